"""The disk engine and its reference model offer the same calls."""

import inspect

import pytest
from memory_store import InMemoryStore

from storage.protocol import DelayStore
from storage.store import Store

MEMBERS = [name for name in vars(DelayStore) if not name.startswith("_")]


def test_the_protocol_names_the_shared_calls():
    assert {"send", "update", "commit", "get", "read_second", "checkpoint", "close"} <= set(MEMBERS)


@pytest.mark.parametrize("implementation", [Store, InMemoryStore])
@pytest.mark.parametrize("name", MEMBERS)
def test_implementation_matches_the_protocol(implementation, name):
    wanted = list(inspect.signature(getattr(DelayStore, name)).parameters)
    got = list(inspect.signature(getattr(implementation, name)).parameters)
    assert got[:len(wanted)] == wanted, f"{implementation.__name__}.{name}{got} differs from the protocol {wanted}"
