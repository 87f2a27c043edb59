"""Group commit: many requests' records made durable by one fsync, the
fsync off the event loop, the next commit filling while one syncs (a
round of a few records on a fast disk: on the loop, INLINE_SYNC_RECORDS).

    request A: append record, await durable() ─┐ commit N: the syncer thread
    request B: append record, await durable() ─┘ fsyncs (broker.disk.syncer)
    request C: append record, await durable() ─┐   ... meanwhile C and D
    request D: append record, await durable() ─┘   append: commit N+1 fills
                                                 N synced: apply N's records
                                                 to the derived files, hand
                                                 the new index entries on,
                                                 answer A and B; sync N+1

A request is answered only after its record is durable (in a cluster:
also on a quorum of followers, `Replicated`). One fsync per batch of
concurrent requests gives the same durability as one per request at a
hundred times the rate, and running it in a thread lets the loop parse,
validate and append the next batch meanwhile (docs/internals.md, "How a
node works"). The requests of one commit share one future. The commit task
is the only one that syncs or applies; applying runs on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from storage.config import FsyncPolicy
from storage.entry import IndexEntry
from storage.errors import Unavailable
from storage.store import Store

from ..core.redact import client_text
from ..observe.metrics import Metrics
from .syncer import Syncer

Replicated = Callable[[int], Awaitable[None]]

# Status changes of committed bulk-call parts applied between two turns of
# the event loop (storage.records PART; about 3 ms of work).
DEFERRED_SLICE = 500

# How long a record nobody waits for (a pull's, on a standalone node) may
# stay appended and not yet synced: a request that waits for the group
# commit within that time takes it along in its fsync (a pull and the ack
# that follows it: one fsync, not two).
UNWAITED_COMMIT_DELAY_S = 0.005

# A round of at most INLINE_SYNC_RECORDS records fsyncs on the event loop
# itself, once the last INLINE_SYNC_AFTER fsyncs each took under
# INLINE_SYNC_MAX_S: so few records are a few clients each waiting for its
# answer, the loop has nothing to do meanwhile, and handing the fsync to
# the syncer thread costs two thread wake-ups -- more CPU than the fsync
# itself (a quarter of a single send's on this machine: docs/benchmarks.md,
# "The syncer thread or the loop"). A larger round, or a disk whose fsyncs
# are slow, syncs in the thread while the loop takes the next requests; a
# fast disk turned slow holds the loop for one fsync at most, then the
# thread takes over again.
INLINE_SYNC_RECORDS = 8
INLINE_SYNC_MAX_S = 0.001
INLINE_SYNC_AFTER = 16

log = logging.getLogger("hourglass.commit")


class GroupCommit:
    """Makes appended records durable together: many requests, one fsync.

    A request appends its record, then awaits `durable()`; the commit task
    has the syncer thread fsync every record appended so far while the loop
    goes on, then applies them to the derived files, hands the new index
    entries to `on_entries`, and wakes those requests (one future for all
    of them). Records appended during a sync wait for the next one, which
    starts as soon as this one is applied."""

    def __init__(self, store: Store, on_entries: Callable[[list[IndexEntry]], None], metrics: Metrics,
                 replicated: Replicated | None = None, apply_lock: asyncio.Lock | None = None) -> None:
        self._store = store
        # Held while records are fsync'ed and applied: a snapshot holds it to
        # copy derived files that do not change under it (a cluster's; None:
        # nothing else reads the store's files, nothing to hold).
        self._apply_lock = apply_lock
        self._on_entries = on_entries
        self._metrics = metrics
        # In a cluster: called with each offset once it is on this node's
        # disk, and awaited until enough followers have it too (see
        # replication.log_stream.LeaderLog); requests are answered then.
        self._replicated = replicated
        self._answering: set[asyncio.Task[None]] = set()
        # What the requests appended since the last sync began wait on (None:
        # none waits yet); resolved when their records are durable.
        self._filling: asyncio.Future[None] | None = None
        self._quiet: list[tuple[Callable[[], object], asyncio.Future[object]]] = []
        # A round is asked for (`kick`); `_wake` is what the idle commit
        # task awaits (an Event's wait and clear are Python calls a round)
        self._kicked = False
        self._wake: asyncio.Future[None] | None = None
        self._failed: BaseException | None = None
        self._syncer: Syncer | None = None  # made by run(), on its loop
        self._kick_timer: asyncio.TimerHandle | None = None  # a kick_soon() pending
        self.rounds = 0  # commits made (syncs and applies), for the metrics and the tests
        self.inline_syncs = 0  # of which fsync'ed on the loop (INLINE_SYNC_RECORDS)
        self._fast_syncs = 0  # fsyncs in a row under INLINE_SYNC_MAX_S

    def __repr__(self) -> str:
        return (f"GroupCommit(pending_records={self._store.pending_records}, rounds={self.rounds}, "
                f"waiting={self._filling is not None}, failed={self._failed!r})")

    def kick(self) -> None:
        """Make what is appended durable now, without waiting for it."""
        self._kicked = True
        wake = self._wake
        if wake is not None:
            self._wake = None
            if not wake.done():
                wake.set_result(None)

    def kick_soon(self) -> None:
        """Make what is appended durable within UNWAITED_COMMIT_DELAY_S, or
        with the next commit a request waits for, whichever comes first."""
        if self._kick_timer is None:
            self._kick_timer = asyncio.get_running_loop().call_later(UNWAITED_COMMIT_DELAY_S, self._kick_later)

    def _kick_later(self) -> None:
        self._kick_timer = None
        self.kick()

    def durable(self) -> asyncio.Future[None]:
        """Await it after appending: done once what was appended is durable
        (the same future for every request of a commit).

        A Task awaiting a future cancels that future when the Task is
        cancelled, and this one is every request's of the commit: a Task
        (the wheel's releases, a pusher's pull: tasks a stand-down cancels)
        gets it shielded, so its cancellation stays its own. A request's
        frame run by the HTTP server outside any Task (broker.http.httpd) cannot
        be cancelled, and gets the future itself (no shield's future and
        callbacks per request)."""
        if self._failed is not None:
            raise Unavailable(f"the commit log failed: {client_text(self._failed)}")
        future = self._filling
        if future is None:
            future = self._filling = asyncio.get_running_loop().create_future()
            self.kick()
        if asyncio.current_task() is None:
            return future
        return asyncio.shield(future)

    async def background_durable(self, what: str) -> bool:
        """`durable()` for a background task's records (timers, releases,
        span moves, the tick): True once durable; False if they are on this
        node's disk but a quorum did not acknowledge them in time (a
        leader whose followers are restarting or installing a snapshot).
        That is no failure of the task: the records stay in this node's
        log, which followers fetch when they can (or, if this node is
        deposed meanwhile, they are lost with its tail, as in a crash
        before they replicated); the task goes on. Raises Unavailable when
        the commits stopped (a failed fsync, this node stopped leading)."""
        try:
            await self.durable()
        except Unavailable as e:
            if self._failed is not None or self._replicated is None:
                raise
            log.warning("%s: %s; kept on this node, it goes on", what, client_text(e))
            return False
        return True

    async def run(self) -> None:
        store = self._store
        self._syncer = syncer = Syncer(store.sync_log)
        never = store.config.fsync is FsyncPolicy.NEVER
        lock = self._apply_lock
        loop = asyncio.get_running_loop()
        try:
            while True:
                if not self._kicked:
                    wake = self._wake = loop.create_future()
                    await wake
                self._kicked = False
                if lock is not None:
                    await lock.acquire()
                # taken once the lock is held: a round cancelled while it
                # waits for it leaves its requests to `abandon` to answer
                waiting, self._filling = self._filling, None
                try:
                    count, end_offset = store.commit_point()
                    try:
                        if count:
                            started = time.perf_counter()
                            if never:  # nothing to wait for, no thread to wake
                                took = 0.0
                            elif count <= INLINE_SYNC_RECORDS and self._fast_syncs >= INLINE_SYNC_AFTER:
                                store.sync_log()
                                took = time.perf_counter() - started
                                self.inline_syncs += 1
                            else:
                                took = await syncer.sync()  # the loop goes on meanwhile
                            self._fast_syncs = self._fast_syncs + 1 if took < INLINE_SYNC_MAX_S else 0
                            entries = store.apply_pending(count, defer=True)
                            if entries:  # (status changes only: nothing new for the wheel)
                                self._on_entries(entries)
                            self._metrics.committed(took, time.perf_counter() - started)
                            self.rounds += 1
                    except asyncio.CancelledError:  # stopping: the records may still be made durable
                        _answer(waiting, Unavailable("this node stops; retry (the client does, with the same msgId)"))
                        raise
                    except BaseException as e:  # a failed fsync: nothing more may be answered 200
                        self._failed = e
                        error = Unavailable(f"the commit log failed: {client_text(e)}")
                        _answer(waiting, error)
                        _answer(self._filling, error)
                        raise
                    if waiting is not None:  # (None: nobody waited; a pull's record, a quiet point)
                        if self._replicated is None:
                            _answer(waiting, None)
                        else:  # answered when a quorum has it, while the next batch is fsync'ed
                            task = asyncio.create_task(_answer_when_replicated(self._replicated, end_offset,
                                                                               waiting))
                            self._answering.add(task)
                            task.add_done_callback(self._answering.discard)
                    if self._quiet and not store.parts_held():  # (a checkpoint waits for a call's COMMIT)
                        self._run_quiet()
                    # a committed bulk call's parts, a slice a turn (no call when there are none)
                    more = (store.held_parts or store.deferred_parts) and store.apply_deferred(DEFERRED_SLICE)
                finally:
                    if lock is not None:
                        lock.release()
                if more:
                    self.kick()
                    await asyncio.sleep(0)
        finally:
            syncer.close()

    def _run_quiet(self) -> None:
        """Apply everything appended, fsync'ing inline, and run the waiting
        functions, all without yielding: no request can append in between,
        so they see a store with nothing pending (however busy the node)."""
        store = self._store
        count, _ = store.commit_point()
        if count:
            store.sync_log()
            self._on_entries(store.apply_pending(count))
            if store.parts_held():  # a bulk call's PART or INTENT came meanwhile: no quiet point yet
                return
        quiet, self._quiet = self._quiet, []
        for fn, future in quiet:
            try:
                future.set_result(fn())
            except Exception as e:
                future.set_exception(e)

    async def at_quiet_point(self, fn: Callable[[], object]) -> object:
        """Run `fn` at a moment when every appended record is durable and
        applied (a checkpoint's first step); returns what it returns.
        Raises Unavailable once the commits stopped (a failed fsync, or this
        node stopped leading): no round will come to run it."""
        if self._failed is not None:
            raise Unavailable(f"no more commits: {client_text(self._failed)}")
        future: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        self._quiet.append((fn, future))
        self.kick()
        return await future

    def abandon(self) -> None:
        """Answer every waiting request 503 (the node stopped leading)."""
        error = Unavailable("this node stopped leading; retry (the client does, with the same msgId)")
        self._failed = self._failed or error  # (requests waiting for followers are failed by the leader log)
        _answer(self._filling, error)
        self._filling = None
        # A quiet point waited for (a checkpoint begun while leading) would
        # wait for ever, holding the checkpoint lock that a snapshot install
        # takes: a fault drill saw a follower stuck so for minutes.
        quiet, self._quiet = self._quiet, []
        for _, future in quiet:
            if not future.done():
                future.set_exception(error)

    async def flush(self) -> None:
        """Commit whatever is pending (used at stop)."""
        if self._store.pending_records:
            await self.durable()

    async def settled(self) -> None:
        """Return once every record appended so far is durable: committed
        here and, in a cluster, on a quorum. A write that changes nothing
        answers with what earlier records made (an ack repeated to a new
        leader finds the message acked by a record of the last term that
        only this node may hold yet): it waits for them too, or its 200
        could be lost with this node (a fault drill saw such an ack)."""
        await self.flush()
        if self._replicated is not None:
            await self._replicated(self._store.log_end_offset)


async def _answer_when_replicated(replicated: Replicated, end_offset: int, waiting: asyncio.Future[None]) -> None:
    try:
        await replicated(end_offset)
    except Unavailable as e:
        _answer(waiting, e)
    else:
        _answer(waiting, None)


def _answer(waiting: asyncio.Future[None] | None, error: BaseException | None) -> None:
    if waiting is None or waiting.done():
        return
    if error is None:
        waiting.set_result(None)
    else:
        waiting.set_exception(error)
