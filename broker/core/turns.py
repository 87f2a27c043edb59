"""Calls of one kind that start in the same turn of the event loop,
carried out as one (docs/internals.md, "Pipelined runs and turns").

The requests of many connections that arrive together -- read in one
poll of the loop -- each join the open turn of their key (a topic's
acks, a topic's sends); the first to join waits for the loop's next turn,
which comes after every read of this one was served, then carries out
what all joined with one call (one record, one commit) and hands each
its share of the results. A lone call waits one turn of the loop and
costs one call, as before.

A turn that fails fails each call that joined it, with its error (the
callers answer it, or carry their part out alone: broker.http.api).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Generic, TypeVar

Key = TypeVar("Key", bound=Hashable)
Item = TypeVar("Item")
Result = TypeVar("Result")


class _Turn(Generic[Item, Result]):
    __slots__ = ("items", "waiting")

    def __init__(self, items: list[Item]) -> None:
        self.items = items
        # the calls that joined the first: where their items start, how many, and what each awaits
        self.waiting: list[tuple[int, int, asyncio.Future[list[Result]]]] = []


class Turns(Generic[Key, Item, Result]):
    """`join(key, items)`: `carry_out(key, every item that joined key's
    turn)`'s results for `items`. `carry_out` answers one result an item,
    in order."""

    def __init__(self, carry_out: Callable[[Key, list[Item]], Awaitable[list[Result]]]) -> None:
        self._carry_out = carry_out
        self._open: dict[Key, _Turn[Item, Result]] = {}

    def __repr__(self) -> str:
        return f"Turns(open={len(self._open)})"

    async def join(self, key: Key, items: Sequence[Item]) -> list[Result]:
        loop = asyncio.get_running_loop()
        turn = self._open.get(key)
        if turn is not None:  # (a future of its own: a caller cancelled cancels only its own)
            share: asyncio.Future[list[Result]] = loop.create_future()
            turn.waiting.append((len(turn.items), len(items), share))
            turn.items.extend(items)
            return await share
        turn = _Turn(list(items))
        self._open[key] = turn
        try:
            tick: asyncio.Future[None] = loop.create_future()
            loop.call_soon(_resolve, tick)
            await tick  # (a future, not a bare yield: an inline frame goes on without a Task)
            del self._open[key]
            results = await self._carry_out(key, turn.items)
        except BaseException as error:
            if self._open.get(key) is turn:
                del self._open[key]
            for _, _, share in turn.waiting:
                if not share.done():
                    if isinstance(error, Exception):
                        share.set_exception(error)
                    else:  # this caller was cancelled: the others are answered as if theirs was
                        share.cancel()
            raise
        for at, count, share in turn.waiting:
            if not share.done():
                share.set_result(results[at:at + count])
        return results[:len(items)]


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
