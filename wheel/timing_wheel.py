"""Two-level timing wheel over the delay logs' (hour, second) grid."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import NamedTuple

from storage.entry import MS_PER_HOUR, MS_PER_SECOND, SECONDS_PER_HOUR
from storage.errors import ConfigError, ContractError, InvariantError

from .delay_queue import DelayQueue


def format_second(abs_s: int) -> str:
    """An absolute second (seconds since the epoch) as `hour:second`, the
    delay logs' own coordinates: 472002:0300 is second 300 of hour 472002."""
    hour, second = divmod(abs_s, SECONDS_PER_HOUR)
    return f"{hour}:{second:04d}"


class Level(enum.Enum):
    """Where `TimingWheel.offer` put a second."""

    MEMORY = "memory"  # already loaded: the caller keeps the entry in RAM itself
    SECONDS = "seconds"  # the seconds wheel has a slot for it
    HOURS = "hours"  # the hours wheel has a slot for its hour


class Slot(NamedTuple):
    """A non-empty slot of either wheel, as it sits in the DelayQueue."""

    level: Level  # SECONDS or HOURS
    start_s: int  # absolute second the slot begins (an hour slot: its second 0)

    @property
    def hour(self) -> int:
        return self.start_s // SECONDS_PER_HOUR

    @property
    def second(self) -> int:
        return self.start_s % SECONDS_PER_HOUR

    @property
    def start_ms(self) -> int:
        return self.start_s * MS_PER_SECOND

    def __repr__(self) -> str:
        if self.level is Level.HOURS:
            return f"Slot(hour {self.hour})"
        return f"Slot(second {format_second(self.start_s)})"


class Offer(NamedTuple):
    level: Level
    expiration_ms: int | None  # set when a new slot entered the DelayQueue


class TimingWheel:
    """A seconds wheel (3600 slots of 1 s) under an hours wheel, whose
    non-empty slots wait in a `DelayQueue`; it tells its owner when each
    slot must be acted on, never reads a clock, never holds a message.

    The unit of the seconds wheel is one second of one hour file (u = 1 s,
    n = 3600 slots, interval 1 h). The hours wheel's slots are the hour
    files themselves: storage's `next_hour` is its overflow, so a delay of
    years costs one DelayQueue item, like Kafka's overflow wheels but with
    storage keeping the empty slots. The wheel keeps:

        loaded_below_s  L: every second before L has been loaded into RAM
                        (or was empty when L passed it); entries for those
                        seconds are the owner's, not the wheel's.
        seconds wheel   bytearray(3600): slot (S % 3600) set while second S
                        is known non-empty and not loaded yet. Every such S
                        is in [L, L + 3600), so the index is unambiguous.
        hours wheel     the set of hours known non-empty whose seconds are
                        not on the seconds wheel yet ("not cascaded").

    Each slot is in the DelayQueue once, expiring `lead_ms` before it
    starts (the preload lead): an hour slot at hour_start - lead, when its
    3600-count table is read and its non-empty seconds cascade onto the
    seconds wheel; a second slot at second_start - lead, when its owner
    reads the second's entries into RAM. Both expire in start order, so
    the DelayQueue's head is also the earliest unloaded slot.

    Worked example: lead 10 s, now 10:00:00 of hour h, one message due
    12:05:00.250 (hour h+2, second 300) and nothing else.

        now        call                         L           DelayQueue
        10:00:00   offer(h+2:0300) -> HOURS     h:0000      [hour h+2 @11:59:50]
        10:00:00   advance(now)                 h:0011      (head is far: L follows the clock)
        11:59:50   pop_expired -> hour h+2      h+2:0000    []
                   cascade(h+2, counts)         h+2:0000    [second h+2:0300 @12:04:50]
                   advance(now)                 h+2:0001    (follows the clock: 0001..0299 are empty)
        12:04:50   pop_expired -> second 300    h+2:0301    []   owner reads second 300
        12:05:00.250                            the owner releases the message from RAM

    Three wake-ups for a 2 h 5 min wait; a wheel ticking every second would
    make 7,500, and one without a DelayQueue would spin through them.

    Cost: offer O(1) when the slot already exists, else one DelayQueue push
    (O(log n), n = non-empty pending slots); pop O(log n); cascade O(3600)
    once per non-empty hour. Memory: 3600 bytes plus one queue item per
    non-empty pending slot: at most 3600 seconds and a few hours.

    Who calls what: one owner (the `Scheduler`), from one task. It offers
    every new second, pops expired slots and must load a popped second
    (and cascade a popped hour) before the next offer, and keeps the
    queue holding the next non-empty hour (it asks storage's `next_hour`
    after each cascade). The wheel is plain data: no I/O, no locks.
    """

    def __init__(self, loaded_below_s: int, lead_ms: int) -> None:
        if lead_ms < 0:
            raise ConfigError(f"lead_ms must be >= 0, got {lead_ms}")
        self.lead_ms = lead_ms
        # L: seconds before this are loaded (the owner holds their entries).
        # Read by the owner; only the wheel moves it (a plain attribute: read
        # for every stored message).
        self.loaded_below_s = loaded_below_s
        self._seconds = bytearray(SECONDS_PER_HOUR)
        self._second_slots = 0
        self._hours: set[int] = set()
        self._queue: DelayQueue[Slot] = DelayQueue()

    @property
    def first_pending_s(self) -> int | None:
        """The earliest second whose entries are still only on disk, or None.
        (An hour slot that starts before L stands for its seconds from L on.)"""
        head = self._queue.peek()
        return None if head is None else max(head.start_s, self.loaded_below_s)

    def next_expiration_ms(self) -> int | None:
        """When the earliest slot must be acted on, or None: nothing pending."""
        return self._queue.peek_expiration_ms()

    def offer(self, abs_s: int) -> Offer:
        """A new entry was stored in second `abs_s`: make sure a slot covers it."""
        new = tuple.__new__  # (Offer's own __new__ is Python code: offered once per stored message)
        if abs_s < self.loaded_below_s:
            return new(Offer, (Level.MEMORY, None))
        hour = abs_s // SECONDS_PER_HOUR
        if hour <= self.loaded_below_s // SECONDS_PER_HOUR:
            if self._seconds[abs_s % SECONDS_PER_HOUR] and abs_s < self.loaded_below_s + SECONDS_PER_HOUR:
                return new(Offer, (Level.SECONDS, None))  # its second has a slot: `_add_second`'s answer
            return new(Offer, (Level.SECONDS, self._add_second(abs_s)))
        return new(Offer, (Level.HOURS, self.add_hour(hour)))

    def add_hour(self, hour: int) -> int | None:
        """Put a non-empty hour on the hours wheel; its expiration if new."""
        if hour in self._hours:
            return None
        self._hours.add(hour)
        expiration_ms = hour * MS_PER_HOUR - self.lead_ms
        self._queue.offer(Slot(Level.HOURS, hour * SECONDS_PER_HOUR), expiration_ms)
        return expiration_ms

    def cascade(self, hour: int, counts: Sequence[int]) -> int:
        """Move a popped hour's non-empty seconds (from L on) onto the seconds
        wheel; returns how many slots were added."""
        if len(counts) != SECONDS_PER_HOUR:
            raise ContractError(f"second_counts({hour}) has {len(counts)} values, expected {SECONDS_PER_HOUR}")
        base_s = hour * SECONDS_PER_HOUR
        if base_s > self.loaded_below_s:
            raise ContractError(f"cascade of hour {hour} before the wheel reached it "
                                f"(loaded below {format_second(self.loaded_below_s)})")
        added = 0
        for second in range(max(0, self.loaded_below_s - base_s), SECONDS_PER_HOUR):
            if counts[second] and self._add_second(base_s + second) is not None:
                added += 1
        return added

    def _add_second(self, abs_s: int) -> int | None:
        if not self.loaded_below_s <= abs_s < self.loaded_below_s + SECONDS_PER_HOUR:
            raise InvariantError(f"second {format_second(abs_s)} is outside the hour the seconds wheel holds "
                                 f"(from {format_second(self.loaded_below_s)})")
        index = abs_s % SECONDS_PER_HOUR
        if self._seconds[index]:
            return None
        self._seconds[index] = 1
        self._second_slots += 1
        expiration_ms = abs_s * MS_PER_SECOND - self.lead_ms
        self._queue.offer(Slot(Level.SECONDS, abs_s), expiration_ms)
        return expiration_ms

    def peek_expired(self, now_ms: int) -> Slot | None:
        """The head slot if it has expired at now_ms, without removing it."""
        expiration_ms = self._queue.peek_expiration_ms()
        return self._queue.peek() if expiration_ms is not None and expiration_ms <= now_ms else None

    def pop_expired(self, now_ms: int) -> Slot | None:
        """Remove and return the head slot if expired. The caller must then
        load a second slot's entries, or cascade an hour slot, at once."""
        slot = self._queue.poll_expired(now_ms)
        if slot is None:
            return None
        if slot.level is Level.SECONDS:
            self._seconds[slot.start_s % SECONDS_PER_HOUR] = 0
            self._second_slots -= 1
            self.loaded_below_s = max(self.loaded_below_s, slot.start_s + 1)
        else:
            self._hours.discard(slot.hour)
            self.loaded_below_s = max(self.loaded_below_s, slot.start_s)
        return slot

    def advance(self, now_ms: int) -> None:
        """Move L over the seconds due for preloading at now_ms (those that
        start before now_ms + lead_ms) but never past a pending slot: those
        seconds are empty, so there is nothing to load. Never moves back."""
        frontier_s = (now_ms + self.lead_ms) // MS_PER_SECOND + 1
        head = self._queue.peek()
        if head is not None:
            frontier_s = min(frontier_s, head.start_s)
        if frontier_s > self.loaded_below_s:
            self.loaded_below_s = frontier_s

    def __len__(self) -> int:
        """Pending slots (seconds and hours)."""
        return len(self._queue)

    def __repr__(self) -> str:
        return (f"TimingWheel(loaded_below={format_second(self.loaded_below_s)}, "
                f"second_slots={self._second_slots}, hour_slots={sorted(self._hours)}, "
                f"head={self._queue.peek()!r})")
