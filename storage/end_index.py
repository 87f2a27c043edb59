"""On-disk index from an ended message's location to when it ended (or
was last sent again): what a topic's `dedupWindowMillis` measures
(docs/api.md, "Deduplication window").

Only the ends the broker asks for are kept: those of messages of topics
that had a dedup window when they ended. The id index already finds an
ended message by (topic, msgId) while retention keeps it; what no file
holds is the time it ended (an index entry has no room for it, and a
STATE record's time leaves with its commit-log segment). So this index
keeps that time, by location, for as long as the message's file lives,
and RAM does not grow with it.

Directory `ends/`, in the id index's format (storage.id_index: the same
`secret` file and `<shard:02x>.hix` shards, byte for byte, 64 shards of
open-addressing slots, each doubling on its own), its slots used as the
key index's counters are (IdIndex.add: a slot whose globalIndex field
holds a number):

    slot key                                  slot holds (file = its hour)
    derive(hour << 32 | globalIndex, hi)      lo + 1

    where the time t (ms since the epoch) = hi * 2**31 + lo,
          hi = t >> 31, lo = t & (2**31 - 1)

A slot's 32-bit number field cannot hold a whole time, so its high part
is in the key: a lookup at `now_ms` probes hi = now >> 31 and the one
before (two probes at most), and takes the later time found. A time in
neither is at least 2**31 ms (24.8 days) old: older than any window
(MAX_WINDOW_MS), so "not found" is the right answer for it.

Worked example: a message at (490000, 7) acked at t = 1,764,000,000,123:
hi = 821, lo = 893,872,251 (t - 821 * 2**31); the slot
derive(490000 << 32 | 7, 821) holds 893,872,252. Sent again at
t + 5,000, under a window of 60,000: `ended_at` finds it under hi = 821,
answers t, the send is a duplicate, and its record moves the slot on to
t + 5,000 (`record` keeps the later of the two: a replay of older
records changes nothing).

Every slot dies with its file (a retired file's slots are dead, reused or
dropped when a shard doubles), so the index holds live files only: at
most one slot per ended message that retention keeps, plus one when its
time crosses a 2**31 ms boundary -- bounded by what the store keeps,
16 bytes a slot, at 35 to 70% load.

What is put, and when (storage.applying): a STATE or PART record's item
with FLAG_END_TIME (storage.delay_index) -- set by the placement on a
change that ends a message of a windowed topic, and on a duplicate send
the window answered -- puts its location at the record's time. The end
times are not derived from any other file: a crash replays the records
after the checkpoint (the slots are flushed with the checkpoint, as the
id index's); an index that is missing or damaged is made again empty, and
the ends it held are forgotten (those ids are then stored anew when sent
again: camellia's rule), which `rebuilt` reports; a slot whose check byte
fails is answered as forgotten too, counted in `damaged`.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterable

from .config import StoreConfig
from .disk import Disk
from .entry import Location
from .errors import CorruptionError, NewerFormatError
from .id_index import IdIndex, Residency
from .key_index import derive

HI_SHIFT = 31
LO_MASK = (1 << HI_SHIFT) - 1
# The longest window a lookup answers for: what two probes cover.
MAX_WINDOW_MS = 1 << HI_SHIFT


def end_key(hour: int, global_index: int, hi: int) -> int:
    """The slot key of the message at (hour, global_index) for times whose high part is `hi`."""
    return derive(hour << 32 | global_index, hi)


class EndIndex:
    """Location -> the time its message ended or was last sent again (see
    the module docstring). One thread calls it: the store's.

    Cost: `record_many` is two probe sequences an item (read the slot,
    move it on); `ended_at` two or four. Memory is the mapped pages
    touched, returned to the page cache after each checkpoint (`shed`)."""

    def __init__(self, slots: IdIndex, rebuilt: str | None = None) -> None:
        self.slots = slots  # the shards, in the id index's format
        self.rebuilt = rebuilt  # why it was made again empty at opening (None: opened as it was)
        self.damaged = 0  # slots whose check byte failed at a look-up (that end forgotten)

    @classmethod
    def open(cls, directory: str, config: StoreConfig, is_live: Callable[[int], bool], disk: Disk,
             residency: Residency | None = None) -> EndIndex:
        """The index in `directory`, or a new empty one when it is missing or
        damaged (a torn or corrupt shard: its ends are forgotten)."""
        reason = None
        if IdIndex.is_current(directory):
            try:
                return cls(IdIndex.open(directory, config.id_shard_initial_slots, is_live, disk=disk,
                                        residency=residency))
            except NewerFormatError:  # not damage: refused, never made again
                raise
            except CorruptionError as e:
                reason = str(e)
            shutil.rmtree(directory)
        elif os.path.isdir(directory):
            reason = f"{directory} is incomplete"
            shutil.rmtree(directory)
        slots = IdIndex.build(directory, config.id_shard_initial_slots, is_live, disk=disk,
                              residency=residency)
        try:
            slots.publish()
        except BaseException:
            slots.close()
            raise
        return cls(slots, reason)

    def record_many(self, items: Iterable[tuple[int, int, int]]) -> None:
        """Each (hour, globalIndex, time): the message there ended, or was
        sent again, at that time (the later of it and the time kept)."""
        slots = self.slots
        for hour, global_index, time_ms in items:
            key = end_key(hour, global_index, time_ms >> HI_SHIFT)
            stored = (time_ms & LO_MASK) + 1
            try:
                held = slots.count(key, hour)
                if stored > held:
                    slots.add(key, hour, stored - held)
            except CorruptionError:  # that slot's check byte fails: this end is forgotten
                self.damaged += 1

    def ended_at(self, where: Location, now_ms: int) -> int | None:
        """When the message at `where` ended or was last sent again, if that
        was recorded and less than MAX_WINDOW_MS before `now_ms`'s high part
        began; else None."""
        hour, gi = where
        hi = now_ms >> HI_SHIFT
        for h in (hi, hi - 1):
            try:
                stored = self.slots.count(end_key(hour, gi, h), hour)
            except CorruptionError:  # a slot's check byte fails: answered as forgotten
                self.damaged += 1
                return None
            if stored:
                return (h << HI_SHIFT) + stored - 1
        return None

    def flush(self) -> None:
        self.slots.flush()

    def shed(self) -> None:
        self.slots.shed()

    def disk_bytes(self) -> int:
        return self.slots.disk_bytes()

    def close(self) -> None:
        self.slots.close()

    def __repr__(self) -> str:
        return f"EndIndex({self.slots!r}, rebuilt={self.rebuilt is not None}, damaged={self.damaged})"
