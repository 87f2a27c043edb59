"""redriveMsgs jobs on the Redis backend (docs/redis.md, "redriveMsgs jobs
on Redis"): broker.jobs.runner's `RedriveJobs`, unchanged in what a job is,
over a `RedisJobStore`, run by the one node that holds the jobs lease
(`JobWork`); every node sharing the Redis serves getJob, cancelJob and
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

The lease (broker.redis.lease): its holder reads the records
(`RedriveJobs.sync`) and runs the running jobs from their cursors, then
reads them again every SYNC_S: jobs made by other nodes start within that,
and a cancel another node asked is carried out after the current slice.
A holder that loses the lease stops the jobs (their records stay running);
one killed: the next takes the jobs within lease_ms.

The other nodes read the records afresh before each call (`sync`): a
getJob shows a running job's counts as of the holder's last save; a
cancelJob asks the holder (J cancel) and answers once the record says the
job ended.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

import orjson
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from storage.errors import CorruptionError, Unavailable
from wheel.clock import Clock

from ..jobs.runner import JobBackend, JobLimits, JobState, RedriveJobs
from .link import REDIS_ERRORS

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


class JobWork:
    """The node's jobs: a `RedriveJobs` over the records in Redis that serves
    the API (published by `open`), run by this node while it holds the
    jobs lease (broker.redis.lease), which reads the records again every
    SYNC_S."""

    what = "jobs"
    tick_ms: int | None = int(SYNC_S * 1000)

    def __init__(self, client: aioredis.Redis | RedisCluster, key_prefix: str, backend: JobBackend, clock: Clock,
                 limits: JobLimits, publish: Callable[[RedriveJobs], None]) -> None:
        self.key = job_keys(key_prefix)[2]
        self._redis = client
        self._clock = clock
        self._prefix = key_prefix
        self._backend = backend
        self._limits = limits
        self._publish = publish
        self.jobs: RedriveJobs | None = None
        self._synced_s = 0.0  # (monotonic)

    def __repr__(self) -> str:
        return f"JobWork({self._prefix!r}, open={self.jobs is not None})"

    @property
    def opened(self) -> bool:
        return self.jobs is not None

    async def open(self) -> None:
        """Read the records and serve the API's calls (before the node listens)."""
        store = RedisJobStore(self._redis, self._prefix)
        await store.read()
        self.jobs = RedriveJobs(store, self._clock, self._limits, shared=True)
        self._publish(self.jobs)

    async def take(self) -> None:
        assert self.jobs is not None
        self._synced_s = self._clock.monotonic_s()
        await self.jobs.sync()
        self.jobs.start(self._backend)
        log.info("jobs: this node holds the jobs lease and runs the jobs")

    async def tick(self) -> None:
        now_s = self._clock.monotonic_s()
        if self.jobs is not None and now_s - self._synced_s >= SYNC_S:
            self._synced_s = now_s
            await self.jobs.sync()

    async def let_go(self) -> None:
        """Stop the jobs (their records stay running)."""
        if self.jobs is not None:
            await self.jobs.stop()


__all__ = ["JobWork", "RedisJobStore"]
