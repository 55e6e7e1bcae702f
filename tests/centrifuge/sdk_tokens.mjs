// Connection and subscription tokens with Centrifugo's JS SDK against a
// rapidws server started with --jwt-secret: node sdk_tokens.mjs <ws-url>
// <json|protobuf> <secret> (and --expired-grace-secs 1,
// --expired-sub-grace-secs 1, --client-publish). Tokens are made here with
// node's own HMAC. Prints one JSON object: for each case, the states its
// client (or its subscriptions) went through and how often it asked for a
// token.
import crypto from 'node:crypto';
import WebSocket from 'ws';

const [url, format, secret] = process.argv.slice(2);
const { Centrifuge } = format === 'protobuf'
    ? await import('centrifuge/build/protobuf')
    : await import('centrifuge');

const b64 = (value) => Buffer.from(JSON.stringify(value)).toString('base64url');
const jwt = (payload, key = secret) => {
    const signed = `${b64({ alg: 'HS256', typ: 'JWT' })}.${b64(payload)}`;
    return `${signed}.${crypto.createHmac('sha256', key).update(signed).digest('base64url')}`;
};
const now = () => Math.floor(Date.now() / 1000);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function run(name, options, ms) {
    const seen = { states: [], tokens: 0 };
    const getToken = options.getToken;
    if (getToken) {
        options.getToken = async () => { seen.tokens += 1; return getToken(); };
    }
    const client = new Centrifuge(url, { websocket: WebSocket, minReconnectDelay: 100, ...options });
    client.on('connected', () => seen.states.push('connected'));
    client.on('connecting', (ctx) => seen.states.push(`connecting ${ctx.code}`));
    client.on('disconnected', (ctx) => seen.states.push(`disconnected ${ctx.code}`));
    client.connect();
    await sleep(ms);
    seen.final = client.state;
    client.disconnect();
    return [name, seen];
}

// A bare client (no SDK, which would end it itself) that never refreshes
// its token: closed with 3005 once the server's grace is up. It answers
// the pings, so only the expiry can end it.
async function rawUnrefreshed() {
    const ws = new WebSocket(url);
    const seen = { replies: [] };
    ws.on('open', () => ws.send(JSON.stringify({ id: 1, connect: { token: jwt({ sub: 'carol', exp: now() + 1 }) } })));
    ws.on('message', (data) => {
        const text = data.toString();
        if (text === '{}') {
            ws.send('{}');
        } else {
            const reply = JSON.parse(text);
            seen.replies.push({ id: reply.id, expires: reply.connect && reply.connect.expires, ttl: reply.connect && reply.connect.ttl });
        }
    });
    seen.close = await new Promise((resolve) => ws.on('close', (code, reason) => resolve([code, reason.toString()])));
    return ['unrefreshed', seen];
}

// Subscription tokens: one for the channel subscribes; one for another
// channel ends the connection (3500).
async function subscriptions() {
    const seen = { states: [], subscribed: [] };
    const token = jwt({ sub: 'dave', exp: now() + 60 });
    const client = new Centrifuge(url, { websocket: WebSocket, token });
    client.on('connected', () => seen.states.push('connected'));
    client.on('disconnected', (ctx) => seen.states.push(`disconnected ${ctx.code}`));
    const sub = (channel, forChannel) => {
        const s = client.newSubscription(channel, { getToken: async () => jwt({ sub: 'dave', channel: forChannel, exp: now() + 60 }) });
        s.on('subscribed', () => seen.subscribed.push(channel));
        s.subscribe();
    };
    sub('secret', 'secret');
    client.connect();
    await sleep(700);
    sub('other', 'secret');
    await sleep(700);
    return ['subscriptions', seen];
}

// Subscription tokens that last 2 s. `ticking`'s getToken always gives
// one: the SDK refreshes it by itself (sub_refresh) and the subscription
// gets every publication the client makes meanwhile, each with its
// publisher's info. `cut`'s gives its first only, then fails: the server
// unsubscribes it (2501, subscription expired) once its grace is up.
async function subscriptionRefresh() {
    const enc = (value) => format === 'protobuf' ? new TextEncoder().encode(JSON.stringify(value)) : value;
    const dec = (data) => format === 'protobuf' ? JSON.parse(new TextDecoder().decode(data)) : data;
    const token = jwt({ sub: 'frank', exp: now() + 120, info: { name: 'Frank' } });
    const client = new Centrifuge(url, { websocket: WebSocket, token });
    let clientId = null;
    client.on('connected', (ctx) => { clientId = ctx.client; });
    const watch = (channel, getToken) => {
        const seen = { tokens: 0, events: [], publications: [] };
        const sub = client.newSubscription(channel, {
            getToken: async () => { seen.tokens += 1; return getToken(seen.tokens); },
        });
        sub.on('subscribed', () => seen.events.push('subscribed'));
        sub.on('subscribing', (ctx) => seen.events.push(`subscribing ${ctx.code}`));
        sub.on('unsubscribed', (ctx) => seen.events.push(`unsubscribed ${ctx.code}`));
        sub.on('error', (ctx) => seen.events.push(`error ${ctx.type}`));
        sub.on('publication', (ctx) => {
            seen.events.push('publication');
            seen.publications.push(dec(ctx.data).n);
            const info = ctx.info || {};
            seen.info = {
                user: info.user,
                client: info.client === clientId,
                connInfo: info.connInfo && dec(info.connInfo),
                chanInfo: info.chanInfo && dec(info.chanInfo),
            };
        });
        sub.subscribe();
        return seen;
    };
    const short = (channel) => jwt({ sub: 'frank', channel, exp: now() + 2, info: { seat: channel } });
    const ticking = watch('ticking', () => short('ticking'));
    const cut = watch('cut', (n) => {
        if (n > 1) {
            throw new Error('no more tokens');
        }
        return short('cut');
    });
    client.connect();
    await client.ready(5000);
    // Three times the tokens' life, a publication to each every 200 ms.
    let published = 0;
    const start = Date.now();
    while (Date.now() - start < 7000) {
        published += 1;
        await client.publish('ticking', enc({ n: published }));
        await client.publish('cut', enc({ n: published }));
        await sleep(200);
    }
    await sleep(500);
    client.disconnect();
    return ['subRefresh', { published, ticking, cut }];
}

const fresh = () => jwt({ sub: 'alice', exp: now() + 2, info: { name: 'Alice' } });
const results = Object.fromEntries([
    // Expires in 2 s, refreshed each time (the connect reply's ttl).
    await run('refreshed', { token: fresh(), getToken: fresh }, 5500),
    // Expired already: the server answers 109 and the SDK asks for one.
    // (Its new token lasts longer than the case: `exp` is in whole seconds,
    // so one of 2 s may be 1 s from the server's clock, and the SDK would
    // refresh it again within the case.)
    await run('expired', { token: jwt({ sub: 'bob', exp: now() - 10 }), getToken: () => jwt({ sub: 'alice', exp: now() + 30, info: { name: 'Alice' } }) }, 1500),
    // Signed with another secret, or none at all: closed with 3500.
    await run('forged', { token: jwt({ sub: 'eve' }, 'guess') }, 1000),
    await run('anonymous', {}, 1000),
    await rawUnrefreshed(),
    await subscriptions(),
    await subscriptionRefresh(),
]);
console.log(JSON.stringify(results));
process.exit(0);
