"""DelayQueue: items that fall due at a time, earliest expiration first.

Kafka's SystemTimer keeps its wheel's buckets in a java.util.concurrent
DelayQueue; this is the same queue without the blocking: nothing here
sleeps or reads a clock. The caller asks when the head expires, sleeps
that long itself (on its injected clock), and polls. Two callers: the
timing wheel's non-empty slots (wheel.timing_wheel), and the broker's ack
deadlines and expiries of held messages (whose stale items `retain` drops).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class DelayQueue(Generic[T]):
    """Items that become due at an expiration time, earliest first.

    Only non-empty wheel slots are ever offered, so the queue's length is
    the number of slots that hold something, not the length of the time
    span they cover: a lone slot two hours ahead is one item and one wait.

    Worked example (expirations in ms):

        q.offer("b", 5_000)        -> True    (new head: wake the sleeper)
        q.offer("a", 2_000)        -> True    (earlier still: wake again)
        q.offer("c", 9_000)        -> False   (later than the head: no wake)
        q.peek_expiration_ms()     -> 2_000
        q.poll_expired(1_999)      -> None    (nothing due yet)
        q.poll_expired(5_000)      -> "a", then "b", then None

    Cost: offer and poll O(log n) in the n non-empty slots; peek O(1).
    Items with equal expirations come out in offer order. An item is not
    de-duplicated: the wheel offers each slot once, when it becomes
    non-empty. Single-threaded: call from one task.
    """

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, T]] = []
        self._offers = 0  # tie-breaker: FIFO among equal expirations, items never compared

    def offer(self, item: T, expiration_ms: int) -> bool:
        """Add `item`; True when it became the head (expires before all others),
        i.e. when whoever sleeps on this queue must be woken to re-plan."""
        self._offers += 1
        heapq.heappush(self._heap, (expiration_ms, self._offers, item))
        return self._heap[0][1] == self._offers

    def peek(self) -> T | None:
        return self._heap[0][2] if self._heap else None

    def peek_expiration_ms(self) -> int | None:
        """When the head expires, or None if the queue is empty."""
        return self._heap[0][0] if self._heap else None

    def poll_expired(self, now_ms: int) -> T | None:
        """Remove and return the head if it has expired at now_ms, else None."""
        if self._heap and self._heap[0][0] <= now_ms:
            return heapq.heappop(self._heap)[2]
        return None

    def retain(self, keep: Callable[[T, int], bool]) -> int:
        """Keep only the items for which `keep(item, expiration_ms)` is true;
        how many were dropped. O(n): for a caller that lets stale items
        pile up rather than find each one (the queue has no remove), and
        compacts once they outnumber the live ones. Offer order among
        equal expirations is kept."""
        kept = [entry for entry in self._heap if keep(entry[2], entry[0])]
        dropped = len(self._heap) - len(kept)
        if dropped:
            heapq.heapify(kept)
            self._heap = kept
        return dropped

    def __len__(self) -> int:
        return len(self._heap)

    def __repr__(self) -> str:
        head = f", head={self._heap[0][2]!r} at {self._heap[0][0]}" if self._heap else ""
        return f"DelayQueue(len={len(self._heap)}{head})"
