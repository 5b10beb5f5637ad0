// inferlb dashboard: charts over time from the gateway's own report endpoints, drawn with the
// vendored uPlot (no CDN). Query parameters: window (1h|6h|24h|7d), or since/until (epoch seconds
// or ISO-8601); bucket (30s, 5m, 1h, ...; chosen from the window when absent); refresh (seconds,
// 0 = off; default 60). When everything is drawn, window.inferlbDashboard.ready is true and
// .charts says how many series and points each chart got (the browser test reads it), and
// .autoscale what the autoscaling panel showed (enabled, models, events), .versions what the
// versions and rollouts panel showed (enabled, models, rollouts), .tiers what the cost-tiers panel
// showed (aliases, tiers, tripped), .kvEvents what the KV-event index panel showed (enabled, nodes).
// With authentication on, the data routes want the admin key: on a 401/403 the page shows its
// sign-in form (.needsKey is true), keeps the key in this tab's sessionStorage and sends it as
// "Authorization: Bearer" on every fetch.
(() => {
  "use strict";

  const PALETTE = ["#2563eb", "#dc2626", "#16a34a", "#d97706", "#7c3aed", "#0891b2", "#db2777",
                   "#65a30d", "#475569", "#ea580c"];
  const STATE_COLORS = { healthy: "#16a34a", cooldown: "#f59e0b", ejected: "#dc2626", unhealthy: "#7f1d1d" };
  const WINDOWS = { "1h": 3600, "6h": 21600, "24h": 86400, "7d": 604800 };
  const UNIT = { s: 1, m: 60, h: 3600, d: 86400, w: 604800 };
  const params = new URLSearchParams(location.search);
  const dash = { ready: false, needsKey: false, charts: {}, errors: [] };
  const KEY_ITEM = "inferlb.adminKey";
  window.inferlbDashboard = dash;
  const plots = [];

  const $ = (id) => document.getElementById(id);

  function parseTime(v) {
    if (!v) return null;
    if (/^\d+(\.\d+)?$/.test(v)) return Number(v);
    const t = Date.parse(v);
    return Number.isNaN(t) ? null : t / 1000;
  }

  function parseDuration(v) {
    const m = /^(\d+(?:\.\d+)?)([smhdw])?$/.exec(String(v).trim());
    return m ? Number(m[1]) * UNIT[m[2] || "s"] : null;
  }

  function autoBucket(span) {
    for (const b of [60, 300, 900, 1800, 3600, 10800, 21600, 86400]) if (span / b <= 150) return b;
    return 86400;
  }

  function range() {
    const win = WINDOWS[params.get("window")] ? params.get("window") : "6h";
    const until = parseTime(params.get("until")) ?? Date.now() / 1000;
    const since = parseTime(params.get("since")) ?? until - WINDOWS[win];
    const bucket = parseDuration(params.get("bucket") || "") || autoBucket(until - since);
    return { win, since, until, bucket };
  }

  async function getJSON(path, query) {
    const url = new URL(path, location.origin);
    for (const [k, v] of Object.entries(query || {})) url.searchParams.set(k, String(v));
    const headers = { accept: "application/json" };
    const key = sessionStorage.getItem(KEY_ITEM);
    if (key) headers.authorization = `Bearer ${key}`;
    const resp = await fetch(url, { headers, credentials: "omit" });
    if (resp.status === 401 || resp.status === 403) {
      let message = `HTTP ${resp.status}`;
      try { message = (await resp.json()).error.message; } catch (_) { /* keep the status */ }
      throw new AuthError(message, Boolean(key));
    }
    if (!resp.ok) throw new Error(`${url.pathname}${url.search}: HTTP ${resp.status}`);
    return resp.json();
  }

  class AuthError extends Error {
    constructor(message, hadKey) {
      super(message);
      this.hadKey = hadKey;
    }
  }

  function askForKey(err) {
    dash.needsKey = true;
    const form = $("login");
    form.hidden = false;
    $("login-why").textContent = err.hadKey ? `That key was refused: ${err.message}` :
      "Authentication is on: sign in with the admin key (kept in this tab only).";
    form.elements.key.focus();
  }

  const fmt = {
    ms: (v) => (v == null ? "–" : v >= 10000 ? `${(v / 1000).toFixed(1)} s` : `${Math.round(v)} ms`),
    pct: (v) => (v == null ? "–" : `${(v * 100).toFixed(1)}%`),
    n: (v) => (v == null ? "–" : Math.round(v).toLocaleString("en-US")),
    rate: (v) => (v == null ? "–" : v >= 1000 ? `${(v / 1000).toFixed(1)}k tok/s` : `${v.toFixed(v < 10 ? 1 : 0)} tok/s`),
    money: (v) => (v == null ? "–" : v >= 100 ? `$${v.toFixed(0)}` : v >= 1 ? `$${v.toFixed(2)}` : `$${v.toFixed(4)}`),
  };

  // Buckets of the window as epoch seconds (uPlot's x axis), aligned like the server's.
  function axis(r) {
    const xs = [];
    for (let t = Math.floor(r.since / r.bucket) * r.bucket; t < r.until && xs.length < 10000; t += r.bucket) xs.push(t);
    return xs;
  }

  // rows -> {seriesName: [value per x]} using key(row) for the series and val(row) for the value.
  function pivot(xs, rows, key, val, fill) {
    const index = new Map(xs.map((x, i) => [x, i]));
    const out = new Map();
    for (const row of rows) {
      const name = key(row);
      if (!out.has(name)) out.set(name, xs.map(() => fill));
      const i = index.get(Math.round(row.bucket));
      if (i !== undefined) {
        const v = val(row);
        const values = out.get(name);
        values[i] = fill === 0 ? (values[i] || 0) + (v || 0) : v;   // counts and costs add up
      }
    }
    return out;
  }

  // counts: a y axis of whole numbers from 0 (replicas), not 3.2 rounded to "3".
  function chart(id, xs, series, yfmt, counts) {
    const el = $(id);
    el.textContent = "";
    const points = series.reduce((n, s) => n + s.values.filter((v) => v != null).length, 0);
    dash.charts[id] = { series: series.length, points };
    if (!series.length || !points) {
      el.innerHTML = '<div class="empty">no data in this window</div>';
      return;
    }
    const opts = {
      width: Math.max(320, el.clientWidth || 600),
      height: 240,
      scales: { x: { time: true } },
      tzDate: (ts) => uPlot.tzDate(new Date(ts * 1000), "Etc/UTC"),   // the axis in UTC, like the reports
      series: [{}, ...series.map((s, i) => ({
        label: s.label, stroke: s.color || PALETTE[i % PALETTE.length], width: 2, dash: s.dash,
        points: { show: false }, value: (u, v) => yfmt(v), ...(s.paths ? { paths: s.paths } : {}),
      }))],
      axes: [{}, { size: 70, values: (u, vals) => vals.map(yfmt), ...(counts ? { incrs: [1, 2, 5, 10, 20, 50, 100] } : {}) }],
    };
    if (counts) opts.scales.y = { range: (u, min, max) => [0, Math.max(1, max) + 1] };
    plots.push(new uPlot(opts, [xs, ...series.map((s) => s.values)], el));
  }

  function tiles(items) {
    $("tiles").innerHTML = items.map(([k, v]) =>
      `<div class="tile"><div class="k">${esc(k)}</div><div class="v">${esc(v)}</div></div>`).join("");
  }

  function esc(s) {
    return String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
  }

  function table(id, head, rows, empty) {
    $(id).innerHTML = rows.length
      ? `<table><thead><tr>${head.map((h) => `<th>${esc(h)}</th>`).join("")}</tr></thead><tbody>` +
        rows.map((r) => `<tr>${r.map((c) => `<td>${esc(c)}</td>`).join("")}</tr>`).join("") + "</tbody></table>"
      : `<div class="empty">${esc(empty || "no data in this window")}</div>`;
  }

  // The autoscaling panel (GET /dashboard/autoscale): per model, forecast vs actual vs capacity in
  // tokens/s and the replicas in place per GPU type, over the autoscaler's rounds since this gateway
  // started; then the last scaling decisions from the scaling_events table. Autoscaling off: says so.
  function autoscalePanel(data) {
    const el = $("autoscale");
    el.textContent = "";
    if (!data.enabled) {
      dash.autoscale = { enabled: false, models: 0, events: 0 };
      const off = document.createElement("div");
      off.className = "empty";
      off.id = "autoscale-off";
      off.textContent = data.reason || "autoscaling is off";
      el.appendChild(off);
      return;
    }
    const st = data.status || {};
    const models = data.models || [];
    const events = data.events || [];
    dash.autoscale = { enabled: true, models: models.length, events: events.length };
    const status = document.createElement("div");
    status.className = "as-status";
    status.id = "autoscale-status";
    const bits = [["actuator", st.actuator], ["forecaster", st.forecaster], ["every", `${st.interval_s} s`],
                  ["rounds", st.rounds], ["failed rounds", st.failed_rounds], ["failed actuations", st.actuation_failures]];
    if (st.leader === false) bits.push(["leader", "no (standby)"]);
    if (st.last_error) bits.push(["last error", st.last_error]);
    status.innerHTML = bits.map(([k, v]) => `${esc(k)} <b>${esc(v ?? "–")}</b>`).join(" · ");
    el.appendChild(status);
    if (!models.length) {
      el.insertAdjacentHTML("beforeend", '<div class="empty">no autoscale round yet</div>');
    }
    models.forEach((m, i) => {
      const box = document.createElement("div");
      box.className = "as-model";
      box.innerHTML = `<h3>${esc(m.model)} <span>forecaster ${esc(m.method ?? "–")}</span></h3>` +
        `<div class="as-grid"><div class="chart" id="chart-autoscale-${i}"></div>` +
        `<div class="chart" id="chart-replicas-${i}"></div></div>`;
      el.appendChild(box);
      chart(`chart-autoscale-${i}`, m.t, [
        { label: "forecast", values: m.forecast, color: "#7c3aed", dash: [6, 4] },
        { label: "actual", values: m.actual, color: "#2563eb" },
        { label: "capacity", values: m.capacity, color: "#16a34a" },
      ], fmt.rate);
      chart(`chart-replicas-${i}`, m.t, Object.entries(m.replicas || {}).map(([gpu, values]) => (
        { label: `${gpu} replicas`, values, paths: uPlot.paths.stepped({ align: 1 }) })), fmt.n, true);
    });
    const box = document.createElement("div");
    box.className = "as-events";
    box.id = "table-scaling";
    el.appendChild(box);
    table("table-scaling", ["time (UTC)", "model", "GPU", "replicas", "in place", "status", "forecaster", "reason"],
      events.map((e) => [new Date(e.at * 1000).toISOString().slice(0, 19).replace("T", " "), e.model,
        e.gpu ?? "–", e.from_replicas == null ? "–" : `${e.from_replicas} → ${e.to_replicas}`,
        e.applied_replicas ?? "–", e.status, e.forecaster ?? "–", e.reason]),
      "no scaling event recorded yet");
  }

  // The versions and rollouts panel (GET /dashboard/versions): per versioned model, one bar of its
  // versions' traffic shares in force; then the rollouts, running first, then the last ended ones,
  // with their step and last decision. No model with versions: says so.
  const utc = (t) => (t == null ? "–" : new Date(t * 1000).toISOString().slice(0, 19).replace("T", " "));

  // The LoRA adapters panel (GET /dashboard/lora): each LoRA model's adapters, then per node the
  // adapters running and waiting there, its slots and the adapters cooling down after a failed load.
  function loraPanel(data) {
    const el = $("lora");
    el.textContent = "";
    const nodes = data.nodes || [];
    dash.lora = { enabled: Boolean(data.enabled), models: (data.models || []).length, nodes: nodes.length };
    if (!data.enabled) {
      const off = document.createElement("div");
      off.className = "empty";
      off.id = "lora-off";
      off.textContent = data.reason || "no LoRA model";
      el.appendChild(off);
      return;
    }
    const models = document.createElement("div");
    models.id = "table-lora-models";
    const perNode = document.createElement("div");
    perNode.id = "table-lora-nodes";
    el.append(models, perNode);
    const list = (xs) => (xs && xs.length ? xs.join(", ") : "–");
    table("table-lora-models", ["model", "adapters", "base", "failure cool-down"],
      data.models.map((m) => [m.model, list(m.adapters), m.base ?? "–", `${m.failure_cooldown_s} s`]));
    table("table-lora-nodes", ["node", "running", "waiting", "slots (max_lora)", "failed to load (cooling down)"],
      nodes.map((n) => [n.node, list(n.running), list(n.waiting), n.max_lora ?? "not reported", list(n.failed)]));
  }

  function versionsPanel(data) {
    const el = $("versions");
    el.textContent = "";
    const models = data.models || [];
    const rollouts = data.rollouts || [];
    dash.versions = { enabled: Boolean(data.enabled), models: models.length, rollouts: rollouts.length };
    if (!data.enabled) {
      const off = document.createElement("div");
      off.className = "empty";
      off.id = "versions-off";
      off.textContent = data.reason || "no model has versions";
      el.appendChild(off);
    }
    models.forEach((m, i) => {
      const row = document.createElement("div");
      row.className = "vr-row";
      row.id = `versions-${i}`;
      const name = document.createElement("span");
      name.className = "name";
      name.textContent = m.model;
      if (m.overridden) {
        const tag = document.createElement("span");
        tag.textContent = " (overridden)";
        name.appendChild(tag);
      }
      const bar = document.createElement("div");
      bar.className = "vr-bar";
      m.versions.forEach((v, j) => {
        if (!(v.share > 0)) return;   // a version with no traffic takes no room; its name is in the title
        const seg = document.createElement("div");
        seg.className = "vr-seg";
        seg.style.width = `${v.share * 100}%`;
        seg.style.background = PALETTE[j % PALETTE.length];
        seg.textContent = `${v.name} ${fmt.pct(v.share)}`;
        bar.appendChild(seg);
      });
      bar.title = m.versions.map((v) => `${v.name}: weight ${v.weight} (${fmt.pct(v.share)})`).join(", ");
      row.append(name, bar);
      el.appendChild(row);
    });
    if (!data.enabled && !rollouts.length) return;
    const box = document.createElement("div");
    box.className = "vr-rollouts";
    box.id = "table-rollouts";
    el.appendChild(box);
    table("table-rollouts", ["rollout", "model", "from → to", "state", "step", "last decision", "started (UTC)",
      "ended (UTC)", "reason"],
      rollouts.map((r) => {
        const d = r.last_decision;
        const steps = r.steps || [];
        return [r.id, r.model, `${r.from_version} → ${r.to_version}`, r.state,
          `${r.percent}%` + (steps.length ? ` (${Math.min(r.step + 1, steps.length)}/${steps.length})` : ""),
          d ? d.action : "–", utc(r.started_at), utc(r.ended_at),
          (d && d.reason) || r.reason || "–"];
      }),
      "no rollout yet");
  }

  // The cost-tiers panel (GET /admin/tiers, and /reports/sla grouped by model,served for the window):
  // one row per tier of each model alias: its threshold, the window's requests, error rate and SLO
  // attainment, the cost and choices since this gateway started, and its guard (tripped: why).
  function tiersPanel(state, sla) {
    const aliases = state.data || [];
    const rows = [];
    let tripped = 0;
    for (const a of aliases) {
      for (const t of a.tiers) {
        const w = (sla.data || []).find((row) => row.model === a.alias && row.served === t.model) || {};
        const g = t.guard;
        if (g && g.tripped) tripped += 1;
        rows.push([a.alias, t.model, t.max_score == null ? "rest" : `≤ ${t.max_score}`, fmt.n(w.count),
          fmt.pct(w.error_rate), fmt.pct(w.slo_attainment), fmt.n(t.chosen), fmt.money(t.cost),
          g ? (g.tripped ? `TRIPPED: ${g.reason}` : `ok (${g.trips} trips)`) : "–"]);
      }
    }
    dash.tiers = { aliases: aliases.length, tiers: rows.length, tripped };
    table("tiers", ["alias", "tier", "score", "requests", "error rate", "in SLO", "chosen since start",
      "cost since start", "guard"], rows, "no model alias has tiers");
  }

  // The KV-event index panel (GET /dashboard/kv-events): per model the decisions that used the
  // engines' KV events or fell back to the gateway-side hash; per publishing node its indexed
  // blocks and its stream's state (fresh, or why stale). Not configured: says so.
  function kvEventsPanel(data) {
    const el = $("kv-events");
    dash.kvEvents = { enabled: Boolean(data.enabled), nodes: Object.keys(data.nodes || {}).length };
    if (!data.enabled) {
      el.innerHTML = `<div class="empty" id="kv-events-off">${esc(data.reason || "KV events are off")}</div>`;
      return;
    }
    const models = Object.entries(data.models || {}).map(([m, v]) =>
      [m, v.tokenizer, fmt.n(v.used), fmt.n(v.fallback), v.tokenizer_problem || ""]);
    const nodes = Object.entries(data.nodes || {}).map(([n, v]) =>
      [n, fmt.n(v.blocks), v.stale ? `stale: ${v.stale}` : "fresh", fmt.n(v.batches),
       `${fmt.n(v.gaps_replayed)} / ${fmt.n(v.gaps_lost)}`, fmt.n(v.errors)]);
    el.innerHTML = '<div id="kv-events-models"></div><div id="kv-events-nodes"></div>';
    table("kv-events-models", ["model", "tokenizer", "index used", "fell back", "tokenizer problem"], models,
      "no model reads KV events");
    table("kv-events-nodes", ["node", "blocks", "stream", "batches", "gaps replayed / lost", "bad messages"], nodes,
      "no node publishes KV events");
  }

  function states(hist) {
    const el = $("chart-states");
    el.textContent = "";
    const samples = hist.samples || [];
    dash.charts["chart-states"] = { series: (hist.nodes || []).length, points: samples.length };
    if (!samples.length) {
      el.innerHTML = '<div class="empty">no samples yet</div>';
      return;
    }
    const t0 = samples[0].t;
    const t1 = Math.max(hist.now ?? Date.now() / 1000, samples[samples.length - 1].t + 1);   // the gateway's clock
    for (const node of hist.nodes) {
      const row = document.createElement("div");
      row.className = "state-row";
      const name = document.createElement("span");
      name.className = "name";
      const role = (hist.roles || {})[node];   // prefill / decode (docs/disaggregation.md); none: both
      name.textContent = role ? `${node} (${role})` : node;
      const bar = document.createElement("div");
      bar.className = "state-bar";
      samples.forEach((s, i) => {
        const end = i + 1 < samples.length ? samples[i + 1].t : t1;
        const seg = document.createElement("div");
        seg.className = "state-seg";
        const st = s.states[node];
        seg.style.left = `${((s.t - t0) / (t1 - t0)) * 100}%`;
        seg.style.width = `${Math.max(0.2, ((end - s.t) / (t1 - t0)) * 100)}%`;
        seg.style.background = STATE_COLORS[st] || "#cbd5e1";
        seg.title = `${node}: ${st || "unknown"} at ${new Date(s.t * 1000).toISOString()}`;
        bar.appendChild(seg);
      });
      row.append(name, bar);
      el.appendChild(row);
    }
    const legend = document.createElement("div");
    legend.className = "legend";
    for (const [st, c] of Object.entries(STATE_COLORS)) {
      const item = document.createElement("span");
      const sw = document.createElement("i");
      sw.style.background = c;
      item.append(sw, st);
      legend.appendChild(item);
    }
    el.appendChild(legend);
  }

  async function load() {
    const r = range();
    $("controls").elements.window.value = r.win;
    $("range").textContent = `${new Date(r.since * 1000).toISOString().slice(0, 16)}Z → ` +
      `${new Date(r.until * 1000).toISOString().slice(0, 16)}Z, ${r.bucket}s buckets`;
    const w = { since: r.since.toFixed(3), until: r.until.toFixed(3) };
    const b = { ...w, bucket: `${r.bucket}s` };
    // One call first: without a key (auth on) only it is refused, not nine (failures are rate-limited).
    const hist = await getJSON("/dashboard/node-states");
    const [all, byModel, byNode, costTenant, costModel, slaTotal, slaModelTotal, costTotal, scaling, versions, tierState,
      slaTiers, lora] = await Promise.all([
      getJSON("/reports/sla", { ...b, group_by: "none" }),
      getJSON("/reports/sla", { ...b, group_by: "model" }),
      getJSON("/reports/sla", { ...b, group_by: "node" }),
      getJSON("/reports/cost", { ...b, group_by: "tenant" }),
      getJSON("/reports/cost", { ...b, group_by: "model" }),
      getJSON("/reports/sla", { ...w, group_by: "none" }),
      getJSON("/reports/sla", { ...w, group_by: "model" }),
      getJSON("/reports/cost", { ...w, group_by: "tenant" }),
      getJSON("/dashboard/autoscale", { events: 20 }),
      getJSON("/dashboard/versions", { limit: 10 }),
      getJSON("/admin/tiers"),
      getJSON("/reports/sla", { ...w, group_by: "model,served" }),
      getJSON("/dashboard/lora"),
    ]);
    while (plots.length) plots.pop().destroy();
    const xs = axis(r);
    const one = (rows, field) => pivot(xs, rows, () => "all", (row) => row[field], null).get("all") || xs.map(() => null);
    chart("chart-latency", xs, ["p50", "p95", "p99"].map((q) => ({ label: `e2e ${q}`, values: one(all.data, `e2e_${q}_ms`) })), fmt.ms);
    chart("chart-ttft", xs, ["p50", "p95", "p99"].map((q) => ({ label: `TTFT ${q}`, values: one(all.data, `ttft_${q}_ms`) })), fmt.ms);
    const slo = pivot(xs, byModel.data.filter((row) => row.slo_attainment != null), (row) => row.model ?? "none", (row) => row.slo_attainment, null);
    chart("chart-slo", xs, [...slo].map(([name, values]) => ({ label: name, values })), fmt.pct);
    const reqs = pivot(xs, byNode.data, (row) => row.node ?? "no node", (row) => row.count, 0);
    const errs = pivot(xs, byNode.data, (row) => row.node ?? "no node", (row) => row.errors, 0);
    const nodeSeries = [];
    [...reqs.keys()].forEach((name, i) => {
      const color = PALETTE[i % PALETTE.length];
      nodeSeries.push({ label: `${name} requests`, values: reqs.get(name), color });
      nodeSeries.push({ label: `${name} errors`, values: errs.get(name), color, dash: [6, 4] });
    });
    chart("chart-nodes", xs, nodeSeries, fmt.n);
    const costSeries = (rows, key) => [...pivot(xs, rows, (row) => (row.kind === "idle" ? "idle capacity" : row[key] ?? "none"), (row) => row.cost, 0)]
      .map(([name, values]) => ({ label: name, values, dash: name === "idle capacity" ? [6, 4] : undefined, color: name === "idle capacity" ? "#94a3b8" : undefined }));
    chart("chart-cost-tenant", xs, costSeries(costTenant.data, "tenant"), fmt.money);
    chart("chart-cost-model", xs, costSeries(costModel.data, "model"), fmt.money);
    states(hist);
    autoscalePanel(scaling);
    versionsPanel(versions);
    tiersPanel(tierState, slaTiers);
    loraPanel(lora);
    kvEventsPanel(await getJSON("/dashboard/kv-events"));
    const total = slaTotal.data[0] || {};
    const sum = costTotal.summary || {};
    tiles([
      ["requests", fmt.n(total.count)], ["error rate", fmt.pct(total.error_rate)],
      ["SLO attainment", fmt.pct(total.slo_attainment)], ["e2e p95", fmt.ms(total.e2e_p95_ms)],
      ["TTFT p95", fmt.ms(total.ttft_p95_ms)], ["cost", fmt.money(sum.attributed_cost)],
      ["idle cost", fmt.money(sum.idle_cost)], ["GPU utilization", fmt.pct(sum.utilization)],
    ]);
    table("table-sla", ["model", "requests", "error rate", "e2e p95", "TTFT p95", "in SLO"],
      slaModelTotal.data.map((row) => [row.model ?? "none", fmt.n(row.count), fmt.pct(row.error_rate),
        fmt.ms(row.e2e_p95_ms), fmt.ms(row.ttft_p95_ms), fmt.pct(row.slo_attainment)]));
    table("table-cost", ["tenant", "requests", "cost", "per request", "per 1k tokens"],
      costTotal.data.map((row) => [row.kind === "idle" ? "idle capacity" : row.tenant ?? "none", fmt.n(row.requests),
        fmt.money(row.cost), fmt.money(row.cost_per_request), fmt.money(row.cost_per_1k_tokens)]));
  }

  function fail(err) {
    dash.errors.push(String(err && err.message ? err.message : err));
    const box = $("error");
    box.hidden = false;
    box.textContent = `Could not load the dashboard data: ${dash.errors[dash.errors.length - 1]}`;
    console.error(err);
  }

  async function refresh() {
    dash.ready = false;
    $("logout").hidden = !sessionStorage.getItem(KEY_ITEM);
    try {
      await load();
      dash.needsKey = false;
      $("login").hidden = true;
      $("error").hidden = true;
    } catch (err) {
      if (err instanceof AuthError) askForKey(err);
      else fail(err);
    }
    dash.ready = true;
    document.body.dataset.ready = "1";
  }

  document.addEventListener("DOMContentLoaded", () => {
    $("controls").addEventListener("submit", (ev) => {
      ev.preventDefault();
      const next = new URLSearchParams(location.search);
      next.set("window", ev.target.elements.window.value);
      for (const k of ["since", "until", "bucket"]) next.delete(k);
      location.search = next.toString();
    });
    $("login").addEventListener("submit", (ev) => {
      ev.preventDefault();
      const key = ev.target.elements.key.value.trim();
      ev.target.elements.key.value = "";
      if (key) sessionStorage.setItem(KEY_ITEM, key);
      refresh();
    });
    $("logout").addEventListener("click", () => {
      sessionStorage.removeItem(KEY_ITEM);
      refresh();
    });
    refresh();
    const every = Number(params.get("refresh") ?? 60);
    if (every > 0) setInterval(refresh, every * 1000);
  });
})();
