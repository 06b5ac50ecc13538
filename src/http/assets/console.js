// Courier's operator console: endpoints (created and managed by admins and tenants' keys), a
// live delivery feed, a delivery's detail, replay (one or every failed delivery of an
// endpoint), resend, test events and a throughput chart. Signed in with a tenant's key (a
// portal link) it is that tenant's portal. It speaks Courier's public GraphQL API like any
// other client and shows exactly what its API key may see.
"use strict";

import { LiveSubscription } from "./console-socket.js";
import { ThroughputChart } from "./console-chart.js";

const TOKEN_KEY = "courier.token";
/** Rows kept in the feed: the newest; older ones leave the page as new ones stream in. */
const FEED_CAP = 200;
/** Deliveries read when the feed is (re)loaded. */
const READ_PAGE = 50;
/** Endpoints read per request; pages are read until all are, up to ENDPOINT_PAGES. */
const ENDPOINT_PAGE = 100;
const ENDPOINT_PAGES = 20;
const STATES = ["PENDING", "PROCESSING", "DELIVERED", "FAILED"];

const SUBSCRIPTION = `subscription Feed {
  deliveryStateChanged { deliveryId endpointId previousState state at }
}`;
const DELIVERY_ROW = "id state createdAt endpoint { id }";
const DELIVERIES = `query Feed($filter: DeliveryFilter, $first: Int, $after: String) {
  deliveries(filter: $filter, first: $first, after: $after) {
    edges { cursor node { ${DELIVERY_ROW} } }
    pageInfo { hasNextPage }
  }
}`;
const DETAIL = `query Detail($id: ID!) {
  delivery(id: $id) {
    id state cycleAttempts nextAttemptAt lastError createdAt updatedAt orderingKey
    waitingBehind { id state }
    endpoint { id name url }
    submission { id idempotencyKey payload createdAt }
    attempts { number statusCode error superseded startedAt finishedAt durationMs responseBody responseHeaders }
  }
}`;
const REPLAY = `mutation Replay($id: ID!) { replayDelivery(id: $id) { id state } }`;
const REPLAY_FAILED = `mutation ReplayFailed($endpointId: ID!) {
  replayDeliveries(filter: { endpointId: $endpointId }) { replayed }
}`;
const RESEND = `mutation Resend($id: ID!) { resendDelivery(id: $id) { id state } }`;
const TEST_EVENT = `mutation TestEvent($endpointId: ID!) { sendTestEvent(endpointId: $endpointId) { id state } }`;
const WHO = `query Who { currentKey { role tenant { id name } expiresAt } }`;
const TENANTS = `query Tenants($first: Int, $after: String) {
  tenants(first: $first, after: $after) { edges { node { id name } } pageInfo { hasNextPage endCursor } }
}`;
const CREATE_ENDPOINT = `mutation CreateEndpoint($input: CreateEndpointInput!) {
  createEndpoint(input: $input) { endpoint { id name } secret }
}`;
const UPDATE_ENDPOINT = `mutation UpdateEndpoint($id: ID!, $input: UpdateEndpointInput!) {
  updateEndpoint(id: $id, input: $input) { endpoint { id name disabled } secret }
}`;
const ROTATE_SECRET = `mutation RotateSecret($id: ID!) {
  rotateEndpointSecret(id: $id) { endpoint { id name } secret }
}`;
/** Endpoint fields that newer Courier versions add; read only when the schema has them. */
const OPTIONAL_FIELDS = ["disabledReason", "eventTypes", "maxInFlight", "rateLimit", "pausedUntil", "tenant", "health"];
/** How an optional field is selected (fields with sub-fields). */
const OPTIONAL_SELECTION = {
  tenant: "tenant { id name }",
  health: "health { attempts successRate latencyP50Ms latencyP99Ms }",
};
/** Tenants read for an admin's tenant column and filter. */
const TENANT_PAGE = 100;

const $ = (id) => document.getElementById(id);
const timeFormat = new Intl.DateTimeFormat(undefined, {
  hour: "2-digit", minute: "2-digit", second: "2-digit", hourCycle: "h23",
});
const dateTimeFormat = new Intl.DateTimeFormat(undefined, {
  dateStyle: "medium", timeStyle: "medium",
});

const page = {
  token: null,
  live: null,
  chart: null,
  optional: new Set(),
  /** Who is signed in: { role, tenant: { id, name } | null, expiresAt }. */
  identity: null,
  /** An admin's tenants, id -> { id, name }. */
  tenants: new Map(),
  endpoints: new Map(),
  /**
   * The endpoint table's rows as drawn, id -> { key, tr }: a read redraws only the rows of
   * endpoints that changed (their counts are updated in place), so a table of thousands
   * stays cheap to refresh while deliveries flow.
   */
  endpointRows: new Map(),
  /** The endpoint filter's options as drawn: their ids and names, joined. */
  endpointOptions: "",
  /** Whether a read of the endpoints has completed since signing in. */
  endpointsRead: false,
  /** Whether a read of the endpoints is under way, and whether another is to follow it. */
  endpointsReading: false,
  endpointsAgain: false,
  /** id -> { id, endpointId, state, since, el } */
  rows: new Map(),
  /** Ids of the rows, newest first. */
  order: [],
  filter: { endpointId: "", state: "", tenantId: "" },
  /** The endpoint the editor is changing; null while it creates one. */
  editing: null,
  /** What each of the editor's fields showed when it opened (see `openEditor`). */
  editorShown: {},
  /** While the feed is read: the last change events gave meanwhile, by delivery id (they win over the read). */
  touched: null,
  readGeneration: 0,
  queued: [],
  frame: 0,
  countsDirty: new Set(),
  detailId: null,
  detailTimer: 0,
  /** Signs the page out when its key expires (a portal link's). */
  expiryTimer: 0,
  endpointTimer: 0,
  /** How many rows the feed keeps: FEED_CAP, and more once older ones are asked for. */
  cap: FEED_CAP,
  /** Whether the feed holds the oldest delivery its filter matches (nothing older to show). */
  complete: false,
  /** While older deliveries are being read: the states events gave meanwhile, by id. */
  olderTouched: null,
  /** Endpoints heard of in events but not yet read, already asked for. */
  unknownEndpoints: new Set(),
  /**
   * The tenants of endpoints the page has not read (past the endpoints it reads), learned
   * from deliveries the API listed under a tenant filter: by endpoint id.
   */
  tenantOf: new Map(),
  /** Endpoint reads: the newest one started (an older answer is dropped). */
  endpointGeneration: 0,
  quietTimer: 0,
  busyTimer: 0,
  pauseTimer: 0,
  rereadTimer: 0,
  /** How far Courier's clock is ahead of this browser's, in milliseconds (see noteClock). */
  serverAhead: 0,
};

// ---------- GraphQL over HTTP

class ApiError extends Error {
  constructor(errors) {
    const first = errors[0] || {};
    super(first.message || "the request failed");
    this.code = (first.extensions && first.extensions.code) || "ERROR";
    this.extensions = first.extensions || {};
  }
}

async function gql(query, variables = {}) {
  let response;
  try {
    response = await fetch(new URL("graphql", document.baseURI), {
      method: "POST",
      headers: {
        "content-type": "application/json",
        accept: "application/graphql-response+json, application/json",
        authorization: "Bearer " + page.token,
      },
      body: JSON.stringify({ query, variables }),
      cache: "no-store",
      credentials: "omit",
    });
  } catch (err) {
    throw new ApiError([{ message: "Courier did not answer.", extensions: { code: "NETWORK" } }]);
  }
  noteClock(response);
  let body;
  try {
    body = await response.json();
  } catch {
    throw new ApiError([{ message: `HTTP ${response.status}`, extensions: { code: "HTTP" } }]);
  }
  if (body.errors && body.errors.length) throw new ApiError(body.errors);
  return body.data;
}

/** Notes how far Courier's clock is ahead of this browser's, from the `Date` of an answer
 * (whole seconds, so its middle), so that an expiry, which Courier judges by its own clock,
 * is judged here by the same clock, however wrong this browser's is. */
function noteClock(response) {
  const date = Date.parse(response.headers.get("date") || "");
  if (!Number.isNaN(date)) page.serverAhead = date + 500 - Date.now();
}

/** Now by Courier's clock, as far as noteClock knows it. */
function courierNow() {
  return Date.now() + page.serverAhead;
}

// ---------- small DOM helpers

/** `text` set apart from the sentence around it (Unicode's first-strong isolate), without
 * the direction controls of its own (which could close the isolate early): a name holding
 * a right-to-left override cannot turn the rest of the sentence, or the URL beside it,
 * around. */
function isolate(text) {
  return `\u2068${String(text).replace(/[\u202a-\u202e\u2066-\u2069]/g, "")}\u2069`;
}

function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key.startsWith("data-") || key.startsWith("aria-")) node.setAttribute(key, value);
    else node[key] = value;
  }
  for (const child of children) if (child != null) node.append(child);
  return node;
}

function notify(message, tone = "info") {
  const notice = $("notice");
  notice.textContent = message;
  notice.dataset.tone = tone;
  notice.hidden = false;
  clearTimeout(notify.timer);
  notify.timer = setTimeout(() => { notice.hidden = true; }, 8000);
}

function shortId(id) {
  return id.slice(0, 8) + "…" + id.slice(-4);
}

function formatTime(iso) {
  const date = new Date(iso);
  return Number.isNaN(date.getTime()) ? "" : timeFormat.format(date);
}

function formatDateTime(iso) {
  const date = new Date(iso);
  return Number.isNaN(date.getTime()) ? "" : dateTimeFormat.format(date);
}

// ---------- connection status

const STATUS_TEXT = {
  connecting: "Connecting…",
  resyncing: "Reading…",
  live: "Live",
  reconnecting: "Reconnecting…",
  lagged: "Lagged: re-reading…",
  refused: "Key refused",
  stopped: "Signed out",
};

function showStatus(status, delay) {
  const node = $("connection");
  node.dataset.status = status;
  node.textContent = status === "reconnecting" && delay
    ? `Reconnecting in ${Math.max(1, Math.round(delay / 1000))} s…`
    : STATUS_TEXT[status] || status;
}

// ---------- sign-in

/** The token in the address bar's fragment, if any, taken out of it and its history entry. */
function takeFragmentToken() {
  const token = new URLSearchParams(window.location.hash.slice(1)).get("token");
  if (token) history.replaceState(null, "", window.location.pathname);
  return token;
}

/** The token to start with: the fragment's, else the one this tab kept. */
function tokenFromFragment() {
  const token = takeFragmentToken();
  if (token) sessionStorage.setItem(TOKEN_KEY, token);
  return sessionStorage.getItem(TOKEN_KEY);
}

/** Another #token= link opened in this tab (only the fragment changes): sign in with it. */
function signInFromNewFragment() {
  const token = takeFragmentToken();
  if (!token || token === page.token) return;
  if (page.token) signOut();
  signIn(token);
}

/** Why a key signed in a while ago was refused: an expired one says so. */
function refusalMessage(fallback) {
  const identity = page.identity;
  if (!identity || !identity.expiresAt || Date.parse(identity.expiresAt) > courierNow() + 5000) {
    return fallback;
  }
  const at = formatDateTime(identity.expiresAt);
  return identity.tenant
    ? `This portal link expired at ${at}: ask whoever gave it to you for a new one.`
    : `This key expired at ${at}: sign in with another.`;
}

function showSignIn(message = "") {
  $("dashboard").hidden = true;
  $("sign-out").hidden = true;
  $("sign-in").hidden = false;
  $("sign-in-error").textContent = message;
  $("token").focus();
}

function signOut(message = "") {
  sessionStorage.removeItem(TOKEN_KEY);
  // GraphiQL's tabs and history in this tab go with the key.
  for (const key of Object.keys(sessionStorage)) {
    if (key.startsWith("graphiql:")) sessionStorage.removeItem(key);
  }
  page.token = null;
  page.identity = null;
  page.tenants = new Map();
  renderIdentity();
  if (page.live) page.live.stop();
  page.live = null;
  clearInterval(page.endpointTimer);
  for (const timer of ["quietTimer", "busyTimer", "pauseTimer", "rereadTimer", "detailTimer", "expiryTimer"]) {
    clearTimeout(page[timer]);
    page[timer] = 0;
  }
  // Nothing the key could see stays on the page: open dialogs close, lists empty.
  for (const dialog of document.querySelectorAll("dialog[open]")) dialog.close();
  $("detail-body").replaceChildren();
  page.endpointGeneration += 1;
  page.readGeneration += 1;
  clearTimeout(notify.timer);
  $("notice").hidden = true;
  for (const note of ["endpoints-note", "feed-count", "endpoint-health"]) $(note).textContent = "";
  page.endpoints = new Map();
  page.endpointRows = new Map();
  page.endpointOptions = "";
  page.endpointsRead = false;
  page.endpointsReading = false;
  page.endpointsAgain = false;
  page.rows = new Map();
  page.order = [];
  page.queued = [];
  page.unknownEndpoints = new Set();
  page.tenantOf = new Map();
  $("feed").replaceChildren();
  $("endpoints").tBodies[0].replaceChildren();
  // The next key starts afresh: no filter, chart or half-typed form of this one's.
  page.filter = { endpointId: "", state: "", tenantId: "" };
  renderEndpointActions();
  $("filter-state").value = "";
  $("filter-endpoint").replaceChildren();
  $("editor-form").reset();
  if (page.chart) page.chart.reset();
  document.title = "Courier console";
  showStatus("stopped");
  showSignIn(message);
}

async function signIn(token) {
  page.token = token;
  try {
    await discoverOptionalFields();
    await readIdentity(token);
  } catch (err) {
    if (page.token !== token) return;
    const refused = err.code === "UNAUTHENTICATED" || err.code === "FORBIDDEN";
    signOut(refused
      ? "Courier refused that token: it is wrong or revoked, or its portal link has expired."
      : `Courier could not be reached: ${err.message}`);
    return;
  }
  // Signed out (or in with another key) while these were read: that sign-in is over.
  if (page.token !== token) return;
  sessionStorage.setItem(TOKEN_KEY, token);
  $("sign-in").hidden = true;
  $("dashboard").hidden = false;
  $("sign-out").hidden = false;
  if (!page.chart) page.chart = new ThroughputChart($("chart"), $("chart-summary"));
  const url = new URL("graphql/ws", document.baseURI);
  url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
  page.live = new LiveSubscription({
    url: url.toString(),
    token,
    query: SUBSCRIPTION,
    onEvent: (data) => receive(data.deliveryStateChanged),
    onResync: () => reread(),
    onStatus: showStatus,
    onFatal: (message, keyRefused) => (keyRefused ? signOut(refusalMessage(message)) : notify(message, "error")),
  });
  page.live.start();
  // A backstop for what changes without a delivery event: retention pruning, settings
  // another user changed.
  clearInterval(page.endpointTimer);
  page.endpointTimer = setInterval(refreshEndpoints, 15000);
  await reread();
}

/** Which optional Endpoint fields this Courier has (introspection; also checks the key). */
async function discoverOptionalFields() {
  const data = await gql(`{ __type(name: "Endpoint") { fields { name } } }`);
  const names = new Set(((data.__type && data.__type.fields) || []).map((f) => f.name));
  page.optional = new Set(OPTIONAL_FIELDS.filter((name) => names.has(name)));
  for (const cell of document.querySelectorAll("[data-optional]")) {
    cell.hidden = !page.optional.has(cell.dataset.optional);
  }
}

// ---------- who is signed in

/** Reads the key's role and tenant; an admin's tenants too, for the tenant column and filter. */
/** Reads who `token` is; shown only while the page is still signed in with it. */
async function readIdentity(token) {
  const identity = (await gql(WHO)).currentKey;
  const tenants = await readTenants(identity);
  if (page.token !== token) return;
  page.identity = identity;
  page.tenants = tenants;
  renderIdentity();
  signOutAtExpiry(token);
}

/** The longest wait a browser timer takes (about 24.8 days); a later expiry is looked at again then. */
const LONGEST_TIMER_MS = 2 ** 31 - 1;

/** How long after its expiry a key signs out: a little over refusalMessage's margin, so it says why. */
const EXPIRY_MARGIN_MS = 6000;

/**
 * A key that expires (a portal link's) signs the page out when it does, by Courier's
 * clock, whether or not Courier can be reached then to refuse it. The timer looks again
 * when it fires (a machine asleep, or Courier's clock read afresh, moves the expiry), and
 * so does a tab shown again.
 */
function signOutAtExpiry(token = page.token) {
  clearTimeout(page.expiryTimer);
  page.expiryTimer = 0;
  const expiresAt = page.token === token && page.identity && page.identity.expiresAt;
  if (!expiresAt) return;
  const wait = Date.parse(expiresAt) + EXPIRY_MARGIN_MS - courierNow();
  if (wait <= 0) {
    signOut(refusalMessage("This key has expired."));
    return;
  }
  page.expiryTimer = setTimeout(() => signOutAtExpiry(token), Math.min(wait, LONGEST_TIMER_MS));
}

/** An admin's tenants (none for other keys), id -> { id, name }, page by page (up to ENDPOINT_PAGES). */
async function readTenants(identity) {
  const tenants = new Map();
  if (!identity || identity.role !== "ADMIN") return tenants;
  let after = null;
  let more = true;
  for (let n = 0; more && n < ENDPOINT_PAGES; n++) {
    const data = await gql(TENANTS, { first: TENANT_PAGE, after });
    for (const { node } of data.tenants.edges) tenants.set(node.id, node);
    more = data.tenants.pageInfo.hasNextPage;
    after = data.tenants.pageInfo.endCursor;
  }
  return tenants;
}

/** Whether this key may create and change endpoints: admins and tenants' keys. */
function canManage() {
  return Boolean(page.identity && (page.identity.role === "ADMIN" || page.identity.tenant));
}

/** Whether the endpoints table shows each endpoint's tenant (an admin with tenants). */
function showsTenants() {
  return Boolean(page.identity && page.identity.role === "ADMIN" && page.tenants.size && page.optional.has("tenant"));
}

function renderIdentity() {
  const identity = page.identity;
  const node = $("identity");
  node.hidden = !identity;
  if (!identity) {
    node.replaceChildren();
    node.title = "";
  } else {
    if (identity.tenant) node.replaceChildren(el("bdi", { text: identity.tenant.name }), " portal");
    else node.textContent = identity.role === "ADMIN" ? "Admin" : "Partner";
    node.title = identity.expiresAt ? `Signed in until ${formatDateTime(identity.expiresAt)}` : "";
  }
  // A key that expires (a portal link's) says until when, in plain sight.
  const until = $("key-expiry");
  until.hidden = !(identity && identity.expiresAt);
  until.textContent = until.hidden ? "" : `until ${formatDateTime(identity.expiresAt)}`;
  if (identity) {
    document.title = identity.tenant ? `${isolate(identity.tenant.name)}: Courier portal` : "Courier console";
  }
  $("new-endpoint").hidden = !canManage();
  for (const cell of document.querySelectorAll('[data-column="tenant"]')) cell.hidden = !showsTenants();
  $("dashboard").classList.toggle("with-tenants", showsTenants());
  $("tenant-filter").hidden = !showsTenants();
  const select = $("filter-tenant");
  select.replaceChildren(
    el("option", { value: "", text: "All tenants" }),
    ...[...page.tenants.values()].map((t) => el("option", { value: t.id, text: t.name })));
  select.value = page.tenants.has(page.filter.tenantId) ? page.filter.tenantId : "";
}

// ---------- endpoints

function endpointsQuery() {
  const optional = [...page.optional].map((name) => OPTIONAL_SELECTION[name] || name).join(" ");
  return `query Endpoints($first: Int, $after: String) {
    endpoints(first: $first, after: $after) {
      edges { node { id name url disabled ${optional}
        deliveryCounts { pending processing delivered failed total } } }
      pageInfo { hasNextPage endCursor }
    }
  }`;
}

/**
 * Reads every endpoint afresh (page by page, up to ENDPOINT_PAGES of them), and an admin's
 * tenants with them; an answer overtaken by a later read is dropped.
 */
async function readEndpoints() {
  const generation = ++page.endpointGeneration;
  page.endpointsReading = true;
  try {
    await readEndpointPages(generation);
  } finally {
    if (generation === page.endpointGeneration) {
      page.endpointsReading = false;
      // Activity during the read asks for another, after it.
      if (page.endpointsAgain) {
        page.endpointsAgain = false;
        endpointsChanged();
      }
    }
  }
}

/** The body of [readEndpoints]: the read numbered `generation`. */
async function readEndpointPages(generation) {
  const tenantsRead = readTenants(page.identity);
  // Awaited below; if reading the endpoints fails first, its failure is that one's.
  tenantsRead.catch(() => undefined);
  const endpoints = new Map();
  let after = null;
  let more = true;
  for (let n = 0; more && n < ENDPOINT_PAGES; n++) {
    const data = await gql(endpointsQuery(), { first: ENDPOINT_PAGE, after });
    if (generation !== page.endpointGeneration) return;
    for (const { node } of data.endpoints.edges) endpoints.set(node.id, node);
    more = data.endpoints.pageInfo.hasNextPage;
    after = data.endpoints.pageInfo.endCursor;
    // The first read after signing in shows each page as it comes.
    if (!page.endpointsRead && more) {
      page.endpoints = new Map(endpoints);
      $("endpoints-note").textContent = `(${endpoints.size} so far)`;
      renderEndpoints();
    }
  }
  const tenants = await tenantsRead;
  if (generation !== page.endpointGeneration) return;
  // Feed rows name their endpoint: only those of an endpoint renamed (or new) are redrawn.
  const renamed = new Set([...endpoints.values()]
    .filter((endpoint) => page.endpoints.get(endpoint.id)?.name !== endpoint.name)
    .map((endpoint) => endpoint.id));
  page.endpoints = endpoints;
  page.endpointsRead = true;
  for (const id of endpoints.keys()) page.unknownEndpoints.delete(id);
  $("endpoints-note").textContent = more ? `(the first ${endpoints.size})` : `(${endpoints.size})`;
  const tenantsChanged = tenants.size !== page.tenants.size
    || [...tenants.values()].some((t) => page.tenants.get(t.id)?.name !== t.name);
  if (tenantsChanged) {
    page.tenants = tenants;
    renderIdentity();
  }
  renderEndpoints();
  for (const row of page.rows.values()) {
    if (renamed.has(row.endpointId)) paintRow(row);
  }
  wakeWhenPauseEnds();
}

/**
 * Counts follow events between reads, but an event can also be in the read it follows (it
 * committed before the read and arrived after it): so endpoints are read again soon after
 * activity, 1.5 s after the last event and at least every 5 s while events keep coming,
 * which also brings health, pauses and disables up to date.
 */
function endpointsChanged() {
  clearTimeout(page.quietTimer);
  page.quietTimer = setTimeout(refreshEndpoints, 1500);
  if (!page.busyTimer) page.busyTimer = setTimeout(refreshEndpoints, 5000);
}

function refreshEndpoints() {
  clearTimeout(page.quietTimer);
  clearTimeout(page.busyTimer);
  page.quietTimer = 0;
  page.busyTimer = 0;
  if (!page.token) return;
  // A read under way is let finish (restarting it could keep a long one from ever
  // finishing while events come): another follows it.
  if (page.endpointsReading) {
    page.endpointsAgain = true;
    return;
  }
  readEndpoints().catch(() => undefined);
}

/** Reads the endpoints again when the first pause shown ends. */
function wakeWhenPauseEnds() {
  clearTimeout(page.pauseTimer);
  page.pauseTimer = 0;
  const now = courierNow();
  const ends = [...page.endpoints.values()]
    .map((endpoint) => (endpoint.pausedUntil ? Date.parse(endpoint.pausedUntil) : NaN))
    .filter((at) => at > now);
  if (!ends.length) return;
  const wait = Math.min(Math.min(...ends) - now + 500, 3600000);
  page.pauseTimer = setTimeout(refreshEndpoints, wait);
}

/**
 * Draws the endpoint table and the endpoint filter's options. A row is rebuilt only when
 * what it shows of its endpoint changed (counts are written into the cells it has), and
 * the table is re-laid only when its rows or their order changed.
 */
function renderEndpoints() {
  const body = $("endpoints").tBodies[0];
  const tenants = showsTenants();
  const drawn = new Map();
  const rows = [];
  for (const endpoint of page.endpoints.values()) {
    if (!inChosenTenant(endpoint)) continue;
    const key = rowKey(endpoint, tenants);
    const kept = page.endpointRows.get(endpoint.id);
    let tr;
    if (kept && kept.key === key) {
      tr = kept.tr;
      writeCounts(tr, endpoint.deliveryCounts);
    } else {
      tr = endpointRow(endpoint, tenants);
    }
    drawn.set(endpoint.id, { key, tr });
    rows.push(tr);
  }
  page.endpointRows = drawn;
  if (!rows.length) {
    rows.push(el("tr", {}, el("td", { colSpan: 10, class: "note", text: "No endpoints this key may see." })));
  }
  placeRows(body, rows);
  const select = $("filter-endpoint");
  const chosen = page.filter.endpointId;
  const choices = [...page.endpoints.values()].filter(inChosenTenant);
  const options = JSON.stringify(choices.map((e) => [e.id, e.name]));
  if (options !== page.endpointOptions) {
    page.endpointOptions = options;
    select.replaceChildren(
      el("option", { value: "", text: "All endpoints" }),
      ...choices.map((e) => el("option", { value: e.id, text: e.name })));
  }
  select.value = page.endpoints.has(chosen) ? chosen : "";
  renderEndpointActions();
}

/** What an endpoint's row shows but its counts: a row is rebuilt when this changes. */
function rowKey(endpoint, tenants) {
  return JSON.stringify([
    endpoint.name, endpoint.url, endpoint.disabled, endpoint.disabledReason,
    endpoint.eventTypes, endpoint.maxInFlight, endpoint.rateLimit, endpoint.pausedUntil,
    tenants && endpoint.tenant ? endpoint.tenant.name : null, tenants, [...page.optional],
  ]);
}

/**
 * Makes `rows` the children of `body`, in order, moving as few as it can: rows that go are
 * removed, then each row not already in its place is put there. A row left in place keeps
 * the focus it holds (a row moved loses it).
 */
function placeRows(body, rows) {
  const wanted = new Set(rows);
  for (const child of [...body.children]) {
    if (!wanted.has(child)) child.remove();
  }
  let at = body.firstElementChild;
  for (const tr of rows) {
    if (at === tr) {
      at = at.nextElementSibling;
    } else {
      body.insertBefore(tr, at);
    }
  }
}

/** One endpoint's row of the table. */
function endpointRow(endpoint, tenants) {
  const status = endpoint.disabled
    ? "Disabled" + (endpoint.disabledReason ? ` (${endpoint.disabledReason})` : "")
    : "Enabled";
  const types = endpoint.eventTypes && endpoint.eventTypes.length
    ? endpoint.eventTypes.join(", ") : "every type";
  const flow = [];
  if (endpoint.maxInFlight != null) flow.push(String(endpoint.maxInFlight));
  if (endpoint.rateLimit != null) flow.push(`${endpoint.rateLimit}/s`);
  const flowTitle = [
    endpoint.maxInFlight != null ? `at most ${endpoint.maxInFlight} requests in flight` : null,
    endpoint.rateLimit != null ? `at most ${endpoint.rateLimit} starts a second` : "no rate limit",
  ].filter(Boolean).join(", ");
  const paused = endpoint.pausedUntil ? new Date(endpoint.pausedUntil) : null;
  const counts = endpoint.deliveryCounts;
  return el("tr", { "data-endpoint-id": endpoint.id },
    el("th", { scope: "row" },
      el("button", {
        type: "button", class: "link", text: endpoint.name,
        title: `Show only the deliveries of ${isolate(endpoint.name)}`, "data-filter-endpoint": endpoint.id,
      })),
    tenants ? el("td", {
      class: "tenant", text: endpoint.tenant ? endpoint.tenant.name : "—",
      title: endpoint.tenant ? endpoint.tenant.name : "no tenant",
    }) : null,
    el("td", { class: "url", text: endpoint.url, title: endpoint.url }),
    el("td", { class: endpoint.disabled ? "disabled" : "enabled", text: status }),
    page.optional.has("eventTypes") ? el("td", { class: "types", title: types }, el("span", { text: types })) : null,
    page.optional.has("maxInFlight") ? el("td", { class: "flow", "data-flow": endpoint.id },
      el("span", { text: flow.join(" · "), title: flowTitle }),
      paused ? el("span", {
        class: "paused", "data-paused-until": endpoint.pausedUntil,
        text: ` · paused to ${timeFormat.format(paused)}`,
        title: "It answered 429 or 503 with Retry-After: nothing is sent until then",
      }) : null) : null,
    ...STATES.map((state) => el("td", {
      class: "num", "data-count": state, text: countText(counts, state),
    })));
}

/** Writes `counts` into a row's count cells, touching only the cells that change. */
function writeCounts(tr, counts) {
  for (const state of STATES) {
    const cell = tr.querySelector(`[data-count="${state}"]`);
    const text = countText(counts, state);
    if (cell && cell.textContent !== text) cell.textContent = text;
  }
}

function renderCounts() {
  for (const id of page.countsDirty) {
    const endpoint = page.endpoints.get(id);
    const drawn = page.endpointRows.get(id);
    if (endpoint && drawn) writeCounts(drawn.tr, endpoint.deliveryCounts);
  }
  page.countsDirty.clear();
  renderEndpointActions();
}

/** A count as shown: never below zero while an event counted twice waits for the next read. */
function countText(counts, state) {
  return String(Math.max(0, counts[state.toLowerCase()]));
}

/** The chosen endpoint's actions (shown while the feed is filtered to one endpoint). */
function renderEndpointActions() {
  const group = $("endpoint-actions");
  const endpoint = page.endpoints.get(page.filter.endpointId);
  group.hidden = !endpoint;
  if (!endpoint) {
    // Hidden, they name no endpoint either: the next key starts afresh.
    for (const button of group.querySelectorAll("button")) {
      delete button.dataset.endpointId;
      button.removeAttribute("aria-label");
    }
    $("endpoint-health").textContent = "";
    return;
  }
  const failed = endpoint.deliveryCounts.failed;
  const manage = canManage();
  for (const button of group.querySelectorAll("[data-manage]")) {
    button.hidden = !manage;
    button.dataset.endpointId = endpoint.id;
  }
  const toggle = group.querySelector('[data-action="toggle-endpoint"]');
  toggle.textContent = endpoint.disabled ? "Enable" : "Disable";
  toggle.setAttribute("aria-label", `${endpoint.disabled ? "Enable" : "Disable"} ${isolate(endpoint.name)}`);
  const test = group.querySelector('[data-action="test-event"]');
  const replayFailed = group.querySelector('[data-action="replay-failed"]');
  for (const button of [test, replayFailed]) button.dataset.endpointId = endpoint.id;
  test.setAttribute("aria-label", `Send ${isolate(endpoint.name)} a test webhook`);
  replayFailed.textContent = failed ? `Replay ${failed} failed` : "Replay failed";
  replayFailed.setAttribute("aria-label", `Replay every failed delivery of ${isolate(endpoint.name)}`);
  if (!replayFailed.dataset.busy) replayFailed.disabled = failed === 0;
  $("endpoint-health").textContent = healthText(endpoint.health);
}

/** An endpoint's last hour in one line (nothing when the server does not report it). */
function healthText(health) {
  if (!health) return "";
  if (health.attempts === 0) return "No attempts in the last hour";
  const rate = Math.round(health.successRate * 1000) / 10;
  return `Last hour: ${rate}% of ${health.attempts} attempts answered 2xx; ` +
    `p50 ≤ ${health.latencyP50Ms} ms, p99 ≤ ${health.latencyP99Ms} ms`;
}

// ---------- the feed

function matchesFilter(row) {
  const { endpointId, state, tenantId } = page.filter;
  if (tenantId) {
    const endpoint = page.endpoints.get(row.endpointId);
    const inTenant = endpoint ? inChosenTenant(endpoint) : page.tenantOf.get(row.endpointId) === tenantId;
    if (!inTenant) return false;
  }
  return (!endpointId || row.endpointId === endpointId) && (!state || row.state === state);
}

/**
 * A feed row for a delivery the API listed under the feed's filter: under a tenant filter,
 * its endpoint is that tenant's, though the page may not have read the endpoint (it reads
 * the first ENDPOINT_PAGES pages of them).
 */
function listedRow(edge) {
  const row = readRow(edge);
  if (page.filter.tenantId && !page.endpoints.has(row.endpointId)) {
    page.tenantOf.set(row.endpointId, page.filter.tenantId);
  }
  return row;
}

/** Whether the endpoint belongs to the tenant an admin chose (any, when none is chosen). */
function inChosenTenant(endpoint) {
  const chosen = page.filter.tenantId;
  return !chosen || Boolean(endpoint.tenant && endpoint.tenant.id === chosen);
}

/** The deliveries filter the feed shows. */
function feedFilter() {
  const filter = {};
  if (page.filter.endpointId) filter.endpointId = page.filter.endpointId;
  if (page.filter.state) filter.state = page.filter.state;
  if (page.filter.tenantId) filter.tenantId = page.filter.tenantId;
  return filter;
}

/** A feed row for a delivery read from the API (an edge: its cursor continues the listing). */
function readRow({ cursor, node }) {
  return { id: node.id, endpointId: node.endpoint.id, state: node.state, since: node.createdAt, cursor };
}

/**
 * Whether delivery `a` comes before `b` in the feed, newest first: by id, the API's own
 * order (ids are UUIDv7, minted as deliveries are created, so this is creation order up to
 * clocks and moments apart, and one order however many processes wrote them).
 */
function newer(a, b) {
  return a.id > b.id;
}

/**
 * When a delivery was created, read off its id: a UUIDv7 starts with the Unix milliseconds
 * it was minted at, which Courier does as it creates the delivery. Null for other ids.
 */
function createdAtOf(id) {
  if (typeof id !== "string" || id.length !== 36 || id[14] !== "7") return null;
  const ms = Number.parseInt(id.slice(0, 8) + id.slice(9, 13), 16);
  return Number.isFinite(ms) ? new Date(ms).toISOString() : null;
}

/** Reads endpoints and the newest deliveries; events that arrive meanwhile win over the read. */
async function reread() {
  const generation = ++page.readGeneration;
  page.touched = new Map();
  page.cap = FEED_CAP;
  const filter = feedFilter();
  try {
    const [, data] = await Promise.all([
      readEndpoints(),
      gql(DELIVERIES, { filter, first: READ_PAGE }),
    ]);
    if (generation !== page.readGeneration) return;
    flush();
    const touched = page.touched;
    const rows = new Map();
    const edges = data.deliveries.edges;
    for (const edge of edges) {
      const row = listedRow(edge);
      const change = touched.get(row.id);
      if (change) row.state = change.state;
      if (matchesFilter(row)) rows.set(row.id, row);
    }
    const complete = !data.deliveries.pageInfo.hasNextPage;
    const bottom = edges.length ? edges[edges.length - 1].node : null;
    for (const [id, change] of touched) {
      // Changed meanwhile and not in the read (created during it, or the page moved on):
      // shown unless older than the page read (the feed has no gaps).
      if (rows.has(id)) continue;
      const row = {
        id, endpointId: change.endpointId, state: change.state,
        since: (page.rows.get(id) || {}).since || createdAtOf(id) || change.at,
      };
      if (matchesFilter(row) && (complete || !bottom || newer(row, bottom))) rows.set(id, row);
    }
    const order = [...rows.values()].sort((a, b) => (newer(a, b) ? -1 : 1)).slice(0, FEED_CAP);
    page.rows = new Map(order.map((row) => [row.id, row]));
    page.order = order.map((row) => row.id);
    $("feed").replaceChildren(...order.map((row) => rowElement(row)));
    setComplete(complete && rows.size <= FEED_CAP);
    updateFeedCount();
  } catch (err) {
    if (err.code === "UNAUTHENTICATED") signOut(refusalMessage("Courier refused the key: sign in again."));
    else notify(`Could not read deliveries: ${err.message}`, "error");
  } finally {
    if (generation === page.readGeneration) page.touched = null;
  }
}

function rowElement(row) {
  const endpoint = page.endpoints.get(row.endpointId);
  const name = endpoint ? endpoint.name : shortId(row.endpointId);
  row.el = el("li", { class: "delivery", "data-delivery-id": row.id, "data-state": row.state },
    el("button", { type: "button", class: "open", "data-action": "open", "aria-label": "" },
      el("span", { class: "badge", text: row.state }),
      el("span", { class: "endpoint", text: name }),
      el("code", { class: "id", text: shortId(row.id) }),
      el("time", { dateTime: row.since, text: formatTime(row.since) })),
    el("span", { class: "act" }));
  paintRow(row);
  return row.el;
}

/** Brings a row's element up to its state: badge, label and (for FAILED) the replay control. */
function paintRow(row) {
  const node = row.el;
  if (!node) return;
  node.dataset.state = row.state;
  node.querySelector(".badge").textContent = row.state;
  const endpoint = page.endpoints.get(row.endpointId);
  node.querySelector(".endpoint").textContent = endpoint ? endpoint.name : shortId(row.endpointId);
  node.querySelector(".open").setAttribute("aria-label",
    `Delivery ${row.id}, ${row.state}, endpoint ${isolate(endpoint ? endpoint.name : row.endpointId)}: show detail`);
  const act = node.querySelector(".act");
  const replay = act.querySelector('[data-action="replay"]');
  if (row.state === "FAILED" && !replay) {
    act.append(el("button", {
      type: "button", class: "replay", text: "Replay", "data-action": "replay",
      "aria-label": `Replay delivery ${row.id}`,
    }));
  } else if (row.state !== "FAILED" && replay) {
    replay.remove();
  }
}

function updateFeedCount() {
  $("feed-count").textContent = `${page.order.length} shown`;
}

/** One state change from the subscription: counted now, painted on the next frame. */
function receive(change) {
  if (!change) return;
  if (change.state === "DELIVERED") page.chart.record("delivered");
  else if (change.previousState === "PROCESSING") page.chart.record("failed");
  const endpoint = page.endpoints.get(change.endpointId);
  if (endpoint) {
    const counts = endpoint.deliveryCounts;
    if (change.previousState) counts[change.previousState.toLowerCase()] -= 1;
    else counts.total += 1;
    counts[change.state.toLowerCase()] += 1;
    page.countsDirty.add(change.endpointId);
    endpointsChanged();
  } else if (!page.unknownEndpoints.has(change.endpointId)) {
    // An endpoint created since the last read (by someone else): read it, once; with the
    // feed under a tenant filter, which cannot place its deliveries without it.
    page.unknownEndpoints.add(change.endpointId);
    clearTimeout(page.rereadTimer);
    page.rereadTimer = setTimeout(() => {
      page.rereadTimer = 0;
      if (page.filter.tenantId) reread();
      else refreshEndpoints();
    }, 500);
  }
  if (page.touched) page.touched.set(change.deliveryId, change);
  if (page.olderTouched) page.olderTouched.set(change.deliveryId, change.state);
  page.queued.push(change);
  if (!page.frame) page.frame = requestAnimationFrame(flush);
  if (page.detailId === change.deliveryId) {
    clearTimeout(page.detailTimer);
    page.detailTimer = setTimeout(() => showDetail(change.deliveryId, false), 250);
  }
}

/** Applies queued changes to the feed in one pass (many events, one layout). */
function flush() {
  cancelAnimationFrame(page.frame);
  page.frame = 0;
  const changes = page.queued;
  page.queued = [];
  const repaint = new Set();
  for (const change of changes) {
    let row = page.rows.get(change.deliveryId);
    if (row) {
      row.state = change.state;
      repaint.add(row);
      continue;
    }
    // A delivery the feed does not hold: new, or one it never held or let go of. Either
    // way it goes where its creation puts it, and not at all when that is older than
    // every row a full feed keeps.
    const since = change.previousState ? createdAtOf(change.deliveryId) || change.at : change.at;
    row = { id: change.deliveryId, endpointId: change.endpointId, state: change.state, since };
    if (!matchesFilter(row) || !place(row)) continue;
  }
  for (const row of repaint) {
    if (!matchesFilter(row)) {
      removeRow(row);
    } else if (row.el) {
      paintRow(row);
    }
  }
  // Rows leave the bottom past the cap, but not while older ones are being read to go
  // below it: the read goes on from there.
  while (!page.olderTouched && page.order.length > page.cap) {
    const row = page.rows.get(page.order[page.order.length - 1]);
    if (row) removeRow(row);
    else page.order.pop();
    setComplete(false);
  }
  renderCounts();
  updateFeedCount();
}

/**
 * Puts a row into the feed in the API's order, newest first. The feed is always the newest
 * deliveries its filter matches, without gaps: a row older than its oldest goes below it
 * only when nothing older exists; otherwise it is left for "Show older" (false).
 */
function place(row) {
  const at = page.order.findIndex((id) => {
    const other = page.rows.get(id);
    return other && newer(row, other);
  });
  if (at === -1 && (!page.complete || page.order.length >= page.cap)) return false;
  page.rows.set(row.id, row);
  const node = rowElement(row);
  if (at === -1) {
    $("feed").append(node);
    page.order.push(row.id);
  } else {
    page.rows.get(page.order[at]).el.before(node);
    page.order.splice(at, 0, row.id);
  }
  return true;
}

/** Records whether anything older than the feed's oldest row exists, and offers it if so. */
function setComplete(complete) {
  page.complete = complete;
  $("feed-older").hidden = complete;
}

/**
 * Adds the next page of older deliveries below the feed's oldest row. The listing goes on
 * from the lowest row read from the API (rows that arrived live have no cursor; those
 * below it come again and are skipped), so nothing between is passed over. Events that
 * arrive meanwhile win over the read, as in [reread].
 */
async function showOlder(button) {
  const generation = page.readGeneration;
  const filter = feedFilter();
  let after = null;
  for (let i = page.order.length - 1; i >= 0; i--) {
    const row = page.rows.get(page.order[i]);
    if (row && row.cursor) {
      after = row.cursor;
      break;
    }
  }
  button.disabled = true;
  page.olderTouched = new Map();
  try {
    let added = 0;
    let more = true;
    // Pages that hold only rows shown already (after a stretch of live rows) are passed.
    for (let pages = 0; more && added === 0 && pages < 10; pages++) {
      const data = await gql(DELIVERIES, { filter, first: READ_PAGE, after });
      if (generation !== page.readGeneration) return;
      flush();
      const feed = $("feed");
      for (const edge of data.deliveries.edges) {
        const shown = page.rows.get(edge.node.id);
        if (shown) {
          shown.cursor = edge.cursor;
          continue;
        }
        // Only what is older than the feed's bottom goes below it (newer rows are shown).
        const bottom = page.rows.get(page.order[page.order.length - 1]);
        if (bottom && !newer(bottom, edge.node)) continue;
        const row = listedRow(edge);
        const state = page.olderTouched.get(row.id);
        if (state) row.state = state;
        if (!matchesFilter(row)) continue;
        page.rows.set(row.id, row);
        page.order.push(row.id);
        feed.append(rowElement(row));
        added += 1;
      }
      more = data.deliveries.pageInfo.hasNextPage;
      const last = data.deliveries.edges[data.deliveries.edges.length - 1];
      after = last ? last.cursor : after;
    }
    page.cap = Math.max(page.cap + added, page.order.length);
    setComplete(!more);
    updateFeedCount();
  } catch (err) {
    notify(`Could not read older deliveries: ${err.message}`, "error");
  } finally {
    page.olderTouched = null;
    button.disabled = false;
  }
}

function removeRow(row) {
  page.rows.delete(row.id);
  page.order = page.order.filter((id) => id !== row.id);
  if (row.el) row.el.remove();
  row.el = null;
}

// ---------- replay

async function replay(id, button) {
  if (button) button.disabled = true;
  try {
    const data = await gql(REPLAY, { id });
    notify(`Replayed delivery ${shortId(id)}: now ${data.replayDelivery.state}.`);
  } catch (err) {
    if (err.code === "DELIVERY_NOT_REPLAYABLE") {
      const state = err.extensions.state || "no longer FAILED";
      notify(`Not replayed (DELIVERY_NOT_REPLAYABLE): delivery ${shortId(id)} is ${state}.`, "error");
    } else {
      notify(`Replay refused (${err.code}): ${err.message}`, "error");
    }
  } finally {
    if (button) button.disabled = false;
  }
  if (page.detailId === id) showDetail(id, false);
}

/** Replays every FAILED delivery of one endpoint, in one call. */
async function replayFailed(endpointId, button) {
  const endpoint = page.endpoints.get(endpointId);
  const name = endpoint ? endpoint.name : shortId(endpointId);
  button.disabled = true;
  button.dataset.busy = "1";
  try {
    const data = await gql(REPLAY_FAILED, { endpointId });
    const n = data.replayDeliveries.replayed;
    notify(`Replayed ${n} failed deliver${n === 1 ? "y" : "ies"} of ${isolate(name)}.`);
  } catch (err) {
    notify(`Bulk replay refused (${err.code}): ${err.message}`, "error");
  } finally {
    delete button.dataset.busy;
    renderEndpointActions();
  }
}

/** Sends a DELIVERED delivery again (same webhook-id). */
async function resend(id, button) {
  if (button) button.disabled = true;
  try {
    const data = await gql(RESEND, { id });
    notify(`Resending delivery ${shortId(id)}: now ${data.resendDelivery.state}.`);
  } catch (err) {
    if (err.code === "DELIVERY_NOT_REPLAYABLE") {
      const state = err.extensions.state || "no longer DELIVERED";
      notify(`Not resent (DELIVERY_NOT_REPLAYABLE): delivery ${shortId(id)} is ${state}.`, "error");
    } else {
      notify(`Resend refused (${err.code}): ${err.message}`, "error");
    }
  } finally {
    if (button) button.disabled = false;
  }
  if (page.detailId === id) showDetail(id, false);
}

/** Sends an endpoint a signed courier.test webhook; it appears in the feed like any delivery. */
async function sendTestEvent(endpointId, button) {
  const endpoint = page.endpoints.get(endpointId);
  const name = endpoint ? endpoint.name : shortId(endpointId);
  button.disabled = true;
  try {
    const data = await gql(TEST_EVENT, { endpointId });
    notify(`Test webhook ${shortId(data.sendTestEvent.id)} sent to ${isolate(name)}.`);
  } catch (err) {
    notify(`Test webhook refused (${err.code}): ${err.message}`, "error");
  } finally {
    button.disabled = false;
  }
}

// ---------- managing endpoints (admins and tenants' keys)

/** Opens the editor: empty to create an endpoint, or filled with `endpoint` to change it. */
function openEditor(endpoint) {
  page.editing = endpoint || null;
  $("editor-heading").textContent = endpoint ? `Edit ${isolate(endpoint.name)}` : "New endpoint";
  $("editor-name").value = endpoint ? endpoint.name : "";
  $("editor-url").value = endpoint ? endpoint.url : "";
  $("editor-types").value = endpoint && endpoint.eventTypes ? endpoint.eventTypes.join(", ") : "";
  $("editor-in-flight").value = endpoint && endpoint.maxInFlight != null ? String(endpoint.maxInFlight) : "";
  $("editor-rate").value = endpoint && endpoint.rateLimit != null ? String(endpoint.rateLimit) : "";
  // What each field showed: an edit sends only the fields changed from it, so saving a new
  // name leaves the event types as they are, and a cap that follows the process-wide
  // default (shown as its value) is not pinned to it.
  page.editorShown = Object.fromEntries(EDITOR_FIELDS.map((id) => [id, $(id).value]));
  // An admin creating an endpoint chooses its tenant (it never changes, and the tenant's
  // portal sees the endpoint); the tenant filter only suggests one.
  const tenantChoice = !endpoint && page.identity.role === "ADMIN" && page.tenants.size > 0;
  $("editor-tenant-label").hidden = !tenantChoice;
  const tenant = $("editor-tenant");
  tenant.hidden = !tenantChoice;
  tenant.replaceChildren(
    el("option", { value: "", text: "No tenant" }),
    ...[...page.tenants.values()].map((t) => el("option", { value: t.id, text: t.name })));
  tenant.value = tenantChoice && page.tenants.has(page.filter.tenantId) ? page.filter.tenantId : "";
  $("editor-error").textContent = "";
  $("endpoint-editor").showModal();
  $("editor-name").focus();
}

/** A whole number from an editor field, or null when it is empty; anything else is refused. */
function numberField(id) {
  const input = $(id);
  const text = input.value.trim();
  // A number input the browser could not read (`abc`) reads as empty: refused, not the default.
  const unreadable = input.validity && input.validity.badInput;
  if (!unreadable && text === "") return null;
  // `1e2` is 100; `1.5` and `abc` are no whole number.
  const number = unreadable ? NaN : Number(text);
  if (!Number.isSafeInteger(number)) {
    const label = document.querySelector(`label[for="${id}"]`);
    const name = label ? label.firstChild.textContent.trim() : id;
    throw Object.assign(new Error(`${name} must be a whole number, or empty`), { code: "BAD_USER_INPUT" });
  }
  return number;
}

/** The ids of the editor's input fields, in the order they are read. */
const EDITOR_FIELDS = ["editor-name", "editor-url", "editor-types", "editor-in-flight", "editor-rate"];

/**
 * The event types written in the editor, separated by commas or whitespace. An event type
 * holds no whitespace but may hold a comma (`invoice.created,v2`), so a type the endpoint
 * already had, shown as it is, reads back whole; a new one is split at its commas.
 */
function eventTypesField() {
  const had = new Set(page.editing && page.editing.eventTypes ? page.editing.eventTypes : []);
  return $("editor-types").value.trim().split(/,?\s+/)
    .flatMap((typed) => (had.has(typed) ? [typed] : typed.split(",")))
    .filter(Boolean);
}

async function saveEditor() {
  const read = {
    "editor-name": () => ["name", $("editor-name").value.trim()],
    "editor-url": () => ["url", $("editor-url").value.trim()],
    "editor-types": () => ["eventTypes", eventTypesField()],
    "editor-in-flight": () => ["maxInFlight", numberField("editor-in-flight")],
    "editor-rate": () => ["rateLimit", numberField("editor-rate")],
  };
  let fields;
  try {
    fields = Object.fromEntries(EDITOR_FIELDS
      .filter((id) => !page.editing || $(id).value !== page.editorShown[id] || $(id).validity.badInput)
      .map((id) => read[id]()));
  } catch (err) {
    $("editor-error").textContent = `${err.code}: ${err.message}`;
    return;
  }
  if (page.editing && Object.keys(fields).length === 0) {
    $("endpoint-editor").close();
    return;
  }
  const save = $("editor-save");
  save.disabled = true;
  try {
    let result;
    if (page.editing) {
      result = (await gql(UPDATE_ENDPOINT, { id: page.editing.id, input: fields })).updateEndpoint;
      notify(`Saved ${isolate(result.endpoint.name)}.`);
    } else {
      const input = { ...fields };
      const tenant = $("editor-tenant");
      if (!tenant.hidden && tenant.value) input.tenantId = tenant.value;
      result = (await gql(CREATE_ENDPOINT, { input })).createEndpoint;
      notify(`Created ${isolate(result.endpoint.name)}.`);
    }
    $("endpoint-editor").close();
    if (result.secret) showSecret(result.endpoint.name, result.secret);
    await readEndpoints();
  } catch (err) {
    $("editor-error").textContent = `${err.code}: ${err.message}`;
  } finally {
    save.disabled = false;
  }
}

/** Mints a new signing secret for the endpoint and shows it, once. */
async function rotateSecret(endpointId, button) {
  button.disabled = true;
  try {
    const data = (await gql(ROTATE_SECRET, { id: endpointId })).rotateEndpointSecret;
    showSecret(data.endpoint.name, data.secret);
    await readEndpoints();
  } catch (err) {
    notify(`Secret not rotated (${err.code}): ${err.message}`, "error");
  } finally {
    button.disabled = false;
  }
}

/** Disables an enabled endpoint (its deliveries wait) or enables a disabled one. */
async function toggleEndpoint(endpointId, button) {
  const endpoint = page.endpoints.get(endpointId);
  if (!endpoint) return;
  button.disabled = true;
  try {
    const data = await gql(UPDATE_ENDPOINT, { id: endpointId, input: { disabled: !endpoint.disabled } });
    const changed = data.updateEndpoint.endpoint;
    notify(`${isolate(changed.name)} is ${changed.disabled ? "disabled: its deliveries wait" : "enabled"}.`);
    await readEndpoints();
  } catch (err) {
    notify(`Not changed (${err.code}): ${err.message}`, "error");
  } finally {
    button.disabled = false;
  }
}

function showSecret(name, secret) {
  $("secret-for").textContent = `The new signing secret of ${isolate(name)}:`;
  $("secret-value").textContent = secret;
  $("secret-shown").showModal();
}

// ---------- detail

async function showDetail(id, open = true) {
  const dialog = $("detail");
  page.detailId = id;
  if (open) {
    $("detail-body").replaceChildren(el("p", { class: "note", text: "Reading…" }));
    if (!dialog.open) dialog.showModal();
  }
  let delivery;
  try {
    delivery = (await gql(DETAIL, { id })).delivery;
  } catch (err) {
    $("detail-body").replaceChildren(el("p", { class: "error", text: `${err.code}: ${err.message}` }));
    return;
  }
  if (page.detailId !== id || !dialog.open) return;
  if (!delivery) {
    $("detail-body").replaceChildren(el("p", { class: "note", text: "This delivery no longer exists." }));
    return;
  }
  $("detail-body").replaceChildren(...detailContent(delivery));
}

function detailContent(d) {
  const facts = el("dl", { class: "facts" },
    el("dt", { text: "Delivery" }), el("dd", {}, el("code", { text: d.id })),
    el("dt", { text: "State" }), el("dd", {}, el("span", { class: "badge", "data-state": d.state, text: d.state })),
    el("dt", { text: "Endpoint" }), el("dd", { text: `${isolate(d.endpoint.name)} — ${isolate(d.endpoint.url)}` }),
    el("dt", { text: "Created" }), el("dd", { text: formatDateTime(d.createdAt) }),
    el("dt", { text: "Next attempt" }),
    el("dd", {
      text: d.nextAttemptAt ? formatDateTime(d.nextAttemptAt)
        : d.waitingBehind ? "when the delivery ahead of it in its line settles" : "none scheduled",
    }),
    d.orderingKey ? el("dt", { text: "Ordering key" }) : null,
    d.orderingKey ? el("dd", {}, el("code", { id: "detail-ordering-key", text: d.orderingKey })) : null,
    d.waitingBehind ? el("dt", { text: "Waits behind" }) : null,
    d.waitingBehind ? el("dd", {},
      el("button", {
        type: "button", id: "detail-head", class: "link", "data-head": d.waitingBehind.id,
        "aria-label": `Show the delivery it waits behind, ${d.waitingBehind.id}`,
        text: d.waitingBehind.id,
      }),
      el("span", { class: "badge", "data-state": d.waitingBehind.state, text: d.waitingBehind.state })) : null,
    el("dt", { text: "This cycle" }), el("dd", { text: `${d.cycleAttempts} attempt(s)` }),
    d.lastError ? el("dt", { text: "Last error" }) : null,
    d.lastError ? el("dd", { text: d.lastError }) : null,
    d.submission.idempotencyKey ? el("dt", { text: "Idempotency key" }) : null,
    d.submission.idempotencyKey ? el("dd", {}, el("code", { text: d.submission.idempotencyKey })) : null);
  const actions = d.state === "FAILED"
    ? el("p", {}, el("button", { type: "button", id: "detail-replay", class: "replay", "data-action": "replay", text: "Replay this delivery" }))
    : d.state === "DELIVERED"
      ? el("p", {}, el("button", { type: "button", id: "detail-resend", "data-action": "resend", text: "Send again (same webhook-id)" }))
      : null;
  const attempts = d.attempts.length
    ? el("table", { class: "attempts" },
      el("caption", { text: "Attempts" }),
      el("thead", {}, el("tr", {}, ...["#", "Started", "Outcome", "Duration", "Superseded", "Response"]
        .map((h) => el("th", { scope: "col", text: h })))),
      el("tbody", {}, ...d.attempts.map((a) => el("tr", {},
        el("td", { class: "num", text: String(a.number) }),
        el("td", { text: formatDateTime(a.startedAt) }),
        el("td", { text: a.error ? (a.statusCode ? `${a.statusCode}: ${a.error}` : a.error) : String(a.statusCode ?? "") }),
        el("td", { class: "num", text: a.durationMs == null ? "" : `${a.durationMs} ms` }),
        el("td", { text: a.superseded ? "yes" : "no" }),
        el("td", {}, responseDetails(a))))))
    : el("p", { class: "note", text: "No attempts yet." });
  const payload = el("pre", { class: "payload", tabIndex: 0, "aria-label": "Payload" },
    JSON.stringify(d.submission.payload, null, 2));
  return [facts, actions, attempts, el("h3", { text: "Payload" }), payload].filter(Boolean);
}

/** What the receiver answered an attempt: the start of its body and its headers. */
function responseDetails(attempt) {
  if (attempt.responseBody == null && attempt.responseHeaders == null) {
    return el("span", { class: "note", text: "no response" });
  }
  const body = attempt.responseBody || "";
  const headers = Object.entries(attempt.responseHeaders || {})
    .map(([name, value]) => `${name}: ${value}`).join("\n");
  return el("details", { "data-response": String(attempt.number) },
    el("summary", { text: bodySize(body) }),
    el("pre", { class: "response-body", "aria-label": "Response body", text: body }),
    el("pre", { class: "response-headers", "aria-label": "Response headers", text: headers }));
}

/** What a stored response body's summary says: its size in bytes, or that it was cut. */
function bodySize(body) {
  if (!body) return "empty body";
  const bytes = new TextEncoder().encode(body).length;
  // Courier keeps the first 4 KiB, cut at a character's end.
  return bytes >= 4096 - 3 ? "first 4 KiB of the body" : `${bytes} bytes of body`;
}

// ---------- wiring

function wire() {
  $("sign-in-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const token = $("token").value.trim();
    $("token").value = "";
    if (token) signIn(token);
  });
  $("sign-out").addEventListener("click", () => signOut());
  window.addEventListener("hashchange", signInFromNewFragment);
  document.addEventListener("visibilitychange", () => {
    if (!document.hidden) signOutAtExpiry();
  });
  $("filter-endpoint").addEventListener("change", (event) => {
    page.filter.endpointId = event.target.value;
    renderEndpointActions();
    reread();
  });
  $("filter-tenant").addEventListener("change", (event) => {
    page.filter.tenantId = event.target.value;
    const chosen = page.endpoints.get(page.filter.endpointId);
    if (chosen && !inChosenTenant(chosen)) page.filter.endpointId = "";
    renderEndpoints();
    reread();
  });
  $("new-endpoint").addEventListener("click", () => openEditor(null));
  $("editor-form").addEventListener("submit", (event) => {
    event.preventDefault();
    saveEditor();
  });
  $("editor-cancel").addEventListener("click", () => $("endpoint-editor").close());
  $("secret-close").addEventListener("click", () => $("secret-shown").close());
  // The secret leaves the page with its dialog, however it is closed.
  $("secret-shown").addEventListener("close", () => { $("secret-value").textContent = ""; });
  $("feed-older").addEventListener("click", (event) => showOlder(event.currentTarget));
  $("filter-state").addEventListener("change", (event) => {
    page.filter.state = event.target.value;
    reread();
  });
  $("endpoint-actions").addEventListener("click", (event) => {
    const action = event.target.closest("[data-action]");
    if (!action || !action.dataset.endpointId) return;
    const id = action.dataset.endpointId;
    if (action.dataset.action === "test-event") sendTestEvent(id, action);
    else if (action.dataset.action === "replay-failed") replayFailed(id, action);
    else if (action.dataset.action === "edit-endpoint") openEditor(page.endpoints.get(id));
    else if (action.dataset.action === "rotate-secret") rotateSecret(id, action);
    else if (action.dataset.action === "toggle-endpoint") toggleEndpoint(id, action);
  });
  $("endpoints").addEventListener("click", (event) => {
    const button = event.target.closest("[data-filter-endpoint]");
    if (!button) return;
    page.filter.endpointId = button.dataset.filterEndpoint;
    $("filter-endpoint").value = page.filter.endpointId;
    renderEndpointActions();
    reread();
  });
  $("feed").addEventListener("click", (event) => {
    const item = event.target.closest("[data-delivery-id]");
    const action = event.target.closest("[data-action]");
    if (!item || !action) return;
    if (action.dataset.action === "replay") replay(item.dataset.deliveryId, action);
    else showDetail(item.dataset.deliveryId);
  });
  $("detail-close").addEventListener("click", () => $("detail").close());
  $("detail").addEventListener("close", () => { page.detailId = null; });
  $("detail").addEventListener("click", (event) => {
    if (event.target.id === "detail-replay" && page.detailId) replay(page.detailId, event.target);
    if (event.target.id === "detail-resend" && page.detailId) resend(page.detailId, event.target);
    if (event.target.id === "detail-head") showDetail(event.target.dataset.head, false);
  });
}

wire();
const saved = tokenFromFragment();
if (saved) signIn(saved);
else showSignIn();
