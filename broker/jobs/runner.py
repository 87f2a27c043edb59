"""redriveMsgs jobs (docs/api.md, "Re-driving by filter"): dead letters put
back by filter, at a rate, in the background, surviving a restart and a
failover; listed by getJob, stopped by cancelJob.

A job is its parameters (topic, a `DeadFilter`, the new trigger time,
rate, limit), its progress (a cursor: the place in the topic's index
where its next slice starts) and its counts (matched, re-driven,
skipped = matched but no longer dead when its slice took it), a state
(running, done, cancelled, failed) and its times. `RedriveJobs` runs each
running job as a task of slices: a slice is the backend's
`redrive_slice` (broker.disk.dead_letters: at most JOB_SCAN index entries
read and `slice_size` matches re-driven as one MOVE record, appended when
it returns, with what makes it durable: the job awaits that while its
next slices run, at most UNSETTLED of them at once, so a slice's fsync
does not hold the next one back), then the job's record saved
(`JobStore.save`: durable, once every slice before it is; at most every
`save_every_s`), then a pause so the job keeps to its rate, measured
from the time it (re)started, each slice's moves counted at the pace of
their time (a job of a node of shards: its share of the node's rate,
moved by demand, broker.shards.rates):

    rate 10,000/s: slices of 250; slice k starts at t0 + 250·k / 10,000 s
    rate 0: slices of SLICE_MAX, one after another, the loop free between

so at any rate the event loop is held for one slice at most (a few ms):
/health and every request are served between slices.

Why a crash re-drives nothing twice: a slice's moves are durable before
the record that moves the cursor past them is saved; a message moved is no longer
dead (its old place released), so a slice read again after a restart (the
record not yet saved) passes it. What a crash can lose is the counts of
the slices since the last save (at most `save_every_s` of them): the
record then counts fewer than were re-driven. A message the job re-drove
that ends again before the job's scan reaches its new place is re-driven
again (its redriveCount says so).

Bounds: at most `max_jobs` jobs run at once, a job more is refused
(LimitReached, 429); the records kept, running and ended, are at most
`max_jobs` too: a new job takes the room of the oldest ended one (its
record dropped), and an ended job is kept `retention_ms` at most, then
dropped at the next create or list. getJob of a job whose record was
dropped says so while this node remembers it (the last DROPPED_KEPT).

Who calls what: the API (broker.jobs.api) calls `create`, `get`, `jobs`,
`cancel`; the node calls `start(backend)` once its broker serves (a
cluster: when it starts leading) and `stop()` when it stops (or stands
down): running jobs stay running in the store, and resume from their
cursor at the next `start`.

A shared store (Redis: broker.redis.jobs, several nodes over one): each
node's RedriveJobs serves the calls, reading the records again first
(`sync`); the node holding the jobs lease has it started, and `sync`s it
every 0.2 s too (launching the jobs other nodes made, stopping those whose
cancel another node asked through the store: `cancel` on a node that does
not run the job asks, then waits for the record to end).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import secrets
from collections import deque
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from storage.errors import ConfigError, ContractError, CorruptionError, InvalidRequest, LimitReached, NotFound, Unavailable
from wheel.clock import Clock

from ..core.bulk_params import DeadFilter, JobCursor, RedriveMsgsRequest
from ..core.redact import client_text
from ..tasks import cancel_and_wait

log = logging.getLogger("hourglass.jobs")

# Matches a slice re-drives at most (one MOVE record; a few ms of the loop).
SLICE_MAX = 250
# Slices a second a paced job aims at: slice size rate / SLICES_A_SECOND.
SLICES_A_SECOND = 40
# Slices appended and not yet durable a job runs ahead by at most.
UNSETTLED = 4
DEFAULT_MAX_JOBS = 100
DEFAULT_RETENTION_MS = 24 * 3_600_000
# A cancel asked of the node that runs the job (a shared store): its record
# read again this often, and the answer given after this long at most.
CANCEL_LOOK_S = 0.05
CANCEL_WAIT_S = 30.0
# Dropped jobs' ids remembered (RAM), so getJob says what became of them.
DROPPED_KEPT = 1000


class JobState(enum.Enum):
    RUNNING = "running"
    DONE = "done"
    CANCELLED = "cancelled"
    FAILED = "failed"


@dataclass(frozen=True)
class JobLimits:
    """What the node's jobs may hold (flags of `hourglass serve`)."""

    # Jobs running at once, and records kept, running and ended (--max-jobs): a redriveMsgs while
    # this many run is answered 429; past the records, the oldest ended one makes room.
    max_jobs: int = DEFAULT_MAX_JOBS
    # How long an ended job stays listed (--job-retention-ms).
    retention_ms: int = DEFAULT_RETENTION_MS

    def __post_init__(self) -> None:
        if self.max_jobs < 1:
            raise ConfigError(f"--max-jobs must be at least 1, got {self.max_jobs}")
        if self.retention_ms < 0:
            raise ConfigError(f"--job-retention-ms must be at least 0, got {self.retention_ms}")


class JobStore(Protocol):
    """Where job records are kept: a data directory's jobs files
    (broker.jobs.file), a cluster's replicated state (broker.cluster.records),
    or a Redis several nodes share (broker.redis.jobs). `save` and `remove`
    are durable on return."""

    # Seconds between two saves of a running job's progress (0: every slice).
    save_every_s: float

    def load(self) -> list[dict[str, object]]: ...

    async def save(self, record: Mapping[str, object]) -> None: ...

    async def remove(self, job_id: str) -> None: ...

    async def fetch(self) -> tuple[list[dict[str, object]], set[str]] | None:
        """A shared store's records as they are now, and the jobIds whose
        cancel another node asked (`ask_cancel`); None: a store only this
        node writes (its RAM is the truth)."""
        ...

    async def ask_cancel(self, job_id: str) -> None:
        """Ask the node that runs the job to cancel it (a shared store's)."""
        ...


class JobBackend(Protocol):
    """What a job's slices need of the broker (broker.disk.backend.Broker,
    broker.redis.backend.RedisBroker: each its own kind of cursor)."""

    async def redrive_slice(self, topic: str, flt: DeadFilter, trigger_ms: int | None, cursor: JobCursor,
                            max_moves: int) -> tuple[int, int, JobCursor | None, Coroutine[Any, Any, None] | None]: ...


def new_job_id() -> str:
    return secrets.token_hex(8)


@dataclass(slots=True)
class Job:
    """One job's record (see the module docstring)."""

    job_id: str
    topic: str
    filter: DeadFilter
    trigger_ms: int | None
    rate: int
    limit: int
    created_ms: int
    cursor: JobCursor = (0, 0)
    matched: int = 0
    redriven: int = 0
    state: JobState = JobState.RUNNING
    ended_ms: int | None = None
    error: str | None = None
    # The job's rate over the whole node (a job of a node of shards runs on
    # each, `rate` its share: broker.jobs.api); the same on a node of one.
    node_rate: int = -1
    # The rate this part of the job keeps now (RAM only): `rate`, or its
    # share of `node_rate` moved by demand (broker.shards.rates, `set_pace`).
    pace: float = -1.0

    def __post_init__(self) -> None:
        if self.node_rate < 0:
            self.node_rate = self.rate
        if self.pace < 0:
            self.pace = float(self.rate)

    def __repr__(self) -> str:
        return (f"Job({self.job_id}, {self.topic!r}, {self.state.value}, redriven={self.redriven}/{self.limit}, "
                f"cursor={tuple(self.cursor)})")

    @property
    def skipped(self) -> int:
        return self.matched - self.redriven

    def slice_size(self) -> int:
        """Matches the next slice takes at most."""
        size = SLICE_MAX if self.rate == 0 else max(1, min(SLICE_MAX, int(self.pace) // SLICES_A_SECOND))
        return min(size, self.limit - self.redriven)

    def stored(self) -> dict[str, object]:
        """The record as a JobStore keeps it."""
        return {"jobId": self.job_id, "kind": "redriveMsgs", "topic": self.topic, "filter": self.filter.fields(),
                "triggerTime": self.trigger_ms, "rate": self.rate, "limit": self.limit,
                "createTime": self.created_ms, "cursor": list(self.cursor), "matched": self.matched,
                "redriven": self.redriven, "state": self.state.value, "endTime": self.ended_ms, "error": self.error,
                "nodeRate": self.node_rate}

    @classmethod
    def from_stored(cls, record: Mapping[str, object]) -> Job:
        """A stored record's job; InvalidRequest if it is none."""
        try:
            flt, cursor = record["filter"], record["cursor"]
            if not (isinstance(flt, list) and isinstance(cursor, list) and len(cursor) == 2):
                raise ContractError(f"a filter list and a cursor pair, not {flt!r} and {cursor!r}")
            job = cls(str(record["jobId"]), str(record["topic"]), DeadFilter.of(flt), _int_or_none(record["triggerTime"]),
                      _int(record["rate"]), _int(record["limit"]), _int(record["createTime"]),
                      (_int(cursor[0]), cursor[1] if isinstance(cursor[1], str) else _int(cursor[1])),
                      _int(record["matched"]), _int(record["redriven"]),
                      JobState(record["state"]), _int_or_none(record["endTime"]),
                      None if record.get("error") is None else str(record["error"]),
                      _int(record.get("nodeRate", record["rate"])))  # (a record of an older release: its rate)
        except (KeyError, ValueError, TypeError) as e:
            raise InvalidRequest("job", f"not a job's record: {e!r}") from e
        return job

    def public(self) -> dict[str, object]:
        """getJob's `job`."""
        f = self.filter
        return {"jobId": self.job_id, "kind": "redriveMsgs", "topic": self.topic,
                "filter": {"key": f.key, "tag": f.tag, "msgIdPrefix": f.msg_id_prefix,
                           "status": sorted(int(s) for s in f.statuses), "endedFrom": f.ended_from_ms,
                           "endedTo": f.ended_to_ms},
                "triggerTime": self.trigger_ms, "rate": self.rate, "limit": self.limit, "state": self.state.value,
                "matched": self.matched, "redriven": self.redriven, "skipped": self.skipped,
                "createTime": self.created_ms, "endTime": self.ended_ms, "error": self.error}


def _retrieved(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        task.exception()


def _int(value: object) -> int:
    if type(value) is not int:
        raise ContractError(f"{value!r} is not a whole number")
    return value


def _int_or_none(value: object) -> int | None:
    return None if value is None else _int(value)


class RedriveJobs:
    """The node's redriveMsgs jobs over a JobStore (see the module docstring).
    Runs on the event loop."""

    def __init__(self, store: JobStore, clock: Clock, limits: JobLimits | None = None, *,
                 shared: bool = False) -> None:
        self._store = store
        self._clock = clock
        self.limits = limits or JobLimits()
        self._jobs: dict[str, Job] = {}
        for record in store.load():
            try:
                job = Job.from_stored(record)
            except InvalidRequest as e:
                raise CorruptionError(f"{store!r} job {record.get('jobId')!r}", 0, e.reason) from e
            self._jobs[job.job_id] = job
        self._backend: JobBackend | None = None
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._wakes: dict[str, asyncio.Event] = {}
        self._cancelled: set[str] = set()
        self._creating = asyncio.Lock()
        # jobId -> when its next slice is due (monotonic s), while it runs here
        self._due_s: dict[str, float] = {}
        # jobId -> why and when its record was dropped (the last DROPPED_KEPT), for getJob's 404
        self._dropped: dict[str, str] = {}
        self.slices = 0  # slices run (tests)
        # Whether other nodes write the store too (broker.redis.jobs): its
        # records are read again before each call (`sync`).
        self.shared = shared

    def __repr__(self) -> str:
        running = sum(job.state is JobState.RUNNING for job in self._jobs.values())
        return f"RedriveJobs({len(self._jobs)} jobs, {running} running, {self._store!r})"

    # == lifetime ================================================================

    def start(self, backend: JobBackend) -> None:
        """Run the running jobs (resumed from their cursors) over `backend`."""
        self._backend = backend
        for job in self._jobs.values():
            if job.state is JobState.RUNNING:
                self._launch(job)

    async def stop(self) -> None:
        """Stop every job's task between or in a slice; their records stay
        running (what a slice cut short made durable, the next start passes)."""
        self._backend = None
        await cancel_and_wait(list(self._tasks.values()))
        self._tasks.clear()

    def _launch(self, job: Job) -> None:
        self._wakes[job.job_id] = asyncio.Event()
        task = asyncio.create_task(self._run(job), name=f"job-{job.job_id}")
        self._tasks[job.job_id] = task
        task.add_done_callback(lambda _: self._tasks.pop(job.job_id, None))

    # == the calls ================================================================

    async def create(self, request: RedriveMsgsRequest, job_id: str | None = None, node_rate: int = -1,
                     drop: Sequence[str] = ()) -> Job:
        """A new job, saved (durable) and started; LimitReached while
        --max-jobs run. `node_rate`: the rate of the whole job when this is a
        shard's part of it (its `rate` a share), else its rate. `drop`: the
        ended jobs whose records make room (a node of shards picks the same
        on every shard); more, the oldest ended, if need be."""
        async with self._creating:  # (two creates at once: each counts the other's job)
            await self.sync()
            now_ms = self._clock.now_ms()
            await self._drop_expired(now_ms)
            for old in [self._jobs.get(i) for i in drop]:
                if old is not None and old.state is not JobState.RUNNING:
                    await self._drop(old, now_ms, f"its room was taken by a newer job (--max-jobs "
                                                  f"{self.limits.max_jobs})")
            await self._make_room(now_ms)
            job_id = job_id or new_job_id()
            if job_id in self._jobs:
                raise InvalidRequest("jobId", f"job {job_id} exists")
            job = Job(job_id, request.topic, request.filter, request.trigger_ms, request.rate, request.limit, now_ms,
                      node_rate=node_rate)
            await self._store.save(job.stored())
            self._jobs[job_id] = job
        if self._backend is not None:
            self._launch(job)
        log.info("job %s: redriveMsgs of topic %s started (rate %d, limit %d)", job_id, job.topic, job.rate,
                 job.limit)
        return job

    def get(self, job_id: str) -> Job:
        job = self._jobs.get(job_id)
        if job is None:
            dropped = self._dropped.get(job_id)
            if dropped is not None:
                raise NotFound(f"job {job_id!r} ended and its record was dropped: {dropped}")
            raise NotFound(f"no job {job_id!r} (an ended job is kept --job-retention-ms, and until --max-jobs "
                           f"newer ones need its room)")
        return job

    async def jobs(self) -> list[Job]:
        """Every job kept, newest first (at most --max-jobs)."""
        await self.sync()
        await self._drop_expired(self._clock.now_ms())
        return sorted(self._jobs.values(), key=lambda job: (-job.created_ms, job.job_id))

    async def cancel(self, job_id: str) -> Job:
        """A running job stops after its current slice (answered once it
        has, its record saved cancelled); an ended one is answered as it is."""
        await self.sync()
        job = self.get(job_id)
        if job.state is not JobState.RUNNING:
            return job
        task = self._tasks.get(job_id)
        if task is None and self.shared:  # (run by another node, or by none yet: asked of the one that will)
            return await self._cancel_elsewhere(job_id)
        self._cancelled.add(job_id)
        if task is None:  # (not started: no broker serves yet)
            await self._end(job, JobState.CANCELLED)
            return job
        self._wakes[job_id].set()
        await asyncio.shield(task)
        return job

    async def _cancel_elsewhere(self, job_id: str) -> Job:
        """A shared store's job this node does not run: the cancel asked of
        the node that runs it, answered once its record says it ended (its
        current slice done), or as it is after CANCEL_WAIT_S (no node ran
        it meanwhile: the next to take the jobs ends it before any slice)."""
        await self._store.ask_cancel(job_id)
        deadline_s = self._clock.monotonic_s() + CANCEL_WAIT_S
        while True:
            await self.sync()
            job = self.get(job_id)
            if job.state is not JobState.RUNNING or self._clock.monotonic_s() >= deadline_s:
                return job
            await asyncio.sleep(CANCEL_LOOK_S)

    async def sync(self) -> None:
        """A shared store's records read again (a no-op for one only this
        node writes): each job not running here as the store has it (an
        ended one stays ended: records end once), new ones added, removed
        ones dropped; on the node that runs them (started), each running
        job not yet run here launched, and each whose cancel was asked
        stopped after its current slice."""
        fetched = await self._store.fetch()
        if fetched is None:
            return
        records, cancels = fetched
        seen = set()
        for record in records:
            try:
                job = Job.from_stored(record)
            except InvalidRequest as e:
                raise CorruptionError(f"{self._store!r} job {record.get('jobId')!r}", 0, e.reason) from e
            seen.add(job.job_id)
            mine = self._jobs.get(job.job_id)
            if job.job_id in self._tasks or (mine is not None and mine.state is not JobState.RUNNING):
                continue
            self._jobs[job.job_id] = job
            if self._backend is not None and job.state is JobState.RUNNING:
                self._launch(job)
        for job_id in [i for i in self._jobs if i not in seen and i not in self._tasks]:
            del self._jobs[job_id]
        for job_id in cancels:
            if job_id in self._tasks and job_id not in self._cancelled:
                self._cancelled.add(job_id)
                self._wakes[job_id].set()

    async def _drop_expired(self, now_ms: int) -> None:
        for job in list(self._jobs.values()):
            if job.ended_ms is not None and now_ms - job.ended_ms >= self.limits.retention_ms:
                await self._drop(job, now_ms, f"kept --job-retention-ms ({self.limits.retention_ms} ms) after it ended")

    async def _make_room(self, now_ms: int) -> None:
        """Room for a job more: LimitReached while --max-jobs run; else, at
        --max-jobs records, the oldest ended ones dropped (oldest made first:
        on a node of shards every shard drops the same)."""
        limit = self.limits.max_jobs
        if len(self._jobs) < limit:
            return
        ended = sorted((job for job in self._jobs.values() if job.state is not JobState.RUNNING),
                       key=lambda job: (job.created_ms, job.job_id))
        if len(self._jobs) - len(ended) >= limit:
            raise LimitReached(f"the node runs {len(self._jobs) - len(ended)} redriveMsgs jobs and --max-jobs is "
                               f"{limit}: a job more is refused until one ends (cancelJob ends one); retry later")
        for job in ended[:len(self._jobs) - limit + 1]:
            await self._drop(job, now_ms, f"its room was taken by a newer job (--max-jobs {limit})")

    async def _drop(self, job: Job, now_ms: int, why: str) -> None:
        await self._store.remove(job.job_id)
        self._jobs.pop(job.job_id, None)
        self._dropped[job.job_id] = f"{why}, at {now_ms} ms"
        if len(self._dropped) > DROPPED_KEPT:
            del self._dropped[next(iter(self._dropped))]

    # == a job's task =============================================================

    async def _run(self, job: Job) -> None:
        clock = self._clock
        saved_s = self._due_s[job.job_id] = clock.monotonic_s()
        wake = self._wakes[job.job_id]
        unsettled: deque[asyncio.Task[None]] = deque()  # slices appended, their durability awaited in order

        async def settle(keep: int) -> None:
            while len(unsettled) > keep:
                await unsettled.popleft()
        try:
            while True:
                if job.job_id in self._cancelled:
                    await settle(0)
                    await self._end(job, JobState.CANCELLED)
                    return
                backend = self._backend
                if backend is None:
                    return
                matched, redriven, after, settled = await backend.redrive_slice(
                    job.topic, job.filter, job.trigger_ms, job.cursor, job.slice_size())
                if settled is not None:
                    unsettled.append(asyncio.ensure_future(settled))
                self.slices += 1
                job.matched += matched
                job.redriven += redriven
                if after is not None:
                    job.cursor = after
                if after is None or job.redriven >= job.limit:
                    await settle(0)
                    await self._end(job, JobState.DONE)
                    return
                if job.rate:
                    self._due_s[job.job_id] += redriven / job.pace
                await settle(UNSETTLED)
                now_s = clock.monotonic_s()
                if now_s - saved_s >= self._store.save_every_s:
                    await settle(0)
                    await self._store.save(job.stored())
                    saved_s = now_s
                await self._keep_pace(job, wake)
        except asyncio.CancelledError:
            raise
        except Unavailable as e:  # stopping, deposed or failed: the job goes on at the next start
            if self._backend is not None:
                log.warning("job %s paused until the node serves again: %s", job.job_id, client_text(e))
        except Exception as e:
            log.exception("job %s failed", job.job_id)
            job.error = client_text(e)
            await self._end(job, JobState.FAILED)
        finally:
            self._due_s.pop(job.job_id, None)
            for task in unsettled:  # (stopped or failed: what they made durable, the next start passes)
                task.cancel()
                task.add_done_callback(_retrieved)

    async def _keep_pace(self, job: Job, wake: asyncio.Event) -> None:
        """Wait until the job's next slice is due at its pace (`_due_s`: each
        slice's moves at the pace of the time), or it is cancelled."""
        waited = False
        while job.rate and job.job_id not in self._cancelled:
            pause_s = self._due_s[job.job_id] - self._clock.monotonic_s()
            if pause_s <= 0:
                break
            waited = True
            wake.clear()  # (set again by a cancel or a new pace: looked at again)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(wake.wait(), pause_s)
        if not waited:
            await asyncio.sleep(0)

    def paces(self) -> list[tuple[str, int, float]]:
        """(jobId, node rate, pace) of each paced job running here."""
        return [(job_id, job.node_rate, job.pace) for job_id in self._tasks
                if (job := self._jobs[job_id]).rate and job.state is JobState.RUNNING]

    def set_pace(self, job_id: str, per_s: float) -> None:
        """The job's part here runs at `per_s` from now on (its share of the
        node's rate: broker.shards.rates); the wait for its next slice
        stretched or shrunk to the new pace."""
        job = self._jobs.get(job_id)
        if job is None or job.state is not JobState.RUNNING or not job.rate or per_s <= 0 or per_s == job.pace:
            return
        due_s = self._due_s.get(job_id)
        if due_s is not None:
            now_s = self._clock.monotonic_s()
            if due_s > now_s:
                self._due_s[job_id] = now_s + (due_s - now_s) * job.pace / per_s
        job.pace = per_s
        wake = self._wakes.get(job_id)
        if wake is not None:
            wake.set()

    async def _end(self, job: Job, state: JobState) -> None:
        """The job's record saved ended, then the job ended in RAM: once a
        job reads as ended, no save of it is left to come (a record dropped
        to make room is not written back)."""
        ended_ms = self._clock.now_ms()
        await self._store.save({**job.stored(), "state": state.value, "endTime": ended_ms})
        job.state = state
        job.ended_ms = ended_ms
        self._cancelled.discard(job.job_id)
        log.info("job %s %s: %d matched, %d re-driven", job.job_id, state.value, job.matched, job.redriven)
