// The OpenRFT dashboard: the job list at /, one job at /?job=ID (curves, samples, checkpoints, events), runs
// compared at /?compare=ID,ID. Polls the server's JSON routes; charts are drawn with uPlot from the series the
// server resolves (openrft.charts: the same ones `openrft plot` draws).
"use strict";

const KEY_STORAGE = "openrft-api-key";
const ACTIVE_POLL_MS = 1000;
const IDLE_POLL_MS = 5000;
const LIST_POLL_MS = 3000;
const MAX_EVENTS = 1000;
const COLORS = ["#2563eb", "#dc2626", "#059669", "#d97706", "#7c3aed", "#0891b2", "#db2777", "#4b5563"];
const TERMINAL = ["succeeded", "failed", "cancelled"];

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
const jobId = params.get("job");
const compareIds = (params.get("compare") || "").split(",").filter(Boolean);
const view = params.get("view");
const CLUSTER_POLL_MS = 2000;
const SAMPLES_PAGE = 25;
const state = {
  timer: null, lastEvent: 0, plots: new Map(), comparePlots: new Map(), job: null, selected: new Set(),
  samples: { overview: null, order: "step", offset: 0, shown: null, latest: null },
};

class AuthNeeded extends Error {}

// the API ---------------------------------------------------------------------------------------------

async function errorText(response) {
  try {
    const body = await response.json();
    return (body.error && body.error.message) || JSON.stringify(body);
  } catch (e) {
    return `${response.status} ${response.statusText}`;
  }
}

async function api(path, options = {}) {
  const headers = { ...(options.headers || {}) };
  const key = sessionStorage.getItem(KEY_STORAGE);
  if (key) headers.Authorization = `Bearer ${key}`;
  const response = await fetch(path, { ...options, headers });
  if (response.status === 401) {
    showKeyForm(await errorText(response));
    throw new AuthNeeded();
  }
  if (!response.ok) throw new Error(await errorText(response));
  return response.json();
}

function showKeyForm(reason) {
  stopPolling();
  for (const id of ["list-view", "job-view", "compare-view", "cluster-view"]) $(id).hidden = true;
  $("key-reason").textContent = reason || "";
  $("key-view").hidden = false;
  $("key-input").focus();
}

// formatting -------------------------------------------------------------------------------------------

function fmtTime(seconds) {
  return seconds ? new Date(seconds * 1000).toLocaleString() : "—";
}

function fmtNumber(value, digits = 4) {
  return value === null || value === undefined ? "—" : Number(value).toFixed(digits);
}

function cell(row, text, className) {
  const td = document.createElement("td");
  if (text instanceof Node) td.appendChild(text);
  else td.textContent = text;
  if (className) td.className = className;
  row.appendChild(td);
  return td;
}

function statusBadge(status) {
  const span = document.createElement("span");
  span.className = `status ${status}`;
  span.textContent = status;
  return span;
}

function stamp() {
  $("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
}

// polling ----------------------------------------------------------------------------------------------

function stopPolling() {
  if (state.timer) clearTimeout(state.timer);
  state.timer = null;
}

function schedule(fn, ms) {
  stopPolling();
  state.timer = setTimeout(fn, ms);
}

async function poll(load, interval) {
  try {
    const next = await load();
    $("failure").hidden = true;
    stamp();
    schedule(() => poll(load, interval), next ?? interval);
  } catch (e) {
    if (e instanceof AuthNeeded) return;
    $("failure").textContent = `Cannot reach the server: ${e.message}`;
    $("failure").hidden = false;
    schedule(() => poll(load, interval), IDLE_POLL_MS);
  }
}

// the job list -----------------------------------------------------------------------------------------

async function loadList() {
  const page = await api("/v1/dashboard/jobs?limit=100");
  $("list-view").hidden = false;
  const body = $("jobs").querySelector("tbody");
  body.replaceChildren();
  for (const job of page.data) {
    const row = document.createElement("tr");
    row.dataset.jobId = job.id;
    const pick = document.createElement("input");
    pick.type = "checkbox";
    pick.className = "pick";
    pick.checked = state.selected.has(job.id);
    pick.setAttribute("aria-label", `compare ${job.id}`);
    pick.addEventListener("change", () => {
      if (pick.checked) state.selected.add(job.id);
      else state.selected.delete(job.id);
      $("compare-selected").disabled = state.selected.size < 2;
    });
    cell(row, pick);
    const link = document.createElement("a");
    link.href = `/?job=${encodeURIComponent(job.id)}`;
    link.textContent = job.name ? `${job.name} (${job.id})` : job.id;
    cell(row, link);
    cell(row, statusBadge(job.status));
    cell(row, job.dialect);
    cell(row, job.model);
    cell(row, `${job.step} / ${job.total_steps}`, "num");
    cell(row, fmtNumber(job.train_reward), "num");
    cell(row, fmtNumber(job.validation_reward), "num");
    cell(row, fmtTime(job.created_at));
    cell(row, fmtTime(job.finished_at));
    body.appendChild(row);
  }
  $("no-jobs").hidden = page.data.length > 0;
  return LIST_POLL_MS;
}

// one job ----------------------------------------------------------------------------------------------

function info(label, value) {
  const div = document.createElement("div");
  const dt = document.createElement("dt");
  const dd = document.createElement("dd");
  dt.textContent = label;
  dd.textContent = value;
  div.append(dt, dd);
  return div;
}

/** What a job asks for (the API's `resources`): learners, generation actors, CPUs and GPUs, and where. */
function describeResources(r) {
  if (!r) return "—";
  const count = (n, one) => `${n} ${one}${n === 1 ? "" : "s"}`;
  const amount = (v, what) => (v === null ? `${what} decided at start` : `${v} ${what}`);
  if (r.runtime === "local") {
    return `1 learner in the job's process on the worker (${r.cpu === null ? "the worker's cores" : amount(r.cpu, "CPU")})`;
  }
  const where = r.ray_address_set ? "on the server's Ray cluster" : "on a Ray instance of the worker";
  return (
    `${count(r.learners, "learner")}, ${count(r.generation_replicas, "generation actor")} ${where}: ` +
    `${amount(r.cpu, "CPU")}, ${amount(r.gpu, "GPU")}`
  );
}

function renderSummary(job) {
  document.title = `${job.name || job.id} · OpenRFT`;
  $("where").textContent = job.id;
  $("job-title").textContent = job.name || job.id;
  const badge = $("job-status");
  badge.className = `status ${job.status}`;
  badge.textContent = job.control && job.active ? `${job.status} (${job.control} requested)` : job.status;
  $("job-info").replaceChildren(
    info("Job", job.id),
    info("Dialect", job.dialect),
    info("Model", job.model),
    info("Steps", `${job.step} / ${job.total_steps}`),
    info("Resources", describeResources(job.resources)),
    ...(job.queue_reason ? [info("Waiting for", job.queue_reason)] : []),
    info("Train reward", fmtNumber(job.train_reward)),
    info("Validation reward", fmtNumber(job.validation_reward)),
    info("Created", fmtTime(job.created_at)),
    info("Finished", fmtTime(job.finished_at)),
  );
  $("job-error").hidden = !job.error;
  $("job-error").textContent = job.error || "";
  const status = job.status;
  $("pause").disabled = !(status === "running" || status === "queued") || job.control === "cancel";
  $("resume").disabled = status !== "paused";
  $("cancel").disabled = TERMINAL.includes(status) || job.control === "cancel";
}

/** The y range: the data's, padded; a flat series (all rewards 0) gets a unit-wide range around it. */
function yRange(u, min, max) {
  if (min === null || max === null) return [0, 1];
  if (min === max) return min === 0 ? [0, 1] : [min - Math.abs(min) * 0.5, max + Math.abs(max) * 0.5];
  const pad = (max - min) * 0.08;
  return [min - pad, max + pad];
}

function axisNumber(v) {
  if (v === 0) return "0";
  const abs = Math.abs(v);
  if (abs >= 10000 || abs < 0.001) return v.toExponential(1);
  return String(Number(v.toPrecision(3)));
}

/** uPlot data from a chart's lines and band: x = the union of their steps, gaps as null. */
function plotData(chart) {
  const all = [...chart.lines, ...(chart.band ? [chart.band.low, chart.band.high] : [])];
  const xs = [...new Set(all.flatMap((s) => s.steps))].sort((a, b) => a - b);
  const column = (s) => {
    const byStep = new Map(s.steps.map((step, i) => [step, s.values[i]]));
    return xs.map((x) => (byStep.has(x) ? byStep.get(x) : null));
  };
  return [xs, ...all.map(column)];
}

function plotOptions(chart, width) {
  const series = [{ label: "step" }];
  chart.lines.forEach((line, i) => {
    series.push({ label: line.name, stroke: COLORS[i % COLORS.length], width: 2, spanGaps: true,
                  points: { show: true, size: 5 } });
  });
  const options = {
    width, height: 220, series, legend: { live: false },
    scales: { x: { time: false }, y: { range: yRange } },
    axes: [
      { label: "step", values: (u, splits) => splits.map((v) => (Number.isInteger(v) ? String(v) : "")) },
      { size: 60, values: (u, splits) => splits.map(axisNumber) },
    ],
  };
  if (chart.band) {
    const color = "rgba(37, 99, 235, 0.15)";
    series.push({ label: "min", stroke: color, width: 1, spanGaps: true, points: { show: false } });
    series.push({ label: "max", stroke: color, width: 1, spanGaps: true, points: { show: false } });
    const low = series.length - 2;
    options.bands = [{ series: [low + 1, low], fill: color }];
  }
  return options;
}

function renderCharts(charts, holder = $("charts"), plots = state.plots) {
  for (const chart of charts) {
    let entry = plots.get(chart.title);
    const signature = JSON.stringify([chart.lines.map((l) => l.name), Boolean(chart.band)]);
    if (!entry) {
      const box = document.createElement("div");
      box.className = "chart";
      box.dataset.metric = chart.metric;
      const title = document.createElement("h3");
      title.textContent = chart.title;
      const empty = document.createElement("div");
      empty.className = "empty";
      empty.textContent = "no data yet";
      const area = document.createElement("div");
      box.append(title, area, empty);
      holder.appendChild(box);
      entry = { box, area, empty, plot: null, signature: null };
      plots.set(chart.title, entry);
    }
    entry.box.dataset.points = String(chart.points);
    entry.empty.hidden = chart.points > 0;
    const data = plotData(chart);
    if (entry.plot && entry.signature === signature) {
      entry.plot.setData(data);
    } else {
      if (entry.plot) entry.plot.destroy();
      entry.area.replaceChildren();
      entry.plot = new uPlot(plotOptions(chart, Math.max(entry.box.clientWidth - 16, 300)), data, entry.area);
      entry.signature = signature;
    }
  }
}

function renderCheckpoints(checkpoints) {
  const body = $("checkpoints").querySelector("tbody");
  body.replaceChildren();
  for (const c of checkpoints) {
    const row = document.createElement("tr");
    cell(row, String(c.step), "num");
    cell(row, fmtNumber(c.val_reward), "num");
    cell(row, fmtTime(c.created_at));
    cell(row, c.id);
    body.appendChild(row);
  }
  $("no-checkpoints").hidden = checkpoints.length > 0;
}

function appendEvents(events) {
  const list = $("events");
  const atBottom = list.scrollTop + list.clientHeight >= list.scrollHeight - 4;
  for (const e of events) {
    if (e.seq <= state.lastEvent) continue; // already shown (two polls crossed)
    const item = document.createElement("li");
    item.className = e.level;
    const time = document.createElement("span");
    time.className = "time";
    time.textContent = new Date(e.created_at * 1000).toLocaleTimeString();
    item.append(time, document.createTextNode(e.message));
    list.appendChild(item);
    state.lastEvent = Math.max(state.lastEvent, e.seq);
  }
  while (list.children.length > MAX_EVENTS) list.firstChild.remove();
  if (atBottom) list.scrollTop = list.scrollHeight;
}

async function loadJob() {
  const page = await api(`/v1/dashboard/jobs/${encodeURIComponent(jobId)}?after_event=${state.lastEvent}`);
  $("job-view").hidden = false;
  state.job = page.job;
  renderSummary(page.job);
  renderCharts(page.charts);
  renderCheckpoints(page.checkpoints);
  appendEvents(page.events);
  await refreshSamples();
  return page.job.active ? ACTIVE_POLL_MS : IDLE_POLL_MS;
}

// samples ----------------------------------------------------------------------------------------------

function samplesUrl(query) {
  const search = new URLSearchParams();
  for (const [k, v] of Object.entries(query)) if (v !== null && v !== undefined && v !== "") search.set(k, v);
  return `/v1/fine_tuning/jobs/${encodeURIComponent(jobId)}/samples?${search}`;
}

function option(value, text) {
  const o = document.createElement("option");
  o.value = value;
  o.textContent = text;
  return o;
}

/** The recorded steps of the chosen kind in the step menu ("latest" first), keeping the user's choice. */
function renderStepMenu() {
  const overview = state.samples.overview;
  const kind = $("s-kind").value;
  const steps = overview.steps.filter((s) => s.kind === kind);
  const menu = $("s-step");
  const chosen = menu.value;
  const latest = steps.length ? steps[steps.length - 1] : null;
  const signature = JSON.stringify([kind, steps]);
  if (menu.dataset.signature === signature) return latest ? latest.step : null; // unchanged: keep it open
  menu.dataset.signature = signature;
  const items = [option("", latest ? `latest (${latest.step})` : "latest"), option("all", "every step")];
  for (const s of steps.slice().reverse()) {
    const mean = s.mean_reward === null ? "—" : Number(s.mean_reward).toFixed(3);
    const errors = s.errors ? `, ${s.errors} errors` : "";
    items.push(option(String(s.step), `${s.step}: ${s.samples} samples, mean ${mean}${errors}`));
  }
  menu.replaceChildren(...items);
  menu.value = [...menu.options].some((o) => o.value === chosen) ? chosen : "";
  return latest ? latest.step : null;
}

function renderGraderMenus() {
  const overview = state.samples.overview;
  const graders = $("s-grader");
  const chosen = graders.value;
  if (graders.dataset.signature === JSON.stringify(overview.graders)) return;
  graders.dataset.signature = JSON.stringify(overview.graders);
  graders.replaceChildren(option("", "every grader"), ...overview.graders.map((g) => option(g, g)));
  graders.value = overview.graders.includes(chosen) ? chosen : "";
  const errors = $("s-error");
  if (errors.options.length === 2) errors.append(...overview.error_kinds.map((k) => option(k, k)));
}

/** The query of the samples table: the controls' filters, the sort order and the page. */
function sampleQuery(latest) {
  const step = $("s-step").value;
  return {
    kind: $("s-kind").value,
    step: step === "all" ? null : step === "" ? latest : step,
    grader: $("s-grader").value,
    error_kind: $("s-error").value,
    min_reward: $("s-min").value,
    max_reward: $("s-max").value,
    order: state.samples.order,
    offset: state.samples.offset,
    limit: SAMPLES_PAGE,
  };
}

/** Poll: the recorded steps; the table again only when what it shows changed (a new latest step). */
async function refreshSamples(force = false) {
  state.samples.overview = await api(`/v1/dashboard/jobs/${encodeURIComponent(jobId)}/samples`);
  renderGraderMenus();
  const latest = renderStepMenu();
  if (latest === null && $("s-kind").value === "eval" && state.samples.overview.steps.length) {
    $("s-kind").value = "train"; // nothing evaluated yet: show training samples
    return refreshSamples(true);
  }
  const query = JSON.stringify(sampleQuery(latest));
  if (!force && query === state.samples.shown) return;
  state.samples.shown = query;
  await loadSamples(sampleQuery(latest));
}

function graderSummary(graders) {
  return Object.entries(graders || {})
    .map(([name, g]) => `${name} ${g.score === null ? "—" : Number(g.score).toFixed(3)}`)
    .join(", ");
}

function shorten(text, width = 160) {
  const flat = String(text ?? "").replace(/\s+/g, " ").trim();
  return flat.length > width ? `${flat.slice(0, width - 1)}…` : flat;
}

async function loadSamples(query) {
  const page = await api(samplesUrl(query));
  const body = $("samples").querySelector("tbody");
  body.replaceChildren();
  for (const s of page.data) {
    const row = document.createElement("tr");
    row.dataset.sampleId = s.id;
    row.className = s.error_kind ? "failed" : "";
    cell(row, String(s.step), "num");
    cell(row, s.example_id);
    cell(row, String(s.sample_index), "num");
    cell(row, fmtNumber(s.reward, 3), "num reward");
    cell(row, fmtNumber(s.advantage, 3), "num");
    cell(row, String(s.policy_age), "num");
    cell(row, s.error_kind || "");
    cell(row, graderSummary(s.graders));
    cell(row, shorten(s.response), "response");
    row.addEventListener("click", () => showSample(s));
    body.appendChild(row);
  }
  $("no-samples").hidden = page.data.length > 0 || query.offset > 0;
  $("s-prev").disabled = query.offset === 0;
  $("s-next").disabled = !page.has_more;
  const first = page.data.length ? query.offset + 1 : 0;
  $("s-page").textContent = page.data.length ? `samples ${first}–${query.offset + page.data.length}` : "";
  for (const th of $("samples").querySelectorAll("th.sortable")) {
    const order = state.samples.order;
    th.classList.toggle("sorted", order.replace("-", "") === th.dataset.order);
    th.dataset.direction = order.startsWith("-") ? "descending" : "ascending";
  }
}

function block(title, text, className = "") {
  const box = document.createElement("div");
  box.className = `message ${className}`;
  const head = document.createElement("div");
  head.className = "role";
  head.textContent = title;
  const pre = document.createElement("pre");
  pre.textContent = text;
  box.append(head, pre);
  return box;
}

function messageText(message) {
  const content = typeof message.content === "string" ? message.content : JSON.stringify(message.content);
  const calls = (message.tool_calls || []).map((c) => {
    const fn = c.function || c;
    return `→ ${fn.name}(${typeof fn.arguments === "string" ? fn.arguments : JSON.stringify(fn.arguments)})`;
  });
  return [content || "", ...calls].filter(Boolean).join("\n");
}

/** A sample's whole trajectory: prompt, each turn (tool calls and results), the answer, what graded it. */
async function showSample(s) {
  const detail = $("sample-detail");
  $("detail-title").textContent =
    `${s.kind === "eval" ? "Validation" : "Training"} sample ${s.sample_index} of example ${s.example_id}, step ${s.step}`;
  const body = $("detail-body");
  body.replaceChildren();
  for (const m of s.prompt) body.appendChild(block(m.role, messageText(m), m.role));
  if (s.turns) {
    for (const m of s.turns) body.appendChild(block(m.role === "tool" ? `tool ${m.name || ""}` : m.role, messageText(m), m.role));
  } else {
    body.appendChild(block("assistant (response)", s.response, "assistant"));
  }
  const facts = document.createElement("dl");
  facts.className = "info";
  facts.append(
    info("Reward", fmtNumber(s.reward)),
    info("Advantage", fmtNumber(s.advantage)),
    info("Policy version / age", `${s.policy_version} / ${s.policy_age}`),
    info("Finish", `${s.finish_reason}, ${s.response_tokens} tokens`),
  );
  if (s.error_kind) facts.append(info("Error", `${s.error_kind}: ${s.error_message || ""}`));
  body.appendChild(facts);
  const graders = document.createElement("table");
  graders.className = "grid graders";
  graders.innerHTML = "<thead><tr><th>Grader</th><th class='num'>Score</th><th>Explanation</th></tr></thead>";
  const tbody = document.createElement("tbody");
  for (const [name, g] of Object.entries(s.graders || {})) {
    const row = document.createElement("tr");
    cell(row, name);
    cell(row, fmtNumber(g.score), "num");
    const why = document.createElement("pre");
    why.textContent = g.explanation || "";
    cell(row, why);
    tbody.appendChild(row);
  }
  for (const [name, value] of Object.entries(s.metrics || {})) {
    const row = document.createElement("tr");
    cell(row, `metric ${name}`);
    cell(row, fmtNumber(value), "num");
    cell(row, "");
    tbody.appendChild(row);
  }
  graders.appendChild(tbody);
  body.appendChild(graders);
  detail.hidden = false;
  await showAcross(s);
  detail.scrollIntoView({ block: "start" });
}

/** How one validation prompt's answers changed: its samples at every evaluation, oldest first. */
async function showAcross(s) {
  const page = await api(samplesUrl({ kind: "eval", example_id: s.example_id, limit: 500 }));
  const body = $("across").querySelector("tbody");
  body.replaceChildren();
  for (const a of page.data) {
    const row = document.createElement("tr");
    if (a.id === s.id) row.className = "current";
    cell(row, String(a.step), "num");
    cell(row, String(a.sample_index), "num");
    cell(row, fmtNumber(a.reward, 3), "num");
    cell(row, graderSummary(a.graders));
    cell(row, shorten(a.response, 240), "response");
    body.appendChild(row);
  }
  $("across").hidden = page.data.length === 0;
  $("no-across").hidden = page.data.length > 0;
}

function resetSamples() {
  state.samples.offset = 0;
  refreshSamples(true).catch(showFailure);
}

function showFailure(e) {
  if (e instanceof AuthNeeded) return;
  $("failure").textContent = e.message;
  $("failure").hidden = false;
}

// runs compared ----------------------------------------------------------------------------------------

async function loadCompare() {
  const page = await api(`/v1/dashboard/compare?jobs=${compareIds.map(encodeURIComponent).join(",")}`);
  $("compare-view").hidden = false;
  $("where").textContent = `${page.jobs.length} runs compared`;
  const body = $("compare-jobs").querySelector("tbody");
  body.replaceChildren();
  page.jobs.forEach((job, i) => {
    const row = document.createElement("tr");
    const swatch = document.createElement("span");
    swatch.className = "swatch";
    swatch.style.background = COLORS[i % COLORS.length];
    const link = document.createElement("a");
    link.href = `/?job=${encodeURIComponent(job.id)}`;
    link.textContent = job.label;
    const name = document.createElement("span");
    name.append(swatch, link);
    cell(row, name);
    cell(row, statusBadge(job.status));
    cell(row, `${job.step} / ${job.total_steps}`, "num");
    cell(row, fmtNumber(job.train_reward), "num");
    cell(row, fmtNumber(job.validation_reward), "num");
    body.appendChild(row);
  });
  renderCharts(page.charts, $("compare-charts"), state.comparePlots);
  renderSettings(page.jobs, page.settings);
  return page.jobs.some((j) => j.active) ? ACTIVE_POLL_MS * 3 : IDLE_POLL_MS;
}

function renderSettings(jobs, settings) {
  const head = document.createElement("tr");
  for (const title of ["Setting", ...jobs.map((j) => j.label)]) {
    const th = document.createElement("th");
    th.textContent = title;
    head.appendChild(th);
  }
  $("settings").querySelector("thead").replaceChildren(head);
  const only = $("only-differences").checked;
  const body = $("settings").querySelector("tbody");
  body.replaceChildren();
  for (const s of settings) {
    if (only && !s.differs) continue;
    const row = document.createElement("tr");
    row.className = s.differs ? "differs" : "";
    row.dataset.setting = s.name;
    cell(row, s.name);
    for (const v of s.values) cell(row, v === null ? "—" : v);
    body.appendChild(row);
  }
}

async function act(action) {
  if (action === "cancel" && !confirm(`Cancel job ${jobId}? A cancelled job cannot be resumed.`)) return;
  const message = $("action-message");
  try {
    await api(`/v1/fine_tuning/jobs/${encodeURIComponent(jobId)}/${action}`, { method: "POST" });
    message.textContent = `${action} requested`;
    message.className = "muted";
  } catch (e) {
    if (e instanceof AuthNeeded) return;
    message.textContent = `${action} failed: ${e.message}`;
    message.className = "error";
  }
  message.hidden = false;
  poll(loadJob, ACTIVE_POLL_MS);
}

// the cluster ------------------------------------------------------------------------------------------

function fmtAmount(value) {
  return value === null || value === undefined ? "—" : `${Number(value.toFixed(2))}`;
}

function fmtBytes(bytes) {
  if (!bytes) return "—";
  const gib = bytes / 2 ** 30;
  return gib >= 1 ? `${gib.toFixed(1)} GiB` : `${(bytes / 2 ** 20).toFixed(0)} MiB`;
}

function jobLink(entry) {
  if (!entry.job) return document.createTextNode(entry.name || "—");
  const link = document.createElement("a");
  link.href = `/?job=${encodeURIComponent(entry.job)}`;
  link.textContent = entry.name ? `${entry.name} (${entry.job})` : entry.job;
  return link;
}

function fill(tableId, rows, render) {
  const body = $(tableId).querySelector("tbody");
  body.replaceChildren();
  for (const item of rows) {
    const row = document.createElement("tr");
    render(row, item);
    body.appendChild(row);
  }
}

function shortNode(node) {
  return node.length > 16 ? node.slice(0, 12) + "…" : node;
}

/** The Tinker API's hosts (TinkerHost actors' nodes, or this server process) and the clients each holds. */
function showTinker(tinker) {
  $("tinker-part").hidden = !tinker;
  if (!tinker) return;
  $("tinker-source").textContent =
    tinker.source === "ray" ? "Clients live in TinkerHost actors, one per node of the cluster." : "Clients live in the server process.";
  fill("tinker-hosts", tinker.hosts, (row, host) => {
    row.dataset.node = host.node;
    cell(row, shortNode(host.node)).title = host.node;
    cell(row, fmtAmount(host.cpu), "num");
    cell(row, fmtAmount(host.gpu), "num");
    cell(row, Object.entries(host.tenants).map(([who, n]) => `${who}: ${n}`).join(", ") || "none");
  });
  const clients = tinker.hosts.flatMap((host) => host.clients.map((c) => ({ ...c, node: host.node })));
  $("no-tinker").hidden = clients.length > 0;
  fill("tinker-clients", clients, (row, c) => {
    if (c.client) row.dataset.client = c.client;
    cell(row, c.client || c.name);
    cell(row, c.kind);
    cell(row, c.tenant || "—");
    cell(row, shortNode(c.node)).title = c.node;
    cell(row, c.base_model || "—");
  });
}

/** Nodes (Ray's, or this machine), who holds what, the queue with its reasons, use against quotas. */
async function loadCluster() {
  const page = await api("/v1/dashboard/cluster");
  document.title = "Cluster · OpenRFT";
  $("where").textContent = "cluster";
  $("cluster-view").hidden = false;
  $("cluster-source").textContent =
    page.source === "ray" ? "The server's Ray cluster (--ray-address), as Ray's GCS records it." : "This machine: the server has no --ray-address.";
  $("cluster-error").hidden = !page.error;
  $("cluster-error").textContent = page.error || "";
  fill("nodes", page.nodes, (row, node) => {
    row.dataset.nodeId = node.id;
    cell(row, node.id.length > 16 ? node.id.slice(0, 12) + "…" : node.id).title = node.id;
    cell(row, node.address || "—");
    cell(row, fmtAmount(node.cpu), "num");
    cell(row, fmtAmount(node.gpu), "num");
    cell(row, fmtBytes(node.memory_bytes), "num");
    cell(row, fmtAmount(node.held.cpu), "num");
    cell(row, fmtAmount(node.held.gpu), "num");
    cell(row, Object.entries(node.custom).map(([k, v]) => `${k}: ${v}`).join(", ") || "—");
  });
  $("no-held").hidden = page.held.length > 0;
  fill("held", page.held, (row, entry) => {
    if (entry.job) row.dataset.jobId = entry.job;
    cell(row, jobLink(entry));
    cell(row, entry.tenant || "—");
    cell(row, entry.node ? (entry.node.length > 16 ? entry.node.slice(0, 12) + "…" : entry.node) : "—");
    cell(row, fmtAmount(entry.cpu), "num");
    cell(row, fmtAmount(entry.gpu), "num");
    cell(row, entry.group || "—");
  });
  showTinker(page.tinker);
  fill("queue", page.queue.jobs, (row, job) => {
    row.dataset.jobId = job.job;
    cell(row, jobLink(job));
    cell(row, job.tenant);
    cell(row, String(job.priority), "num");
    cell(row, job.reason || "its turn (next when a worker is free)");
    cell(row, fmtTime(job.created_at));
  });
  const others = page.queue.others_waiting;
  $("queue-others").textContent = others ? `and ${others} job(s) of other tenants waiting` : "";
  fill("quotas", page.quotas, (row, q) => {
    row.dataset.tenant = q.tenant;
    if (q.exhausted) row.className = "exhausted";
    cell(row, q.tenant);
    cell(row, fmtAmount(q.cpu_seconds.used), "num");
    cell(row, q.cpu_seconds.limit === null ? "no limit" : fmtAmount(q.cpu_seconds.limit), "num");
    cell(row, fmtAmount(q.gpu_seconds.used), "num");
    cell(row, q.gpu_seconds.limit === null ? "no limit" : fmtAmount(q.gpu_seconds.limit), "num");
    cell(row, q.set_for ? `${q.set_for}${q.exhausted ? " — used up: jobs wait" : ""}` : "none");
  });
  return CLUSTER_POLL_MS;
}

// start ------------------------------------------------------------------------------------------------

function start() {
  $("key-view").hidden = true;
  $("forget-key").hidden = !sessionStorage.getItem(KEY_STORAGE);
  if (view === "cluster") poll(loadCluster, CLUSTER_POLL_MS);
  else if (compareIds.length) poll(loadCompare, IDLE_POLL_MS);
  else if (jobId) poll(loadJob, ACTIVE_POLL_MS);
  else poll(loadList, LIST_POLL_MS);
}

$("key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const key = $("key-input").value.trim();
  if (!key) return;
  sessionStorage.setItem(KEY_STORAGE, key);
  $("key-input").value = "";
  start();
});
$("forget-key").addEventListener("click", () => {
  sessionStorage.removeItem(KEY_STORAGE);
  location.reload();
});
for (const action of ["pause", "resume", "cancel"]) $(action).addEventListener("click", () => act(action));
for (const id of ["s-kind", "s-step", "s-grader", "s-error", "s-min", "s-max"]) {
  $(id).addEventListener("change", resetSamples);
}
$("sample-controls").addEventListener("submit", (event) => {
  event.preventDefault();
  resetSamples();
});
for (const th of $("samples").querySelectorAll("th.sortable")) {
  th.addEventListener("click", () => {
    const key = th.dataset.order;
    const order = state.samples.order;
    state.samples.order = order === `-${key}` ? key : `-${key}`; // descending first, then ascending
    resetSamples();
  });
}
$("s-prev").addEventListener("click", () => {
  state.samples.offset = Math.max(0, state.samples.offset - SAMPLES_PAGE);
  refreshSamples(true).catch(showFailure);
});
$("s-next").addEventListener("click", () => {
  state.samples.offset += SAMPLES_PAGE;
  refreshSamples(true).catch(showFailure);
});
$("detail-close").addEventListener("click", () => {
  $("sample-detail").hidden = true;
});
$("compare-selected").addEventListener("click", () => {
  location.href = `/?compare=${[...state.selected].map(encodeURIComponent).join(",")}`;
});
$("only-differences").addEventListener("change", () => poll(loadCompare, IDLE_POLL_MS));
window.addEventListener("resize", () => {
  for (const entry of [...state.plots.values(), ...state.comparePlots.values()]) {
    if (entry.plot) entry.plot.setSize({ width: Math.max(entry.box.clientWidth - 16, 300), height: 220 });
  }
});
start();
