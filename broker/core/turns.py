"""Calls of one kind that start in the same turn of the event loop,
carried out as one (docs/internals.md, "Turns").

The requests of many connections that arrive together -- read in one
poll of the loop -- each join the open turn of their key (a topic's
acks, a topic's sends); the first to join waits for the loop's next turn,
which comes after every read of this one was served, then carries out
what all joined with one call (one record, one commit) and hands each
its share of the results. A lone call waits one turn of the loop and
makes the one call it made alone. A turn holds at most `max_items` items
and `max_weight` of their weight (a send's text): one more starts the
next turn.

A turn of many calls that fails (or whose first caller is cancelled)
fails none of them: each carries out its own items alone, as if it had
not joined, and meets what it alone meets.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Generic, TypeVar

Key = TypeVar("Key", bound=Hashable)
Item = TypeVar("Item")
Result = TypeVar("Result")


class _Turn(Generic[Item, Result]):
    def __init__(self, items: list[Item], weight: int) -> None:
        self.items = items
        self.weight = weight
        # the calls that joined the first: where their items start, how many, and what each
        # awaits (None: the turn failed, carry your own out alone)
        self.waiting: list[tuple[int, int, asyncio.Future[list[Result] | None]]] = []


class Turns(Generic[Key, Item, Result]):
    """`join(key, items)`: `carry_out(key, every item that joined key's
    turn)`'s results for `items`. `carry_out` answers one result an item,
    in order; `weigh` an item's share of `max_weight`."""

    def __init__(self, carry_out: Callable[[Key, list[Item]], Awaitable[list[Result]]], max_items: int,
                 weigh: Callable[[Item], int] | None = None, max_weight: int = 0) -> None:
        self._carry_out = carry_out
        self._max_items = max_items
        self._weigh = weigh
        self._max_weight = max_weight
        self._open: dict[Key, _Turn[Item, Result]] = {}

    def __repr__(self) -> str:
        return f"Turns(open={len(self._open)}, max_items={self._max_items})"

    async def join(self, key: Key, items: Sequence[Item]) -> list[Result]:
        loop = asyncio.get_running_loop()
        weigh = self._weigh
        weight = 0 if weigh is None else sum(map(weigh, items))
        turn = self._open.get(key)
        if turn is not None and (len(turn.items) + len(items) > self._max_items
                                 or (weigh is not None and turn.weight + weight > self._max_weight)):
            del self._open[key]  # full: it is carried out as it is, and this call starts the next
            turn = None
        if turn is not None:  # (a future of its own: a caller cancelled cancels only its own)
            share: asyncio.Future[list[Result] | None] = loop.create_future()
            turn.waiting.append((len(turn.items), len(items), share))
            turn.items.extend(items)
            turn.weight += weight
            results = await share
            return await self._carry_out(key, list(items)) if results is None else results
        turn = _Turn(list(items), weight)
        self._open[key] = turn
        try:
            tick: asyncio.Future[None] = loop.create_future()
            loop.call_soon(_resolve, tick)
            await tick  # (a future, not a bare yield: an inline frame goes on without a Task)
            if self._open.get(key) is turn:
                del self._open[key]
            if not turn.waiting:
                return await self._carry_out(key, turn.items)
            results = await self._carry_out(key, turn.items)
        except BaseException as error:
            if self._open.get(key) is turn:
                del self._open[key]
            if not turn.waiting:
                raise
            for _, _, share in turn.waiting:  # each carries its own out alone
                if not share.done():
                    share.set_result(None)
            if not isinstance(error, Exception):
                raise  # (this caller cancelled: only its own items are given up)
            return await self._carry_out(key, list(items))
        for at, count, share in turn.waiting:
            if not share.done():
                share.set_result(results[at:at + count])
        return results[:len(items)]


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
