"use strict";
// zerobubble view: plain DOM and inline SVG, no library and nothing from the internet.

const SVG = "http://www.w3.org/2000/svg";
const POLL_MS = 3000;
const state = { metrics: [], metricsAt: 0, evals: [], evalsAt: 0, answers: {}, route: null, skipped: 0 };

function h(tag, attrs, ...children) {
  const el = tag.startsWith("svg:") ? document.createElementNS(SVG, tag.slice(4)) : document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "style") Object.assign(el.style, value);
    else if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else el.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

async function getJSON(path, params) {
  const query = new URLSearchParams();
  for (const [key, value] of Object.entries(params || {})) {
    if (value !== "" && value !== null && value !== undefined) query.set(key, value);
  }
  const response = await fetch(path + (query.toString() ? "?" + query : ""));
  const body = await response.json();
  if (!response.ok) {
    const where = body.error && body.error.field ? body.error.field + ": " : "";
    throw new Error(where + (body.error ? body.error.message : response.statusText));
  }
  return body;
}

const fmt = (v, digits = 3) => (typeof v === "number" ? (Number.isInteger(v) ? String(v) : v.toFixed(digits)) : "–");

// ---- live data: the run's metrics and evaluations, followed by byte offset

// New rows of a followed file, asked for until the server has no more to give now.
async function followFile(path, rowsKey, atKey) {
  let answer, grew = 0;
  do {
    answer = await getJSON(path, { since: state[atKey] });
    if (answer.reset) state[rowsKey] = [];
    for (const row of answer.rows) state[rowsKey].push(row);
    state.skipped += (answer.skipped || []).length;
    state[atKey] = answer.next;
    grew += answer.rows.length;
  } while (answer.more);
  return { answer, grew };
}

async function follow() {
  const metrics = await followFile("/api/metrics", "metrics", "metricsAt");
  const evals = await followFile("/api/evals", "evals", "evalsAt");
  state.answers = evals.answer.answers;
  const last = state.metrics[state.metrics.length - 1];
  document.getElementById("live").textContent =
    (last ? `step ${last.step} · policy version ${last.policy_version} · ${state.evals.length} evaluations` : "no steps yet") +
    (state.skipped ? ` · ${state.skipped} unreadable lines skipped` : "");
  return metrics.grew + evals.grew > 0;
}

// ---- curves

const PANELS = [
  ["Learning", [
    ["reward", ["reward_mean"]], ["accuracy", ["answer_accuracy", "format_accuracy"]], ["loss", ["loss"]],
    ["KL to the reference", ["kl"]], ["entropy", ["entropy"]],
    ["response length", ["response_length_mean", "response_length_max"]], ["truncation rate", ["truncation_rate"]],
  ]],
  ["Pipeline", [
    ["staleness (policy versions)", ["staleness_mean", "staleness_max"]],
    ["trainer idle fraction", ["trainer_idle_fraction"]], ["weight sync seconds", ["weight_sync_seconds"]],
    ["pull wait seconds", ["pull_wait_seconds"]], ["step seconds", ["step_seconds"]],
    ["tokens per second", ["tokens_per_second"]],
  ]],
  // Only in runs that record them: what the behaviour log-probs say against the trainer's (the engines' gap on
  // tokens of the weights trained, staleness apart; what the corrections did) and the teacher's reverse KL.
  ["Off-policy", [
    ["rollout-trainer gap", ["rollout_gap_kl", "rollout_gap_abs"]],
    ["behaviour weight", ["behaviour_weight_mean", "behaviour_weight_max"]],
    ["corrected tokens", ["mismatch_masked_fraction", "behaviour_weight_capped_fraction"]],
    ["reverse KL to the teacher", ["teacher_reverse_kl"]],
  ]],
  // Only in runs with episodes: how many ended by their environment failing, in all and by reason.
  ["Episodes", [
    ["episodes failed in their environment", (keys) => keys.filter((k) => k.startsWith("episodes_failed"))],
  ]],
];
const OPTIONAL_SECTIONS = new Set(["Off-policy", "Episodes"]);
const COLOURS = ["#0969da", "#cf222e", "#2da44e", "#8250df", "#bf8700", "#1b7c83"];

// Axis labels in three significant digits, so they fit the margin.
const tick = (v) => (Math.abs(v) >= 1e4 || (v !== 0 && Math.abs(v) < 1e-3) ? v.toExponential(1)
  : String(Number(v.toPrecision(3))));

function chart(title, series, xLabel) {
  const W = 340, H = 200, L = 54, R = 10, T = 34, B = 30;
  const points = series.flatMap((s) => s.points);
  const svg = h("svg:svg", { class: "chart", width: W, height: H, viewBox: `0 0 ${W} ${H}`, "data-title": title });
  svg.append(h("svg:text", { x: 8, y: 14, class: "title" }, title));
  if (!points.length) return svg;
  const xs = points.map((p) => p[0]), ys = points.map((p) => p[1]);
  let [x0, x1, y0, y1] = [Math.min(...xs), Math.max(...xs), Math.min(...ys), Math.max(...ys)];
  if (x0 === x1) { x0 -= 1; x1 += 1; }
  if (y0 === y1) { y0 -= 0.5; y1 += 0.5; }
  const X = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
  const Y = (y) => H - B - ((y - y0) / (y1 - y0)) * (H - T - B);
  svg.append(h("svg:line", { x1: L, y1: H - B, x2: W - R, y2: H - B, class: "axis" }),
    h("svg:line", { x1: L, y1: T, x2: L, y2: H - B, class: "axis" }),
    h("svg:text", { x: L - 4, y: Y(y1) + 4, "text-anchor": "end" }, tick(y1)),
    h("svg:text", { x: L - 4, y: Y(y0) + 4, "text-anchor": "end" }, tick(y0)),
    h("svg:text", { x: L, y: H - 12 }, fmt(x0, 0)),
    h("svg:text", { x: W - R, y: H - 12, "text-anchor": "end" }, fmt(x1, 0)),
    h("svg:text", { x: (L + W) / 2, y: H - 2, "text-anchor": "middle" }, xLabel));
  series.forEach((s, i) => {
    const colour = COLOURS[i % COLOURS.length];
    const path = s.points.map((p) => `${X(p[0]).toFixed(1)},${Y(p[1]).toFixed(1)}`).join(" ");
    svg.append(h("svg:polyline", { points: path, fill: "none", stroke: colour, "stroke-width": 1.6, "data-key": s.key }));
    if (s.points.length < 30) {
      for (const p of s.points) svg.append(h("svg:circle", { cx: X(p[0]), cy: Y(p[1]), r: 2, fill: colour }));
    }
    if (series.length > 1) {
      svg.append(h("svg:text", { x: L + 70 * i, y: 28, fill: colour }, "— " + s.label));
    }
  });
  return svg;
}

function metricSeries(key, _, keys) {
  const points = state.metrics.filter((r) => typeof r[key] === "number" && typeof r.step === "number")
    .map((r) => [r.step, r[key]]);
  // Beside its siblings a series is named by what sets it apart: response_length_mean and _max read mean and max.
  const shared = keys.length > 1 ? keys[0].slice(0, keys[0].lastIndexOf("_") + 1) : "";
  const label = shared && keys.every((k) => k.startsWith(shared)) ? key.slice(shared.length) : key.split("_")[0];
  return { key, label, points };
}

function renderCurves(main) {
  if (!state.metrics.length) main.append(h("p", { class: "empty" }, "The run has not finished a step yet."));
  const present = [...new Set(state.metrics.flatMap((r) => Object.keys(r)))].sort();
  for (const [section, panels] of PANELS) {
    const row = h("div", { class: "charts", id: "charts-" + section.toLowerCase() });
    for (const [title, named] of panels) {
      const keys = typeof named === "function" ? named(present) : named;
      const series = keys.map(metricSeries).filter((s) => s.points.length);
      if (series.length) row.append(chart(title, series, "step"));
    }
    if (row.childElementCount || !OPTIONAL_SECTIONS.has(section)) main.append(h("h2", {}, section), row);
  }
  main.append(h("h2", {}, "Evaluations"));
  const byDataset = {};
  for (const e of state.evals) (byDataset[e.dataset] = byDataset[e.dataset] || []).push(e);
  const row = h("div", { class: "charts", id: "charts-evaluations" });
  for (const [dataset, rows] of Object.entries(byDataset)) {
    const keys = Object.keys(rows[0]).filter((k) => k.startsWith("pass@"));
    const series = keys.map((key) => ({ key, label: key, points: rows.filter((r) => typeof r[key] === "number")
      .map((r) => [r.version, r[key]]) }));
    row.append(chart(`${dataset}: pass@k`, series, "policy version"));
  }
  if (!state.evals.length) row.append(h("p", { class: "empty" }, "No evaluations yet."));
  main.append(row);
}

// ---- rollouts: a filtered list that pages through the log

const FILTERS = [["step_min", "step ≥"], ["step_max", "step ≤"], ["reward_min", "reward ≥"], ["reward_max", "reward ≤"],
  ["source", "data source"], ["finish", "finish"], ["version", "policy version"], ["length_min", "length ≥"],
  ["length_max", "length ≤"]];

function rewardColour(reward) {
  const r = Math.max(0, Math.min(1, reward));
  return `hsl(${Math.round(120 * r)}, 65%, 45%)`;
}

async function renderRollouts(main, params) {
  const form = h("form", { class: "filters", id: "filters" });
  for (const [key, label] of FILTERS) {
    const input = key === "finish"
      ? h("select", { name: key }, ["", "stop", "length", "unspecified"].map((v) => h("option", { value: v }, v || "any")))
      : h("input", { name: key, type: key === "source" ? "text" : "number", step: "any" });
    input.value = params.get(key) || "";
    form.append(h("label", {}, label, input));
  }
  form.append(h("button", { type: "submit" }, "Filter"));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const next = new URLSearchParams();
    for (const [key, value] of new FormData(form)) if (value !== "") next.set(key, value);
    location.hash = "rollouts" + (next.toString() ? "?" + next : "");
  });
  main.append(h("h2", {}, "Rollout log"), form);
  const query = Object.fromEntries(params);
  const page = await getJSON("/api/rollouts", query);
  if (!page.total) {
    main.append(h("p", { class: "empty" }, "No rollout log yet: set trainer.tracking.rollout_log to write one."));
    return;
  }
  const table = h("table", { id: "rollout-list" }, h("tr", {}, ["line", "step", "prompt", "source", "rewards",
    "advantages", "versions", "finish", "length"].map((c) => h("th", {}, c))));
  for (const g of page.groups) {
    const rs = g.responses;
    const mean = (k) => rs.length ? rs.reduce((a, r) => a + (r[k] || 0), 0) / rs.length : null;
    const versions = [...new Set(rs.map((r) => r.policy_version))].join(", ");
    const finishes = {};
    for (const r of rs) { const f = String(r.finish_reason || "").replace("FINISH_REASON_", "").toLowerCase(); finishes[f] = (finishes[f] || 0) + 1; }
    table.append(h("tr", { class: "group-row", "data-line": g.line, onclick: () => { location.hash = `group/${g.line}`; } },
      h("td", {}, g.line), h("td", {}, g.step), h("td", { class: "prompt", title: g.prompt }, g.prompt),
      h("td", {}, g.data_source || ""),
      h("td", {}, rs.map((r) => h("span", { class: "dot", title: fmt(r.reward), style: { background: rewardColour(r.reward) } })),
        " ", fmt(mean("reward"), 2)),
      h("td", {}, rs.map((r) => fmt(r.advantage, 2)).join(" ")), h("td", {}, versions),
      h("td", {}, Object.entries(finishes).map(([k, n]) => `${k} ×${n}`).join(", ")), h("td", {}, fmt(mean("length"), 1))));
  }
  const cursor = Number(params.get("cursor") || 0);
  const pager = h("div", { class: "pager" },
    `${page.groups.length} groups shown (lines scanned from ${cursor}: ${page.scanned}) of ${page.total} logged`);
  if (cursor > 0) {
    pager.append(h("a", { href: "#" + routeWith(params, { cursor: null }) }, "first page"));
  }
  if (page.next !== null) {
    pager.append(h("a", { href: "#" + routeWith(params, { cursor: page.next }), id: "next-page" }, "next page"));
  }
  if (!page.groups.length) main.append(h("p", { class: "empty" }, "No group from here matches."));
  main.append(table, pager);
  for (const note of page.skipped || []) {
    main.append(h("p", { class: "skipped" }, `line ${note.line} skipped: ${note.reason}`));
  }
}

function routeWith(params, changes) {
  const next = new URLSearchParams(params);
  for (const [key, value] of Object.entries(changes)) {
    if (value === null) next.delete(key); else next.set(key, value);
  }
  return "rollouts" + (next.toString() ? "?" + next : "");
}

// ---- a group's samples side by side, and one sample's tokens

async function renderGroup(main, line, chosen, colourBy) {
  const g = await getJSON("/api/group", { line });
  const user = (g.messages || []).filter((m) => m.role === "user").map((m) => m.content).join("\n");
  main.append(h("h2", {}, `Group at line ${line}: prompt ${g.prompt_id}, step ${g.step}`),
    h("div", { class: "facts" }, `data source ${g.data_source || "–"} · ground truth ${g.gt_answer ?? "(tests)"} · trained at policy version ${g.trained_policy_version}`),
    h("pre", { id: "prompt" }, user));
  const cards = h("div", { class: "samples", id: "group-view" });
  (g.responses || []).forEach((r, j) => {
    cards.append(h("div", {
      class: `sample-card ${r.answer_ok ? "ok" : "wrong"}${j === chosen ? " chosen" : ""}`, "data-sample": j,
      onclick: () => { location.hash = `group/${line}/${j}`; },
    }, h("div", {}, h("strong", {}, `#${j}`), ` reward ${fmt(r.reward)} · advantage ${fmt(r.advantage)}`),
    h("div", { class: "facts" }, `version ${r.policy_version} · ${String(r.finish_reason).replace("FINISH_REASON_", "").toLowerCase()} finish · ${r.length ?? "?"} tokens`),
    r.episode ? h("div", { class: "facts episode" }, `episode in ${r.episode.environment}: ${r.episode.turns} turns · ` +
      `${r.episode.tool_calls} tool calls · ended: ${r.episode.ended_reason}`) : null,
    h("pre", {}, r.text)));
  });
  main.append(cards);
  if (chosen !== null && g.responses && g.responses[chosen]) main.append(renderTokens(g.responses[chosen], chosen, colourBy));
}

function visible(text) {
  return text.replace(/[\u0000-\u0008\u000b-\u001f\u007f]/g, (c) => "\\x" + c.charCodeAt(0).toString(16).padStart(2, "0"));
}

function versionColour(version, lowest, highest) {
  const t = highest > lowest ? (version - lowest) / (highest - lowest) : 1;
  return `hsl(${Math.round(220 - 180 * t)}, 70%, 82%)`;
}

function renderTokens(r, index, colourBy) {
  const box = h("div", { id: "token-view" });
  box.append(h("h2", {}, `Sample #${index}: tokens`));
  if (!Array.isArray(r.token_ids)) {
    box.append(h("p", { class: "empty" }, "This log has no tokens (tracking.rollout_log.tokens was off)."));
    return box;
  }
  const hasVersions = Array.isArray(r.token_versions);
  const mode = h("select", { id: "colour-mode" }, h("option", { value: "logprob" }, "colour by log-prob"),
    h("option", { value: "version", disabled: !hasVersions }, "colour by policy version" + (hasVersions ? "" : " (tokens carry no versions)")));
  if (colourBy === "version" && hasVersions) mode.value = "version";
  mode.addEventListener("change", () => { location.hash = `group/${location.hash.split("/")[1]}/${index}/${mode.value}`; });
  const area = h("div", { id: "tokens" });
  const legend = h("div", { class: "legend", id: "token-legend" });
  const draw = () => {
    area.replaceChildren();
    const byVersion = mode.value === "version";
    const versions = hasVersions ? r.token_versions : [];
    const lowest = Math.min(...versions), highest = Math.max(...versions);
    let turn = 0;
    r.token_ids.forEach((id, i) => {
      const model = !Array.isArray(r.loss_mask) || r.loss_mask[i] !== 0;
      if (Array.isArray(r.loss_mask) && (i === 0 || r.loss_mask[i] !== r.loss_mask[i - 1])) {
        // Numbered as the episode counts turns: the model's; what the environment answered sits between them.
        if (model) turn += 1;
        area.append(h("span", { class: "turn-boundary", "data-turn": turn }, model ? `turn ${turn}: model` : "observation / tool"));
      }
      const text = r.tokens ? r.tokens[i] : `⟨${id}⟩`;
      const lp = r.logprobs ? r.logprobs[i] : null;
      const tip = `id ${id}` + (lp !== null && model ? ` · log-prob ${fmt(lp, 4)} · p ${fmt(Math.exp(lp), 3)}` : "") +
        (hasVersions ? ` · version ${versions[i]}` : "") + (model ? "" : " · not sampled (loss mask 0)");
      const span = h("span", { class: "tok " + (model ? "tok-model" : "tok-obs"), title: tip, "data-i": i }, visible(text));
      if (model) {
        span.style.background = byVersion ? versionColour(versions[i], lowest, highest)
          : `hsl(${Math.round(120 * Math.exp(lp ?? 0))}, 75%, 80%)`;
      }
      area.append(span);
    });
    legend.replaceChildren(...[byVersion ? `policy versions ${lowest} (blue) to ${highest} (orange)` :
      "probability of each sampled token: ", ...(byVersion ? [] : [0.01, 0.25, 0.5, 0.75, 1].map((p) =>
      h("span", { style: { background: `hsl(${Math.round(120 * p)}, 75%, 80%)` } }, p))),
    Array.isArray(r.loss_mask) ? h("span", { class: "tok-obs" }, "observation / tool tokens (not trained)") : null,
    r.tokens_cut ? ` · the first ${r.token_ids.length} of ${r.length} tokens` : null].flat().filter((x) => x !== null));
  };
  box.append(mode, legend, area);
  draw();
  return box;
}

// ---- an evaluation's answers at two policy versions

async function renderEvals(main, dataset, a, b) {
  main.append(h("h2", {}, "Held-out answers at two policy versions"));
  const names = Object.keys(state.answers);
  if (!names.length) { main.append(h("p", { class: "empty" }, "No evaluation answers in this run yet.")); return; }
  dataset = names.includes(dataset) ? dataset : names[0];
  const versions = state.answers[dataset];
  a = versions.includes(a) ? a : versions[0];
  b = versions.includes(b) ? b : versions[versions.length - 1];
  const pick = (value) => h("select", {}, versions.map((v) => h("option", { value: v, selected: v === value }, `version ${v}`)));
  const sets = h("select", {}, names.map((n) => h("option", { value: n, selected: n === dataset }, n)));
  const [pa, pb] = [pick(a), pick(b)];
  const go = () => { location.hash = `evals/${encodeURIComponent(sets.value)}/${pa.value}/${pb.value}`; };
  for (const s of [sets, pa, pb]) s.addEventListener("change", go);
  main.append(h("div", { class: "filters" }, sets, " ", pa, " vs ", pb));
  const pair = await getJSON("/api/eval-pair", { dataset, a, b });
  const list = h("div", { id: "eval-view" });
  const side = (answers, version) => h("div", {}, h("div", { class: "facts" },
    `version ${version}: ${answers.filter((x) => x.answer_ok).length}/${answers.length} correct`),
  answers.map((x) => h("div", { class: "answer" + (x.answer_ok ? " ok" : "") },
    h("span", { class: "facts" }, `sample ${x.sample} · reward ${fmt(x.reward)} · ${x.finish_reason}` + (x.episode ?
      ` · ${x.episode.turns} turns · ${x.episode.tool_calls} tool calls · ended: ${x.episode.ended}` : "")),
    // An episode's answer is its whole transcript: the model's turns and the tools' answers between them.
    h("pre", {}, x.episode ? x.episode.transcript : x.text))));
  for (const q of pair.questions) {
    list.append(h("div", { class: "eval-question", "data-prompt": q.prompt_id },
      h("strong", {}, `question ${q.prompt_id}`), q.data_source ? ` · ${q.data_source}` : "",
      q.question !== undefined ? h("pre", { class: "question" }, q.question) : "",
      q.gt_answer != null ? h("div", { class: "facts" }, `ground truth: ${q.gt_answer}`) : "",
      h("div", { class: "eval-sides" }, side(q.a, pair.a), side(q.b, pair.b))));
  }
  main.append(h("div", { class: "facts" }, `${pair.questions.length} of ${pair.total} questions`), list);
}

// ---- routes: #curves, #rollouts?filters, #group/LINE[/SAMPLE[/logprob|version]], #evals[/DATASET/A/B]

async function render() {
  const main = document.getElementById("main");
  const route = location.hash.slice(1) || "curves";
  const [path, search] = route.split("?");
  const parts = path.split("/");
  document.body.dataset.state = "loading";
  for (const link of document.querySelectorAll("header nav a")) {
    link.classList.toggle("active", link.id === "nav-" + (parts[0] === "group" ? "rollouts" : parts[0]));
  }
  const fresh = h("main", { id: "main", "data-view": parts[0] });
  try {
    if (parts[0] === "rollouts") await renderRollouts(fresh, new URLSearchParams(search || ""));
    else if (parts[0] === "group") {
      await renderGroup(fresh, Number(parts[1]), parts[2] !== undefined ? Number(parts[2]) : null, parts[3]);
    }
    else if (parts[0] === "evals") await renderEvals(fresh, decodeURIComponent(parts[1] || ""), Number(parts[2]), Number(parts[3]));
    else renderCurves(fresh);
  } catch (error) {
    fresh.append(h("p", { class: "error", id: "view-error" }, String(error.message || error)));
  }
  main.replaceWith(fresh);
  state.route = route;
  document.body.dataset.state = "ready";
}

async function start() {
  await follow();
  window.addEventListener("hashchange", render);
  await render();
  setInterval(async () => {
    if (document.hidden) return;
    const grew = await follow();
    if (grew && (state.route === "curves" || state.route === "")) await render();
  }, POLL_MS);
}

start();
