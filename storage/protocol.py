"""The public protocol of a delay-message store, shared by the disk engine
(`storage.store.Store`) and its reference model (`storage.memory.InMemoryStore`).

Callers (the broker, the timing wheel, the tests) type against this, so a
test can drive both implementations with the same calls and compare.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from .entry import IndexEntry, Location, Message
from .store import CheckpointReport, NewMessage, SendResult, StateChange


class DelayStore(Protocol):
    """Like a Mapping[(topic, msgId), Message] whose messages are also filed
    by (hour, second) of max(trigger_ms, now_ms), with group commit."""

    def send(self, batch: Sequence[NewMessage], now_ms: int) -> list[SendResult]: ...

    def update(self, changes: Iterable[StateChange], now_ms: int) -> None: ...

    def commit(self) -> list[IndexEntry]: ...

    def get(self, topic: str, msg_id: str) -> Message | None: ...

    def read_entry(self, where: Location) -> IndexEntry: ...

    def read_message(self, where: Location) -> Message | None: ...

    def read_second(self, hour: int, second: int) -> list[IndexEntry]: ...

    def second_counts(self, hour: int) -> Sequence[int]: ...

    def next_hour(self, from_hour: int) -> int | None: ...

    def hours(self) -> list[tuple[int, int, int]]: ...

    def checkpoint(self, now_ms: int) -> CheckpointReport: ...

    def advance(self, now_ms: int) -> None: ...

    def close(self) -> None: ...
