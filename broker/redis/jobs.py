"""redriveMsgs jobs on the Redis backend (docs/redis.md, "redriveMsgs jobs
on Redis"): broker.jobs.runner's `RedriveJobs`, unchanged in what a job is,
over a `RedisJobStore`, run by the one node that holds the jobs lease
(`JobLease`); every node sharing the Redis serves getJob, cancelJob and
redriveMsgs from the records in Redis.

Keys (J = "<prefix>:{jobs}:", one hash tag: one Redis Cluster slot):

    J jobs     hash    jobId -> the job's record (JSON, as
                       broker.jobs.runner's `Job.stored`)
    J cancel   hash    jobId -> "1": a cancel asked by a node that does not
                       run the job, for the holder to carry out (dropped
                       with the record's end, or its removal)
    J lease    string  the id of the node running the jobs (expires after
                       lease_ms unless renewed)

A job's slice is one script over its topic's keys
(lua/backend/redrive_slice.lua, broker.redis.requests' `redrive_slice`):
atomic, and a message it moved is no longer in the dead set, so a slice
run again -- by the same node after a restart, or by the next holder after
the lease passed, from the last cursor saved -- re-drives nothing twice.
The holder saves a running job's record at most every SAVE_EVERY_S; what a
node death loses is the counts of the slices since (the record counts
fewer than were re-driven, never more).

The lease. Every node tries to take it (SET NX PX; one that finds it taken
looks again when it would lapse) and renews it every lease_ms / 3; the
holder reads the records (`RedriveJobs.sync`) and runs the running jobs
from their cursors, then reads them again every SYNC_S: jobs made by other
nodes start within that, and a cancel another node asked is carried out
after the current slice. A renewal that fails, or none for 2/3 of lease_ms,
stops the jobs (their records stay running) before the lease can lapse for
another node to take. A holder killed: the next takes the jobs within
lease_ms.

The other nodes read the records afresh before each call (`sync`): a
getJob shows a running job's counts as of the holder's last save; a
cancelJob asks the holder (J cancel) and answers once the record says the
job ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable, Mapping

import orjson
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from storage.errors import CorruptionError, HourglassError, Unavailable
from wheel.clock import Clock

from ..jobs.runner import JobBackend, JobLimits, JobState, RedriveJobs
from .link import REDIS_ERRORS
from .schedules import LEASE_LOOK_MIN_MS, RELEASE, RENEW

log = logging.getLogger("hourglass.redis.jobs")

# Seconds between two saves of a running job's progress (a HSET each).
SAVE_EVERY_S = 0.2
# How often the holder reads the records again (jobs made, cancels asked elsewhere).
SYNC_S = 0.2

# KEYS: jobs, cancel. ARGV: jobId record ended("1"/"0") -> 1. An ended
# job's cancel request goes with its end.
SAVE = """
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
if ARGV[3] == '1' then redis.call('HDEL', KEYS[2], ARGV[1]) end
return 1
"""
# KEYS: jobs, cancel. ARGV: jobId -> 1 asked | 0 no such running job.
ASK_CANCEL = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('HSET', KEYS[2], ARGV[1], '1')
return 1
"""
# KEYS: jobs, cancel. ARGV: jobId -> 1.
REMOVE = """
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
return 1
"""
# KEYS: jobs, cancel -> {every record, the jobIds whose cancel was asked}.
FETCH = """
return {redis.call('HVALS', KEYS[1]), redis.call('HKEYS', KEYS[2])}
"""


def job_keys(key_prefix: str) -> tuple[str, str, str]:
    """The jobs, cancel and lease keys (the module docstring)."""
    p = f"{key_prefix}:{{jobs}}:"
    return p + "jobs", p + "cancel", p + "lease"


class RedisJobStore:
    """broker.jobs.runner's JobStore in Redis (the module docstring): `read`
    before `load`; `fetch` reads them again; `save` and `remove` are one
    script each, as durable as Redis keeps what it is told."""

    save_every_s = SAVE_EVERY_S

    def __init__(self, client: aioredis.Redis | RedisCluster, key_prefix: str) -> None:
        self._redis = client
        self._jobs_key, self._cancel_key, _ = job_keys(key_prefix)
        self._save = client.register_script(SAVE)
        self._ask = client.register_script(ASK_CANCEL)
        self._fetch = client.register_script(FETCH)
        self._remove = client.register_script(REMOVE)
        self._loaded: list[dict[str, object]] = []

    def __repr__(self) -> str:
        return f"RedisJobStore({self._jobs_key!r})"

    async def read(self) -> None:
        """Read the records for `load` (before the RedriveJobs is built)."""
        self._loaded = (await self._fetched())[0]

    def load(self) -> list[dict[str, object]]:
        return self._loaded

    async def fetch(self) -> tuple[list[dict[str, object]], set[str]] | None:
        return await self._fetched()

    async def _fetched(self) -> tuple[list[dict[str, object]], set[str]]:
        try:
            values, cancels = await self._fetch(keys=[self._jobs_key, self._cancel_key])
        except REDIS_ERRORS as e:
            raise Unavailable(f"cannot read the jobs from Redis: {e}") from e
        records = []
        for value in values:
            try:
                record = orjson.loads(value)
            except orjson.JSONDecodeError as e:
                raise CorruptionError(self._jobs_key, 0, f"a job's record is not JSON: {e}") from e
            if not isinstance(record, dict):
                raise CorruptionError(self._jobs_key, 0, f"a job's record is not a JSON object: {value[:80]!r}")
            records.append(record)
        return records, {str(c) for c in cancels}

    async def save(self, record: Mapping[str, object]) -> None:
        ended = record.get("state") != JobState.RUNNING.value
        try:
            await self._save(keys=[self._jobs_key, self._cancel_key],
                             args=[str(record["jobId"]), orjson.dumps(record), "1" if ended else "0"])
        except REDIS_ERRORS as e:
            raise Unavailable(f"cannot write the job's record to Redis: {e}") from e

    async def remove(self, job_id: str) -> None:
        try:
            await self._remove(keys=[self._jobs_key, self._cancel_key], args=[job_id])
        except REDIS_ERRORS as e:
            raise Unavailable(f"cannot remove the job's record from Redis: {e}") from e

    async def ask_cancel(self, job_id: str) -> None:
        try:
            await self._ask(keys=[self._jobs_key, self._cancel_key], args=[job_id])
        except REDIS_ERRORS as e:
            raise Unavailable(f"cannot ask the job's cancel in Redis: {e}") from e


class JobLease:
    """The node's jobs: a `RedriveJobs` over the records in Redis that serves
    the API (published by `open`), run by this node while it holds the
    jobs lease (the module docstring). Renewed every lease_ms / 3."""

    def __init__(self, client: aioredis.Redis | RedisCluster, key_prefix: str, backend: JobBackend, clock: Clock,
                 limits: JobLimits, publish: Callable[[RedriveJobs], None], *, lease_ms: int = 10_000,
                 node: str | None = None) -> None:
        self._redis = client
        self._prefix = key_prefix
        self._backend = backend
        self._clock = clock
        self._limits = limits
        self._publish = publish
        self.lease_ms = lease_ms
        self.node = node or uuid.uuid4().hex  # (broker.redis.identity: kept across restarts)
        self._lease_key = job_keys(key_prefix)[2]
        self._renew = client.register_script(RENEW)
        self._release = client.register_script(RELEASE)
        self.jobs: RedriveJobs | None = None
        self.holding = False
        self._task: asyncio.Task[None] | None = None
        self.takes = 0  # times this node took the lease (tests)

    def __repr__(self) -> str:
        return f"JobLease(node={self.node}, holding={self.holding})"

    async def open(self) -> None:
        """Read the records and serve the API's calls (before the node listens)."""
        store = RedisJobStore(self._redis, self._prefix)
        await store.read()
        self.jobs = RedriveJobs(store, self._clock, self._limits, shared=True)
        self._publish(self.jobs)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="job-lease")

    async def stop(self) -> None:
        """Stop the jobs (their records stay running) and let the lease go:
        another node takes them at once."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        held = self.holding
        await self._let_go()
        if held:
            with contextlib.suppress(*REDIS_ERRORS):
                await self._release(keys=[self._lease_key], args=[self.node])

    async def _run(self) -> None:
        renewed_ms = 0
        synced_ms = 0
        while True:
            now_ms = self._clock.now_ms()
            wait_ms = min(self.lease_ms // 3, int(SYNC_S * 1000))
            try:
                if self.jobs is None:
                    await self.open()
                jobs = self.jobs
                assert jobs is not None
                if not self.holding:
                    # free, or this node's own from before a restart (its id kept: broker.redis.identity)
                    if await self._redis.set(self._lease_key, self.node, nx=True, px=self.lease_ms) \
                            or await self._renew(keys=[self._lease_key], args=[self.node, str(self.lease_ms)]):
                        renewed_ms = synced_ms = now_ms
                        await jobs.sync()
                        jobs.start(self._backend)
                        self.holding = True
                        self.takes += 1
                        log.info("jobs: this node holds the jobs lease and runs the jobs")
                    else:  # looked at again when it would lapse (a dead holder's: its lease time at most)
                        left_ms = int(await self._redis.pttl(self._lease_key))
                        wait_ms = max(LEASE_LOOK_MIN_MS, min(self.lease_ms // 3, left_ms + LEASE_LOOK_MIN_MS))
                else:
                    if now_ms - renewed_ms >= self.lease_ms // 3:
                        if await self._renew(keys=[self._lease_key], args=[self.node, str(self.lease_ms)]):
                            renewed_ms = now_ms
                        else:
                            log.warning("jobs: the lease passed to another node; this node stops its jobs")
                            await self._let_go()
                    if self.holding and now_ms - synced_ms >= SYNC_S * 1000:
                        synced_ms = now_ms
                        await jobs.sync()
            except (*REDIS_ERRORS, HourglassError, OSError) as e:
                log.warning("jobs: lease: %s", e)
                if self.holding and self._clock.now_ms() - renewed_ms > 2 * self.lease_ms // 3:
                    await self._let_go()  # it may lapse before a renewal gets through
            await self._clock.sleep(wait_ms / 1000)

    async def _let_go(self) -> None:
        if self.holding and self.jobs is not None:
            await self.jobs.stop()
        self.holding = False


__all__ = ["JobLease", "RedisJobStore"]
