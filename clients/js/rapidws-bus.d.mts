// Type declarations for rapidws-bus.mjs.

/** A position on a topic: the epoch of its history and an offset in it. */
export interface Position {
  /** The topic's epoch, in hex. */
  epoch: string;
  /** Counts the topic's publications from 1 within the epoch. */
  offset: number;
}

/** One publication, delivered once. */
export interface Delivery extends Position {
  topic: string;
  /** The text as published, or the bytes of a binary publication. */
  data: string | Uint8Array;
}

export interface DiscontinuityDetail {
  topic: string;
  /**
   * `"server"`: the bus said it could not deliver all that was published
   * (a resume past its history, another epoch, a subscriber too slow);
   * `"epoch"`: a delivery came in another epoch than the last one without
   * the bus saying so.
   */
  reason: "server" | "epoch";
}

export interface CloseDetail {
  code: number;
  reason: string;
  /** Milliseconds until the next attempt; `null` after `close()`. */
  delay: number | null;
}

export interface ErrorDetail {
  /** The bus's refusal, or why a message from it was not understood. */
  message: string;
  /** The command the bus refused, when it answers one. */
  command?: "subscribe" | "unsubscribe";
  topic?: string;
}

export interface SubscriberEventMap {
  message: CustomEvent<Delivery>;
  discontinuity: CustomEvent<DiscontinuityDetail>;
  /** A resumed topic's replay is complete and nothing was missed. */
  recovered: CustomEvent<{ topic: string }>;
  subscribed: CustomEvent<{ topic: string }>;
  unsubscribed: CustomEvent<{ topic: string }>;
  error: CustomEvent<ErrorDetail>;
  /** `url` is the endpoint with the query this connection used. */
  open: CustomEvent<{ url: string }>;
  close: CustomEvent<CloseDetail>;
}

export interface Backoff {
  /** The first retry's ceiling, in ms (250). */
  base?: number;
  /** The largest ceiling, in ms (30000). */
  cap?: number;
  /** A connection open this long (ms) resets the backoff (5000). */
  stable?: number;
  /** A handshake not done after this long (ms) is given up (15000). */
  connectTimeout?: number;
}

/**
 * Anything constructed like the browser's WebSocket from a URL: the
 * browser's own, or Node's `ws` package.
 */
export type WebSocketConstructor = new (url: string) => object;

export interface SubscribeOptions {
  /** The topics to start with (each 1 to 1024 bytes of UTF-8). */
  topics?: string[];
  /** The WebSocket constructor; `globalThis.WebSocket` by default. */
  WebSocket?: WebSocketConstructor;
  backoff?: Backoff;
  /** A JWT for a bus with `--jwt-secret`, or a function asked on each connect. */
  token?: string | (() => string);
}

export interface Subscriber extends EventTarget {
  /** The topics held: those given and those the bus acknowledged since. */
  readonly topics: string[];
  /**
   * Each topic's position: the last delivered, or where it started before
   * its first delivery; `null` until the bus said either.
   */
  readonly positions: Record<string, Position | null>;
  /** Whether the socket is open now. */
  readonly connected: boolean;
  /** Asks the bus for one more topic (`subscribed` or `error` follows). */
  subscribe(topic: string): void;
  /** Leaves a topic: nothing more of it is delivered or resumed. */
  unsubscribe(topic: string): void;
  /** Stops for good: no reconnect after it. */
  close(): void;
  addEventListener<K extends keyof SubscriberEventMap>(
    type: K,
    listener: (event: SubscriberEventMap[K]) => void,
    options?: boolean | AddEventListenerOptions,
  ): void;
  addEventListener(
    type: string,
    listener: EventListenerOrEventListenerObject | null,
    options?: boolean | AddEventListenerOptions,
  ): void;
  removeEventListener<K extends keyof SubscriberEventMap>(
    type: K,
    listener: (event: SubscriberEventMap[K]) => void,
    options?: boolean | EventListenerOptions,
  ): void;
  removeEventListener(
    type: string,
    listener: EventListenerOrEventListenerObject | null,
    options?: boolean | EventListenerOptions,
  ): void;
}

/**
 * Subscribes to topics on the bus whose WebSocket endpoint is `url`
 * (`ws://host:port/ws`): one socket with `positions=1`, reconnected with
 * capped exponential backoff and full jitter, each topic resumed from the
 * last position delivered.
 */
export function subscribe(url: string, options?: SubscribeOptions): Subscriber;

/** The delay before retry number `attempt` (from 0): random below min(cap, base * 2^attempt). */
export function backoffDelay(
  attempt: number,
  backoff?: Pick<Backoff, "base" | "cap">,
  random?: () => number,
): number;
