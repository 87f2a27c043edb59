"""The console's pages: PAGE (broker/console/api.py serves it), one HTML
document with its script and styles inline and charts drawn as SVG, so the
node serves it offline with nothing to build; and LOGIN_PAGE, the form
that trades the token for a session (broker/console/login.py).

PAGE polls the console's JSON endpoints every 2 s (topics, each with its
pause and the age of its oldest due message, the forecast
with recurring schedules' coming runs folded in, the schedules' list,
lateness, throughput, subscriptions, the node) and makes its API calls
(dead letters, re-drive, lookups, the search by key, tag, msgId prefix,
status or time range with its count, and bulk cancel and shift of the
matches, each behind a confirmation; re-drive by filter as a redriveMsgs
job, and the jobs' list, read again every second while one runs, with
cancel; the selected topic's pause, what a resume will release, and pause
and resume, each behind a confirmation) through the console's paths: the
session cookie authenticates every one; the page keeps nothing in the
browser's storage. Any answer 401 (the session expired or was ended)
sends the browser to the login form."""

LOGIN_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>hourglass console: log in</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body{font:14px system-ui,sans-serif;margin:0;background:#f6f7f9;color:#1d2733}
form{max-width:360px;margin:80px auto;background:#fff;border:1px solid #dde1e6;border-radius:6px;padding:18px}
h1{font-size:18px;margin:0 0 12px}input,button{font:inherit;padding:4px 8px}input{width:100%;box-sizing:border-box;margin:6px 0 10px}
.error{color:#b91c1c}
</style></head><body>
<form method="post" action="/console/login"><h1>hourglass console</h1>
<!--message-->
<label for="token">API token (the node's --auth-token-file)</label>
<input id="token" name="token" type="password" autocomplete="off" autofocus required>
<button type="submit">log in</button></form>
</body></html>
"""

PAGE = r"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>hourglass console</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body{font:14px system-ui,sans-serif;margin:0;background:#f6f7f9;color:#1d2733}
header{background:#1d2733;color:#fff;padding:10px 18px;display:flex;gap:18px;align-items:baseline}
header h1{font-size:18px;margin:0}header span{opacity:.8}
main{display:grid;grid-template-columns:minmax(380px,1fr) 2fr;gap:14px;padding:14px}
section{background:#fff;border:1px solid #dde1e6;border-radius:6px;padding:10px 14px}
h2{font-size:15px;margin:4px 0 8px}table{border-collapse:collapse;width:100%}
td,th{padding:3px 6px;border-bottom:1px solid #eef0f3;text-align:right}td:first-child,th:first-child{text-align:left}
tr.sel{background:#e8f0fe}tr[data-topic]{cursor:pointer}.wide{grid-column:1/3}
svg{width:100%;height:160px;background:#fbfcfd}.bar{fill:#3b82f6}.over{fill:#ef4444}.now{stroke:#ef4444;stroke-width:2}
.muted{color:#6b7785}.paused{color:#b45309;font-weight:600}input,button{font:inherit;padding:3px 6px}pre{white-space:pre-wrap;margin:4px 0}
</style></head><body>
<header><h1>hourglass</h1><span id="node">…</span><span id="clock"></span>
<form method="post" action="/console/logout" style="margin-left:auto"><button id="logout">log out</button></form></header>
<main>
<section><h2>Topics <span class="muted" id="topicCount"></span></h2>
<input id="prefix" placeholder="filter by prefix"> <button id="prev">‹</button><button id="next">›</button>
<table id="topics"><thead><tr><th>topic</th><th>waiting</th><th title="due, not handed out: a paused topic's held backlog">ready</th><th>consuming</th><th>dead</th><th>paused</th><th title="how long ago the oldest ready message fell due">oldest due</th><th title="how long ago the consuming message held longest was handed over (leases extended by extendMsg)">longest held</th></tr></thead><tbody></tbody></table>
<div id="flow"><h2>Pause <span class="muted" id="flowTopic">(pick a topic)</span></h2>
<div id="flowInfo" class="muted"></div>
<span id="flowControls" hidden>on resume <select id="flowOnResume"><option value="hold">hold: hand out what fell due</option><option value="shift">shift: move what fell due by the pause's length</option></select>
<button id="pause">pause</button> <button id="resume">resume</button></span></div></section>
<section><h2>Forecast: due per second, next hour <span class="muted" id="fcTopic">(all topics)</span></h2>
<svg id="perSecond" preserveAspectRatio="none"></svg>
<h2>Due per minute, next 24 h <span class="muted" id="fcInfo"></span></h2>
<svg id="perMinute" preserveAspectRatio="none"></svg></section>
<section><h2>Release lateness <span class="muted">under load</span></h2><svg id="lateness" preserveAspectRatio="none"></svg><div class="muted" id="latInfo"></div></section>
<section><h2>Throughput, last 15 min (per 10 s)</h2><svg id="throughput" preserveAspectRatio="none"></svg>
<div class="muted">blue: sends · green: pulls · orange: acks</div></section>
<section class="wide"><h2>Dead letters <span class="muted" id="deadTopic"></span></h2>
<button id="redriveAll">re-drive all</button> <button id="deadMore">next page</button>
<table id="dead"><thead><tr><th>msgId</th><th>status</th><th>retry</th><th>ended by</th><th></th></tr></thead><tbody></tbody></table>
<h2>Re-drive by filter</h2>
<input id="rdKey" placeholder="key"> <input id="rdTag" placeholder="tag"> <input id="rdPrefix" placeholder="msgId prefix">
<select id="rdStatus"><option value="5,6">status 5 and 6</option><option value="5">5: expired</option><option value="6">6: ended</option></select>
<span title="each message's expireTime (triggerTime + ttl): it keeps no other end time">ended from</span>
<input id="rdFrom" type="datetime-local"> to <input id="rdTo" type="datetime-local"><br>
due in <input id="rdDelay" type="number" min="0" size="6" placeholder="0"> s or at <input id="rdAt" type="datetime-local">
at most <input id="rdRate" type="number" min="0" size="8" placeholder="any rate"> a second
<button id="redriveFilter">re-drive matches</button> <span id="rdDone" class="muted"></span>
<h2>Jobs <span class="muted" id="jobsInfo"></span></h2>
<table id="jobs"><thead><tr><th>jobId</th><th>topic</th><th>filter</th><th>due</th><th>rate/s</th><th>state</th><th>matched</th><th>redriven</th><th>skipped</th><th>started</th><th>ended</th><th></th></tr></thead><tbody></tbody></table></section>
<section class="wide"><h2>Search <span class="muted" id="srTopic">(pick a topic)</span></h2>
<input id="srKey" placeholder="key"> <input id="srTag" placeholder="tag"> <input id="srPrefix" placeholder="msgId prefix">
<input id="srStatus" placeholder="status (1,2,3)" size="10"> from <input id="srFrom" type="datetime-local"> to <input id="srTo" type="datetime-local">
<button id="search">search</button> <button id="srMore">next page</button>
<span id="srCount" class="muted"></span><br>
<button id="bulkCancel">cancel all matches</button> shift by <input id="srShift" type="number" value="60" size="6"> min
<button id="bulkShift">shift all matches</button> <span id="srDone" class="muted"></span>
<table id="srTable"><thead><tr><th>msgId</th><th>status</th><th>triggers</th><th>key</th><th>tag</th></tr></thead><tbody></tbody></table></section>
<section><h2>Push subscriptions</h2>
<table id="subs"><thead><tr><th>topic</th><th>url</th><th>signed</th><th>concurrency</th><th>rate/s</th><th>delivered</th><th>failed</th><th>in flight</th><th>backing off</th><th>last error</th></tr></thead><tbody></tbody></table></section>
<section class="wide"><h2>Recurring schedules <span class="muted" id="schCount"></span></h2>
<table id="schedules"><thead><tr><th>topic</th><th>scheduleId</th><th>when</th><th>next fires</th><th>last run</th><th>last outcome</th><th>lateness (last · mean)</th><th>released</th><th>missed</th><th>paused</th></tr></thead><tbody></tbody></table></section>
<section><h2>Node</h2><table id="nodeTable"><tbody></tbody></table>
<h2>Message lookup</h2><input id="lkTopic" placeholder="topic"> <input id="lkId" placeholder="msgId"> <button id="lookup">get</button>
<pre id="lkOut" class="muted"></pre></section>
</main>
<script>
"use strict";
const API = "/console/api/";  // the API calls too: the session cookie is sent to /console paths only
let offset = 0, selected = null, deadCursor = null;
const $ = id => document.getElementById(id);
const esc = s => String(s).replace(/[&<>"]/g, c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"}[c]));
function answered(r) { if (r.status === 401) location.assign("/console/login"); return r.json(); }
async function get(path) { return answered(await fetch(path, {credentials: "same-origin"})); }
async function post(path, form) {
  // X-Hourglass-Console: a page of another origin cannot send it without the node's consent (CORS)
  return answered(await fetch(API + path, {method: "POST", credentials: "same-origin", body: new URLSearchParams(form),
    headers: {"Content-Type": "application/x-www-form-urlencoded", "X-Hourglass-Console": "1"}}));
}
function bars(svg, values, opts = {}) {
  const w = 1000, h = 160, n = values.length, max = Math.max(1, ...values);
  let out = `<svg viewBox="0 0 ${w} ${h}" preserveAspectRatio="none">`;
  values.forEach((v, i) => { if (v > 0) { const bh = Math.max(1, v / max * (h - 14));
    out += `<rect class="bar ${opts.cls ? opts.cls(i) : ""}" x="${i * w / n}" y="${h - bh}" width="${Math.max(w / n, 0.6)}" height="${bh}"><title>${opts.label ? esc(opts.label(i)) : i}: ${v}</title></rect>`; } });
  if (opts.now !== undefined) out += `<line class="now" x1="${opts.now}" x2="${opts.now}" y1="0" y2="${h}"/>`;
  out += `<text x="4" y="12" font-size="11" fill="#6b7785">max ${max}</text></svg>`;
  svg.outerHTML = out.replace("<svg ", `<svg id="${svg.id}" `);
}
function lines(svg, series, keys, colors) {
  const w = 1000, h = 160, n = Math.max(1, series.length - 1);
  const max = Math.max(1, ...series.flatMap(p => keys.map(k => p[k])));
  let out = `<svg id="${svg.id}" viewBox="0 0 ${w} ${h}" preserveAspectRatio="none">`;
  keys.forEach((k, j) => { const pts = series.map((p, i) => `${i * w / n},${h - p[k] / max * (h - 14)}`).join(" ");
    out += `<polyline fill="none" stroke="${colors[j]}" stroke-width="2" points="${pts}"/>`; });
  svg.outerHTML = out + `<text x="4" y="12" font-size="11" fill="#6b7785">max ${max}</text></svg>`;
}
async function topics() {
  const d = await get(`${API}topics?offset=${offset}&limit=50&prefix=${encodeURIComponent($("prefix").value)}`);
  if (d.code !== 200) { $("topicCount").textContent = d.msg; return; }
  $("topicCount").textContent = `${d.total} topics, from ${d.offset + 1}`;
  $("topics").tBodies[0].innerHTML = d.topics.map(t => `<tr data-topic="${esc(t.topic)}" class="${t.topic === selected ? "sel" : ""}">` +
    `<td>${esc(t.topic)}</td><td>${t.waiting}</td><td>${t.ready}</td><td>${t.consuming}</td><td>${t.dead}</td>` +
    `<td class="paused">${t.paused === true ? "⏸ paused" : t.paused ? `⏸ ${t.paused.length} key${t.paused.length > 1 ? "s" : ""}` : ""}</td>` +
    `<td>${t.oldestDueAgeMillis ? age(t.oldestDueAgeMillis) : t.ready ? "—" : ""}</td>` +
    `<td>${t.longestHeldMillis ? age(t.longestHeldMillis) : t.consuming ? "—" : ""}</td></tr>`).join("");
}
const age = ms => ms < 1000 ? `${ms} ms` : ms < 120000 ? `${(ms / 1000).toFixed(1)} s` : ms < 7200000 ? `${Math.round(ms / 60000)} min` : `${(ms / 3600000).toFixed(1)} h`;
let fellDue = {};  // the last count of what fell due while the selected topic was paused
async function flow() {  // the selected topic's pause, and what a resume will release
  $("flowControls").hidden = !selected;
  if (!selected) { $("flowTopic").textContent = "(pick a topic)"; $("flowInfo").textContent = ""; return; }
  const [c, info] = await Promise.all([get(API + "getTopicConfig?topic=" + encodeURIComponent(selected)),
                                       get(API + "topics?limit=20&prefix=" + encodeURIComponent(selected))]);
  $("flowTopic").textContent = `(${selected})`;
  if (c.code !== 200) { $("flowInfo").textContent = c.msg; $("flowControls").hidden = true; return; }
  const s = c.data, row = (info.topics || []).find(t => t.topic === selected) || {ready: 0};
  const keys = s.pausedKeys.length ? ` · ${s.pausedKeys.length} paused key${s.pausedKeys.length > 1 ? "s" : ""}: ` +
    s.pausedKeys.slice(0, 5).map(k => k.key).join(", ") + (s.pausedKeys.length > 5 ? ", …" : "") : "";
  if (!s.pause) { $("flowInfo").textContent = "not paused" + keys; return; }
  const p = s.pause, now = Date.now();
  let text = `⏸ paused since ${new Date(p.pausedAt).toLocaleString()} (on resume: ${p.onResume})${keys}. ` +
    `Held: ${row.ready} due, not handed out` + (row.oldestDueAgeMillis ? `, the oldest for ${age(row.oldestDueAgeMillis)}` : "") + ".";
  if (p.onResume === "hold") text += ` A resume hands out all ${row.ready}.`;
  else {  // shift (and expire): what fell due while paused, a count by listMsg (the node's bulk scan, in slices)
    if (fellDue.topic !== selected || fellDue.since !== p.pausedAt || now - fellDue.at >= 10000) {  // counted every 10 s at most
      const n = await get(API + "listMsg?" + new URLSearchParams({topic: selected, status: "1,2", triggerFrom: String(p.pausedAt),
                                                                  triggerTo: String(Math.max(now, p.pausedAt + 1)), countOnly: "true"}));
      fellDue = {topic: selected, since: p.pausedAt, at: now, n: n.code === 200 ? n.count : "?"};
    }
    const fell = fellDue.n;
    text += p.onResume === "shift"
      ? ` A resume moves the ${fell} that fell due while paused by the pause's length (${age(now - p.pausedAt)} now) and hands out the rest at once.`
      : ` A resume ends the ${fell} that fell due while paused (status 5) and hands out the rest.`;
  }
  $("flowInfo").textContent = text;
}
$("pause").onclick = async () => { if (selected && confirm(`pause ${selected}? Nothing of it is handed out until resumed.`)) {
  const d = await post("pauseTopic", {topic: selected, onResume: $("flowOnResume").value});
  if (d.code !== 200) $("flowInfo").textContent = d.msg; else { fellDue = {}; flow(); topics(); } } };
$("resume").onclick = async () => { if (selected && confirm(`resume ${selected}?`)) {
  const d = await post("resumeTopic", {topic: selected});
  if (d.code !== 200) $("flowInfo").textContent = d.msg; else { flow(); topics(); } } };
async function forecastAll() {
  const d = await get(API + "forecast" + (selected ? "?topic=" + encodeURIComponent(selected) : ""));
  if (d.code !== 200) return;
  if (selected) {
    $("fcTopic").textContent = `(${selected}: per hour, next 24 h)`;
    bars($("perSecond"), d.perHour, {label: i => `+${i} h`, now: 0});
    bars($("perMinute"), [d.overdue, ...d.perHour], {cls: i => i === 0 ? "over" : "", label: i => i ? `+${i - 1} h` : "overdue"});
  } else {
    $("fcTopic").textContent = "(all topics)";
    bars($("perSecond"), d.perSecond, {label: i => new Date(d.secondStartMs + i * 1000).toLocaleTimeString(), now: 0});
    bars($("perMinute"), [d.overdue, ...d.perMinute], {cls: i => i === 0 ? "over" : "",
      label: i => i ? new Date(d.minuteStartMs + (i - 1) * 60000).toLocaleTimeString() : "overdue (ready now)"});
  }
  $("fcInfo").textContent = `overdue ${d.overdue} · later than 24 h ${d.later}` +
    (d.scheduleRuns ? ` · of them, runs of recurring schedules not made yet: ${d.scheduleRuns}` + (d.scheduleRunsCut ? " (and more)" : "") : "");
}
async function stats() {
  const d = await get(API + "stats");
  if (d.code !== 200) return;
  const L = d.lateness;
  bars($("lateness"), L.counts, {label: i => i < L.bounds.length ? `≤ ${L.bounds[i] * 1000} ms` : `> ${L.bounds[L.bounds.length - 1]} s`});
  const S = d.smoothing;
  $("latInfo").textContent = `${L.count} released` + (L.count ? `, mean ${(L.sumSeconds / L.count * 1000).toFixed(1)} ms late` : "") +
    (S.count ? ` · releaseRate held ${S.count} back, mean ${(S.sumSeconds / S.count * 1000).toFixed(1)} ms (smoothing)` : "");
  if (d.throughput.length) lines($("throughput"), d.throughput, ["sends", "pulls", "acks"], ["#3b82f6", "#16a34a", "#f59e0b"]);
}
async function node() {
  const d = await get(API + "node");
  if (d.code !== 200) { $("node").textContent = d.msg; return; }
  $("node").textContent = d.role + (d.node ? " " + d.node : "") + (d.term !== undefined ? " · term " + d.term : "");
  if (d.insecure) $("node").textContent += " · ⚠ insecure cluster: no cluster secret";
  const rows = Object.entries(d).filter(([k]) => !["code", "msg", "followers"].includes(k));
  let html = rows.map(([k, v]) => `<tr><td>${esc(k)}</td><td>${esc(k.endsWith("Ms") && v ? new Date(v).toLocaleString() : v)}</td></tr>`).join("");
  for (const f of d.followers || []) html += `<tr><td>follower ${esc(f.node)}</td><td>lag ${f.lagBytes} B, seen ${f.seenAgoMs} ms ago</td></tr>`;
  $("nodeTable").tBodies[0].innerHTML = html;
}
async function subscriptions() {
  const d = await get(API + "subscriptions");
  if (d.code !== 200) return;
  $("subs").tBodies[0].innerHTML = d.subscriptions.map(s => { const h = s.health || {}; const failed = Object.entries(h.failures || {});
    return `<tr><td>${esc(s.topic)}</td><td>${esc(s.url)}</td><td>${s.signed ? "yes" : "no"}</td><td>${s.concurrency}</td>` +
      `<td>${s.rateLimit || "—"}</td><td>${h.deliveries || 0}</td><td>${esc(failed.map(([r, n]) => r + ": " + n).join(", ") || "0")}</td>` +
      `<td>${h.inFlight || 0}</td><td>${h.backingOff || 0}</td>` +
      `<td>${esc(h.lastError ? h.lastError + " (" + new Date(h.lastErrorTime).toLocaleTimeString() + ")" : "")}</td></tr>`; }).join("");
}
async function schedules() {
  const d = await get(API + "schedules?limit=100" + (selected ? "&topic=" + encodeURIComponent(selected) : ""));
  if (d.code !== 200) { $("schCount").textContent = d.msg; return; }
  $("schCount").textContent = d.total ? `${d.total}` + (d.total > d.schedules.length ? `, the first ${d.schedules.length}` : "") : "none";
  const when = s => s.cron !== null ? `${s.cron} (${s.timeZone})` : `every ${s.everyMillis / 1000} s`;
  const time = ms => new Date(ms).toLocaleString();
  $("schedules").tBodies[0].innerHTML = d.schedules.map(s => { const r = s.lastRun;
    const outcome = !r ? "—" : !r.missed ? "on time" : s.misfire === "skip" ? "missed, skipped" : "missed, delivered late";
    return `<tr data-schedule="${esc(s.scheduleId)}"><td>${esc(s.topic)}</td><td>${esc(s.scheduleId)}</td><td>${esc(when(s))}</td>` +
      `<td>${s.nextFireTimes.map(time).join("<br>") || "—"}</td><td>${r ? time(r.scheduledTime) : "—"}</td><td>${outcome}</td>` +
      `<td>${r ? r.latenessMillis + " ms" : "—"} · ${s.meanLatenessMillis === null ? "—" : s.meanLatenessMillis.toFixed(1) + " ms"}</td>` +
      `<td>${s.released}</td><td>${s.missed}</td><td>${s.paused ? "yes" : "no"}</td></tr>`; }).join("");
}
async function dead(reset) {
  if (!selected) { $("deadTopic").textContent = "(pick a topic)"; return; }
  if (reset) deadCursor = null;
  const q = "topic=" + encodeURIComponent(selected) + "&limit=20" + (deadCursor ? "&cursor=" + encodeURIComponent(deadCursor) : "");
  const d = await get(API + "listDeadMsg?" + q);
  if (d.code !== 200) { $("deadTopic").textContent = d.msg; return; }
  deadCursor = d.cursor; $("deadTopic").textContent = `(${selected})`;
  $("dead").tBodies[0].innerHTML = d.delayMsgList.map(m => `<tr><td>${esc(m.msgId)}</td><td>${m.status}</td><td>${m.retry}</td>` +
    `<td>${new Date(m.expireTime).toLocaleString()}</td><td><button data-redrive="${esc(m.msgId)}">re-drive</button></td></tr>`).join("");
}
function deadFilter() {  // the re-drive form's parameters, as redriveMsgs takes them
  const f = {topic: selected || ""}, ms = id => String(new Date($(id).value).getTime());
  for (const [id, name] of [["rdKey", "key"], ["rdTag", "tag"], ["rdPrefix", "msgIdPrefix"], ["rdStatus", "status"], ["rdRate", "rate"]])
    if ($(id).value) f[name] = $(id).value;
  if ($("rdFrom").value) f.endedFrom = ms("rdFrom");
  if ($("rdTo").value) f.endedTo = ms("rdTo");
  if ($("rdDelay").value) f.delayMillis = String(Math.round(Number($("rdDelay").value) * 1000));
  if ($("rdAt").value) f.triggerTime = ms("rdAt");
  return f;
}
let jobsTimer = null, jobsRunning = false;
async function jobs() {  // the node's jobs; again every second while one runs
  const d = await get(API + "getJob");
  if (d.code !== 200) { $("jobsInfo").textContent = d.msg; return; }
  const running = d.jobs.some(j => j.state === "running"), time = ms => ms === null ? "—" : new Date(ms).toLocaleString();
  const filter = f => [f.key !== null && "key " + f.key, f.tag !== null && "tag " + f.tag, f.msgIdPrefix !== null && "msgId " + f.msgIdPrefix + "…",
    "status " + f.status.join(","), f.endedFrom !== null && "ended from " + time(f.endedFrom), f.endedTo !== null && "ended before " + time(f.endedTo)]
    .filter(Boolean).join(" · ");
  $("jobsInfo").textContent = d.jobs.length ? `${d.jobs.length}` + (running ? " · refreshed every second while one runs" : "") : "none";
  $("jobs").tBodies[0].innerHTML = d.jobs.map(j => `<tr data-job="${esc(j.jobId)}" data-state="${esc(j.state)}"><td>${esc(j.jobId)}</td>` +
    `<td>${esc(j.topic)}</td><td>${esc(filter(j.filter))}</td><td>${j.triggerTime === null ? "when re-driven" : esc(time(j.triggerTime))}</td>` +
    `<td>${j.rate || "—"}</td><td>${esc(j.state + (j.error ? ": " + j.error : ""))}</td><td>${j.matched}</td><td>${j.redriven}</td>` +
    `<td>${j.skipped}</td><td>${esc(time(j.createTime))}</td><td>${esc(time(j.endTime))}</td>` +
    `<td>${j.state === "running" ? `<button data-cancel-job="${esc(j.jobId)}">cancel</button>` : ""}</td></tr>`).join("");
  if (jobsRunning && !running) { dead(true); topics(); }  // what they re-drove has left the dead letters
  jobsRunning = running;
  clearTimeout(jobsTimer);  // one timer however many calls overlap
  jobsTimer = running ? setTimeout(jobs, 1000) : null;
}
$("redriveFilter").onclick = async () => {
  if (!selected) { $("rdDone").textContent = "pick a topic"; return; }
  const f = deadFilter(), narrowed = ["key", "tag", "msgIdPrefix", "endedFrom", "endedTo"].some(k => k in f) || f.status !== "5,6";
  if (!confirm(`re-drive the matching dead letters of ${selected}?` + (narrowed ? "" : " (no filter: all of them)"))) return;
  const d = await post("redriveMsgs", f);
  if (d.code !== 200) { $("rdDone").textContent = d.msg; return; }
  $("rdDone").textContent = `job ${d.jobId} started`;
  jobsRunning = true;  // so that its end, however soon, reads the dead letters again
  jobs();
};
let srCursor = null;
function filters() {  // the search's filters, as listMsg, deleteMsgs and rescheduleMsgs take them
  const f = {topic: selected || ""};
  for (const [id, name] of [["srKey", "key"], ["srTag", "tag"], ["srPrefix", "msgIdPrefix"], ["srStatus", "status"]])
    if ($(id).value) f[name] = $(id).value;
  if ($("srFrom").value) f.triggerFrom = String(new Date($("srFrom").value).getTime());
  if ($("srTo").value) f.triggerTo = String(new Date($("srTo").value).getTime());
  return f;
}
async function search(reset) {
  if (!selected) { $("srTopic").textContent = "(pick a topic)"; return; }
  if (reset) srCursor = null;
  const f = filters(), q = new URLSearchParams({...f, limit: "20", ...(srCursor ? {cursor: srCursor} : {})});
  const [page, count] = await Promise.all([get(API + "listMsg?" + q), reset ? get(API + "listMsg?" + new URLSearchParams({...f, countOnly: "true"})) : null]);
  if (page.code !== 200) { $("srCount").textContent = page.msg; return; }
  if (count) $("srCount").textContent = `${count.count} match`;
  srCursor = page.cursor; $("srTopic").textContent = `(${selected})`;
  $("srTable").tBodies[0].innerHTML = page.delayMsgList.map(m => `<tr><td>${esc(m.msgId)}</td><td>${m.status}</td>` +
    `<td>${new Date(m.triggerTime).toLocaleString()}</td><td>${esc(m.key)}</td><td>${esc(m.tag)}</td></tr>`).join("");
}
async function bulk(call, extra, verb, field) {  // every match, in calls of the default limit, once confirmed
  const f = filters();
  if (!selected || !confirm(`${verb} every match in ${selected}?` + (Object.keys(f).length > 1 ? "" : " (no filter: all of it)"))) return;
  let done = 0, d = {more: true};
  while (d.more) {
    d = await post(call, {...f, ...extra, ...(Object.keys(f).length > 1 ? {} : {all: "true"})});
    if (d.code !== 200) { $("srDone").textContent = d.msg; return; }
    done += d[field];
    if (call === "rescheduleMsgs") break;  // a shift is made once: the moved may match again
  }
  $("srDone").textContent = `${verb}: ${done}` + (d.more ? " (more left)" : "");
  search(true); topics();
}
$("search").onclick = () => search(true);
$("srMore").onclick = () => search(false);
$("bulkCancel").onclick = () => bulk("deleteMsgs", {}, "cancelled", "deleted");
$("bulkShift").onclick = () => bulk("rescheduleMsgs", {shiftMillis: String(Number($("srShift").value) * 60000)}, "shifted", "rescheduled");
document.addEventListener("click", async e => {
  const row = e.target.closest("tr[data-topic]");
  if (row) { selected = row.dataset.topic === selected ? null : row.dataset.topic; $("lkTopic").value = selected || "";
             topics(); forecastAll(); dead(true); search(true); schedules(); jobs(); flow(); }
  if (e.target.dataset.redrive) { await post("redriveMsg", {topic: selected, msgId: e.target.dataset.redrive}); dead(true); topics(); }
  if (e.target.dataset.cancelJob) { const d = await post("cancelJob", {jobId: e.target.dataset.cancelJob});
    $("rdDone").textContent = d.code === 200 ? "" : d.msg; jobs(); }
});
$("redriveAll").onclick = async () => { if (selected && confirm(`re-drive every dead letter of ${selected}?`)) {
  const d = await post("redriveMsg", {topic: selected, all: "true"}); alert(`re-driven: ${d.redriven}` + (d.more ? " (more left)" : "")); dead(true); } };
$("deadMore").onclick = () => dead(false);
$("prev").onclick = () => { offset = Math.max(0, offset - 50); topics(); };
$("next").onclick = () => { offset += 50; topics(); };
$("prefix").oninput = () => { offset = 0; topics(); };
$("lookup").onclick = async () => { const d = await post("getMsg", {topic: $("lkTopic").value, msgId: $("lkId").value});
  $("lkOut").textContent = JSON.stringify(d.delayMsg || d, null, 1); };
async function tick() {
  $("clock").textContent = new Date().toLocaleTimeString();
  await Promise.all([topics(), forecastAll(), stats(), node(), subscriptions(), schedules(), flow()]);
  document.body.dataset.loaded = "1";
}
tick(); setInterval(tick, 2000); jobs();
</script></body></html>
"""
