"""Moving the WAITING messages of due far-future spans to nearer files.

A message more than 32 hours ahead is filed in a span of 2^s hours
(storage.spans), which the wheel never reads. When a span falls due (at
least 32 hours before its first message), `Store.refile` files its waiting
messages again, into half-size spans or their own hours, a record of
REFILE_STEP at a time; the group commit hands the ones now in hours to the
wheel like any send. After a long outage, overdue ones are filed into the
current second and released at once (late, never early).
"""

from __future__ import annotations

import asyncio
import logging

from storage.store import Store
from wheel.clock import Clock

from ..core.lifecycle import Lifecycle
from .group_commit import GroupCommit

# After a failed move of due spans' messages, wait this long.
SPAN_RETRY_S = 5

log = logging.getLogger("hourglass.service")


class SpanMover:
    """The task that moves due spans' messages. `wake` is set when a send
    files a message in a span (broker.disk.filing): the next due span may be
    earlier."""

    def __init__(self, store: Store, clock: Clock, lifecycle: Lifecycle, commits: GroupCommit,
                 wake: asyncio.Event) -> None:
        self._store = store
        self._clock = clock
        self._lifecycle = lifecycle
        self._commits = commits
        self._wake = wake

    def __repr__(self) -> str:
        return f"SpanMover(next_refile_ms={self._store.next_refile_ms()})"

    async def run(self) -> None:
        """Move due spans' messages, each record durable before the next,
        until the node stops. A full disk is logged and tried again; it
        refuses nothing. Sleeps until the next span falls due, or a send
        files into a span."""
        store, clock = self._store, self._clock
        moved = 0
        while not self._lifecycle.stopping:
            self._wake.clear()
            now_ms = clock.now_ms()
            try:
                n = store.refile(now_ms)
            except OSError as e:
                log.warning("moving messages of due spans failed (%s); trying again in %d s", e, SPAN_RETRY_S)
                await clock.sleep_until(now_ms + SPAN_RETRY_S * 1000, asyncio.Event())
                continue
            if n:
                moved += n
                await self._commits.background_durable("messages moved from due spans")
                continue
            if moved:
                log.info("moved %d waiting messages from due spans to nearer files", moved)
                moved = 0
            due_ms = store.next_refile_ms()
            if due_ms is not None and due_ms <= now_ms:  # due, its sends not applied yet
                await self._commits.background_durable("messages moved from due spans")
                continue
            await clock.sleep_until(due_ms, self._wake)
