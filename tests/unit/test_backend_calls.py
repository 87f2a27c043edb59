"""Both backends expose the Backend protocol's calls the same way: each is
a method of one of the backend's parts (requests, dead letters, bulk,
topics), bound once when the backend is built, so a request enters its
part with no forwarding frame between (broker.backend.Backend;
docs/internals.md, "A send, part by part")."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest
from fakes import FakeClock

from broker.backend import Backend
from broker.core.params import Defaults, NewSend
from broker.disk.backend import Broker
from broker.observe.metrics import Metrics
from broker.redis.backend import RedisBroker
from storage.config import StoreConfig
from storage.entry import Status
from storage.errors import InvalidRequest
from storage.store import NewMessage, Store

START_MS = 490_000 * 3_600_000

# The protocol's calls, its lifetime's left out (wake_all, begin_stop, stop).
CALLS = sorted(name for name, member in vars(Backend).items()
               if callable(member) and not name.startswith("_") and name not in ("wake_all", "begin_stop", "stop"))


def unbound(backend: Any) -> dict[str, str]:
    """The calls the backend answers in a frame of its own (a forwarder):
    each with what it is. (A compiled build's objects have no __dict__:
    what a call is bound to is what tells.)"""
    out = {}
    for name in CALLS:
        call = getattr(backend, name)
        owner = getattr(call, "__self__", None)
        if owner is None or owner is backend:
            out[name] = repr(call)
    return out


def test_the_calls_are_found() -> None:
    assert {"send", "pull", "long_poll", "ack", "list_dead", "list_msgs", "topic_info", "topic_backlogs"} <= set(CALLS)


def test_the_disk_broker_binds_the_backends_calls_to_its_parts(tmp_path) -> None:
    clock = FakeClock(START_MS)
    store = Store.open(str(tmp_path), StoreConfig(), now_ms=clock.now_ms())
    try:
        broker = Broker(store, clock, Defaults(), Metrics(), tick_path=os.path.join(tmp_path, "tick"))
        assert unbound(broker) == {}
    finally:
        store.close()


def test_the_redis_broker_binds_the_backends_calls_to_its_parts() -> None:
    broker = RedisBroker.from_url("redis://127.0.0.1:1/0", FakeClock(START_MS), Defaults(), Metrics())
    assert unbound(broker) == {}


def test_the_disk_brokers_send_takes_a_bare_new_message_at_the_clocks_now(tmp_path) -> None:
    """What the disk broker's `send` did before it entered `Requests` at
    once: a bare NewMessage is a send that is not strict, checked (a bad one
    stores nothing) and stored at the clock's now (due: READY at once)."""
    clock = FakeClock(START_MS)
    store = Store.open(str(tmp_path), StoreConfig(), now_ms=clock.now_ms())

    async def body() -> None:
        broker = Broker(store, clock, Defaults(), Metrics(), tick_path=os.path.join(tmp_path, "tick"))
        broker.start()
        try:
            with pytest.raises(InvalidRequest):
                await broker.send([NewMessage("t", "a", "x", START_MS, START_MS, 60_000, 2),
                                   NewMessage("t", "b", "x", START_MS, START_MS, -1, 2)])
            assert broker.topic_list() == []
            due, later = await broker.send([NewMessage("t", "a", "x", START_MS, START_MS, 60_000, 2),
                                            NewMessage("t", "b", "x", START_MS, START_MS + 1, 60_000, 2)])
            assert (due.status, later.status) == (Status.READY, Status.WAITING)
            again, = await broker.send([NewSend(NewMessage("t", "a", "y", START_MS, START_MS, 60_000, 2), False)])
            assert again.msg == "x"  # alive: the stored one answered
        finally:
            await broker.stop()
            store.close()

    asyncio.run(body())
