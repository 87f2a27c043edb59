"""Stopping the node's background tasks when a cancel may be lost.

On Python 3.11, `asyncio.wait_for` -- which redis-py uses to send each
command -- returns normally when a cancel lands as the wait it guards
ends (CPython gh-86296): the task runs on as if it was never cancelled,
and a stop that awaits it waits for ever (CI saw a Redis-backed node
outlive SIGTERM so, its jobs lease still renewing). Two remedies, used
together:

    raise_swallowed_cancel   a loop over Redis calls checks, between its
                             rounds, whether a cancel of it was asked
                             (`Task.cancelling()` stays counted)
    cancel_and_wait          a stop cancels again, every AGAIN_S, the
                             tasks that have not ended
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

# How long a stop lets a cancelled task end (its own clean-up: a Redis call
# or two) before it takes the cancel for lost and cancels it again.
AGAIN_S = 0.5


def raise_swallowed_cancel() -> None:
    """Re-raise a cancel() that was lost (the module docstring). Called
    between the rounds of our loops."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


async def cancel_and_wait(tasks: Iterable[asyncio.Task[Any]]) -> None:
    """Cancel `tasks` and return once every one has ended, cancelling again
    each AGAIN_S those still running. What they raised is taken (not
    logged as never retrieved), as `gather(..., return_exceptions=True)`
    does."""
    every = list(tasks)
    pending = {task for task in every if not task.done()}
    try:
        while pending:
            for task in pending:
                task.cancel()
            _, pending = await asyncio.wait(pending, timeout=AGAIN_S)
    finally:  # (this wait itself cancelled: those ended are taken all the same)
        for task in every:
            if task.done() and not task.cancelled():
                task.exception()


__all__ = ["AGAIN_S", "cancel_and_wait", "raise_swallowed_cancel"]
