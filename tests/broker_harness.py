"""A Broker on a real Store, a FakeClock and an event loop of its own, for
the stateful model tests (tests/unit/test_broker_*_model.py) and the
lifecycle tests (tests/unit/test_broker_lifecycle.py): open, settle, let
time pass, restart and close it from synchronous test code."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile

from fakes import FakeClock

from broker.core.params import Defaults
from broker.disk.backend import Broker
from broker.disk.ready import QueueLimits
from broker.observe.metrics import Metrics
from storage.config import StoreConfig
from storage.store import Store

CONFIG = StoreConfig(segment_bytes=64 * 1024, id_shard_initial_slots=16)
SCRATCH_DIR = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None


class BrokerHarness:
    """Holds `store` and `broker` (opened by `open_broker`); `run` drives a
    coroutine on the harness's loop; `quiesce` lets the broker's tasks
    (commits, timers, refills) run until idle; `advance_to` lets the fake
    time pass (every wheel release and timer on the way fires at its
    time); `restart` stops the broker, closes the store (after a
    checkpoint, or not: recovery then replays the commit log) and opens
    both again on the same directory."""

    def __init__(self, prefix: str, start_ms: int, limits: QueueLimits, defaults: Defaults) -> None:
        self.directory = tempfile.mkdtemp(prefix=prefix, dir=SCRATCH_DIR)
        self.loop = asyncio.new_event_loop()
        self.clock = FakeClock(start_ms)
        self.clock.watch_threads(self.loop)  # settle waits for fsyncs run in threads
        self.limits, self.defaults = limits, defaults
        self.store: Store | None = None
        self.broker: Broker | None = None

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    def open_broker(self) -> None:
        self.store = Store.open(self.directory, CONFIG, now_ms=self.clock.now_ms())
        self.broker = Broker(self.store, self.clock, self.defaults, Metrics(),
                             tick_path=os.path.join(self.directory, "tick"), limits=self.limits)

        async def start():
            self.broker.start()
            await self.quiesce()
        self.run(start())

    async def quiesce(self) -> None:
        for _ in range(3):
            await self.clock.settle()
            await self.broker.commits.flush()
        await self.clock.settle()

    def close_broker(self, checkpoint: bool = False) -> None:
        """Stop the broker and close the store; `checkpoint` first takes the
        last checkpoint a graceful stop of the server takes."""
        self.run(self.broker.stop())
        if checkpoint:
            self.store.checkpoint(self.clock.now_ms())
        self.store.close()

    def restart(self, checkpoint: bool = False) -> None:
        self.close_broker(checkpoint)
        self.open_broker()

    def advance_to(self, target_ms: int) -> None:
        async def advance():
            await self.clock.run_until(target_ms)
            await self.quiesce()
        self.run(advance())

    def teardown(self) -> None:
        try:
            if self.broker is not None:
                self.close_broker()
        finally:
            self.loop.run_until_complete(self.loop.shutdown_default_executor())
            self.loop.close()
            shutil.rmtree(self.directory, ignore_errors=True)


class HarnessMachine:
    """A stateful test's view of its `BrokerHarness` (`self.h`): mix in
    before RuleBasedStateMachine."""

    h: BrokerHarness

    @property
    def clock(self) -> FakeClock:
        return self.h.clock

    @property
    def broker(self) -> Broker:
        return self.h.broker

    @property
    def store(self) -> Store:
        return self.h.store

    def _run(self, coro):
        return self.h.run(coro)

    async def _quiesce(self) -> None:
        await self.h.quiesce()

    def teardown(self) -> None:
        self.h.teardown()
