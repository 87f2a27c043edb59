"""A backend's serving life: serving, stopping, or failed. Both backends
(the disk `broker.disk.backend.Broker` and the Redis `RedisBroker`) build one.

Stopping has two steps. `begin_stop()` refuses new work (every request
method starts with `check_serving()`, which raises Unavailable: HTTP 503),
answers every long poll now, empty (broker.core.long_polls), and calls the
backend's `on_stop` (to wake its background tasks); the server then
finishes the requests in flight and calls the backend's own `stop()`.
`fail()` is `begin_stop()` for a backend that cannot go on (a failed
append, fsync or background task): it records the error in `failed`, logs
it once, and calls `on_fatal` so the server exits (a restart recovers).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from storage.errors import Unavailable

from .long_polls import LongPolls


class Lifecycle:
    """Whether the backend serves, and why it stopped. Runs on the event loop."""

    def __init__(self, long_polls: LongPolls, log: logging.Logger, failure_words: str,
                 on_stop: Callable[[], None] | None = None) -> None:
        self._long_polls = long_polls
        self._log = log  # where a failure is logged
        self._failure_words = failure_words  # what the log says the node does then
        self._on_stop = on_stop
        # True once the node stops (`begin_stop`); written only here.
        self.stopping = False
        # Called once if the node must stop (a failed append, fsync or task):
        # RAM and disk (or Redis) may disagree, so only a restart is safe.
        self.on_fatal: Callable[[BaseException], None] | None = None
        self.failed: BaseException | None = None

    def __repr__(self) -> str:
        return f"Lifecycle(stopping={self.stopping}, failed={self.failed!r})"

    def check_serving(self) -> None:
        """Raise Unavailable (503) once the node stops: the first step of every request."""
        if self.stopping:
            raise Unavailable("the node is stopping")

    def begin_stop(self) -> None:
        """Refuse new work and answer every long poll now."""
        self.stopping = True
        self._long_polls.close()
        if self._on_stop is not None:
            self._on_stop()

    def fail(self, error: BaseException, where: str) -> None:
        if self.failed is None:
            self._log.critical("%s failed: %r; %s", where, error, self._failure_words)
            self.failed = error
            self.begin_stop()
            if self.on_fatal is not None:
                self.on_fatal(error)

    def task_ended(self, task: asyncio.Task[None]) -> None:
        """A background task's done-callback: its error fails the node."""
        error = None if task.cancelled() else task.exception()
        if error is not None:
            self.fail(error, f"task {task.get_name()}")
