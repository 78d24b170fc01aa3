// The exception panel: the review queue from /api/review, an operation's
// evidence and timeline from /api/operations/{id}, and decisions POSTed to
// /api/operations/{id}/resolve with the bearer token kept in sessionStorage.
// The Dead letters tab: both dead-letter places from /api/dlq (the DLQ
// topic and the outbox's dead_letter rows), re-driven (with a dry run
// first, if wished) through /api/dlq/redrive and /api/dlq/outbox/redrive.
// When the instance is in a fleet (/api/fleet answers), every request asks
// for scope=fleet: the queue of every member, each operation from (and each
// decision to) the member that owns it.
// When the instance has a token configured, reads need it too: the token
// entered at the top (or in a form below) is sent with every request.
// Everything the server sends is inserted as text, never as HTML.
"use strict";

const OUTCOMES = ["MISSING", "DIVERGENT", "AMBIGUOUS", "DUPLICATE_EFFECT", "NOT_APPLICABLE", "CORRECT"];
const state = { queue: [], sortDesc: true, selected: null, lastLoad: null, verdictOf: {}, fleet: null, members: [], tab: "review", dlq: null, dlqRequest: 0 };
const $ = (id) => document.getElementById(id);

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : String(c));
  }
  return e;
}

/** "45 s", "12 min", "3 h 5 min", "2 d 4 h". */
function humanAge(ms) {
  if (ms === null || ms === undefined || isNaN(ms)) return "–";
  const s = Math.max(0, Math.floor(ms / 1000));
  if (s < 60) return `${s} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} min`;
  const h = Math.floor(m / 60);
  if (h < 24) return m % 60 ? `${h} h ${m % 60} min` : `${h} h`;
  const d = Math.floor(h / 24);
  return h % 24 ? `${d} d ${h % 24} h` : `${d} d`;
}

function when(ms) {
  if (ms === null || ms === undefined) return "–";
  const d = new Date(ms);
  return d.toLocaleString(undefined, { dateStyle: "short", timeStyle: "medium" });
}

function badge(text, cls) {
  return el("span", { class: `badge ${cls || ""}` }, text === null || text === undefined ? "–" : text);
}

/** The tab's API token (http.token or http.read_token), or "". */
function apiToken() {
  return sessionStorage.getItem("reconciler.token") || "";
}

/** Keeps `token` for this tab, in every field that shows it. */
function keepToken(token) {
  sessionStorage.setItem("reconciler.token", token);
  for (const id of ["token", "r-token", "rd-token"]) $(id).value = token;
}

/** What to add to an error of a read: how to get past a 401. */
function authHint(e) {
  return e.status === 401 ? " Enter the API token (http.token or http.read_token) at the top and press Use." : "";
}

async function getJson(url, options) {
  let resp;
  const opts = { ...(options || {}) };
  opts.headers = { ...(opts.headers || {}) };
  if (apiToken() && !opts.headers.Authorization) opts.headers.Authorization = `Bearer ${apiToken()}`;
  try {
    resp = await fetch(url, opts);
  } catch (e) {
    throw new Error(`cannot reach the reconciler (${e.message})`);
  }
  let body = null;
  const text = await resp.text();
  try { body = text ? JSON.parse(text) : null; } catch (_) { body = null; }
  if (!resp.ok) {
    const msg = body && body.error ? body.error : (text || resp.statusText);
    const err = new Error(`${resp.status}: ${msg}`);
    err.status = resp.status;
    throw err;
  }
  return body;
}

function showError(id, msg) {
  const box = $(id);
  box.hidden = !msg;
  box.textContent = msg || "";
}

// ---- readiness -------------------------------------------------------------

async function loadReady() {
  const b = $("ready");
  try {
    const resp = await fetch("/readyz");
    const r = await resp.json();
    b.className = `badge ${r.ready ? "ok" : "no"}`;
    b.textContent = r.ready ? "ready" : `not ready (${r.restored}/${r.partitions} partitions restored)`;
  } catch (_) {
    b.className = "badge no";
    b.textContent = "unreachable";
  }
}

// ---- the fleet -------------------------------------------------------------

/** Whether this instance is in a fleet: then every request asks for the fleet. */
async function loadFleet() {
  try {
    const f = await getJson("/api/fleet");
    state.fleet = f && f.me ? f : null;
  } catch (_) {
    state.fleet = null;
  }
  const b = $("fleet");
  if (b) {
    const live = state.fleet ? state.fleet.members.filter((m) => m.live).length : 0;
    b.hidden = !state.fleet;
    b.textContent = state.fleet ? `fleet: ${live} live member${live === 1 ? "" : "s"}` : "";
  }
}

/** `url` asking for the whole fleet when this instance is in one. */
function scoped(url) {
  return state.fleet ? `${url}${url.includes("?") ? "&" : "?"}scope=fleet` : url;
}

/** "host:port" of a member's URL. */
function host(url) {
  try { return new URL(url).host; } catch (_) { return url; }
}

// ---- the queue -------------------------------------------------------------

/** "person" (the review queue) or "machine" (cases waiting for a PROBE or REQUEUE to be answered). */
function waiting() {
  return $("filter-waiting").value || "person";
}

async function loadQueue() {
  try {
    const body = await getJson(scoped(`/api/review?waiting=${encodeURIComponent(waiting())}`));
    state.queue = Array.isArray(body) ? body : body.cases;
    state.members = Array.isArray(body) ? [] : body.members;
    state.lastLoad = Date.now();
    const unreachable = state.members.filter((m) => m.error);
    showError("queue-error", unreachable.length
      ? `Not every member answered: ${unreachable.map((m) => `${host(m.url)} (${m.error})`).join("; ")}. Their cases are missing below.`
      : null);
  } catch (e) {
    showError("queue-error", `Could not load the review queue: ${e.message}.${authHint(e)}`);
  }
  fillFilterOptions();
  renderQueue();
  $("updated").textContent = state.lastLoad ? `updated ${new Date(state.lastLoad).toLocaleTimeString()}` : "";
}

function fillFilterOptions() {
  const typeSel = $("filter-type");
  const current = typeSel.value;
  const types = [...new Set(state.queue.map((c) => c.operation_type))].sort();
  typeSel.replaceChildren(el("option", { value: "" }, "all"), ...types.map((t) => el("option", { value: t }, t)));
  if (types.includes(current)) typeSel.value = current;
  const outSel = $("filter-outcome");
  if (outSel.options.length === 1) {
    for (const o of OUTCOMES) outSel.append(el("option", { value: o }, o));
  }
}

function filtered() {
  const type = $("filter-type").value;
  const outcome = $("filter-outcome").value;
  const minAge = Number($("filter-age").value || 0);
  const rows = state.queue.filter((c) =>
    (!type || c.operation_type === type) && (!outcome || c.outcome === outcome) && c.age_ms >= minAge);
  rows.sort((a, b) => (state.sortDesc ? b.age_ms - a.age_ms : a.age_ms - b.age_ms));
  return rows;
}

function renderQueue() {
  const rows = filtered();
  const machine = waiting() === "machine";
  for (const th of document.querySelectorAll(".machine-only")) th.hidden = !machine;
  const body = $("queue-body");
  body.replaceChildren(...rows.map((c) => {
    const tr = el("tr", {
      tabindex: "0",
      "data-operation-id": c.operation_id,
      onclick: () => openOperation(c.operation_id),
      onkeydown: (ev) => { if (ev.key === "Enter") openOperation(c.operation_id); },
    },
    el("td", { class: "age", title: `waiting since ${when(c.since)}` }, humanAge(c.age_ms)),
    el("td", {}, el("code", {}, c.operation_id),
      c.instance ? el("div", { class: "muted instance", title: `owned by ${c.instance}` }, host(c.instance)) : null),
    el("td", {}, el("code", {}, c.entity_id)),
    el("td", {}, c.operation_type),
    el("td", {}, badge(c.outcome, `outcome-${c.outcome}`)),
    el("td", {}, c.recommended_action || "–"),
    ...(machine ? [el("td", { class: "follow-up" }, when(c.follow_up_at))] : []),
    el("td", { class: "reason" }, c.superseded_by ? `[superseded by ${c.superseded_by.operation_id}] ` : "", c.reason || ""));
    if (c.operation_id === state.selected) tr.classList.add("selected");
    return tr;
  }));
  $("queue").hidden = rows.length === 0;
  const empty = $("queue-empty");
  empty.hidden = rows.length !== 0;
  empty.textContent = state.queue.length === 0
    ? (machine ? "No operation is waiting for a machine action." : "The review queue is empty: no operation is waiting for a person.")
    : "No case matches these filters.";
  const oldest = rows.length ? Math.max(...rows.map((c) => c.age_ms)) : null;
  $("queue-count").textContent = state.queue.length === 0 ? "" :
    `${rows.length} of ${state.queue.length} case${state.queue.length === 1 ? "" : "s"}` +
    (oldest !== null ? ` · oldest ${humanAge(oldest)}` : "");
}

// ---- one operation ---------------------------------------------------------

async function openOperation(id) {
  state.selected = id;
  renderQueue();
  $("detail").hidden = false;
  $("d-id").textContent = id;
  $("resolve-result").replaceChildren();
  try {
    const op = await getJson(scoped(`/api/operations/${encodeURIComponent(id)}`));
    showError("detail-error", null);
    $("detail-body").hidden = false;
    renderOperation(op);
  } catch (e) {
    $("detail-body").hidden = true;
    showError("detail-error", e.status === 404 ? `Operation ${id} is not in the state of ${state.fleet ? "any live member of the fleet" : "the partitions this instance owns"} (never seen, moved, or removed after retention).` : `Could not load operation ${id}: ${e.message}`);
  }
  $("detail").scrollIntoView({ behavior: "smooth", block: "start" });
}

function facts(dl, pairs) {
  dl.replaceChildren(...pairs.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v === null || v === undefined ? "–" : v)]));
}

function renderOperation(op) {
  const v = op.last_verdict;
  facts($("d-facts"), [
    ["State", badge(op.state, op.state === "MANUAL_REVIEW" ? "no" : "")],
    ["Entity", el("code", {}, op.entity_id)],
    ["Type", op.operation_type],
    ["Partition", op.partition],
    ["Outcome", v ? badge(v.outcome, `outcome-${v.outcome}`) : "–"],
    ["Recommended", v ? v.action : "–"],
    ["In review since", op.review_since ? `${when(op.review_since)} (${humanAge(Date.now() - op.review_since)})` : "–"],
    ["Deadline", when(op.deadline_at)],
    ["Follow-up", op.follow_up ? `${op.follow_up.action} at ${when(op.follow_up.at)}` : "–"],
    ["Next attempt", op.next_attempt_at ? `scheduled for ${when(op.next_attempt_at)}` : "–"],
    ["Requeued", op.requeues ? `${op.requeues} time${op.requeues === 1 ? "" : "s"} automatically` : "–"],
    ["Superseded by", op.superseded_by ? el("code", {}, `${op.superseded_by.operation_id} (version ${op.superseded_by.expected_version ?? "–"})`) : "–"],
  ]);
  $("d-reason").textContent = v ? v.reason : "No verdict yet.";

  const ex = op.expected || {};
  const ob = op.observed || {};
  const row = (name, e, o, compare) => {
    const differs = compare && e !== null && e !== undefined && o !== null && o !== undefined && String(e) !== String(o);
    return el("tr", {}, el("th", {}, name), el("td", {}, e ?? "–"), el("td", { class: differs ? "diff" : "" }, o ?? "–"));
  };
  $("d-evidence").replaceChildren(
    el("tr", {}, el("th", {}, ""), el("th", {}, "expected"), el("th", {}, "observed")),
    row("version", ex.version, ob.version, true),
    row("fingerprint", ex.fingerprint, ob.fingerprint, true),
    row("remote ids", null, (ob.remote_ids || []).join(", ") || null),
    row("attempts", ex.max_attempts !== undefined ? `at most ${ex.max_attempts}` : null, ob.attempts),
    row("destination", ex.destination, null),
    row("idempotency key", ex.idempotency_key, null),
    row("idempotent", ex.idempotent === undefined ? null : (ex.idempotent ? "yes" : "no"), null),
    row("requested at", ex.requested_at ? when(ex.requested_at) : null, null),
    row("last event at", null, when(ob.last_event_at)),
  );
  const c = op.counts || {};
  facts($("d-counts"), [
    ["events applied", c.events_applied],
    ["duplicates seen", c.duplicates_seen],
    ["out of order", c.out_of_order_seen],
    ["held now", c.held_now],
    ["verdicts", c.verdicts],
  ]);

  const tl = op.timeline || [];
  $("d-timeline-note").textContent = `${tl.length} record${tl.length === 1 ? "" : "s"} in arrival order` +
    (op.timeline_dropped ? ` (${op.timeline_dropped} earlier ones not kept)` : "");
  $("d-timeline").replaceChildren(...tl.map((t) => {
    const notes = [el("span", { class: "note" }, t.summary || t.body)];
    if (t.manual) notes.push(el("span", { class: "note" }, `${t.manual.actor} decided ${t.manual.decision}: ${t.manual.note}`));
    for (const a of t.anomalies || []) notes.push(el("span", { class: "note anomaly" }, `⚠ ${a.kind}: ${a.detail}`));
    for (const vd of t.verdicts || []) notes.push(el("span", { class: "note verdict" }, `→ ${vd.outcome} / ${vd.action} (${vd.state}): ${vd.reason}`));
    const delivery = t.deliveries > 1 ? ` · delivery ${t.delivery} of ${t.deliveries}` : "";
    return el("tr", { class: t.delivery > 1 ? "dup" : "" },
      el("td", {}, t.ordinal),
      el("td", { class: "mono" }, `p${t.partition} @ ${t.offset}`),
      el("td", {}, el("code", {}, t.body), el("span", { class: "note muted" }, `${t.event_id}${delivery}`)),
      el("td", {}, t.seq ?? "–"),
      el("td", {}, when(t.occurred_at)),
      el("td", {}, t.producer),
      el("td", {}, t.disposition + (t.still_held ? " (waiting)" : "")),
      el("td", {}, ...notes));
  }));

  const allowed = op.allowed_decisions || [];
  const sel = $("r-decision");
  // No decision is preselected: publishing one is a deliberate choice.
  const recommended = op.last_verdict ? op.last_verdict.action : null;
  sel.replaceChildren(el("option", { value: "" }, "choose…"),
    ...allowed.map((d) => el("option", { value: d }, d === recommended ? `${d} (recommended)` : d)));
  const off = $("resolve-off");
  off.hidden = allowed.length !== 0;
  off.textContent = allowed.length ? "" : `No decision is possible in state ${op.state}: only open operations (not yet confirmed, compensated or closed) can be resolved.`;
  $("r-submit").disabled = allowed.length === 0;
  $("r-submit").hidden = allowed.length === 0;
  $("resolve-fields").hidden = allowed.length === 0;
  $("resolve").dataset.operationId = op.operation_id;
  state.verdictOf[op.operation_id] = v ? v.verdict_id : null;
}

// ---- resolving -------------------------------------------------------------

async function submitResolve(ev) {
  ev.preventDefault();
  const form = $("resolve");
  const id = form.dataset.operationId;
  const token = $("r-token").value.trim();
  const actor = $("r-actor").value.trim();
  keepToken(token);
  localStorage.setItem("reconciler.actor", actor);
  const result = $("resolve-result");
  const payload = {
    decision: $("r-decision").value,
    actor,
    note: $("r-note").value.trim(),
    evidence_checked: $("r-evidence").value.split(",").map((s) => s.trim()).filter(Boolean),
  };
  if (!token) {
    result.replaceChildren(el("div", { class: "error" }, "Enter the API token (http.token) to publish a decision."));
    return;
  }
  $("r-submit").disabled = true;
  result.replaceChildren(el("div", { class: "muted" }, "Publishing…"));
  try {
    const r = await getJson(scoped(`/api/operations/${encodeURIComponent(id)}/resolve`), {
      method: "POST",
      headers: { "Content-Type": "application/json", "Authorization": `Bearer ${token}` },
      body: JSON.stringify(payload),
    });
    result.replaceChildren(el("div", { class: "success" },
      `Decision ${payload.decision} published (event ${r.event_id}, partition ${r.partition}). Waiting for the pipeline to apply it…`));
    const after = await waitForChange(id, state.verdictOf[id]);
    if (after) {
      const v = after.last_verdict;
      result.replaceChildren(el("div", { class: "success", id: "resolve-applied" },
        `Applied: the operation is now ${after.state}` + (v ? `, verdict ${v.outcome} / ${v.action}: ${v.reason}` : ".")));
      renderOperation(after);
    } else {
      result.append(el("div", { class: "muted" }, "Not applied yet; the queue refreshes on its own."));
    }
    $("r-note").value = "";
    await loadQueue();
  } catch (e) {
    const hint = e.status === 401 ? " Check the token." : e.status === 403 ? "" : "";
    result.replaceChildren(el("div", { class: "error" }, `Not published: ${e.message}.${hint}`));
  } finally {
    $("r-submit").disabled = false;
  }
}

/** Polls the operation until a new verdict (the decision's) replaces `before` (at most ~15 s). */
async function waitForChange(id, before) {
  for (let i = 0; i < 30; i++) {
    await new Promise((r) => setTimeout(r, 500));
    try {
      const op = await getJson(scoped(`/api/operations/${encodeURIComponent(id)}`));
      const now = op.last_verdict ? op.last_verdict.verdict_id : null;
      if (now !== before) return op;
    } catch (_) { /* keep trying */ }
  }
  return null;
}

// ---- tabs ------------------------------------------------------------------

function showTab(tab) {
  state.tab = tab;
  for (const b of document.querySelectorAll(".tabs button")) b.setAttribute("aria-selected", String(b.dataset.tab === tab));
  $("queue-section").hidden = tab !== "review";
  $("detail").hidden = tab !== "review" || !state.selected;
  $("dlq-section").hidden = tab !== "dlq";
  history.replaceState(null, "", tab === "dlq" ? "#dlq" : location.pathname + location.search);
  if (tab === "dlq") loadDlq();
}

// ---- dead letters ----------------------------------------------------------

async function loadDlq() {
  // Only the latest request is shown: a slow answer to an older one (the
  // periodic refresh) must not overwrite the reload after a re-drive.
  const mine = ++state.dlqRequest;
  let d;
  try {
    d = await getJson("/api/dlq?samples=200");
  } catch (e) {
    if (mine === state.dlqRequest) showError("dlq-error", `Could not load the dead letters: ${e.message}.${authHint(e)}`);
    return;
  }
  if (mine !== state.dlqRequest) return;
  showError("dlq-error", null);
  state.dlq = d;
  renderDlq(state.dlq);
  $("dlq-updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
}

function classTable(id, rows, now) {
  $(id).replaceChildren(...(rows.length ? [el("tr", {}, el("th", {}, "class"), el("th", {}, "waiting"), el("th", {}, "oldest"))] : []),
    ...rows.map((c) => el("tr", {}, el("td", {}, badge(c.class || "–")), el("td", {}, c.count),
      el("td", { title: when(c.oldest_ms) }, c.oldest_ms ? humanAge(now - c.oldest_ms) : "–"))));
}

function renderDlq(d) {
  // The periodic refresh must not lose what the person selected.
  const kept = selectedLetters();
  const now = d.now_ms;
  const k = d.kafka || {};
  showError("dlq-kafka-error", k.error ? `The DLQ topic could not be read: ${k.error}` : null);
  $("dlq-topic").textContent = k.topic || "";
  $("dlq-counts").textContent = k.error ? "" : `${k.waiting} waiting` + (k.redriven ? `, ${k.redriven} re-driven` : "") +
    (k.oldest_waiting_ms ? ` · oldest ${humanAge(now - k.oldest_waiting_ms)}` : "");
  classTable("dlq-classes", k.by_class || [], now);
  const letters = k.samples || [];
  $("dlq-body").replaceChildren(...letters.map((l) => {
    const src = l.source || {};
    const box = el("input", { type: "checkbox", "data-position": `${l.partition}:${l.offset}`, "aria-label": `select ${l.partition}/${l.offset}` });
    box.checked = kept.positions.includes(`${l.partition}:${l.offset}`);
    if (l.truncated_from) { box.disabled = true; box.title = `value truncated from ${l.truncated_from} bytes: cannot be re-driven`; }
    return el("tr", { "data-position": `${l.partition}:${l.offset}` },
      el("td", {}, box),
      el("td", { class: "mono" }, `${l.partition}/${l.offset}`),
      el("td", { title: when(l.timestamp) }, l.timestamp ? humanAge(now - l.timestamp) : "–"),
      el("td", {}, badge(l.class)),
      el("td", {}, el("code", {}, l.key ?? "null")),
      el("td", { class: "mono" }, `${src.topic}/${src.partition ?? "?"}/${src.offset ?? "?"}`, el("span", { class: "note muted" }, when(src.timestamp))),
      el("td", { class: "cause" }, l.message, l.redriven_from ? el("span", { class: "note muted" }, `re-driven before, from ${l.redriven_from}`) : null),
      el("td", {}, ...(l.headers || []).map(([hk, hv]) => el("span", { class: "note mono" }, `${hk} = ${hv ?? "null"}`))));
  }));
  $("dlq-letters").hidden = letters.length === 0;
  $("dlq-empty").hidden = letters.length !== 0 || !!k.error;

  const ob = d.outbox || {};
  const off = $("ob-off");
  off.hidden = !!ob.available;
  off.textContent = ob.available ? "" : `Not shown: ${ob.reason || "the outbox is not reachable from this instance"}.`;
  $("ob-counts").textContent = ob.available ? `${ob.dead_letters} dead letter${ob.dead_letters === 1 ? "" : "s"}, ${ob.pending} pending` +
    (ob.oldest_dead_letter_ms ? ` · oldest ${humanAge(now - ob.oldest_dead_letter_ms)}` : "") : "";
  classTable("ob-classes", ob.available ? ob.by_class : [], now);
  const rows = ob.available ? ob.samples : [];
  const obBox = (r) => {
    const box = el("input", { type: "checkbox", "data-id": r.id, "aria-label": `select row ${r.id}` });
    box.checked = kept.ids.includes(r.id);
    return box;
  };
  $("ob-body").replaceChildren(...rows.map((r) => el("tr", { "data-id": r.id },
    el("td", {}, obBox(r)),
    el("td", { class: "mono" }, r.id),
    el("td", { title: when(r.created_at_ms) }, humanAge(now - r.created_at_ms)),
    el("td", {}, badge(r.class)),
    el("td", {}, el("code", {}, r.entity_id)),
    el("td", {}, el("code", {}, r.event_id ?? "undecodable"), el("span", { class: "note muted" }, `${r.operation_id ?? ""} · ${r.event_bytes} B`)),
    el("td", {}, r.attempts),
    el("td", { class: "cause" }, r.last_error))));
  $("ob-letters").hidden = rows.length === 0;
  $("ob-empty").hidden = rows.length !== 0 || !ob.available;

  const audit = [
    ...(k.audit || []).map((a) => ({ at: a.at_ms, actor: a.actor, place: "DLQ", what: `${a.dead_letter} (${a.class}, key ${a.key ?? "null"}) → ${a.to_topic}` +
      (a.state === "sending" ? " (cut short before the broker acknowledged it: re-drive it by position to be sure)" : ""), note: a.note })),
    ...(ob.available ? ob.audit : []).map((a) => ({ at: a.at_ms, actor: a.actor, place: "outbox", what: `row ${a.outbox_id} (${a.last_error ?? ""})`, note: a.note })),
  ].sort((a, b) => b.at - a.at);
  $("audit-body").replaceChildren(...audit.map((a) => el("tr", {},
    el("td", {}, when(a.at)), el("td", {}, a.actor), el("td", {}, a.place), el("td", { class: "mono" }, a.what), el("td", {}, a.note))));
  $("dlq-audit").hidden = audit.length === 0;
  $("audit-empty").hidden = audit.length !== 0;

  $("dlq-all").checked = false;
  $("ob-all").checked = false;
  const waitingAll = (k.waiting || 0) + (ob.available ? ob.dead_letters : 0);
  $("dlq-badge").hidden = waitingAll === 0;
  $("dlq-badge").textContent = String(waitingAll);
  $("dlq-badge").className = `badge ${waitingAll ? "no" : ""}`;
  countSelected();
}

function selectedLetters() {
  return {
    positions: [...document.querySelectorAll("#dlq-body input:checked")].map((c) => c.dataset.position),
    ids: [...document.querySelectorAll("#ob-body input:checked")].map((c) => Number(c.dataset.id)),
  };
}

function countSelected() {
  const { positions, ids } = selectedLetters();
  const n = positions.length + ids.length;
  $("rd-selected").textContent = n ? `(${n} selected)` : "(select dead letters above)";
}

async function submitRedrive(dry) {
  const token = $("rd-token").value.trim();
  const actor = $("rd-actor").value.trim();
  const note = $("rd-note").value.trim();
  keepToken(token);
  localStorage.setItem("reconciler.actor", actor);
  const result = $("redrive-result");
  const { positions, ids } = selectedLetters();
  const fail = (msg) => result.replaceChildren(el("div", { class: "error" }, msg));
  if (!positions.length && !ids.length) return fail("Select the dead letters to re-drive.");
  if (!actor) return fail("Say who re-drives (Actor): it goes to the audit.");
  if (!token) return fail("Enter the API token (http.token) to re-drive.");
  const headers = { "Content-Type": "application/json", "Authorization": `Bearer ${token}` };
  const verb = dry ? "would be re-driven" : "re-driven";
  const lines = [];
  $("rd-submit").disabled = true;
  $("rd-dry").disabled = true;
  try {
    if (positions.length) {
      const r = await getJson("/api/dlq/redrive", { method: "POST", headers, body: JSON.stringify({ positions, actor, note, dry_run: dry }) });
      const skipped = r.items.filter((i) => i.skipped).map((i) => `${i.dlq_partition}/${i.dlq_offset}: ${i.skipped}`);
      lines.push(`DLQ: ${r.sent} ${verb}` + (skipped.length ? `, ${skipped.length} skipped (${skipped.join("; ")})` : ""));
    }
    if (ids.length) {
      const r = await getJson("/api/dlq/outbox/redrive", { method: "POST", headers, body: JSON.stringify({ ids, actor, note, dry_run: dry }) });
      lines.push(`outbox: ${r.ids.length} row${r.ids.length === 1 ? "" : "s"} ${verb} (${r.ids.join(", ")})`);
    }
    result.replaceChildren(el("div", { class: dry ? "muted" : "success", id: dry ? "redrive-dry" : "redrive-done" },
      lines.join("; ") + (dry ? ". Dry run: nothing was sent." : `, by ${actor}.`)));
    if (!dry) await loadDlq();
  } catch (e) {
    fail(`${lines.length ? lines.join("; ") + "; but " : ""}not re-driven: ${e.message}.${e.status === 401 ? " Check the token." : ""}`);
  } finally {
    $("rd-submit").disabled = false;
    $("rd-dry").disabled = false;
  }
}

// ---- wiring ----------------------------------------------------------------

async function refresh() {
  loadReady();
  await loadFleet();
  await loadQueue();
  if (state.tab === "dlq") await loadDlq();
}

document.addEventListener("DOMContentLoaded", async () => {
  keepToken(apiToken());
  $("r-actor").value = localStorage.getItem("reconciler.actor") || "";
  $("token-form").addEventListener("submit", (ev) => { ev.preventDefault(); keepToken($("token").value.trim()); refresh(); });
  $("rd-actor").value = $("r-actor").value;
  for (const b of document.querySelectorAll(".tabs button")) b.addEventListener("click", () => showTab(b.dataset.tab));
  $("dlq-body").addEventListener("change", countSelected);
  $("ob-body").addEventListener("change", countSelected);
  for (const [all, body] of [["dlq-all", "dlq-body"], ["ob-all", "ob-body"]]) {
    $(all).addEventListener("change", () => {
      for (const c of document.querySelectorAll(`#${body} input:not([disabled])`)) c.checked = $(all).checked;
      countSelected();
    });
  }
  $("redrive").addEventListener("submit", (ev) => { ev.preventDefault(); submitRedrive(false); });
  $("rd-dry").addEventListener("click", () => submitRedrive(true));
  for (const id of ["filter-type", "filter-outcome", "filter-age"]) $(id).addEventListener("change", renderQueue);
  $("filter-waiting").addEventListener("change", loadQueue);
  $("sort-age").addEventListener("click", () => {
    state.sortDesc = !state.sortDesc;
    $("sort-arrow").textContent = state.sortDesc ? "▼" : "▲";
    renderQueue();
  });
  $("refresh").addEventListener("click", refresh);
  $("close-detail").addEventListener("click", () => { $("detail").hidden = true; state.selected = null; renderQueue(); });
  $("resolve").addEventListener("submit", submitResolve);
  const params = new URLSearchParams(location.search);
  if (location.hash === "#dlq") showTab("dlq");
  await refresh();
  setInterval(refresh, 15000);
  if (params.get("op")) openOperation(params.get("op"));
});
