"""Calls of one kind that come while one of their key is being carried
out, carried out together once it is done (docs/internals.md, "Turns").

A call whose key has nothing being carried out goes at once, alone, as
it always did: a lone request waits for nothing. One that comes while a
call of its key is carried out (a topic's sends, or its acks, waiting
for their commit) opens the key's next turn, and every call of the key
that comes meanwhile -- from any connection -- joins it; when the call
being carried out is done, the turn's first carries out what all joined
with one call (one record, one commit) and hands each its share. Their
commit could not have begun before the one in progress ended: joining
costs them no wait, and saves a record and a pass a call.

A turn holds at most `max_items` items and `max_weight` of their weight
(a send's text); a call that would pass it goes at once, alone. A turn
of many calls that fails (or whose first caller is cancelled) fails none
of them: each carries out its own items alone, as if it had not joined,
and meets what it alone meets.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Generic, TypeVar

Key = TypeVar("Key", bound=Hashable)
Item = TypeVar("Item")
Result = TypeVar("Result")


class _Turn(Generic[Item, Result]):
    def __init__(self, items: list[Item], weight: int, go: asyncio.Future[None]) -> None:
        self.items = items
        self.weight = weight
        self.go = go  # set once the call it waits for is done
        # the calls that joined the first: where their items start, how many, and what each
        # awaits (None: the turn failed, carry your own out alone)
        self.waiting: list[tuple[int, int, asyncio.Future[list[Result] | None]]] = []


class Turns(Generic[Key, Item, Result]):
    """`join(key, items)`: `carry_out(key, items)`'s results, carried out
    with those of every call of `key` that came while another was carried
    out. `carry_out` answers one result an item, in order; `weigh` an
    item's share of `max_weight`."""

    def __init__(self, carry_out: Callable[[Key, list[Item]], Awaitable[list[Result]]], max_items: int,
                 weigh: Callable[[Item], int] | None = None, max_weight: int = 0) -> None:
        self._carry_out = carry_out
        self._max_items = max_items
        self._weigh = weigh
        self._max_weight = max_weight
        self._open: dict[Key, _Turn[Item, Result]] = {}  # the next turn of a key, waiting
        self._running: dict[Key, int] = {}  # calls of a key being carried out

    def __repr__(self) -> str:
        return f"Turns(open={len(self._open)}, running={sum(self._running.values())}, max_items={self._max_items})"

    async def join(self, key: Key, items: Sequence[Item]) -> list[Result]:
        weigh = self._weigh
        weight = 0 if weigh is None else sum(map(weigh, items))
        turn = self._open.get(key)
        if turn is not None:
            if (len(turn.items) + len(items) > self._max_items
                    or (weigh is not None and turn.weight + weight > self._max_weight)):
                return await self._run(key, list(items))  # (full: this one goes alone)
            share: asyncio.Future[list[Result] | None] = asyncio.get_running_loop().create_future()
            turn.waiting.append((len(turn.items), len(items), share))  # (a future of its own: a caller
            turn.items.extend(items)                                   # cancelled cancels only its own)
            turn.weight += weight
            results = await share
            return await self._run(key, list(items)) if results is None else results
        if not self._running.get(key):
            return await self._run(key, list(items))  # nothing of its key in progress: at once
        turn = _Turn(list(items), weight, asyncio.get_running_loop().create_future())
        self._open[key] = turn
        try:
            await turn.go  # (a future: an inline frame goes on without a Task)
            if self._open.get(key) is turn:
                del self._open[key]
            if not turn.waiting:
                return await self._run(key, turn.items)
            results = await self._run(key, turn.items)
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
            return await self._run(key, list(items))
        for at, count, share in turn.waiting:
            if not share.done():
                share.set_result(results[at:at + count])
        return results[:len(items)]

    async def _run(self, key: Key, items: list[Item]) -> list[Result]:
        """`carry_out`, counted as in progress for its key; once done, the
        key's next turn may go."""
        running = self._running
        running[key] = running.get(key, 0) + 1
        try:
            return await self._carry_out(key, items)
        finally:
            left = running[key] - 1
            if left:
                running[key] = left
            else:
                del running[key]
            turn = self._open.get(key)
            if turn is not None and not turn.go.done():
                turn.go.set_result(None)
