"""camellia-delay-queue's monitoring, as its server exposes it: the metric
names of its GET /metrics (so camellia's Grafana dashboard,
`docs/camellia-delay-queue/grafana-conf.json` in netease-im/camellia,
works unchanged) and the JSON of GET getMonitorString.

    family                 labels             value
    info                   camellia's labels  1 (values from this Python process)
    uptime                 -                  ms since the process started
    start_time             -                  ms epoch of the start
    memory_info            type               bytes (see MEMORY_TYPES)
    cpu                    type=cpu_num|usage CPUs; % of one CPU over the last interval
    gc                     name, type         Python's collector generations:
                                              collections (count), ms spent (time)
    request                topic, type        getMonitorData's requestStatsList
    pull_msg_time_gap      topic, type        count|avg|max, ms: pull - trigger
    ready_queue_time_gap   topic, type        count|avg|max, ms: ready - trigger
    topic_info             topic, type        queue sizes and waiting buckets

`request` and the two gaps are of the last monitor interval
(`broker.observe.metrics.Metrics.roll`), gauges as camellia's are. The hourglass_*
families of `Metrics.families` are unchanged beside them. The families with
a `topic` label show the topics /metrics shows (broker.http.scrape: at most
--metrics-topics), their labels cut as `broker.observe.metrics.cut_topic` cuts
them; getMonitorString (an API call, not a scrape) lists every topic.

A node of shards makes each sample of its shards' (`Sample.merge`): the
process families as a node of processes has them (memory, CPU use and
collections summed; the CPUs, info and uptime the largest, start_time the
earliest), the topics' counts summed, a time gap's max the largest and its
avg weighted by its count.
"""

from __future__ import annotations

import gc
import importlib.metadata
import os
import platform
import resource
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from .metrics import GAUGE, MAX, MEAN, MIN, REQUEST_STATS, Family, MonitorData, Sample, topic_labels

# getTopicInfo's waitingQueueInfo keys -> camellia's topic_info type labels.
WAITING_TYPES = {
    "sizeOf0To1min": "size_0_1min",
    "sizeOf1minTo10min": "size_1min_10min",
    "sizeOf10minTo30min": "size_10min_30min",
    "sizeOf30minTo1hour": "size_30min_1hour",
    "sizeOf1hourTo6hour": "size_1hour_6hour",
    "sizeOf6hourTo1day": "size_6hour_1day",
    "sizeOf1dayTo7day": "size_1day_7day",
    "sizeOf7dayTo30day": "size_7day_30day",
    "sizeOf30dayToInfinite": "size_30day_infinite",
}
# memory_info types: camellia's are the JVM's; here the process's resident
# set stands for the heap and its peak for the maximum; a Python process
# has no free heap, non-heap or netty memory to report (0).
MEMORY_TYPES = ("free_memory", "total_memory", "max_memory", "heap_memory_usage", "no_heap_memory_usage",
                "netty_direct_memory")


class GcTimer:
    """Milliseconds Python's cyclic collector spent, per generation, timed
    by a gc callback (installed once per process: `GcTimer.installed()`)."""

    _instance: GcTimer | None = None

    def __init__(self) -> None:
        self.ms = [0.0, 0.0, 0.0]
        self._started = 0.0
        gc.callbacks.append(self._on_gc)

    @classmethod
    def installed(cls) -> GcTimer:
        if cls._instance is None:
            cls._instance = cls()
        return cls._instance

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif 0 <= info.get("generation", -1) < len(self.ms):
            self.ms[info["generation"]] += (time.perf_counter() - self._started) * 1000


class ProcessStats:
    """The process-wide families: info, uptime, start_time, memory_info,
    cpu, gc. `roll()` (every monitor interval) measures the CPU used since
    the previous roll, as camellia's CpuUsageCollector does."""

    def __init__(self) -> None:
        self.start_ms = time.time_ns() // 1_000_000
        self._start_mono = time.monotonic()
        self.cpu_count = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        self.cpu_percent = 0.0  # 100 = one CPU busy, as camellia's ratio
        self._cpu_at = (time.process_time(), time.monotonic())
        self.gc = GcTimer.installed()
        try:
            self.version = importlib.metadata.version("hourglass")
        except importlib.metadata.PackageNotFoundError:
            self.version = "unknown"

    def roll(self) -> None:
        cpu_s, mono_s = time.process_time(), time.monotonic()
        used_s, wall_s = cpu_s - self._cpu_at[0], mono_s - self._cpu_at[1]
        if wall_s > 0:
            self.cpu_percent = used_s / wall_s * 100
        self._cpu_at = (cpu_s, mono_s)

    def families(self) -> list[Family]:
        info = {"camellia_version": "", "hourglass_version": self.version, "arch": platform.machine(),
                "os_name": platform.system(), "os_version": platform.release(),
                "system_load_average": f"{os.getloadavg()[0]:g}" if hasattr(os, "getloadavg") else "",
                "vm_vendor": platform.python_implementation(), "vm_name": sys.implementation.name,
                "vm_version": platform.python_version(), "jvm_info": "", "java_version": ""}
        rss, peak = _rss_bytes()
        memory = dict.fromkeys(MEMORY_TYPES, 0) | {"total_memory": rss, "max_memory": peak,
                                                    "heap_memory_usage": rss}
        uptime_ms = int((time.monotonic() - self._start_mono) * 1000)
        collections = []
        for generation, stats in enumerate(gc.get_stats()):
            collections += [Sample("gc", (("name", f"gen{generation}"), ("type", "count")), stats["collections"]),
                            Sample("gc", (("name", f"gen{generation}"), ("type", "time")), int(self.gc.ms[generation]))]
        return [Family("info", "Delay Queue Info", GAUGE, [Sample("info", tuple(info.items()), 1, MAX)]),
                Family("uptime", "Delay Queue Uptime", GAUGE, [Sample("uptime", (), uptime_ms, MAX)]),
                Family("start_time", "Delay Queue StartTime", GAUGE, [Sample("start_time", (), self.start_ms, MIN)]),
                Family("memory_info", "Delay Queue Memory", GAUGE,
                       [Sample("memory_info", (("type", t),), memory[t]) for t in MEMORY_TYPES]),
                Family("cpu", "Delay Queue Cpu", GAUGE, [Sample("cpu", (("type", "cpu_num"),), self.cpu_count, MAX),
                                                         Sample("cpu", (("type", "usage"),), self.cpu_percent)], "f"),
                Family("gc", "Delay Queue gc", GAUGE, collections)]


def families(process: ProcessStats, monitor: MonitorData, topic_infos: Sequence[Mapping[str, Any]],
             shown: frozenset[str]) -> list[Family]:
    """camellia's /metrics families: the process's, then `monitor`
    (getMonitorData's data) of the topics in `shown`, and `topic_infos`
    (getTopicInfo's data of those of them the node has)."""
    requests = []
    for stats in _shown(monitor["requestStatsList"], shown):
        topic = topic_labels(stats["topic"])
        requests += [Sample("request", (*topic, ("type", kind)), stats[kind]) for kind in REQUEST_STATS]
    gaps = []
    for name, key, help_text in (("pull_msg_time_gap", "pullMsgTimeGapStatsList", "Pull Msg Time Gap"),
                                 ("ready_queue_time_gap", "readyQueueTimeGapStatsList", "Ready Queue Time Gap")):
        samples = []
        for gap in _shown(monitor[key], shown):
            topic = topic_labels(gap["topic"])
            samples += [Sample(name, (*topic, ("type", "count")), gap["count"]),
                        Sample(name, (*topic, ("type", "avg")), float(gap["avg"]), MEAN),
                        Sample(name, (*topic, ("type", "max")), gap["max"], MAX)]
        gaps.append(Family(name, f"Delay Queue {help_text}", GAUGE, samples, "f"))
    sizes = []
    for info in topic_infos:
        topic = topic_labels(info["topic"])
        counts = [(kind, info[kind]) for kind in ("readyQueueSize", "ackQueueSize", "waitingQueueSize")]
        counts += [(WAITING_TYPES[key], n) for key, n in info["waitingQueueInfo"].items()]
        sizes += [Sample("topic_info", (*topic, ("type", kind)), n) for kind, n in counts]
    return [*process.families(), Family("request", "Delay Queue Request", GAUGE, requests), *gaps,
            Family("topic_info", "Delay Queue Topic Info", GAUGE, sizes)]


def monitor_string(monitor: MonitorData, topic_infos: Sequence[Mapping[str, Any]]) -> bytes:
    """getMonitorString's text (JSON, for camellia's sentinel system): the
    last interval's stats and every topic's sizes and waiting buckets."""
    return orjson.dumps({
        "requestStats": monitor["requestStatsList"],
        "pullMsgTimeGapStats": monitor["pullMsgTimeGapStatsList"],
        "readyQueueTimeGapStats": monitor["readyQueueTimeGapStatsList"],
        "topicInfoStats": [{"topic": i["topic"], "waitingQueueSize": i["waitingQueueSize"],
                            "ackQueueSize": i["ackQueueSize"], "readyQueueSize": i["readyQueueSize"]}
                           for i in topic_infos],
        "waitingQueueStats": [{**i["waitingQueueInfo"], "topic": i["topic"]} for i in topic_infos],
    })


def _shown(entries: list[dict[str, Any]], shown: frozenset[str]) -> list[dict[str, Any]]:
    """The entries of a getMonitorData list whose topic is shown: one
    set lookup each, which is all an unshown topic costs."""
    return [entry for entry in entries if entry["topic"] in shown]


def _rss_bytes() -> tuple[int, int]:
    """(resident set, its peak) in bytes."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)
    try:
        with open("/proc/self/statm", "rb") as f:
            rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        rss = peak
    return rss, max(peak, rss)
