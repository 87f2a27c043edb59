"""The message lifecycle of one node: docs/api.md's Semantics over the disk store.

Where each state lives:

    1 WAITING     on disk only; the timing wheel (wheel.Scheduler) reads it
                  back a few seconds before its trigger and releases it
    2 READY       on disk; RAM holds a bounded window of them per topic
                  (broker.ready), ordered by (-priority, triggerTime), each
                  with an expiry timer; the rest are refilled from disk
    3 CONSUMING   on disk, and in RAM with an ack-deadline timer, capped
                  per topic (a pull at the cap takes fewer)
    4..7 final    on disk only, readable by getMsg until the hour retires

Every transition is one status change appended to the commit log
(`Store.update`); a request is answered only after its change is durable
(`GroupCommit`). The one change made without a request -- WAITING -> READY
when the wheel releases a message, and READY/CONSUMING -> retry or end when
a timer fires -- is durable before the wheel's tick moves past it, so
after a crash nothing released is lost. A restart reads no backlog:
CONSUMING messages come from the store's in-flight set (kept in its
checkpoint, bounded by the in-flight cap) with their own ack deadlines
(capped at the default ack timeout from the restart); each topic with READY
messages starts spilled from its first hour holding any, refilled as
consumers take them; WAITING ones come back through the wheel from its tick.
A pull is answered before its record is durable on a standalone node (a
crash then redelivers it: at least once); every other change is answered
after its fsync.

Transitions (now = the clock; expire = triggerTime + ttlMillis):

    release      WAITING -> READY, or EXPIRED (5) if now >= expire
    pull         READY -> CONSUMING, deadline = now + ackTimeoutMillis
    ack          CONSUMING or READY -> ACKED
    nack         CONSUMING -> READY with retry+1, or ENDED (6) past maxRetry;
                 of a READY message: nothing (a repeated nack)
    ack timeout  CONSUMING -> READY with retry+1, or ENDED (6) past maxRetry
                 or past expire
    expiry       READY -> EXPIRED (5) if never delivered (retry 0), else ENDED
                 (6); a CONSUMING message is left to its ack or ack timeout;
                 a spilled READY one when the refill reaches it
    delete       WAITING, READY or CONSUMING -> DELETED; `release` also frees
                 the msgId (getMsg answers 404, the id may be sent again)

Long polls wait on their topic; a message becoming READY wakes them at once.

The Broker is assembled from one module per concern, each a mixin over the
Broker's state (this module holds the state, the constructor and the
lifetime):

    broker.group_commit   GroupCommit: many requests, one fsync
    broker.operations     the request methods (send, pull, long poll, ack...)
    broker.windows        READY windows and in-flight messages in RAM; refills
    broker.timers         ack deadlines and expiries
    broker.releases       WAITING -> READY; tick persistence; recovery
    broker.dead_letters   reschedule, listDeadMsg, redrive
    broker.lifecycle      stopping, failing and long polls (shared with Redis)
"""

from __future__ import annotations

import asyncio
import itertools
from collections import defaultdict

from storage.entry import Location
from storage.errors import Unavailable
from storage.store import StateChange, Store
from wheel.clock import Clock
from wheel.driver import WheelDriver
from wheel.scheduler import Scheduler, SchedulerConfig
from wheel.tick_state import TickState, TickStateFile

from .dead_letters import DeadLetters
from .group_commit import GroupCommit, Replicated
from .lifecycle import Lifecycle
from .metrics import Metrics
from .operations import Operations
from .params import Defaults
from .ready import Live, QueueLimits, TopicQueue
from .redact import client_text
from .releases import Releases
from .timers import Timers
from .windows import Windows

__all__ = ["Broker", "GroupCommit"]


class Broker(Operations, Windows, Timers, Releases, DeadLetters, Lifecycle):
    """One standalone node's queues over a `Store`. All methods run on the
    event loop; `start()` launches the commit, wheel and timer tasks."""

    def __init__(self, store: Store, clock: Clock, defaults: Defaults, metrics: Metrics, *,
                 tick_path: str, scheduler_config: SchedulerConfig | None = None,
                 replicated: Replicated | None = None, apply_lock: asyncio.Lock | None = None,
                 limits: QueueLimits | None = None) -> None:
        super().__init__()  # (Lifecycle: stopping, failing, long-poll waiters)
        self.store = store
        self.clock = clock
        self.defaults = defaults
        self.metrics = metrics
        self.limits = limits or QueueLimits()
        self.topics: dict[str, TopicQueue] = {}
        self.live: dict[Location, Live] = {}  # every window and consuming message
        self._inflight: dict[tuple[str, str], Live] = {}  # consuming ones by (topic, msgId)
        self.window_total = 0  # READY messages held in windows (parked ones included)
        self.parked_total = 0  # of which parked: held behind a busy serial key (broker.ready)
        self.key_spilled_total = 0  # places of serial keys' messages on disk remembered (broker.ready)
        self.consuming_total = 0
        # A pull waits for its record's fsync only in a cluster (there the
        # answer also waits for followers, as every write's).
        self._pull_waits = replicated is not None
        # Topics of sends appended but maybe not applied yet, which the store
        # does not name yet: counted against --max-topics (broker.operations).
        self._topics_filing: set[str] = set()
        self._to_refill: set[str] = set()  # spilled topics whose window has room
        self._key_refills: set[tuple[str, str]] = set()  # (topic, serial key) freed with messages on disk
        self._refill_wake = asyncio.Event()
        self._span_wake = asyncio.Event()  # a send filed into a span (see _run_span_moves)
        self._timers: list[tuple[int, int, Location, str]] = []  # (due_ms, seq, location, "ack" | "expire")
        self._timer_seq = itertools.count()
        self._timer_wake = asyncio.Event()
        # Filing seconds of sends appended but not yet handed to the wheel:
        # the tick written to disk never passes them (see _persist_tick).
        self._unfiled: dict[int, int] = defaultdict(int)
        self._tick_file = TickStateFile(tick_path, fsync=True)
        now_ms = clock.now_ms()
        self._recover(now_ms)
        self.scheduler = Scheduler(store, self._tick_file.state, now_ms, scheduler_config or SchedulerConfig())
        self.commits = GroupCommit(store, self._on_committed, metrics, replicated, apply_lock)
        self.driver = WheelDriver(self.scheduler, clock, self._release, persist_tick=self._persist_tick)
        self._tasks: list[asyncio.Task] = []

    # == lifetime ================================================================

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self.commits.run(), name="group-commit"),
                       asyncio.create_task(self.driver.run(), name="wheel"),
                       asyncio.create_task(self._run_timers(), name="timers"),
                       asyncio.create_task(self._run_refills(), name="refills"),
                       asyncio.create_task(self._run_span_moves(), name="span-moves")]
        for task in self._tasks:
            task.add_done_callback(self._task_ended)
        if self._to_refill:  # topics a restart found with ready messages on disk
            self._refill_wake.set()

    def _update(self, changes: list[StateChange], now_ms: int) -> None:
        """Log status changes whose RAM side is already done; if the append
        fails, RAM is ahead of disk: stop the node (a restart recovers)."""
        try:
            self.store.update(changes, now_ms)
        except BaseException as e:
            self.fail(e, "a commit-log append")
            raise Unavailable(f"the commit log failed: {client_text(e)}") from e

    async def stop(self) -> None:
        """After the HTTP server has finished its requests: stop the wheel
        (persisting its tick), commit, stop the tasks."""
        self.begin_stop()
        self.driver.stop()
        self._timer_wake.set()
        self._refill_wake.set()
        self._span_wake.set()
        wheel, timers = self._tasks[1], self._tasks[2]
        await asyncio.wait([wheel, timers], timeout=10)
        await self.commits.flush()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tick_file.close()

    async def abandon(self) -> None:
        """Stop at once without waiting for anything to replicate (this node
        no longer leads): answer every request in flight 503, stop the tasks."""
        self.begin_stop()
        self.driver.stop()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.commits.abandon()
        self._tick_file.close()

    @property
    def tick(self) -> TickState | None:
        """The tick last persisted: what a follower may take over from."""
        return self._tick_file.state
