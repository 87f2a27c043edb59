"""The disk engine and its reference model offer the same calls."""

import inspect

import pytest
from memory_store import InMemoryStore

from storage.config import StoreConfig
from storage.protocol import DelayStore
from storage.store import Store

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
