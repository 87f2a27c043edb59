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
families of `Metrics.render` are unchanged beside them. The families with
a `topic` label show the topics /metrics shows (broker.http.scrape: at most
--metrics-topics), their labels cut as `broker.observe.metrics.topic_label` cuts
them; getMonitorString (an API call, not a scrape) lists every topic.
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

from .metrics import REQUEST_STATS, MonitorData, escape_label, topic_label

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

    def render(self) -> list[str]:
        info = {"camellia_version": "", "hourglass_version": self.version, "arch": platform.machine(),
                "os_name": platform.system(), "os_version": platform.release(),
                "system_load_average": f"{os.getloadavg()[0]:g}" if hasattr(os, "getloadavg") else "",
                "vm_vendor": platform.python_implementation(), "vm_name": sys.implementation.name,
                "vm_version": platform.python_version(), "jvm_info": "", "java_version": ""}
        lines = _family("info", "Delay Queue Info")
        lines.append("info{" + ",".join(f'{k}="{escape_label(v)}"' for k, v in info.items()) + "} 1")
        lines += _family("uptime", "Delay Queue Uptime")
        lines.append(f"uptime {int((time.monotonic() - self._start_mono) * 1000)}")
        lines += _family("start_time", "Delay Queue StartTime")
        lines.append(f"start_time {self.start_ms}")
        rss, peak = _rss_bytes()
        memory = dict.fromkeys(MEMORY_TYPES, 0) | {"total_memory": rss, "max_memory": peak,
                                                    "heap_memory_usage": rss}
        lines += _family("memory_info", "Delay Queue Memory")
        lines += [f'memory_info{{type="{t}"}} {memory[t]}' for t in MEMORY_TYPES]
        lines += _family("cpu", "Delay Queue Cpu")
        lines += [f'cpu{{type="cpu_num"}} {self.cpu_count}', f'cpu{{type="usage"}} {self.cpu_percent:f}']
        lines += _family("gc", "Delay Queue gc")
        for generation, stats in enumerate(gc.get_stats()):
            lines.append(f'gc{{name="gen{generation}",type="count"}} {stats["collections"]}')
            lines.append(f'gc{{name="gen{generation}",type="time"}} {int(self.gc.ms[generation])}')
        return lines


def render(process: ProcessStats, monitor: MonitorData, topic_infos: Sequence[Mapping[str, Any]],
           shown: frozenset[str]) -> str:
    """camellia's /metrics text: the process families, then `monitor`
    (getMonitorData's data) of the topics in `shown`, and `topic_infos`
    (getTopicInfo's data of those of them the node has)."""
    lines = process.render()
    lines += _family("request", "Delay Queue Request")
    for stats in _shown(monitor["requestStatsList"], shown):
        topic = topic_label(stats["topic"])
        lines += [f'request{{topic="{topic}",type="{kind}"}} {stats[kind]}' for kind in REQUEST_STATS]
    for name, key, help_text in (("pull_msg_time_gap", "pullMsgTimeGapStatsList", "Pull Msg Time Gap"),
                                 ("ready_queue_time_gap", "readyQueueTimeGapStatsList", "Ready Queue Time Gap")):
        lines += _family(name, f"Delay Queue {help_text}")
        for gap in _shown(monitor[key], shown):
            topic = topic_label(gap["topic"])
            lines += [f'{name}{{topic="{topic}",type="count"}} {gap["count"]}',
                      f'{name}{{topic="{topic}",type="avg"}} {float(gap["avg"]):f}',
                      f'{name}{{topic="{topic}",type="max"}} {gap["max"]}']
    lines += _family("topic_info", "Delay Queue Topic Info")
    for info in topic_infos:
        topic = topic_label(info["topic"])
        sizes = [(kind, info[kind]) for kind in ("readyQueueSize", "ackQueueSize", "waitingQueueSize")]
        sizes += [(WAITING_TYPES[key], n) for key, n in info["waitingQueueInfo"].items()]
        lines += [f'topic_info{{topic="{topic}",type="{kind}"}} {n}' for kind, n in sizes]
    return "\n".join(lines) + "\n"


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


def _family(name: str, help_text: str) -> list[str]:
    return [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]


def _rss_bytes() -> tuple[int, int]:
    """(resident set, its peak) in bytes."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)
    try:
        with open("/proc/self/statm", "rb") as f:
            rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        rss = peak
    return rss, max(peak, rss)
