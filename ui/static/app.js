// muster dashboard: plain JavaScript, no build step, no library.
// Each page fetches /api/PAGE?at=POINT and draws it; /api/events (server-sent events) says when the
// log grew, and in live mode the page is fetched again. The time slider picks a sequence of the log.
"use strict";

const PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7",
  "#9c755f", "#bab0ac", "#1f77b4", "#2ca02c"];
const ui = { at: null, lastSeq: 0, header: null, busy: false, again: false, page: "cluster", arg: "" };
const $ = (id) => document.getElementById(id);

function esc(v) {
  return String(v ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}
function num(v, digits = 0) {
  return Number(v || 0).toLocaleString(undefined, { maximumFractionDigits: digits, minimumFractionDigits: digits });
}
function colour(queue) {
  const names = (ui.header && ui.header.queues) || [];
  const i = names.indexOf(queue);
  return PALETTE[(i < 0 ? names.length : i) % PALETTE.length];
}
function when(t) {
  if (t === null || t === undefined) return "-";
  if (ui.header && ui.header.epoch) return new Date(t * 1000).toLocaleString();
  return "t=" + t;
}
function span(seconds) {
  const s = Math.round(seconds || 0);
  if (s < 60) return s + "s";
  const m = Math.floor(s / 60);
  if (m < 60) return m + "m " + String(s % 60).padStart(2, "0") + "s";
  const h = Math.floor(m / 60);
  if (h < 48) return h + "h " + String(m % 60).padStart(2, "0") + "m";
  return Math.floor(h / 24) + "d " + (h % 24) + "h";
}

// ---------------------------------------------------------------- fetching

async function api(path, params = {}) {
  const q = new URLSearchParams(params);
  if (ui.at !== null) q.set("at", ui.at);
  const r = await fetch(path + (q.toString() ? "?" + q : ""), { headers: { Accept: "application/json" } });
  const body = await r.text();
  if (r.status === 503) return { catchingUp: JSON.parse(body).header };
  if (!r.ok) throw new Error(body || r.statusText);
  return JSON.parse(body);
}

async function render() {
  if (ui.busy) { ui.again = true; return; }
  ui.busy = true;
  try {
    do {
      ui.again = false;
      await draw();
    } while (ui.again);
  } finally {
    ui.busy = false;
  }
}

async function draw() {
  const hash = location.hash.replace(/^#\/?/, "") || "cluster";
  const [page, ...rest] = hash.split("/");
  ui.page = page;
  ui.arg = decodeURIComponent(rest.join("/"));
  document.querySelectorAll("nav a").forEach((a) => a.classList.toggle("on", a.dataset.page === page));
  const main = $("main");
  let doc;
  try {
    if (page === "queues") doc = await api("/api/queues");
    else if (page === "jobs" && ui.arg) doc = await api("/api/jobs/" + encodeURIComponent(ui.arg));
    else if (page === "jobs") doc = await api("/api/jobs", jobQuery());
    else if (page === "chargeback") doc = await api("/api/chargeback");
    else doc = await api("/api/cluster");
  } catch (err) {
    main.innerHTML = `<p class="error" data-testid="error">${esc(err.message)}</p>`;
    return;
  }
  if (doc.catchingUp) {
    const c = doc.catchingUp;
    const what = c.what === "books" ? "reading the log for billing and stories" : "folding the log";
    main.innerHTML = `<p class="muted" data-testid="catching-up">${what}: ${num(c.folded)} of ${num(c.target)} events…</p>`;
    ui.header = null;  // the next message of /api/events draws the page again
    return;
  }
  showHeader(doc.header);
  main.onmouseover = main.onclick = null;  // the cluster map's, on another page
  const painter = { queues: drawQueues, chargeback: drawChargeback, jobs: ui.arg ? drawJob : drawJobs }[page] || drawCluster;
  painter(main, doc.page);
  main.dataset.page = page;
  main.dataset.seq = doc.header.seq;
}

function showHeader(h) {
  ui.header = h;
  ui.lastSeq = h.last_seq;
  const slider = $("slider");
  slider.max = Math.max(1, h.last_seq);
  if (document.activeElement !== slider) slider.value = h.seq;
  $("live").classList.toggle("on", ui.at === null);
  $("asof").textContent = `${h.live ? "live" : "as of"} seq ${num(h.seq)} of ${num(h.last_seq)} · ${when(h.at)}`;
}

// ---------------------------------------------------------------- cluster

function drawCluster(main, p) {
  const gangs = p.gangs;
  const blocks = new Map();
  for (const d of p.domains) {
    const path = p.levels.map((lv) => d.labels[lv]);
    const block = path.length > 1 ? path.slice(0, -1).join("/") : "cluster";
    if (!blocks.has(block)) blocks.set(block, []);
    blocks.get(block).push(d);
  }
  let total = 0, used = 0, free = 0;
  p.domains.forEach((d) => { total += d.gpus; used += d.used; free += d.free; });
  const legend = (ui.header.queues || []).map((q) => `<span><i class="sw" style="background:${colour(q)}"></i>${esc(q)}</span>`).join("")
    + `<span><i class="sw gpu free"></i>free</span><span><i class="sw gpu reserved"></i>reserved</span>`
    + `<span><i class="sw gpu idle" style="background:#888"></i>idle gang</span>`;
  let html = `<h2>Cluster</h2><p class="muted" data-testid="cluster-summary">${num(total)} GPUs · ${num(used)} in use · ${num(free)} free · ${Object.keys(gangs).length} gangs placed</p>`;
  html += `<div class="legend">${legend}</div><div class="blocks">`;
  for (const [block, racks] of blocks) {
    html += `<div class="block"><div class="title">${esc(block)}</div>`;
    for (const d of racks) {
      const rack = d.domain.split("/").pop() || d.domain;
      html += `<div class="rack" data-domain="${esc(d.domain)}"><div class="title">${esc(rack)} <small>${d.free}/${d.gpus} free, ${d.largest_free} on one node</small></div>`;
      for (const n of d.nodes_list) html += drawNode(n, gangs);
      html += `</div>`;
    }
    html += `</div>`;
  }
  html += `</div>`;
  main.innerHTML = html;
  // one handler for the whole map (thousands of cells), not three per gang
  let lit = null;
  main.onmouseover = (e) => {
    const el = e.target.closest(".gang");
    const job = el ? el.dataset.job : null;
    if (job === lit) return;
    main.querySelectorAll(".gang.hl").forEach((g) => g.classList.remove("hl"));
    if (job !== null) main.querySelectorAll(`.gang[data-job="${CSS.escape(job)}"]`).forEach((g) => g.classList.add("hl"));
    lit = job;
  };
  main.onclick = (e) => {
    const el = e.target.closest(".gang");
    if (el) location.hash = "#/jobs/" + encodeURIComponent(el.dataset.job);
  };
}

function drawNode(n, gangs) {
  const cls = n.status.startsWith("down") ? "down" : n.status.includes("cordoned") ? "cordoned" : "";
  let cells = "";
  let held = 0;
  for (const c of n.cells) {
    const g = gangs[c.job] || {};
    const util = g.utilization === null || g.utilization === undefined ? "" : `, GPU utilization ${Math.round(g.utilization * 100)}%`;
    const title = `${c.job} (${g.queue}, ${g.gpus} GPUs ${g.shape} on ${g.nodes} nodes${util})`;
    const opacity = g.utilization === null || g.utilization === undefined ? 1 : 0.45 + 0.55 * g.utilization;
    let boxes = "";
    for (let i = 0; i < c.gpus; i++) boxes += `<i class="gpu${g.idle ? " idle" : ""}" style="background-color:${colour(g.queue)};opacity:${opacity.toFixed(2)}"></i>`;
    cells += `<span class="gang" data-job="${esc(c.job)}" data-queue="${esc(g.queue)}" title="${esc(title)}">${boxes}</span>`;
    held += c.gpus;
  }
  // pods muster does not schedule (or its own, still leaving) may hold more than the gangs left over
  const reserved = Math.min(n.reserved, Math.max(0, n.gpus - held));
  for (let i = 0; i < reserved; i++) cells += `<i class="gpu reserved" title="reserved"></i>`;
  for (let i = held + reserved; i < n.gpus; i++) cells += `<i class="gpu free" title="free"></i>`;
  const title = `${n.node}: ${n.status}, ${n.used} of ${n.gpus} GPUs used by gangs, ${n.reserved} held by other pods, ${n.free} free`;
  return `<div class="node ${cls}" data-node="${esc(n.node)}" title="${esc(title)}"><span class="name">${esc(n.node)}</span><span class="gpus">${cells}</span></div>`;
}

// ---------------------------------------------------------------- queues

function sparkline(points, queue, nominal) {
  const w = 160, hgt = 28;
  if (points.length < 2) return "";
  const values = points.map((p) => p.used[queue] || 0);
  const top = Math.max(1, nominal, ...values);
  const x0 = points[0].seq, x1 = points[points.length - 1].seq;
  const x = (s) => (x1 === x0 ? w : ((s - x0) / (x1 - x0)) * w).toFixed(1);
  const y = (v) => (hgt - 2 - (v / top) * (hgt - 4)).toFixed(1);
  const line = points.map((p, i) => `${x(p.seq)},${y(values[i])}`).join(" ");
  return `<svg width="${w}" height="${hgt}" data-testid="spark"><line x1="0" x2="${w}" y1="${y(nominal)}" y2="${y(nominal)}" stroke="#999" stroke-dasharray="3 3"/>`
    + `<polyline fill="none" stroke="${colour(queue)}" stroke-width="1.5" points="${line}"/></svg>`;
}

function quotaBar(r) {
  const { nominal, used, lent } = r.gpus;  // summed over flavors by the server
  const top = Math.max(1, nominal, used + lent);
  const pct = (v) => ((100 * v) / top).toFixed(1) + "%";
  const own = Math.min(used, nominal);
  return `<div class="bar" title="used ${used}, nominal ${nominal}, lent ${lent}">`
    + `<i style="left:0;width:${pct(own)};background:${colour(r.queue)}"></i>`
    + (used > nominal ? `<i style="left:${pct(nominal)};width:${pct(used - nominal)};background:${colour(r.queue)};opacity:.55"></i>` : "")
    + (lent ? `<i style="left:${pct(own)};width:${pct(lent)};background:#bbb"></i>` : "")
    + `<b style="left:${pct(nominal)}"></b></div>`;
}

function drawQueues(main, p) {
  const byCohort = new Map();
  for (const r of p.rows) {
    const c = r.cohort || "(no cohort)";
    if (!byCohort.has(c)) byCohort.set(c, []);
    byCohort.get(c).push(r);
  }
  let html = `<h2>Queues</h2><p class="muted">GPUs. Bar: used within nominal (solid), borrowed beyond it (light), lent to the cohort (grey); the mark is the nominal quota. Line: GPUs in use over the log, dashed at nominal.</p>`;
  for (const [cohort, rows] of byCohort) {
    const parent = p.cohorts[cohort];
    html += `<div class="card"><h3>cohort ${esc(cohort)}${parent ? ` <span class="muted">in ${esc(parent)}</span>` : ""}</h3><table data-testid="queues"><tr>`
      + `<th>queue</th><th class="n">nominal</th><th class="n">used</th><th class="n">borrowed</th><th class="n">lent</th><th>quota</th>`
      + `<th class="n">running</th><th class="n">pending gangs</th><th class="n">pending GPUs</th><th class="n">weight</th><th class="n">fair share</th><th>history</th></tr>`;
    for (const r of rows) {
      html += `<tr data-queue="${esc(r.queue)}"><td><i class="sw" style="background:${colour(r.queue)}"></i> ${esc(r.queue)}</td>`
        + `<td class="n">${num(r.gpus.nominal)}</td><td class="n">${num(r.gpus.used)}</td><td class="n">${num(r.gpus.borrowed)}</td><td class="n">${num(r.gpus.lent)}</td>`
        + `<td>${quotaBar(r)}</td><td class="n">${r.running}</td><td class="n">${r.pending}</td><td class="n">${num(r.pending_gpus)}</td>`
        + `<td class="n">${num(r.weight, 1)}</td><td class="n" title="weighted dominant resource share (Kueue's DRS), per mille">${r.share_permille}‰</td>`
        + `<td>${sparkline(p.history, r.queue, r.gpus.nominal)}</td></tr>`;
    }
    html += `</table></div>`;
  }
  main.innerHTML = html;
}

// ---------------------------------------------------------------- jobs

function jobQuery() {
  const q = {};
  const text = $("q"), status = $("status"), queue = $("queue");
  if (text && text.value) q.q = text.value;
  if (status && status.value) q.status = status.value;
  if (queue && queue.value) q.queue = queue.value;
  return q;
}

function drawJobs(main, p) {
  let form = $("jobsearch");
  if (!form || !main.contains(form)) {
    const statuses = ["", "pending", "admitted", "finished", "failed", "cancelled", "rejected"];
    const queues = [""].concat(ui.header.queues || []);
    main.innerHTML = `<h2>Jobs</h2><form class="search" id="jobsearch"><input id="q" data-testid="search" placeholder="search job or queue" size="30">`
      + `<select id="status">${statuses.map((s) => `<option value="${s}">${s || "any state"}</option>`).join("")}</select>`
      + `<select id="queue">${queues.map((s) => `<option value="${esc(s)}">${esc(s) || "any queue"}</option>`).join("")}</select></form><div id="jobrows"></div>`;
    form = $("jobsearch");
    let timer = null;
    const again = () => { clearTimeout(timer); timer = setTimeout(render, 150); };
    form.addEventListener("input", again);
    form.addEventListener("submit", (e) => { e.preventDefault(); render(); });
  }
  const counts = Object.entries(ui.header.jobs).map(([k, v]) => `${num(v)} ${k}`).join(", ");
  let html = `<p class="muted">${num(p.matched)} matched${p.matched > p.rows.length ? `, newest ${p.rows.length} shown` : ""} · all jobs: ${esc(counts)}</p>`;
  html += `<table data-testid="jobs"><tr><th>job</th><th>queue</th><th>state</th><th class="n">GPUs</th><th>shape</th><th>priority</th><th class="n">age</th><th class="n">preempted</th><th>why it waits</th></tr>`;
  for (const r of p.rows) {
    html += `<tr class="click" data-job="${esc(r.job)}"><td>${esc(r.job)}</td><td><i class="sw" style="background:${colour(r.queue)}"></i> ${esc(r.queue)}</td>`
      + `<td><span class="pill ${esc(r.status)}">${esc(r.status)}</span></td><td class="n">${r.gpus}</td><td>${esc(r.shape)}</td><td>${esc(r.priority_class || "-")}</td>`
      + `<td class="n">${span(r.age)}</td><td class="n">${r.preemptions || ""}</td><td>${esc(r.why)}</td></tr>`;
  }
  $("jobrows").innerHTML = html + `</table>`;
  $("jobrows").querySelectorAll("tr.click").forEach((tr) => tr.addEventListener("click", () => { location.hash = "#/jobs/" + encodeURIComponent(tr.dataset.job); }));
}

function drawJob(main, d) {
  const s = d.summary || {};
  const start = s.submitted_at;
  let html = `<h2><a href="#/jobs">Jobs</a> / ${esc(d.job)}</h2><div class="card" data-testid="job-summary">`
    + `<span class="pill ${esc(d.status)}">${esc(d.status)}</span> queue <b>${esc(d.queue)}</b> · ${s.gpus} GPUs (${esc(s.shape)}) · priority ${esc(s.priority_class || "lowest")} (${s.priority})`
    + ` · preempted ${s.preemptions || 0}× · ${num((s.lost_gpu_seconds || 0) / 3600, 2)} GPU-hours lost</div>`;
  if (d.pending) {
    const p = d.pending;
    html += `<div class="card" data-testid="job-pending"><h3>Waiting: position ${p.position} of ${p.queue_length} in ${esc(d.queue)}</h3>`
      + `<p>What would have to change for it to run:</p><ul class="changes">${p.what_would_have_to_change.map((c) => `<li>${esc(c)}</li>`).join("")}</ul></div>`;
  }
  const placement = Object.entries(d.placement || {});
  if (placement.length) {
    html += `<div class="card"><h3>Placement</h3>${placement.map(([n, g]) => `<span class="pill">${esc(n)}: ${g} GPUs</span>`).join(" ")}</div>`;
  }
  const preemptions = d.story.filter((l) => l.kind === "preempted");
  if (preemptions.length) {
    html += `<div class="card"><h3>Preemptions</h3><table><tr><th>time</th><th>by</th><th>reason</th><th class="n">work lost (GPU-h)</th></tr>`
      + preemptions.map((l) => `<tr><td>${when(l.at)}</td><td>${esc(l.preemptor || "-")}</td><td>${esc(l.reason)}</td><td class="n">${num(l.lost_gpu_seconds / 3600, 2)}</td></tr>`).join("")
      + `</table></div>`;
  }
  html += `<div class="card"><h3>Story</h3><table data-testid="story"><tr><th class="n">seq</th><th>time</th><th class="n">since submit</th><th>what</th><th>what happened</th></tr>`;
  for (const l of d.story) {
    html += `<tr><td class="n">${l.seq}</td><td>${when(l.at)}</td><td class="n">${start !== undefined ? "+" + span(l.at - start) : ""}</td>`
      + `<td><span class="pill ${esc(l.kind)}">${esc(l.kind)}</span></td><td>${esc(l.text)}</td></tr>`;
  }
  main.innerHTML = html + `</table></div>`;
}

// ---------------------------------------------------------------- chargeback

function hbars(rows, fields, title) {
  const w = 640, rowH = 22, left = 110;
  const top = Math.max(1e-9, ...rows.flatMap((r) => fields.map((f) => Number(r[f.key]) || 0)));
  const band = rowH * fields.length + 8;
  let svg = `<svg width="${w + 80}" height="${rows.length * band + 24}" data-testid="chart">`;
  fields.forEach((f, i) => { svg += `<rect x="${left + i * 130}" y="2" width="10" height="10" fill="${f.fill === "queue" ? "#8a94ad" : f.fill}"/><text x="${left + 14 + i * 130}" y="11">${esc(f.label)}</text>`; });
  rows.forEach((r, j) => {
    const y0 = 20 + j * band;
    svg += `<text x="0" y="${y0 + band / 2}">${esc(r.key)}</text>`;
    fields.forEach((f, i) => {
      const v = Number(r[f.key]) || 0;
      const bw = (v / top) * w * 0.8;
      svg += `<rect x="${left}" y="${y0 + i * rowH}" width="${bw.toFixed(1)}" height="${rowH - 6}" fill="${f.fill === "queue" ? colour(r.key) : f.fill}"/>`
        + `<text x="${left + bw + 4}" y="${y0 + i * rowH + 12}">${num(v, 2)}</text>`;
    });
  });
  return `<h3>${esc(title)}</h3>` + svg + `</svg>`;
}

function hourly(hours, queues, span) {
  if (!hours.length) return "";
  const w = 700, hgt = 160, bw = Math.max(2, Math.min(28, w / hours.length - 2));
  const totals = hours.map((h) => Math.max(h.capacity_gpu_s, Object.values(h.allocated_by_queue).reduce((a, b) => a + b, 0)));
  const top = Math.max(1, ...totals);
  let svg = `<svg width="${w + 40}" height="${hgt + 30}" data-testid="hourly">`;
  hours.forEach((h, i) => {
    let y = hgt;
    const x = 30 + i * (bw + 2);
    for (const q of queues) {
      const v = h.allocated_by_queue[q] || 0;
      const bh = (v / top) * hgt;
      y -= bh;
      svg += `<rect x="${x}" y="${y.toFixed(1)}" width="${bw}" height="${bh.toFixed(1)}" fill="${colour(q)}"><title>${esc(q)}: ${num(v / 3600, 2)} GPU-h</title></rect>`;
    }
    const cy = hgt - (h.capacity_gpu_s / top) * hgt;
    svg += `<line x1="${x}" x2="${x + bw}" y1="${cy.toFixed(1)}" y2="${cy.toFixed(1)}" stroke="#1d2433" stroke-width="2"><title>capacity ${num(h.capacity_gpu_s / 3600, 2)} GPU-h</title></line>`;
  });
  svg += `<text x="30" y="${hgt + 16}">${esc(when(hours[0].hour))}</text><text x="${w - 120}" y="${hgt + 16}">${esc(when(hours[hours.length - 1].hour))}</text>`;
  const per = span > 1 ? `${span} hours` : "hour";
  return `<h3>Allocated GPU-hours per ${per}, by queue (line: capacity)</h3>` + svg + `</svg>`;
}

function drawChargeback(main, p) {
  const r = p.report;
  const cur = r.currency || "";
  let html = `<h2>Chargeback</h2><p class="muted">${esc(when(r.start))} to ${esc(when(r.end))}, as the billing ledger holds it at this point of the log`
    + (p.priced ? `; rate card ${esc(r.rate_versions.join(", "))}` : "; no rate card (muster ui --rates FILE prices it)") + `.</p>`;
  html += `<div class="card">` + hbars(r.rows, [
    // one colour per quantity, none a queue's: a queue coloured like "used" or "lost" read as that quantity
    { key: "allocated_gpu_hours", label: "allocated GPU-h", fill: "#8a94ad" },
    { key: "used_gpu_hours", label: "used GPU-h", fill: "#59a14f" },
    { key: "borrowed_gpu_hours", label: "borrowed GPU-h", fill: "#b07aa1" },
    { key: "lost_gpu_hours", label: "lost GPU-h", fill: "#e15759" },
  ], "GPU-hours by queue") + `</div>`;
  if (p.priced) html += `<div class="card">` + hbars(r.rows, [{ key: "total_cost", label: `cost ${cur}`, fill: "queue" }], `Cost by queue (${cur})`) + `</div>`;
  html += `<div class="card">` + hourly(p.hours, ui.header.queues || [], p.bar_hours || 1) + `</div>`;
  const cols = ["allocated_gpu_hours", "used_gpu_hours", "idle_gpu_hours", "borrowed_gpu_hours", "lost_gpu_hours", "total_cost"];
  const head = ["GPU-h alloc", "used", "idle", "borrowed", "lost", `total ${cur}`];
  const line = (key, row) => `<tr><td>${esc(key)}</td>${cols.map((c) => `<td class="n">${num(row[c], 2)}</td>`).join("")}<td class="n">${row.efficiency === null ? "-" : Math.round(row.efficiency * 100) + "%"}</td></tr>`;
  html += `<div class="card"><h3>By queue</h3><table data-testid="billing"><tr><th>queue</th>${head.map((h) => `<th class="n">${esc(h)}</th>`).join("")}<th class="n">eff.</th></tr>`
    + r.rows.map((row) => line(row.key, row)).join("") + line("total", r.totals) + `</table>`;
  html += `<h3>By GPU model</h3><table><tr><th>model</th>${head.map((h) => `<th class="n">${esc(h)}</th>`).join("")}<th class="n">eff.</th></tr>`
    + Object.entries(p.by_model).map(([m, row]) => line(m || "(unlabelled)", row)).join("") + `</table></div>`;
  main.innerHTML = html;
}

// ---------------------------------------------------------------- time travel and live updates

function travel(at) {
  ui.at = at;
  render();
}

function start() {
  $("live").addEventListener("click", () => travel(null));
  const slider = $("slider");
  let scrub = null;
  const moved = () => { clearTimeout(scrub); scrub = setTimeout(() => travel(String(slider.value)), 120); };
  slider.addEventListener("input", moved);  // while dragging: forward moves fold on from the last point
  slider.addEventListener("change", moved);
  $("atform").addEventListener("submit", (e) => {
    e.preventDefault();
    const v = $("at").value.trim();
    travel(v === "" || v === "end" ? null : v);
  });
  window.addEventListener("hashchange", render);
  const events = new EventSource("/api/events");
  events.onmessage = (m) => {
    const e = JSON.parse(m.data);
    if (e.seq > ui.lastSeq || !ui.header) {
      ui.lastSeq = e.seq;
      slider.max = Math.max(1, e.seq);
      if (ui.at === null) render();
    }
  };
  render();
}

document.addEventListener("DOMContentLoaded", start);
