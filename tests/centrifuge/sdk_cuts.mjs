// Centrifugo's own JS SDK (npm `centrifuge`, on `ws`) as a subscriber that
// a test watches while it cuts the connection under it:
//
//   node sdk_cuts.mjs <ws-url> <channel> <browser|node> <json|protobuf>
//
// It connects, subscribes to <channel> and reports, one JSON object a line
// as it happens, its states (`{"state":"connected"}`...), each `subscribed`
// (with `wasRecovering`, `recovered` and the position), each publication
// (`{"pub":[n, offset]}`, n from the data `{"n": n}`) and any error. Once a
// publication whose data says `"last": true` has arrived, and nothing more
// for half a second (a late duplicate would show), it disconnects, reports
// `{"done":true}` and exits.
//
// `browser` dispatches the WebSocket's messages one a task, as a browser
// does (`ws` with `allowSynchronousEvents: false`); `node` keeps `ws`'s
// default, which emits every message of one read in the same task.
import WebSocket from 'ws';

const [url, channel, dispatch, format] = process.argv.slice(2);
if (!url || !channel || !['browser', 'node'].includes(dispatch)
    || !['json', 'protobuf'].includes(format)) {
    console.error('usage: node sdk_cuts.mjs <ws-url> <channel> <browser|node> <json|protobuf>');
    process.exit(2);
}
const { Centrifuge } = format === 'protobuf'
    ? await import('centrifuge/build/protobuf')
    : await import('centrifuge');
// The server HTTP API publishes JSON; a Protobuf client gets its bytes.
const dataOf = (data) => format === 'protobuf'
    ? JSON.parse(new TextDecoder().decode(data))
    : data;

// The SDK constructs its socket as `new websocket(url, protocols)`: the
// option goes in through a subclass.
class OneMessageATask extends WebSocket {
    constructor(address, protocols) {
        super(address, protocols, { allowSynchronousEvents: false });
    }
}

const report = (value) => process.stdout.write(JSON.stringify(value) + '\n');

const client = new Centrifuge(url, {
    websocket: dispatch === 'browser' ? OneMessageATask : WebSocket,
    minReconnectDelay: 50,
    maxReconnectDelay: 400,
});
client.on('connecting', (ctx) => report({ state: 'connecting', code: ctx.code, reason: ctx.reason }));
client.on('connected', () => report({ state: 'connected' }));
client.on('disconnected', (ctx) => report({ state: 'disconnected', code: ctx.code, reason: ctx.reason }));
client.on('error', (ctx) => report({ error: `${ctx.type}: ${ctx.error && ctx.error.message}` }));

const sub = client.newSubscription(channel);
sub.on('subscribing', (ctx) => report({ subscribing: ctx.code, reason: ctx.reason }));
sub.on('subscribed', (ctx) => report({
    subscribed: {
        wasRecovering: ctx.wasRecovering,
        recovered: ctx.recovered,
        recoverable: ctx.recoverable,
        offset: ctx.streamPosition ? Number(ctx.streamPosition.offset) : null,
        epoch: ctx.streamPosition ? ctx.streamPosition.epoch : null,
    },
}));
sub.on('error', (ctx) => report({ error: `sub ${ctx.type}: ${ctx.error && ctx.error.message}` }));

let quiet = null;
const finish = () => {
    client.disconnect();
    report({ done: true });
    process.exit(0);
};
sub.on('publication', (ctx) => {
    const data = dataOf(ctx.data);
    report({ pub: [data.n, Number(ctx.offset)] });
    if (quiet !== null || data.last === true) {
        // Anything after the last one is reported, and the wait starts
        // again.
        clearTimeout(quiet);
        quiet = setTimeout(finish, 500);
    }
});

// A test that died without stopping us: end anyway.
setTimeout(() => {
    report({ error: 'gave up after 120 s' });
    process.exit(1);
}, 120_000).unref();

sub.subscribe();
client.connect();
