"""The syncer: one thread that runs the commit log's fsyncs, so the event
loop does not wait on the disk (docs/internals.md, "How a node works";
a round of a few records on a fast disk fsyncs on the loop itself:
broker.disk.group_commit's INLINE_SYNC_RECORDS).

    event loop                              syncer thread
    ----------                              -------------
    requests append records to the log
    GroupCommit: sync() ──── put ─────────► fdatasync (the GIL released:
    requests keep arriving, parsed,                     the loop runs on)
      validated and appended: the next     │
      commit fills meanwhile               │
    the future resolves ◄── call_soon_threadsafe ─┘
    apply the synced records, answer them

A hand-off costs two wake-ups (a futex to the thread, an eventfd write
back to the loop) and no executor, queue of callables or
`concurrent.futures.Future`: measured CPU per commit round is in
docs/benchmarks.md ("The flow path"). One fsync is in flight at a time:
the group commit waits for its answer before the next, so what a sync
covers is never behind what an earlier one covered.
"""

from __future__ import annotations

import asyncio
import queue
import sys
import threading
import time
from collections.abc import Callable

from storage.errors import ContractError

# The syncer thread holds the GIL for a few microseconds before and after
# each fsync. While the loop thread runs Python, a thread that wants the
# GIL waits up to the interpreter's switch interval (5 ms by default)
# before the loop is made to let go: every commit would start and end that
# much late under load. This interval is set for the whole process when the
# syncer starts; only threads that wait for the GIL are affected by it (the
# loop thread is alone otherwise). Measured in docs/benchmarks.md ("The
# flow path").
SWITCH_INTERVAL_S = 0.0001


class Syncer:
    """Runs `sync` (a function that blocks until what was appended is on
    disk) in its own thread, each call answered on the event loop as a
    future of the seconds it took. Created and used on one event loop;
    `close()` ends the thread."""

    def __init__(self, sync: Callable[[], None], loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._sync = sync
        self._loop = loop or asyncio.get_running_loop()
        self._calls: queue.SimpleQueue[asyncio.Future[float] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self.rounds = 0  # syncs run, for the repr and the tests
        self._closed = False  # close() was called

    def __repr__(self) -> str:
        alive = self._thread is not None and self._thread.is_alive()
        return f"Syncer(rounds={self.rounds}, thread={'running' if alive else 'stopped'})"

    def sync(self) -> asyncio.Future[float]:
        """Start a sync; the future gets its duration in seconds, or the
        exception it raised."""
        if self._thread is None:
            if sys.getswitchinterval() > SWITCH_INTERVAL_S:
                sys.setswitchinterval(SWITCH_INTERVAL_S)
            self._thread = threading.Thread(target=self._run, name="hourglass-syncer", daemon=True)
            self._thread.start()
        elif self._closed:
            raise ContractError("the syncer is closed")
        future: asyncio.Future[float] = self._loop.create_future()
        self._calls.put(future)
        return future

    def close(self) -> None:
        """End the thread once the syncs asked for have run (their answers
        are dropped if the loop is closed by then)."""
        self._closed = True
        if self._thread is not None and self._thread.is_alive():
            self._calls.put(None)
            self._thread.join()

    def _run(self) -> None:
        calls, sync, loop = self._calls, self._sync, self._loop
        while True:
            future = calls.get()
            if future is None:
                return
            started = time.perf_counter()
            error: BaseException | None = None
            try:
                sync()
            except BaseException as e:  # handed to the loop: the group commit fails the node
                error = e
            self.rounds += 1
            try:
                loop.call_soon_threadsafe(_settle, future, time.perf_counter() - started, error)
            except RuntimeError:  # the loop is closed: nobody waits any more
                return


def _settle(future: asyncio.Future[float], took_s: float, error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(took_s)
    else:
        future.set_exception(error)
