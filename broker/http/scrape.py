"""One GET /metrics answer of any node (standalone, cluster or Redis),
bounded whatever the topics.

    backlogs    (waiting, ready, consuming, dead) of every topic: the backend's
                `topic_backlogs`, one pass yielding between slices
    selection   the --metrics-topics topics with the largest backlogs
                (ties: the most requests in the last monitor interval,
                then the name), found with a heap of that size; and every
                topic's counters and backlog summed
    infos       getTopicInfo of the selected topics only (the backend's
                `topic_infos`: camellia's topic_info, and the topics'
                due_undelivered and oldest_due_age_seconds from its
                dueUndelivered and oldestDueAgeMillis; the disk backend reads
                the oldest from its ready window and the first READY entries
                on disk, at most REFILL_SCAN a topic, Redis from one short
                script a topic)
    render      hourglass's families (broker.observe.metrics) and camellia's
                (broker.observe.camellia_metrics) of the selected topics only, and
                the sums; each topic label at most MAX_LABEL_CHARS long

Every step over all topics runs SLICE topics between yields to the event
loop, so a scrape of 10,000 topics never holds up requests for its whole
length; what is rendered is O(--metrics-topics). With the defaults (100
topics shown, labels of at most 128 characters) an answer is under about
1 MB, where it was 86 MB for 3,000 topics of 1 KiB names, and took the loop
for 0.7 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import os
from collections.abc import Iterable
from dataclasses import replace
from operator import attrgetter

from storage.errors import Unavailable
from storage.store import Store

from ..backend import Backend
from ..observe import camellia_metrics
from ..observe.metrics import COUNTERS, REQUEST_STATS, Backlog, Metrics, TopicSelection
from .http_types import Response

# Topics handled between two yields to the event loop.
SLICE = 2048

# A node-level series of /metrics: (name, type, value).
Series = tuple[str, str, float]

_counter_values = attrgetter(*(attr for attr, _ in COUNTERS))


async def metrics_response(backend: Backend | None, metrics: Metrics, process: camellia_metrics.ProcessStats,
                           most_topics: int, series: Iterable[Series]) -> Response:
    """/metrics of a node: its `metrics` and `process` families, the topics
    of `backend` (None: a cluster follower, which runs none), at most
    `most_topics` of them shown (--metrics-topics), and the node-level
    `series`. A backend that cannot be reached (Redis down) leaves out the
    topics' sizes, not the answer."""
    backlogs: dict[str, Backlog] = {}
    if backend is not None:
        try:
            backlogs = await backend.topic_backlogs()
        except Unavailable:
            backend = None
    selection = await select_topics(metrics, backlogs, most_topics)
    infos: list[dict[str, object]] = []
    if backend is not None:
        with contextlib.suppress(Unavailable):
            infos = await backend.topic_infos([t for t in selection.shown if t in backlogs])
    if infos:
        selection = replace(selection, due=due_of(infos))
    text = metrics.render(selection, series) + camellia_metrics.render(
        process, metrics.monitor_data(), infos, frozenset(selection.shown))
    return Response(200, text.encode(), "text/plain; charset=utf-8")


def due_of(infos: Iterable[dict[str, object]]) -> dict[str, tuple[int, int | None]]:
    """(dueUndelivered, oldestDueAgeMillis) of each getTopicInfo of
    `infos`: the age None where the backend leaves it out."""
    due: dict[str, tuple[int, int | None]] = {}
    for info in infos:
        count, age = info.get("dueUndelivered"), info.get("oldestDueAgeMillis")
        if isinstance(count, int):
            due[str(info["topic"])] = (count, age if isinstance(age, int) else None)
    return due


def disk_series(store: Store, data_path: str) -> list[Series]:
    """A disk node's room: bytes the store's files take, and the size of
    the file system `data_path` is on and the room left there for this
    user (statvfs: what a send's disk-room check sees)."""
    try:
        fs = os.statvfs(data_path)
    except OSError:
        return [("hourglass_disk_used_bytes", "gauge", store.disk_bytes())]
    return [("hourglass_disk_used_bytes", "gauge", store.disk_bytes()),
            ("hourglass_disk_free_bytes", "gauge", fs.f_bavail * fs.f_frsize),
            ("hourglass_disk_size_bytes", "gauge", fs.f_blocks * fs.f_frsize)]


async def select_topics(metrics: Metrics, backlogs: dict[str, Backlog], most: int) -> TopicSelection:
    """The topics (those with a backlog or counters) whose series /metrics
    shows: at most `most`, the largest backlogs (waiting + ready +
    consuming) first, then those with the most requests in the last monitor
    interval, then by name (dead letters are no backlog). Also every
    topic's counters and backlog summed, and its dead letters where the
    backend counts them."""
    stats = metrics.monitor_data()["requestStatsList"]
    requests: dict[str, int] = {}
    for start in range(0, len(stats), SLICE):
        requests.update((s["topic"], sum(s[kind] for kind in REQUEST_STATS)) for s in stats[start:start + SLICE])
        await asyncio.sleep(0)
    counters = list(metrics.topics.values())
    topics = list(backlogs.keys() | metrics.topics.keys())
    heap: list[tuple[int, int, str]] = []  # the `most` largest so far; heap[0] the smallest of them
    backlog_totals = [0, 0, 0]
    dead_total: int | None = None
    for start in range(0, len(topics), SLICE):
        for topic in topics[start:start + SLICE]:
            backlog = backlogs.get(topic)
            if backlog is not None:
                backlog_totals[0] += backlog[0]
                backlog_totals[1] += backlog[1]
                backlog_totals[2] += backlog[2]
                if backlog[3] is not None:
                    dead_total = (dead_total or 0) + backlog[3]
            if most:
                rank = (backlog[0] + backlog[1] + backlog[2] if backlog else 0, requests.get(topic, 0), topic)
                if len(heap) < most:
                    heapq.heappush(heap, rank)
                elif rank > heap[0]:
                    heapq.heapreplace(heap, rank)
        await asyncio.sleep(0)
    counter_totals = [0] * len(COUNTERS)
    for start in range(0, len(counters), SLICE):
        for m in counters[start:start + SLICE]:
            for i, value in enumerate(_counter_values(m)):
                counter_totals[i] += value
        await asyncio.sleep(0)
    shown = sorted(topic for _, _, topic in heap)
    return TopicSelection(shown=shown, backlogs={t: backlogs[t] for t in shown if t in backlogs},
                          topics=len(backlogs), counter_totals=tuple(counter_totals),
                          backlog_totals=(backlog_totals[0], backlog_totals[1], backlog_totals[2]),
                          dead_total=dead_total)
