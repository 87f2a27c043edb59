"""The node's recurring schedules: kept durable, and each one's next run
made as an ordinary message (docs/api.md, "Recurring schedules").

A schedule's state (`ScheduleState`) lives in RAM and in the schedules
file (broker.schedules.file), whose record of it is written and synced
before anything is done on its strength. Of its runs, only the next one
exists, as a WAITING message with msgId `<scheduleId>@<nominal ms>` and
trigger time nominal + jitter (broker.core.recurrence); the state names it
(`pending`). The rule that makes the next run:

    when the pending run is released (WAITING -> READY, or EXPIRED), the
    backend tells `on_release` in the same turn, before the release is
    carried out; the worker task then writes the state with the next
    run as pending (synced), and only then sends that run's message.

The worker takes the releases queued meanwhile in slices of at most
ADVANCE_SLICE (100): a slice's next runs are worked out, written as one
record of their progress (one sync: the schedules file's "runs" record,
or one Raft write), then sent as one batch (the send path sendMsgBatch
takes), so 100,000 schedules firing at one instant cost 400 writes and
400 sends, not 100,000 of each, and no slice holds the event loop long
(some 5 ms: a /health asked meanwhile waits behind a few slices, not a
second's worth) or RAM for more than itself. The lock is let go between
slices.

So a crash anywhere leaves one of: the release not durable (the wheel
releases the run again after the restart: at least once, as any
message); the release durable but the next run not recorded (`start`
finds the pending run released and makes the next); the next run recorded
but not sent (`start` finds no message with its msgId and sends it).
The msgId is the same each time the same run is made, and the sends
that may repeat one (a restart's, a repair's) are strict (an ended
message with that id is answered, not replaced), so no run is made twice
and none is lost. The first send of a run just recorded is not: an ended
message under its id can only be an older one's (a run a client deleted
before a pause and resume brought its time back, a replaced version's),
and is replaced, as camellia's send replaces one.

The schedule owns its progress, not the run's message: a pending run
that leaves WAITING other than by its release (deleteMsg, deleteMsgs, a
purge, an ack or a move by a client) is looked at (`on_cancel`: the disk
broker's Filing tells it the place, which `_places` maps to its schedule),
and one deleted is not delivered: the schedule goes on with the run after
it, on time (`_skip`). A send of a run answered with a message the
schedule did not make (a client's, sent under that msgId before the
schedule existed: the API refuses one for a schedule that exists) is a
conflict, counted, and the schedule goes on past it too: no message
stands in for a run. The safety net for any path that tells no one (the
Redis backend, where any node deletes; a run refiled from a far span): a
pending run not released CHECK_AFTER_MS after its trigger time is read
(`_checks`: broker.schedules.checks, O(1) a run, no walk over every schedule) and
followed as deleted, a conflict, a release, or looked at again later.

A release more than misfireGraceMillis after the run's nominal time has
missed: `on_release` ends it unseen (status 5) with misfire=skip (the
release's own record; on Redis, where any node's script releases it, the
run's send carries that deadline, `NewSend.skip_after_ms`, and the script
ends it), and the worker picks the next run by
broker.core.recurrence.released (skip and once: the first nominal time after
now; all: the next one, until maxCatchUp runs in a row have caught up).

A pause holds a run back (docs/api.md, "Recurring schedules": a paused
topic). A pending run that falls due while its topic or serial key is
paused (`holds.paused_for`, the disk broker's ready windows) is not
released: `on_hold`, told of each release before `on_release`, answers
it and the backend leaves it WAITING, out of the wheel; the schedule
keeps it pending (`_held`, RAM) and makes no next run. The resume
(broker.flow.keeper, once its gate is open) calls `resumed`, which has
the backend release it now (`release_held`: the same release, told to
`on_hold` and `on_release` again), so the misfire rule judges it against
the resume time as any late release. A resume's shift or expire leaves
these runs out (`held_places`). Nothing of the hold is written: after a
restart or a failover `_recover` finds the pending run WAITING and due
(the wheel's tick may be past it) and holds it if still paused, else
releases it; `_look` does the same for one it finds so later.

Who calls what: the event loop only. `on_release` is the backend's
(broker.disk.messages' `release`) and never waits; the API's calls (put,
delete, pause, resume) and the worker's batches take one lock, so each
sees a state no other is halfway through changing.

A store several nodes write (Redis: broker.redis.schedules, where every
node serves the API and one makes the runs) says so through `read`: each
API call first reads the schedules it is about as stored now, and a write
that meets another node's change (StaleRows: nothing of it written) is
decided again on what that node wrote. A node that serves the API without
making runs is `serve`d, not `start`ed; the one making runs is told of
other nodes' changes through `refresh`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from array import array
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol, TypeVar

from storage.entry import Location, Message, Status
from storage.errors import ConfigError, Conflict, HourglassError, InvariantError, LimitReached, NotFound, Unavailable
from storage.types import NewMessage
from wheel.clock import Clock

from ..backend import Backend
from ..core.params import DeleteRequest, NewSend
from ..core.recurrence import Misfire, Recurrence, jitter_ms, parse_run_msg_id, released, run_msg_id
from ..tasks import cancel_and_wait
from .checks import Checks
from .file import LAST_RUNS, Key, OpenedRowsLike, Row, RowError, RunProgress
from .params import ScheduleSpec

log = logging.getLogger("hourglass.schedules")
T = TypeVar("T")

# Released runs a schedule's answer lists (getSchedule's lastRuns): LAST_RUNS.
# Releases the worker follows at a time: one write of their progress, one send
# (a quarter of sendMsgBatch's most: 10,000 every-second schedules keep the loop
# answering within 50 ms, docs/benchmarks.md).
ADVANCE_SLICE = 100
# --max-schedules' default: schedules a node keeps (each in RAM with its
# msg); a put of one more answers 429.
DEFAULT_MAX_SCHEDULES = 10_000
# --max-schedule-bytes' default: what the schedules' messages may hold in
# RAM in all (their msg, topic, ids, in UTF-8 bytes: ScheduleSpec.size_bytes);
# a put past it answers 429.
DEFAULT_MAX_SCHEDULE_BYTES = 64 * 1024 * 1024
# What `ScheduleStore.read` answers: rows (None: deleted), stale runs of deleted ones.
Fresh = tuple[dict[Key, Row | None], dict[Key, str]]
# An API call that meets another node's change of its schedule (StaleRows)
# reads it again and decides anew, at most this many times.
STALE_ATTEMPTS = 5
# Schedules a restart looks at (each one's pending run looked up) between
# turns of the loop: 10,000 looked up at once held it some 100 ms.
RECOVER_SLICE = 250
# After a write or send that failed (a disk error, a Raft write that no
# majority committed in time), the worker tries again this often.
REPAIR_INTERVAL_S = 1.0
# A pending run not released this long after its trigger time is read (the
# safety net of the module docstring); one found still WAITING, as made, is
# read again this long after.
CHECK_AFTER_MS = 500
# Pending runs of the checks a pass of the worker looks at (in slices of
# ADVANCE_SLICE, a turn of the loop between them).
CHECK_SLICE = 1000
# Checks taken between two turns of the loop, most of them stale (their run
# released and followed since): taken as they come due, they keep the checks
# from growing to a pass over all of them (`_send_runs`).
POP_SLICE = 10 * CHECK_SLICE


class ScheduleStore(Protocol):
    """Where a node's schedules are durable: the schedules file on a
    standalone node (broker.schedules.file.ScheduleFile), the Raft group's
    state on a cluster (broker.cluster.schedules.RaftScheduleStore). Both
    keep the same records: {"put": row}, {"delete": [topic, scheduleId],
    "stale": msgId or None}."""

    @property
    def rows(self) -> OpenedRowsLike:
        """Each schedule's last row, as opened (cleared once Schedules has read it)."""
        ...

    stale: dict[Key, str]  # runs of deleted schedules to delete if still waiting, as opened

    async def write(self, records: list[Row]) -> None:
        """The records, durable once it returns (raises if they may not be)."""
        ...

    async def write_runs(self, states: Sequence[RunProgress]) -> None:
        """Runs made: these schedules' progress (read at the call), durable
        once it returns, in one write."""
        ...

    def rewrite_due(self, live_bytes: int) -> bool: ...

    async def rewrite(self, states: Sequence[RunProgress]) -> None:
        """Keep these schedules' rows alone (each a "put")."""
        ...

    async def forget_stale(self, keys: list[Key]) -> None:
        """The stale runs of these deleted schedules are dealt with."""
        ...

    async def read(self, keys: Sequence[Key]) -> Fresh | None:
        """Those of these schedules that another node changed since this one
        last read or wrote them (a store several nodes write: Redis), as
        they are now: their rows (None: deleted) and the stale runs of the
        deleted ones. None: this node is the only writer (RAM is current)."""
        ...

    async def topic_ids(self, topic: str) -> set[str] | None:
        """The topic's scheduleIds as stored now (None: as `read`)."""
        ...

    def close(self) -> None: ...


class RunHolds(Protocol):
    """What a backend with pauses does for the runs they hold back (the
    disk broker: broker.disk.backend.Broker; see `Schedules.on_hold`)."""

    def paused_for(self, topic: str, serial_key: str) -> bool:
        """Whether a message of the topic with this serial key is held by a pause."""
        ...

    async def release_held(self, topic: str, msg_ids: Sequence[str]) -> int:
        """These WAITING messages released now, if due (told to `on_hold` again)."""
        ...


class StaleRows(Unavailable):
    """Raised by a store's write when another node changed some of its
    schedules since this node read them (Redis, where every node writes
    them): nothing of the write was applied; `keys` are those schedules.
    The caller reads them again (`ScheduleStore.read`) and decides anew."""

    def __init__(self, keys: list[Key]) -> None:
        super().__init__(f"{len(keys)} schedules were changed meanwhile by another node; retry")
        self.keys = keys


@dataclass(frozen=True)
class ScheduleLimits:
    """What the node's schedules may hold (flags of `hourglass serve`)."""

    # Schedules in all (--max-schedules).
    max_schedules: int = DEFAULT_MAX_SCHEDULES
    # Their messages' UTF-8 bytes in all (--max-schedule-bytes; ScheduleSpec.size_bytes).
    max_bytes: int = DEFAULT_MAX_SCHEDULE_BYTES
    # The node's shards, each holding its share of the two caps above
    # (broker.shards.budgets); 1: these are the node's.
    shards: int = 1

    def __post_init__(self) -> None:
        if self.max_schedules < 0:
            raise ConfigError(f"--max-schedules must be at least 0, got {self.max_schedules}")
        if self.max_bytes < 0:
            raise ConfigError(f"--max-schedule-bytes must be at least 0, got {self.max_bytes}")


@dataclass(slots=True)
class ScheduleState:
    """One schedule as the node keeps it (see the module docstring)."""

    spec: ScheduleSpec
    recurrence: Recurrence
    version: int
    paused: bool = False
    pending: int | None = None  # the nominal time of the run that exists and is not released yet
    runs: int = 0  # runs made, the pending one included (counted against `limit`)
    catch_up: int = 0  # missed runs delivered in a row (misfire=all)
    # released runs, oldest first, two numbers each: nominal ms, and ms late
    # at release * 2 + missed (`last_runs` reads them; 16 bytes a run, not
    # a tuple of three objects)
    history: array[int] = field(default_factory=lambda: array("q"))
    stale: str | None = None  # a run to delete if still waiting (a replaced or paused schedule's)
    # since the node started (on a cluster: since it last started leading),
    # /metrics' and the console's: runs released, runs missed (released past
    # their grace, or never made meanwhile), released runs' lateness summed
    released: int = 0
    missed: int = 0
    late_ms: int = 0
    # where the pending run's message is (the disk's Location, from its
    # send's answer): the key of Schedules._places that maps it back here
    place: Location | None = None
    # (topic, scheduleId): one tuple a schedule, the one its maps are keyed by
    key: Key = field(init=False)

    def __post_init__(self) -> None:
        self.key = (self.spec.topic, self.spec.schedule_id)

    def __repr__(self) -> str:
        return (f"ScheduleState({self.spec.topic!r}/{self.spec.schedule_id!r}, v{self.version}, "
                f"pending={self.pending}, runs={self.runs}, paused={self.paused})")

    def msg_id(self, nominal_ms: int) -> str:
        return run_msg_id(self.spec.schedule_id, nominal_ms)

    def trigger_ms(self, nominal_ms: int) -> int:
        return nominal_ms + jitter_ms(self.msg_id(nominal_ms), self.spec.jitter_ms)

    def run_fields(self, nominal_ms: int) -> tuple[int, str, int, int, int, str, str]:
        """What its run for `nominal_ms` holds: trigger time, msg, ttl, maxRetry, priority, tag, key."""
        spec = self.spec
        return (self.trigger_ms(nominal_ms), spec.msg, spec.ttl_ms, spec.max_retry, spec.priority, spec.tag,
                spec.key)

    def made(self, nominal_ms: int, message: Message) -> bool:
        """Is `message` the run this schedule makes for `nominal_ms` (not a
        client's under the run's msgId, nor a waiting one a client moved)?
        A released run's trigger time may have moved since (a push retry)."""
        m, fields = message, self.run_fields(nominal_ms)
        trigger_ms = m.trigger_ms if m.status is Status.WAITING else fields[0]
        return (trigger_ms, m.msg, m.ttl_ms, m.max_retry, m.priority, m.tag, m.key) == fields

    def runs_left(self) -> int | None:
        """Runs it may still make (None: no limit)."""
        return None if self.spec.limit is None else max(0, self.spec.limit - self.runs)

    def next_fire_times(self, count: int) -> list[int]:
        """The pending run's nominal time and those after it, at most the runs left."""
        if self.pending is None:
            return []
        left = self.runs_left()
        times = [self.pending]
        at: int | None = self.pending
        while len(times) < (count if left is None else min(count, left + 1)):
            assert at is not None
            at = self.recurrence.first_after(at)
            if at is None:
                break
            times.append(at)
        return times

    def public(self, count: int) -> dict[str, object]:
        return {**self.spec.public(), "version": self.version, "paused": self.paused, "runs": self.runs,
                "nextFireTimes": self.next_fire_times(count)}

    @property
    def last_runs(self) -> list[tuple[int, int, bool]]:
        """Released runs, oldest first: (nominal ms, ms late at release, missed)."""
        h = self.history
        return [(h[i], h[i + 1] >> 1, bool(h[i + 1] & 1)) for i in range(0, len(h), 2)]

    @property
    def last_late_ms(self) -> int:
        """The last released run's lateness (0 before any)."""
        return self.history[-1] >> 1 if self.history else 0

    def last_run(self) -> tuple[int, int, bool]:
        """The run released last (broker.schedules.file.RunProgress)."""
        h = self.history
        return h[-2], h[-1] >> 1, bool(h[-1] & 1)

    def progress(self) -> Row:
        return {"pending": self.pending, "runs": self.runs, "catchUp": self.catch_up,
                "lastRuns": [list(r) for r in self.last_runs], "stale": self.stale}

    def row(self) -> Row:
        return {**self.spec.public(), "version": self.version, "paused": self.paused, **self.progress()}

    @classmethod
    def from_row(cls, row: Row) -> ScheduleState:
        spec = ScheduleSpec.from_public(row)
        last_runs = row.get("lastRuns") or []
        if not isinstance(last_runs, list):
            raise RowError("lastRuns is not a list")
        pending, stale = row.get("pending"), row.get("stale")
        version, runs, catch_up = row["version"], row["runs"], row["catchUp"]
        if not (type(version) is int and type(runs) is int and type(catch_up) is int):
            raise RowError("version, runs and catchUp must be whole numbers")
        history = array("q", [n for r in last_runs[-LAST_RUNS:] for n in (int(r[0]), int(r[1]) * 2 + bool(r[2]))])
        return cls(spec, spec.recurrence(), version, bool(row.get("paused")),
                   pending if type(pending) is int else None, runs, catch_up, history,
                   stale if isinstance(stale, str) else None)

    def note_release(self, nominal_ms: int, late_ms: int, missed: bool) -> None:
        h = self.history
        if len(h) < 2 * LAST_RUNS:  # a new array of the exact size (appending would leave room unused)
            self.history = h + array("q", (nominal_ms, late_ms * 2 + missed))
        else:  # full: shifted in place
            h[:-2] = h[2:]
            h[-2], h[-1] = nominal_ms, late_ms * 2 + missed


def seen_released_ms(spec: ScheduleSpec, nominal_ms: int, status: Status, now_ms: int) -> int:
    """When a run found released at `now_ms` counts as released, where its
    release was not seen as it happened (Redis: any node's script releases
    it): then, except that a run of misfire=skip that was delivered (not
    ended unseen) was released within its grace, as its release would have
    ended it past it."""
    if spec.misfire is Misfire.SKIP and status is not Status.EXPIRED:
        return min(now_ms, nominal_ms + spec.grace_ms)
    return now_ms


class Schedules:
    """The node's schedules over `file`, their runs made through a backend
    once `start` is called (see the module docstring)."""

    def __init__(self, file: ScheduleStore, clock: Clock, limits: ScheduleLimits | None = None) -> None:
        self._file = file
        self._clock = clock
        self.limits = limits or ScheduleLimits()
        self._states: dict[Key, ScheduleState] = {}
        for row in file.rows.values():
            state = ScheduleState.from_row(row)
            self._states[state.key] = state
        file.rows.clear()  # (the states hold it all now)
        self._stale = dict(file.stale)  # runs of deleted schedules still to delete
        self.bytes_held = sum(s.spec.size_bytes for s in self._states.values())
        self._released: list[tuple[Key, int, int]] = []  # (schedule, nominal, released at): the worker's
        self._wake = asyncio.Event()
        self._lock = asyncio.Lock()
        # puts waiting for the lock: the first to get it makes them all (one write, one send)
        self._puts: list[tuple[ScheduleSpec, int | None, asyncio.Future[ScheduleState]]] = []
        # schedules whose last change was not written or whose run not sent (an error): the worker repairs them
        self._unsettled: dict[Key, ScheduleState] = {}
        # pending runs to look at (a cancel at their place, a send answered
        # with a message the schedule did not make): the worker's
        self._gone: list[tuple[Key, int]] = []
        # releases a failed write or send left unfollowed: followed again
        # after REPAIR_INTERVAL_S (a follow is idempotent: a schedule moved
        # on already is skipped)
        self._held_back: list[tuple[Key, int, int]] = []
        # a run sent (schedule, nominal time), read at a time if still pending
        self._checks = Checks()
        self._places: dict[Location, Key] = {}  # each pending run's place -> its schedule (ScheduleState.place)
        # since the node started (on a cluster: since it last started
        # leading), /metrics': pending runs deleted (the schedule went on
        # past them), runs whose msgId held a message the schedule did not make
        self.runs_deleted = 0
        self.run_conflicts = 0
        self._backend: Backend | None = None
        self._task: asyncio.Task[None] | None = None
        # The backend's pauses (None: none here; on Redis the scripts hold runs
        # back themselves, broker.redis.schedules): a pending run
        # that falls due while its topic or serial key is paused is held back
        # (`on_hold`), kept here, schedule -> (nominal, place), until the
        # resume (`resumed`) releases it, judged by its misfire rule then.
        self.holds: RunHolds | None = None
        self._held: dict[Key, tuple[int, Location]] = {}

    def __repr__(self) -> str:
        return f"Schedules({len(self._states)} schedules, {len(self._released)} releases queued, {self._file!r})"

    def _holder(self) -> str:
        """Who holds the schedules a cap counts, in a refusal's words."""
        return "the node" if self.limits.shards == 1 else "this schedule's shard"

    def _cap(self, flag: str) -> str:
        """A cap's name, in a refusal's words: the flag's, or a shard's share of it."""
        return flag if self.limits.shards == 1 else f"its share of {flag} (over {self.limits.shards} shards)"

    def __len__(self) -> int:
        return len(self._states)

    def states(self) -> list[ScheduleState]:
        return list(self._states.values())

    def topic_states(self, topic: str) -> list[ScheduleState]:
        return [s for (t, _), s in self._states.items() if t == topic]

    def idle(self) -> bool:
        """No release is waiting to be followed and no change is under way (tests)."""
        return not self._released and not self._gone and not self._lock.locked()

    def scheduled(self, topic: str, schedule_ids: Sequence[str]) -> set[str]:
        """Those of `schedule_ids` that are schedules of `topic` (a send
        under one's run msgId is refused: broker.http.api)."""
        return {sid for sid in schedule_ids if (topic, sid) in self._states}

    # == the backend's side ==================================================

    def on_hold(self, messages: Sequence[Message], now_ms: int) -> set[Location]:
        """WAITING messages about to be released at `now_ms` (called by the
        backend first): the pending runs among them whose topic or serial
        key is paused are held back -- left WAITING, out of the wheel, their
        schedules making no next run -- until `resumed`. Answers their places."""
        holds = self.holds
        if holds is None or not self._states:
            return set()
        held: set[Location] = set()
        for m in messages:
            if "@" not in m.msg_id or not holds.paused_for(m.topic, m.key):
                continue
            run = parse_run_msg_id(m.msg_id)
            if run is None:
                continue
            state = self._states.get((m.topic, run[0]))
            if state is None or state.pending != run[1] or m.retry:
                continue
            self._held[state.key] = (run[1], m.location)
            held.add(m.location)
        return held

    def held_places(self, topic: str, key: str | None) -> frozenset[Location]:
        """The places of the runs a pause of the topic (or of its serial key)
        holds back, and of each pending run of its schedules (a resume's
        shift or expire leaves them out: their misfire rule decides)."""
        places: set[Location] = set()
        for state in self.topic_states(topic):
            if state.pending is None or (key is not None and state.spec.key != key):
                continue
            held = self._held.get(state.key)
            if held is not None and held[0] == state.pending:
                places.add(held[1])
            if state.place is not None:
                places.add(state.place)
        return frozenset(places)

    async def resumed(self, topic: str, key: str | None) -> int:
        """The topic (or its serial key) resumed: the runs held back and no
        longer paused released now (the misfire rule judges each against
        now: broker.core.recurrence.released). How many were released."""
        holds = self.holds
        if holds is None or self._backend is None:
            return 0  # (not making runs: a restart's `_recover` finds them)
        runs: list[tuple[Key, int]] = []
        for k, (nominal_ms, _) in list(self._held.items()):
            if k[0] != topic:
                continue
            state = self._states.get(k)
            if state is None or state.pending != nominal_ms:  # deleted, paused or gone on since
                del self._held[k]
            elif (key is None or state.spec.key == key) and not holds.paused_for(topic, state.spec.key):
                runs.append((k, nominal_ms))
        if not runs:
            return 0
        try:
            for at in range(0, len(runs), ADVANCE_SLICE):
                part = runs[at:at + ADVANCE_SLICE]
                for k, _ in part:
                    del self._held[k]
                await holds.release_held(topic, [self._states[k].msg_id(n) for k, n in part
                                                 if k in self._states])
        except (HourglassError, OSError) as e:  # looked at again: released by `_look`
            log.warning("schedules: the runs held by topic %s's pause not released yet: %s", topic, e)
            for k, n in runs:
                self._held.pop(k, None)
                self._check_again(k, n)
            self._wake.set()
        return len(runs)

    def on_release(self, messages: Sequence[Message], now_ms: int) -> list[Location]:
        """WAITING messages being released at `now_ms` (called by the backend
        before it carries the release out): each pending run among them is
        queued for the worker. Answers the runs that missed with
        misfire=skip: the backend ends them unseen (status 5)."""
        if not self._states:
            return []
        skipped: list[Location] = []
        for m in messages:
            if "@" not in m.msg_id:
                continue
            run = parse_run_msg_id(m.msg_id)
            if run is None:
                continue
            state = self._states.get((m.topic, run[0]))
            if state is None or state.pending != run[1]:
                continue
            self._released.append((state.key, state.pending, now_ms))  # (the state's own: no copies kept)
            spec = state.spec
            if spec.misfire is Misfire.SKIP and now_ms - run[1] > spec.grace_ms and m.retry == 0:
                skipped.append(m.location)
        if self._released:
            self._wake.set()
        return skipped

    def serve(self, backend: Backend) -> None:
        """Serve the API's calls through `backend` (their runs made and
        deleted through it) without making the runs of releases: on Redis,
        a node that does not hold the schedules lease (broker.redis.schedules)."""
        self._backend = backend

    def on_cancel(self, location: Location) -> None:
        """The WAITING message at `location` left WAITING other than by its
        release (the disk broker's Filing.cancel: deleted, acked, moved):
        if it is a pending run, the worker looks at it. O(1), never waits."""
        key = self._places.pop(location, None)
        if key is None:
            return
        state = self._states.get(key)
        if state is not None and state.place == location and state.pending is not None:
            state.place = None
            self._gone.append((key, state.pending))
            self._wake.set()

    def on_gone(self, key: Key, nominal_ms: int) -> None:
        """A pending run seen gone or not as made (broker.redis.schedules'
        watch): the worker looks at it."""
        self._gone.append((key, nominal_ms))
        self._wake.set()

    def start(self, backend: Backend) -> None:
        """Make runs through `backend` from now on: first what a restart
        finds undone (see the module docstring), then each release."""
        self._backend = backend
        self._task = asyncio.create_task(self._run(), name="schedules")

    @property
    def firing(self) -> bool:
        """Whether this node makes the runs of releases (started, not stopped)."""
        return self._task is not None

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait((task,))
        self._backend = None

    def close(self) -> None:
        self._file.close()

    def backend(self) -> Backend:
        if self._backend is None:
            raise Unavailable("schedules are not served on this node now (starting or stopping); retry")
        return self._backend

    async def _run(self) -> None:
        async with self._lock:
            await self._recover()
        while True:
            wait_s = self._wait_s()
            if wait_s is None:
                await self._wake.wait()
            elif wait_s > 0:
                with contextlib.suppress(TimeoutError):
                    await self._clock.wait_for(self._wake.wait(), wait_s)
            else:
                await asyncio.sleep(0)  # (the loop's turn between slices of checks)
            self._wake.clear()
            jobs, self._released, self._held_back = self._held_back + self._released, [], []
            for at in range(0, max(1, len(jobs)), ADVANCE_SLICE):  # the lock let go between slices
                async with self._lock:
                    part = jobs[at:at + ADVANCE_SLICE]
                    try:
                        if self._unsettled:
                            await self._repair()
                        await self._advance(part)
                    except (HourglassError, OSError) as e:  # a disk or Raft write error: repaired from RAM
                        log.warning("schedules: %d releases not followed by their next runs yet: %s", len(part), e)
                        self._held_back.extend(part)
            del jobs, part  # (not held while the worker waits)
            gone = self._due_checks()
            for at in range(0, len(gone), ADVANCE_SLICE):
                async with self._lock:
                    looked = gone[at:at + ADVANCE_SLICE]
                    try:
                        await self._look(looked)
                    except (HourglassError, OSError) as e:  # read again a moment later
                        log.warning("schedules: %d pending runs not looked at yet: %s", len(looked), e)
                        for key, nominal_ms in looked:
                            self._check_again(key, nominal_ms)
                await asyncio.sleep(0)  # (a look reads each run without a wait: the loop's turn between slices)
            del gone

    def _wait_s(self) -> float | None:
        """How long the worker may wait for a wake (None: until one)."""
        if self._gone or self._released:
            return 0
        wait_s = REPAIR_INTERVAL_S if self._unsettled or self._held_back else None
        due_ms = self._checks.due_ms()
        if due_ms is not None:
            due_s = max(0, due_ms - self._clock.now_ms()) / 1000
            wait_s = due_s if wait_s is None else min(wait_s, due_s)
        return wait_s

    def _due_checks(self) -> list[tuple[Key, int]]:
        """The runs to look at now: those told of, and those of the checks
        due that are still pending (taken CHECK_SLICE at a time until that
        many are pending, or POP_SLICE taken: most are of runs released
        and followed since)."""
        gone, self._gone = self._gone, []
        now_ms, states = self._clock.now_ms(), self._states
        for _ in range(POP_SLICE // CHECK_SLICE):
            due = self._checks.take_due(now_ms, CHECK_SLICE)
            for key, nominal_ms in due:
                state = states.get(key)
                if state is not None and state.pending == nominal_ms:
                    gone.append((key, nominal_ms))
            if len(due) < CHECK_SLICE or len(gone) >= CHECK_SLICE:
                break
        return gone

    async def _look(self, runs: list[tuple[Key, int]]) -> None:
        """Pending runs that may be gone (a slice): each read; one deleted,
        missing or not as the schedule made it is skipped (`_skip`), one
        released is followed as a release, one WAITING as made is read
        again later."""
        backend, holds = self.backend(), self.holds
        skipped: list[tuple[ScheduleState, int, bool]] = []
        due: dict[str, list[str]] = {}  # by topic: runs due and waiting, out of the wheel
        seen: set[Key] = set()
        for key, nominal_ms in runs:
            state = self._states.get(key)
            if state is None or state.pending != nominal_ms or key in self._unsettled or key in seen:
                continue  # moved on, or its send not done yet (the repair's)
            seen.add(key)
            try:
                message: Message | None = await backend.get(state.spec.topic, state.msg_id(nominal_ms))
            except NotFound:
                message = None
            if message is None or message.status is Status.DELETED:
                skipped.append((state, nominal_ms, False))
            elif not state.made(nominal_ms, message):
                skipped.append((state, nominal_ms, True))
            elif message.status is Status.WAITING:
                held = self._held.get(key)
                if held is not None and held[0] == nominal_ms:
                    continue  # held back by a pause: its resume releases it
                if holds is None or message.trigger_ms > self._clock.now_ms():
                    self._check_again(key, nominal_ms)
                elif holds.paused_for(message.topic, message.key):  # (a restart during the pause, a send due now)
                    self._held[key] = (nominal_ms, message.location)
                else:  # due and not released: a pause's resume cut short, a restart's tick past it
                    due.setdefault(message.topic, []).append(message.msg_id)
                    self._check_again(key, nominal_ms)
            else:  # released (or acked while waiting) with no release told: followed as one
                self._released.append((key, nominal_ms, self._clock.now_ms()))
                self._wake.set()
        if holds is not None:
            for topic, msg_ids in due.items():
                await holds.release_held(topic, msg_ids)
        if skipped:
            await self._skip(skipped)

    async def _skip(self, runs: list[tuple[ScheduleState, int, bool]]) -> None:
        """Pending runs gone (deleted; or, `conflict`, held by a message the
        schedule did not make): never delivered as runs; each schedule goes
        on with its first nominal time after the run (or after now, if
        later), recorded (one write), then sent (one batch)."""
        now_ms = self._clock.now_ms()
        changed: list[ScheduleState] = []
        sends: list[tuple[ScheduleState, int]] = []
        conflicts = 0
        for state, nominal_ms, conflict in runs:
            conflicts += conflict
            if conflict:
                log.warning("schedules: run %s of topic %s holds a message the schedule did not make; the schedule "
                            "goes on past it", state.msg_id(nominal_ms), state.spec.topic)
            following = state.recurrence.first_after(max(nominal_ms, now_ms))
            left = state.runs_left()
            if left is not None and left <= 0:
                following = None
            state.pending, state.catch_up = following, 0
            self._unplace(state)
            if following is not None:
                state.runs += 1
                sends.append((state, following))
            changed.append(state)
        self.run_conflicts += conflicts
        self.runs_deleted += len(runs) - conflicts
        log.info("schedules: %d pending runs gone (%d deleted, %d conflicts); their schedules go on", len(runs),
                 len(runs) - conflicts, conflicts)
        for s in changed:  # until written and sent (an error leaves them to _repair)
            self._unsettled[s.key] = s
        await self._write([{"put": s.row()} for s in changed])
        await self._send_runs(sends, strict=False)  # (just recorded: the module docstring)
        for s in changed:
            self._unsettled.pop(s.key, None)

    async def _send_runs(self, runs: list[tuple[ScheduleState, int]], strict: bool) -> None:
        """Send these runs (one batch). Each answered as made is placed (its
        place mapped for `on_cancel`) and its check set; one answered with
        a message the schedule did not make is looked at (`_look`)."""
        if not runs:
            return
        answers = await self.backend().send([self._run_send(s, nominal_ms, strict) for s, nominal_ms in runs])
        now_ms = self._clock.now_ms()
        for (state, nominal_ms), message in zip(runs, answers):
            if state.pending != nominal_ms or self._states.get(state.key) is not state:
                continue
            if not state.made(nominal_ms, message):
                self._gone.append((state.key, nominal_ms))
                self._wake.set()
                continue
            self._unplace(state)
            state.place = message.location
            self._places[message.location] = state.key
            self._checks.add(state.trigger_ms(nominal_ms) + CHECK_AFTER_MS, state.key, nominal_ms, now_ms)
        most = 2 * len(self._states) + CHECK_SLICE
        if self._checks.far_added > most and len(self._checks) > most:
            # the checks of runs no longer pending far ahead (a schedule put,
            # paused or deleted long before its run's time), and repeats: one
            # pass once more were added far ahead, and are kept, than twice
            # the schedules (those of runs due soon go as they come due: `_due_checks`)
            states = self._states
            self._checks.keep(lambda key, nominal_ms: (s := states.get(key)) is not None and s.pending == nominal_ms)
        self._wake.set()  # (the worker's wait ends by the first check)

    def _check_again(self, key: Key, nominal_ms: int) -> None:
        """Read `key`'s pending run `nominal_ms` again CHECK_AFTER_MS from now."""
        now_ms = self._clock.now_ms()
        self._checks.add(now_ms + CHECK_AFTER_MS, key, nominal_ms, now_ms)

    def _unplace(self, state: ScheduleState) -> None:
        """Forget where the state's pending run was (it moved on, or is gone)."""
        if state.place is not None:
            if self._places.get(state.place) == state.key:
                del self._places[state.place]
            state.place = None

    async def _repair(self) -> None:
        """Schedules whose change a failed write or send left undone: their
        rows written again, their pending runs sent (strict: a run made
        already is answered, not made again)."""
        states = [s for s in self._unsettled.values() if self._states.get(s.key) is s]
        for at in range(0, len(states), ADVANCE_SLICE):
            part = states[at:at + ADVANCE_SLICE]
            try:
                await self._write([{"put": s.row()} for s in part])
            except StaleRows as e:  # another node's change holds: those are read again, the rest repaired next time
                await self._fresh(e.keys)
                raise
            for s in part:
                if s.stale is not None:
                    await self._drop_run(s.spec.topic, s.stale)
                    s.stale = None
            await self._send_runs([(s, s.pending) for s in part if s.pending is not None], strict=True)
            for s in part:
                self._unsettled.pop(s.key, None)
        self._unsettled.clear()
        log.info("schedules: %d repaired after an error", len(states))

    async def _recover(self) -> None:
        """What a stop or crash left undone: stale runs deleted, each pending
        run sent if it does not exist, followed if it was released."""
        backend = self.backend()
        live = {s.msg_id(s.pending) for s in self._states.values() if s.pending is not None}
        for (topic, _), msg_id in list(self._stale.items()):
            if msg_id not in live:
                await self._drop_run(topic, msg_id)
        if self._stale:
            await self._file.forget_stale(list(self._stale))
        self._stale.clear()
        missing: list[tuple[ScheduleState, int]] = []  # pending runs never sent: sent ADVANCE_SLICE at a time
        due: dict[str, list[str]] = {}  # by topic: pending runs due, still waiting, their pause over
        now_ms, holds = self._clock.now_ms(), self.holds
        for n, state in enumerate(list(self._states.values()), 1):
            if n % RECOVER_SLICE == 0:  # (a get that finds the message answers without a turn of the loop)
                await asyncio.sleep(0)
            if state.stale is not None and state.stale not in live:
                await self._drop_run(state.spec.topic, state.stale)
            state.stale = None
            if state.pending is None:
                continue
            try:
                message = await backend.get(state.spec.topic, state.msg_id(state.pending))
            except NotFound:
                missing.append((state, state.pending))
                if len(missing) >= ADVANCE_SLICE:
                    await self._send_runs(missing, strict=True)
                    missing = []
                continue
            if message.status is Status.DELETED or not state.made(state.pending, message):
                self._gone.append((state.key, state.pending))  # deleted, or not the run: skipped (_look)
                self._wake.set()
            elif message.status is not Status.WAITING:  # released before the stop: follow it now
                self._released.append((state.key, state.pending, self._clock.now_ms()))
                self._wake.set()
            else:  # waiting, as made: placed, and looked at if not released in time
                state.place = message.location
                self._places[message.location] = state.key
                if holds is not None and message.trigger_ms <= now_ms:  # due: held back by a pause (the wheel's
                    # tick may be past it)
                    if holds.paused_for(message.topic, message.key):
                        self._held[state.key] = (state.pending, message.location)
                        continue
                    due.setdefault(message.topic, []).append(message.msg_id)  # its pause is over
                self._checks.add(max(now_ms, state.trigger_ms(state.pending)) + CHECK_AFTER_MS, state.key,
                                 state.pending, now_ms)
        await self._send_runs(missing, strict=True)
        if holds is not None:
            for topic, msg_ids in due.items():
                await holds.release_held(topic, msg_ids)

    async def _advance(self, jobs: list[tuple[Key, int, int]]) -> None:
        """Released runs (a slice): each schedule's next run recorded (one
        write of their progress), then sent (one batch)."""
        changed: list[ScheduleState] = []
        sends: list[tuple[ScheduleState, int]] = []
        for key, nominal_ms, released_ms in jobs:
            state = self._states.get(key)
            if state is None or state.pending != nominal_ms:
                continue  # deleted, paused or replaced since
            spec = state.spec
            outcome = released(state.recurrence, spec.misfire, spec.grace_ms, spec.max_catch_up, nominal_ms,
                               released_ms, state.catch_up)
            late_ms = max(0, released_ms - nominal_ms)
            state.note_release(nominal_ms, late_ms, outcome.missed)
            state.released += 1
            state.missed += outcome.missed_runs
            state.late_ms += late_ms
            following = outcome.next_nominal
            left = state.runs_left()
            if left is not None and left <= 0:
                following = None
            state.pending, state.catch_up = following, outcome.catch_up
            self._unplace(state)
            if following is not None:
                state.runs += 1
                sends.append((state, following))
            changed.append(state)
        if not changed:
            return
        for s in changed:  # until written and sent (an error leaves them to _repair)
            self._unsettled[s.key] = s
        written = await self._write_runs(changed)
        await self._rewrite_if_due()
        if len(written) < len(changed):  # the others' runs are another node's change's
            sends = [(s, n) for s, n in sends if s.key in written]
        await self._send_runs(sends, strict=False)  # (just recorded: the module docstring)
        for s in changed:
            self._unsettled.pop(s.key, None)

    async def _write_runs(self, states: list[ScheduleState]) -> dict[Key, ScheduleState]:
        """Their progress written; a schedule another node changed meanwhile
        (StaleRows, Redis) is read again and left out: that change holds.
        The ones written."""
        while True:
            try:
                await self._file.write_runs(states)
                return {s.key: s for s in states}
            except StaleRows as e:
                await self._fresh(e.keys)
                changed = set(e.keys)
                states = [s for s in states if s.key not in changed]

    def _run_send(self, state: ScheduleState, nominal_ms: int, strict: bool) -> NewSend:
        spec = state.spec
        message = NewMessage(spec.topic, state.msg_id(nominal_ms), spec.msg, self._clock.now_ms(),
                             state.trigger_ms(nominal_ms), spec.ttl_ms, spec.max_retry, spec.priority, spec.tag,
                             spec.key)
        skip_after = nominal_ms + spec.grace_ms if spec.misfire is Misfire.SKIP else None
        return NewSend(message, strict, skip_after, run=True)

    async def _drop_run(self, topic: str, msg_id: str) -> None:
        """Delete a run if it is still waiting (a released one is delivered),
        its msgId released: the same nominal time may be a run again (a
        schedule replaced by one whose times overlap, resumed, put anew)."""
        backend = self.backend()
        try:
            message = await backend.get(topic, msg_id)
            if message.status is Status.WAITING:
                await backend.delete(DeleteRequest(topic, msg_id, True))
        except NotFound:
            return

    async def _write(self, records: list[Row]) -> None:
        await self._file.write(records)
        await self._rewrite_if_due()

    async def _rewrite_if_due(self) -> None:
        if self._file.rewrite_due(self.bytes_held + 400 * len(self._states)):
            await self._file.rewrite(list(self._states.values()))

    async def refresh(self, keys: Sequence[Key]) -> None:
        """Schedules another node changed (Redis: the holder of the lease
        is told which) read again, under the lock."""
        async with self._lock:
            await self._fresh(keys)

    async def _fresh(self, keys: Sequence[Key]) -> None:
        """RAM's copy of these schedules made the store's, where other
        nodes write it too (a no-op on a store this node alone writes).
        The caller holds the lock."""
        fresh = await self._file.read(keys)
        if fresh is None:
            return
        rows, stale = fresh
        for key, row in rows.items():
            before = self._states.pop(key, None)
            if before is not None:
                self.bytes_held -= before.spec.size_bytes
            if row is None:
                continue
            state = ScheduleState.from_row(row)
            if before is not None:  # this node's counts go on
                state.released, state.missed, state.late_ms = before.released, before.missed, before.late_ms
            self._states[key] = state
            self.bytes_held += state.spec.size_bytes
        if not self.firing:  # runs left to delete are the lease holder's, as is every run
            return
        live = {s.msg_id(s.pending) for s in self._states.values() if s.pending is not None}
        for key in rows:
            adopted = self._states.get(key)
            if adopted is not None and adopted.stale is not None:  # a change whose node died before deleting it
                if adopted.stale not in live:
                    await self._drop_run(adopted.spec.topic, adopted.stale)
                adopted.stale = None
        for (topic, _), msg_id in stale.items():
            if msg_id not in live:
                await self._drop_run(topic, msg_id)
        if stale:
            await self._file.forget_stale(list(stale))

    async def _as_stored(self, keys: Sequence[Key], change: Callable[[], Awaitable[T]]) -> T:
        """An API call's `change` (the lock held) decided on these schedules
        as stored now, and decided anew if another node changed them before
        it was written (StaleRows: nothing of it was)."""
        for attempt in range(STALE_ATTEMPTS):
            await self._fresh(keys)
            try:
                return await change()
            except StaleRows:
                if attempt == STALE_ATTEMPTS - 1:
                    raise
        raise InvariantError("unreachable")

    # == the API's side ==========================================================

    def get(self, topic: str, schedule_id: str) -> ScheduleState:
        state = self._states.get((topic, schedule_id))
        if state is None:
            raise NotFound(f"no schedule {schedule_id!r} in topic {topic!r}")
        return state

    def page(self, topic: str, cursor: str | None, limit: int) -> tuple[list[ScheduleState], str | None]:
        """A topic's schedules by scheduleId after `cursor`, and the next cursor (None: the last page)."""
        ids = sorted(sid for (t, sid) in self._states if t == topic and (cursor is None or sid > cursor))
        shown = ids[:limit]
        return [self._states[(topic, sid)] for sid in shown], (shown[-1] if len(ids) > limit else None)

    async def put(self, spec: ScheduleSpec, version: int | None) -> ScheduleState:
        """Create or replace a schedule; durable, its first run made, once it
        returns. Conflict (409) if `version` is given and is not the stored
        one (0: one exists); LimitReached (429) past --max-schedules or
        --max-schedule-bytes. Puts that wait for the lock meanwhile are
        made together, in the order they came: one write, one send."""
        self.backend()
        done: asyncio.Future[ScheduleState] = asyncio.get_running_loop().create_future()
        self._puts.append((spec, version, done))
        async with self._lock:
            puts, self._puts = self._puts, []
            if puts:
                try:
                    await self._as_stored([(s.topic, s.schedule_id) for s, _, _ in puts],
                                          lambda: self._put_all(puts))
                except BaseException as e:
                    for _, _, d in puts:
                        if not d.done():
                            d.set_exception(e if isinstance(e, Exception) else Unavailable("stopping; retry"))
                    raise
        return await done

    async def _put_all(self, puts: list[tuple[ScheduleSpec, int | None, asyncio.Future[ScheduleState]]]) -> None:
        """Each put decided in order against what the ones before it left,
        then all written at once, their old runs deleted, their first runs
        sent, and each put answered (or refused alone: 409, 429)."""
        now_ms = self._clock.now_ms()
        made: dict[Key, ScheduleState] = {}  # this round's last state of each schedule
        answers: list[tuple[asyncio.Future[ScheduleState], ScheduleState]] = []
        refused: list[tuple[asyncio.Future[ScheduleState], HourglassError]] = []  # answered once the rest is written
        count, held = len(self._states), self.bytes_held
        for spec, version, done in puts:
            key = (spec.topic, spec.schedule_id)
            before = self._states.get(key)
            old = made.get(key, before)
            try:
                if version is not None and version != (0 if old is None else old.version):
                    raise Conflict(f"schedule {spec.schedule_id!r} is at version {0 if old is None else old.version}"
                                   f", not {version}" + (" (0: it must not exist)" if version == 0 else ""))
                if old is None and count >= self.limits.max_schedules:
                    raise LimitReached(f"{self._holder()} has {count} schedules and {self._cap('--max-schedules')} is "
                                       f"{self.limits.max_schedules}: delete one first, or raise --max-schedules")
                now_held = held - (0 if old is None else old.spec.size_bytes) + spec.size_bytes
                if now_held > self.limits.max_bytes:
                    raise LimitReached(f"{self._holder()}'s schedules' messages would hold {now_held} bytes and "
                                       f"{self._cap('--max-schedule-bytes')} is {self.limits.max_bytes}: delete "
                                       f"schedules first, or raise --max-schedule-bytes")
            except HourglassError as e:
                refused.append((done, e))
                continue
            count += old is None
            held = now_held
            recurrence = spec.recurrence()
            paused = old is not None and old.paused
            first = None if paused else recurrence.first_at_or_after(max(spec.start_ms, now_ms + 1))
            state = ScheduleState(spec, recurrence, 1 if old is None else old.version + 1, paused, first,
                                  0 if first is None else 1, 0, array("q") if old is None else old.history)
            # the run to delete: the one that exists (made before this round), unless it is this one's
            # first as this one makes it
            old_run = None if before is None or before.pending is None else before.msg_id(before.pending)
            kept = (first is not None and before is not None and old_run == state.msg_id(first)
                    and before.run_fields(first) == state.run_fields(first))
            state.stale = None if kept else old_run
            if old is not None:  # its counts go on (as its last runs do)
                state.released, state.missed, state.late_ms = old.released, old.missed, old.late_ms
            made[state.key] = state
            answers.append((done, state))
        if made:
            await self._made(made, held)
        for done, error in refused:
            done.set_exception(error)
        for done, state in answers:
            if not done.done():
                done.set_result(state)

    async def _made(self, made: dict[Key, ScheduleState], held: int) -> None:
        """Puts decided (`held`: the schedules' bytes then): written at
        once, their old runs deleted, their first runs sent."""
        self.backend()
        await self._file.write([{"put": s.row()} for s in made.values()])
        for key in made:
            replaced = self._states.get(key)
            if replaced is not None:
                self._unplace(replaced)
        self._states.update(made)
        self.bytes_held = held
        await self._rewrite_if_due()  # (after: a rewrite keeps the states RAM holds)
        self._unsettled.update(made)  # until its old run is deleted and its first sent
        sends = []
        for state in made.values():
            if state.stale is not None:
                await self._drop_run(state.spec.topic, state.stale)
                state.stale = None
            if state.pending is not None:
                sends.append((state, state.pending))
        await self._send_runs(sends, strict=False)
        for key in made:
            self._unsettled.pop(key, None)

    async def delete(self, topic: str, schedule_id: str) -> None:
        """Remove a schedule and delete its pending run; NotFound if none."""
        self.backend()
        async with self._lock:
            await self._as_stored([(topic, schedule_id)], lambda: self._delete(topic, schedule_id))

    async def _delete(self, topic: str, schedule_id: str) -> None:
        state = self.get(topic, schedule_id)
        run = None if state.pending is None else state.msg_id(state.pending)
        await self._file.write([{"delete": [topic, schedule_id], "stale": run}])
        del self._states[state.key]
        self._unplace(state)
        self.bytes_held -= state.spec.size_bytes
        if run is not None:
            await self._drop_run(topic, run)
        # after the drop too: a rewrite keeps only live rows, so the delete
        # record's stale run (what a restart drops if the drop failed) must
        # not go before the run does
        await self._rewrite_if_due()

    async def pause(self, topic: str, schedule_id: str) -> ScheduleState:
        """No more runs until resumed; its pending run deleted. NotFound if none."""
        self.backend()
        async with self._lock:
            return await self._as_stored([(topic, schedule_id)], lambda: self._pause(topic, schedule_id))

    async def _pause(self, topic: str, schedule_id: str) -> ScheduleState:
        state = self.get(topic, schedule_id)
        if state.paused:
            return state
        run = None if state.pending is None else state.msg_id(state.pending)
        paused = replace(state, paused=True, version=state.version + 1, catch_up=0, pending=None,
                         runs=state.runs - (state.pending is not None), stale=run)
        await self._file.write([{"put": paused.row()}])  # (RAM changed once it is written)
        self._unplace(state)
        paused.place = None
        self._states[paused.key] = paused
        await self._rewrite_if_due()  # (after: a rewrite keeps the states RAM holds)
        if run is not None:
            self._unsettled[paused.key] = paused  # a drop that fails, _repair does again
            await self._drop_run(topic, run)
            self._unsettled.pop(paused.key, None)
        paused.stale = None
        return paused

    async def resume(self, topic: str, schedule_id: str) -> ScheduleState:
        """Runs again from the first nominal time after now. NotFound if none."""
        self.backend()
        async with self._lock:
            return await self._as_stored([(topic, schedule_id)], lambda: self._resume(topic, schedule_id))

    async def _resume(self, topic: str, schedule_id: str) -> ScheduleState:
        state = self.get(topic, schedule_id)
        if not state.paused:
            return state
        left = state.runs_left()
        now_ms = self._clock.now_ms()
        first = None if left == 0 else state.recurrence.first_at_or_after(max(state.spec.start_ms, now_ms + 1))
        resumed = replace(state, paused=False, version=state.version + 1, pending=first,
                          runs=state.runs + (first is not None))
        await self._file.write([{"put": resumed.row()}])  # (RAM changed once it is written)
        self._states[resumed.key] = resumed
        await self._rewrite_if_due()  # (after: a rewrite keeps the states RAM holds)
        if first is not None:
            self._unsettled[resumed.key] = resumed  # a send that fails, _repair does again
            await self._send_runs([(resumed, first)], strict=False)
            self._unsettled.pop(resumed.key, None)
        return resumed

    async def fetch(self, topic: str, schedule_id: str) -> ScheduleState:
        """getSchedule's: the schedule as stored now. NotFound if none."""
        async with self._lock:
            await self._fresh([(topic, schedule_id)])
        return self.get(topic, schedule_id)

    async def fetch_page(self, topic: str, cursor: str | None, limit: int) -> tuple[list[ScheduleState], str | None]:
        """listSchedules': `page` over the topic's schedules as stored now."""
        async with self._lock:
            ids = await self._file.topic_ids(topic)
            if ids is not None:  # RAM's made the store's: the gone, and the page's (one more for the cursor)
                gone = [key for key in self._states if key[0] == topic and key[1] not in ids]
                shown = sorted(i for i in ids if cursor is None or i > cursor)[:limit + 1]
                await self._fresh(gone + [(topic, i) for i in shown])
        return self.page(topic, cursor, limit)

    async def last_runs(self, state: ScheduleState) -> list[dict[str, object]]:
        """getSchedule's lastRuns: the released runs, newest first, each with its message's status now."""
        backend = self.backend()
        runs: list[dict[str, object]] = []
        # (as they are now: the worker may follow the release while the reads below wait)
        listed, pending = state.last_runs, state.pending
        if pending is not None:  # released, its next run not made yet (on Redis: until the lease holder sees it)
            msg_id = state.msg_id(pending)
            try:
                message: Message | None = await backend.get(state.spec.topic, msg_id)
            except NotFound:
                message = None
            if message is not None and message.status is not Status.WAITING:
                late_ms = max(0, seen_released_ms(state.spec, pending, message.status, self._clock.now_ms())
                              - pending)
                runs.append({"scheduledTime": pending, "msgId": msg_id,
                             "triggerTime": state.trigger_ms(pending), "status": int(message.status),
                             "latenessMillis": late_ms, "missed": late_ms > state.spec.grace_ms})
                listed = listed[len(listed) >= LAST_RUNS:]
        for nominal_ms, late_ms, missed in reversed(listed):
            msg_id = state.msg_id(nominal_ms)
            try:
                status: int | None = int((await backend.get(state.spec.topic, msg_id)).status)
            except NotFound:
                status = None
            runs.append({"scheduledTime": nominal_ms, "msgId": msg_id, "triggerTime": state.trigger_ms(nominal_ms),
                         "status": status, "latenessMillis": late_ms, "missed": missed})
        return runs

    def check(self) -> None:
        """Raise InvariantError if RAM's states contradict themselves (tests)."""
        for key, state in self._states.items():
            if key != state.key:
                raise InvariantError(f"{state!r} is kept under {key}")
            if state.paused and state.pending is not None:
                raise InvariantError(f"{state!r} is paused with a pending run")
            if state.spec.limit is not None and state.runs > state.spec.limit:
                raise InvariantError(f"{state!r} made more runs than its limit")
