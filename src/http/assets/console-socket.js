// One GraphQL subscription over `graphql-transport-ws`, kept alive: it reconnects with
// backoff, answers pings, pings a quiet connection and replaces one that stays silent (a
// connection can die without closing: a lost network, a laptop asleep), and asks the page
// to re-read whatever it may have missed (after every (re)connection and after
// SUBSCRIPTION_LAGGED), reporting each step as a status.
"use strict";

/** The close code Courier gives a missing, wrong or revoked key. */
const KEY_REFUSED = 4403;
const MAX_BACKOFF_MS = 15000;
/** With nothing heard for this long the client pings; with nothing for twice as long (not
 * even the pong), the connection is taken for dead and replaced. */
const QUIET_MS = 10000;

/**
 * A live subscription. `onEvent(data)` gets each `next` payload's data; `onResync(reason)`
 * (may return a promise) re-reads what the page shows; `onStatus(status, detail)` reports
 * "connecting" | "live" | "reconnecting" | "lagged" | "refused" | "stopped";
 * `onFatal(message, keyRefused)` reports what retrying cannot fix.
 */
export class LiveSubscription {
  constructor({ url, token, query, onEvent, onResync, onStatus, onFatal }) {
    Object.assign(this, { url, token, query, onEvent, onResync, onStatus, onFatal });
    this.socket = null;
    this.attempt = 0;
    this.nextId = 1;
    this.current = null;
    this.timer = 0;
    this.watchdog = 0;
    this.lastHeard = 0;
    this.stopped = false;
  }

  /** Opens the connection (and keeps it open until `stop`). */
  start() {
    this.stopped = false;
    this.connect();
  }

  /** Closes the connection for good. */
  stop() {
    this.stopped = true;
    clearTimeout(this.timer);
    clearInterval(this.watchdog);
    if (this.socket) {
      this.socket.onclose = null;
      this.socket.close(1000, "signed out");
      this.socket = null;
    }
    this.onStatus("stopped");
  }

  connect() {
    clearTimeout(this.timer);
    this.onStatus(this.attempt === 0 ? "connecting" : "reconnecting");
    let socket;
    try {
      socket = new WebSocket(this.url, "graphql-transport-ws");
    } catch (err) {
      this.retry();
      return;
    }
    this.socket = socket;
    this.lastHeard = Date.now();
    clearInterval(this.watchdog);
    this.watchdog = setInterval(() => this.checkAlive(socket), QUIET_MS / 2);
    socket.onopen = () => {
      socket.send(JSON.stringify({
        type: "connection_init",
        payload: { Authorization: "Bearer " + this.token },
      }));
    };
    socket.onmessage = (message) => this.receive(socket, message.data);
    socket.onclose = (event) => {
      if (this.socket !== socket) return;
      clearInterval(this.watchdog);
      this.socket = null;
      this.current = null;
      if (event.code === KEY_REFUSED) {
        this.stopped = true;
        this.onStatus("refused");
        this.onFatal("Courier refused this key (revoked, expired or unknown): sign in again.", true);
        return;
      }
      this.retry();
    };
  }

  /** Pings `socket` once it has been quiet a while; replaces it once it stays silent. */
  checkAlive(socket) {
    if (this.socket !== socket) return;
    const quiet = Date.now() - this.lastHeard;
    if (quiet >= 2 * QUIET_MS) {
      // No close event will come in time (the network is gone, not the server's answer):
      // leave this socket and connect afresh.
      clearInterval(this.watchdog);
      socket.onclose = null;
      socket.onmessage = null;
      socket.close();
      this.socket = null;
      this.current = null;
      this.retry();
    } else if (quiet >= QUIET_MS && socket.readyState === WebSocket.OPEN) {
      socket.send(JSON.stringify({ type: "ping" }));
    }
  }

  retry() {
    if (this.stopped) return;
    const base = Math.min(MAX_BACKOFF_MS, 500 * 2 ** this.attempt);
    const delay = Math.round(base * (0.5 + Math.random() / 2));
    this.attempt += 1;
    this.onStatus("reconnecting", delay);
    this.timer = setTimeout(() => this.connect(), delay);
  }

  receive(socket, text) {
    this.lastHeard = Date.now();
    let message;
    try {
      message = JSON.parse(text);
    } catch {
      return;
    }
    switch (message.type) {
      case "connection_ack":
        this.attempt = 0;
        this.subscribe("connected");
        break;
      case "ping":
        socket.send(JSON.stringify({ type: "pong" }));
        break;
      case "next":
        if (message.id === this.current) this.next(message.payload || {});
        break;
      case "error":
        if (message.id === this.current) {
          this.current = null;
          const first = Array.isArray(message.payload) ? message.payload[0] : null;
          this.onFatal((first && first.message) || "the subscription was refused");
        }
        break;
      case "complete":
        // Courier ended the subscription (after a lag or a revocation error): start over.
        if (message.id === this.current) this.subscribe("restarted");
        break;
      default:
        break;
    }
  }

  next(payload) {
    const errors = payload.errors || [];
    const codes = errors.map((error) => error.extensions && error.extensions.code);
    if (codes.includes("SUBSCRIPTION_LAGGED")) {
      // The subscription ends after this error: subscribe again, then re-read.
      this.subscribe("lagged");
      return;
    }
    if (codes.includes("UNAUTHENTICATED") || codes.includes("FORBIDDEN")) {
      this.stop();
      this.onStatus("refused");
      this.onFatal(errors[0].message || "the key was refused", true);
      return;
    }
    if (payload.data) this.onEvent(payload.data);
  }

  /** Starts a new subscription, then re-reads: nothing committed in between is lost. */
  subscribe(reason) {
    const socket = this.socket;
    if (!socket || socket.readyState !== WebSocket.OPEN) return;
    const id = String(this.nextId++);
    this.current = id;
    socket.send(JSON.stringify({ id, type: "subscribe", payload: { query: this.query } }));
    this.onStatus(reason === "lagged" ? "lagged" : "resyncing");
    Promise.resolve(this.onResync(reason))
      .catch(() => undefined)
      .then(() => {
        if (this.current === id && this.socket === socket) this.onStatus("live");
      });
  }
}
