// Climate's dashboard: plain ES module, no build step. Every text from the server is put into
// the page with textContent (never innerHTML), so names holding HTML or script stay text.
import { DataSet, Timeline, moment } from "./vendor/vis-timeline-graph2d.esm.min.js";
// ECharts (1.1 MB) is fetched and compiled only when the capacity chart is first drawn, after
// the timeline: the first view does not wait for it.
let echartsModule = null;
const loadECharts = () => (echartsModule ??= import("./vendor/echarts.esm.min.js"));

const API = new URL("../", document.baseURI).href.replace(/\/$/, "");
const TOKEN_KEY = "climate-token";
const HOUR = 3600e3;
const DAY = 24 * HOUR;
const PROJECT_COLOURS = 12;
// Rows drawn at once: vis-timeline draws every row it is given, so a thousand hosts are shown a
// page at a time (all their bars are loaded; paging and filtering need no request).
const PAGE_ROWS = 40;

const $ = (id) => document.getElementById(id);

// -- helpers ----------------------------------------------------------------------------------

function el(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (className) node.className = className;
  return node;
}

function clear(node) {
  while (node.firstChild) node.removeChild(node.firstChild);
  return node;
}

let flash = null;

// Says ``text`` once the page has moved to ``hash``.
function go(hash, text) {
  flash = text;
  location.hash = hash;
}

function say(text, kind = "") {
  const status = $("status");
  status.textContent = text;
  status.className = kind;
}

// The browser refuses to send a form with a field left wrong and says why beside it; the status
// line says it too, instead of still showing the last request's answer.
for (const form of document.querySelectorAll("form")) {
  form.addEventListener(
    "invalid",
    (event) => {
      const control = event.target;
      if (form.querySelector(":invalid") !== control) return; // the first one only
      const label = control.closest("label")?.firstChild?.textContent.trim() || control.name;
      say(`${label}: ${control.validationMessage}`, "error");
    },
    true, // "invalid" does not bubble
  );
}

class ApiError extends Error {
  constructor(status, body) {
    super(body?.error_message || `HTTP ${status}`);
    this.status = status;
    this.body = body;
  }
}

async function api(method, path, body) {
  const headers = { Accept: "application/json" };
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers["X-Auth-Token"] = token;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(API + path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (response.status === 204) return null;
  const data = await response.json().catch(() => null);
  if (!response.ok) {
    if (response.status === 401) showLogin();
    throw new ApiError(response.status, data);
  }
  return data;
}

function query(params) {
  const search = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) {
    if (value !== undefined && value !== null && value !== "") search.set(key, value);
  }
  const text = search.toString();
  return text ? `?${text}` : "";
}

// Lease dates on the wire are naive UTC ("2030-06-01T09:00:00.000000").
function fromWire(text) {
  return text ? new Date(`${text.slice(0, 19)}Z`) : null;
}

function shown(date) {
  return date ? date.toISOString().slice(0, 16).replace("T", " ") : "";
}

// <input type="datetime-local"> holds UTC here ("2030-06-01T09:00"); the API takes it as is.
function toInput(date) {
  return date.toISOString().slice(0, 16);
}

// A date field left empty (or not a date) is said at once, naming the API's field: parsed as
// it is, ":00Z" is 2000-01-01 to the browser, and the server would be asked about that date.
class InputError extends Error {}

function fromInput(value, field) {
  const date = new Date(`${value}:00Z`);
  if (!/^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}$/.test(value) || Number.isNaN(date.valueOf())) {
    throw new InputError(`${field}: a date and time is needed (UTC)`);
  }
  return date;
}

function toApi(date) {
  return shown(date);
}

// A project's colour: FNV-1a of its id, so each project keeps its colour across pages.
function projectClass(project) {
  let hash = 0x811c9dc5;
  for (const char of project) {
    hash ^= char.charCodeAt(0);
    hash = Math.imul(hash, 0x01000193) >>> 0;
  }
  return `p${hash % PROJECT_COLOURS}`;
}

function table(tbody, rows) {
  clear(tbody);
  for (const cells of rows) {
    const tr = el("tr");
    for (const cell of cells) {
      const td = el("td");
      if (cell instanceof Node) td.appendChild(cell);
      else td.textContent = cell ?? "";
      tr.appendChild(td);
    }
    tbody.appendChild(tr);
  }
}

function link(text, href) {
  const a = el("a", text);
  a.href = href;
  return a;
}

// -- who is calling ---------------------------------------------------------------------------

// ``known``: the caller is identified; until then every view waits behind the token form.
const me = { known: false, admin: false, allowed: new Set() };

function showLogin() {
  me.known = false;
  for (const view of document.querySelectorAll(".view")) view.hidden = true;
  $("login").hidden = false;
  $("token-input").focus();
}

// Who is calling, from the policy (``GET /v1/policy/caller``): no call is tried to see whether
// it fails. False when a token is needed and none (or a refused one) was given.
async function identify() {
  let caller;
  try {
    ({ caller } = await api("GET", "/v1/policy/caller"));
  } catch (error) {
    if (error.status === 401) return false;
    throw error;
  }
  if (!caller) return false;
  me.known = true;
  me.admin = caller.admin;
  me.allowed = new Set(caller.allowed);
  $("nav-admin").hidden = !me.allowed.has("blazar:oshosts:get");
  $("nav-new").hidden = !me.allowed.has("blazar:leases:post");
  for (const node of document.querySelectorAll(".admin-only")) node.hidden = !me.admin;
  $("who").textContent = me.admin
    ? "admin"
    : me.allowed.has("blazar:leases:post")
      ? "project member"
      : "project reader (read only)";
  $("logout").hidden = !sessionStorage.getItem(TOKEN_KEY);
  return true;
}

$("login-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  sessionStorage.setItem(TOKEN_KEY, $("token-input").value.trim());
  $("token-input").value = "";
  let known = false;
  try {
    known = await identify();
  } catch (error) {
    // Refused otherwise than unknown (a Keystone token without a project: 403): say why.
    sessionStorage.removeItem(TOKEN_KEY);
    failed(error);
    return;
  }
  if (known) {
    $("login").hidden = true;
    route();
  } else {
    sessionStorage.removeItem(TOKEN_KEY);
    say("that token was refused", "error");
  }
});

$("logout").addEventListener("click", () => {
  sessionStorage.removeItem(TOKEN_KEY);
  location.reload();
});

// -- timeline ---------------------------------------------------------------------------------

const tl = {
  timeline: null,
  chart: null,
  loaded: null,
  data: null,
  all: null,
  first: 0,
  filter: "",
};

function barLabel(item) {
  const data = tl.data;
  if (item.lease === null) return "busy";
  const lease = data.leases[item.lease];
  return item.amount ? `${lease.name} (${item.amount})` : lease.name;
}

function barTemplate(item) {
  if (item.type === "background") return el("span");
  const label = el("span", barLabel(item));
  if (item.lease !== null) {
    // Reachable by keyboard: Tab to a bar, Enter opens its lease.
    const lease = tl.data.leases[item.lease];
    label.tabIndex = 0;
    label.setAttribute("role", "link");
    label.dataset.lease = lease.id;
    label.setAttribute("aria-label", `lease ${lease.name}, ${lease.status}`);
  }
  return label;
}

$("timeline").addEventListener("keydown", (event) => {
  const lease = event.target.dataset?.lease;
  if (event.key === "Enter" && lease) location.hash = `#/lease/${encodeURIComponent(lease)}`;
});

function tooltip(item) {
  const box = el("div", null, "tip");
  if (item.type === "background") {
    box.appendChild(el("div", "free"));
    return box;
  }
  const data = tl.data;
  if (item.lease === null) {
    box.appendChild(el("strong", "busy"));
    box.appendChild(el("div", "booked by another project"));
  } else {
    const lease = data.leases[item.lease];
    box.appendChild(el("strong", lease.name));
    box.appendChild(el("div", `${lease.status} · project ${lease.project_id}`));
    box.appendChild(el("div", `lease ${lease.id}`));
  }
  if (item.amount) box.appendChild(el("div", `amount ${item.amount}`));
  box.appendChild(el("div", `${shown(new Date(item.start))} → ${shown(new Date(item.end))} UTC`));
  return box;
}

function groupTemplate(group) {
  return el("span", group.label, group.reservable ? "" : "down");
}

function barClass(bar, data) {
  if (bar.lease === null) return "bar busy";
  const lease = data.leases[bar.lease];
  return `bar ${projectClass(lease.project_id)} s-${lease.status.toLowerCase()}`;
}

async function loadTimeline(start, end) {
  const type = $("tl-type").value;
  const answer = await api(
    "GET",
    `/v1/timeline${query({
      resource_type: type,
      start: new Date(start).toISOString(),
      end: new Date(end).toISOString(),
    })}`,
  );
  const data = answer.timeline;
  tl.data = data;
  showProjects(data);
  tl.loaded = { start: data.start * 1000, end: data.end * 1000, type };
  const groups = data.resources.map((r, i) => ({
    id: i,
    content: "",
    label: r.pool ? `${r.name} (${r.pool})` : r.name,
    reservable: r.reservable,
    className: r.reservable ? "" : "down",
  }));
  const items = data.bars.map((b, i) => ({
    id: i,
    group: b.resource,
    start: b.start * 1000,
    end: b.end * 1000,
    content: "",
    lease: b.lease,
    amount: b.amount,
    className: barClass(b, data),
  }));
  const now = data.now * 1000;
  if (data.end * 1000 > now) {
    items.push({
      id: "free",
      type: "background",
      start: Math.max(now, data.start * 1000),
      end: data.end * 1000,
      content: "",
      className: "free",
    });
  }
  return { groups, items, now, data };
}

// Which colour is whose: the projects of the leases loaded, each with its bars' colour.
function showProjects(data) {
  const box = clear($("tl-projects"));
  const projects = [...new Set(data.leases.map((lease) => lease.project_id))].sort();
  for (const project of projects) {
    const entry = el("span", null, "project");
    entry.append(el("span", null, `swatch ${projectClass(project)}`), el("span", project));
    box.appendChild(entry);
  }
}

function visibleWindow(hours) {
  const now = Date.now();
  return { start: now - (hours * HOUR) / 6, end: now + (hours * HOUR * 5) / 6 };
}

async function drawTimeline(window) {
  const container = $("timeline");
  const started = performance.now();
  const span = window.end - window.start;
  const loadStart = window.start - span / 4;
  const loadEnd = window.end + span / 2;
  const { groups, items, now, data } = await loadTimeline(loadStart, loadEnd);
  tl.all = { groups, items };
  const page = rowsPage();
  container.dataset.state = "drawing";
  const drawn = () =>
    requestAnimationFrame(() => {
      container.dataset.bars = String(data.bars.length);
      container.dataset.resources = String(data.resources.length);
      container.dataset.drawMs = String(Math.round(performance.now() - started));
      container.dataset.state = "drawn";
    });
  if (!tl.timeline) {
    tl.timeline = new Timeline(container, new DataSet(page.items), new DataSet(page.groups), {
      stack: false,
      orientation: "top",
      start: window.start,
      end: window.end,
      zoomMin: HOUR,
      zoomMax: 400 * DAY,
      verticalScroll: true,
      maxHeight: "60vh",
      groupHeightMode: "fixed",
      showCurrentTime: false,
      selectable: true,
      margin: { item: 2, axis: 4 },
      // Every date on the page is UTC: the axis too, whatever the browser's time zone.
      moment: (date) => moment(date).utc(),
      template: barTemplate,
      groupTemplate,
      tooltip: { followMouse: true, template: tooltip, delay: 100 },
      // The first draw is hidden until vis-timeline has laid it out, then this is called.
      onInitialDrawComplete: drawn,
    });
    tl.timeline.addCustomTime(now, "now");
    tl.timeline.setCustomTimeMarker("now", "now", false);
    tl.timeline.on("rangechanged", (props) => {
      if (!props.byUser) return;
      const { start, end } = tl.loaded;
      if (props.start.valueOf() < start || props.end.valueOf() > end) {
        drawTimeline({ start: props.start.valueOf(), end: props.end.valueOf() }).catch(failed);
      }
    });
    tl.timeline.on("doubleClick", (props) => openBar(props.item));
    tl.timeline.on("select", (props) => openBar(props.items[0]));
  } else {
    // Later draws come in steps, each ending with "changed": drawn once every row is there.
    const rowsDrawn = () => {
      if (container.querySelectorAll(".vis-labelset .vis-label").length < page.groups.length) {
        return;
      }
      tl.timeline.off("changed", rowsDrawn);
      drawn();
    };
    tl.timeline.on("changed", rowsDrawn);
    tl.timeline.setData({ groups: new DataSet(page.groups), items: new DataSet(page.items) });
    tl.timeline.setCustomTime(now, "now");
    tl.timeline.setWindow(window.start, window.end, { animation: false });
  }

  drawCapacity(window).catch(failed);
}

// The rows of the current page (after the name filter) and their bars.
function rowsPage() {
  const needle = tl.filter.toLowerCase();
  const matching = tl.all.groups.filter((g) => g.label.toLowerCase().includes(needle));
  tl.first = Math.max(0, Math.min(tl.first, matching.length - 1));
  const groups = matching.slice(tl.first, tl.first + PAGE_ROWS);
  const shown = new Set(groups.map((g) => g.id));
  const items = tl.all.items.filter((item) => item.group === undefined || shown.has(item.group));
  $("rows-shown").textContent = matching.length
    ? `rows ${tl.first + 1}–${tl.first + groups.length} of ${matching.length}`
    : "no rows";
  $("rows-prev").disabled = tl.first === 0;
  $("rows-next").disabled = tl.first + PAGE_ROWS >= matching.length;
  return { groups, items };
}

function showRows() {
  if (!tl.timeline) return;
  const page = rowsPage();
  tl.timeline.setData({ groups: new DataSet(page.groups), items: new DataSet(page.items) });
}

$("rows-prev").addEventListener("click", () => {
  tl.first = Math.max(0, tl.first - PAGE_ROWS);
  showRows();
});
$("rows-next").addEventListener("click", () => {
  tl.first += PAGE_ROWS;
  showRows();
});
$("timeline-controls").addEventListener("submit", (event) => event.preventDefault());
$("rows-filter").addEventListener("input", () => {
  tl.filter = $("rows-filter").value;
  tl.first = 0;
  showRows();
});

function openBar(id) {
  if (id === undefined || id === null || id === "free") return;
  const bar = tl.data.bars[id];
  if (bar && bar.lease !== null) location.hash = `#/lease/${tl.data.leases[bar.lease].id}`;
}

function capacityBucket(span) {
  if (span <= 2 * DAY) return 3600;
  if (span <= 15 * DAY) return 3 * 3600;
  return 86400;
}

async function drawCapacity(window) {
  const type = $("tl-type").value;
  const now = Date.now();
  const end = Math.max(window.end, now + DAY);
  const bucket = capacityBucket(end - now);
  const answer = await api(
    "GET",
    `/v1/availability/timeline${query({
      resource_type: type,
      start: "now",
      end: new Date(end).toISOString(),
      bucket,
    })}`,
  );
  const capacity = answer.timeline;
  const at = capacity.buckets.map((b) => fromWire(b.start_date).valueOf());
  const series = [
    {
      name: `free ${capacity.unit}`,
      color: "#2ea043",
      data: capacity.buckets.map((b, i) => [at[i], b.free]),
    },
  ];
  if (capacity.buckets.length && capacity.buckets[0].busy !== undefined) {
    series.push({
      name: "busy",
      color: "#8b949e",
      data: capacity.buckets.map((b, i) => [at[i], b.busy]),
    });
    series.push({
      name: "partly busy",
      color: "#d0d7de",
      data: capacity.buckets.map((b, i) => [at[i], b.partly_busy]),
    });
  }
  if (!tl.chart) {
    const echarts = await loadECharts();
    tl.chart ??= echarts.init($("capacity"), null, { renderer: "canvas" });
  }
  tl.chart.setOption(
    {
      animation: false,
      useUTC: true,
      tooltip: { trigger: "axis", renderMode: "richText" },
      // Under the chart: at the top it ran over the axis name on a phone-wide page.
      legend: { bottom: 0 },
      grid: { left: 50, right: 20, top: 30, bottom: 55 },
      xAxis: { type: "time" },
      yAxis: { type: "value", name: `of ${capacity.total} ${capacity.unit}`, minInterval: 1 },
      series: series.map((s) => ({
        ...s,
        type: "line",
        step: "start",
        stack: "capacity",
        areaStyle: {},
        symbol: "none",
      })),
    },
    true,
  );
  $("capacity").dataset.state = "drawn";
}

function zoom(value) {
  if (!tl.timeline) return;
  const hours = value === "now" ? null : Number(value);
  if (hours === null) {
    tl.timeline.moveTo(Date.now());
    return;
  }
  const window = visibleWindow(hours);
  drawTimeline(window).catch(failed);
}

for (const button of document.querySelectorAll("[data-zoom]")) {
  button.addEventListener("click", () => zoom(button.dataset.zoom));
}

$("tl-type").addEventListener("change", () => {
  tl.first = 0;
  const range = tl.timeline ? tl.timeline.getWindow() : null;
  const window = range
    ? { start: range.start.valueOf(), end: range.end.valueOf() }
    : visibleWindow(168);
  drawTimeline(window).catch(failed);
});

// -- lease list -------------------------------------------------------------------------------

async function showLeases(filtered = false) {
  const form = new FormData($("lease-filters"));
  const answer = await api(
    "GET",
    `/v1/leases${query({
      status: form.get("status"),
      project_id: me.admin ? form.get("project_id") : "",
      sort_key: "start_date",
    })}`,
  );
  const needle = String(form.get("name") || "").toLowerCase();
  const leases = answer.leases.filter((l) => l.name.toLowerCase().includes(needle));
  const rows = $("lease-table").tBodies[0];
  table(
    rows,
    leases.map((l) => [
      link(l.name, `#/lease/${encodeURIComponent(l.id)}`),
      el("span", l.status, `status s-${l.status.toLowerCase()}`),
      shown(fromWire(l.start_date)),
      shown(fromWire(l.end_date)),
      l.project_id,
      l.id,
    ]),
  );
  const project = me.admin ? form.get("project_id") : "";
  $("feed-link").href = `${API}/v1/leases.ics${query({ project_id: project })}`;
  if (!leases.length) {
    const cell = rows.appendChild(el("tr")).appendChild(el("td", "No lease matches."));
    cell.colSpan = 6;
  }
  // A flash from the page before (a lease deleted) stays until the filters change.
  if (filtered || !$("status").textContent) say(`${leases.length} lease(s)`);
}

$("lease-filters").addEventListener("submit", (event) => {
  event.preventDefault();
  showLeases(true).catch(failed);
});

// The feed needs the token too: followed as a link it would leave the page for a 401. With a
// token it is fetched with it and saved; with noauth the link is the feed (and subscribable).
$("feed-link").addEventListener("click", async (event) => {
  if (!sessionStorage.getItem(TOKEN_KEY)) return;
  event.preventDefault();
  try {
    const response = await fetch($("feed-link").href, {
      headers: { "X-Auth-Token": sessionStorage.getItem(TOKEN_KEY) },
    });
    if (!response.ok) {
      if (response.status === 401) showLogin();
      throw new ApiError(response.status, await response.json().catch(() => null));
    }
    const url = URL.createObjectURL(await response.blob());
    const save = el("a");
    save.href = url;
    save.download = "climate-leases.ics";
    document.body.appendChild(save);
    save.click();
    save.remove();
    setTimeout(() => URL.revokeObjectURL(url), 60e3);
    say("calendar feed saved as climate-leases.ics", "ok");
  } catch (error) {
    failed(error);
  }
});

// -- one lease --------------------------------------------------------------------------------

const current = { lease: null };

// Host names by id, for those who may list hosts (admins): allocations name their host by id. Read
// once per lease page shown, however many allocations ask.
let hostNames = null;

function hostName(id) {
  if (!me.allowed.has("blazar:oshosts:get")) return Promise.resolve(null);
  hostNames ??= api("GET", "/v1/os-hosts").then(
    (answer) => new Map(answer.hosts.map((h) => [String(h.id), h.hypervisor_hostname])),
  );
  return hostNames.then((names) => names.get(String(id)) ?? null);
}

async function allocationLabel(reservation, allocation) {
  const onHost = ["physical:host", "virtual:instance"].includes(reservation.resource_type);
  const label = (onHost ? await hostName(allocation.resource_id) : null) ?? allocation.resource_id;
  return allocation.count ? `${label} × ${allocation.count}` : String(label);
}

// The page's actions work on ``current.lease``: none until the lease asked for is shown.
function forgetLease() {
  current.lease = null;
  $("lease-title").textContent = "";
  for (const id of ["lease-fields", "lease-reservations", "lease-refusal"]) clear($(id));
  for (const id of ["lease-events", "lease-history"]) clear($(id).tBodies[0]);
  for (const node of $("lease-update").elements) node.disabled = true;
}

async function showLease(id) {
  forgetLease();
  hostNames = null;
  const { lease } = await api("GET", `/v1/leases/${encodeURIComponent(id)}`);
  current.lease = lease;
  // Only what the policy lets the caller do (a reader reads): no button that is refused.
  const may = {
    "blazar:leases:put": ["lease-start", "lease-end", "lease-save", "lease-extend", "lease-shrink"],
    "blazar:leases:delete": ["lease-delete"],
    "climate:leases:confirm": ["lease-confirm"],
  };
  for (const [rule, ids] of Object.entries(may)) {
    for (const id of ids) $(id).disabled = !me.allowed.has(rule);
  }
  $("lease-title").textContent = lease.name;
  const fields = clear($("lease-fields"));
  for (const key of ["id", "status", "status_reason", "project_id", "user_id", "lease_type"]) {
    fields.appendChild(el("dt", key));
    fields.appendChild(el("dd", lease[key] ?? ""));
  }
  // What a lease type, a hold or a series adds, where the lease has it.
  for (const key of ["queue_position", "deadline", "hold_expires_at", "series_id", "occurrence"]) {
    if (lease[key] === undefined || lease[key] === null) continue;
    fields.appendChild(el("dt", key));
    fields.appendChild(el("dd", lease[key]));
  }
  const held = lease.status === "HELD";
  $("lease-confirm").hidden = !held;
  for (const id of ["lease-save", "lease-extend", "lease-shrink"]) $(id).hidden = held;
  fields.appendChild(el("dt", "window (UTC)"));
  fields.appendChild(
    el("dd", `${shown(fromWire(lease.start_date))} → ${shown(fromWire(lease.end_date))}`),
  );
  $("lease-start").value = toInput(fromWire(lease.start_date));
  $("lease-end").value = toInput(fromWire(lease.end_date));
  $("lease-refusal").hidden = true;
  const box = clear($("lease-reservations"));
  for (const r of lease.reservations) {
    const part = el("div", null, "reservation");
    const dl = el("dl", null, "fields");
    for (const [key, value] of Object.entries(r)) {
      if (key === "allocations") continue;
      dl.appendChild(el("dt", key));
      const text = value !== null && typeof value === "object" ? JSON.stringify(value) : value;
      dl.appendChild(el("dd", text ?? ""));
    }
    part.appendChild(dl);
    const allocations = el("table", null, "allocations");
    const head = el("tr");
    for (const title of ["allocation", "start (UTC)", "end (UTC)"]) head.appendChild(el("th", title));
    allocations.appendChild(el("thead")).appendChild(head);
    const body = allocations.appendChild(el("tbody"));
    const labels = await Promise.all(r.allocations.map((a) => allocationLabel(r, a)));
    table(
      body,
      r.allocations.map((a, i) => [
        labels[i],
        shown(fromWire(a.start_date)),
        shown(fromWire(a.end_date)),
      ]),
    );
    part.appendChild(allocations);
    box.appendChild(part);
  }
  table(
    $("lease-events").tBodies[0],
    lease.events.map((e) => [e.event_type, shown(fromWire(e.time)), e.status]),
  );
  const history = $("lease-history").tBodies[0];
  if (!me.allowed.has("climate:audit:get")) {
    table(history, [["", "the audit log is for admins", "", ""]]);
    return;
  }
  try {
    const audit = await api("GET", `/v1/audit${query({ target_id: lease.id })}`);
    table(
      history,
      audit.audit_log.map((row) => [
        shown(fromWire(row.at)),
        row.action,
        `${row.actor_user} (${row.actor_project})`,
        row.detail === null ? "" : JSON.stringify(row.detail),
      ]),
    );
  } catch (error) {
    if (error.status !== 403) throw error;
    table(history, [["", "the audit log is for admins", "", ""]]);
  }
}

async function updateLease(changes) {
  const lease = current.lease;
  try {
    await api("PUT", `/v1/leases/${encodeURIComponent(lease.id)}`, changes);
  } catch (error) {
    if (error.status === 409) {
      refusal($("lease-refusal"), error.body, (offer) =>
        api("PUT", `/v1/leases/${encodeURIComponent(lease.id)}`, offer.lease).then(() =>
          afterUpdate(lease.id),
        ),
      );
      say("refused: see why below, and the offers", "error");
      return;
    }
    throw error;
  }
  await afterUpdate(lease.id);
}

async function afterUpdate(id) {
  await showLease(id);
  say("lease updated", "ok");
}

$("lease-update").addEventListener("submit", (event) => {
  event.preventDefault();
  const changes = {};
  const lease = current.lease;
  if (!lease) return;
  let start;
  let end;
  try {
    start = fromInput($("lease-start").value, "start_date");
    end = fromInput($("lease-end").value, "end_date");
  } catch (error) {
    failed(error);
    return;
  }
  if (toInput(start) !== toInput(fromWire(lease.start_date))) changes.start_date = toApi(start);
  if (toInput(end) !== toInput(fromWire(lease.end_date))) changes.end_date = toApi(end);
  if (!Object.keys(changes).length) {
    say("the dates are as they were: nothing to save");
    return;
  }
  updateLease(changes).catch(failed);
});

function shiftEnd(hours) {
  if (!current.lease) return;
  const end = fromWire(current.lease.end_date);
  updateLease({ end_date: toApi(new Date(end.valueOf() + hours * HOUR)) }).catch(failed);
}

$("lease-extend").addEventListener("click", () => shiftEnd(1));
$("lease-confirm").addEventListener("click", async () => {
  const lease = current.lease;
  if (!lease) return;
  try {
    await api("POST", `/v1/leases/${encodeURIComponent(lease.id)}/confirm`);
    await showLease(lease.id);
    say("hold confirmed", "ok");
  } catch (error) {
    failed(error);
  }
});
$("lease-shrink").addEventListener("click", () => shiftEnd(-1));
$("lease-delete").addEventListener("click", async () => {
  const lease = current.lease;
  if (!lease || !window.confirm(`Delete lease ${lease.name}?`)) return;
  try {
    await api("DELETE", `/v1/leases/${encodeURIComponent(lease.id)}`);
    go("#/leases", "lease deleted");
  } catch (error) {
    failed(error);
  }
});

// -- refusals and offers ----------------------------------------------------------------------

function refusal(box, body, take) {
  clear(box);
  box.hidden = false;
  box.appendChild(el("h3", "Refused"));
  box.appendChild(el("p", body.error_message, "reason"));
  const reasons = body.reason?.reservations || [];
  if (reasons.length) {
    const list = el("ul");
    for (const r of reasons) {
      const parts = [`reservation ${r.index + 1} (${r.resource_type}): ${r.rule}`];
      if (r.matching !== undefined) parts.push(`${r.matching} match, ${r.free} free`);
      if (r.enough_free_by) parts.push(`enough free by ${shown(fromWire(r.enough_free_by))} UTC`);
      list.appendChild(el("li", parts.join("; ")));
    }
    box.appendChild(list);
  }
  const offers = body.offers || [];
  if (!offers.length) {
    box.appendChild(el("p", "No counter-offer."));
    return;
  }
  box.appendChild(el("h4", "Counter-offers"));
  const list = el("ul", null, "offers");
  for (const offer of offers) {
    const item = el("li", null, "offer");
    const lease = offer.lease;
    const dates = [];
    if (lease.start_date) {
      dates.push(`from ${lease.start_date === "now" ? "now" : shown(fromWire(lease.start_date))}`);
    }
    if (lease.end_date) dates.push(`to ${shown(fromWire(lease.end_date))}`);
    const counts = (lease.reservations || [])
      .map((r) => r.max ?? r.amount)
      .filter((n) => n !== undefined);
    const when = [
      ...(dates.length ? [`${dates.join(" ")} UTC`] : []),
      ...(counts.length ? [`${counts.join(" + ")} resource(s)`] : []),
    ].join(", ");
    const what = {
      later_start: "later start",
      fewer_hosts: "fewer resources",
      shorter: "shorter",
    }[offer.kind] || offer.kind;
    item.appendChild(el("span", `${what}: ${when}${offer.below_request ? " (below the minimum asked)" : ""}`));
    const button = el("button", "Take this offer");
    button.type = "button";
    button.dataset.kind = offer.kind;
    button.addEventListener("click", () => {
      button.disabled = true;
      take(offer).catch((error) => {
        button.disabled = false;
        failed(error);
      });
    });
    item.appendChild(button);
    list.appendChild(item);
  }
  box.appendChild(list);
}

// -- new lease --------------------------------------------------------------------------------

function newReservation() {
  const type = $("new-type").value;
  const count = Number($("new-count").value);
  const properties = $("new-properties").value.trim();
  if (type === "network") {
    return { resource_type: type, amount: count, resource_properties: properties };
  }
  if (type === "virtual:floatingip") {
    return { resource_type: type, amount: count, network_id: $("new-network").value.trim() };
  }
  if (type === "virtual:instance") {
    const affinity = $("new-affinity").value;
    return {
      resource_type: type,
      amount: count,
      vcpus: Number($("new-vcpus").value),
      memory_mb: Number($("new-memory").value),
      disk_gb: Number($("new-disk").value),
      affinity: affinity === "" ? null : affinity === "true",
      resource_properties: properties,
    };
  }
  const reservation = { resource_type: type, min: count, max: count, resource_properties: properties };
  if (type === "physical:host") reservation.hypervisor_properties = "";
  return reservation;
}

$("new-type").addEventListener("change", () => {
  const ips = $("new-type").value === "virtual:floatingip";
  $("new-network-field").hidden = !ips;
  $("new-network").required = ips;
  $("new-properties").closest("label").hidden = ips;
  const instances = $("new-type").value === "virtual:instance";
  for (const label of document.querySelectorAll("#new-lease .instance-only")) {
    label.hidden = !instances;
    for (const input of label.querySelectorAll("input")) input.required = instances;
  }
});

function newLeaseBody(start, end) {
  return {
    name: $("new-name").value.trim(),
    start_date: toApi(start),
    end_date: toApi(end),
    reservations: [newReservation()],
    events: [],
  };
}

async function created(lease) {
  // The next booking starts from a blank form: a name kept from this one would be refused as
  // taken, and dates kept would be in the past by then.
  $("new-lease").reset();
  $("new-type").dispatchEvent(new Event("change"));
  clear($("new-windows"));
  $("new-refusal").hidden = true;
  go(`#/lease/${encodeURIComponent(lease.id)}`, `lease ${lease.name} created`);
}

async function createLease(body) {
  clear($("new-windows"));
  $("new-refusal").hidden = true;
  try {
    const answer = await api("POST", "/v1/leases", body);
    await created(answer.lease);
  } catch (error) {
    if (error.status !== 409 || !error.body?.reason) throw error;
    refusal($("new-refusal"), error.body, (offer) =>
      api("POST", "/v1/leases", offer.lease).then((answer) => created(answer.lease)),
    );
    say("refused: see why below, and the offers", "error");
  }
}

$("new-lease").addEventListener("submit", (event) => {
  event.preventDefault();
  try {
    const start = fromInput($("new-start").value, "start_date");
    const end = fromInput($("new-end").value, "end_date");
    createLease(newLeaseBody(start, end)).catch(failed);
  } catch (error) {
    failed(error);
  }
});

$("new-suggest").addEventListener("click", async () => {
  try {
    const start = fromInput($("new-start").value, "start_date");
    const end = fromInput($("new-end").value, "end_date");
    const duration = Math.round((end - start) / 1000);
    const answer = await api("POST", "/v1/availability", {
      reservations: [newReservation()],
      duration,
      search_start: start < new Date() ? "now" : toApi(start),
      search_end: toApi(new Date(Math.max(start, Date.now()) + 30 * DAY)),
      limit: 3,
    });
    const box = clear($("new-windows"));
    if (!answer.windows.length) {
      box.appendChild(el("p", "No window in the next 30 days."));
      return;
    }
    box.appendChild(el("h3", "Earliest windows"));
    const list = el("ul", null, "offers");
    for (const w of answer.windows) {
      const from = fromWire(w.start_date);
      const to = fromWire(w.end_date);
      const item = el("li", null, "window");
      item.appendChild(el("span", `${shown(from)} → ${shown(to)} UTC`));
      const use = el("button", "Use this window");
      use.type = "button";
      use.addEventListener("click", () => {
        $("new-start").value = toInput(from);
        $("new-end").value = toInput(to);
      });
      const book = el("button", "Book it");
      book.type = "button";
      book.addEventListener("click", () => createLease(newLeaseBody(from, to)).catch(failed));
      item.append(use, book);
      list.appendChild(item);
    }
    box.appendChild(list);
  } catch (error) {
    failed(error);
  }
});

function resetNewForm() {
  const start = new Date(Math.ceil((Date.now() + 5 * 60e3) / 60e3) * 60e3);
  if (!$("new-start").value) $("new-start").value = toInput(start);
  if (!$("new-end").value) $("new-end").value = toInput(new Date(start.valueOf() + HOUR));
}

// -- inventory (admins) -----------------------------------------------------------------------

const INVENTORY = {
  "os-hosts": "hosts",
  devices: "devices",
  networks: "networks",
  floatingips: "floatingips",
  "volume-pools": "volume_pools",
};

async function showAdmin() {
  const kind = $("admin-kind").value;
  const answer = await api("GET", `/v1/${kind}`);
  const rows = answer[INVENTORY[kind]] || [];
  const keys = [];
  for (const row of rows) for (const key of Object.keys(row)) if (!keys.includes(key)) keys.push(key);
  const head = clear($("admin-table").tHead);
  const tr = el("tr");
  for (const key of keys) tr.appendChild(el("th", key));
  head.appendChild(tr);
  table(
    $("admin-table").tBodies[0],
    rows.map((row) =>
      keys.map((key) => {
        const value = row[key];
        return value !== null && typeof value === "object" ? JSON.stringify(value) : value;
      }),
    ),
  );
  say(`${rows.length} ${INVENTORY[kind].replace("_", " ")}`);
}

$("admin-kind").addEventListener("change", () => showAdmin().catch(failed));

// -- routing ----------------------------------------------------------------------------------

function failed(error) {
  // The server's refusals are shown on the page; only the page's own faults are logged.
  if (!(error instanceof ApiError || error instanceof InputError)) console.error(error);
  if (error.status !== 401) say(error.message, "error");
}

function route() {
  if (!me.known) {
    // No token yet (or one refused): the views, and their calls, wait for one.
    showLogin();
    return;
  }
  const hash = location.hash || "#/timeline";
  const [, view, id] = hash.match(/^#\/([a-z]+)(?:\/(.+))?$/) || [null, "timeline"];
  for (const section of document.querySelectorAll(".view")) section.hidden = true;
  for (const a of document.querySelectorAll("nav a")) {
    a.classList.toggle("current", a.dataset.view === view);
  }
  if (flash) say(flash, "ok");
  else say("");
  flash = null;
  const show = (name) => {
    $(`view-${name}`).hidden = false;
  };
  if (view === "lease" && id) {
    show("lease");
    showLease(decodeURIComponent(id)).catch(failed);
  } else if (view === "leases") {
    show("leases");
    showLeases().catch(failed);
  } else if (view === "new") {
    show("new");
    resetNewForm();
    const refused = !me.allowed.has("blazar:leases:post");
    for (const node of $("new-lease").elements) node.disabled = refused;
    if (refused) say("your roles do not allow creating leases (blazar:leases:post)", "error");
  } else if (view === "admin" && me.allowed.has("blazar:oshosts:get")) {
    show("admin");
    showAdmin().catch(failed);
  } else {
    // #/timeline/720: a view of that many hours around now (links, the benchmark).
    show("timeline");
    const hours = Number(id) > 0 ? Number(id) : 168;
    if (!tl.timeline || id) drawTimeline(visibleWindow(hours)).catch(failed);
    else refreshTimeline();
  }
}

// The window shown, fetched again: leases made, changed or ended since show as they are now.
function refreshTimeline() {
  const range = tl.timeline.getWindow();
  drawTimeline({ start: range.start.valueOf(), end: range.end.valueOf() }).catch(failed);
}

const REFRESH_MS = 60e3;
setInterval(() => {
  if (tl.timeline && !$("view-timeline").hidden && document.visibilityState === "visible") {
    refreshTimeline();
  }
}, REFRESH_MS);

window.addEventListener("hashchange", route);

(async () => {
  if (await identify()) route();
  else showLogin();
})().catch(failed);
