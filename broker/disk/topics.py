"""What the disk broker knows of its topics: which it has, the --max-topics
cap on new ones, camellia's TopicInfo and the backlogs /metrics shows.

A topic exists while the store names it (a message of it in a live hour)
or a ready window holds it. A send to a new topic is refused (LimitReached,
429, nothing stored) if it would make more than --max-topics, counting the
store's topics plus those of sends appended but not yet applied (which the
store does not name yet). The reads scan per-hour counts, not messages, a
slice at a time between other work.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from storage.entry import MS_PER_HOUR, Status
from storage.store import NewMessage, Store, text_hash, total_counts
from wheel.clock import Clock

from ..backend import WAITING_BUCKETS, topic_cap_error, topic_info_json, waiting_bucket
from ..observe.metrics import Backlog
from .group_commit import GroupCommit
from .ready import QueueLimits
from .windows import ReadyWindows

# Index entries classified per slice by getTopicInfo before it lets other
# work run (a large hour would otherwise stall dispatch for its whole scan).
SCAN_CHUNK = 4096
# Index entries a topic-info scan reads between yields to the loop (about
# 5 ms of the loop's time: storage.delay_index.count_waiting).
BUCKET_SCAN_CHUNK = 8_192


class Topics:
    """The topic reads and the topic cap. Runs on the event loop."""

    def __init__(self, store: Store, clock: Clock, commits: GroupCommit, windows: ReadyWindows,
                 limits: QueueLimits) -> None:
        self._store = store
        self._clock = clock
        self._commits = commits
        self._windows = windows
        self._limits = limits
        # The topics the store has (`Store.topic_set`): a send to one of
        # them needs no `new_topics`.
        self.stored = store.topic_set
        # Topics of sends appended but maybe not applied yet, which the store
        # does not name yet: counted against --max-topics.
        self._filing: set[str] = set()

    def __repr__(self) -> str:
        return f"Topics(stored={self._store.topic_count()}, filing={len(self._filing)})"

    def has_topic(self, topic: str) -> bool:
        return topic in self._windows.topics or self._store.has_topic(topic)

    def topic_list(self) -> list[str]:
        return sorted(set(self._store.topic_names().values()) | set(self._windows.topics))

    def new_topics(self, batch: Sequence[NewMessage]) -> set[str]:
        """The topics of `batch` the node does not have yet; LimitReached
        (429, nothing stored) if they would make more than --max-topics."""
        stored = self.stored
        new: set[str] = set()
        last = None
        for m in batch:  # (a batch's messages share their topic, as a rule)
            topic = m.topic
            if topic != last:
                last = topic
                if topic not in new and topic not in stored:
                    new.add(topic)
        if new:
            self._filing = {topic for topic in self._filing if topic not in stored}
            topics = self._store.topic_count() + len(self._filing)
            if topics + len(new - self._filing) > self._limits.topics:
                raise topic_cap_error(topics, self._limits.topics)
        return new

    def filing(self, topics: set[str]) -> None:
        """Sends to these new topics were appended (the store names them once applied)."""
        self._filing |= topics

    async def topic_info(self, topic: str) -> dict[str, object]:
        """camellia's TopicInfo of `topic` (`topic_infos` of it alone)."""
        return (await self.topic_infos([topic]))[0]

    async def topic_infos(self, topics: Sequence[str]) -> list[dict[str, object]]:
        """camellia's TopicInfo of each of `topics` (queue sizes and the
        waiting queue's delay buckets), once every change made so far is
        committed, in one pass: an hour that straddles a bucket edge is read
        once for all of them (its entries, a slice at a time between
        requests), not once per topic."""
        await self._commits.flush()
        store = self._store
        names = store.topic_names()
        now_ms = self._clock.now_ms()
        infos: list[tuple[str, list[int], list[int]]] = []
        wanted: dict[int, list[int]] = {}
        straddling: set[int] = set()
        for topic in topics:
            topic_hash = text_hash(topic)
            hours = store.topic_hours(topic_hash) if names.get(topic_hash) == topic else []
            buckets = [0] * len(WAITING_BUCKETS)
            for hour, counts in hours:
                if not counts[Status.WAITING]:
                    continue
                first_hour, last_hour = store.file_hours(hour)  # (a span covers many)
                first = waiting_bucket(first_hour * MS_PER_HOUR - now_ms)
                if first == waiting_bucket((last_hour + 1) * MS_PER_HOUR - 1 - now_ms):
                    buckets[first] += counts[Status.WAITING]
                else:
                    straddling.add(hour)
                    wanted[topic_hash] = buckets
            infos.append((topic, total_counts(hours), buckets))
        # a straddling file's waiting entries of the wanted topics, counted by
        # trigger time against the buckets' edges (waiting_bucket's rule:
        # a message due in `until` ms is in the first bucket whose upper bound
        # exceeds it), a slice at a time between yields to the loop
        edges = [now_ms + upper for _, upper in WAITING_BUCKETS if upper is not None]
        for hour in sorted(straddling):
            start = 0
            while read := store.count_waiting(hour, start, BUCKET_SCAN_CHUNK, wanted, edges):
                start += read
                await asyncio.sleep(0)
        answers = []
        for topic, totals, buckets in infos:
            oldest_ms = self._windows.oldest_ready_ms(topic) if totals[Status.READY] else None
            held_ms = self._windows.first_handed_over_ms(topic) if totals[Status.CONSUMING] else None
            answers.append(topic_info_json(topic, totals[Status.WAITING], buckets, totals[Status.READY],
                                           totals[Status.CONSUMING], oldest_ms, now_ms,
                                           0 if held_ms is None else max(0, now_ms - held_ms)))
        return answers

    async def topic_backlogs(self) -> dict[str, Backlog]:
        """(waiting, ready, consuming, dead) of every topic the store names
        (committed changes; dead: EXPIRED and ENDED, the dead letters
        retention still keeps), summed over the hours' per-topic counts in
        one pass, SCAN_CHUNK (hour, topic) pairs between yields to the loop."""
        names = self._store.topic_names()
        totals: dict[int, tuple[int, int, int, int]] = dict.fromkeys(names, (0, 0, 0, 0))
        pairs = 0
        for counts_of_hour in self._store.hour_topic_counts():
            for topic_hash, counts in counts_of_hour:
                waiting, ready, consuming, dead = totals.get(topic_hash, (0, 0, 0, 0))
                totals[topic_hash] = (waiting + counts[Status.WAITING], ready + counts[Status.READY],
                                      consuming + counts[Status.CONSUMING],
                                      dead + counts[Status.EXPIRED] + counts[Status.ENDED])
            pairs += len(counts_of_hour)
            if pairs >= SCAN_CHUNK:
                pairs = 0
                await asyncio.sleep(0)
        return {names[topic_hash]: counts for topic_hash, counts in totals.items() if topic_hash in names}
