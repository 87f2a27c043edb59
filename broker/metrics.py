"""Counters and histograms of one node, rendered for GET /metrics
(Prometheus text format) and GET getMonitorData (camellia's shape).

Per topic (label `topic`): sends, duplicate sends, pulls, acks, nacks,
retries (redeliveries after an ack timeout or nack), messages ended (5 or
6), deletes, getMsg calls, messages made ready; gauges of waiting, ready
and consuming messages. Per node: a histogram of dispatch lateness (ready
time minus trigger time) and one of fsync latency. Counters count since
the process started.
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
    pull_gap: GapStats = field(default_factory=GapStats)  # pull time - trigger time
    ready_gap: GapStats = field(default_factory=GapStats)  # ready time - trigger time


COUNTERS = (("sends", "messages stored by sendMsg/sendMsgBatch"),
            ("duplicates", "sends of an id that exists (answered with the stored message)"),
            ("pulls", "messages handed out by pullMsg/longPollingMsg"),
            ("acks", "messages acked"), ("nacks", "messages nacked"),
            ("retries", "messages made deliverable again after an ack timeout or nack"),
            ("ended", "messages ended without ack (status 5 or 6)"),
            ("deletes", "messages deleted"), ("gets", "getMsg calls"),
            ("ready", "messages made ready by the wheel"))


class Metrics:
    def __init__(self) -> None:
        self.topics: dict[str, TopicMetrics] = {}
        self.lateness_seconds = Histogram(LATENESS_BUCKETS_S)
        self.fsync_seconds = Histogram(FSYNC_BUCKETS_S)

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

    def monitor_data(self) -> dict:
        """getMonitorData's `data`, in camellia's shape."""
        topics = sorted(self.topics.items())
        return {
            "requestStatsList": [{"topic": t, "sendMsg": m.sends, "pullMsg": m.pulls, "deleteMsg": m.deletes,
                                  "ackMsg": m.acks, "getMsg": m.gets, "triggerMsgReady": m.ready,
                                  "triggerMsgEndLife": m.ended, "triggerMsgTimeout": m.retries}
                                 for t, m in topics],
            "pullMsgTimeGapStatsList": [m.pull_gap.as_json(t) for t, m in topics if m.pull_gap.count],
            "readyQueueTimeGapStatsList": [m.ready_gap.as_json(t) for t, m in topics if m.ready_gap.count],
        }


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
