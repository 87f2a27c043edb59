"""The disk engine and its reference model offer the same calls: the
public protocol of a delay-message store, shared by the disk engine
(`storage.store.Store`) and its reference model (tests/memory_store.py's
`InMemoryStore`), so that a test can drive both with the same calls and
compare (tests/property/test_store_model.py)."""

import inspect
from collections.abc import Iterable, Iterator, Sequence
from typing import Protocol

import pytest
from memory_store import InMemoryStore

from storage.config import StoreConfig
from storage.entry import IndexEntry, Location, Message
from storage.store import Store
from storage.types import CheckpointReport, NewMessage, SendResult, StateChange


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

    def topic_names(self) -> dict[int, str]: ...

    def topic_hours(self, topic_hash: int) -> list[tuple[int, list[int]]]: ...

    def topic_counts(self, topic_hash: int) -> list[int]: ...

    def topic_count(self) -> int: ...

    def hour_topic_counts(self) -> Iterator[list[tuple[int, list[int]]]]: ...

    def hour_entries(self, hour: int, first: int = 0, count: int | None = None) -> list[IndexEntry]: ...

    def checkpoint(self, now_ms: int) -> CheckpointReport: ...

    def advance(self, now_ms: int) -> None: ...

    def close(self) -> None: ...


MEMBERS = [name for name in vars(DelayStore) if not name.startswith("_")]


def test_the_protocol_names_the_shared_calls():
    assert {"send", "update", "commit", "get", "read_second", "checkpoint", "close"} <= set(MEMBERS)


@pytest.mark.parametrize("implementation", [Store, InMemoryStore])
@pytest.mark.parametrize("name", MEMBERS)
def test_implementation_matches_the_protocol(implementation, name, tmp_path):
    """On an open store: some of Store's calls are its parts' own methods,
    set when it opens (`Store.send` is the placement's)."""
    wanted = list(inspect.signature(getattr(DelayStore, name)).parameters)[1:]  # (without self: bound below)
    store = Store.open(str(tmp_path), StoreConfig()) if implementation is Store else InMemoryStore()
    try:
        got = list(inspect.signature(getattr(store, name)).parameters)
    finally:
        store.close()
    assert got[:len(wanted)] == wanted, f"{implementation.__name__}.{name}{got} differs from the protocol {wanted}"
