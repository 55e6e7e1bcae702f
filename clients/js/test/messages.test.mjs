// The subscriber against a scripted bus (a `ws` server on loopback that
// says exactly what each test needs, bad messages included): what it
// delivers, drops and reports, and the query it resumes with.
import { test } from "node:test";
import assert from "node:assert/strict";
import { once } from "node:events";
import WebSocket, { WebSocketServer } from "ws";
import { subscribe, backoffDelay } from "../rapidws-bus.mjs";

// A server whose connections arrive one by one: `next()` gives the next
// connection with its request URL and a queue of the messages it got.
async function scripted() {
  const server = new WebSocketServer({ host: "127.0.0.1", port: 0 });
  await once(server, "listening");
  const waiting = [];
  const arrived = [];
  let count = 0;
  server.on("connection", (socket, request) => {
    count += 1;
    const got = [];
    const wanted = [];
    socket.on("message", (data) => {
      const text = data.toString();
      const taker = wanted.shift();
      if (taker) taker(text);
      else got.push(text);
    });
    const connection = {
      socket,
      url: new URL(request.url, "ws://bus"),
      said: () => (got.length ? Promise.resolve(got.shift()) : new Promise((resolve) => wanted.push(resolve))),
      send: (value) => socket.send(typeof value === "string" ? value : JSON.stringify(value)),
    };
    const taker = waiting.shift();
    if (taker) taker(connection);
    else arrived.push(connection);
  });
  return {
    url: `ws://127.0.0.1:${server.address().port}/ws`,
    next: () => (arrived.length ? Promise.resolve(arrived.shift()) : new Promise((resolve) => waiting.push(resolve))),
    count: () => count,
    close: () => {
      for (const client of server.clients) client.terminate();
      server.close();
    },
  };
}

// Every event of the subscriber, in order, as [type, detail].
function record(subscriber) {
  const events = [];
  const waiters = [];
  for (const type of ["message", "discontinuity", "recovered", "subscribed", "unsubscribed", "error", "open", "close"]) {
    subscriber.addEventListener(type, (event) => {
      events.push([type, event.detail]);
      for (const waiter of [...waiters]) waiter();
    });
  }
  // Resolves once `predicate(events)` holds.
  const until = (predicate) =>
    new Promise((resolve) => {
      const check = () => {
        if (predicate(events)) {
          waiters.splice(waiters.indexOf(check), 1);
          resolve();
        }
      };
      waiters.push(check);
      check();
    });
  return { events, until };
}

const fast = { base: 10, cap: 50, stable: 100000 };
const delivery = (topic, epoch, offset, data) => ({ topic, epoch, offset, data });

test("bad messages are reported and dropped; positions are delivered once", async () => {
  const bus = await scripted();
  const subscriber = subscribe(bus.url, { topics: ["a", "b c,d"], WebSocket, backoff: fast });
  const { events, until } = record(subscriber);
  const first = await bus.next();
  assert.equal(first.url.pathname, "/ws");
  assert.equal(first.url.search, "?positions=1&starts=1&topics=a,b%20c%2Cd");
  await until((e) => e.some(([type]) => type === "open"));
  const epoch = "00000000000000aa";
  // Each of these is reported as an error event and changes nothing.
  const bad = [
    "not json",
    "[]",
    "null",
    "42",
    JSON.stringify({ hello: "there" }),
    JSON.stringify({ topic: "a", epoch: "zz", offset: 1, data: "x" }),
    JSON.stringify({ topic: "a", epoch, offset: -1, data: "x" }),
    JSON.stringify({ topic: "a", epoch, offset: 2 ** 60, data: "x" }),
    JSON.stringify({ topic: "a", epoch, offset: "1", data: "x" }),
    JSON.stringify({ topic: "a", epoch, offset: 1 }),
    JSON.stringify({ topic: "a", epoch, offset: 1, data_b64: "!!!" }),
    JSON.stringify({ topic: "a", recovered: "yes" }),
  ];
  for (const text of bad) first.send(text);
  first.socket.send(Buffer.from([1, 2, 3]), { binary: true });
  // Not a topic of this subscriber: dropped without a word.
  first.send(delivery("zzz", epoch, 1, "not mine"));
  first.send(delivery("a", epoch, 1, "one"));
  first.send(delivery("a", epoch, 1, "one again"));
  first.send(delivery("a", epoch, 2, "two"));
  first.send({ topic: "b c,d", epoch: "bb", offset: 5, data_b64: "AAEC/w==" });
  first.send(delivery("a", epoch, 2, "two again"));
  first.send(delivery("a", epoch, 1, "one, late"));
  // Another epoch, without the server's recovered:false first: a
  // discontinuity of the subscriber's own, then the delivery.
  first.send(delivery("a", "cc", 1, "another history"));
  await until((e) => e.some(([type, d]) => type === "message" && d.epoch === "cc"));
  const errors = events.filter(([type]) => type === "error");
  assert.equal(errors.length, bad.length + 1, JSON.stringify(errors));
  for (const [, detail] of errors) assert.match(detail.message, /unreadable message from the bus/);
  const delivered = events.filter(([type]) => type === "message" || type === "discontinuity").map(([type, d]) => [type, d]);
  assert.deepEqual(delivered, [
    ["message", delivery("a", epoch, 1, "one")],
    ["message", delivery("a", epoch, 2, "two")],
    ["message", { topic: "b c,d", epoch: "bb", offset: 5, data: new Uint8Array([0, 1, 2, 255]) }],
    ["discontinuity", { topic: "a", reason: "epoch" }],
    ["message", delivery("a", "cc", 1, "another history")],
  ]);
  assert.deepEqual(subscriber.positions, { a: { epoch: "cc", offset: 1 }, "b c,d": { epoch: "bb", offset: 5 } });

  // Cut: the next connection resumes both topics from what was delivered.
  first.socket.terminate();
  const second = await bus.next();
  assert.deepEqual(second.url.searchParams.getAll("since"), ["a:cc:1", "b c,d:bb:5"]);
  assert.equal(second.url.search, "?positions=1&starts=1&since=a:cc:1&since=b%20c%2Cd:bb:5");
  assert.equal(second.url.searchParams.get("topics"), null);
  await until((e) => e.filter(([type]) => type === "open").length === 2);
  // A replay overlapping what was delivered: only what is new passes.
  second.send(delivery("a", "cc", 1, "replayed twice"));
  second.send(delivery("a", "cc", 2, "replayed"));
  second.send({ topic: "a", recovered: true });
  // Told of a gap: the next delivery may be in another epoch.
  second.send({ topic: "b c,d", recovered: false });
  second.send(delivery("b c,d", "dd", 1, "after the gap"));
  await until((e) => e.some(([type, d]) => type === "message" && d.epoch === "dd"));
  const tail = events.slice(events.findLastIndex(([type]) => type === "open") + 1);
  assert.deepEqual(tail, [
    ["message", delivery("a", "cc", 2, "replayed")],
    ["recovered", { topic: "a" }],
    ["discontinuity", { topic: "b c,d", reason: "server" }],
    ["message", delivery("b c,d", "dd", 1, "after the gap")],
  ]);
  subscriber.close();
  await once(second.socket, "close");
  bus.close();
});

test("subscribe and unsubscribe: held once acknowledged, refusals say which command", async () => {
  const bus = await scripted();
  const subscriber = subscribe(bus.url, { topics: ["a"], WebSocket, backoff: fast });
  const { events, until } = record(subscriber);
  const first = await bus.next();
  await until((e) => e.some(([type]) => type === "open"));
  subscriber.subscribe("");
  subscriber.subscribe("x");
  assert.equal(await first.said(), "subscribe:");
  assert.equal(await first.said(), "subscribe:x");
  first.send({ error: "empty topic name" });
  first.send({ subscribed: "x" });
  await until((e) => e.some(([type]) => type === "subscribed"));
  assert.deepEqual(
    events.filter(([type]) => type === "error" || type === "subscribed"),
    [
      ["error", { message: "empty topic name", command: "subscribe", topic: "" }],
      ["subscribed", { topic: "x" }],
    ],
  );
  assert.deepEqual(subscriber.topics, ["a", "x"]);
  subscriber.unsubscribe("a");
  assert.equal(await first.said(), "unsubscribe:a");
  // What comes for a topic left is not delivered.
  first.send(delivery("a", "aa", 1, "left"));
  first.send(delivery("x", "aa", 1, "kept"));
  await until((e) => e.some(([type]) => type === "message"));
  assert.deepEqual(
    events.filter(([type]) => type === "message").map(([, d]) => d.data),
    ["kept"],
  );
  // Asked while the socket is down: asked again once it is open.
  first.socket.terminate();
  await until((e) => e.some(([type]) => type === "close"));
  subscriber.subscribe("y");
  const second = await bus.next();
  assert.equal(second.url.search, "?positions=1&starts=1&since=x:aa:1");
  assert.equal(await second.said(), "subscribe:y");
  second.send({ subscribed: "y" });
  await until((e) => e.filter(([type]) => type === "subscribed").length === 2);
  assert.deepEqual(subscriber.topics, ["x", "y"]);
  // close(): no reconnect after it, however the socket ends.
  subscriber.close();
  await once(second.socket, "close");
  await new Promise((resolve) => setTimeout(resolve, 300));
  assert.equal(bus.count(), 2);
  assert.equal(events.at(-1)[0], "close");
  assert.equal(events.at(-1)[1].delay, null);
  bus.close();
});

test("a bus that is down is retried with growing, jittered delays", async () => {
  const bus = await scripted();
  const url = bus.url;
  bus.close();
  const subscriber = subscribe(url, { topics: ["a"], WebSocket, backoff: { base: 5, cap: 40, stable: 1000 } });
  const { events, until } = record(subscriber);
  await until((e) => e.filter(([type]) => type === "close").length >= 8);
  subscriber.close();
  const delays = events.filter(([type, d]) => type === "close" && d.delay !== null).map(([, d]) => d.delay);
  delays.forEach((delay, attempt) => {
    assert.ok(delay >= 0 && delay < Math.min(40, 5 * 2 ** attempt), `attempt ${attempt}: ${delay}`);
  });
  // Full jitter: anywhere below the ceiling, capped.
  assert.equal(backoffDelay(3, { base: 250, cap: 30000 }, () => 0.5), 1000);
  assert.equal(backoffDelay(20, { base: 250, cap: 30000 }, () => 0.999), 29970);
  assert.equal(backoffDelay(0, { base: 250, cap: 30000 }, () => 0), 0);
});

test("close() from a listener: nothing more is delivered, even from the same read", async () => {
  const bus = await scripted();
  const subscriber = subscribe(bus.url, { topics: ["a"], WebSocket, backoff: fast });
  const { events, until } = record(subscriber);
  subscriber.addEventListener("message", () => subscriber.close());
  const first = await bus.next();
  await until((e) => e.some(([type]) => type === "open"));
  // Sent together: Node's `ws` hands them over in one go.
  for (let offset = 1; offset <= 3; offset++) first.send(delivery("a", "aa", offset, `m${offset}`));
  await once(first.socket, "close");
  assert.deepEqual(
    events.filter(([type]) => type === "message").map(([, d]) => d.offset),
    [1],
  );
  assert.equal(bus.count(), 1);
  bus.close();
});

test("a topic without deliveries resumes from where the bus said it starts", async () => {
  const bus = await scripted();
  const subscriber = subscribe(bus.url, { topics: ["quiet", "busy"], WebSocket, backoff: fast });
  const { until } = record(subscriber);
  const first = await bus.next();
  await until((e) => e.some(([type]) => type === "open"));
  first.send({ topic: "quiet", since: "00000000000000ab:7" });
  first.send({ topic: "busy", since: "00000000000000cd:3" });
  first.send(delivery("busy", "00000000000000cd", 4, "four"));
  // An older start never moves a topic back; a bad one is an error.
  first.send({ topic: "busy", since: "00000000000000cd:1" });
  first.send({ topic: "quiet", since: "nope" });
  await until((e) => e.some(([type]) => type === "error"));
  assert.deepEqual(subscriber.positions, {
    quiet: { epoch: "00000000000000ab", offset: 7 },
    busy: { epoch: "00000000000000cd", offset: 4 },
  });
  first.socket.terminate();
  const second = await bus.next();
  assert.equal(second.url.search, "?positions=1&starts=1&since=quiet:00000000000000ab:7&since=busy:00000000000000cd:4");
  subscriber.close();
  bus.close();
});
