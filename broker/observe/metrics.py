"""Counters and histograms of one node, rendered for GET /metrics
(Prometheus text format) and GET getMonitorData (camellia's shape).

Per topic (label `topic`): sends, duplicate sends, pulls, acks, nacks,
retries (redeliveries after an ack timeout or nack), messages ended (5 or
6), deletes, getMsg calls, messages made ready; gauges of waiting, ready
and consuming messages, and of dead letters kept (disk backend). Per node:
the same counters and gauges summed over every topic (`hourglass_node_*`),
how many topics there are and how many have series of their own,
histograms of release lateness by cause (`load`: ready time minus due
time, `due_ms`, the wheel's own lateness; `smoothing`: the delay a topic's
releaseRate added to a message handed out), of dwell (ack time minus
trigger time, of the messages acked once due), of fsync latency and of a
commit round's time (its fsync and applying its records). The
`hourglass_*` counters count since the process started. Per shown topic
too, from getTopicInfo's fields (broker.http.scrape): the messages due and
not handed out, and the age of the oldest of them.

/metrics stays bounded however many topics there are: per-topic series
only for the topics a `TopicSelection` names (broker.http.scrape picks at most
--metrics-topics, the largest backlogs first), and each topic label at
most MAX_LABEL_CHARS characters (`cut_topic`).

What /metrics shows is data before it is text: a `Family` (name, HELP,
TYPE, its `Sample`s: series name, labels as they are, value, and how a node
of shards makes it of its shards' samples), which every part of /metrics
builds (here, camellia_metrics, the node's own series, push, schedules)
and `render_text` alone writes, escaping every label value. A node of
shards merges its shards' families by their labels
(broker.shards.views.merge_families), never their text.

getMonitorData (and camellia's `request`, `pull_msg_time_gap` and
`ready_queue_time_gap` metrics, `broker.observe.camellia_metrics`) counts per
interval, as camellia's monitor does: `roll(now_ms)`, called every
--monitor-interval-s, publishes what happened since the previous roll and
starts a new interval. Between rolls getMonitorData answers the last
published interval, unchanged (before the first roll: empty lists).

    t=0 roll   send a, send b   t=60 roll   pull a   t=120 roll
               (published at 60: sendMsg 2)  (published at 120: pullMsg 1,
                                              sendMsg absent: no send then)
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from storage.entry import Message

from ..core.transitions import Effect

# A topic's (waiting, ready, consuming, dead) messages, for /metrics: dead
# letters (status 5 or 6) still kept, None where the backend does not count
# them (Redis: broker.redis.requests.topic_backlogs).
Backlog = tuple[int, int, int, int | None]

# getMonitorData's `data`, in camellia's JSON shape: lists of per-topic
# stats (requestStatsList, pullMsgTimeGapStatsList, ...) and the interval.
MonitorData = dict[str, Any]

LATENESS_BUCKETS_S = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1.0, 5.0, 60.0)
# Dwell spans a consumer's work too: wider, to an hour.
DWELL_BUCKETS_S = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 3600.0)
FSYNC_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1.0)
COMMIT_ROUND_BUCKETS_S = FSYNC_BUCKETS_S
# Longest topic label value, in characters (before escaping). A longer
# topic shows as its first characters, "~" and the 32 hex digits of a
# 128-bit BLAKE2b hash of the whole name: distinct, since no one can make
# two names with one hash, and the same label at every scrape and restart.
MAX_LABEL_CHARS = 128
LABEL_DIGEST_BYTES = 16


def due_ms(trigger_ms: int, arrived_ms: int) -> int:
    """When a message was due: its trigger time, or when it arrived if that
    is later (`arrived_ms`: its send's produce time, or the rescheduleMsg
    that gave it a past trigger time). A message sent with a trigger time
    already past is due at its arrival, not when that time was: dispatch
    lateness and camellia's time gaps count from here (docs/operations.md)."""
    return max(trigger_ms, arrived_ms)


def cut_topic(topic: str) -> str:
    """`topic` as a label's value: at most MAX_LABEL_CHARS characters (a
    longer one is cut, with a hash of it), not escaped yet (`render_text` does)."""
    if len(topic) > MAX_LABEL_CHARS:
        digest = hashlib.blake2b(topic.encode("utf-8", "surrogatepass"), digest_size=LABEL_DIGEST_BYTES).hexdigest()
        return f"{topic[:MAX_LABEL_CHARS - 1 - len(digest)]}~{digest}"
    return topic


def topic_label(topic: str) -> str:
    """`topic` as a label value is written: cut (`cut_topic`), then escaped."""
    return escape_label(cut_topic(topic))


def escape_label(value: str) -> str:
    """A Prometheus label value as the text format writes it: backslash,
    newline and quote escaped. A value holding a control or line-separator
    character (anything `str.isprintable` refuses but a plain space), or a
    backslash, is first spelled out (`spell_label`), so that no reader
    splitting lines at CR, U+2028 and the like can cut a series in two,
    and no two values share a label (a value left as it is holds no
    backslash; one spelled out always holds one)."""
    if "\\" in value or not value.isprintable():
        value = spell_label(value)
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def spell_label(value: str) -> str:
    """`value` with each backslash doubled and each character
    `str.isprintable` refuses written as `\\xHH`, `\\uHHHH` or
    `\\UHHHHHHHH`, as Python's escapes: one spelling a value.
    docs/operations.md, "Metrics", says how a topic's label reads."""
    out = []
    for char in value:
        if char == "\\":
            out.append("\\\\")
        elif char.isprintable():
            out.append(char)
        else:
            code = ord(char)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
    return "".join(out)


# -- families: what /metrics shows, as data -----------------------------------------------

# The kinds of family (its TYPE line).
COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"

# How a node of shards makes a sample of its shards' samples of the same
# series (broker.shards.views.merge_families).
SUM = "sum"  # summed: counters, and gauges of messages, bytes, files
MAX = "max"  # the largest: a gauge of one process (a limit, a lag, an age), or one every shard tells alike
MIN = "min"  # the smallest: when the first of the processes started
MEAN = "mean"  # an average weighted by its count: its family's sample of the same labels but type="count"

# A series' labels in the order written, each value as it is (`render_text` escapes it).
Labels = tuple[tuple[str, str], ...]

# A sample's value: an int or a float, each kept as it is (an int is written whole). Not
# `int | float`: the compiled build (mypyc) takes that for a float, and an int would become one.
Number = Any


class Sample(NamedTuple):
    """One series and its value: `name` its family's, or a histogram's
    `<family>_bucket`, `_sum` and `_count`."""

    name: str
    labels: Labels
    value: Number  # an int is written whole, a float as its family's float_format says
    merge: str = SUM


class Family(NamedTuple):
    """One metric family of /metrics, as data: its HELP text ("": no HELP
    line), its kind, its samples, and how it writes a float value (a
    format spec: "" Python's shortest repr, ".6f" six decimals, ...)."""

    name: str
    help_text: str
    kind: str
    samples: list[Sample]
    float_format: str = ""


def single_series(name: str, kind: str, value: Number, merge: str = SUM) -> Family:
    """A family of one series without labels, as a node's own series are
    (`NodeBase.node_series`): a TYPE line, and a float written to 15
    significant digits (a byte count or log offset given as a float reads whole)."""
    return Family(name, "", kind, [Sample(name, (), value, merge)], ".15g")


def render_text(families: Iterable[Family]) -> str:
    """The Prometheus text of `families`: each one's HELP and TYPE lines,
    then its samples, every label value escaped (`escape_label`)."""
    lines = []
    for family in families:
        if family.help_text:
            lines.append(f"# HELP {family.name} {family.help_text}")
        lines.append(f"# TYPE {family.name} {family.kind}")
        float_format = family.float_format
        for name, labels, value, _ in family.samples:
            number = str(value) if isinstance(value, int) else format(value, float_format)
            if labels:
                written = ",".join(f'{label}="{escape_label(text)}"' for label, text in labels)
                lines.append(f"{name}{{{written}}} {number}")
            else:
                lines.append(f"{name} {number}")
    return "\n".join(lines) + "\n"


def topic_labels(topic: str) -> Labels:
    """The labels of a topic's series: its name, cut (`cut_topic`)."""
    return (("topic", cut_topic(topic)),)


class Histogram:
    """A Prometheus histogram: cumulative bucket counts, sum and count."""

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last is +Inf
        self.total = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value
        self.count += 1

    def samples(self, name: str, labels: Labels = ()) -> list[Sample]:
        """Its samples as family `name`'s, `labels` (cause="load") on each."""
        samples = []
        running = 0
        for bound, n in zip(self.bounds, self.counts):
            running += n
            samples.append(Sample(f"{name}_bucket", (*labels, ("le", str(bound))), running))
        samples.append(Sample(f"{name}_bucket", (*labels, ("le", "+Inf")), self.count))
        samples.append(Sample(f"{name}_sum", labels, self.total))
        samples.append(Sample(f"{name}_count", labels, self.count))
        return samples


@dataclass
class GapStats:
    """count / avg / max of a time gap in ms (camellia's TimeGapStats)."""

    count: int = 0
    total: int = 0
    max: int = 0

    def observe(self, gap_ms: int) -> None:
        self.count += 1
        self.total += gap_ms
        self.max = max(self.max, gap_ms)

    def as_json(self, topic: str) -> dict[str, object]:
        return {"topic": topic, "count": self.count,
                "avg": round(self.total / self.count, 2) if self.count else 0.0, "max": self.max}


@dataclass
class TopicMetrics:
    sends: int = 0
    duplicates: int = 0
    pulls: int = 0
    acks: int = 0
    nacks: int = 0
    retries: int = 0
    ended: int = 0
    deletes: int = 0
    gets: int = 0
    ready: int = 0
    reschedules: int = 0
    redrives: int = 0
    extensions: int = 0
    stale: int = 0
    # Of the current monitor interval only (reset by Metrics.roll):
    pull_gap: GapStats = field(default_factory=GapStats)  # pull time - trigger time
    ready_gap: GapStats = field(default_factory=GapStats)  # ready time - trigger time

    def request_counts(self) -> tuple[int, ...]:
        """camellia's RequestStats counts, cumulative: sendMsg (answered
        sends, duplicates included, as camellia's monitor counts them),
        pullMsg, deleteMsg, ackMsg (acks and nacks: camellia counts ackMsg
        calls), getMsg, triggerMsgReady, triggerMsgEndLife, triggerMsgTimeout."""
        return (self.sends + self.duplicates, self.pulls, self.deletes, self.acks + self.nacks, self.gets,
                self.ready, self.ended, self.retries)

    def pulled(self, messages: Sequence[Message], now_ms: int) -> None:
        """Messages a pull at `now_ms` handed out (either backend): counted,
        and camellia's pull gap of each, from its due time."""
        self.pulls += len(messages)
        observe = self.pull_gap.observe
        for m in messages:
            observe(now_ms - max(m.trigger_ms, m.produce_ms))

    def count(self, effects: tuple[Effect, ...], times: int = 1) -> None:
        """What a transition's effects count (broker.core.transitions: COUNT_*),
        `times` transitions of those effects; compared by identity (an
        Enum's hash is a call into Python)."""
        for effect in effects:
            if effect is _READY:
                self.ready += times
            elif effect is _ACK:
                self.acks += times
            elif effect is _ENDED:
                self.ended += times
            elif effect is _RETRY:
                self.retries += times
            elif effect is _NACK:
                self.nacks += times
            elif effect is _DELETE:
                self.deletes += times


_READY, _ACK, _ENDED = Effect.COUNT_READY, Effect.COUNT_ACK, Effect.COUNT_ENDED
_RETRY, _NACK, _DELETE = Effect.COUNT_RETRY, Effect.COUNT_NACK, Effect.COUNT_DELETE


COUNTERS = (("sends", "messages stored by sendMsg/sendMsgBatch"),
            ("duplicates", "sends of an id that exists (answered with the stored message)"),
            ("pulls", "messages handed out by pullMsg/longPollingMsg"),
            ("acks", "messages acked"), ("nacks", "messages nacked"),
            ("retries", "messages made deliverable again after an ack timeout or nack"),
            ("ended", "messages ended without ack (status 5 or 6)"),
            ("deletes", "messages deleted"), ("gets", "getMsg calls"),
            ("ready", "messages made ready by the wheel"),
            ("reschedules", "messages given a new trigger time by rescheduleMsg"),
            ("redrives", "dead letters (status 5 or 6) made ready again by redriveMsg"),
            ("extensions", "consuming messages whose lease extendMsg extended"),
            ("stale", "acks, nacks and extensions refused: their deliveryId not the current delivery"))


REQUEST_STATS = ("sendMsg", "pullMsg", "deleteMsg", "ackMsg", "getMsg", "triggerMsgReady", "triggerMsgEndLife",
                 "triggerMsgTimeout")
# The per-topic gauges, in the order of a backlog (waiting, ready, consuming).
STATES = ("waiting", "ready", "consuming")


@dataclass(frozen=True)
class TopicSelection:
    """What one /metrics answer shows of the topics (broker.http.scrape builds
    it): series of their own for `shown` only, and sums over all."""

    shown: list[str]  # the topics with series of their own, by name
    backlogs: dict[str, Backlog]  # of the shown topics the node has
    topics: int  # topics the node has
    counter_totals: tuple[int, ...]  # each of COUNTERS summed over every topic's counters
    backlog_totals: tuple[int, int, int]  # (waiting, ready, consuming) summed over every topic
    dead_total: int | None = None  # dead letters summed over every topic (None: the backend counts none)
    # Of the shown topics, getTopicInfo's (dueUndelivered, oldestDueAgeMillis);
    # the age None where the backend does not tell it.
    due: dict[str, tuple[int, int | None]] = field(default_factory=dict)
    # Of the shown topics, getTopicInfo's longestHeldMillis, where the backend tells it.
    held: dict[str, int] = field(default_factory=dict)


def _states(backlog: Backlog) -> tuple[int, int, int]:
    """A backlog's messages in each of STATES."""
    return backlog[0], backlog[1], backlog[2]


class Metrics:
    def __init__(self) -> None:
        self.topics: dict[str, TopicMetrics] = {}
        # release lateness by cause (the module docstring): the wheel's, and releaseRate's
        self.load_lateness_seconds = Histogram(LATENESS_BUCKETS_S)
        self.smoothing_lateness_seconds = Histogram(LATENESS_BUCKETS_S)
        self.dwell_seconds = Histogram(DWELL_BUCKETS_S)
        self.fsync_seconds = Histogram(FSYNC_BUCKETS_S)
        self.commit_round_seconds = Histogram(COMMIT_ROUND_BUCKETS_S)
        # the monitor interval (see the module docstring)
        self._interval_start_ms: int | None = None
        self._counts_at_start: dict[str, tuple[int, ...]] = {}
        self._published: MonitorData = {"requestStatsList": [], "pullMsgTimeGapStatsList": [],
                                 "readyQueueTimeGapStatsList": []}
        self._before: MonitorData | None = None  # the interval published before it

    def topic(self, name: str, exists: bool = True) -> TopicMetrics:
        """The counters of topic `name`. `exists=False` (a request naming a
        topic the node does not have) gives counters that are dropped
        unless the topic has some already: made-up names never become label
        values of /metrics nor entries here."""
        m = self.topics.get(name)
        if m is None:
            m = TopicMetrics()
            if exists:
                self.topics[name] = m
        return m

    def observe_release(self, topic: str, load_ms: int, smoothing_ms: int) -> None:
        """A message of `topic`, a topic with a releaseRate, handed out:
        `smoothing_ms` of its lateness is what the rate added, counted under
        cause="smoothing". `load_ms`, the rest, is not counted again: the
        wheel's part of it is cause="load", counted when the message was
        made ready, and its wait for a consumer is the consumer's (dwell)."""
        self.smoothing_lateness_seconds.observe(smoothing_ms / 1000)

    def acked(self, trigger_times_ms: Iterable[int], now_ms: int) -> None:
        """Messages acked at `now_ms` once due, each with its trigger time:
        their dwell (a message acked before it was due has none)."""
        observe = self.dwell_seconds.observe
        for trigger_ms in trigger_times_ms:
            observe(max(0, now_ms - trigger_ms) / 1000)

    def committed(self, fsync_s: float, round_s: float) -> None:
        """A group-commit round: its fsync took `fsync_s`, the whole round
        (fsync and applying its records) `round_s`."""
        self.fsync_seconds.observe(fsync_s)
        self.commit_round_seconds.observe(round_s)

    def families(self, selection: TopicSelection) -> list[Family]:
        """The counters and gauges of the topics `selection` shows, the same
        summed over every topic, and the histograms. O(shown topics)."""
        shown = [(topic_labels(t), t, self.topics.get(t)) for t in selection.shown]
        families = []
        for attr, help_text in COUNTERS:
            name = f"hourglass_{attr}_total"
            families.append(Family(name, help_text, COUNTER, [Sample(name, labels, getattr(m, attr))
                                                              for labels, _, m in shown if m is not None]))
        backlogs = [(labels, selection.backlogs[t]) for labels, t, _ in shown if t in selection.backlogs]
        for i, state in enumerate(STATES):
            name = f"hourglass_{state}_messages"
            families.append(Family(name, "", GAUGE, [Sample(name, labels, _states(backlog)[i])
                                                     for labels, backlog in backlogs]))
        if selection.dead_total is not None:
            families.append(Family("hourglass_dead_messages", "dead letters kept (status 5 or 6)", GAUGE,
                                   [Sample("hourglass_dead_messages", labels, dead) for labels, backlog in backlogs
                                    if (dead := backlog[3]) is not None]))
        for (attr, help_text), total in zip(COUNTERS, selection.counter_totals):
            name = f"hourglass_node_{attr}_total"
            families.append(Family(name, f"{help_text}, every topic's", COUNTER, [Sample(name, (), total)]))
        for state, total in zip(STATES, selection.backlog_totals):
            name = f"hourglass_node_{state}_messages"
            families.append(Family(name, "", GAUGE, [Sample(name, (), total)]))
        if selection.dead_total is not None:
            families.append(Family("hourglass_node_dead_messages", "", GAUGE,
                                   [Sample("hourglass_node_dead_messages", (), selection.dead_total)]))
        # (a node of shards tells each shard its count of topics and the topics it shows: MAX)
        families += [Family("hourglass_topics", "topics the node has (--max-topics bounds them)", GAUGE,
                            [Sample("hourglass_topics", (), selection.topics, MAX)]),
                     Family("hourglass_topics_shown", "topics with series of their own (--metrics-topics bounds them)",
                            GAUGE, [Sample("hourglass_topics_shown", (), len(shown), MAX)])]
        due = selection.due
        families += [
            Family("hourglass_topic_due_undelivered",
                   "messages due and not handed out (getTopicInfo's dueUndelivered)", GAUGE,
                   [Sample("hourglass_topic_due_undelivered", labels, due[t][0]) for labels, t, _ in shown
                    if t in due]),
            Family("hourglass_topic_oldest_due_age_seconds", "how long ago the oldest message due and not handed "
                   "out fell due (getTopicInfo's oldestDueAgeMillis)", GAUGE,
                   [Sample("hourglass_topic_oldest_due_age_seconds", labels, age / 1000, MAX) for labels, t, _ in shown
                    if t in due and (age := due[t][1]) is not None]),
            Family("hourglass_topic_longest_held_seconds", "how long ago the consuming message held longest was "
                   "handed over (getTopicInfo's longestHeldMillis: leases extended by extendMsg)", GAUGE,
                   [Sample("hourglass_topic_longest_held_seconds", labels, selection.held[t] / 1000, MAX)
                    for labels, t, _ in shown if t in selection.held])]
        name = "hourglass_release_lateness_seconds"
        families += [
            Family(name, "ready or hand-out time minus due time, by cause: load (the wheel behind) or smoothing (a "
                   "topic's releaseRate)", HISTOGRAM,
                   [*self.load_lateness_seconds.samples(name, (("cause", "load"),)),
                    *self.smoothing_lateness_seconds.samples(name, (("cause", "smoothing"),))], ".6f"),
            Family("hourglass_dwell_seconds", "ack time minus trigger time of the messages acked once due", HISTOGRAM,
                   self.dwell_seconds.samples("hourglass_dwell_seconds"), ".6f"),
            Family("hourglass_fsync_seconds", "", HISTOGRAM, self.fsync_seconds.samples("hourglass_fsync_seconds"),
                   ".6f"),
            Family("hourglass_commit_round_seconds", "", HISTOGRAM,
                   self.commit_round_seconds.samples("hourglass_commit_round_seconds"), ".6f")]
        return families

    def render(self, selection: TopicSelection, node: Iterable[Family]) -> str:
        """The text of `families(selection)` and then `node` (the node's own series)."""
        return render_text([*self.families(selection), *node])

    def roll(self, now_ms: int) -> None:
        """End the current monitor interval at `now_ms`: publish its counts
        (the topics with any) and gap stats, and start the next. The first
        call only starts an interval."""
        topics = sorted(self.topics.items())
        counts = {t: m.request_counts() for t, m in topics}
        if self._interval_start_ms is not None:
            stats: list[dict[str, object]] = []
            for t, now in counts.items():
                before = self._counts_at_start.get(t, (0,) * len(now))
                delta = [a - b for a, b in zip(now, before)]
                if any(delta):
                    stats.append({"topic": t, **dict(zip(REQUEST_STATS, delta))})
            if "intervalEndTime" in self._published:
                self._before = self._published
            self._published = {
                "requestStatsList": stats,
                "pullMsgTimeGapStatsList": [m.pull_gap.as_json(t) for t, m in topics if m.pull_gap.count],
                "readyQueueTimeGapStatsList": [m.ready_gap.as_json(t) for t, m in topics if m.ready_gap.count],
                # extensions: the interval these counts are of (ms epoch)
                "intervalStartTime": self._interval_start_ms, "intervalEndTime": now_ms,
            }
        for _, m in topics:
            m.pull_gap, m.ready_gap = GapStats(), GapStats()
        self._counts_at_start = counts
        self._interval_start_ms = now_ms

    def monitor_data(self) -> MonitorData:
        """getMonitorData's `data`, in camellia's shape: the last interval
        `roll` published."""
        return self._published

    def recent_monitor_data(self) -> list[MonitorData]:
        """The last two intervals `roll` published, oldest first: a node of
        shards answers the newest one every shard has closed (shards roll
        at the same wall-clock boundaries, not at the same instant)."""
        return [self._published] if self._before is None else [self._before, self._published]

