"""Scheduler: the timing wheel, the preload window and the tick, driven by now_ms."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from storage.entry import MS_PER_SECOND, SECONDS_PER_HOUR, IndexEntry, Location
from storage.errors import ConfigError

from .source import SlotSource
from .tick_state import TickState
from .timing_wheel import Level, TimingWheel, format_second
from .window import PreloadWindow, abs_second


@dataclass(frozen=True)
class SchedulerConfig:
    """How the scheduler trades memory, wake-ups and catch-up speed."""

    # How far ahead a second's entries are read into RAM. A second is loaded
    # preload_ms before it starts, so a slow disk read never delays a release,
    # and a message sent for a loaded second goes straight into RAM. RAM holds
    # about this much time's worth of messages.
    preload_ms: int = 10_000
    # Most entries one poll() returns. After downtime this is the catch-up
    # batch: the driver delivers it, yields, and polls again; overdue seconds
    # are read from disk only while fewer than this many entries are held,
    # so memory stays flat however far behind the tick is. It is also what
    # one turn of the loop hands over when many fall due at one instant
    # (10,000 every-second schedules: 10,000 a second, delivered with their
    # next runs' sends in one turn held the loop some 100 ms at 10,000, and
    # 20 ms at 1,000 each turn: a /health waits behind a few turns).
    max_release_per_poll: int = 100
    # A release later than this after it was due (`due_ms`) counts as
    # overdue and opens (or extends) a catch-up report.
    late_ms: int = 1_000
    # The longest time storage may take between choosing a message's second
    # (max(trigger, now)) and calling on_new for it (its group commit). The
    # tick never claims a second the clock left less than this long ago, so
    # a message filed late into an already passed second is never skipped
    # by a restart. Costs: a restart re-reads this much more.
    commit_lag_ms: int = 100

    def __post_init__(self) -> None:
        if self.preload_ms < 0:
            raise ConfigError(f"preload_ms must be >= 0, got {self.preload_ms}")
        if self.max_release_per_poll < 1:
            raise ConfigError(f"max_release_per_poll must be >= 1, got {self.max_release_per_poll}")
        if self.late_ms < 0:
            raise ConfigError(f"late_ms must be >= 0, got {self.late_ms}")
        if self.commit_lag_ms < 0:
            raise ConfigError(f"commit_lag_ms must be >= 0, got {self.commit_lag_ms}")


def due_ms(entry: IndexEntry) -> int:
    """When the wheel had `entry` due: its trigger time, or the start of the
    second it was filed in if that is later. Storage files a message under
    max(trigger, arrival), so one sent with a trigger time already past
    (triggerTime=1000) is due from its arrival's second, not from 1970: the
    wheel's lateness is its own delay, never the sender's choice."""
    return max(entry.trigger_ms, abs_second(entry) * MS_PER_SECOND)


@dataclass
class CatchUpReport:
    """One catch-up: from the first poll that released something more than
    late_ms after it was due (`due_ms`; or had to hold back overdue
    seconds) to the first poll after which nothing due was left."""

    started_at_ms: int
    finished_at_ms: int | None = None  # None while catching up
    released: int = 0  # entries released during the catch-up
    overdue: int = 0  # of those, released more than late_ms after they were due
    max_lateness_ms: int = 0  # the latest release, ms after it was due

    @property
    def active(self) -> bool:
        return self.finished_at_ms is None


@dataclass
class SchedulerStats:
    polls: int = 0  # dispatcher wake-ups: one per poll()
    released: int = 0
    hours_cascaded: int = 0  # second_counts() reads
    seconds_loaded: int = 0  # read_second() reads
    entries_offered: int = 0  # on_new() calls
    early_wakes: int = 0  # times wake listeners were told of an earlier wake-up
    clock_steps_back: int = 0  # polls whose now_ms was before the previous poll's
    catch_ups: int = 0


class Scheduler:
    """Releases stored entries at their trigger millisecond, reading the delay
    logs through a `SlotSource` only as far ahead as the preload window.

    Three parts, one per module: the `TimingWheel` (which seconds and hours
    hold something still on disk, and when to read them), the
    `PreloadWindow` (the entries read, released in order), and the tick
    (how far release has come, to resume from). The scheduler does the I/O
    between them and keeps time only as the now_ms it is given.

    Worked example (preload 10 s; h is the current hour; no prior tick):

        s = Scheduler(source, None, now_ms=h:0000.000)
        e = source.add(trigger h+2:0300.250); s.on_new(e)
                -> hour slot h+2 (expires at h+1:3590); listeners told
        s.next_wakeup_ms() -> h+1:3590.000  (2 h asleep, not 7,200 ticks)
        s.poll(h+1:3590.000) -> []          cascade hour h+2: second 300 slot
        s.next_wakeup_ms() -> h+2:0290.000
        s.poll(h+2:0290.000) -> []          read second 300 into RAM
        s.next_wakeup_ms() -> h+2:0300.250
        e2 = source.add(trigger h+2:0300.100); s.on_new(e2)
                -> second 300 is loaded: appended in RAM, O(1); listeners
                   told the wake-up moved to h+2:0300.100
        s.poll(h+2:0300.100) -> [e2];  s.poll(h+2:0300.250) -> [e]

    Released order: (trigger_ms, -priority, hour, global_index); never an
    entry with trigger_ms > now_ms, whatever the clock does. An entry filed
    after its trigger (storage files it into the second it arrived in) is
    released at the next poll.

    Tick: `tick` is the position every entry before which has been
    released (see `tick_state`). It is the earliest of: the first
    unreleased local index of every second held in RAM, the first second
    still on disk, and the clock's second (the latest now_ms polled, less
    commit_lag_ms, never before the tick the scheduler started from): a
    new message can still be filed into the current second, so the tick
    never claims it whole. A message filed into a second the tick has
    passed (a slow commit, a clock stepped back) pulls the tick back
    until it is released.
    Starting from a tick: seconds before it are not read; entries of its
    second below its local_index are skipped; everything WAITING after it
    is released (again, if it was released but not acked before a crash).
    Starting without one (None): from the first hour storage holds, or
    now_ms's second if that is earlier.

    Catch-up: when the tick is far behind now_ms, overdue seconds are read
    in order, only while fewer than max_release_per_poll entries are held,
    and each poll releases at most that many; next_wakeup_ms() then returns
    a time <= now_ms until the backlog is gone. `catch_up` reports it.

    Cost: on_new O(1) (O(log n) if it opens a new slot or lands in the
    second being released); poll O(released log held + slots expired), plus
    3600 per hour cascaded; memory: the preloaded entries (about preload_ms
    worth, or max_release_per_poll when catching up; one second read from
    disk is read whole) plus the wheel's 3600-byte table and pending slots.

    Who calls what, all from one task (the event loop): storage calls
    on_new for every entry it commits (once each, in local_index order
    within a second, in the same step that makes it readable), and cancel
    when a message leaves WAITING other than by this release (deleted, or
    acked after a re-delivery); the driver calls poll, next_wakeup_ms and
    tick, and registers a wake listener. Nothing here blocks or sleeps.
    """

    def __init__(self, source: SlotSource, tick: TickState | None, now_ms: int,
                 config: SchedulerConfig | None = None) -> None:
        self.config = config = config if config is not None else SchedulerConfig()
        self._source = source
        if tick is None:
            start_s, done_below_local = now_ms // MS_PER_SECOND, 0
            first_hour = source.next_hour(0)
            if first_hour is not None:
                start_s = min(start_s, first_hour * SECONDS_PER_HOUR)
        else:
            start_s, done_below_local = tick.position
        self.started_at = TickState.at(start_s, done_below_local)
        self._wheel = TimingWheel(start_s, config.preload_ms)
        self._window = PreloadWindow()
        self._window.open_second(start_s, done_below_local)
        self._claim_s = start_s  # the tick may claim seconds before this one whole
        self._last_now_ms = now_ms
        self._max_now_ms = now_ms
        self._blocked = False  # overdue seconds left on disk by the memory bound
        self._announced_ms: int | None = None  # the wake-up the driver sleeps toward
        self._listeners: list[Callable[[int], None]] = []
        self._catch_up: CatchUpReport | None = None
        self.stats = SchedulerStats()
        first = source.next_hour(start_s // SECONDS_PER_HOUR)
        if first is not None:
            self._wheel.add_hour(first)
        self._wheel.advance(now_ms)

    # -- storage's side ------------------------------------------------------

    def on_new(self, entry: IndexEntry) -> bool:
        """Storage committed `entry`. Returns True (and tells the wake
        listeners) when it makes the next wake-up earlier. Entries of one
        second must be reported in local_index order."""
        return self.on_new_many((entry,))

    def on_new_many(self, entries: Iterable[IndexEntry]) -> bool:
        """`on_new` for each of a commit's entries, in order, announcing the
        earliest new wake-up once."""
        wheel, window = self._wheel, self._window
        loaded_below_s = wheel.loaded_below_s  # (offers and the window do not move it)
        offered: set[int] = set()  # seconds offered by this call: a second offer adds no slot
        earliest = None
        count = 0
        for entry in entries:
            count += 1
            abs_s = abs_second(entry)
            if abs_s < loaded_below_s:
                # A loaded second. If the window no longer tracks it (released
                # whole, or before the tick we started from), every earlier
                # local index of it is done: on_new comes in local order.
                window.open_second(abs_s, entry.local_index)
                due_ms = window.add(entry)
            elif entry.trigger_ms < abs_s * MS_PER_SECOND:
                # Filed after its trigger, so due already: into RAM though its
                # second is still on disk (the read of that second skips it).
                due_ms = window.add(entry)
            elif abs_s in offered:
                continue
            else:
                offered.add(abs_s)
                due_ms = wheel.offer(abs_s).expiration_ms
            if due_ms is not None and (earliest is None or due_ms < earliest):
                earliest = due_ms
        self.stats.entries_offered += count
        return earliest is not None and self._announce(earliest)

    def cancel(self, location: Location) -> bool:
        """The message at `location` left WAITING (deleted, acked): forget it
        if held in RAM (True). If it is still on disk, its status will keep
        it from loading."""
        return self._window.cancel(location)

    # -- the driver's side ---------------------------------------------------

    def add_wake_listener(self, listener: Callable[[int], None]) -> None:
        """Call `listener(ms)` whenever on_new makes the wake-up earlier than
        the one next_wakeup_ms() last returned (ms may be <= now: poll now)."""
        self._listeners.append(listener)

    def remove_wake_listener(self, listener: Callable[[int], None]) -> None:
        self._listeners.remove(listener)

    def poll(self, now_ms: int) -> list[IndexEntry]:
        """Advance to now_ms and return the entries due, in release order:
        all of them, or the first max_release_per_poll when catching up."""
        self.stats.polls += 1
        if now_ms < self._last_now_ms:
            self.stats.clock_steps_back += 1
        self._last_now_ms = now_ms
        self._max_now_ms = max(self._max_now_ms, now_ms)
        limit = self.config.max_release_per_poll
        released: list[IndexEntry] = []
        while True:
            blocked = self._advance_wheel(now_ms)
            self._window.activate(now_ms)
            batch = self._window.pop_due(now_ms, limit - len(released))
            released.extend(batch)
            if not blocked or not batch or len(released) >= limit:
                break
        self._blocked = blocked
        clock_s = (self._max_now_ms - self.config.commit_lag_ms) // MS_PER_SECOND
        self._claim_s = max(self._claim_s, clock_s)
        first_on_disk = self._wheel.first_pending_s
        # A second still (partly) on disk keeps its record of what was released.
        self._window.retire(self._claim_s if first_on_disk is None else min(self._claim_s, first_on_disk))
        self.stats.released += len(released)
        self._report(now_ms, released)
        return released

    def _advance_wheel(self, now_ms: int) -> bool:
        """Cascade expired hours and load expired seconds, in time order.
        True if it stopped at an overdue second to keep memory bounded:
        then at least one held entry is due, so the next poll progresses."""
        wheel, window, source = self._wheel, self._window, self._source
        limit = self.config.max_release_per_poll
        try:
            while (slot := wheel.peek_expired(now_ms)) is not None:
                if slot.level is Level.SECONDS:
                    if slot.start_ms <= now_ms and len(window) >= limit:
                        due_ms = window.next_due_ms()
                        if due_ms is not None and due_ms <= now_ms:
                            return True  # enough is held, and due: release that first
                    wheel.pop_expired(now_ms)
                    window.load(slot.start_s, source.read_second(slot.hour, slot.second))
                    self.stats.seconds_loaded += 1
                else:
                    wheel.pop_expired(now_ms)
                    wheel.cascade(slot.hour, source.second_counts(slot.hour))
                    self.stats.hours_cascaded += 1
                    following = source.next_hour(slot.hour + 1)
                    if following is not None:
                        wheel.add_hour(following)
            return False
        finally:
            wheel.advance(now_ms)

    def next_wakeup_ms(self) -> int | None:
        """When poll must next be called: the next release, activation,
        preload or hour cascade; <= the last now_ms while a backlog remains;
        None when nothing is pending at all (sleep until woken)."""
        candidates = [ms for ms in (self._wheel.next_expiration_ms(), self._window.next_due_ms())
                      if ms is not None]
        self._announced_ms = min(candidates) if candidates else None
        return self._announced_ms

    def _announce(self, due_ms: int) -> bool:
        if self._announced_ms is not None and due_ms >= self._announced_ms:
            return False
        self._announced_ms = due_ms
        self.stats.early_wakes += 1
        for listener in list(self._listeners):
            listener(due_ms)
        return True

    @property
    def tick(self) -> TickState:
        """Dispatch progress to persist and replicate (see the class docstring)."""
        window = self._window
        best = (self._claim_s, window.prefix_of(self._claim_s))
        first_held = window.first_unreleased()
        if first_held is not None and first_held < best:
            best = first_held
        first_on_disk = self._wheel.first_pending_s
        if first_on_disk is not None and (first_on_disk, window.prefix_of(first_on_disk)) < best:
            best = (first_on_disk, window.prefix_of(first_on_disk))
        return TickState.at(*best)

    # -- reporting -----------------------------------------------------------

    def _behind(self, now_ms: int) -> bool:
        if self._blocked:
            return True
        return any(ms is not None and ms <= now_ms
                   for ms in (self._window.next_due_ms(), self._wheel.next_expiration_ms()))

    def _report(self, now_ms: int, released: list[IndexEntry]) -> None:
        late_ms = self.config.late_ms
        lateness = [now_ms - due_ms(e) for e in released]
        overdue = sum(1 for ms in lateness if ms > late_ms)
        report = self._catch_up
        if (report is None or not report.active) and (overdue or self._blocked):
            report = self._catch_up = CatchUpReport(started_at_ms=now_ms)
            self.stats.catch_ups += 1
        if report is None or not report.active:
            return
        report.released += len(released)
        report.overdue += overdue
        report.max_lateness_ms = max(report.max_lateness_ms, max(lateness, default=0))
        if not self._behind(now_ms):
            report.finished_at_ms = now_ms

    def lag_ms(self, now_ms: int) -> int:
        """How late the wheel is at `now_ms`: how long ago the earliest
        entry not yet released was due (`due_ms`), held in RAM or in a
        second still only on disk (counted from that second's start, or
        its hour's for an hour not yet read: at most that late); 0 when
        nothing is overdue. Dispatch lateness counts a release once it
        happens; this shows one that has not happened yet."""
        due = self._window.first_due_ms()
        first_on_disk = self._wheel.first_pending_s
        if first_on_disk is not None and (due is None or first_on_disk * MS_PER_SECOND < due):
            due = first_on_disk * MS_PER_SECOND
        return 0 if due is None else max(0, now_ms - due)

    @property
    def catch_up(self) -> CatchUpReport | None:
        """The current catch-up, or the last one (a copy), or None if none yet."""
        return None if self._catch_up is None else dataclasses.replace(self._catch_up)

    @property
    def wakeups(self) -> int:
        """Polls so far: each is one wake-up of the dispatcher."""
        return self.stats.polls

    def __repr__(self) -> str:
        catching_up = ", catching up" if self._catch_up is not None and self._catch_up.active else ""
        return (f"Scheduler(tick={self.tick!r}, held={len(self._window)}, "
                f"loaded_below={format_second(self._wheel.loaded_below_s)}, "
                f"pending_slots={len(self._wheel)}, polls={self.stats.polls}{catching_up})")
