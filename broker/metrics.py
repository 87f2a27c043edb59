"""Counters and histograms of one node, rendered for GET /metrics
(Prometheus text format) and GET getMonitorData (camellia's shape).

Per topic (label `topic`): sends, duplicate sends, pulls, acks, nacks,
retries (redeliveries after an ack timeout or nack), messages ended (5 or
6), deletes, getMsg calls, messages made ready; gauges of waiting, ready
and consuming messages. Per node: a histogram of dispatch lateness (ready
time minus trigger time) and one of fsync latency. The `hourglass_*`
counters count since the process started.

getMonitorData (and camellia's `request`, `pull_msg_time_gap` and
`ready_queue_time_gap` metrics, `broker.camellia_metrics`) counts per
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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

LATENESS_BUCKETS_S = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1.0, 5.0, 60.0)
FSYNC_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1.0)


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

    def render(self, name: str) -> list[str]:
        lines = [f"# TYPE {name} histogram"]
        running = 0
        for bound, n in zip(self.bounds, self.counts):
            running += n
            lines.append(f'{name}_bucket{{le="{bound}"}} {running}')
        lines.append(f'{name}_bucket{{le="+Inf"}} {self.count}')
        lines.append(f"{name}_sum {self.total:.6f}")
        lines.append(f"{name}_count {self.count}")
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

    def as_json(self, topic: str) -> dict:
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


class Metrics:
    def __init__(self) -> None:
        self.topics: dict[str, TopicMetrics] = {}
        self.lateness_seconds = Histogram(LATENESS_BUCKETS_S)
        self.fsync_seconds = Histogram(FSYNC_BUCKETS_S)
        # the monitor interval (see the module docstring)
        self._interval_start_ms: int | None = None
        self._counts_at_start: dict[str, tuple[int, ...]] = {}
        self._published: dict = {"requestStatsList": [], "pullMsgTimeGapStatsList": [],
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

    def render(self, gauges: Iterable[tuple[str, int, int, int]], node: Iterable[tuple[str, str, float]]) -> str:
        """Prometheus text: per-topic counters, `gauges` (topic, waiting,
        ready, consuming), the histograms, and `node` (name, type, value)."""
        lines = []
        topics = sorted(self.topics.items())
        for attr, help_text in COUNTERS:
            name = f"hourglass_{attr}_total"
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} counter"]
            lines += [f'{name}{{topic="{_label(t)}"}} {getattr(m, attr)}' for t, m in topics]
        gauges = list(gauges)
        for i, state in enumerate(("waiting", "ready", "consuming"), start=1):
            name = f"hourglass_{state}_messages"
            lines.append(f"# TYPE {name} gauge")
            lines += [f'{name}{{topic="{_label(g[0])}"}} {g[i]}' for g in gauges]
        lines += self.lateness_seconds.render("hourglass_dispatch_lateness_seconds")
        lines += self.fsync_seconds.render("hourglass_fsync_seconds")
        for name, kind, value in node:
            lines += [f"# TYPE {name} {kind}", f"{name} {value:g}" if isinstance(value, float) else f"{name} {value}"]
        return "\n".join(lines) + "\n"

    def roll(self, now_ms: int) -> None:
        """End the current monitor interval at `now_ms`: publish its counts
        (the topics with any) and gap stats, and start the next. The first
        call only starts an interval."""
        topics = sorted(self.topics.items())
        counts = {t: m.request_counts() for t, m in topics}
        if self._interval_start_ms is not None:
            stats = []
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

    def monitor_data(self) -> dict:
        """getMonitorData's `data`, in camellia's shape: the last interval
        `roll` published."""
        return self._published


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
