"""What the timing wheel reads from the delay logs.

The wheel never scans the delay logs. It asks three questions, each cheap:

    next_hour(from_hour)      which hour file is the next non-empty one?
                              (the hours wheel: empty hours are never visited)
    second_counts(hour)       how many entries does each second of that hour
                              hold? (the hour's second table, 3600 ints)
    read_second(hour, second) every entry of one second, walked back along
                              its preGlobalIndex chain (the preload)

`storage.store.Store` answers them from disk; the tests' reference,
`InMemorySlotSource` (tests/fakes.py), answers them from dicts laid out the
same way (a second table of last globalIndex per second, entries chained by
preGlobalIndex).

Filing rule (storage's, restated because the wheel depends on it): an entry
is filed under the (hour, second) of max(trigger_ms, now_ms) at the moment
it is stored, keeping its real trigger_ms. So its second is never earlier
than its trigger's own second, and is later only for messages that were
already due when stored. Within a second, local_index counts 0, 1, 2, ...
in arrival order, which is not trigger order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from storage.entry import IndexEntry


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
