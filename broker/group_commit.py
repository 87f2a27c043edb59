"""Group commit: many requests' records made durable by one fsync.

    request A: append record, await durable() ─┐
    request B: append record, await durable() ─┼─► commit task: fsync once,
    request C: append record, await durable() ─┘   apply to the derived files,
                                                   hand the new index entries
                                                   on, wake A, B and C

A request is answered only after its record is durable (in a cluster:
also on a quorum of followers, `Replicated`). One fsync per batch of
concurrent requests gives the same durability as one per request at a
hundred times the rate (docs/internals.md, "How a node works").
The commit task is the only one that fsyncs or applies; everything runs on
the event loop, the fsync itself in a worker thread once fsyncs are slow.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from storage.entry import IndexEntry
from storage.errors import Unavailable
from storage.store import Store

from .metrics import Metrics
from .redact import client_text

# The group commit fsyncs on the event loop itself while fsyncs take less
# than this on average (the loop waits that long; requests arriving
# meanwhile form the next batch), and in a worker thread once they are
# slower, so a slow disk never stalls the loop. (Measured on a 2-core VM: a
# hand-off to a thread and back costs ~80 us of CPU, as much as the fsync.)
INLINE_FSYNC_S = 0.001

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
        self._answering: set[asyncio.Task[None]] = set()
        self._waiting: list[asyncio.Future[None]] = []
        self._quiet: list[tuple[Callable[[], object], asyncio.Future[object]]] = []
        self._kick = asyncio.Event()
        self._failed: BaseException | None = None
        self._fsync_ewma_s = 0.0  # recent fsyncs' duration (see INLINE_FSYNC_S)

    def __repr__(self) -> str:
        return (f"GroupCommit(pending_records={self._store.pending_records}, waiting={len(self._waiting)}, "
                f"fsync_ewma_ms={self._fsync_ewma_s * 1000:.3f}, failed={self._failed!r})")

    def kick(self) -> None:
        """Make what is appended durable soon, without waiting for it."""
        self._kick.set()

    async def durable(self) -> None:
        if self._failed is not None:
            raise Unavailable(f"the commit log failed: {client_text(self._failed)}")
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
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
                            future.set_exception(Unavailable(f"the commit log failed: {client_text(e)}"))
                    raise
                if self._replicated is None:
                    _answer(waiting, None)
                else:  # answered when a quorum has it, while the next batch is fsync'ed
                    task = asyncio.create_task(_answer_when_replicated(self._replicated, end_offset, waiting))
                    self._answering.add(task)
                    task.add_done_callback(self._answering.discard)
                if self._quiet:
                    self._run_quiet()

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
        future: asyncio.Future[object] = asyncio.get_running_loop().create_future()
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


async def _answer_when_replicated(replicated: Replicated, end_offset: int,
                                  waiting: list[asyncio.Future[None]]) -> None:
    try:
        await replicated(end_offset)
    except Unavailable as e:
        _answer(waiting, e)
    else:
        _answer(waiting, None)


def _answer(waiting: list[asyncio.Future[None]], error: BaseException | None) -> None:
    for future in waiting:
        if not future.done():
            if error is None:
                future.set_result(None)
            else:
                future.set_exception(error)
