"""What both backends (the disk `broker.service.Broker` and the Redis
`RedisBroker`) do alike about serving: stopping, failing, and long polls.

Stopping has two steps. `begin_stop()` refuses new work (every request
method starts with `_check_serving()`, which raises Unavailable: HTTP 503)
and answers every long poll now, empty; the server then finishes the
requests in flight and calls the backend's own `stop()`. `fail()` is
`begin_stop()` for a backend that cannot go on (a failed append, fsync or
background task): it records the error in `failed`, logs it once, and calls
`on_fatal` so the server exits (a restart recovers).

A long poll (`_wait_ready`) pulls; if that finds nothing it waits on its
topic until a message becomes READY there (whoever makes one READY calls
`_wake(topic)`), the timeout passes, or the node stops, then pulls again:

    poll(topic T, 30 s) -> pull: []  -> wait on T ......... _wake(T) -> pull: [m]
                                        (30 s left)

A client that hung up (`gone()`) takes nothing: what its last pull took
goes back to READY (`give_back`). Waiting uses the backend's injected
clock (its monotonic time and timers: a FakeClock in tests); one
waiter is a future in `_waiters[topic]`, set by `_wake` and removed when
the poll returns, so an idle topic holds nothing.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable

from storage.entry import Message
from storage.errors import Unavailable
from wheel.clock import Clock


class Lifecycle:
    """The stop, fail and long-poll state every backend has; a base class.
    All of it runs on the event loop."""

    # Where a failure is logged, and what the log says it does (the disk
    # node also exits).
    _log = logging.getLogger("hourglass.service")
    _failure_words = "the node stops serving and exits"
    clock: Clock  # (set by the backend) long polls wait on its monotonic time

    def __init__(self) -> None:
        self._stopping = False
        self._waiters: dict[str, list[asyncio.Future[None]]] = defaultdict(list)
        # Called once if the node must stop (a failed append, fsync or task):
        # RAM and disk (or Redis) may disagree, so only a restart is safe.
        self.on_fatal: Callable[[BaseException], None] | None = None
        self.failed: BaseException | None = None

    def _task_ended(self, task: asyncio.Task[None]) -> None:
        error = None if task.cancelled() else task.exception()
        if error is not None:
            self.fail(error, f"task {task.get_name()}")

    def fail(self, error: BaseException, where: str) -> None:
        if self.failed is None:
            self._log.critical("%s failed: %r; %s", where, error, self._failure_words)
            self.failed = error
            self.begin_stop()
            if self.on_fatal is not None:
                self.on_fatal(error)

    def begin_stop(self) -> None:
        """Refuse new work and answer every long poll now."""
        self._stopping = True
        self.wake_all()

    def _check_serving(self) -> None:
        if self._stopping:
            raise Unavailable("the node is stopping")

    # == long polls ==============================================================

    def _wake(self, topic: str) -> None:
        for future in self._waiters.pop(topic, ()):
            if not future.done():
                future.set_result(None)

    def wake_all(self) -> None:
        for topic in list(self._waiters):
            self._wake(topic)

    async def _wait_ready(self, topic: str, timeout_ms: int, pull: Callable[[], Awaitable[list[Message]]],
                          give_back: Callable[[list[Message]], Awaitable[None]], gone: Callable[[], bool], *,
                          wait_before_pull: bool = False, repoll_s: float | None = None) -> list[Message]:
        """A long poll of `topic`: `pull()` until it takes something or
        `timeout_ms` passes, waiting between pulls for `_wake(topic)`.

        `wait_before_pull`: the waiter is set up before each pull, so a wake
        that comes while the pull awaits a round trip counts (Redis: other
        processes wake it); else only when a pull found nothing (disk: no
        cost to a pull that finds messages). `repoll_s`: pull again at
        least this often even unwoken (Redis: a wake lost with a connection
        then costs no more)."""
        clock = self.clock
        deadline = clock.monotonic_s() + timeout_ms / 1000
        while True:
            if self._stopping or gone():  # answered, possibly empty, as the node stops
                return []
            future = self._enlist(topic) if wait_before_pull else None
            try:
                messages = await pull()
                if messages and gone():
                    await give_back(messages)
                    return []
                remaining = deadline - clock.monotonic_s()
                if messages or remaining <= 0:
                    return messages
                if future is None:
                    future = self._enlist(topic)
                timer = clock.call_later(remaining if repoll_s is None else min(remaining, repoll_s),
                                         functools.partial(_settle, future))
                try:
                    await future
                finally:
                    timer.cancel()
            finally:
                if future is not None:
                    waiters = self._waiters.get(topic)
                    if waiters and future in waiters:
                        waiters.remove(future)
                        if not waiters:
                            del self._waiters[topic]

    def _enlist(self, topic: str) -> asyncio.Future[None]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters[topic].append(future)
        return future


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
