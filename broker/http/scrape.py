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
    families    hourglass's families (broker.observe.metrics) and camellia's
                (broker.observe.camellia_metrics) of the selected topics only, and
                the sums; each topic label at most MAX_LABEL_CHARS long; written
                as text once (`metrics_answer`)

A node of shards chooses for the node (broker.node.standalone.DiskNode.metrics_text):
the shards' `topic_ranks` summed, the `largest` of them, and each shard's
families of exactly those topics (a `Choice`), merged by their labels
(broker.shards.views.merge_families).

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
from typing import NamedTuple

from storage.errors import Unavailable
from storage.store import Store

from ..backend import Backend
from ..observe import camellia_metrics
from ..observe.metrics import (
    COUNTERS,
    GAUGE,
    MAX,
    REQUEST_STATS,
    Backlog,
    Family,
    Metrics,
    TopicSelection,
    render_text,
    single_series,
)
from .http_types import Response

# Topics handled between two yields to the event loop.
SLICE = 2048

# A topic's place among those /metrics may show: its backlog (waiting +
# ready + consuming; None: no such topic here, only its counters) and its
# requests in the last monitor interval.
Rank = tuple[int | None, int]

_counter_values = attrgetter(*(attr for attr, _ in COUNTERS))


class Choice(NamedTuple):
    """The topics /metrics shows, chosen for a whole node of shards (each
    shard shows its part of them), and how many topics the node has."""

    shown: list[str]  # by name
    topics: int


async def metrics_families(backend: Backend | None, metrics: Metrics, process: camellia_metrics.ProcessStats,
                           most_topics: int, node: Iterable[Family], choice: Choice | None = None) -> list[Family]:
    """/metrics of a node: its `metrics` and `process` families, the topics
    of `backend` (None: a cluster follower, which runs none), at most
    `most_topics` of them shown (--metrics-topics) unless `choice` says
    which (a shard's part of its node's), and the node's own series
    `node`. A backend that cannot be reached (Redis down) leaves out the
    topics' sizes, not the answer."""
    backlogs: dict[str, Backlog] = {}
    if backend is not None:
        try:
            backlogs = await backend.topic_backlogs()
        except Unavailable:
            backend = None
    selection = await select_topics(metrics, backlogs, most_topics, choice)
    infos: list[dict[str, object]] = []
    if backend is not None:
        with contextlib.suppress(Unavailable):
            infos = await backend.topic_infos([t for t in selection.shown if t in backlogs])
    if infos:
        selection = replace(selection, due=due_of(infos), held={str(info["topic"]): held for info in infos
                                                                if isinstance(held := info.get("longestHeldMillis"), int)})
    return [*metrics.families(selection), *node,
            *camellia_metrics.families(process, metrics.monitor_data(), infos, frozenset(selection.shown))]


def metrics_answer(families: Iterable[Family]) -> Response:
    """GET /metrics' answer: `families` as Prometheus text."""
    return Response(200, render_text(families).encode(), "text/plain; charset=utf-8")


def due_of(infos: Iterable[dict[str, object]]) -> dict[str, tuple[int, int | None]]:
    """(dueUndelivered, oldestDueAgeMillis) of each getTopicInfo of
    `infos`: the age None where the backend leaves it out."""
    due: dict[str, tuple[int, int | None]] = {}
    for info in infos:
        count, age = info.get("dueUndelivered"), info.get("oldestDueAgeMillis")
        if isinstance(count, int):
            due[str(info["topic"])] = (count, age if isinstance(age, int) else None)
    return due


def disk_series(store: Store, data_path: str) -> list[Family]:
    """A disk node's room: bytes the store's files take, and the size of
    the file system `data_path` is on and the room left there for this
    user (statvfs: what a send's disk-room check sees; the shards of a
    node share the file system, so theirs is the largest, not a sum)."""
    used = single_series("hourglass_disk_used_bytes", GAUGE, store.disk_bytes())
    try:
        fs = os.statvfs(data_path)
    except OSError:
        return [used]
    return [used, single_series("hourglass_disk_free_bytes", GAUGE, fs.f_bavail * fs.f_frsize, MAX),
            single_series("hourglass_disk_size_bytes", GAUGE, fs.f_blocks * fs.f_frsize, MAX)]


async def topic_ranks(metrics: Metrics, backlogs: dict[str, Backlog]) -> dict[str, Rank]:
    """The rank of each topic with a backlog or counters."""
    stats = metrics.monitor_data()["requestStatsList"]
    requests: dict[str, int] = {}
    for start in range(0, len(stats), SLICE):
        requests.update((s["topic"], sum(s[kind] for kind in REQUEST_STATS)) for s in stats[start:start + SLICE])
        await asyncio.sleep(0)
    topics = list(backlogs.keys() | metrics.topics.keys())
    ranks: dict[str, Rank] = {}
    for start in range(0, len(topics), SLICE):
        for topic in topics[start:start + SLICE]:
            backlog = backlogs.get(topic)
            ranks[topic] = (None if backlog is None else backlog[0] + backlog[1] + backlog[2], requests.get(topic, 0))
        await asyncio.sleep(0)
    return ranks


async def largest(ranks: dict[str, Rank], most: int) -> list[str]:
    """The `most` topics of `ranks` /metrics shows, by name: the largest
    backlogs (none counts 0), then the most requests in the last monitor
    interval, then the name; found with a heap of that size."""
    heap: list[tuple[int, int, str]] = []  # the `most` largest so far; heap[0] the smallest of them
    if most:
        items = list(ranks.items())
        for start in range(0, len(items), SLICE):
            for topic, (backlog, requests) in items[start:start + SLICE]:
                rank = (0 if backlog is None else backlog, requests, topic)
                if len(heap) < most:
                    heapq.heappush(heap, rank)
                elif rank > heap[0]:
                    heapq.heapreplace(heap, rank)
            await asyncio.sleep(0)
    return sorted(topic for _, _, topic in heap)


async def select_topics(metrics: Metrics, backlogs: dict[str, Backlog], most: int,
                        choice: Choice | None = None) -> TopicSelection:
    """The topics (those with a backlog or counters) whose series /metrics
    shows: at most `most`, the `largest` of their `topic_ranks` (dead
    letters are no backlog), unless `choice` names them. Also every
    topic's counters and backlog summed, and its dead letters where the
    backend counts them."""
    if choice is None:
        choice = Choice(await largest(await topic_ranks(metrics, backlogs), most), len(backlogs))
    backlog_totals = [0, 0, 0]
    dead_total: int | None = None
    values = list(backlogs.values())
    for start in range(0, len(values), SLICE):
        for backlog in values[start:start + SLICE]:
            backlog_totals[0] += backlog[0]
            backlog_totals[1] += backlog[1]
            backlog_totals[2] += backlog[2]
            if backlog[3] is not None:
                dead_total = (dead_total or 0) + backlog[3]
        await asyncio.sleep(0)
    counters = list(metrics.topics.values())
    counter_totals = [0] * len(COUNTERS)
    for start in range(0, len(counters), SLICE):
        for m in counters[start:start + SLICE]:
            for i, value in enumerate(_counter_values(m)):
                counter_totals[i] += value
        await asyncio.sleep(0)
    shown = choice.shown
    return TopicSelection(shown=shown, backlogs={t: backlogs[t] for t in shown if t in backlogs},
                          topics=choice.topics, counter_totals=tuple(counter_totals),
                          backlog_totals=(backlog_totals[0], backlog_totals[1], backlog_totals[2]),
                          dead_total=dead_total)
