"""WAITING -> READY: the releases, and the wheel's tick that records them.

A message leaves WAITING for READY (or EXPIRED, past its ttl: broker.core
.transitions' `Release`) in one of two ways, each one status record:

  - the wheel releases due entries (`release`, wheel.WheelDriver's
    deliver), a few ms after their trigger time at most;
  - a send, reschedule or re-drive due already is made READY by its own
    request (`release_due_now`, `ready_if_due`) once durable, so its answer
    says 2 and long polls wake now; the wheel, which holds it too by then,
    forgets it.

Each READY one goes to its topic's ready window and wakes the topic's long
polls: the windows (broker.disk.windows) carry the release out. Lateness (the dispatch lateness histogram,
camellia's ready gap) counts from the due time (broker.observe.metrics.due_ms).

Tick persistence (`persist_tick`, the driver's): the wheel's position
(wheel.tick_state) is written only past releases that are durable, and
never past a message not yet handed to the wheel (broker.disk.filing): a
restart starts the wheel from the tick and must find every message not
yet released.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from storage.entry import IndexEntry, Location, Message, Status
from storage.store import SendOutcome, SendResult, Store, text_hash
from wheel.clock import Clock
from wheel.scheduler import Scheduler
from wheel.tick_state import TickState, TickStateFile

from ..core.transitions import RELEASE, SKIPPED_RELEASE, due
from ..observe.metrics import Metrics, due_ms
from .filing import Filing
from .group_commit import GroupCommit
from .journal import Journal
from .ready import HeldMessage
from .windows import ReadyWindows


class Releaser:
    """Releases WAITING messages and persists the wheel's tick. Runs on the
    event loop; the tick file is this part's to write and close."""

    def __init__(self, store: Store, clock: Clock, metrics: Metrics, windows: ReadyWindows, journal: Journal,
                 commits: GroupCommit, filing: Filing, scheduler: Scheduler, tick_file: TickStateFile) -> None:
        self._store = store
        self._clock = clock
        self._metrics = metrics
        self._windows = windows
        self._journal = journal
        self._commits = commits
        self._filing = filing
        self._scheduler = scheduler
        self._tick_file = tick_file
        # Told of the messages each release is about to make READY, with the
        # time (the node's recurring schedules: broker.schedules.keeper); answers
        # the runs that missed with misfire=skip, which end EXPIRED unseen.
        self.on_release: Callable[[Sequence[Message], int], Sequence[Location]] | None = None

    def __repr__(self) -> str:
        return f"Releaser(tick={self._tick_file.state}, {self._filing!r})"

    @property
    def tick(self) -> TickState | None:
        """The tick last persisted: what a follower may take over from."""
        return self._tick_file.state

    def release(self, entries: list[IndexEntry]) -> None:
        """Released by the wheel: due now. Becomes READY (or EXPIRED)."""
        status, read = self._store.status, self._store.read_message
        self._make_ready([(m, entry.topic_hash) for entry in entries
                          if status(entry.location) is Status.WAITING  # (no body read for one released already)
                          and (m := read(entry.location)) is not None])

    def release_due_now(self, results: Sequence[SendResult], now_ms: int) -> list[Message]:
        """A send's answer once durable: its messages due already (delay <=
        0, a past trigger time) are made READY now rather than at the
        wheel's next poll, so the answer says 2 (as camellia's) and long
        polls wake at once."""
        stored = self.ready_if_due([r.message for r in results if r.outcome is SendOutcome.STORED], now_ms)
        changed = {m.location: m.status for m in stored}  # (a duplicate in the batch shares its location)
        return [r.message._replace(status=changed[r.message.location]) if r.message.location in changed
                else r.message for r in results]

    def ready_if_due(self, messages: list[Message], now_ms: int) -> list[Message]:
        """New WAITING messages (sent, rescheduled, re-driven), durable: those
        due by `now_ms` READY now (the wheel forgets them); all with their
        status."""
        due_now = [m for m in messages if due(m.trigger_ms, now_ms)]
        if not due_now:
            return messages
        status = self._store.status
        waiting = [m for m in due_now if status(m.location) is Status.WAITING]  # (the wheel may have been first)
        for m in waiting:
            self._filing.cancel(m.location)
        self._make_ready([(m, text_hash(m.topic)) for m in waiting], arrived_ms=now_ms)
        return [m._replace(status=status(m.location)) if due(m.trigger_ms, now_ms) else m for m in messages]

    def _make_ready(self, messages: list[tuple[Message, int]], arrived_ms: int | None = None) -> None:
        """WAITING messages (with their topic hashes) due now: READY into
        their topics' windows (which wake the long polls), or EXPIRED past
        their ttl (broker.core.transitions' `Release`, carried out by the
        windows). Their lateness counts from their due time: the trigger
        time, or the arrival if later -- each one's produce time, or
        `arrived_ms` (the request that made them due: a send, a
        rescheduleMsg, a re-drive)."""
        if not messages:
            return
        now_ms = self._clock.now_ms()
        lateness = self._metrics.lateness_seconds
        dues = []
        for message, _ in messages:
            due = due_ms(message.trigger_ms, message.produce_ms if arrived_ms is None else arrived_ms)
            lateness.observe(max(0, now_ms - due) / 1000)
            dues.append(due)
        batch = [HeldMessage.of(message, topic_hash) for message, topic_hash in messages]
        skipped = () if self.on_release is None else self.on_release([m for m, _ in messages], now_ms)
        if skipped:
            ended = set(skipped)
            changes = self._windows.apply(SKIPPED_RELEASE, [h for h in batch if h.location in ended], now_ms)
            changes += self._windows.apply(RELEASE, [h for h in batch if h.location not in ended], now_ms)
        else:
            changes = self._windows.apply(RELEASE, batch, now_ms)
        for held, due in zip(batch, dues):
            if held.state.status is Status.READY:
                self._metrics.topic(held.topic).ready_gap.observe(now_ms - due)
        if changes:
            self._journal.append(changes, now_ms)

    async def persist_tick(self, tick: TickState) -> None:
        """The tick moves only past releases that are durable, and never past
        a message still in its group commit (a slow fsync can outlast the
        scheduler's commit lag): a restart must read that message's second.
        Releases a quorum did not acknowledge in time leave the file as it
        was (a restart re-reads their seconds: at least once)."""
        if not await self._commits.background_durable("released messages"):
            return
        self._tick_file.write(self._filing.cap(min(tick, self._scheduler.tick, key=lambda t: t.position)))

    def close(self) -> None:
        self._tick_file.close()
