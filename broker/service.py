"""The message lifecycle of one node: SPEC.md section 3 over the disk store.

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
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import os
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable, Sequence

from storage.entry import MS_PER_HOUR, MS_PER_SECOND, SECONDS_PER_HOUR, IndexEntry, Location, Message, Status
from storage.errors import Conflict, InvalidRequest, NotFound, Unavailable
from storage.spans import is_span
from storage.store import NewMessage, SendOutcome, StateChange, Store, text_hash, total_counts
from wheel.clock import Clock
from wheel.driver import WheelDriver
from wheel.scheduler import Scheduler, SchedulerConfig
from wheel.tick_state import TickState, TickStateFile

from .metrics import Metrics
from .params import AckRequest, Defaults, DeleteRequest, LongPollRequest, NewSend, PullRequest, as_sends
from .ready import CACHED_MSG_CHARS, Live, QueueLimits, TopicQueue

log = logging.getLogger("hourglass.service")

# getTopicInfo's waitingQueueInfo buckets, as camellia names them: upper
# bounds of time-until-trigger, in ms.
WAITING_BUCKETS = (
    ("sizeOf0To1min", 60_000),
    ("sizeOf1minTo10min", 600_000),
    ("sizeOf10minTo30min", 1_800_000),
    ("sizeOf30minTo1hour", 3_600_000),
    ("sizeOf1hourTo6hour", 6 * 3_600_000),
    ("sizeOf6hourTo1day", 24 * 3_600_000),
    ("sizeOf1dayTo7day", 7 * 24 * 3_600_000),
    ("sizeOf7dayTo30day", 30 * 24 * 3_600_000),
    ("sizeOf30dayToInfinite", None),
)


# The group commit fsyncs on the event loop itself while fsyncs take less
# than this on average (the loop waits that long; requests arriving
# meanwhile form the next batch), and in a worker thread once they are
# slower, so a slow disk never stalls the loop. (Measured on a 2-core VM: a
# hand-off to a thread and back costs ~80 us of CPU, as much as the fsync.)
INLINE_FSYNC_S = 0.001

# A refill reads at most about this many index entries (192 KiB) and takes
# at most REFILL_FOUND messages before other work runs.
REFILL_SCAN = 4096
REFILL_FOUND = 512
REFILL_ROUNDS = 4
# A pull that finds its topic's window nearly empty refills it whole, reading
# at most about this many index entries a round.
INLINE_REFILL_SCAN = 65536
# Freed serial keys with messages on disk a pull reads back itself (the
# rest: the background refill).
INLINE_KEY_REFILLS = 4

# Index entries classified per slice by getTopicInfo before it lets other
# work run (a large hour would otherwise stall dispatch for its whole scan).
SCAN_CHUNK = 4096

# listDeadMsg and redriveMsg all=true read at most this many index entries
# per page or step; a re-drive moves at most REDRIVE_STEP messages a record.
DEAD_SCAN = 65536
REDRIVE_STEP = 1000
# Past every hour and span id (storage.spans): "scan to the end".
MAX_FILE_ID = 1 << 24
# After a failed move of due spans' messages (storage.spans), wait this long.
SPAN_RETRY_S = 5


def new_msg_id() -> str:
    """32 random hex digits, as uuid4().hex without its version bits (a fifth of its cost)."""
    return os.urandom(16).hex()


Replicated = Callable[[int], Awaitable[None]]


class GroupCommit:
    """Makes appended records durable together: many requests, one fsync.

    A request appends its record, then awaits `durable()`; the commit task
    fsyncs every record appended so far (on the loop while fsyncs are fast,
    see INLINE_FSYNC_S; else in a worker thread, so the loop keeps taking
    requests), applies them to the derived files, hands the new
    index entries to `on_entries`, and wakes those requests."""

    def __init__(self, store: Store, on_entries: Callable[[list[IndexEntry]], None], metrics: Metrics,
                 replicated: Replicated | None = None, apply_lock: asyncio.Lock | None = None) -> None:
        self._store = store
        # Held while records are fsync'ed and applied: a snapshot holds it to
        # copy derived files that do not change under it.
        self._apply_lock = apply_lock or asyncio.Lock()
        self._on_entries = on_entries
        self._metrics = metrics
        # In a cluster: called with each offset once it is on this node's
        # disk, and awaited until enough followers have it too (see
        # replication.log_stream.LeaderLog); requests are answered then.
        self._replicated = replicated
        self._answering: set[asyncio.Task] = set()
        self._waiting: list[asyncio.Future] = []
        self._quiet: list[tuple[Callable[[], object], asyncio.Future]] = []
        self._kick = asyncio.Event()
        self._failed: BaseException | None = None
        self._fsync_ewma_s = 0.0  # recent fsyncs' duration (see INLINE_FSYNC_S)

    def kick(self) -> None:
        """Make what is appended durable soon, without waiting for it."""
        self._kick.set()

    async def durable(self) -> None:
        if self._failed is not None:
            raise Unavailable(f"the commit log failed: {self._failed}")
        future = asyncio.get_running_loop().create_future()
        self._waiting.append(future)
        self._kick.set()
        await future

    async def run(self) -> None:
        store = self._store
        while True:
            await self._kick.wait()
            self._kick.clear()
            waiting, self._waiting = self._waiting, []
            async with self._apply_lock:
                count = store.pending_records
                end_offset = store.log_end_offset
                try:
                    if count:
                        started = time.perf_counter()
                        if self._fsync_ewma_s < INLINE_FSYNC_S:
                            store.sync_log()
                        else:
                            await asyncio.to_thread(store.sync_log)
                        took = time.perf_counter() - started
                        self._fsync_ewma_s += (took - self._fsync_ewma_s) / 8
                        self._metrics.fsync_seconds.observe(took)
                        self._on_entries(store.apply_pending(count))
                except BaseException as e:  # a failed fsync: nothing more may be answered 200
                    self._failed = e
                    for future in waiting + self._waiting:
                        if not future.done():
                            future.set_exception(Unavailable(f"the commit log failed: {e}"))
                    raise
                if self._replicated is None:
                    _answer(waiting, None)
                else:  # answered when a quorum has it, while the next batch is fsync'ed
                    task = asyncio.create_task(self._answer_when_replicated(end_offset, waiting))
                    self._answering.add(task)
                    task.add_done_callback(self._answering.discard)
                if self._quiet:
                    self._run_quiet()

    async def _answer_when_replicated(self, end_offset: int, waiting: list[asyncio.Future]) -> None:
        try:
            await self._replicated(end_offset)
        except Unavailable as e:
            _answer(waiting, e)
        else:
            _answer(waiting, None)

    def _run_quiet(self) -> None:
        """Apply everything appended, fsync'ing inline, and run the waiting
        functions, all without yielding: no request can append in between,
        so they see a store with nothing pending (however busy the node)."""
        store = self._store
        count = store.pending_records
        if count:
            store.sync_log()
            self._on_entries(store.apply_pending(count))
        quiet, self._quiet = self._quiet, []
        for fn, future in quiet:
            try:
                future.set_result(fn())
            except Exception as e:
                future.set_exception(e)

    async def at_quiet_point(self, fn: Callable[[], object]) -> object:
        """Run `fn` at a moment when every appended record is durable and
        applied (a checkpoint's first step); returns what it returns."""
        future = asyncio.get_running_loop().create_future()
        self._quiet.append((fn, future))
        self._kick.set()
        return await future

    def abandon(self) -> None:
        """Answer every waiting request 503 (the node stopped leading)."""
        error = Unavailable("this node stopped leading; retry (the client does, with the same msgId)")
        self._failed = self._failed or error  # (requests waiting for followers are failed by the leader log)
        _answer(self._waiting, error)
        self._waiting = []

    async def flush(self) -> None:
        """Commit whatever is pending (used at stop)."""
        if self._store.pending_records:
            await self.durable()


def _answer(waiting: list[asyncio.Future], error: BaseException | None) -> None:
    for future in waiting:
        if not future.done():
            if error is None:
                future.set_result(None)
            else:
                future.set_exception(error)


class Broker:
    """One standalone node's queues over a `Store`. All methods run on the
    event loop; `start()` launches the commit, wheel and timer tasks."""

    def __init__(self, store: Store, clock: Clock, defaults: Defaults, metrics: Metrics, *,
                 tick_path: str, scheduler_config: SchedulerConfig | None = None,
                 replicated: Replicated | None = None, apply_lock: asyncio.Lock | None = None,
                 limits: QueueLimits | None = None) -> None:
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
        self._to_refill: set[str] = set()  # spilled topics whose window has room
        self._key_refills: set[tuple[str, str]] = set()  # (topic, serial key) freed with messages on disk
        self._refill_wake = asyncio.Event()
        self._span_wake = asyncio.Event()  # a send filed into a span (see _run_span_moves)
        self._timers: list[tuple[int, int, Location, str]] = []  # (due_ms, seq, location, "ack" | "expire")
        self._timer_seq = itertools.count()
        self._timer_wake = asyncio.Event()
        self._waiters: dict[str, list[asyncio.Future]] = defaultdict(list)
        self._stopping = False
        # Filing seconds of sends appended but not yet handed to the wheel:
        # the tick written to disk never passes them (see _persist_tick).
        self._unfiled: dict[int, int] = defaultdict(int)
        # Called once if the node must stop (a failed append, fsync or task):
        # RAM and disk may disagree, so only a restart (recovery) is safe.
        self.on_fatal: Callable[[BaseException], None] | None = None
        self.failed: BaseException | None = None
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

    def _task_ended(self, task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:
            self.fail(task.exception(), f"task {task.get_name()}")

    def fail(self, error: BaseException, where: str) -> None:
        if self.failed is None:
            log.critical("%s failed: %r; the node stops serving and exits", where, error)
            self.failed = error
            self.begin_stop()
            if self.on_fatal is not None:
                self.on_fatal(error)

    def _update(self, changes: list[StateChange], now_ms: int) -> None:
        """Log status changes whose RAM side is already done; if the append
        fails, RAM is ahead of disk: stop the node (a restart recovers)."""
        try:
            self.store.update(changes, now_ms)
        except BaseException as e:
            self.fail(e, "a commit-log append")
            raise Unavailable(f"the commit log failed: {e}") from e

    def begin_stop(self) -> None:
        """Refuse new work and answer every long poll now."""
        self._stopping = True
        self.wake_all()

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

    def _check_serving(self) -> None:
        if self._stopping:
            raise Unavailable("the node is stopping")

    # == recovery ==================================================================

    def _recover(self, now_ms: int) -> None:
        """Put CONSUMING messages back in RAM from the store's in-flight set
        (no scan), and mark every topic with READY messages spilled from its
        first hour holding any: its window refills as consumers pull."""
        fresh_ms = now_ms + self.defaults.ack_timeout_ms
        held = 0
        for location, deadline_ms in self.store.consuming().items():
            message = self.store.read_message(location)
            if message is None or message.status is not Status.CONSUMING:
                continue
            live = _live(message, text_hash(message.topic))
            live.message = None
            self.live[location] = live
            self._track_consuming(self._queue(message.topic), live)
            # its own deadline if its pull's record gave one, capped by the default timeout
            live.deadline_ms = min(deadline_ms or fresh_ms, fresh_ms)
            self._timer(live.deadline_ms, location, "ack")
            held += 1
        names = self.store.topic_names()
        spilled = 0
        for topic_hash, hour in self.store.first_hours(Status.READY).items():
            name = names.get(topic_hash)
            if name is not None:
                self._queue(name).spill_at(Location(hour, 0))
                self._to_refill.add(name)
                spilled += 1
        if held or spilled:
            log.info("recovered %d consuming messages; %d topics hold ready messages on disk", held, spilled)

    # == the wheel's side ======================================================

    def _on_committed(self, entries: list[IndexEntry]) -> None:
        unfiled = self._unfiled
        filed = [entry for entry in entries if not is_span(entry.hour)]  # a span's: refile() brings them in time
        self.scheduler.on_new_many(filed)
        for entry in filed:
            second = entry.hour * SECONDS_PER_HOUR + entry.second
            left = unfiled[second] - 1
            if left > 0:
                unfiled[second] = left
            else:
                del unfiled[second]

    def _release(self, entries: list[IndexEntry]) -> None:
        """Released by the wheel: due now. Becomes READY (or EXPIRED)."""
        status = self.store.status
        self._make_ready([(m, entry.topic_hash) for entry in entries
                          if status(entry.location) is Status.WAITING  # (no body read for one released already)
                          and (m := self.store.read_message(entry.location)) is not None])

    def _make_ready(self, messages: list[tuple[Message, int]]) -> None:
        """WAITING messages (with their topic hashes) due now: READY, or
        EXPIRED past their ttl."""
        now_ms = self.clock.now_ms()
        changes = []
        woken = set()
        for message, topic_hash in messages:
            self.metrics.lateness_seconds.observe(max(0, now_ms - message.trigger_ms) / 1000)
            if now_ms >= message.expire_ms:
                changes.append(StateChange(message.location, Status.EXPIRED, 0))
                self.metrics.topic(message.topic).ended += 1
                continue
            changes.append(StateChange(message.location, Status.READY, 0, prev_status=Status.WAITING,
                                       topic_hash=topic_hash))
            self._admit(_live(message._replace(status=Status.READY), topic_hash))
            m = self.metrics.topic(message.topic)
            m.ready += 1
            m.ready_gap.observe(now_ms - message.trigger_ms)
            woken.add(message.topic)
        if changes:
            self._update(changes, now_ms)
        for topic in woken:
            self._wake(topic)

    async def _persist_tick(self, tick: TickState) -> None:
        """The tick moves only past releases that are durable, and never past
        a send still in its group commit (a slow fsync can outlast the
        scheduler's commit lag): a restart must read that send's second."""
        await self.commits.durable()
        tick = min(tick, self.scheduler.tick, key=lambda t: t.position)
        if self._unfiled:
            held = TickState.at(min(self._unfiled), 0)
            tick = min(tick, held, key=lambda t: t.position)
        self._tick_file.write(tick)

    # == RAM state of READY / CONSUMING messages (broker.ready) =================

    def _queue(self, topic: str) -> TopicQueue:
        queue = self.topics.get(topic)
        if queue is None:
            queue = self.topics[topic] = TopicQueue(topic, text_hash(topic))
        return queue

    def _admit(self, live: Live) -> None:
        """A READY message: into its topic's window if there is room, or if it
        outranks the window's last (which goes back to disk); else it stays
        on disk only, for a refill to find."""
        queue = self._queue(live.topic)
        limits = self.limits
        if live.serial_key and self._key_full(queue, live.serial_key):
            self.live.pop(live.location, None)  # its key has its share of the window: it waits on disk
            self._key_spill(queue, live.serial_key, live.location)
            return
        if len(queue.ready) < limits.window and self.window_total - self.parked_total < limits.window_total:
            self._window_add(queue, live)
            return
        last = queue.last()
        if last is not None and live.key < self.live[last].key:
            self._spill(queue, self.live[last])
            self._window_add(queue, live)
            return
        self.live.pop(live.location, None)
        queue.spill_at(live.location)

    def _key_spill(self, queue: TopicQueue, serial_key: str, location: Location) -> None:
        """A READY message of a key with its share of RAM stays on disk; its
        place is remembered while fewer than window_total are."""
        if queue.key_spill_at(serial_key, location, self.key_spilled_total < self.limits.window_total):
            self.key_spilled_total += 1

    def _key_full(self, queue: TopicQueue, serial_key: str) -> bool:
        """The key has its share of the window (key_window messages), or it
        is busy and the topic holds `window` parked messages already."""
        return (queue.key_count(serial_key) >= self.limits.key_window
                or serial_key in queue.busy and queue.parked >= self.limits.window)

    def _window_add(self, queue: TopicQueue, live: Live) -> None:
        self.live[live.location] = live
        queue.add(live)
        self.window_total += 1
        if live.serial_key in queue.busy:  # (parked)
            self.parked_total += 1
        self._timer(live.expire_ms, live.location, "expire")

    def _window_remove(self, queue: TopicQueue, live: Live) -> None:
        if live.serial_key in queue.busy:  # (parked)
            self.parked_total -= 1
        queue.remove(live)
        self.window_total -= 1

    def _spill(self, queue: TopicQueue, live: Live) -> None:
        """A message of the window goes back to disk only (it is READY there)."""
        self._window_remove(queue, live)
        del self.live[live.location]
        queue.spill_at(live.location)

    def _consume(self, live: Live, deadline_ms: int) -> None:
        queue = self.topics[live.topic]
        if live.status is Status.READY:
            self._window_remove(queue, live)
            self._track_consuming(queue, live)
        live.status, live.deadline_ms = Status.CONSUMING, deadline_ms
        self._timer(deadline_ms, live.location, "ack")

    def _track_consuming(self, queue: TopicQueue, live: Live) -> None:
        """Count a consuming message against the caps and find it by id."""
        queue.consuming += 1
        self.consuming_total += 1
        self._inflight[(live.topic, live.msg_id)] = live
        if live.serial_key:
            others = queue.hold_key(live.serial_key)
            self.parked_total += len(others)
            room = self.limits.window - (queue.parked - len(others))
            for other in others[max(0, room):]:  # parked beyond `window` in the topic: back to disk
                self._window_remove(queue, other)
                del self.live[other.location]
                self._key_spill(queue, other.serial_key, other.location)

    def _unconsume(self, queue: TopicQueue, live: Live) -> None:
        """One fewer consuming: a pull held back by a cap may go on."""
        del self._inflight[(live.topic, live.msg_id)]
        capped = queue.consuming >= self.limits.inflight
        total_capped = self.consuming_total >= self.limits.inflight_total
        queue.consuming -= 1
        self.consuming_total -= 1
        back = queue.release_key(live.serial_key) if live.serial_key else None
        if back is not None:
            self.parked_total -= back
            capped = True  # the key is free: its parked message can go, wake the topic's long polls
            if queue.has_spilled(live.serial_key):
                self._key_refills.add((queue.name, live.serial_key))
                self._refill_wake.set()
        if total_capped:
            self.wake_all()
        elif capped:
            self._wake(queue.name)

    def _requeue(self, live: Live, retry: int) -> None:
        """CONSUMING -> READY with `retry`."""
        queue = self.topics[live.topic]
        self._unconsume(queue, live)
        live.status, live.retry = Status.READY, retry
        self._admit(live)

    def _forget(self, live: Live) -> None:
        queue = self.topics[live.topic]
        if live.status is Status.READY:
            self._window_remove(queue, live)
        else:
            self._unconsume(queue, live)
        del self.live[live.location]

    # == refilling windows from disk ==============================================

    def _refill(self, queue: TopicQueue, want: int, max_scan: int = REFILL_SCAN) -> int:
        """Up to `want` spilled READY messages of the topic into its window,
        in filing order (reading at most about `max_scan` index entries);
        those past their ttl end instead. Returns how many were added."""
        now_ms = self.clock.now_ms()
        added, ended = 0, []
        for _ in range(REFILL_ROUNDS):  # (entries held already count in a scan's finds: go on past them)
            if not queue.spilled or added >= want:
                break
            entries, queue.scan = self.store.scan_ready(queue.topic_hash, queue.scan or Location(0, 0),
                                                        now_ms // MS_PER_HOUR + 1, max_scan, want - added)
            queue.spilled = queue.scan is not None
            added += self._hold_found(queue, [e.location for e in entries], now_ms, ended)
            if not entries:
                break
        self._ended(ended, now_ms)
        return added

    def _hold_found(self, queue: TopicQueue, locations: Iterable[Location], now_ms: int,
                    ended: list[StateChange]) -> int:
        """Spilled messages found on disk into the window; how many."""
        added = 0
        for location in locations:
            if location not in self.live:
                added += self._hold(queue, location, self.store.read_message(location), now_ms, ended)
        return added

    def _hold(self, queue: TopicQueue, location: Location, message: Message | None, now_ms: int,
              ended: list[StateChange]) -> bool:
        """One message read from disk into the window, if it is still READY
        and alive and its key has room (else it ends, or stays on disk)."""
        if message is None or message.status is not Status.READY or message.topic != queue.name:
            return False
        if now_ms >= message.expire_ms:
            ended.append(StateChange(location, Status.EXPIRED if message.retry == 0 else Status.ENDED,
                                     message.retry))
            self.metrics.topic(queue.name).ended += 1
            return False
        if message.key and self._key_full(queue, message.key):
            self._key_spill(queue, message.key, location)  # (read again when the key has room)
            return False
        self._window_add(queue, _live(message, queue.topic_hash))
        return True

    def _refill_key(self, queue: TopicQueue, serial_key: str) -> None:
        """Spilled READY messages of one serial key into the window, up to
        its key_window, from its own disk position (ready.py), reading at
        most about REFILL_SCAN index entries; the rest later."""
        want = min(self.limits.key_window - queue.key_count(serial_key), self.limits.window - len(queue.ready))
        if want <= 0:
            return  # (no room: the next pull or refill of the topic tries again)
        now_ms = self.clock.now_ms()
        ended: list[StateChange] = []
        places = queue.take_spilled(serial_key, want)
        self.key_spilled_total -= len(places)
        want -= self._hold_found(queue, places, now_ms, ended)
        start = queue.key_scan.get(serial_key)
        if start is None or want <= 0:
            self._ended(ended, now_ms)
            self._wake(queue.name)
            return
        del queue.key_scan[serial_key]
        entries, after = self.store.scan_ready(queue.topic_hash, start, now_ms // MS_PER_HOUR + 1, REFILL_SCAN,
                                               REFILL_FOUND)
        for entry in entries:
            if entry.location in self.live:
                continue
            message = self.store.read_message(entry.location)
            if message is not None and message.key == serial_key:  # (another key's: its own position covers it)
                if want <= 0:  # the rest later, from here
                    queue.key_spill_at(serial_key, entry.location)
                    break
                want -= self._hold(queue, entry.location, message, now_ms, ended)
        if after is not None and serial_key not in queue.key_scan:
            queue.key_spill_at(serial_key, after)
        self._ended(ended, now_ms)
        self._wake(queue.name)

    def _ended(self, ended: list[StateChange], now_ms: int) -> None:
        if ended:
            self._update(ended, now_ms)
            self.commits.kick()

    def _schedule_refill(self, queue: TopicQueue) -> None:
        if queue.spilled and len(queue.ready) <= self.limits.window // 2:
            self._to_refill.add(queue.name)
            self._refill_wake.set()

    async def _run_refills(self) -> None:
        """Refill spilled topics' windows in the background, a slice at a time."""
        while not self._stopping:
            await self._refill_wake.wait()
            self._refill_wake.clear()
            while self._key_refills and not self._stopping:
                name, serial_key = self._key_refills.pop()
                queue = self.topics.get(name)
                if queue is not None and serial_key not in queue.busy:
                    self._refill_key(queue, serial_key)
                await asyncio.sleep(0)
            while self._to_refill and not self._stopping:
                for name in list(self._to_refill):
                    queue = self.topics.get(name)
                    room = 0 if queue is None else min(self.limits.window - len(queue.ready),
                                                       self.limits.window_total - self.window_total
                                                       + self.parked_total)
                    if queue is None or not queue.spilled or room <= 0:
                        self._to_refill.discard(name)
                        continue
                    if self._refill(queue, min(room, REFILL_FOUND)):
                        self._wake(name)
                    await asyncio.sleep(0)

    async def _run_span_moves(self) -> None:
        """Move the waiting messages of due spans to nearer files
        (Store.refile, storage.spans), a record of REFILE_STEP at a time,
        each made durable before the next. A span is due at least 32 hours before its first message, so this
        runs long before the wheel needs them (after a long outage, overdue
        ones are filed into the current second and released at once). A
        full disk is logged and tried again; it refuses nothing. Sleeps
        until the next span falls due, or a send files into a span."""
        moved = 0
        while not self._stopping:
            self._span_wake.clear()
            now_ms = self.clock.now_ms()
            try:
                n = self.store.refile(now_ms)
            except OSError as e:
                log.warning("moving messages of due spans failed (%s); trying again in %d s", e, SPAN_RETRY_S)
                await self.clock.sleep_until(now_ms + SPAN_RETRY_S * 1000, asyncio.Event())
                continue
            if n:
                moved += n
                await self.commits.durable()
                continue
            if moved:
                log.info("moved %d waiting messages from due spans to nearer files", moved)
                moved = 0
            due_ms = self.store.next_refile_ms()
            if due_ms is not None and due_ms <= now_ms:  # due, its sends not applied yet
                await self.commits.durable()
                continue
            await self.clock.sleep_until(due_ms, self._span_wake)

    def _retry_or_end(self, live: Live, now_ms: int) -> StateChange:
        """A delivery was not acked: the message goes back to READY (its next
        pull counts the next delivery), or ends (6) after max_retry + 1
        deliveries or past its ttl."""
        m = self.metrics.topic(live.topic)
        if live.retry > live.max_retry or now_ms >= live.expire_ms:
            self._forget(live)
            m.ended += 1
            return StateChange(live.location, Status.ENDED, live.retry, prev_status=Status.CONSUMING,
                               topic_hash=live.topic_hash)
        self._requeue(live, live.retry)
        m.retries += 1
        self._wake(live.topic)
        return StateChange(live.location, Status.READY, live.retry, prev_status=Status.CONSUMING,
                           topic_hash=live.topic_hash)

    # == timers: ack deadlines and expiries ======================================

    def _timer(self, due_ms: int, location: Location, kind: str) -> None:
        if len(self._timers) > 2 * len(self.live) + 1024:
            self._compact_timers()
        first = self._timers[0][0] if self._timers else None
        heapq.heappush(self._timers, (due_ms, next(self._timer_seq), location, kind))
        if first is None or due_ms < first:
            self._timer_wake.set()

    def _compact_timers(self) -> None:
        """Drop timers of messages no longer held (acked, deleted, ended) or
        no longer in the timer's state, so the heap stays O(live)."""
        def current(timer) -> bool:
            due_ms, _, location, kind = timer
            live = self.live.get(location)
            if live is None:
                return False
            if kind == "ack":
                return live.status is Status.CONSUMING and live.deadline_ms == due_ms
            return live.status is Status.READY and live.expire_ms == due_ms
        self._timers = [t for t in self._timers if current(t)]
        heapq.heapify(self._timers)

    async def _run_timers(self) -> None:
        while not self._stopping:
            self._timer_wake.clear()
            now_ms = self.clock.now_ms()
            changes = []
            while self._timers and self._timers[0][0] <= now_ms:
                due_ms, _, location, kind = heapq.heappop(self._timers)
                live = self.live.get(location)
                if live is None:
                    continue
                if kind == "ack" and live.status is Status.CONSUMING and live.deadline_ms == due_ms:
                    changes.append(self._retry_or_end(live, now_ms))
                elif kind == "expire" and live.status is Status.READY and now_ms >= live.expire_ms:
                    self._forget(live)
                    self.metrics.topic(live.topic).ended += 1
                    changes.append(StateChange(location, Status.EXPIRED if live.retry == 0 else Status.ENDED,
                                               live.retry, prev_status=Status.READY, topic_hash=live.topic_hash))
            if changes:
                self._update(changes, now_ms)
                await self.commits.durable()
            due = self._timers[0][0] if self._timers else None
            await self.clock.sleep_until(due, self._timer_wake)

    # == long polls ==============================================================

    def _wake(self, topic: str) -> None:
        for future in self._waiters.pop(topic, ()):
            if not future.done():
                future.set_result(None)

    def wake_all(self) -> None:
        for topic in list(self._waiters):
            self._wake(topic)

    # == requests ================================================================

    async def send(self, sends: Sequence[NewSend | NewMessage]) -> list[Message]:
        """Store new messages; answered once durable. An id whose message is
        alive (1-3) answers the stored message, unchanged. An id whose
        message has ended (4-7) is stored anew, the ended one released (as
        camellia does), unless the send asks for strict idempotence: then
        the stored message is answered unchanged while it is retained."""
        self._check_serving()
        sends = as_sends(sends)
        batch = [s.message for s in sends]
        now_ms = batch[0].produce_ms if batch else self.clock.now_ms()
        results = self._store_new(batch, now_ms)
        replace = [i for i, r in enumerate(results)
                   if r.outcome is SendOutcome.DUPLICATE and r.message.status.is_final and not sends[i].strict]
        if replace:  # rare: release the ended ones, then store those sends again
            ended = {results[i].message.location: results[i].message for i in replace}
            self._update([StateChange(m.location, m.status, m.retry, released=True) for m in ended.values()],
                         now_ms)
            for i, result in zip(replace, self._store_new([batch[i] for i in replace], now_ms)):
                results[i] = result
        unfiled, stored, duplicates, due_now = self._unfiled, 0, 0, False
        for outcome, message in results:
            if outcome is SendOutcome.STORED:
                stored += 1
                trigger_ms = message.trigger_ms
                if trigger_ms <= now_ms:
                    due_now = True
                    trigger_ms = now_ms
                if not is_span(message.location.hour):
                    unfiled[trigger_ms // MS_PER_SECOND] += 1
                else:
                    self._span_wake.set()
            else:
                duplicates += 1
        topics = {message.topic for _, message in results}
        if len(topics) == 1:  # sendMsgBatch: one topic, counted once
            m = self.metrics.topic(topics.pop())
            m.sends += stored
            m.duplicates += duplicates
        else:
            for outcome, message in results:
                m = self.metrics.topic(message.topic)
                if outcome is SendOutcome.STORED:
                    m.sends += 1
                else:
                    m.duplicates += 1
        await self.commits.durable()
        if not due_now:
            return [r.message for r in results]
        return self._release_due_now(results, now_ms)

    def _release_due_now(self, results: list, now_ms: int) -> list[Message]:
        """Messages sent due already (delay <= 0, a past trigger time) are
        made READY here rather than at the wheel's next poll, so the answer
        says 2 (as camellia's) and long polls wake at once. The wheel, which
        holds them already, is told to forget them.)"""
        stored = self._ready_if_due([r.message for r in results if r.outcome is SendOutcome.STORED], now_ms)
        changed = {m.location: m.status for m in stored}  # (a duplicate in the batch shares its location)
        return [r.message._replace(status=changed[r.message.location]) if r.message.location in changed
                else r.message for r in results]

    def _ready_if_due(self, messages: list[Message], now_ms: int) -> list[Message]:
        """New WAITING messages (sent, rescheduled, re-driven): those due by
        `now_ms` READY now (see _release_due_now); all with their status."""
        due = [m for m in messages if m.trigger_ms <= now_ms]
        if not due:
            return messages
        status, cancel = self.store.status, self.scheduler.cancel
        waiting = [m for m in due if status(m.location) is Status.WAITING]  # (the wheel may have been first)
        for m in waiting:
            cancel(m.location)
        self._make_ready([(m, text_hash(m.topic)) for m in waiting])
        return [m._replace(status=status(m.location)) if m.trigger_ms <= now_ms else m for m in messages]

    # == reschedule and dead letters ==============================================

    async def reschedule(self, topic: str, msg_id: str, trigger_ms: int) -> Message:
        """A WAITING or READY message gets a new trigger time (<= now: due
        now, READY at once); it keeps its id, body, priority and delivery
        count. Its old place never delivers it: it is filed anew (a MOVE
        record, storage.records), so the change survives a restart and a
        failover. A consuming or ended message: Conflict, nothing changed."""
        self._check_serving()
        await self.commits.flush()  # (a change to it still in its commit is applied first)
        message = self._message(topic, msg_id)
        if message.status not in (Status.WAITING, Status.READY):
            raise Conflict(f"message {msg_id!r} is {_status_words(message.status)}: only a waiting or ready "
                           f"message can be rescheduled" + (" (ack or nack it first)"
                                                            if message.status is Status.CONSUMING else ""))
        now_ms = self.clock.now_ms()
        moved, = self._move([(message, trigger_ms, message.retry)], now_ms)
        self.metrics.topic(topic).reschedules += 1
        await self.commits.durable()
        return self._ready_if_due([moved], now_ms)[0]

    def _move(self, changes: list[tuple[Message, int, int]], now_ms: int) -> list[Message]:
        """Store.move, then the RAM side: the old places leave the wheel or
        the ready window (after the append: a refused one changes nothing)."""
        try:
            moved = self.store.move([(m.location, trigger_ms, retry) for m, trigger_ms, retry in changes], now_ms)
        except InvalidRequest:
            raise
        except OSError as e:
            raise Unavailable(f"the commit log refused the write: {e}") from e
        for old, _, _ in changes:
            if old.status is Status.WAITING:
                self.scheduler.cancel(old.location)
            elif (live := self.live.get(old.location)) is not None:  # READY in the window
                self._forget(live)
        for m in moved:
            if is_span(m.location.hour):
                self._span_wake.set()
            else:
                self._unfiled[max(m.trigger_ms, now_ms) // MS_PER_SECOND] += 1
        return moved

    async def list_dead(self, topic: str, statuses: frozenset[Status], cursor: str | None,
                        limit: int) -> tuple[list[Message], str | None]:
        """A page of the topic's dead letters (EXPIRED 5 and/or ENDED 6, still
        retained), oldest filed first, and the cursor of the next page (None:
        no more). Bounded work: reads at most DEAD_SCAN index entries, so a
        page may hold fewer than `limit` with a cursor to go on."""
        self._check_serving()
        await self.commits.flush()
        start = _parse_cursor(cursor)
        topic_hash = text_hash(topic)
        if not self.has_topic(topic):
            return [], None
        entries, after = self.store.scan_status(topic_hash, sorted(statuses), start, MAX_FILE_ID, DEAD_SCAN, limit)
        messages = [m for e in entries if (m := self.store.read_message(e.location)) is not None]
        return messages, None if after is None else f"{after.hour}-{after.global_index}"

    async def redrive(self, topic: str, msg_id: str) -> Message:
        """A dead letter (5 or 6) READY again now, with a fresh retry budget
        (retry 0) and ttl (counted from now); anything else: Conflict."""
        self._check_serving()
        await self.commits.flush()
        message = self._message(topic, msg_id)
        if message.status not in (Status.EXPIRED, Status.ENDED):
            raise Conflict(f"message {msg_id!r} is {_status_words(message.status)}: only an expired (5) or "
                           f"ended (6) message can be re-driven")
        now_ms = self.clock.now_ms()
        moved = self._move([(message, now_ms, 0)], now_ms)
        self.metrics.topic(topic).redrives += 1
        await self.commits.durable()
        return self._ready_if_due(moved, now_ms)[0]

    async def redrive_all(self, topic: str, limit: int) -> tuple[int, bool]:
        """Re-drive the topic's dead letters, oldest first, at most `limit`,
        REDRIVE_STEP a record (each durable before the next; other requests
        run between). Returns how many, and whether more are left."""
        self._check_serving()
        await self.commits.flush()
        if not self.has_topic(topic):
            return 0, False
        topic_hash, done, cursor = text_hash(topic), 0, Location(0, 0)
        dead = (Status.EXPIRED, Status.ENDED)
        while done < limit and not self._stopping:
            entries, after = self.store.scan_status(topic_hash, dead, cursor, MAX_FILE_ID, DEAD_SCAN,
                                                    min(REDRIVE_STEP, limit - done))
            if entries:
                now_ms = self.clock.now_ms()
                olds = [m for e in entries if (m := self.store.read_message(e.location)) is not None]
                moved = self._move([(m, now_ms, 0) for m in olds], now_ms)
                done += len(moved)
                self.metrics.topic(topic).redrives += len(moved)
                await self.commits.durable()
                self._ready_if_due(moved, now_ms)
            if after is None:
                return done, False
            cursor = after
            await asyncio.sleep(0)
        return done, done >= limit and self._has_dead(topic_hash, cursor)

    def _has_dead(self, topic_hash: int, cursor: Location) -> bool:
        entries, after = self.store.scan_status(topic_hash, (Status.EXPIRED, Status.ENDED), cursor, MAX_FILE_ID,
                                                DEAD_SCAN, 1)
        return bool(entries) or after is not None

    def _store_new(self, batch: list[NewMessage], now_ms: int) -> list:
        try:
            return self.store.send(batch, now_ms)
        except InvalidRequest:
            raise
        except OSError as e:  # nothing was kept (the store undoes a failed append)
            raise Unavailable(f"the commit log refused the write: {e}") from e

    async def pull(self, request: PullRequest | LongPollRequest) -> list[Message]:
        """Up to `batch` READY messages of the topic, now CONSUMING: fewer at
        the in-flight caps. Answered before the record is durable on a
        standalone node (a pull lost in a crash is a redelivery)."""
        self._check_serving()
        queue = self.topics.get(request.topic)
        if queue is None:
            return []
        limits = self.limits
        room = min(request.batch, limits.inflight - queue.consuming, limits.inflight_total - self.consuming_total)
        if room <= 0:
            return []
        if (queue.key_scan or queue.key_spilled) and len(queue.ready) < limits.window:
            free = [k for k in dict.fromkeys((*queue.key_spilled, *queue.key_scan)) if k not in queue.busy]
            for serial_key in free[:INLINE_KEY_REFILLS]:
                self._refill_key(queue, serial_key)
        if queue.spilled and len(queue.ready) < limits.window:
            # Top the window up first (after a restart it starts empty; a send
            # may have put a message in it while older ones wait on disk), so
            # the pull picks by priority among as many as the window holds. A
            # pull may take the window over the total cap by its batch.
            want = min(limits.window - len(queue.ready),
                       max(room, limits.window_total - self.window_total + self.parked_total))
            self._refill(queue, want, max_scan=INLINE_REFILL_SCAN)
        if not queue.ready:
            return []
        tags = frozenset(request.tags) if request.tags else None
        now_ms = self.clock.now_ms()
        taken: list[Live] = []
        while len(taken) < room:
            location = queue.best(tags)
            if location is None:
                break
            live = self.live[location]
            live.retry += 1  # retry counts deliveries: 1 on the first (camellia)
            self._consume(live, now_ms + request.ack_timeout_ms)
            taken.append(live)
        self._schedule_refill(queue)
        if not taken:
            return []
        self._update([StateChange(live.location, Status.CONSUMING, live.retry, deadline_ms=live.deadline_ms,
                                  prev_status=Status.READY, topic_hash=live.topic_hash) for live in taken], now_ms)
        messages = []
        for live in taken:
            if live.message is None:
                messages.append(self.store.read_message(live.location))
            else:
                messages.append(live.message._replace(status=Status.CONSUMING, retry=live.retry))
                live.message = None
        m = self.metrics.topic(request.topic)
        m.pulls += len(taken)
        for message in messages:
            m.pull_gap.observe(now_ms - message.trigger_ms)
        if self._pull_waits:
            await self.commits.durable()
        else:
            self.commits.kick()
        return messages

    async def long_poll(self, request: LongPollRequest, gone: Callable[[], bool] = lambda: False) -> list[Message]:
        """As pull, but waits up to the timeout for a message to be READY.
        `gone()` says the client hung up: then nothing is taken, and what
        was taken meanwhile goes back to READY with its retry unchanged."""
        deadline = time.monotonic() + request.long_polling_timeout_ms / 1000
        while True:
            if self._stopping or gone():  # answered, possibly empty, as the node stops
                return []
            messages = await self.pull(request)
            if messages and gone():
                await self._give_back(messages)
                return []
            remaining = deadline - time.monotonic()
            if messages or remaining <= 0:
                return messages
            loop = asyncio.get_running_loop()
            future = loop.create_future()
            self._waiters[request.topic].append(future)
            timeout = loop.call_later(remaining, _settle, future)
            try:
                await future
            finally:
                timeout.cancel()
                waiters = self._waiters.get(request.topic)
                if waiters and future in waiters:
                    waiters.remove(future)
                    if not waiters:
                        del self._waiters[request.topic]

    async def _give_back(self, messages: list[Message]) -> None:
        """Pulled for a client that is gone: READY again, as if never pulled."""
        changes = []
        for message in messages:
            live = self.live.get(message.location)
            if live is not None and live.status is Status.CONSUMING:
                self._requeue(live, live.retry - 1)
                changes.append(StateChange(live.location, Status.READY, live.retry, prev_status=Status.CONSUMING,
                                           topic_hash=live.topic_hash))
                self._wake(live.topic)
        if changes:
            self._update(changes, self.clock.now_ms())
            await self.commits.durable()

    def _message(self, topic: str, msg_id: str) -> Message:
        message = self.store.get(topic, msg_id)
        if message is None:
            raise NotFound(f"no message {msg_id!r} in topic {topic!r}")
        return message

    async def ack(self, request: AckRequest) -> None:
        """ack: WAITING, READY or CONSUMING -> ACKED (never delivered after).
        nack: CONSUMING -> READY now, or ENDED after its last delivery.
        Anything else -- an unknown id, an ended message, a nack of a
        message not consuming -- changes nothing and is no error (camellia)."""
        await self.ack_many(request.topic, [request.msg_id], request.ack)

    async def ack_many(self, topic: str, msg_ids: Sequence[str], ack: bool = True) -> list[Status | None]:
        """`ack` of each id in turn, one record and one fsync for all; the
        status of each after it (None: no such message)."""
        self._check_serving()
        now_ms = self.clock.now_ms()
        changes: list[StateChange] = []
        after: dict[str, Status | None] = {}
        for msg_id in msg_ids:
            if msg_id in after:  # a repeated id: once
                continue
            change, after[msg_id] = self._ack_one(topic, msg_id, ack, now_ms)
            if change is not None:
                changes.append(change)
        if changes:
            self._update(changes, now_ms)
            await self.commits.durable()
        else:
            await self.commits.flush()  # an earlier change to them may still be in its commit
        return [after[msg_id] for msg_id in msg_ids]

    def _ack_one(self, topic: str, msg_id: str, ack: bool, now_ms: int) -> tuple[StateChange | None, Status | None]:
        """The change an ack or nack of one id makes (None: none), and the
        message's status after it (None: no such message)."""
        live = self._inflight.get((topic, msg_id))
        if live is not None:  # consuming (every consuming message is held): no disk read
            m = self.metrics.topic(topic)
            if not ack:
                m.nacks += 1
                change = self._retry_or_end(live, now_ms)
                return change, change.status
            self._forget(live)
            m.acks += 1
            return StateChange(live.location, Status.ACKED, live.retry, prev_status=Status.CONSUMING,
                               topic_hash=live.topic_hash), Status.ACKED
        message = self.store.get(topic, msg_id)
        m = self.metrics.topic(topic, exists=message is not None)
        if message is None:
            return None, None
        if not ack or message.status.is_final:  # (a nack of one not held consuming changes nothing)
            return None, message.status
        if message.status is Status.WAITING:
            self.scheduler.cancel(message.location)
        elif (live := self.live.get(message.location)) is not None:  # READY in the window (beyond it: none)
            self._forget(live)
        m.acks += 1
        return StateChange(message.location, Status.ACKED, message.retry), Status.ACKED

    async def delete(self, request: DeleteRequest) -> None:
        """WAITING, READY or CONSUMING -> DELETED; `release` also frees the id.
        An ended or unknown message raises NotFound (camellia's 404); with
        `release` an ended one is released all the same."""
        self._check_serving()
        message = self._message(request.topic, request.msg_id)
        status = message.status
        was_live = not status.is_final
        if status is Status.WAITING:
            self.scheduler.cancel(message.location)
            status = Status.DELETED
        elif status in (Status.READY, Status.CONSUMING):
            live = self.live.get(message.location)
            if live is not None:
                self._forget(live)
            status = Status.DELETED
        elif not request.release:
            await self.commits.flush()
            raise NotFound(f"message {request.msg_id!r} has ended (status {int(status)})")
        self._update([StateChange(message.location, status, message.retry, released=request.release)],
                     self.clock.now_ms())
        self.metrics.topic(request.topic).deletes += 1
        await self.commits.durable()
        if not was_live:
            raise NotFound(f"message {request.msg_id!r} had ended (status {int(status)}); released")

    async def get(self, topic: str, msg_id: str) -> Message:
        """The message as committed: a change still in its group commit is
        waited for, never shown before it is durable."""
        self._check_serving()
        await self.commits.flush()
        self.metrics.topic(topic, exists=self.has_topic(topic)).gets += 1
        return self._message(topic, msg_id)

    # == topic information =======================================================

    async def topic_info(self, topic: str) -> dict:
        """camellia's TopicInfo: queue sizes and the waiting queue's delay
        buckets, once every change made so far is committed."""
        return (await self.topic_infos([topic]))[0]

    async def topic_infos(self, topics: Sequence[str]) -> list[dict]:
        """`topic_info` of each of `topics`, in one pass: an hour that
        straddles a bucket edge is read once for all of them (its entries,
        a slice at a time between requests), not once per topic."""
        await self.commits.flush()
        names = self.store.topic_names()
        now_ms = self.clock.now_ms()
        infos, wanted, straddling = [], {}, set()
        for topic in topics:
            topic_hash = text_hash(topic)
            hours = self.store.topic_hours(topic_hash) if names.get(topic_hash) == topic else []
            buckets = [0] * len(WAITING_BUCKETS)
            for hour, counts in hours:
                if not counts[Status.WAITING]:
                    continue
                first_hour, last_hour = self.store.file_hours(hour)  # (a span covers many)
                first = _bucket(first_hour * MS_PER_HOUR - now_ms)
                if first == _bucket((last_hour + 1) * MS_PER_HOUR - 1 - now_ms):
                    buckets[first] += counts[Status.WAITING]
                else:
                    straddling.add(hour)
                    wanted[topic_hash] = buckets
            infos.append((topic, total_counts(hours), buckets))
        for hour in sorted(straddling):  # classify its waiting entries of the wanted topics
            start = 0
            while chunk := self.store.hour_entries(hour, start, SCAN_CHUNK):
                for entry in chunk:
                    buckets = wanted.get(entry.topic_hash)
                    if buckets is not None and entry.status is Status.WAITING:
                        buckets[_bucket(entry.trigger_ms - now_ms)] += 1
                start += len(chunk)
                await asyncio.sleep(0)
        return [{
            "topic": topic,
            "waitingQueueSize": totals[Status.WAITING],
            "waitingQueueInfo": {name: n for (name, _), n in zip(WAITING_BUCKETS, buckets)},
            "readyQueueSize": totals[Status.READY],
            "ackQueueSize": totals[Status.CONSUMING],
        } for topic, totals, buckets in infos]

    def topic_list(self) -> list[str]:
        names = set(self.store.topic_names().values()) | set(self.topics)
        return sorted(names)

    def has_topic(self, topic: str) -> bool:
        return topic in self.topics or self.store.has_topic(topic)


def _status_words(status: Status) -> str:
    return f"{status.name.lower()} (status {int(status)})"


def _parse_cursor(cursor: str | None) -> Location:
    """listDeadMsg's cursor, "<file id>-<globalIndex>" as a page answered it."""
    if not cursor:
        return Location(0, 0)
    hour, dash, gi = cursor.partition("-")
    if not (dash and hour.isascii() and hour.isdigit() and gi.isascii() and gi.isdigit()
            and len(hour) < 12 and len(gi) < 12):
        raise InvalidRequest("cursor", f"must be a cursor a listDeadMsg page answered, got {cursor[:40]!r}")
    return Location(int(hour), int(gi))


def _settle(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


def _live(message: Message, topic_hash: int) -> Live:
    return Live(message.location, message.topic, message.tag, message.priority, message.trigger_ms,
                message.expire_ms, message.max_retry, message.retry, message.status, message.msg_id, topic_hash,
                message=message if len(message.msg) <= CACHED_MSG_CHARS else None, serial_key=message.key)


def _bucket(until_trigger_ms: int) -> int:
    for i, (_, upper) in enumerate(WAITING_BUCKETS):
        if upper is None or until_trigger_ms < upper:
            return i
    raise AssertionError("the last bucket is unbounded")
