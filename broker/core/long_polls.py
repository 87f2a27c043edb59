"""Long polls: a pull that waits on its topic until a message is READY
there, its timeout passes, or the node stops. Both backends build one.

A long poll (`wait_ready`) pulls; if that finds nothing it waits on its
topic until whoever makes a message READY there calls `wake(topic)`, then
pulls again:

    poll(topic T, 30 s) -> pull: []  -> wait on T ......... wake(T) -> pull: [m]
                                        (30 s left)

A client that hung up (`gone()`) takes nothing: what its last pull took
goes back to READY (`give_back`). Waiting uses the backend's injected
clock (its monotonic time and timers: a FakeClock in tests); one waiter is
a future in `_waiters[topic]`, set by `wake` and removed when the poll
returns, so an idle topic holds nothing. `close()` (the node stops)
answers every poll now and each later one at once. All of it runs on the
event loop.
"""

from __future__ import annotations

import asyncio
import functools
from collections import defaultdict
from collections.abc import Awaitable, Callable

from storage.entry import Message
from wheel.clock import Clock


class LongPolls:
    """The long polls waiting on each topic."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock  # long polls wait on its monotonic time
        self._waiters: dict[str, list[asyncio.Future[None]]] = defaultdict(list)
        self._closed = False
        # Told of each wake (a node of many shards tells the shards that found the topic drained:
        # broker.shards.router); None: nobody.
        self.on_wake: Callable[[str], None] | None = None

    def __repr__(self) -> str:
        return f"LongPolls(waiting={sum(map(len, self._waiters.values()))}, closed={self._closed})"

    def wake(self, topic: str) -> None:
        """A message became READY in `topic` (or a pull held back by a cap
        may go on): its long polls pull again."""
        for future in self._waiters.pop(topic, ()):
            if not future.done():
                future.set_result(None)
        if self.on_wake is not None:
            self.on_wake(topic)

    def wake_waiters(self, topic: str) -> None:
        """As `wake`, told by another shard: this node's long polls of
        `topic` pull again, and nobody else is told."""
        for future in self._waiters.pop(topic, ()):
            if not future.done():
                future.set_result(None)

    def wake_all(self) -> None:
        for topic in list(self._waiters):
            self.wake(topic)

    def close(self) -> None:
        """Answer every long poll now, and each later one at once (the node stops)."""
        self._closed = True
        self.wake_all()

    async def wait_ready(self, topic: str, timeout_ms: int, pull: Callable[[], Awaitable[list[Message]]],
                         give_back: Callable[[list[Message]], Awaitable[None]], gone: Callable[[], bool], *,
                         wait_before_pull: bool = False, repoll_s: float | None = None) -> list[Message]:
        """A long poll of `topic`: `pull()` until it takes something or
        `timeout_ms` passes, waiting between pulls for `wake(topic)`.

        `wait_before_pull`: the waiter is set up before each pull, so a wake
        that comes while the pull awaits a round trip counts (Redis: other
        processes wake it); else only when a pull found nothing (disk: no
        cost to a pull that finds messages). `repoll_s`: pull again at
        least this often even unwoken (Redis: a wake lost with a connection
        then costs no more)."""
        clock = self._clock
        deadline = clock.monotonic_s() + timeout_ms / 1000
        while True:
            if self._closed or gone():  # answered, possibly empty, as the node stops
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
