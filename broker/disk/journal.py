"""The disk broker's writes to the commit log, when they are durable, and
what a failed one means.

Every change to a message is one record appended to the commit log
(`Store.send`, `Store.move`, `Store.update`) and made durable by the group
commit (broker.disk.group_commit) before the request that made it is answered.
Two kinds of failure differ:

    send, move   the store undoes a failed append: nothing was kept, the
                 request is answered 503 (Unavailable) and may be retried
    status change RAM was changed first (the window, the in-flight set):
                 RAM is now ahead of disk, so the node fails (broker.core
                 .lifecycle) and a restart recovers from the commit log

The parts await what they appended through it (`durable`, `settled`,
`flush`: the group commit's, broker.disk.group_commit).
"""

from __future__ import annotations

import asyncio
from array import array
from collections.abc import Coroutine, Sequence
from typing import Any

from storage.entry import Location, Message
from storage.errors import InvalidRequest, Unavailable
from storage.store import NewMessage, SendResult, StateChange, Store

from ..core.lifecycle import Lifecycle
from ..core.redact import client_text
from .group_commit import GroupCommit


class Journal:
    """Appends records for the broker's parts, and hands them the group
    commit's waits (a request is answered once its records are durable).
    Runs on the event loop."""

    def __init__(self, store: Store, lifecycle: Lifecycle, commits: GroupCommit) -> None:
        self._store = store
        self._lifecycle = lifecycle
        self._commits = commits

    def __repr__(self) -> str:
        return f"Journal(pending_records={self._store.pending_records})"

    def send(self, batch: Sequence[NewMessage], now_ms: int) -> list[SendResult]:
        """Store new messages (WAITING): one record. Their fields are
        checked already (broker.core.params)."""
        try:
            return self._store.send(batch, now_ms, checked=True)
        except InvalidRequest:
            raise
        except OSError as e:  # nothing was kept (the store undoes a failed append)
            raise Unavailable(f"the commit log refused the write: {client_text(e)}") from e

    def move(self, moves: Sequence[tuple[Location, int, int]], now_ms: int, redrive: bool = False) -> list[Message]:
        """File messages anew at (trigger time, retry): one MOVE record; the
        moved messages, WAITING at their new places (`redrive`: their
        redriveCount one more)."""
        try:
            return self._store.move(moves, now_ms, redrive)
        except InvalidRequest:
            raise
        except OSError as e:
            raise Unavailable(f"the commit log refused the write: {client_text(e)}") from e

    def append(self, changes: list[StateChange], now_ms: int, part_of: int = 0) -> None:
        """Status changes whose RAM side is done already: one record (with
        `part_of`, a PART of that bulk call: storage.records). If the
        append fails, RAM is ahead of disk: the node fails (a restart recovers)."""
        try:
            self._store.update(changes, now_ms, part_of)
        except BaseException as e:
            self._lifecycle.fail(e, "a commit-log append")
            raise Unavailable(f"the commit log failed: {client_text(e)}") from e

    def seen_again(self, places: list[Location], now_ms: int) -> None:
        """The end times kept for these ended messages moved on to `now_ms`
        (duplicate sends their topic's dedup window answered): one record,
        appended after the send's, whose results the caller is still
        carrying out; a failure fails the node, as `append`'s does."""
        try:
            self._store.seen_again(places, now_ms)
        except BaseException as e:
            self._lifecycle.fail(e, "a commit-log append")
            raise Unavailable(f"the commit log failed: {client_text(e)}") from e

    def intend(self, call_id: int, topic: str, shift_ms: int | None, trigger_ms: int | None,
               places: array[int], now_ms: int) -> None:
        """The INTENT record of a large move (storage.records); once durable
        the call is carried out whole, here or by the next node to serve.
        A failure fails the node, as `append`'s does."""
        try:
            self._store.intend(call_id, topic, shift_ms, trigger_ms, places, now_ms)
        except BaseException as e:
            self._lifecycle.fail(e, "a commit-log append")
            raise Unavailable(f"the commit log failed: {client_text(e)}") from e

    def done(self, call_id: int, now_ms: int) -> None:
        """The DONE record of an INTENT's call, carried out."""
        try:
            self._store.done(call_id, now_ms)
        except BaseException as e:
            self._lifecycle.fail(e, "a commit-log append")
            raise Unavailable(f"the commit log failed: {client_text(e)}") from e

    def commit_parts(self, call_id: int, now_ms: int) -> None:
        """The COMMIT record of a bulk call's PARTs (call id 0: drop the
        parts held of a call that never committed). A failure fails the
        node, as `append`'s does: the call's RAM side is done."""
        try:
            self._store.commit_parts(call_id, now_ms)
        except BaseException as e:
            self._lifecycle.fail(e, "a commit-log append")
            raise Unavailable(f"the commit log failed: {client_text(e)}") from e

    # == the waits for them (the group commit's: broker.disk.group_commit) ===========

    def durable(self) -> asyncio.Future[None]:
        return self._commits.durable()

    def settled(self) -> Coroutine[Any, Any, None]:
        return self._commits.settled()

    def flush(self) -> Coroutine[Any, Any, None]:
        return self._commits.flush()

    def kick_soon(self) -> None:
        self._commits.kick_soon()

    def background_durable(self, what: str) -> Coroutine[Any, Any, bool]:
        return self._commits.background_durable(what)
