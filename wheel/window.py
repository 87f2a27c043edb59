"""The preload window: entries of loaded seconds, held in RAM until due."""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator

from storage.entry import MS_PER_SECOND, SECONDS_PER_HOUR, IndexEntry, Location, Status

from .timing_wheel import format_second

# Release order: trigger time, then higher priority first, then storage order.
_Key = tuple[int, int, int, int]  # (trigger_ms, -priority, hour, global_index)


def release_key(entry: IndexEntry) -> _Key:
    """The order in which due entries are released."""
    return (entry.trigger_ms, -entry.priority, entry.hour, entry.global_index)


def abs_second(entry: IndexEntry) -> int:
    """The absolute second (since the epoch) an entry is filed under."""
    return entry.hour * SECONDS_PER_HOUR + entry.second


class _Second:
    """One second held in the window: its entries not yet activated, and how
    far its release has come in local_index terms (for the tick)."""

    __slots__ = ("abs_s", "done_ahead", "known_end", "pending", "pending_min_ms", "prefix", "seen")

    def __init__(self, abs_s: int, prefix: int) -> None:
        self.abs_s = abs_s
        self.prefix = prefix  # every local_index below this is done
        self.seen: set[int] = set()  # local indexes >= prefix the window knows of
        self.done_ahead: set[int] = set()  # of those, the done ones (released out of local order)
        self.known_end = prefix  # 1 + the highest local_index known
        self.pending: list[IndexEntry] | None = []  # waiting for activation; None once active
        self.pending_min_ms: int | None = None  # earliest trigger among `pending`

    def knows(self, local_index: int) -> bool:
        return local_index < self.prefix or local_index in self.seen

    def learn(self, local_index: int) -> None:
        self.seen.add(local_index)
        if local_index >= self.known_end:
            self.known_end = local_index + 1

    def mark_done(self, local_index: int) -> None:
        self.done_ahead.add(local_index)
        while self.prefix in self.done_ahead:
            self.done_ahead.remove(self.prefix)
            self.seen.discard(self.prefix)
            self.prefix += 1

    @property
    def complete(self) -> bool:
        """Every entry known is done, with no gap of unknown local indexes."""
        return self.prefix >= self.known_end


class PreloadWindow:
    """The entries of the loaded seconds (normally the next ~10 s), released
    at their exact trigger millisecond in (trigger_ms, -priority, hour,
    global_index) order, plus each second's release progress.

    Two stages keep insertion O(1) without sorting anything ahead of time
    (seed 003's point): a second's entries first sit in an unsorted list
    (`pending`), appended to in O(1); when the earliest of them is due, the
    second is activated: its list joins one heap of active entries, from
    which due entries are popped in order. Entries already due when they
    arrive (filed after their trigger) go straight to the heap.

    Worked example (times are ms into second 5 of some hour; entries x, y, z
    of second 5 with local indexes 0, 1, 2):

        load(5, [x due 5.800, y due 5.200 prio 0, z due 5.200 prio 9])
            -> pending[5] = [x, y, z], activation at 5.200
        next_due_ms() -> 5.200
        activate(5.200); pop_due(5.200) -> [z, y]   (same ms: priority 9 first)
            progress of second 5: done {1, 2}, prefix 0 (x, local 0, waits)
        add(w: second 5, local 3, due 5.300)        -> heap (second 5 is active)
        pop_due(5.800) -> [w, x]; prefix 4: second 5 complete

    Progress: a second's `prefix` is the length of its fully released run
    of local indexes (released, cancelled, or not WAITING when read); the
    tick is built from it, so a restart re-reads exactly what may be
    unreleased. A local index the window has not seen yet stops the prefix,
    so a gap (entries reported out of order) can only hold the tick back.

    De-duplication: an entry whose (second, local_index) the window already
    knows is ignored, so an entry both read by `load` and reported by `add`
    is held once. Completed seconds are dropped by `retire`.

    Cost: add O(1) into a pending second, O(log n) into an active one;
    activation O(k) for k entries (one heapify) or O(k log n); pop O(log n)
    per entry; cancel O(1) (the heap copy is skipped lazily). Memory: the
    held entries plus a few ints per held second.

    Who calls what: the `Scheduler` only, from one task.
    """

    def __init__(self) -> None:
        self._seconds: dict[int, _Second] = {}
        self._held: dict[Location, IndexEntry] = {}
        self._active: list[_Key] = []
        self._activations: list[tuple[int, int]] = []  # (ms, abs_s); stale items skipped

    def open_second(self, abs_s: int, done_below_local: int) -> None:
        """Start tracking `abs_s` with its local indexes below `done_below_local`
        already done (the second of a restored tick)."""
        if abs_s not in self._seconds:
            self._seconds[abs_s] = _Second(abs_s, done_below_local)

    def load(self, abs_s: int, entries: Iterable[IndexEntry]) -> int:
        """Take a second as read from storage; returns how many are now held."""
        self.open_second(abs_s, 0)
        held = 0
        for entry in entries:
            if self.add(entry) is not None:
                held += 1
        return held

    def add(self, entry: IndexEntry) -> int | None:
        """Hold a new entry of a loaded second. Returns its trigger_ms if it is
        now held, None if it was known already or is not WAITING."""
        abs_s = abs_second(entry)
        second = self._seconds.get(abs_s)
        if second is None:
            second = self._seconds[abs_s] = _Second(abs_s, 0)
        if second.knows(entry.local_index):
            return None
        second.learn(entry.local_index)
        if entry.status != Status.WAITING:
            second.mark_done(entry.local_index)
            return None
        self._held[entry.location] = entry
        if second.pending is not None and entry.trigger_ms >= abs_s * MS_PER_SECOND:
            second.pending.append(entry)
            if second.pending_min_ms is None or entry.trigger_ms < second.pending_min_ms:
                second.pending_min_ms = entry.trigger_ms
                heapq.heappush(self._activations, (entry.trigger_ms, abs_s))
        else:
            heapq.heappush(self._active, release_key(entry))
        return entry.trigger_ms

    def cancel(self, location: Location) -> bool:
        """Forget a held entry (deleted); True if it was held."""
        entry = self._held.pop(location, None)
        if entry is None:
            return False
        self._seconds[abs_second(entry)].mark_done(entry.local_index)
        return True

    def activate(self, now_ms: int) -> None:
        """Move every second whose earliest entry is due at now_ms into the heap."""
        while self._activations and self._activations[0][0] <= now_ms:
            ms, abs_s = heapq.heappop(self._activations)
            second = self._seconds.get(abs_s)
            if second is None or second.pending is None or second.pending_min_ms != ms:
                continue  # stale: activated already, or an earlier item superseded it
            keys = [release_key(e) for e in second.pending if e.location in self._held]
            second.pending = None
            second.pending_min_ms = None
            if self._active:
                for key in keys:
                    heapq.heappush(self._active, key)
            else:
                heapq.heapify(keys)
                self._active = keys

    def pop_due(self, now_ms: int, limit: int) -> list[IndexEntry]:
        """Release up to `limit` active entries with trigger_ms <= now_ms, in order."""
        out: list[IndexEntry] = []
        active = self._active
        while active and len(out) < limit and active[0][0] <= now_ms:
            _, _, hour, global_index = heapq.heappop(active)
            entry = self._held.pop(Location(hour, global_index), None)
            if entry is None:
                continue  # cancelled
            self._seconds[abs_second(entry)].mark_done(entry.local_index)
            out.append(entry)
        return out

    def next_due_ms(self) -> int | None:
        """The earliest time something held becomes due (activation or release)."""
        active, activations = self._active, self._activations
        while active and Location(active[0][2], active[0][3]) not in self._held:
            heapq.heappop(active)
        while activations:
            ms, abs_s = activations[0]
            second = self._seconds.get(abs_s)
            if second is not None and second.pending is not None and second.pending_min_ms == ms:
                break
            heapq.heappop(activations)
        candidates = [queue[0][0] for queue in (active, activations) if queue]
        return min(candidates) if candidates else None

    def first_due_ms(self) -> int | None:
        """When the earliest entry held was due: its trigger time, or the
        start of the second it was filed in if that is later (an entry
        filed after its trigger, the scheduler's `due_ms`); None if none is
        held."""
        self.next_due_ms()  # (drops the stale heads of both heaps)
        candidates = [ms for ms, _ in self._activations[:1]]  # (a pending second's entries are due in it)
        if self._active:
            _, _, hour, global_index = self._active[0]
            entry = self._held[Location(hour, global_index)]
            candidates.append(max(entry.trigger_ms, abs_second(entry) * MS_PER_SECOND))
        return min(candidates) if candidates else None

    def prefix_of(self, abs_s: int) -> int:
        """How many leading local indexes of `abs_s` are known done (0 if untracked)."""
        second = self._seconds.get(abs_s)
        return 0 if second is None else second.prefix

    def first_unreleased(self) -> tuple[int, int] | None:
        """(abs_s, local_index) of the earliest entry that may still be
        unreleased among the tracked seconds, or None."""
        return min(((s.abs_s, s.prefix) for s in self._seconds.values() if not s.complete), default=None)

    def retire(self, before_s: int) -> int:
        """Stop tracking complete seconds before `before_s`; returns how many."""
        done = [abs_s for abs_s, s in self._seconds.items() if abs_s < before_s and s.complete]
        for abs_s in done:
            del self._seconds[abs_s]
        return len(done)

    def __len__(self) -> int:
        """Entries held."""
        return len(self._held)

    def __iter__(self) -> Iterator[IndexEntry]:
        """The held entries, in no particular order."""
        return iter(self._held.values())

    @property
    def tracked_seconds(self) -> int:
        return len(self._seconds)

    def __repr__(self) -> str:
        span = ""
        if self._seconds:
            span = f", seconds {format_second(min(self._seconds))}..{format_second(max(self._seconds))}"
        return f"PreloadWindow(held={len(self._held)}, tracked_seconds={len(self._seconds)}{span})"
