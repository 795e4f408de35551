// The OpenRFT dashboard: the job list at /, one job at /?job=ID. Polls the server's JSON routes; charts are
// drawn with uPlot from the series the server resolves (openrft.charts: the same ones `openrft plot` draws).
"use strict";

const KEY_STORAGE = "openrft-api-key";
const ACTIVE_POLL_MS = 1000;
const IDLE_POLL_MS = 5000;
const LIST_POLL_MS = 3000;
const MAX_EVENTS = 1000;
const COLORS = ["#2563eb", "#dc2626", "#059669", "#d97706", "#7c3aed", "#0891b2", "#db2777", "#4b5563"];
const TERMINAL = ["succeeded", "failed", "cancelled"];

const $ = (id) => document.getElementById(id);
const jobId = new URLSearchParams(location.search).get("job");
const state = { timer: null, lastEvent: 0, plots: new Map(), job: null };

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
  for (const id of ["list-view", "job-view"]) $(id).hidden = true;
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

function renderCharts(charts) {
  const holder = $("charts");
  for (const chart of charts) {
    let entry = state.plots.get(chart.title);
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
      state.plots.set(chart.title, entry);
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
  return page.job.active ? ACTIVE_POLL_MS : IDLE_POLL_MS;
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

// start ------------------------------------------------------------------------------------------------

function start() {
  $("key-view").hidden = true;
  $("forget-key").hidden = !sessionStorage.getItem(KEY_STORAGE);
  if (jobId) poll(loadJob, ACTIVE_POLL_MS);
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
window.addEventListener("resize", () => {
  for (const entry of state.plots.values()) {
    if (entry.plot) entry.plot.setSize({ width: Math.max(entry.box.clientWidth - 16, 300), height: 220 });
  }
});
start();
