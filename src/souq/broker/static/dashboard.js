// The Souq dashboard: a read-only view over the public HTTP API, in plain browser JavaScript.
//
// Where it learns what changed:
//   * `GET /v1/events?follow=true` (server-sent events), when the broker has it: each machine
//     event makes the page fetch that one machine again.
//   * otherwise polling: `GET /v1/workers` and `GET /v1/apps/{app}/machines` every second, and
//     the feed shows the changes the polls saw.
// Which apps it shows: `GET /v1/apps` when the broker has it, plus the apps the user typed and
// the apps named by events (remembered in localStorage).
// Batch jobs: `GET /sched/list` at each poll and after each job event (the newest JOBS_MAX);
// a broker without it hides the section.
// Each line of the feed is stamped with when it happened (the event's own `timestamp`, or the
// machine's `updated_at` a poll saw), not when the page heard of it.
// Everything the API sends is put into the page as text, never as HTML.
"use strict";

(() => {
  const POLL_MS = 1000; // while there is no event stream
  const SLOW_POLL_MS = 5000; // a safety net while the event stream is up
  const FEED_MAX = 200;
  const JOBS_MAX = 50;
  const APP_NAME = /^[a-z0-9][a-z0-9-]{0,62}$/;
  const STORE_KEY = "souq.dashboard.apps";

  const state = {
    mode: "starting", // "events" | "polling"
    apps: new Set(loadApps()),
    machines: new Map(), // id -> machine
    workers: [],
    regions: null, // the answer of /v1/regions, when it exists
    hasApps: null, // null until /v1/apps has been tried
    hasRegions: null,
    selected: null, // {app, id}
    pollTimer: null,
    jobs: [], // the answer of /sched/list, newest first
    jobStates: null, // name -> state at the last poll (to tell changes while polling)
    hasJobs: null, // null until /sched/list has been tried
  };

  const $ = (id) => document.getElementById(id);

  // ---- small helpers ------------------------------------------------------------------------

  function el(tag, props, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(props || {})) {
      if (value === undefined || value === null) continue;
      if (key === "class") node.className = value;
      else if (key === "dataset") Object.assign(node.dataset, value);
      else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, value);
    }
    for (const child of children.flat(Infinity)) {
      if (child === undefined || child === null) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  class HttpError extends Error {
    constructor(status, message) {
      super(message);
      this.status = status;
    }
  }

  // The API token: given once as /ui#token=TOKEN (a fragment never reaches a server or its
  // logs), kept for this tab only; every request sends it.
  const TOKEN_KEY = "souq-token";
  (function takeToken() {
    const match = /(?:^#|&)token=([^&]+)/.exec(window.location.hash);
    if (match) {
      sessionStorage.setItem(TOKEN_KEY, decodeURIComponent(match[1]));
      history.replaceState(null, "", window.location.pathname + window.location.search);
    }
  })();

  function withToken(headers) {
    const token = sessionStorage.getItem(TOKEN_KEY);
    return token ? { ...headers, Authorization: `Bearer ${token}` } : headers;
  }

  async function getJSON(path) {
    const response = await fetch(path, {
      headers: withToken({ Accept: "application/json" }),
      cache: "no-store",
    });
    if (!response.ok) {
      let message = `${response.status} ${response.statusText}`;
      try {
        const body = await response.json();
        if (body && body.error) message = body.error;
      } catch (_) {
        // not JSON: keep the status line
      }
      if (response.status === 401) message += " (open this page as /ui#token=TOKEN)";
      throw new HttpError(response.status, `GET ${path}: ${message}`);
    }
    return response.json();
  }

  const missing = (err) => err instanceof HttpError && (err.status === 404 || err.status === 405);

  function loadApps() {
    try {
      const apps = JSON.parse(localStorage.getItem(STORE_KEY) || "[]");
      return Array.isArray(apps) ? apps.filter((a) => APP_NAME.test(a)) : [];
    } catch (_) {
      return [];
    }
  }

  function rememberApp(app) {
    if (typeof app !== "string" || !APP_NAME.test(app) || state.apps.has(app)) return false;
    state.apps.add(app);
    try {
      localStorage.setItem(STORE_KEY, JSON.stringify([...state.apps]));
    } catch (_) {
      // private mode or storage off: the app is still watched until the page closes
    }
    renderApps();
    return true;
  }

  const clock = (ms) => new Date(ms).toLocaleTimeString([], { hour12: false });
  const shortTime = (iso) => {
    const when = Date.parse(iso);
    return Number.isNaN(when) ? iso || "" : clock(when);
  };
  const percent = (used, total) => (total > 0 ? Math.min(100, (100 * used) / total) : 0);
  const num = (x) => (Number.isInteger(x) ? String(x) : Number(x).toFixed(2).replace(/\.?0+$/, ""));

  function meter(used, total, unit) {
    const share = percent(used, total);
    const fill = el("div", { class: share >= 85 ? "fill hot" : "fill" });
    fill.style.width = `${share}%`;
    return el(
      "div",
      { class: "meter", title: `${share.toFixed(0)}%` },
      el("div", { class: "bar" }, fill),
      el("span", {}, `${num(used)} / ${num(total)}${unit}`),
    );
  }

  const badge = (value) => el("span", { class: "state", dataset: { state: value } }, value);

  function setProblem(text) {
    const node = $("problem");
    node.hidden = !text;
    node.textContent = text || "";
  }

  function setMode(mode) {
    state.mode = mode;
    const node = $("mode");
    node.dataset.mode = mode;
    node.textContent = mode === "events" ? "live: event stream" : `polling every ${POLL_MS / 1000} s`;
  }

  // ---- the event feed -----------------------------------------------------------------------

  // When something happened, from its own record: milliseconds since the epoch, or an ISO
  // time; the first of `stamps` that is one (now, only when none is: a note of the page's own).
  function happenedAt(...stamps) {
    for (const stamp of stamps) {
      const ms = typeof stamp === "number" ? stamp : typeof stamp === "string" ? Date.parse(stamp) : NaN;
      if (Number.isFinite(ms) && ms > 0) return ms;
    }
    return Date.now();
  }

  function feed(kind, text, machineId, at) {
    const list = $("feed");
    const when = at ?? Date.now();
    const iso = new Date(when).toISOString();
    const item = el(
      "li",
      { dataset: machineId ? { machineId } : {} },
      el("time", { datetime: iso, title: iso }, clock(when)),
      el("span", { class: "kind" }, kind),
      text,
    );
    list.prepend(item);
    while (list.children.length > FEED_MAX) list.lastElementChild.remove();
  }

  // ---- fetching -----------------------------------------------------------------------------

  async function refreshWorkers() {
    state.workers = await getJSON("/v1/workers");
    renderWorkers();
    renderRegions();
  }

  function coalesced(refresh) {
    // Many events at once (a batch create, a burst of job events) cost one refresh.
    let queued = false;
    return () => {
      if (queued) return;
      queued = true;
      setTimeout(() => {
        queued = false;
        refresh().catch(report);
      }, 200);
    };
  }

  // The workers and the regions, fetched together.
  const queueWorkers = coalesced(() => Promise.all([refreshWorkers(), refreshRegions()]));

  async function refreshRegions() {
    if (state.hasRegions === false) return;
    try {
      const body = await getJSON("/v1/regions");
      state.hasRegions = true;
      state.regions = Array.isArray(body) ? body : body.regions || null;
    } catch (err) {
      if (!missing(err)) throw err;
      state.hasRegions = false; // this broker has no /v1/regions: derive them from the workers
    }
    renderRegions();
  }

  async function refreshApps() {
    if (state.hasApps === false) return;
    try {
      const body = await getJSON("/v1/apps");
      state.hasApps = true;
      const apps = Array.isArray(body) ? body : body.apps || [];
      for (const app of apps) rememberApp(typeof app === "string" ? app : app.name || app.app || app.id);
    } catch (err) {
      if (!missing(err)) throw err;
      state.hasApps = false; // type an app name, or let the events name them
    }
  }

  async function refreshApp(app) {
    const listed = await getJSON(`/v1/apps/${encodeURIComponent(app)}/machines`);
    const seen = new Set();
    for (const machine of listed) {
      seen.add(machine.id);
      upsert(machine);
    }
    for (const [id, machine] of state.machines) {
      if (machine.app === app && !seen.has(id)) state.machines.delete(id);
    }
    renderMachines();
  }

  async function refreshMachine(app, id) {
    try {
      upsert(await getJSON(`/v1/apps/${encodeURIComponent(app)}/machines/${encodeURIComponent(id)}`));
    } catch (err) {
      if (!(err instanceof HttpError && err.status === 404)) throw err;
      state.machines.delete(id);
    }
    renderMachines();
  }

  // Record a machine; while polling, say in the feed what changed since the last poll.
  function upsert(machine) {
    const before = state.machines.get(machine.id);
    state.machines.set(machine.id, machine);
    rememberApp(machine.app);
    if (state.mode === "events") return;
    const at = happenedAt(machine.updated_at, machine.created_at);
    if (!before) feed("machine", `${machine.app}/${machine.id} is ${machine.state}`, machine.id, at);
    else if (before.state !== machine.state) {
      feed("machine", `${machine.app}/${machine.id} ${before.state} → ${machine.state}`, machine.id, at);
    }
  }

  async function refreshJobs() {
    if (state.hasJobs === false) return;
    let listed;
    try {
      listed = await getJSON("/sched/list");
    } catch (err) {
      if (!missing(err)) throw err;
      state.hasJobs = false; // a broker from before batch jobs
      $("jobs-section").hidden = true;
      return;
    }
    state.hasJobs = true;
    const before = state.jobStates;
    state.jobStates = new Map(listed.map((j) => [j.name, j.state]));
    if (before && state.mode !== "events") {
      for (const j of listed) {
        const was = before.get(j.name);
        if (was !== j.state) feed("job", was ? `${j.name} ${was} → ${j.state}` : `${j.name} is ${j.state}`);
      }
    }
    state.jobs = listed;
    renderJobs();
  }

  const queueJobs = coalesced(refreshJobs);

  async function refreshAll() {
    await refreshApps();
    await Promise.all([
      refreshWorkers(),
      refreshRegions(),
      refreshJobs(),
      ...[...state.apps].map(refreshApp),
    ]);
    $("updated").textContent = `updated ${clock(Date.now())}`;
  }

  function report(err) {
    setProblem(err instanceof Error ? err.message : String(err));
  }

  async function poll() {
    clearTimeout(state.pollTimer);
    try {
      await refreshAll();
      setProblem("");
    } catch (err) {
      report(err);
    }
    state.pollTimer = setTimeout(poll, state.mode === "events" ? SLOW_POLL_MS : POLL_MS);
  }

  // ---- the event stream (server-sent events over fetch, so that a 404 is seen) ---------------

  async function follow() {
    let response;
    try {
      response = await fetch("/v1/events?follow=true", {
        headers: withToken({ Accept: "text/event-stream" }),
        cache: "no-store",
      });
    } catch (_) {
      setMode("polling");
      setTimeout(follow, SLOW_POLL_MS);
      return;
    }
    const type = response.headers.get("content-type") || "";
    if (!response.ok || !type.startsWith("text/event-stream")) {
      setMode("polling");
      if (response.status !== 404 && response.status !== 405) setTimeout(follow, SLOW_POLL_MS);
      return; // no event stream on this broker: polling it is
    }
    setMode("events");
    feed("stream", "following the broker's event stream");
    try {
      await readEvents(response.body);
    } catch (_) {
      // the connection dropped; fall through to polling and try again
    }
    setMode("polling");
    feed("stream", "event stream closed; polling until it is back");
    poll();
    setTimeout(follow, 2000);
  }

  async function readEvents(body) {
    const reader = body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += value.replace(/\r\n?/g, "\n");
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        let name = "message";
        const data = [];
        for (const line of block.split("\n")) {
          if (line.startsWith(":")) continue; // a keep-alive comment
          const colon = line.indexOf(":");
          const field = colon < 0 ? line : line.slice(0, colon);
          const text = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
          if (field === "event") name = text;
          else if (field === "data") data.push(text);
        }
        if (data.length) onEvent(name, data.join("\n"));
      }
    }
  }

  function onEvent(name, text) {
    let event;
    try {
      event = JSON.parse(text);
    } catch (_) {
      feed(name, text);
      return;
    }
    if (!event || typeof event !== "object") {
      feed(name, String(event));
      return;
    }
    if (event.kind === "job" && event.job && typeof event.job === "object") {
      // {kind: job, worker_id, state, previous?, job: {name, type, why, attempts, exit_code}}
      const change = event.previous ? `${event.previous} → ${event.state}` : event.state;
      const where = event.worker_id ? `on ${event.worker_id}` : "";
      const why = event.job.why === event.job.type ? "" : event.job.why;
      const words = [event.job.name, change, where, why].filter(Boolean).join(" ");
      feed(`job ${event.job.type}`, words, null, happenedAt(event.timestamp));
      queueJobs();
      return;
    }
    // The broker's ClusterEvent: {seq, kind: machine|worker, worker_id, region, machine_id?, app?,
    // state, previous?, event?: {type, status, message, ...}}; other shapes are shown as they come.
    const machine = event.machine && typeof event.machine === "object" ? event.machine : null;
    const detail = event.event && typeof event.event === "object" ? event.event : {};
    const kind = [event.kind || name, detail.type || event.type].filter(Boolean).join(" ");
    const id =
      event.machine_id || (machine && machine.id) || (/machine/.test(`${name} ${kind}`) ? event.id : null);
    const app = event.app || (machine && machine.app) || (id && state.machines.get(id)?.app) || null;
    const status = event.state || event.status || detail.status || (machine && machine.state) || "";
    const change = event.previous ? `${event.previous} → ${status}` : status;
    const where = event.worker_id || (machine && machine.worker_id) || "";
    const subject = id ? `${app ? app + "/" : ""}${id}` : where || event.region || "";
    const words = [subject, change, id && where ? `on ${where}` : "", detail.message || event.message || ""];
    feed(kind, words.filter(Boolean).join(" "), id, happenedAt(event.timestamp, detail.timestamp));

    if (app) rememberApp(app);
    if (machine && machine.id && machine.app && machine.state && machine.config) {
      upsert(machine);
      renderMachines();
    } else if (id && app) {
      refreshMachine(app, id).catch(report);
    } else if (id) {
      Promise.all([...state.apps].map(refreshApp)).catch(report);
    }
    queueWorkers(); // allocations move with machines; worker events change worker rows
    if (state.selected && id === state.selected.id) renderSelectedHeader();
  }

  // ---- rendering ----------------------------------------------------------------------------

  function renderApps() {
    const holder = $("apps");
    holder.replaceChildren(...[...state.apps].sort().map((app) => el("span", { class: "chip" }, app)));
  }

  function renderWorkers() {
    const rows = [...state.workers]
      .sort((a, b) => a.region.localeCompare(b.region) || a.id.localeCompare(b.id))
      .map((w) =>
        el(
          "tr",
          { dataset: { workerId: w.id } },
          el("td", { class: "id" }, w.id),
          el("td", {}, w.region),
          el("td", {}, badge(w.state)),
          el("td", {}, meter(w.allocated.cpus, w.capacity.cpus, "")),
          el("td", {}, meter(w.allocated.memory_mb, w.capacity.memory_mb, " MiB")),
          el("td", {}, w.machines ?? ""),
          el("td", { class: "mono" }, Object.entries(w.labels || {}).map(([k, v]) => `${k}=${v}`).join(" ")),
        ),
      );
    $("workers").replaceChildren(...(rows.length ? rows : [emptyRow(7, "no workers yet")]));
  }

  // A region's spot price (GET /v1/regions: spot_price, spot_price_used and the recent
  // spot_price_history, oldest first), with its history drawn as a row of bars.
  const SPOT_FIELDS = ["spot_price", "spot_price_used", "spot_price_at_ms", "spot_price_source"];
  const BARS = "▁▂▃▄▅▆▇█";
  const price = (x) => String(Number(Number(x).toPrecision(4)));

  function sparkline(values) {
    if (!values.length) return "";
    const low = Math.min(...values);
    const span = Math.max(...values) - low;
    return values.map((v) => BARS[span ? Math.round(((v - low) / span) * (BARS.length - 1)) : 0]).join("");
  }

  function spotPrice(item) {
    if (!item) return "—";
    const history = (item.spot_price_history || []).slice(-24);
    const used = item.spot_price_used === null || item.spot_price_used === undefined ? "" : ` (${(item.spot_price_used * 100).toFixed(0)}% used)`;
    const trail = history.map((p) => `${price(p.price)} at ${new Date(p.at_ms).toISOString()}`).join("\n");
    return el(
      "span",
      { title: trail || "no published history yet" },
      `${price(item.spot_price)}${used} `,
      el("span", { class: "sparkline" }, sparkline(history.map((p) => p.price))),
    );
  }

  function renderRegions() {
    const byRegion = new Map();
    for (const w of state.workers) {
      const r = byRegion.get(w.region) || { up: 0, total: 0, cpus: 0, cpusUsed: 0, mem: 0, memUsed: 0, machines: 0 };
      r.total += 1;
      if (w.state !== "down") r.up += 1;
      r.cpus += w.capacity.cpus;
      r.cpusUsed += w.allocated.cpus;
      r.mem += w.capacity.memory_mb;
      r.memUsed += w.allocated.memory_mb;
      r.machines += w.machines || 0;
      byRegion.set(w.region, r);
    }
    // GET /v1/regions, when the broker has it, is the better source: it counts cordoned and
    // down workers apart and says how many machines of a default size still fit.
    const details = new Map();
    const prices = new Map(); // region -> its /v1/regions item, when it has a spot price
    for (const item of state.regions || []) {
      const name = typeof item === "string" ? item : item.name || item.region || item.id;
      if (!name) continue;
      if (typeof item === "object" && item.capacity && item.allocated) {
        byRegion.set(name, {
          up: item.workers_up ?? item.workers,
          total: item.workers,
          cpus: item.capacity.cpus,
          cpusUsed: item.allocated.cpus,
          mem: item.capacity.memory_mb,
          memUsed: item.allocated.memory_mb,
          machines: item.machines,
        });
      } else if (!byRegion.has(name)) byRegion.set(name, null);
      if (typeof item === "object") {
        const shown = ["name", "region", "id", "workers", "workers_up", "machines"];
        details.set(name, scalars(item, [...shown, ...SPOT_FIELDS]));
        if (item.spot_price !== undefined && item.spot_price !== null) prices.set(name, item);
      }
    }
    const rows = [...byRegion.keys()].sort().map((name) => {
      const r = byRegion.get(name);
      return el(
        "tr",
        { dataset: { region: name } },
        el("td", {}, name),
        el("td", {}, r ? `${r.up} / ${r.total}` : "—"),
        el("td", {}, r ? meter(r.cpusUsed, r.cpus, "") : "—"),
        el("td", {}, r ? meter(r.memUsed, r.mem, " MiB") : "—"),
        el("td", {}, r ? r.machines : "—"),
        el("td", { class: "spot-price" }, spotPrice(prices.get(name))),
        el("td", { class: "mono" }, details.get(name) || ""),
      );
    });
    $("regions").replaceChildren(...(rows.length ? rows : [emptyRow(7, "no regions yet")]));
  }

  function scalars(object, skip) {
    return Object.entries(object)
      .filter(([k, v]) => !skip.includes(k) && v !== null && typeof v !== "object")
      .map(([k, v]) => `${k}=${v}`)
      .join(" ");
  }

  function renderMachines() {
    const rows = [...state.machines.values()]
      .sort((a, b) => a.app.localeCompare(b.app) || a.created_at.localeCompare(b.created_at))
      .map((m) => {
        const selected = state.selected && state.selected.id === m.id;
        return el(
          "tr",
          {
            class: selected ? "selected" : null,
            dataset: { machineId: m.id, app: m.app, state: m.state },
            onclick: () => select(m.app, m.id),
          },
          el("td", { class: "id" }, m.id),
          el("td", {}, m.name),
          el("td", {}, m.app),
          el("td", {}, m.region),
          el("td", { class: "id" }, m.worker_id),
          el("td", { class: "machine-state" }, badge(m.state)),
          el("td", {}, num(m.config.guest.cpus)),
          el("td", {}, `${m.config.guest.memory_mb} MiB`),
          el("td", {}, m.restarts ?? 0),
          el("td", { title: m.updated_at }, shortTime(m.updated_at)),
        );
      });
    $("machines").replaceChildren(
      ...(rows.length ? rows : [emptyRow(10, state.apps.size ? "no machines" : "type an app name to watch its machines")]),
    );
    if (state.selected) renderSelectedHeader();
  }

  const ENDED = new Set(["succeeded", "failed", "cancelled"]);

  function age(ms) {
    const s = Math.max(0, Math.floor(ms / 1000));
    if (s >= 86400) return `${Math.floor(s / 86400)}d`;
    if (s >= 3600) return `${Math.floor(s / 3600)}h`;
    if (s >= 60) return `${Math.floor(s / 60)}m`;
    return `${s}s`;
  }

  function renderJobs() {
    const shown = state.jobs.slice(0, JOBS_MAX);
    const now = Date.now();
    const rows = shown.map((j) =>
      el(
        "tr",
        { dataset: { job: j.name, state: j.state } },
        el("td", { class: "id" }, j.name),
        el("td", { class: "job-state" }, badge(j.state), j.cancel_requested && !ENDED.has(j.state) ? " cancel asked" : ""),
        el("td", { class: "id" }, j.worker || ""),
        el("td", {}, j.attempts),
        el("td", { class: "why" }, j.why),
        el("td", { title: new Date(j.submitted_ms).toISOString() }, age(now - j.submitted_ms)),
      ),
    );
    $("jobs").replaceChildren(...(rows.length ? rows : [emptyRow(6, "no jobs")]));
    $("jobs-count").textContent =
      state.jobs.length > shown.length ? `(the newest ${shown.length} of ${state.jobs.length})` : "";
  }

  const emptyRow = (span, text) => el("tr", {}, el("td", { colspan: span, class: "empty" }, text));

  // ---- the placement explanation ------------------------------------------------------------

  async function select(app, id) {
    state.selected = { app, id };
    renderMachines();
    $("placement-section").hidden = false;
    $("placement").replaceChildren(el("p", { class: "empty" }, "loading…"));
    try {
      const machine = await getJSON(`/v1/apps/${encodeURIComponent(app)}/machines/${encodeURIComponent(id)}`);
      if (!state.selected || state.selected.id !== id) return; // another click came first
      upsert(machine);
      renderPlacement(machine);
    } catch (err) {
      $("placement").replaceChildren(el("p", { class: "empty" }, err.message));
    }
  }

  function renderSelectedHeader() {
    const m = state.machines.get(state.selected.id);
    $("placement-machine").replaceChildren(
      el("span", { class: "mono" }, state.selected.id),
      " ",
      m ? badge(m.state) : "",
    );
  }

  function renderPlacement(machine) {
    renderSelectedHeader();
    const p = machine.placement;
    if (!p) {
      $("placement").replaceChildren(el("p", { class: "empty" }, "this machine has no placement record"));
      return;
    }
    const facts = [
      ["winner", el("span", { id: "placement-winner", class: "mono" }, p.winner || "none")],
      ["runner-up", el("span", { class: "mono" }, p.runner_up || "none")],
      ["request", el("span", { class: "mono" }, p.request_id)],
      ["region", p.region],
      ["policy", p.policy],
      ["asked for", `${num(machine.config.guest.cpus)} cpus, ${machine.config.guest.memory_mb} MiB`],
      ["offers", `${p.offers_received} of ${p.expected_offers} expected`],
    ];
    if (p.sampled) facts.push(["sampled", `${p.sampled.asked} of ${p.sampled.of} workers (seed ${p.sampled.seed})`]);
    if (p.weights && Object.keys(p.weights).length) facts.push(["weights", scalars(p.weights, [])]);
    const parts = [el("dl", {}, facts.map(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]))];

    const reasons = Object.entries(p.rejections || {});
    parts.push(el("h3", {}, "Rejections"));
    parts.push(
      reasons.length
        ? el(
            "ul",
            { id: "placement-rejections" },
            reasons.map(([reason, count]) =>
              el("li", {}, `${reason}: ${count}`, p.unmet && p.unmet[reason] ? ` (${p.unmet[reason].join(", ")})` : ""),
            ),
          )
        : el("p", { class: "empty" }, "no offer was rejected"),
    );

    const stages = [...new Set((p.offers || []).flatMap((o) => Object.keys(o.scores || {})))];
    parts.push(el("h3", {}, "Offers, best first"));
    parts.push(
      el(
        "table",
        { id: "placement-offers" },
        el("thead", {}, el("tr", {}, el("th", {}, "worker"), stages.map((s) => el("th", {}, s)), el("th", {}, "score"))),
        el(
          "tbody",
          {},
          (p.offers || []).map((o) =>
            el(
              "tr",
              { class: o.worker_id === p.winner ? "winner" : o.rejected ? "rejected" : null, dataset: { workerId: o.worker_id } },
              el("td", { class: "id" }, o.worker_id),
              o.rejected
                ? el("td", { colspan: stages.length + 1 }, `rejected: ${o.rejected}${o.detail ? ` (${o.detail})` : ""}`)
                : [stages.map((s) => el("td", {}, s in o.scores ? o.scores[s].toFixed(3) : "")), el("td", {}, o.score == null ? "" : o.score.toFixed(3))],
            ),
          ),
        ),
      ),
    );

    parts.push(el("h3", {}, "Claims"));
    parts.push(
      (p.claims || []).length
        ? el("ol", {}, p.claims.map((c) => el("li", {}, `${c.worker_id}: ${c.ok ? "claimed" : `refused${c.reason ? ` (${c.reason})` : ""}`}`)))
        : el("p", { class: "empty" }, "no claim (a dry run, or nothing fitted)"),
    );

    const t = p.timings || {};
    parts.push(el("h3", {}, "Timings"));
    parts.push(
      el(
        "dl",
        { id: "placement-timings" },
        ["gather_ms", "rank_ms", "claim_ms", "total_ms"].map((k) => [
          el("dt", {}, k.replace("_ms", "")),
          el("dd", {}, `${(t[k] || 0).toFixed(1)} ms`),
        ]),
      ),
    );
    $("placement").replaceChildren(...parts);
  }

  // ---- start --------------------------------------------------------------------------------

  function start() {
    $("app-form").addEventListener("submit", (event) => {
      event.preventDefault();
      const input = $("app-input");
      const app = input.value.trim();
      if (!APP_NAME.test(app)) {
        setProblem(`${app || "an empty name"} is not an app name`);
        return;
      }
      input.value = "";
      rememberApp(app);
      refreshApp(app).catch(report);
    });
    for (const app of new URLSearchParams(location.search).getAll("app")) rememberApp(app);
    renderApps();
    renderMachines();
    renderJobs();
    setMode("polling");
    follow();
    poll();
  }

  start();
})();
