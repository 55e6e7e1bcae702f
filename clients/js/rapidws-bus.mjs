// rapidws-bus: a subscriber for rapidws's notify bus (examples/notify_bus),
// for browsers and Node 20+, with no dependencies. It keeps one WebSocket
// with `positions=1`, reconnects with capped exponential backoff and full
// jitter, resumes every topic from the last position it delivered
// (`since=`), delivers each position at most once and in order, and tells
// the application where it may have missed publications (`discontinuity`).
// See README.md beside this file for the contract.

const DEFAULTS = Object.freeze({ base: 250, cap: 30000, stable: 5000, connectTimeout: 15000 });

// What the bus accepts as a topic name (check_topic): 1 to 1024 bytes.
const MAX_TOPIC_BYTES = 1024;
// An epoch is a u64 in hex on the wire; it goes back into `since=` as is.
const EPOCH = /^[0-9a-fA-F]{1,16}$/;
// Where a topic subscribed from now starts: `<epoch>:<offset>`.
const SINCE = /^([0-9a-fA-F]{1,16}):(\d{1,16})$/;

/**
 * Subscribes to `topics` on the bus whose WebSocket endpoint is `url`
 * (`ws://host:port/ws`; the query is added here) and returns the
 * subscriber: an EventTarget with `close()`.
 */
export function subscribe(url, options = {}) {
  return new Subscriber(url, options);
}

/**
 * The delay before reconnect attempt `attempt` (0 for the first after a
 * drop): full jitter, a random time up to min(cap, base * 2^attempt).
 */
export function backoffDelay(attempt, { base = DEFAULTS.base, cap = DEFAULTS.cap } = {}, random = Math.random) {
  const ceiling = Math.min(cap, base * 2 ** Math.min(attempt, 52));
  return Math.floor(random() * ceiling);
}

function checkTopic(topic) {
  if (typeof topic !== "string" || topic.length === 0) {
    throw new TypeError("a topic is a non-empty string");
  }
  if (new TextEncoder().encode(topic).length > MAX_TOPIC_BYTES) {
    throw new TypeError("a topic is at most 1024 bytes of UTF-8");
  }
}

function decodeBase64(text) {
  const binary = atob(text);
  const bytes = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
  return bytes;
}

class Subscriber extends EventTarget {
  #url;
  #WebSocket;
  #settings;
  #token;
  // topic -> { epoch: string | null, offset: number, broken: boolean }: the
  // last position delivered, and whether the server told of a gap since.
  #topics = new Map();
  // Topics asked for with subscribe() and not yet acknowledged: asked
  // again on each connection until the server answers.
  #asked = new Set();
  // The commands sent on this connection and not yet answered, in order
  // (the bus answers each, in order): to say which one an error refuses.
  #unanswered = [];
  #socket = null;
  #openedAt = null;
  #attempt = 0;
  #timer = null;
  #connectTimer = null;
  #closed = false;
  #wake;

  constructor(url, { topics = [], WebSocket = globalThis.WebSocket, backoff = {}, token } = {}) {
    super();
    const parsed = new URL(url);
    if (parsed.protocol !== "ws:" && parsed.protocol !== "wss:") {
      throw new TypeError("the bus's endpoint is a ws: or wss: URL, got " + parsed.protocol);
    }
    if (typeof WebSocket !== "function") {
      throw new TypeError("no WebSocket: pass one (Node 20: `import WebSocket from \"ws\"`)");
    }
    for (const topic of topics) {
      checkTopic(topic);
      this.#topics.set(topic, { epoch: null, offset: 0, broken: false });
    }
    this.#url = url;
    this.#WebSocket = WebSocket;
    this.#settings = { ...DEFAULTS, ...backoff };
    this.#token = token;
    // A browser that comes back online, or a page shown again, need not
    // wait for the backoff.
    this.#wake = () => {
      const doc = globalThis.document;
      if (doc && doc.visibilityState === "hidden") return;
      if (!this.#closed && this.#socket === null) this.#connect();
    };
    globalThis.addEventListener?.("online", this.#wake);
    globalThis.document?.addEventListener?.("visibilitychange", this.#wake);
    this.#connect();
  }

  /** The topics held (acknowledged or given at the start). */
  get topics() {
    return [...this.#topics.keys()];
  }

  /**
   * Each topic's position, `{ epoch, offset }`, or null: the last delivered,
   * or where the topic started if nothing was delivered on it yet. A
   * reconnect resumes after it.
   */
  get positions() {
    const out = {};
    for (const [topic, at] of this.#topics) {
      out[topic] = at.epoch === null ? null : { epoch: at.epoch, offset: at.offset };
    }
    return out;
  }

  /** Whether the socket is open now. */
  get connected() {
    return this.#socket !== null && this.#openedAt !== null;
  }

  /**
   * Asks the bus for one more topic; a `subscribed` event when it agrees
   * (from then on it is resumed like the others), an `error` when not.
   */
  subscribe(topic) {
    if (this.#closed || this.#topics.has(topic) || this.#asked.has(topic)) return;
    this.#asked.add(topic);
    if (this.connected) this.#send("subscribe", topic);
  }

  /** Leaves a topic: nothing more of it is delivered, and it is not resumed. */
  unsubscribe(topic) {
    this.#asked.delete(topic);
    const held = this.#topics.delete(topic);
    if (held && this.connected) this.#send("unsubscribe", topic);
  }

  /** Stops for good: the socket is closed and never opened again. */
  close() {
    if (this.#closed) return;
    this.#closed = true;
    clearTimeout(this.#timer);
    clearTimeout(this.#connectTimer);
    globalThis.removeEventListener?.("online", this.#wake);
    globalThis.document?.removeEventListener?.("visibilitychange", this.#wake);
    const socket = this.#socket;
    this.#socket = null;
    this.#openedAt = null;
    if (socket) {
      try {
        socket.onopen = socket.onmessage = socket.onclose = null;
        socket.close(1000, "closed by the subscriber");
      } catch {
        // Already closing.
      }
    }
    this.#emit("close", { code: 1000, reason: "closed by the subscriber", delay: null });
  }

  #emit(type, detail) {
    this.dispatchEvent(new CustomEvent(type, { detail }));
  }

  #send(command, topic) {
    try {
      this.#socket.send(command + ":" + topic);
      this.#unanswered.push({ command, topic });
    } catch {
      // The socket is going; its close event reconnects.
    }
  }

  #query() {
    const query = ["positions=1", "starts=1"];
    const fresh = [];
    for (const [topic, at] of this.#topics) {
      if (at.epoch === null) fresh.push(encodeURIComponent(topic));
      else query.push("since=" + encodeURIComponent(topic) + ":" + at.epoch + ":" + at.offset);
    }
    if (fresh.length > 0) query.push("topics=" + fresh.join(","));
    const token = typeof this.#token === "function" ? this.#token() : this.#token;
    if (token) query.push("token=" + encodeURIComponent(token));
    return query.join("&");
  }

  #connect() {
    clearTimeout(this.#timer);
    this.#timer = null;
    if (this.#closed || this.#socket !== null) return;
    let socket, target;
    try {
      const endpoint = new URL(this.#url);
      endpoint.hash = "";
      endpoint.search = (endpoint.search ? endpoint.search + "&" : "?") + this.#query();
      target = endpoint.href;
      socket = new this.#WebSocket(target);
    } catch (error) {
      this.#retry({ code: 1006, reason: String(error && error.message) });
      return;
    }
    this.#socket = socket;
    this.#openedAt = null;
    this.#unanswered = [];
    socket.binaryType = "arraybuffer";
    // A handshake that hangs (a dead network) is given up on.
    this.#connectTimer = setTimeout(() => {
      if (this.#socket === socket && this.#openedAt === null) this.#drop(socket, 1006, "connect timed out");
    }, this.#settings.connectTimeout);
    socket.onopen = () => {
      if (this.#socket !== socket) return;
      clearTimeout(this.#connectTimer);
      this.#openedAt = Date.now();
      for (const topic of this.#asked) this.#send("subscribe", topic);
      this.#emit("open", { url: target });
    };
    // Node's `ws` delivers all messages of one read in one go; each is
    // handled whole before the next, and none once this socket is not
    // the current one (close() or a drop), as a browser would have it.
    socket.onmessage = (event) => {
      if (this.#socket !== socket || this.#closed) return;
      try {
        this.#receive(event.data);
      } catch (error) {
        this.#emit("error", { message: "unreadable message from the bus: " + (error && error.message) });
      }
    };
    // Failures are followed by a close event, which reconnects.
    socket.onerror = () => {};
    socket.onclose = (event) => {
      if (this.#socket !== socket) return;
      this.#drop(socket, event.code, event.reason);
    };
  }

  // The connection is over (closed, failed, or given up on): forget it and
  // try again after the backoff.
  #drop(socket, code, reason) {
    clearTimeout(this.#connectTimer);
    this.#socket = null;
    if (this.#openedAt !== null && Date.now() - this.#openedAt >= this.#settings.stable) this.#attempt = 0;
    this.#openedAt = null;
    try {
      socket.onopen = socket.onmessage = socket.onclose = null;
      socket.close();
    } catch {
      // Closed already.
    }
    this.#retry({ code, reason });
  }

  #retry({ code, reason }) {
    if (this.#closed) return;
    const delay = backoffDelay(this.#attempt, this.#settings);
    this.#attempt += 1;
    this.#timer = setTimeout(() => this.#connect(), delay);
    this.#emit("close", { code, reason: reason || "", delay });
  }

  #receive(data) {
    if (typeof data !== "string") throw new Error("a binary message (positions=1 sends text)");
    const message = JSON.parse(data);
    if (message === null || typeof message !== "object" || Array.isArray(message)) {
      throw new Error("not a JSON object");
    }
    if (typeof message.topic === "string" && "recovered" in message) {
      if (message.recovered === false) this.#discontinuity(message.topic, "server");
      else if (message.recovered === true && this.#topics.has(message.topic)) {
        this.#emit("recovered", { topic: message.topic });
      } else if (message.recovered !== true) throw new Error("recovered is not a boolean");
    } else if (typeof message.topic === "string" && typeof message.since === "string") {
      // Where a topic subscribed from now starts: it resumes from there
      // until a delivery gives a newer position.
      const match = SINCE.exec(message.since);
      if (!match) throw new Error("since is <epoch>:<offset>");
      const at = this.#topics.get(message.topic);
      if (at && at.epoch === null) {
        at.epoch = match[1];
        at.offset = Number(match[2]);
      }
    } else if (typeof message.topic === "string" && ("data" in message || "data_b64" in message)) {
      this.#deliver(message);
    } else if (typeof message.subscribed === "string") {
      this.#answered();
      const topic = message.subscribed;
      this.#asked.delete(topic);
      if (!this.#topics.has(topic)) this.#topics.set(topic, { epoch: null, offset: 0, broken: false });
      this.#emit("subscribed", { topic });
    } else if (typeof message.unsubscribed === "string") {
      this.#answered();
      this.#emit("unsubscribed", { topic: message.unsubscribed });
    } else if (typeof message.error === "string") {
      const refused = this.#answered();
      if (refused && refused.command === "subscribe") this.#asked.delete(refused.topic);
      this.#emit("error", { message: message.error, ...(refused || {}) });
    } else {
      throw new Error("not a message of the bus: " + data.slice(0, 100));
    }
  }

  #answered() {
    return this.#unanswered.shift() || null;
  }

  #discontinuity(topic, reason) {
    const at = this.#topics.get(topic);
    if (!at) return;
    at.broken = true;
    this.#emit("discontinuity", { topic, reason });
  }

  #deliver({ topic, epoch, offset, data, data_b64: encoded }) {
    if (typeof epoch !== "string" || !EPOCH.test(epoch)) throw new Error("a delivery without a valid epoch");
    if (!Number.isSafeInteger(offset) || offset < 0) throw new Error("a delivery without a valid offset");
    let payload;
    if (typeof data === "string") payload = data;
    else if (typeof encoded === "string") payload = decodeBase64(encoded);
    else throw new Error("a delivery without data");
    let at = this.#topics.get(topic);
    if (!at && this.#asked.has(topic)) {
      // Delivered before its acknowledgement arrived: held from now on.
      this.#asked.delete(topic);
      at = { epoch: null, offset: 0, broken: false };
      this.#topics.set(topic, at);
    }
    if (!at) return; // left, or never asked for
    if (at.epoch === epoch) {
      if (offset <= at.offset) return; // delivered already
    } else if (at.epoch !== null && !at.broken) {
      // Another history than the one delivered from, and the server did
      // not say so: whatever lay between is unknown.
      this.#discontinuity(topic, "epoch");
    }
    at.epoch = epoch;
    at.offset = offset;
    at.broken = false;
    this.#emit("message", { topic, epoch, offset, data: payload });
  }
}
