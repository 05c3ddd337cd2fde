// ADC's dashboard: plain script over the REST API and its Server-Sent Events.
// The session is an HttpOnly cookie the api sets at sign-in; this script never holds the token
// after sending it once. Everything shown goes through textContent, never as HTML.
//
// Each view runs in its own context (`View`): its EventSources, log follows, timers, charts and
// window listeners are the context's, and all of them are closed when the view is left. A view's loader awaits
// the api; once its context is closed, whatever it was about to add is dropped (`v.alive`), so a
// view opened again while the first load is still running never shows anything twice.
"use strict";

const $ = (sel) => document.querySelector(sel);
let me = null;
let session = null;        // /v1/me of this sign-in, once asked: the views open beside it
let view = null;           // the current View

class View {
  constructor() { this.alive = true; this.streams = []; this.fetches = []; this.timers = []; this.charts = []; this.unlisten = []; }
  close() {
    this.alive = false;
    this.streams.forEach((s) => s.close());
    this.fetches.forEach((a) => a.abort());
    this.timers.forEach((t) => clearInterval(t));
    this.charts.forEach((c) => c.destroy());
    this.unlisten.forEach((off) => off());
    this.streams = []; this.fetches = []; this.timers = []; this.charts = []; this.unlisten = [];
  }
  listen(target, kind, fn, options) {
    if (!this.alive) return;
    target.addEventListener(kind, fn, options);
    this.unlisten.push(() => target.removeEventListener(kind, fn, options));
  }
  every(ms, fn) { if (this.alive) this.timers.push(setInterval(() => { if (this.alive) fn(); }, ms)); }
  chart(c) { if (this.alive) this.charts.push(c); else c.destroy(); return c; }
}

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else node.setAttribute(k, v);
  }
  for (const child of children) node.append(child);
  return node;
}

async function api(path) {
  const r = await fetch(path, { credentials: "same-origin", headers: { Accept: "application/json" } });
  if (r.status === 401) { showLogin(); throw new Error("signed out"); }
  if (!r.ok) throw new Error(`${path}: ${r.status}`);
  return r.json();
}

function follow(v, path, handlers) {
  if (!v.alive) return null;
  const source = new EventSource(path, { withCredentials: true });
  for (const [kind, fn] of Object.entries(handlers)) {
    source.addEventListener(kind, (e) => { if (v.alive) fn(JSON.parse(e.data)); });
  }
  v.streams.push(source);
  return source;
}

// A streamed text response (a log follow), chunk by chunk, until it ends or the view closes.
async function followText(v, path, onText) {
  if (!v.alive) return;
  const abort = new AbortController();
  v.fetches.push(abort);
  try {
    const r = await fetch(path, { credentials: "same-origin", signal: abort.signal });
    if (!r.ok) { onText(`(${r.status}: ${(await r.text()).slice(0, 300)})\n`); return; }
    const reader = r.body.getReader();
    const decoder = new TextDecoder();
    for (;;) {
      const { value, done } = await reader.read();
      if (done || !v.alive) break;
      onText(decoder.decode(value, { stream: true }));
    }
  } catch (err) {
    if (err.name !== "AbortError") onText(`(log stream ended: ${err.message})\n`);
  }
}

function debounce(v, fn, ms) {
  let timer = null;
  return () => { if (!timer) timer = setTimeout(() => { timer = null; if (v.alive) fn(); }, ms); };
}

function seconds(s) {
  if (s == null || !isFinite(s)) return "-";
  s = Math.max(0, Math.round(s));
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), r = s % 60;
  return h ? `${h}h ${String(m).padStart(2, "0")}m` : m ? `${m}m ${String(r).padStart(2, "0")}s` : `${r}s`;
}

const fmt = {
  time: (t) => new Date(typeof t === "number" ? t * 1000 : t).toLocaleTimeString(),
  stamp: (t) => (t ? new Date(t).toLocaleString() : "-"),
  placement: (p) => (p || []).map((x) => `${x.node}[${x.gpus.join(",")}]`).join(" ") || "-",
  pct: (x) => `${Math.round(x)}%`,
  num: (x, d = 4) => (typeof x === "number" ? x.toPrecision(d) : "-"),
  bytes: (b) => {
    if (typeof b !== "number") return "-";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (b >= 1024 && i < units.length - 1) { b /= 1024; i++; }
    return `${b.toFixed(i ? 1 : 0)} ${units[i]}`;
  },
};

// --- charts (uPlot, vendored) ---------------------------------------------------------

// The legend shows the values under the cursor; away from the chart, the newest values (not "--").
function legendAtLatest(u) {
  if (u.cursor.idx == null && u.data[0].length) u.setLegend({ idx: u.data[0].length - 1 });
}

function emptied(sel) { const box = $(sel); box.replaceChildren(); return box; }

function lineChart(v, target, { width = 460, height = 220, time = false, xLabel = "step", series, yRange, yLabel }) {
  const values = (u, ticks) => ticks.map((t) => (Math.abs(t) < 0.01 && t !== 0 ? t.toExponential(2) : +t.toPrecision(3)));
  const chart = new uPlot({
    width, height, scales: { x: { time }, ...(yRange ? { y: { range: yRange } } : {}) },
    series: [{ label: xLabel, ...(time ? {} : { value: (u, x) => (x == null ? "--" : String(x)) }) },
             ...series.map((s) => ({ width: 2, spanGaps: true, ...s }))],
    axes: [time ? {} : { label: xLabel }, { values, size: 64, ...(yLabel ? { label: yLabel } : {}) }],
    hooks: { setData: [legendAtLatest], setCursor: [legendAtLatest] },
  }, [[], ...series.map(() => [])], target);
  return v.chart(chart);
}

const PALETTE = ["#1d5fd1", "#b35900", "#1a7f37", "#8a3ffc", "#c2185b", "#00838f", "#6d4c41", "#546e7a"];

// --- sign in --------------------------------------------------------------------------

function showLogin() {
  closeView();
  me = null; session = null;
  $("#nav").hidden = true; $("#sign-out").hidden = true; $("#who").textContent = "";
  document.querySelectorAll(".view").forEach((s) => (s.hidden = true));
  $("#login").hidden = false;
}

$("#login-form").addEventListener("submit", async (e) => {
  e.preventDefault();
  const token = $("#login-token").value.trim();
  const r = await fetch("/ui/session", { method: "POST", credentials: "same-origin",
                                         headers: { Authorization: `Bearer ${token}` } });
  $("#login-token").value = "";
  if (r.status !== 204) {
    $("#login-error").textContent = r.status === 401 ? "That token is not valid (unknown, expired or revoked)."
                                                      : `Sign-in failed (${r.status}).`;
    return;
  }
  $("#login-error").textContent = "";
  await start();
});

$("#sign-out").addEventListener("click", async () => {
  await fetch("/ui/logout", { method: "POST", credentials: "same-origin" });
  showLogin();
});

// The view's first reads go out beside /v1/me, not after it: the cookie signs each, and a 401 on
// any of them shows the sign-in form instead.
async function start() {
  const asked = session = api("/v1/me");
  asked.catch(() => {});  // answered below
  route();
  let who;
  try { who = await asked; } catch { return; }
  if (session !== asked) return;  // signed out (or in again) meanwhile
  me = who;
  $("#login").hidden = true; $("#nav").hidden = false; $("#sign-out").hidden = false;
  $("#who").textContent = `${me.name} (${me.role}, team ${me.team})`;
}

// --- routing --------------------------------------------------------------------------

function closeView() {
  if (view) view.close();
  view = null;
}

function route() {
  if (!session) return;
  closeView();
  const v = view = new View();
  const [path, query] = (location.hash || "#/cluster").split("?");
  const [, name, arg] = path.split("/");
  document.querySelectorAll(".view").forEach((s) => (s.hidden = true));
  document.querySelectorAll("#nav a").forEach((a) => a.classList.toggle("active", a.hash === `#/${name}`));
  const id = decodeURIComponent(arg || "");
  const show = { cluster: showCluster, queue: showQueue, jobs: showJobs, job: (w) => showJob(w, id),
                 node: (w) => showNode(w, id), audit: (w) => showAudit(w, new URLSearchParams(query || "")) }[name]
               || showCluster;
  show(v).catch((err) => { if (v.alive && err.message !== "signed out") console.warn(err); });
}
window.addEventListener("hashchange", route);

// --- cluster --------------------------------------------------------------------------

// A thousand nodes of eight GPUs: the view keeps every node's latest state (`model`) and draws
// only the rows in view and a few around them; scrolling draws the rows it brings into view from
// the model, and a live frame touches the DOM only for the rows drawn.
const OVERSCAN_ROWS = 6;

async function showCluster(v) {
  const opened = performance.now();
  $("#view-cluster").hidden = false;
  const box = $("#nodes");
  box.replaceChildren();
  box.style.paddingTop = box.style.paddingBottom = "";
  for (const k of ["loaded", "frames", "drawnMs", "nodes", "cells"]) delete box.dataset[k];  // this opening's only
  delete $("#cluster-chart").dataset.points;
  // One read has the nodes, their devices and the latest readings (the frame it is of); the live
  // stream then sends only the nodes that changed after that frame. Asked first, drawn below.
  const listing = api("/v1/nodes?telemetry=true");
  listing.catch(() => {});  // awaited below, once the chart is made
  const util = lineChart(v, emptied("#cluster-chart"), {
    width: 900, height: 200, time: true, xLabel: "time",
    series: [{ label: "GPUs reporting", stroke: "#9aa3ad" }, { label: "allocated", stroke: "#1d5fd1" },
             { label: "busy", stroke: "#1a7f37" }] });
  const history = async () => {
    const h = await api("/v1/cluster/history");
    if (!v.alive) return;
    util.setData([h.ts, h.gpus, h.allocated, h.busy]);
    $("#cluster-chart").dataset.points = String(h.ts.length);
  };
  const listed = await listing;
  if (!v.alive) return;  // left (or opened again) while loading: that view draws the nodes
  const order = [];      // node ids, top to bottom
  const model = {};      // node id -> { at: its place in `order`, status, host, gpus: index -> latest readings }
  const add = (id, status = "") => {
    if (!model[id]) { model[id] = { at: order.length, status, host: "", gpus: new Map() }; order.push(id); }
    return model[id];
  };
  const drawn = new Map();  // node id -> { root, host, cells: index -> cell } for the rows in the DOM
  let rowPx = 64;           // one row's height with its gap, measured once the first rows are drawn
  let cells = 0;

  const cell = (row, id, g) => {
    let c = row.cells.get(g.index);
    if (!c || c.kind !== (g.kind || c.kind)) {
      const fresh = gpuCell(id, g);
      if (c) c.root.replaceWith(fresh.root); else row.root.append(fresh.root);
      row.cells.set(g.index, c = fresh);
    }
    c.update(g);
  };
  const drawRow = (id) => {
    const n = model[id];
    const host = el("small", { class: "host", text: n.host });
    const row = { root: el("div", { class: "node", "data-node": id }), host, cells: new Map() };
    row.root.append(el("div", { class: "node-name" }, el("a", { href: `#/node/${encodeURIComponent(id)}`, text: id }),
                       el("small", { class: "status", text: n.status }), host));
    for (const g of n.gpus.values()) cell(row, id, g);
    return row;
  };
  // The rows from `first` to `last` (exclusive) in the DOM, the rest of the list's height as padding.
  const place = () => {
    const top = box.getBoundingClientRect().top;
    const first = Math.max(0, Math.floor(-top / rowPx) - OVERSCAN_ROWS);
    const last = Math.min(order.length, Math.ceil((window.innerHeight - top) / rowPx) + OVERSCAN_ROWS);
    for (const [id, row] of drawn) {
      if (model[id].at < first || model[id].at >= last) { row.root.remove(); drawn.delete(id); }
    }
    let next = null;  // rows go in order: each before the first drawn row below it
    for (let i = last - 1; i >= first; i--) {
      const id = order[i];
      let row = drawn.get(id);
      if (!row) { drawn.set(id, row = drawRow(id)); box.insertBefore(row.root, next); }
      next = row.root;
    }
    box.style.paddingTop = `${first * rowPx}px`;
    box.style.paddingBottom = `${Math.max(0, order.length - last) * rowPx}px`;
  };
  const measure = () => {
    const rows = box.children;
    if (rows.length < 2) return false;
    const px = rows[1].offsetTop - rows[0].offsetTop;
    if (px <= 0 || Math.abs(px - rowPx) < 1) return false;
    rowPx = px;
    return true;
  };
  const hostText = (f) => `cpu ${fmt.pct(f.cpu_pct)} · host mem ${fmt.pct(100 * f.mem_used_bytes / (f.mem_total_bytes || 1))}`;
  const devices = (id, gpus) => {  // merged into the model, and into the node's row where it is drawn
    const n = add(id), row = drawn.get(id);
    for (const g of gpus) {
      if (!n.gpus.has(g.index)) cells++;
      const merged = { ...n.gpus.get(g.index), ...g };
      n.gpus.set(g.index, merged);
      if (row) cell(row, id, merged);
    }
  };
  const shown = (f) => {  // a node's readings, from the first read or a live frame
    const n = add(f.node), host = hostText(f);
    if (n.host !== host) {
      n.host = host;
      const row = drawn.get(f.node);
      if (row) row.host.textContent = host;
    }
    devices(f.node, f.gpus);  // a node without GPU telemetry keeps its devices from /v1/nodes
  };
  for (const n of listed.items) {
    add(n.id, n.status);
    devices(n.id, n.devices.map((d) => ({ memory_used_bytes: 0, util_pct: 0, ...d })));
  }
  for (const f of listed.telemetry || []) shown(f);  // before any row is drawn: the first paint is live
  place();
  if (measure()) place();
  const counted = () => { box.dataset.nodes = String(order.length); box.dataset.cells = String(cells); };
  counted();
  box.dataset.drawnMs = String(Math.round(performance.now() - opened));  // for bench/ui_scale.py
  box.dataset.loaded = String(Date.now());
  let pending = false;
  const replace = () => { if (!pending) { pending = true; requestAnimationFrame(() => { pending = false; if (v.alive) place(); }); } };
  v.listen(window, "scroll", replace, { passive: true });
  v.listen(window, "resize", replace);
  follow(v, `/v1/nodes/stream?delta=true&since=${encodeURIComponent(listed.frame || "")}`, {
    nodes: (frames) => {
      const known = order.length;
      frames.forEach(shown);
      if (order.length !== known) { place(); counted(); }  // a node the list did not have
      box.dataset.frames = String(+(box.dataset.frames || 0) + 1);
    },
  });
  await history();
  v.every(10_000, history);
}

// One GPU (or CPU slot) cell, updated in place by each frame: a single element (its bars are the
// CSS of --mem, --hue and --util, its two lines one text), as 8,000 cells are drawn at once.
function gpuCell(node, g) {
  const root = document.createElement("div");
  root.className = g.kind === "cpu" ? "gpu cpu" : "gpu";
  root.dataset.gpu = `${node}/${g.index}`;
  if (g.kind === "cpu") {  // a CPU slot of a node without GPUs: only whether it is taken
    return { root, kind: "cpu", update: (x) => {
      if (x.job_id !== undefined) { root.dataset.job = x.job_id || ""; root.textContent = `CPU slot ${g.index}\n${x.job_id || "free"}`; }
    } };
  }
  root.title = g.name || "";
  let text = "", job = "", used = null;
  return { root, kind: g.kind, update: (x) => {
    const frac = x.memory_total_bytes ? x.memory_used_bytes / x.memory_total_bytes : 0;
    if (x.job_id !== undefined) job = x.job_id || "";
    const now = `GPU ${x.index} · mem ${fmt.pct(frac * 100)} · util ${fmt.pct(x.util_pct || 0)}\n${job || "free"}`;
    if (now !== text) {  // only what changed touches the DOM
      text = now;
      root.textContent = now;
      root.dataset.job = job;
      root.style.setProperty("--mem", `${Math.round(frac * 100)}%`);
      root.style.setProperty("--hue", String(Math.round(130 * (1 - Math.min(1, frac)))));
      root.style.setProperty("--util", `${Math.round(x.util_pct || 0)}%`);
    }
    if (x.memory_used_bytes !== used) {
      used = x.memory_used_bytes;
      root.title = `${x.name || g.name || "GPU"}: ${fmt.bytes(used)} of ${fmt.bytes(x.memory_total_bytes)} in use`;
    }
  } };
}

// --- one node's last hour -------------------------------------------------------------

async function showNode(v, id) {
  $("#view-node").hidden = false;
  $("#node-title").textContent = `Node ${id}: the last hour`;
  const box = $("#node-charts");
  box.replaceChildren();
  delete box.dataset.points;
  $("#node-error").textContent = "";
  let h;
  try { h = await api(`/v1/nodes/${encodeURIComponent(id)}/history`); } catch (err) {
    if (v.alive) $("#node-error").textContent = `No telemetry from ${id} in the last hour (${err.message}).`;
    return;
  }
  if (!v.alive) return;
  const gpus = h.gpus.map((g) => g.index);
  const panel = (key, title, yRange) => {
    const target = el("div", { id: `node-${key}`, class: "history-chart" });
    box.append(el("figure", {}, el("figcaption", { text: title }), target));
    return lineChart(v, target, { width: 560, height: 200, time: true, xLabel: "time", yRange,
      series: key === "host" ? [{ label: "cpu %", stroke: PALETTE[0] }, { label: "memory %", stroke: PALETTE[1] }]
                             : gpus.map((i, k) => ({ label: `GPU ${i}`, stroke: PALETTE[k % PALETTE.length] })) });
  };
  const sensed = h.gpus.some((g) => g.temperature_c.some((t) => t != null));  // simulated devices have none
  const charts = { memory_pct: panel("memory", "GPU memory in use (%)", [0, 100]),
                   util_pct: panel("util", "GPU utilization (%)", [0, 100]),
                   ...(sensed ? { temperature_c: panel("temperature", "GPU temperature (°C)") } : {}),
                   host: panel("host", "host CPU and memory (%)", [0, 100]) };
  const draw = (x) => {
    for (const key of ["memory_pct", "util_pct", "temperature_c"]) {
      if (charts[key]) charts[key].setData([x.ts, ...x.gpus.map((g) => g[key])]);
    }
    charts.host.setData([x.ts, x.cpu_pct, x.mem_pct]);
    box.dataset.points = String(x.ts.length);
  };
  draw(h);
  v.every(10_000, async () => { const x = await api(`/v1/nodes/${encodeURIComponent(id)}/history`); if (v.alive) draw(x); });
}

// --- queue ----------------------------------------------------------------------------

async function showQueue(v) {
  const opened = performance.now();
  $("#view-queue").hidden = false;
  const body = $("#queue-table tbody");
  body.replaceChildren();
  delete body.parentElement.dataset.loaded;
  const render = async () => {
    const q = await api("/v1/queue");
    if (!v.alive) return;
    $("#queue-summary").textContent = `${q.pending} pending; ${q.schedulable_nodes} schedulable node(s), ` +
      `the largest with ${q.largest_node_gpus} device(s).`;
    body.replaceChildren(...q.items.map((j) => {
      const codes = Object.keys(j.reason_codes || {});
      return el("tr", { "data-job-id": j.id, "data-never-fits": String(j.never_fits) },
        el("td", { class: "position", text: `${j.position}` }), el("td", { text: j.priority }),
        el("td", {}, el("a", { href: `#/job/${encodeURIComponent(j.id)}`, class: "mono", text: j.id })),
        el("td", { text: j.name }), el("td", { text: j.team }), el("td", { text: String(j.gpus) }),
        el("td", { class: "waiting", text: seconds(j.waiting_s) }),
        el("td", { class: "reason" },
          ...codes.map((c) => el("span", { class: "code", text: c })),
          el("span", { class: "reason-text", text: j.reason || "waiting for the decider's first evaluation" })),
        el("td", { class: "never" }, j.never_fits ? el("strong", { class: "error", text: "can never fit", title: j.never_fits_why || "" })
                                                  : ""));
    }));
    if (!body.parentElement.dataset.loaded) body.parentElement.dataset.drawnMs = String(Math.round(performance.now() - opened));
    body.parentElement.dataset.loaded = String(Date.now());
  };
  await render();
  // The decider's pass runs each second, so the queue follows at 1 Hz; a slow read skips a beat
  // instead of stacking requests behind it.
  let reading = false;
  v.every(1000, async () => {
    if (reading) return;
    reading = true;
    try { await render(); } finally { reading = false; }
  });
}

// --- jobs -----------------------------------------------------------------------------

function sparkline(target, losses) {
  const xs = losses.map((_, i) => i);
  return (new uPlot({ width: 140, height: 34, legend: { show: false }, cursor: { show: false },
    axes: [{ show: false }, { show: false }], scales: { x: { time: false } },
    series: [{}, { stroke: "#1d5fd1", width: 1.5, points: { show: false } }] }, [xs, losses], target));
}

const ACTIVE = ["running", "checkpointing", "migrating", "resizing"];

async function showJobs(v) {
  $("#view-jobs").hidden = false;
  const body = $("#jobs-table tbody");
  const curves = {};   // job id -> losses
  let lines = {};      // job id -> uPlot sparkline, redrawn with the table
  const dropLines = () => { Object.values(lines).forEach((c) => c.destroy()); lines = {}; };
  v.chart({ destroy: dropLines });
  async function render() {
    const jobs = (await api("/v1/jobs?limit=100")).items;
    if (!v.alive) return;
    const rows = [];
    for (const j of jobs) {
      const p = j.progress || {};
      const curve = el("td", { class: "curve" });
      rows.push(el("tr", { "data-job-id": j.id },
        el("td", {}, el("a", { href: `#/job/${encodeURIComponent(j.id)}`, class: "mono", text: j.id })),
        el("td", { text: j.name }), el("td", { text: j.team }),
        el("td", { class: `status-${j.status}`, text: j.status }), el("td", { text: j.priority }),
        el("td", { class: "mono", text: fmt.placement(j.placement) }),
        el("td", { class: "progress", text: p.step != null ? `${p.step}/${p.max_steps ?? "?"}` : "-" }),
        el("td", { class: "loss", text: fmt.num(p.loss) }), curve));
      if (ACTIVE.includes(j.status) && !curves[j.id]) {  // read once per job; the stream below appends to it
        const m = await api(`/v1/jobs/${encodeURIComponent(j.id)}/metrics?max_points=100`);
        if (!v.alive) return;
        curves[j.id] = m.points.map((x) => x.loss).filter((x) => typeof x === "number");
      }
    }
    dropLines();
    body.replaceChildren(...rows);
    for (const j of jobs) {
      if (ACTIVE.includes(j.status)) {
        lines[j.id] = sparkline( body.querySelector(`tr[data-job-id="${CSS.escape(j.id)}"] td.curve`), curves[j.id]);
      }
    }
    body.parentElement.dataset.loaded = String(Date.now());
  }
  const refresh = debounce(v, render, 1000);
  await render();
  follow(v, "/v1/audit/stream", { audit: (e) => { if (e.job_id) refresh(); } });
  follow(v, "/v1/jobs/stream", {
    progress: (p) => {
      const tr = body.querySelector(`tr[data-job-id="${CSS.escape(p.job_id)}"]`);
      if (!tr) return refresh();
      if (p.step != null) tr.querySelector(".progress").textContent = `${p.step}/${p.max_steps ?? "?"}`;
      if (typeof p.loss === "number") {
        tr.querySelector(".loss").textContent = fmt.num(p.loss);
        if (lines[p.job_id]) {
          curves[p.job_id].push(p.loss);
          if (curves[p.job_id].length > 500) curves[p.job_id].shift();
          lines[p.job_id].setData([curves[p.job_id].map((_, i) => i), curves[p.job_id]]);
        }
      }
    },
    job: refresh,
  });
}

// --- one job --------------------------------------------------------------------------

// A job id as one shell word, for a command shown to copy (ids are [A-Za-z0-9._-], but say so anyway).
function shellWord(s) { return /^[A-Za-z0-9._-]+$/.test(s) ? s : `'${s.replace(/'/g, "'\\''")}'`; }

const MOVES = new Set(["job.move_requested", "decision", "decision.refused", "job.scheduled", "job.starting", "job.running",
  "job.checkpointing", "job.migrating", "job.resizing", "job.preempted", "job.paused", "job.pending",
  "job.succeeded", "job.failed", "job.cancelled", "protocol.done", "protocol.failed", "protocol.rolled_back",
  "command.start", "protocol.prepared", "protocol.prepare_failed", "command.stop", "protocol.resumed"]);
const FINAL = new Set(["job.succeeded", "job.failed", "job.cancelled"]);
const SMOOTHING = 0.9;   // exponential moving average weight of the past, as TensorBoard's slider
const LOG_LINES = 400;   // the tail kept on screen

function smoothed(values) {
  let last = null;
  return values.map((x) => {
    if (typeof x !== "number") return last;
    last = last == null ? x : SMOOTHING * last + (1 - SMOOTHING) * x;
    return last;
  });
}

// Seconds per step from the newest points: the trainer's own step time where it reports one,
// else the time between logging steps.
function stepTime(points) {
  const recent = points.slice(-20);
  const told = recent.map((p) => p.step_time_s).filter((x) => typeof x === "number" && x > 0);
  if (told.length) return told.reduce((a, b) => a + b, 0) / told.length;
  if (recent.length < 2) return null;
  const a = recent[0], b = recent[recent.length - 1];
  return b.step > a.step ? (b.ts - a.ts) / (b.step - a.step) : null;
}

async function showJob(v, id) {
  $("#view-job").hidden = false;
  const q = encodeURIComponent(id);
  for (const t of ["#placement-history tbody", "#checkpoints tbody"]) $(t).replaceChildren();
  $("#log-tail").textContent = "";
  delete $("#log-tail").dataset.bytes;
  delete $("#loss-chart").dataset.points;
  const [job, signed] = await Promise.all([api(`/v1/jobs/${q}`), session]);  // the role decides the actions offered
  if (!v.alive) return;
  $("#job-title").textContent = `${job.name} (${job.id})`;
  $("#job-audit-link").href = `#/audit?job_id=${q}`;
  $("#job-manual-link").href = `#/audit?job_id=${q}&rule=manual`;
  const facts = $("#job-facts");
  const points = [];
  let current = job;
  const setFacts = () => {
    const j = current, p = j.progress || {};
    const started = j.started_at ? Date.parse(j.started_at) / 1000 : null;
    const finished = j.finished_at ? Date.parse(j.finished_at) / 1000 : null;
    const per = stepTime(points);
    const left = p.max_steps != null && p.step != null ? p.max_steps - p.step : null;
    const eta = !finished && per && left != null && ACTIVE.includes(j.status) ? per * left : null;
    const rows = [["status", j.status + (j.status_reason ? ` (${j.status_reason})` : "")], ["team", j.team],
      ["owner", j.owner], ["priority", j.priority], ["placement", fmt.placement(j.placement)],
      ["attempt", String(j.attempt)], ["progress", p.step != null ? `step ${p.step} of ${p.max_steps ?? "?"}` : "-"],
      ["submitted", fmt.stamp(j.submitted_at)], ["started", fmt.stamp(j.started_at)],
      ["finished", fmt.stamp(j.finished_at)],
      [finished ? "duration" : "elapsed", started ? seconds((finished || Date.now() / 1000) - started) : "-"],
      ["step time", per ? `${per.toPrecision(3)} s` : "-"],
      ["ETA", eta != null ? `${seconds(eta)} (at ${new Date(Date.now() + eta * 1000).toLocaleTimeString()})` : "-"],
      ["tokens/s", fmt.num(p.tokens_per_s)], ["last checkpoint", j.last_checkpoint ? `step ${j.last_checkpoint_step}: ${j.last_checkpoint}` : "-"],
      ["trace id", j.trace_id || "-"]];
    if (j.pending_reason) rows.push(["why pending", j.pending_reason]);
    if (j.chain) rows.push(["chain", j.chain.map((m) => `${m.name} ${m.id} (${m.status})`).join(" → ")]);  // after, in order
    for (const [split, m] of Object.entries(j.evaluation || {})) {  // LLaMA-Factory's eval / predict metrics
      const shown = Object.entries(m).filter(([k]) => k !== "step").map(([k, x]) => `${k} ${fmt.num(x)}`);
      rows.push([split, `step ${m.step ?? "?"}: ${shown.join(", ")}`]);
    }
    facts.replaceChildren(...rows.flatMap(([k, x]) => [el("dt", { text: k }), el("dd", { "data-fact": k, text: x })]));
  };
  let offered = "";
  const setActions = () => {  // the commands for what the caller may do now, as the API allows them
    const j = current, sid = shellWord(j.id);
    const may = [];
    if (j.status === "running") may.push([`adc pause ${sid}`, "checkpoint it and hold it"]);
    if (j.status === "running" && ["operator", "admin"].includes(signed.role)) {
      may.push([`adc migrate ${sid} [--to NODE]`, "move it without losing a step (operators)"]);
    }
    if (j.status === "paused") may.push([`adc resume ${sid}`, "queue it to continue from its checkpoint"]);
    if (!["succeeded", "failed", "cancelled"].includes(j.status)) may.push([`adc cancel ${sid}`, "cancel it"]);
    const key = may.map(([c]) => c).join("|");
    if (key === offered) return;
    offered = key;
    $("#job-actions").replaceChildren(...(may.length ? may : [["", `nothing: the job has ${j.status}`]])
      .map(([cmd, what]) => el("li", { "data-command": cmd }, ...(cmd ? [el("code", { text: cmd }), " "] : []),
                               el("span", { class: "legend", text: what }))));
  };
  setFacts();
  setActions();
  v.every(1000, () => { setFacts(); setActions(); });  // elapsed and ETA move on between events
  const refresh = debounce(v, async () => { const j = await api(`/v1/jobs/${q}`); if (v.alive) { current = j; setFacts(); } }, 1000);

  const loss = lineChart(v, emptied("#loss-chart"), {
    series: [{ label: "loss", stroke: "#1d5fd1" }, { label: "smoothed", stroke: "#0b2e6b", show: $("#smooth-loss").checked }] });
  const lr = lineChart(v, emptied("#lr-chart"), { series: [{ label: "learning rate", stroke: "#b35900" }] });
  $("#smooth-loss").onchange = (e) => loss.setSeries(2, { show: e.target.checked });
  const add = (p) => { if (p.step != null) points.push(p); };
  const draw = () => {
    const steps = points.map((p) => p.step), losses = points.map((p) => p.loss ?? null);
    loss.setData([steps, losses, smoothed(losses)]);
    lr.setData([steps, points.map((p) => p.learning_rate ?? null)]);
    $("#loss-chart").dataset.points = String(points.length);
  };
  const [metrics, events] = await Promise.all([api(`/v1/jobs/${q}/metrics`), api(`/v1/jobs/${q}/checkpoints`)]);
  if (!v.alive) return;
  metrics.points.forEach(add);
  draw();

  const history = $("#placement-history tbody");
  // An operator's request (a move) and the decision it became link each other, by the request's id.
  const requests = {}, fulfilled = {};
  const decisionLink = (id) => el("a", { href: `#/audit?decision_id=${encodeURIComponent(id)}`, class: "mono",
                                         title: "every event of this decision", text: id.slice(0, 12) });
  const addMove = (e) => {
    if (!MOVES.has(e.kind)) return;
    history.querySelectorAll("tr.final").forEach((r) => r.classList.remove("final"));
    const where = e.data && e.data.placement ? fmt.placement(e.data.placement) : (e.node || "");
    const decision = el("td", { class: "decision" }, ...(e.decision_id ? [decisionLink(e.decision_id)] : []));
    const row = el("tr", { "data-kind": e.kind, "data-action": e.action || "", class: "final" },
      el("td", { text: fmt.time(e.ts) }),
      el("td", { text: e.kind + (e.action ? ` ${e.action}` : "") + (e.rule ? ` (${e.rule})` : "") }),
      el("td", { class: "mono", text: where }), el("td", { text: e.reason || "" }),
      el("td", { class: "by", text: e.actor || (e.source === "decider" ? `decider (${e.rule || "?"})` : e.source || "") }),
      decision);
    history.append(row);
    const asked = e.kind === "job.move_requested" && e.data && e.data.request_id;
    const answers = e.kind === "decision" && e.evidence && e.evidence.request_id;
    if (asked) {
      requests[asked] = decision;
      if (fulfilled[asked]) decision.replaceChildren("became ", decisionLink(fulfilled[asked]));
    }
    if (answers && e.decision_id) {
      fulfilled[answers] = e.decision_id;
      if (requests[answers]) requests[answers].replaceChildren("became ", decisionLink(e.decision_id));
    }
    if (FINAL.has(e.kind)) history.parentElement.dataset.finished = e.kind;
  };
  const checkpoints = $("#checkpoints tbody");
  const addCheckpoint = (c) => checkpoints.append(el("tr", { "data-step": c.step ?? "" },
    el("td", { text: fmt.time(c.ts) }), el("td", { class: "step", text: c.step ?? "-" }),
    el("td", { class: "size", text: fmt.bytes(c.size_bytes) }), el("td", { text: String(c.attempt) }),
    el("td", { text: c.node || "" }), el("td", { class: "mono", text: c.path || "" })));
  events.items.forEach(addCheckpoint);
  const reloadCheckpoints = debounce(v, async () => {
    const c = await api(`/v1/jobs/${q}/checkpoints`);
    if (v.alive) { checkpoints.replaceChildren(); c.items.forEach(addCheckpoint); }
  }, 1000);

  follow(v, `/v1/audit/stream?job_id=${q}&backlog=1000`, { audit: (e) => { addMove(e); refresh(); } });
  follow(v, `/v1/jobs/stream?job_id=${q}`, {
    progress: (p) => { add(p); draw(); refresh(); },
    job: (e) => { if (e.kind === "checkpointed") reloadCheckpoints(); refresh(); },
  });

  // The trainer's log, followed as `adc logs -f` does (the same route, the same rights).
  const tail = $("#log-tail");
  let text = "";
  followText(v, `/v1/jobs/${q}/logs?tail=${LOG_LINES}&follow=true`, (chunk) => {
    const stick = tail.scrollTop + tail.clientHeight >= tail.scrollHeight - 4;
    text += chunk;
    const lines = text.split("\n");
    if (lines.length > LOG_LINES + 1) text = lines.slice(-LOG_LINES - 1).join("\n");
    tail.textContent = text;
    tail.dataset.bytes = String(+(tail.dataset.bytes || 0) + chunk.length);
    if (stick) tail.scrollTop = tail.scrollHeight;
  });
}

// --- audit ----------------------------------------------------------------------------

// `filters` (from the address, e.g. #/audit?job_id=J or ?decision_id=D) fill the form first.
function showAudit(v, filters = new URLSearchParams()) {
  $("#view-audit").hidden = false;
  const body = $("#audit-table tbody");
  for (const input of $("#audit-filters").elements) if (input.name) input.value = filters.get(input.name) || "";
  const open = () => {
    v.streams.forEach((s) => s.close()); v.streams = [];
    body.replaceChildren();
    const params = new URLSearchParams({ backlog: "200" });
    for (const [k, x] of new FormData($("#audit-filters"))) if (x) params.set(k, x);
    follow(v, `/v1/audit/stream?${params}`, {
      audit: (e) => {
        body.prepend(el("tr", { "data-kind": e.kind, "data-action": e.action || "", "data-job-id": e.job_id || "" },
          el("td", { text: String(e.id) }), el("td", { text: fmt.time(e.ts) }), el("td", { text: e.source }),
          el("td", { text: e.kind }), el("td", { class: "mono", text: e.job_id || "" }), el("td", { text: e.node || "" }),
          el("td", { text: e.rule || "" }), el("td", { text: e.action || "" }), el("td", { text: e.reason || "" }),
          el("td", { class: "mono", text: (e.data && e.data.trace_id) || "" })));
        while (body.children.length > 500) body.lastChild.remove();
      },
    });
  };
  $("#audit-filters").onsubmit = (e) => { e.preventDefault(); open(); };
  open();
  return Promise.resolve();
}

start();
