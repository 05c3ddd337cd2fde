// ADC's dashboard: plain script over the REST API and its Server-Sent Events.
// The session is an HttpOnly cookie the api sets at sign-in; this script never holds the token
// after sending it once. Everything shown goes through textContent, never as HTML.
"use strict";

const $ = (sel) => document.querySelector(sel);
let streams = [];          // the EventSources of the current view, closed when it changes
let charts = [];           // uPlot instances of the current view
let me = null;

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

function follow(path, handlers) {
  const source = new EventSource(path, { withCredentials: true });
  for (const [kind, fn] of Object.entries(handlers)) {
    source.addEventListener(kind, (e) => fn(JSON.parse(e.data)));
  }
  streams.push(source);
  return source;
}

function debounce(fn, ms) {
  let timer = null;
  return () => { if (!timer) timer = setTimeout(() => { timer = null; fn(); }, ms); };
}

const fmt = {
  time: (t) => new Date(typeof t === "number" ? t * 1000 : t).toLocaleTimeString(),
  placement: (p) => (p || []).map((x) => `${x.node}[${x.gpus.join(",")}]`).join(" ") || "-",
  pct: (x) => `${Math.round(x)}%`,
  num: (x, d = 4) => (typeof x === "number" ? x.toPrecision(d) : "-"),
};

// --- sign in --------------------------------------------------------------------------

function showLogin() {
  closeView();
  me = null;
  $("#nav").hidden = true; $("#sign-out").hidden = true; $("#who").textContent = "";
  document.querySelectorAll(".view").forEach((v) => (v.hidden = true));
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

async function start() {
  try { me = await api("/v1/me"); } catch { return; }
  $("#login").hidden = true; $("#nav").hidden = false; $("#sign-out").hidden = false;
  $("#who").textContent = `${me.name} (${me.role}, team ${me.team})`;
  route();
}

// --- routing --------------------------------------------------------------------------

function closeView() {
  streams.forEach((s) => s.close()); streams = [];
  charts.forEach((c) => c.destroy()); charts = [];
}

function route() {
  if (!me) return;
  closeView();
  const [, view, arg] = (location.hash || "#/cluster").split("/");
  document.querySelectorAll(".view").forEach((v) => (v.hidden = true));
  document.querySelectorAll("#nav a").forEach((a) => a.classList.toggle("active", a.hash === `#/${view}`));
  const show = { cluster: showCluster, jobs: showJobs, job: () => showJob(decodeURIComponent(arg || "")),
                 audit: showAudit }[view] || showCluster;
  show();
}
window.addEventListener("hashchange", route);

// --- cluster --------------------------------------------------------------------------

function memColour(frac) {  // green when free, through amber, to red when nearly full
  const hue = Math.round(130 * (1 - Math.min(1, frac)));
  return `hsl(${hue}, 70%, 72%)`;
}

async function showCluster() {
  $("#view-cluster").hidden = false;
  const box = $("#nodes");
  box.replaceChildren();
  const known = (await api("/v1/nodes")).items;
  const rows = {};
  const status = Object.fromEntries(known.map((n) => [n.id, n.status]));
  const row = (id) => {
    if (!rows[id]) {
      rows[id] = el("div", { class: "node", "data-node": id });
      rows[id].append(el("div", { class: "node-name" }, id, el("small", { class: "status", text: status[id] || "" }),
                         el("small", { class: "host" })));
      box.append(rows[id]);
    }
    return rows[id];
  };
  for (const n of known) {
    const r = row(n.id);
    for (const d of n.devices) r.append(gpuCell(n.id, { index: d.index, name: d.name, kind: d.kind, memory_used_bytes: 0,
      memory_total_bytes: d.memory_total_bytes, util_pct: 0, job_id: d.job_id }));
  }
  follow("/v1/nodes/stream", {
    nodes: (frames) => {
      for (const f of frames) {
        const r = row(f.node);
        r.querySelector(".host").textContent = `cpu ${fmt.pct(f.cpu_pct)} · host mem ${fmt.pct(100 * f.mem_used_bytes / (f.mem_total_bytes || 1))}`;
        if (!f.gpus.length) continue;  // a node without GPU telemetry keeps its devices from /v1/nodes
        r.querySelectorAll(".gpu").forEach((c) => c.remove());
        for (const g of f.gpus) r.append(gpuCell(f.node, g));
      }
    },
  });
}

function gpuCell(node, g) {
  if (g.kind === "cpu") {  // a CPU slot of a node without GPUs: only whether it is taken
    return el("div", { class: "gpu", "data-gpu": `${node}/${g.index}`, "data-job": g.job_id || "" },
      el("div", { class: "label" }, el("div", { text: `CPU slot ${g.index}` }),
         el("div", { class: "job", text: g.job_id || "free" })));
  }
  const frac = g.memory_total_bytes ? g.memory_used_bytes / g.memory_total_bytes : 0;
  const mem = el("div", { class: "mem" });
  mem.style.height = `${Math.round(frac * 100)}%`;
  mem.style.background = memColour(frac);
  const util = el("div", { class: "util" });
  util.style.width = `${Math.round(g.util_pct || 0)}%`;
  const label = el("div", { class: "label" },
    el("div", { text: `GPU ${g.index} · mem ${fmt.pct(frac * 100)} · util ${fmt.pct(g.util_pct || 0)}` }),
    el("div", { class: "job", text: g.job_id || "free" }));
  return el("div", { class: "gpu", "data-gpu": `${node}/${g.index}`, "data-job": g.job_id || "",
                     title: g.name || "" }, mem, util, label);
}

// --- jobs -----------------------------------------------------------------------------

function sparkline(target, losses) {
  const xs = losses.map((_, i) => i);
  const chart = new uPlot({ width: 140, height: 34, legend: { show: false }, cursor: { show: false },
    axes: [{ show: false }, { show: false }], scales: { x: { time: false } },
    series: [{}, { stroke: "#1d5fd1", width: 1.5, points: { show: false } }] }, [xs, losses], target);
  charts.push(chart);
  return chart;
}

async function showJobs() {
  $("#view-jobs").hidden = false;
  const body = $("#jobs-table tbody");
  const curves = {};   // job id -> losses
  const lines = {};    // job id -> uPlot sparkline
  async function render() {
    const jobs = (await api("/v1/jobs?limit=100")).items;
    charts.forEach((c) => c.destroy()); charts = [];
    body.replaceChildren();
    for (const j of jobs) {
      const p = j.progress || {};
      const curve = el("td", { class: "curve" });
      const tr = el("tr", { "data-job-id": j.id },
        el("td", {}, el("a", { href: `#/job/${encodeURIComponent(j.id)}`, class: "mono", text: j.id })),
        el("td", { text: j.name }), el("td", { text: j.team }),
        el("td", { class: `status-${j.status}`, text: j.status }), el("td", { text: j.priority }),
        el("td", { class: "mono", text: fmt.placement(j.placement) }),
        el("td", { class: "progress", text: p.step != null ? `${p.step}/${p.max_steps ?? "?"}` : "-" }),
        el("td", { class: "loss", text: fmt.num(p.loss) }), curve);
      body.append(tr);
      if (["running", "checkpointing", "migrating", "resizing"].includes(j.status)) {
        if (!curves[j.id]) {  // read once per job; the stream below appends to it
          const m = await api(`/v1/jobs/${encodeURIComponent(j.id)}/metrics?max_points=100`);
          curves[j.id] = m.points.map((x) => x.loss).filter((x) => typeof x === "number");
        }
        lines[j.id] = sparkline(curve, curves[j.id]);
      }
    }
    body.parentElement.dataset.loaded = String(Date.now());
  }
  const refresh = debounce(render, 1000);
  await render();
  follow("/v1/audit/stream", { audit: (e) => { if (e.job_id) refresh(); } });
  follow("/v1/jobs/stream", {
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

function curveChart(target, label, colour) {
  const values = (u, ticks) => ticks.map((v) => (Math.abs(v) < 0.01 && v !== 0 ? v.toExponential(2) : v.toPrecision(3)));
  const chart = new uPlot({ width: 460, height: 220, scales: { x: { time: false } },
    series: [{ label: "step" }, { label, stroke: colour, width: 2 }],
    axes: [{ label: "step" }, { values, size: 64 }] }, [[], []], target);
  charts.push(chart);
  return chart;
}

const MOVES = new Set(["decision", "decision.refused", "job.scheduled", "job.starting", "job.checkpointing",
  "job.migrating", "job.resizing", "job.preempted", "job.paused", "job.pending", "protocol.done",
  "protocol.failed", "protocol.rolled_back", "command.start"]);

async function showJob(id) {
  $("#view-job").hidden = false;
  const job = await api(`/v1/jobs/${encodeURIComponent(id)}`);
  $("#job-title").textContent = `${job.name} (${job.id})`;
  const facts = $("#job-facts");
  const setFacts = (j) => {
    const p = j.progress || {};
    const rows = [["status", j.status + (j.status_reason ? ` (${j.status_reason})` : "")], ["team", j.team],
      ["owner", j.owner], ["priority", j.priority], ["placement", fmt.placement(j.placement)],
      ["attempt", String(j.attempt)], ["progress", p.step != null ? `step ${p.step} of ${p.max_steps ?? "?"}` : "-"],
      ["tokens/s", fmt.num(p.tokens_per_s)], ["last checkpoint", j.last_checkpoint ? `step ${j.last_checkpoint_step}: ${j.last_checkpoint}` : "-"],
      ["trace id", j.trace_id || "-"]];
    if (j.pending_reason) rows.push(["why pending", j.pending_reason]);
    for (const [split, m] of Object.entries(j.evaluation || {})) {  // LLaMA-Factory's eval / predict metrics
      const shown = Object.entries(m).filter(([k]) => k !== "step").map(([k, v]) => `${k} ${fmt.num(v)}`);
      rows.push([split, `step ${m.step ?? "?"}: ${shown.join(", ")}`]);
    }
    facts.replaceChildren(...rows.flatMap(([k, v]) => [el("dt", { text: k }), el("dd", { "data-fact": k, text: v })]));
  };
  setFacts(job);
  const refresh = debounce(async () => setFacts(await api(`/v1/jobs/${encodeURIComponent(id)}`)), 1000);

  const loss = curveChart($("#loss-chart"), "loss", "#1d5fd1");
  const lr = curveChart($("#lr-chart"), "learning rate", "#b35900");
  const data = { step: [], loss: [], lr: [] };
  const add = (p) => {
    if (p.step == null) return;
    data.step.push(p.step); data.loss.push(p.loss ?? null); data.lr.push(p.learning_rate ?? null);
  };
  const draw = () => {
    loss.setData([data.step, data.loss]); lr.setData([data.step, data.lr]);
    $("#loss-chart").dataset.points = String(data.step.length);
  };
  (await api(`/v1/jobs/${encodeURIComponent(id)}/metrics`)).points.forEach(add);
  draw();

  const history = $("#placement-history tbody");
  const addMove = (e) => {
    if (!MOVES.has(e.kind)) return;
    const where = e.data && e.data.placement ? fmt.placement(e.data.placement) : (e.node || "");
    history.append(el("tr", { "data-kind": e.kind, "data-action": e.action || "" },
      el("td", { text: fmt.time(e.ts) }),
      el("td", { text: e.kind + (e.action ? ` ${e.action}` : "") + (e.rule ? ` (${e.rule})` : "") }),
      el("td", { class: "mono", text: where }), el("td", { text: e.reason || "" })));
  };
  const checkpoints = $("#checkpoints tbody");
  const addCheckpoint = (e) => checkpoints.append(el("tr", {}, el("td", { text: fmt.time(e.ts) }),
    el("td", { text: String(e.attempt) }), el("td", { text: e.node || "" })));
  (await api(`/v1/jobs/${encodeURIComponent(id)}/events`)).items.filter((e) => e.kind === "checkpointed")
    .forEach(addCheckpoint);

  const q = encodeURIComponent(id);
  follow(`/v1/audit/stream?job_id=${q}&backlog=1000`, { audit: (e) => { addMove(e); refresh(); } });
  follow(`/v1/jobs/stream?job_id=${q}`, {
    progress: (p) => { add(p); draw(); refresh(); },
    job: (e) => { if (e.kind === "checkpointed") addCheckpoint(e); refresh(); },
  });
}

// --- audit ----------------------------------------------------------------------------

function showAudit() {
  $("#view-audit").hidden = false;
  const body = $("#audit-table tbody");
  const open = () => {
    streams.forEach((s) => s.close()); streams = [];
    body.replaceChildren();
    const params = new URLSearchParams({ backlog: "200" });
    for (const [k, v] of new FormData($("#audit-filters"))) if (v) params.set(k, v);
    follow(`/v1/audit/stream?${params}`, {
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
}

start();
