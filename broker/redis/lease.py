"""A lease in Redis: the right of one node at a time, of the nodes sharing
a Redis, to do a node-wide work -- making the schedules' runs
(broker.redis.schedules' `ScheduleWork`) or running the redriveMsgs jobs
(broker.redis.jobs' `JobWork`). One `RedisLease` holds each; the work
says what taking it and letting it go are (`LeaseWork`).

    <key>   string   the id of the node holding the lease (expires after
                     lease_ms unless renewed)

Every node tries to take it: SET NX PX, or a renewal when the key already
names this node (its own lease from before a restart: the node's id is
kept in its --data-dir by broker.redis.identity, so a restarted node takes
it back at once; another node waits for it to lapse). A node that finds it
taken looks again when it would lapse (PTTL), at least LEASE_LOOK_MIN_MS
later. The holder renews it every lease_ms / 3; a renewal refused (the
lease passed to another node), or none for 2/3 of lease_ms (Redis not
answering), lets the work go before the lease can lapse for another node
to take. `stop` lets the work go and releases the lease: another node
takes it at once.

The loop's turn is lease_ms / 3, or the work's `tick_ms` when shorter:
the holder's `tick` runs each turn (the jobs read their records again).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from typing import Protocol

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from storage.errors import HourglassError
from wheel.clock import Clock

from ..tasks import cancel_and_wait, raise_swallowed_cancel
from .link import REDIS_ERRORS

log = logging.getLogger("hourglass.redis.lease")

# KEYS: lease. ARGV: node lease_ms -> 1 renewed | 0 another's (or lapsed).
RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""
# KEYS: lease. ARGV: node -> 1 released | 0 not ours.
RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
# A node that finds the lease taken looks again at most this often, and
# at least this long after the lease was to lapse (PTTL).
LEASE_LOOK_MIN_MS = 20
# How long a stopping node waits for its lease's release (an optimisation:
# unreleased, the lease lapses after lease_ms for another node to take).
RELEASE_WAIT_S = 2.0


class LeaseWork(Protocol):
    """A node-wide work a `RedisLease` holds for the node."""

    what: str  # what it is (logs)
    key: str  # the lease's key
    tick_ms: int | None  # the holder's turn, when shorter than lease_ms / 3

    @property
    def opened(self) -> bool:
        """Whether what serves the API is open (`open`)."""

    async def open(self) -> None:
        """What serves the API, opened before the node listens (and again by
        the lease's loop if that failed)."""

    async def take(self) -> None:
        """The lease was just taken: do the work."""

    async def let_go(self) -> None:
        """The lease is lost or given back: stop the work."""

    async def tick(self) -> None:
        """Each turn while holding."""


class RedisLease:
    """The lease of `work` for this `node` (see the module docstring)."""

    def __init__(self, client: aioredis.Redis | RedisCluster, work: LeaseWork, clock: Clock, *, lease_ms: int,
                 node: str | None) -> None:
        self._redis = client
        self.work = work
        self.lease_key = work.key
        self._clock = clock
        self.lease_ms = lease_ms
        self.node = node or uuid.uuid4().hex  # (broker.redis.identity: kept across restarts)
        self._turn_ms = lease_ms // 3 if work.tick_ms is None else min(lease_ms // 3, work.tick_ms)
        self._renew = client.register_script(RENEW)
        self._release = client.register_script(RELEASE)
        self.holding = False
        self.takes = 0  # times this node took the lease (tests)
        self._task: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return f"RedisLease({self.work!r}, node={self.node}, holding={self.holding})"

    async def open(self) -> None:
        await self.work.open()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"{self.work.what}-lease")
        self._task.add_done_callback(self._loop_ended)

    async def stop(self) -> None:
        """Let the work go and the lease too: another node takes it at once
        (the release deletes the key only while it names this node; one
        not answered within RELEASE_WAIT_S lapses by itself)."""
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait((task,))
        await self._lose()
        with contextlib.suppress(*REDIS_ERRORS, TimeoutError):
            async with asyncio.timeout(RELEASE_WAIT_S):
                await self._release(keys=[self.lease_key], args=[self.node])

    async def _run(self) -> None:
        clock = self._clock
        renewed_s = 0.0  # (the monotonic clock: a wall clock set back must not hold renewals off)
        while True:
            now_s = clock.monotonic_s()
            wait_ms = self._turn_ms
            try:
                if not self.work.opened:
                    await self.work.open()
                if not self.holding:
                    if await self._redis.set(self.lease_key, self.node, nx=True, px=self.lease_ms) \
                            or await self._renew(keys=[self.lease_key], args=[self.node, str(self.lease_ms)]):
                        renewed_s = now_s
                        await self.work.take()
                        self.holding = True
                        self.takes += 1
                    else:  # looked at again when it would lapse (a dead holder's: its lease time at most)
                        left_ms = int(await self._redis.pttl(self.lease_key))
                        wait_ms = max(LEASE_LOOK_MIN_MS, min(wait_ms, left_ms + LEASE_LOOK_MIN_MS))
                else:
                    if (now_s - renewed_s) * 1000 >= self.lease_ms // 3:
                        if await self._renew(keys=[self.lease_key], args=[self.node, str(self.lease_ms)]):
                            renewed_s = now_s
                        else:
                            log.warning("%s: the lease passed to another node; this node lets its %s go",
                                        self.work.what, self.work.what)
                            await self._lose()
                    if self.holding:
                        await self.work.tick()
            except (*REDIS_ERRORS, HourglassError, OSError) as e:
                log.warning("%s: lease: %s", self.work.what, e)
                if self.holding and (clock.monotonic_s() - renewed_s) * 1000 > 2 * self.lease_ms // 3:
                    await self._lose()  # it may lapse before a renewal gets through
            raise_swallowed_cancel()
            await clock.sleep(wait_ms / 1000)

    async def _lose(self) -> None:
        if self.holding:
            try:
                await self.work.let_go()
            finally:
                self.holding = False

    def _loop_ended(self, task: asyncio.Task[None]) -> None:
        """The loop ends only when stopped; an error that ended it is logged
        (this node would not take the lease again)."""
        if not task.cancelled() and task.exception() is not None:
            log.critical("%s: the lease loop ended: %r; this node takes the %s lease no more",
                         self.work.what, task.exception(), self.work.what, exc_info=task.exception())


__all__ = ["LEASE_LOOK_MIN_MS", "RELEASE", "RELEASE_WAIT_S", "RENEW", "LeaseWork", "RedisLease"]
