"""What the timing wheel reads from the delay logs, and an in-memory stand-in.

The wheel never scans the delay logs. It asks three questions, each cheap:

    next_hour(from_hour)      which hour file is the next non-empty one?
                              (the hours wheel: empty hours are never visited)
    second_counts(hour)       how many entries does each second of that hour
                              hold? (the hour's second table, 3600 ints)
    read_second(hour, second) every entry of one second, walked back along
                              its preGlobalIndex chain (the preload)

`storage.store.Store` answers them from disk; `InMemorySlotSource` answers
them from dicts laid out the same way (a second table of last globalIndex
per second, entries chained by preGlobalIndex), for tests and as the
reference.

Filing rule (storage's, restated because the wheel depends on it): an entry
is filed under the (hour, second) of max(trigger_ms, now_ms) at the moment
it is stored, keeping its real trigger_ms. So its second is never earlier
than its trigger's own second, and is later only for messages that were
already due when stored. Within a second, local_index counts 0, 1, 2, ...
in arrival order, which is not trigger order.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from typing import Protocol

from storage.entry import SECONDS_PER_HOUR, IndexEntry, Location, Status, hour_and_second


class SlotSource(Protocol):
    """Like a Mapping[(hour, second), list[IndexEntry]] that can also say
    which hours are non-empty and how full each second is."""

    def next_hour(self, from_hour: int) -> int | None:
        """The smallest hour >= from_hour holding any entry, else None."""
        ...

    def second_counts(self, hour: int) -> Sequence[int]:
        """3600 ints: entries filed under each second of `hour`, whatever
        their status. Cheap: a table in memory."""
        ...

    def read_second(self, hour: int, second: int) -> list[IndexEntry]:
        """Every entry filed under that second, local_index ascending, with
        its current status. Cost proportional to the second's entries."""
        ...


class _Hour:
    """One hour as storage files it: entries by globalIndex, and the second
    table (count and last globalIndex of every second)."""

    __slots__ = ("entries", "counts", "last_global")

    def __init__(self) -> None:
        self.entries: list[IndexEntry] = []
        self.counts = [0] * SECONDS_PER_HOUR
        self.last_global = [-1] * SECONDS_PER_HOUR


class InMemorySlotSource:
    """The reference `SlotSource`: storage's layout held in dicts.

    Worked example (hour h = 472_000, i.e. h * 3_600_000 ms since the epoch):

        add(t + 5_250, 0, now_ms=t)   t = h's start -> (h, 5),  local 0, global 0
        add(t + 5_100, 9, now_ms=t)                  -> (h, 5),  local 1, global 1, pre 0
        add(t - 60_000, 0, now_ms=t + 7_000)  late   -> (h, 7),  local 0, global 2
        read_second(h, 5) -> [global 0, global 1]   (arrival order, not trigger order)

    `seconds_read` and `counts_read` count the calls, so tests can show what
    the wheel read and when. Not thread-safe; nothing here reads a clock.
    """

    def __init__(self) -> None:
        self._hours: dict[int, _Hour] = {}
        self._sorted_hours: list[int] = []
        self.seconds_read = 0
        self.counts_read = 0

    def add(self, trigger_ms: int, priority: int, now_ms: int, *, topic_hash: int = 0,
            tag_hash: int = 0) -> IndexEntry:
        """File a new WAITING entry under max(trigger_ms, now_ms), as storage does."""
        hour, second = hour_and_second(max(trigger_ms, now_ms))
        h = self._hours.get(hour)
        if h is None:
            h = self._hours[hour] = _Hour()
            bisect.insort(self._sorted_hours, hour)
        entry = IndexEntry(hour=hour, second=second, local_index=h.counts[second],
                           global_index=len(h.entries), pre_global_index=h.last_global[second],
                           trigger_ms=trigger_ms, priority=priority, topic_hash=topic_hash,
                           tag_hash=tag_hash, status=Status.WAITING, retry=0)
        h.entries.append(entry)
        h.counts[second] += 1
        h.last_global[second] = entry.global_index
        return entry

    def set_status(self, location: Location, status: Status) -> IndexEntry:
        """Change the status of the entry at `location`; returns the new entry."""
        h = self._hours[location.hour]
        entry = h.entries[location.global_index]._replace(status=status)
        h.entries[location.global_index] = entry
        return entry

    def get(self, location: Location) -> IndexEntry:
        return self._hours[location.hour].entries[location.global_index]

    def __iter__(self) -> Iterator[IndexEntry]:
        """Every entry, hour by hour, globalIndex ascending."""
        for hour in self._sorted_hours:
            yield from self._hours[hour].entries

    def __len__(self) -> int:
        return sum(len(h.entries) for h in self._hours.values())

    # -- SlotSource --------------------------------------------------------

    def next_hour(self, from_hour: int) -> int | None:
        i = bisect.bisect_left(self._sorted_hours, from_hour)
        return self._sorted_hours[i] if i < len(self._sorted_hours) else None

    def second_counts(self, hour: int) -> Sequence[int]:
        self.counts_read += 1
        h = self._hours.get(hour)
        return tuple(h.counts) if h is not None else (0,) * SECONDS_PER_HOUR

    def read_second(self, hour: int, second: int) -> list[IndexEntry]:
        self.seconds_read += 1
        h = self._hours.get(hour)
        if h is None:
            return []
        out = []
        global_index = h.last_global[second]
        while global_index != -1:  # walk the preGlobalIndex chain back, as storage does
            entry = h.entries[global_index]
            out.append(entry)
            global_index = entry.pre_global_index
        out.reverse()
        return out

    def __repr__(self) -> str:
        return (f"InMemorySlotSource(hours={len(self._hours)}, entries={len(self)}, "
                f"seconds_read={self.seconds_read}, counts_read={self.counts_read})")
