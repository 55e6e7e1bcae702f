// The subscriber against the notify_bus example behind a proxy that cuts
// its connections (started by tests/js_client.rs, which passes the URLs in
// the environment; without them these tests are skipped).
import { test } from "node:test";
import assert from "node:assert/strict";
import WebSocket from "ws";
import { subscribe } from "../rapidws-bus.mjs";

const env = process.env;
const skip = env.RAPIDWS_BUS_WS ? false : "needs the bus and its proxy: cargo test --all-features --test js_client";
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
// Short delays, so that many cuts fit in a test; reset after 100 ms up.
const backoff = { base: 20, cap: 500, stable: 100 };

async function post(url, body) {
  const response = await fetch(url, { method: "POST", body });
  const text = await response.text();
  assert.equal(response.status, 200, `${url}: ${text}`);
  return JSON.parse(text);
}

const publish = (http, topic, body) => post(`${http}/publish/${encodeURIComponent(topic)}`, body);

// Every event of the subscriber, in order, and a wait for a condition on
// them.
function record(subscriber) {
  const events = [];
  const waiters = new Set();
  for (const type of ["message", "discontinuity", "recovered", "error", "open", "close"]) {
    subscriber.addEventListener(type, (event) => {
      events.push([type, event.detail]);
      for (const waiter of waiters) waiter();
    });
  }
  const until = (predicate) =>
    new Promise((resolve) => {
      const check = () => {
        if (predicate(events)) {
          waiters.delete(check);
          resolve();
        }
      };
      waiters.add(check);
      check();
    });
  const count = (type) => events.filter(([t]) => t === type).length;
  return { events, until, count };
}

const same = (a, b) => (typeof a === "string" ? a === b : Buffer.from(a).equals(Buffer.from(b)));

test("every publication arrives once and in order across 25 cuts", { skip, timeout: 180000 }, async (t) => {
  const topic = "cuts, a:b/\u00fc \u2713";
  const subscriber = subscribe(env.RAPIDWS_BUS_WS, { topics: [topic], WebSocket, backoff });
  const { events, until, count } = record(subscriber);
  await until(() => count("open") === 1);
  // The first delivery gives the topic a position to resume from.
  const first = await publish(env.RAPIDWS_BUS_HTTP, topic, "m1");
  const sent = [{ offset: first.offset, data: "m1" }];
  await until((e) => e.some(([type, d]) => type === "message" && d.offset === first.offset));

  let publishing = true;
  const publisher = (async () => {
    for (let i = 2; publishing; i++) {
      // Every tenth is binary (not UTF-8): it comes back as a Uint8Array.
      const data = i % 10 === 0 ? new Uint8Array([0xff, i & 0xff, i >> 8]) : `m${i}`;
      const answer = await publish(env.RAPIDWS_BUS_HTTP, topic, data);
      assert.equal(answer.epoch, first.epoch);
      sent.push({ offset: answer.offset, data });
    }
  })();
  let cut = 0;
  for (let k = 1; k <= 25; k++) {
    await until(() => count("open") === k);
    // Anywhere: during the replay, at the seam, in live deliveries.
    await sleep(Math.random() * 150);
    const answer = await post(`${env.RAPIDWS_BUS_PROXY}/cut`);
    assert.ok(answer.cut >= 1, `cut ${k} found no connection`);
    cut += answer.cut;
  }
  await until(() => count("open") === 26);
  await sleep(200);
  publishing = false;
  await publisher;
  const last = sent.at(-1).offset;
  await until((e) => e.some(([type, d]) => type === "message" && d.offset === last));
  subscriber.close();

  const delivered = events.filter(([type]) => type === "message").map(([, d]) => d);
  assert.ok(cut >= 25);
  assert.equal(count("discontinuity"), 0, JSON.stringify(events.filter(([t]) => t === "discontinuity")));
  assert.equal(count("error"), 0, JSON.stringify(events.filter(([t]) => t === "error")));
  assert.equal(delivered.length, sent.length, `${delivered.length} delivered of ${sent.length}`);
  delivered.forEach((d, i) => {
    assert.equal(d.topic, topic);
    assert.equal(d.epoch, first.epoch);
    assert.equal(d.offset, sent[i].offset, `delivery ${i}`);
    assert.ok(same(d.data, sent[i].data), `delivery ${i}: ${d.data} for ${sent[i].data}`);
  });
  // Each reconnect resumed (recovered: true), and the resumes replayed
  // what was published while the subscriber was away: deliveries between
  // an open and its recovered event.
  assert.equal(count("recovered"), 25);
  let replayed = 0;
  let replaying = false;
  let opened = 0;
  for (const [type] of events) {
    if (type === "open") replaying = ++opened > 1;
    else if (type === "recovered") replaying = false;
    else if (type === "message" && replaying) replayed += 1;
  }
  assert.ok(replayed > 0, "no resume replayed anything");
  t.diagnostic(
    `${sent.length} published and delivered once each, ${cut} connections cut, ` +
      `${count("open")} opened, ${replayed} replayed on resuming`,
  );
});

test("a cut longer than history holds: a discontinuity, then live deliveries", { skip, timeout: 60000 }, async () => {
  const topic = "gap";
  const subscriber = subscribe(env.RAPIDWS_SHORT_BUS_WS, { topics: [topic], WebSocket, backoff });
  const { events, until, count } = record(subscriber);
  await until(() => count("open") === 1);
  const before = await publish(env.RAPIDWS_SHORT_BUS_HTTP, topic, "before");
  await until((e) => e.some(([type, d]) => type === "message" && d.data === "before"));

  const held = await post(`${env.RAPIDWS_SHORT_BUS_PROXY}/hold`);
  assert.equal(held.cut, 1);
  const mark = events.length;
  // 50 publications while the subscriber cannot reach the bus (history: 5).
  for (let i = 1; i <= 50; i++) await publish(env.RAPIDWS_SHORT_BUS_HTTP, topic, `during ${i}`);
  // It tried, and was refused, at least twice.
  await until(() => count("close") >= 3);
  await post(`${env.RAPIDWS_SHORT_BUS_PROXY}/release`);
  await until(() => count("discontinuity") === 1);
  const after = await publish(env.RAPIDWS_SHORT_BUS_HTTP, topic, "after");
  await until((e) => e.some(([type, d]) => type === "message" && d.data === "after"));
  subscriber.close();

  const told = events.slice(mark).filter(([type]) => type === "message" || type === "discontinuity");
  assert.deepEqual(told, [
    ["discontinuity", { topic, reason: "server" }],
    ["message", { topic, epoch: before.epoch, offset: after.offset, data: "after" }],
  ]);
  assert.equal(after.offset, before.offset + 51);
});
