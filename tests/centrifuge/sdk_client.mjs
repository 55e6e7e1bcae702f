// Centrifugo's own JS SDK (npm `centrifuge`, on `ws`) against a rapidws
// server: node sdk_client.mjs <ws-url> <json|protobuf> <ping-secs> [api-key].
//
// A subscriber connects and subscribes to `news` (one frame: the SDK
// batches connect and subscribe); a publisher client publishes 1..3; the
// subscriber disconnects, 4..6 are published, and it reconnects: its
// subscription recovers them. It then stays connected over three ping
// intervals; then misses more than the history keeps, and goes on live.
// With an API key, the publications go through the server HTTP API
// (`POST /api/publish`) instead of a publisher client, and the API's
// history and a request with a wrong key are reported too. Prints one JSON object: what each client saw.
import WebSocket from 'ws';

const [url, format, pingSecs, apiKey] = process.argv.slice(2);
const apiUrl = url.replace(/^ws/, 'http').replace('/connection/websocket', '/api/');
const api = async (method, body, key = apiKey) => {
    const response = await fetch(apiUrl + method, {
        method: 'POST',
        headers: { 'X-API-Key': key, 'Content-Type': 'application/json' },
        body: JSON.stringify(body),
    });
    return { status: response.status, body: await response.text() };
};
const { Centrifuge } = format === 'protobuf'
    ? await import('centrifuge/build/protobuf')
    : await import('centrifuge');

const enc = (value) => format === 'protobuf'
    ? new TextEncoder().encode(JSON.stringify(value))
    : value;
const dec = (data) => format === 'protobuf'
    ? JSON.parse(new TextDecoder().decode(data))
    : data;

const seen = { subscribed: [], publications: [], states: [], errors: [] };
const until = async (what, ms = 10000) => {
    const start = Date.now();
    while (!what()) {
        if (Date.now() - start > ms) {
            throw new Error(`timed out: ${JSON.stringify(seen)}`);
        }
        await new Promise((r) => setTimeout(r, 20));
    }
};

const options = { websocket: WebSocket, minReconnectDelay: 100, maxReconnectDelay: 500 };
const client = new Centrifuge(url, options);
client.on('connecting', (ctx) => seen.states.push(['connecting', ctx.code, ctx.reason]));
client.on('connected', (ctx) => seen.states.push(['connected', ctx.transport, !!ctx.client]));
client.on('disconnected', (ctx) => seen.states.push(['disconnected', ctx.code, ctx.reason]));
client.on('error', (ctx) => seen.errors.push(String(ctx.error && ctx.error.message)));
const sub = client.newSubscription('news');
sub.on('subscribed', (ctx) => seen.subscribed.push({
    wasRecovering: ctx.wasRecovering,
    recovered: ctx.recovered,
    recoverable: ctx.recoverable,
    positioned: ctx.positioned,
    offset: ctx.streamPosition ? Number(ctx.streamPosition.offset) : null,
    epochSet: !!(ctx.streamPosition && ctx.streamPosition.epoch),
}));
sub.on('publication', (ctx) => seen.publications.push({ data: dec(ctx.data), offset: Number(ctx.offset) }));
sub.on('error', (ctx) => seen.errors.push(`sub: ${ctx.error && ctx.error.message}`));
sub.subscribe();
client.connect();
await until(() => seen.subscribed.length === 1);

let publisher = new Centrifuge(url, options);
if (apiKey) {
    seen.apiAnswers = [];
    publisher = {
        publish: async (channel, data) => {
            const value = data instanceof Uint8Array ? JSON.parse(new TextDecoder().decode(data)) : data;
            const answer = await api('publish', { channel, data: value });
            seen.apiAnswers.push(JSON.parse(answer.body));
        },
        disconnect: () => {},
    };
} else {
    publisher.connect();
    await publisher.ready(5000);
}
for (const n of [1, 2, 3]) {
    await publisher.publish('news', enc({ n }));
}
await until(() => seen.publications.length === 3);
client.disconnect();
for (const n of [4, 5, 6]) {
    await publisher.publish('news', enc({ n }));
}
client.connect();
await until(() => seen.publications.length === 6 && seen.subscribed.length === 2);
// Pings: the server's every pingSecs, each answered, or it closes us.
await new Promise((r) => setTimeout(r, 3000 * Number(pingSecs) + 500));
await publisher.publish('news', enc({ n: 7 }));
await until(() => seen.publications.length === 7);
seen.finalState = client.state;
// Away for longer than the history (10 kept): the recovery fails, the
// subscription goes on live from the top.
client.disconnect();
for (let n = 8; n <= 20; n++) {
    await publisher.publish('news', enc({ n }));
}
client.connect();
await until(() => seen.subscribed.length === 3);
await publisher.publish('news', enc({ n: 21 }));
await until(() => seen.publications.length === 8);
client.disconnect();
publisher.disconnect();
if (apiKey) {
    const history = await api('history', { channel: 'news', limit: -1 });
    seen.history = JSON.parse(history.body);
    seen.wrongKey = (await api('publish', { channel: 'news', data: {} }, 'wrong')).status;
}
console.log(JSON.stringify(seen));
process.exit(0);
