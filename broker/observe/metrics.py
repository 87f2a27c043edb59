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
most MAX_LABEL_CHARS characters (`topic_label`).

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
from typing import Any

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


def topic_label(topic: str) -> str:
    """`topic` as a label value: escaped, and at most MAX_LABEL_CHARS
    characters before escaping (a longer one is cut, with a hash of it)."""
    if len(topic) > MAX_LABEL_CHARS:
        digest = hashlib.blake2b(topic.encode("utf-8", "surrogatepass"), digest_size=LABEL_DIGEST_BYTES).hexdigest()
        topic = f"{topic[:MAX_LABEL_CHARS - 1 - len(digest)]}~{digest}"
    return escape_label(topic)


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

    def render(self, name: str, labels: str = "", head: bool = True) -> list[str]:
        """Its samples; `labels` (`cause="load"`) on each, and the TYPE
        line first unless `head` is False (a family's second histogram)."""
        lines = [f"# TYPE {name} histogram"] if head else []
        running = 0
        at = f"{labels}," if labels else ""
        for bound, n in zip(self.bounds, self.counts):
            running += n
            lines.append(f'{name}_bucket{{{at}le="{bound}"}} {running}')
        lines.append(f'{name}_bucket{{{at}le="+Inf"}} {self.count}')
        tail = f"{{{labels}}}" if labels else ""
        lines.append(f"{name}_sum{tail} {self.total:.6f}")
        lines.append(f"{name}_count{tail} {self.count}")
        return lines


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
            ("redrives", "dead letters (status 5 or 6) made ready again by redriveMsg"))


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

    def render(self, selection: TopicSelection, node: Iterable[tuple[str, str, float]]) -> str:
        """Prometheus text: the counters and gauges of the topics
        `selection` shows, the same summed over every topic, the
        histograms, and `node` (name, type, value; a name may carry labels,
        `name{label="value"}`: its family's TYPE line comes once, before its
        first series). O(shown topics)."""
        lines = []
        shown = [(topic_label(t), t, self.topics.get(t)) for t in selection.shown]
        for attr, help_text in COUNTERS:
            name = f"hourglass_{attr}_total"
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} counter"]
            lines += [f'{name}{{topic="{label}"}} {getattr(m, attr)}' for label, _, m in shown if m is not None]
        for i, state in enumerate(STATES):
            name = f"hourglass_{state}_messages"
            lines.append(f"# TYPE {name} gauge")
            lines += [f'{name}{{topic="{label}"}} {selection.backlogs[t][i]}' for label, t, _ in shown
                      if t in selection.backlogs]
        if selection.dead_total is not None:
            lines += ["# HELP hourglass_dead_messages dead letters kept (status 5 or 6)",
                      "# TYPE hourglass_dead_messages gauge"]
            lines += [f'hourglass_dead_messages{{topic="{label}"}} {selection.backlogs[t][3]}' for label, t, _ in shown
                      if t in selection.backlogs and selection.backlogs[t][3] is not None]
        for (attr, help_text), total in zip(COUNTERS, selection.counter_totals):
            name = f"hourglass_node_{attr}_total"
            lines += [f"# HELP {name} {help_text}, every topic's", f"# TYPE {name} counter", f"{name} {total}"]
        for state, total in zip(STATES, selection.backlog_totals):
            lines += [f"# TYPE hourglass_node_{state}_messages gauge", f"hourglass_node_{state}_messages {total}"]
        if selection.dead_total is not None:
            lines += ["# TYPE hourglass_node_dead_messages gauge", f"hourglass_node_dead_messages {selection.dead_total}"]
        lines += ["# HELP hourglass_topics topics the node has (--max-topics bounds them)",
                  "# TYPE hourglass_topics gauge", f"hourglass_topics {selection.topics}",
                  "# HELP hourglass_topics_shown topics with series of their own (--metrics-topics bounds them)",
                  "# TYPE hourglass_topics_shown gauge", f"hourglass_topics_shown {len(shown)}"]
        due = selection.due
        lines += ["# HELP hourglass_topic_due_undelivered messages due and not handed out (getTopicInfo's "
                  "dueUndelivered)", "# TYPE hourglass_topic_due_undelivered gauge"]
        lines += [f'hourglass_topic_due_undelivered{{topic="{label}"}} {due[t][0]}' for label, t, _ in shown
                  if t in due]
        lines += ["# HELP hourglass_topic_oldest_due_age_seconds how long ago the oldest message due and not "
                  "handed out fell due (getTopicInfo's oldestDueAgeMillis)",
                  "# TYPE hourglass_topic_oldest_due_age_seconds gauge"]
        lines += [f'hourglass_topic_oldest_due_age_seconds{{topic="{label}"}} {age / 1000}'
                  for label, t, _ in shown if t in due and (age := due[t][1]) is not None]
        lines += ["# HELP hourglass_release_lateness_seconds ready or hand-out time minus due time, by cause: "
                  "load (the wheel behind) or smoothing (a topic's releaseRate)"]
        lines += self.load_lateness_seconds.render("hourglass_release_lateness_seconds", 'cause="load"')
        lines += self.smoothing_lateness_seconds.render("hourglass_release_lateness_seconds", 'cause="smoothing"',
                                                        head=False)
        lines += ["# HELP hourglass_dwell_seconds ack time minus trigger time of the messages acked once due"]
        lines += self.dwell_seconds.render("hourglass_dwell_seconds")
        lines += self.fsync_seconds.render("hourglass_fsync_seconds")
        lines += self.commit_round_seconds.render("hourglass_commit_round_seconds")
        family = ""
        for name, kind, value in node:
            if not (family and name.startswith(family + "{")):
                family = name.partition("{")[0]
                lines.append(f"# TYPE {family} {kind}")
            # (15 digits: a byte count or log offset whole; compiled, every value here is a float)
            lines.append(f"{name} {value:.15g}" if isinstance(value, float) else f"{name} {value}")
        return "\n".join(lines) + "\n"

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

