"""The pending runs the schedules' worker reads again at a time (its safety
net: broker.schedules.keeper's module docstring), kept in buckets of
BUCKET_MS.

A check of time t falls in the bucket ending at the first multiple of
BUCKET_MS at or after t, and comes due at that end: never before its
time, at most BUCKET_MS - 1 ms after it. The buckets' ends are a heap; a
bucket is a list. So a check costs O(1) to add and to take (a new bucket:
O(log b) of the b buckets), however many share a millisecond -- 10,000
every-second schedules put their checks at the same few milliseconds,
where a heap of (time, schedule, run) entries compared each tie's
schedule names, some 5-7 us a pop.

    checks.add(at_ms, key, nominal_ms, now_ms)
    checks.due_ms()                  # when the first bucket comes due (None: empty)
    checks.take_due(now_ms, most)    # up to `most` of the due ones, earliest bucket first
    checks.keep(wanted)              # only those `wanted(key, nominal_ms)` says, once each
    checks.far_added                 # added more than FAR_MS ahead since the last `keep`

A check whose run has moved on (released and followed, deleted) stays
until it comes due, and is then taken and passed over: those of runs
due soon go by themselves. Those far ahead (a schedule put, paused or
deleted long before its run's time) would stay for as long: the keeper
calls `keep` once enough were added far ahead (`far_added`).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from .file import Key

BUCKET_MS = 100
# A check this far ahead of its adding counts in `far_added`.
FAR_MS = 10_000


class Checks:
    def __init__(self) -> None:
        self._buckets: dict[int, list[tuple[Key, int]]] = {}  # bucket's end (ms) -> its checks
        self._ends: list[int] = []  # the buckets' ends, a heap
        self._count = 0
        self.far_added = 0

    def __len__(self) -> int:
        return self._count

    def __repr__(self) -> str:
        return f"Checks({self._count} in {len(self._ends)} buckets)"

    def add(self, at_ms: int, key: Key, nominal_ms: int, now_ms: int) -> None:
        """Check `key`'s run `nominal_ms` once `at_ms` has come (in its bucket's end)."""
        if at_ms - now_ms > FAR_MS:
            self.far_added += 1
        end = -(-at_ms // BUCKET_MS) * BUCKET_MS
        bucket = self._buckets.get(end)
        if bucket is None:
            bucket = self._buckets[end] = []
            heapq.heappush(self._ends, end)
        bucket.append((key, nominal_ms))
        self._count += 1

    def due_ms(self) -> int | None:
        """When the earliest checks come due (None: none kept)."""
        return self._ends[0] if self._ends else None

    def take_due(self, now_ms: int, most: int) -> list[tuple[Key, int]]:
        """Up to `most` checks due by `now_ms`, out of the buckets: the
        earliest bucket's first (within one, in no particular order)."""
        taken: list[tuple[Key, int]] = []
        ends, buckets = self._ends, self._buckets
        while ends and ends[0] <= now_ms and len(taken) < most:
            bucket = buckets[ends[0]]
            room = most - len(taken)
            if len(bucket) <= room:
                taken += bucket
                del buckets[heapq.heappop(ends)]
            else:
                taken += bucket[-room:]
                del bucket[-room:]
        self._count -= len(taken)
        return taken

    def keep(self, wanted: Callable[[Key, int], bool]) -> None:
        """Only the checks `wanted` says, each (schedule, run) once (in its
        earliest bucket): one pass over all of them."""
        seen: set[tuple[Key, int]] = set()
        buckets: dict[int, list[tuple[Key, int]]] = {}
        for end in sorted(self._buckets):
            kept = []
            for check in self._buckets[end]:
                if check not in seen and wanted(*check):
                    seen.add(check)
                    kept.append(check)
            if kept:
                buckets[end] = kept
        self._buckets = buckets
        self._ends = sorted(buckets)  # (a sorted list is a heap)
        self._count = len(seen)
        self.far_added = 0
