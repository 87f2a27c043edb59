"""The built-in console: `GET /console`, and the JSON endpoints it draws from.

The page (broker/console/page.py: plain HTML, JS and SVG, no external
file, so it works offline) polls these, which scripts may use as well;
every one is GET, answers `{"code": 200, "msg": "success", ...}`, and is
behind the node's bearer token like the API:

    /console/api/topics?offset=&limit=&prefix=
        {"total", "offset", "topics": [{"topic", "waiting", "ready",
        "consuming", "dead", "paused", "oldestDueAgeMillis",
        "longestHeldMillis"}]}: topics by
        name, a page of at most 500 (counts: the per-hour, per-topic
        counts; dead = status 5 + 6 still retained; ready: due, not handed
        out, a paused topic's held backlog; paused: getTopicInfo's, true,
        the paused keys, or false; oldestDueAgeMillis and
        longestHeldMillis: getTopicInfo's, of the first AGED_ROWS rows
        with ready or consuming messages, else null -- and null on a node
        no broker serves, a cluster follower; longestHeldMillis null on
        Redis too)
    /console/api/forecast[?topic=]
        {"nowMs", "secondStartMs", "perSecond": [3600 counts: messages
        due in each second of the next hour], "minuteStartMs", "perMinute":
        [1440 counts: in each minute of the next 24 h], "overdue": ready
        messages (and, per topic, its waiting ones already due), "later":
        due after 24 h}. Overall, from the hours' second tables (3600 ints
        an hour, no message is read): entries filed in each second, so a
        message deleted or rescheduled since still counts where it was.
        With `topic`: from the per-hour counts of the topic's waiting
        messages, so per hour (`perHour`: 24 counts, `hourStartMs`), not
        per second. Both fold in the runs recurring schedules will make
        after their pending ones (which are messages already), at their
        nominal times (broker.schedules.forecast): "scheduleRuns", of which
        the windows hold, and "scheduleRunsCut" (true: too many to work
        out, some left out)
    /console/api/stats
        {"lateness": {"bounds": [s...], "counts": [...]} (the histogram
        behind hourglass_release_lateness_seconds{cause="load"}),
        "smoothing": the same of cause="smoothing" (releaseRate's delay),
        "throughput": [{"ms", "sends", "pulls", "acks"} per 10 s for the
        last 15 min]}
    /console/api/subscriptions
        {"subscriptions": [getSubscription's data of each, with its
        health: deliveries, failures by reason, in flight, backing off,
        the last error]} (never a secret)
    /console/api/schedules?offset=&limit=&topic=
        {"total", "offset", "schedules": [{"topic", "scheduleId", "cron",
        "everyMillis", "timeZone", "paused", "version", "runs",
        "nextFireTimes" (3), "lastRun": {"scheduledTime",
        "latenessMillis", "missed"} or null, "misfire", "released",
        "missed", "meanLatenessMillis" (since the node started)}]}: the
        recurring schedules by (topic, scheduleId), a page of at most 500
        (none on a cluster follower: the leader keeps them)
    /console/api/node
        standalone: {"role": "standalone", "diskBytes", "logEndOffset",
        "lastCheckpointMs", "hours"}; a cluster node: {"role", "node",
        "term", "leader", "logEndOffset", "insecure" (--insecure-cluster),
        "followers": [{"node", "offset", "lagBytes", "seenAgoMs"}] (on the
        leader)}

Dead letters, re-drive (one, all, or by filter as a job, with the jobs'
list and cancel), message lookup, the search, and a topic's pause (what a
resume will release: getTopicConfig's pause, and listMsg's count of what
fell due since it; pause and resume) use the API itself (listDeadMsg,
redriveMsg, redriveMsgs, getJob, cancelJob, getMsg, listMsg, deleteMsgs,
rescheduleMsgs, getTopicConfig, pauseTopic, resumeTopic, at
/console/api/<name> for the page: broker.console.login), so on a cluster
they go to the leader as any call.

The token: the operator gives it once, to the login form
(`POST /console/login`) or as `/console?token=T`, and gets a console
session in an HttpOnly, SameSite=Strict cookie that opens the console's
paths, never the API; the page keeps nothing in the browser's storage and
makes its API calls through /console/api/ (broker/console/login.py,
broker/http/sessions.py, console_auth and console_entry in broker/http/api.py, and broker/http/gate.py).
"""

from __future__ import annotations

import asyncio
import collections
import heapq
from collections.abc import Awaitable, Callable, Sequence

from storage.entry import MS_PER_HOUR, MS_PER_SECOND, SECONDS_PER_HOUR, Status
from storage.errors import InvalidRequest
from storage.spans import is_span
from storage.store import Store, text_hash

from ..core.params import parse_form
from ..http.api import answer
from ..http.commands import HERE, CommandTable, ErrorTable
from ..http.http_types import Request, Response
from ..http.sessions import CONSOLE
from ..observe.metrics import Histogram, Metrics
from ..schedules.forecast import SLICE_WORK, future_runs
from ..schedules.keeper import Schedules, ScheduleState
from .page import PAGE

API = CONSOLE + "/api/"
# A bad parameter is the caller's: code 400 in an HTTP 200, as the API's.
CONSOLE_ERRORS: ErrorTable = ((InvalidRequest, 400, 200),)
MAX_PAGE = 500
# Schedules listed (their rows made) between turns of the loop.
ROWS_SLICE = 50
SAMPLE_S = 10
SAMPLES = 90  # 15 minutes
# Rows of a topics page whose oldest due age is read (getTopicInfo's, each
# a look at the topic's ready window and its first READY index entries).
AGED_ROWS = 100

# getTopicInfo of some topics (the backend serving: merged over shards, a
# cluster's leader's); None: no backend serves on this node now.
TopicInfos = Callable[[Sequence[str]], Awaitable[list[dict[str, object]] | None]]


class Console:
    """The console's routes over one node's store and metrics. `node_info`
    gives the node section; `topics` lists the topic names (the broker's,
    or the store's on a follower)."""

    def __init__(self, store: Callable[[], Store], metrics: Metrics, topics: Callable[[], list[str]],
                 node_info: Callable[[], dict[str, object]], now_ms: Callable[[], int],
                 subscriptions: Callable[[], list[dict[str, object]]] = list,
                 schedules: Callable[[], Schedules | None] = lambda: None) -> None:
        self._store = store
        self._schedules = schedules  # the node's recurring schedules (None: it keeps none now)
        self._subscriptions = subscriptions  # the push subscriptions and their health (broker.push.pusher)
        self.metrics = metrics
        self._topics = topics
        self._node_info = node_info
        self._now_ms = now_ms
        # (ms, [sends, pulls, acks] so far) every SAMPLE_S
        self._samples: collections.deque[tuple[int, list[int]]] = collections.deque(maxlen=SAMPLES + 1)
        # The node's hooks (broker.node.base): getTopicInfo's `paused` of a
        # topic (None: no pauses kept), and getTopicInfo of topics.
        self.paused: Callable[[str], bool | list[str] | None] = lambda topic: None
        self.topic_infos: TopicInfos = _no_infos
        # The node's topics and their counts, and its schedules' rows (a
        # node of many shards: every shard's, broker.node.standalone); this process's by default.
        self.node_topics: Callable[[], Awaitable[list[str]]] = self._topics_here
        self.node_counts: Callable[[list[str]], Awaitable[list[list[int]]]] = self.counts_here
        self.node_schedule_rows: Callable[[str | None, int], Awaitable[tuple[int, list[dict[str, object]]]]] = \
            self.schedule_rows_here

    async def _topics_here(self) -> list[str]:
        return self._topics()

    async def counts_here(self, names: list[str]) -> list[list[int]]:
        """(waiting, ready, consuming, dead) of each of `names` in this process's store."""
        store = self._store()
        out = []
        for name in names:
            counts = store.topic_counts(text_hash(name))
            out.append([counts[Status.WAITING], counts[Status.READY], counts[Status.CONSUMING],
                        counts[Status.EXPIRED] + counts[Status.ENDED]])
        return out

    async def schedule_rows_here(self, topic: str | None, first: int) -> tuple[int, list[dict[str, object]]]:
        """How many schedules (of `topic`, or all) this process keeps, and the
        rows of the `first` of them by (topic, scheduleId)."""
        schedules = self._schedules()
        if schedules is None:
            return 0, []
        states = schedules.topic_states(topic) if topic else schedules.states()
        shown = heapq.nsmallest(first, states, key=lambda s: s.key)
        rows = []
        for n, state in enumerate(shown, 1):
            rows.append(schedule_row(state))
            if n % ROWS_SLICE == 0:  # (each row works out 3 next fire times: a cron's cost some 20 us each)
                await asyncio.sleep(0)
        return len(states), rows

    def add_routes(self, table: CommandTable) -> None:
        """Its API (/console/api/*); the page itself, GET /console, the node
        adds behind the console's entry (broker.http.api.console_entry)."""
        for name, handler in (("topics", self.topics), ("forecast", self.forecast), ("stats", self.stats),
                              ("node", self.node), ("subscriptions", self.subscriptions),
                              ("schedules", self.schedules)):
            table.add("GET", API + name, handler, where=HERE, errors=CONSOLE_ERRORS)

    async def run(self) -> None:
        """Sample the send, pull and ack counters every SAMPLE_S (throughput)."""
        while True:
            self._sample()
            await asyncio.sleep(SAMPLE_S)

    def _sample(self) -> None:
        totals = [0, 0, 0]
        for m in self.metrics.topics.values():
            totals[0] += m.sends
            totals[1] += m.pulls
            totals[2] += m.acks
        self._samples.append((self._now_ms(), totals))

    # -- endpoints -------------------------------------------------------------------

    async def page(self, request: Request) -> Response:
        return Response(200, PAGE.encode(), "text/html; charset=utf-8",
                        headers={"Cache-Control": "no-store", "X-Frame-Options": "DENY", "Referrer-Policy": "no-referrer",
                                 "Content-Security-Policy": "default-src 'self'; script-src 'unsafe-inline'; "
                                                            "style-src 'unsafe-inline'; form-action 'self'"})

    async def topics(self, request: Request) -> Response:
        q = parse_form(request.query)
        offset, limit = _int(q, "offset", 0), min(_int(q, "limit", 100), MAX_PAGE)
        prefix = q.get("prefix", "")
        names = [t for t in await self.node_topics() if t.startswith(prefix)]
        page = names[offset:offset + limit]
        rows: list[dict[str, object]] = []
        for name, (waiting, ready, consuming, dead) in zip(page, await self.node_counts(page)):
            rows.append({"topic": name, "waiting": waiting, "ready": ready, "consuming": consuming, "dead": dead,
                         "paused": self.paused(name) or False, "oldestDueAgeMillis": None,
                         "longestHeldMillis": None})
        aged = [row for row in rows if row["ready"] or row["consuming"]][:AGED_ROWS]
        infos = await self.topic_infos([str(row["topic"]) for row in aged]) if aged else None
        for row, info in zip(aged, infos or ()):
            row["oldestDueAgeMillis"] = info.get("oldestDueAgeMillis")
            row["longestHeldMillis"] = info.get("longestHeldMillis")
        return _json(total=len(names), offset=offset, topics=rows)

    async def forecast(self, request: Request) -> Response:
        q = parse_form(request.query)
        store, now_ms = self._store(), self._now_ms()
        topic = q.get("topic")
        schedules = self._schedules()
        if topic:
            per_topic = topic_forecast(store, topic, now_ms)
            if schedules is not None:
                await fold_hours(per_topic, schedules.topic_states(topic), now_ms)
            return _json(**per_topic)
        overall = forecast(store, now_ms)
        if schedules is not None:
            await fold(overall, schedules.states(), now_ms)
        return _json(**overall)

    async def stats(self, request: Request) -> Response:
        if not self._samples or self._now_ms() - self._samples[-1][0] >= SAMPLE_S * 1000:
            self._sample()
        series = [{"ms": ms, "sends": b[0] - a[0], "pulls": b[1] - a[1], "acks": b[2] - a[2]}
                  for (_, a), (ms, b) in zip(self._samples, list(self._samples)[1:])]
        return _json(lateness=_histogram(self.metrics.load_lateness_seconds),
                     smoothing=_histogram(self.metrics.smoothing_lateness_seconds), throughput=series)

    async def schedules(self, request: Request) -> Response:
        q = parse_form(request.query)
        offset, limit = _int(q, "offset", 0), min(_int(q, "limit", 100), MAX_PAGE)
        total, rows = await self.node_schedule_rows(q.get("topic") or None, offset + limit)
        return _json(total=total, offset=offset, schedules=rows[offset:offset + limit])

    async def node(self, request: Request) -> Response:
        return _json(**self._node_info())

    async def subscriptions(self, request: Request) -> Response:
        return _json(subscriptions=self._subscriptions())


def forecast(store: Store, now_ms: int) -> dict[str, object]:
    """Messages due per second for the next hour and per minute for the
    next 24 h, from the second tables (see the module docstring)."""
    first_s = now_ms // MS_PER_SECOND + 1  # the next whole second on
    per_second = [0] * SECONDS_PER_HOUR
    per_minute = [0] * 1440
    minute0 = now_ms // 60_000 + 1
    hour = first_s // SECONDS_PER_HOUR
    last_hour = (now_ms + 24 * MS_PER_HOUR) // MS_PER_HOUR
    h = store.next_hour(hour)
    while h is not None and h <= last_hour:
        counts = store.second_counts(h)
        base_s = h * SECONDS_PER_HOUR
        # seconds of the next hour held by this one: a slice
        lo, hi = max(first_s, base_s), min(first_s + SECONDS_PER_HOUR, base_s + SECONDS_PER_HOUR)
        if lo < hi:
            per_second[lo - first_s:hi - first_s] = counts[lo - base_s:hi - base_s]
        for m in range(60):  # an hour starts on a minute: sum its minutes
            minute = base_s // 60 + m - minute0
            if 0 <= minute < 1440:
                per_minute[minute] += sum(counts[m * 60:(m + 1) * 60])
        h = store.next_hour(h + 1)
    overdue = later = 0
    for file_id, counts in store.file_counts():  # the hours' all-topic totals
        overdue += counts[Status.READY]
        if is_span(file_id) or file_id > last_hour:
            later += counts[Status.WAITING]
    return {"nowMs": now_ms, "secondStartMs": first_s * MS_PER_SECOND, "perSecond": per_second,
            "minuteStartMs": minute0 * 60_000, "perMinute": per_minute, "overdue": overdue, "later": later}


def topic_forecast(store: Store, topic: str, now_ms: int) -> dict[str, object]:
    """One topic's waiting messages per hour for the next 24 h (per-hour
    counts: the second tables are shared by every topic)."""
    now_hour = now_ms // MS_PER_HOUR
    per_hour = [0] * 24
    overdue = later = 0
    for file_id, counts in store.topic_hours(text_hash(topic)):
        overdue += counts[Status.READY]
        waiting = counts[Status.WAITING]
        if not waiting:
            continue
        if is_span(file_id) or file_id >= now_hour + 24:
            later += waiting
        elif file_id < now_hour:
            overdue += waiting
        else:
            per_hour[file_id - now_hour] += waiting
    return {"nowMs": now_ms, "topic": topic, "hourStartMs": now_hour * MS_PER_HOUR, "perHour": per_hour,
            "overdue": overdue, "later": later}


async def fold(overall: dict[str, object], states: Sequence[ScheduleState], now_ms: int) -> None:
    """Add the schedules' runs after their pending ones to `forecast`'s
    answer (worked out, and added, in slices: the loop has turns between)."""
    per_second, per_minute = overall["perSecond"], overall["perMinute"]
    second0, minute0 = overall["secondStartMs"], overall["minuteStartMs"]
    assert isinstance(per_second, list) and isinstance(per_minute, list)
    assert isinstance(second0, int) and isinstance(minute0, int)
    runs, cut = await future_runs(states, now_ms, now_ms + 24 * MS_PER_HOUR)
    total = 0
    for n, (at, count) in enumerate(runs.items(), 1):
        second, minute = (at - second0) // MS_PER_SECOND, (at - minute0) // 60_000
        if 0 <= second < len(per_second):
            per_second[second] += count
        if 0 <= minute < len(per_minute):
            per_minute[minute] += count
        total += count
        if n % SLICE_WORK == 0:
            await asyncio.sleep(0)
    overall["scheduleRuns"], overall["scheduleRunsCut"] = total, cut


async def fold_hours(per_topic: dict[str, object], states: Sequence[ScheduleState], now_ms: int) -> None:
    """Add a topic's schedules' runs after their pending ones to `topic_forecast`'s answer."""
    per_hour, hour0 = per_topic["perHour"], per_topic["hourStartMs"]
    assert isinstance(per_hour, list) and isinstance(hour0, int)
    runs, cut = await future_runs(states, now_ms, hour0 + len(per_hour) * MS_PER_HOUR - 1)
    total = 0
    for n, (at, count) in enumerate(runs.items(), 1):
        per_hour[(at - hour0) // MS_PER_HOUR] += count
        total += count
        if n % SLICE_WORK == 0:
            await asyncio.sleep(0)
    per_topic["scheduleRuns"], per_topic["scheduleRunsCut"] = total, cut


def schedule_row(state: ScheduleState) -> dict[str, object]:
    """A schedule as the console lists it."""
    spec = state.spec
    last = state.last_runs[-1] if state.last_runs else None
    return {"topic": spec.topic, "scheduleId": spec.schedule_id, "cron": spec.cron, "everyMillis": spec.every_ms,
            "timeZone": spec.time_zone, "misfire": spec.misfire.value, "paused": state.paused,
            "version": state.version, "runs": state.runs, "nextFireTimes": state.next_fire_times(3),
            "lastRun": None if last is None else {"scheduledTime": last[0], "latenessMillis": last[1],
                                                  "missed": last[2]},
            "released": state.released, "missed": state.missed,
            "meanLatenessMillis": state.late_ms / state.released if state.released else None}


def standalone_info(store: Store, last_checkpoint_ms: Callable[[], int | None]) -> dict[str, object]:
    return {"role": "standalone", "diskBytes": store.disk_bytes(), "logEndOffset": store.log_end_offset,
            "lastCheckpointMs": last_checkpoint_ms(), "hours": len(store.hours())}


def _histogram(h: Histogram) -> dict[str, object]:
    return {"bounds": list(h.bounds), "counts": list(h.counts), "count": h.count, "sumSeconds": h.total}


async def _no_infos(topics: Sequence[str]) -> list[dict[str, object]] | None:
    return None


def _int(q: dict[str, str], name: str, default: int) -> int:
    value = q.get(name, "")
    return int(value) if value.isascii() and value.isdigit() and len(value) < 10 else default


def _json(**payload: object) -> Response:
    return answer(200, "success", **payload)

