// Connection tokens with Centrifugo's JS SDK against a rapidws server
// started with --jwt-secret: node sdk_tokens.mjs <ws-url> <json|protobuf>
// <secret> (and --expired-grace-secs 1). Tokens are made here with node's own HMAC. Prints one JSON
// object: for each case, the states its client went through and how
// often it asked for a token.
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
]);
console.log(JSON.stringify(results));
process.exit(0);
