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

from broker.core.params import AckRequest, Defaults, DeleteRequest, Fenced, FencedRequest, NewSend, PullRequest
from broker.disk.backend import Broker
from broker.disk.ready import QueueLimits
from broker.observe.metrics import Metrics
from storage.config import StoreConfig
from storage.entry import MS_PER_HOUR, Status
from storage.store import NewMessage, Store

TOPIC = "t"  # the topic a BrokerNode's calls name
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


class BrokerNode:
    """The broker calls a test makes on one topic (TOPIC), each run to
    completion and followed by a quiesce (commits durable, woken tasks
    run): tests/unit/test_broker_lifecycle.py's and test_broker_leases.py's."""

    def __init__(self, h: BrokerHarness) -> None:
        self.h = h

    @property
    def now(self) -> int:
        return self.h.clock.now_ms()

    def _call(self, coro):
        async def call():
            result = await coro
            await self.h.quiesce()
            return result
        return self.h.run(call())

    def send(self, msg_id: str, msg: str = "m", *, delay_ms: int = 0, trigger_ms: int | None = None,
             ttl_ms: int = MS_PER_HOUR, max_retry: int = 3, priority: int = 0, tag: str = "",
             strict: bool = False, topic: str = TOPIC):
        now = self.now
        trigger = now + delay_ms if trigger_ms is None else trigger_ms
        sent, = self._call(self.h.broker.send([NewSend(NewMessage(topic, msg_id, msg, now, trigger, ttl_ms, max_retry,
                                                                  priority, tag), strict)]))
        return sent

    def pull(self, batch: int = 10, ack_timeout_ms: int = 30_000, tags: tuple[str, ...] = ()):
        return self._call(self.h.broker.pull(PullRequest(TOPIC, ack_timeout_ms, batch, tags)))

    def pulled_ids(self, **params) -> list[str]:
        return [m.msg_id for m in self.pull(**params)]

    def ack(self, msg_id: str, ack: bool = True) -> None:
        self._call(self.h.broker.ack(AckRequest(TOPIC, msg_id, ack)))

    def fenced(self, kind: Fenced, msg_ids: tuple[str, ...], deliveries: tuple[int, ...],
               ack_timeout_ms: int = 30_000, max_lease_ms: int = 12 * MS_PER_HOUR):
        """A fenced ack, nack or extension (docs/api.md, "Leases"): each id's Fencing."""
        return self._call(self.h.broker.requests.fenced(FencedRequest(TOPIC, msg_ids, deliveries, kind,
                                                                      len(msg_ids) > 1, ack_timeout_ms,
                                                                      max_lease_ms)))

    def delete(self, msg_id: str, release: bool = False) -> None:
        self._call(self.h.broker.delete(DeleteRequest(TOPIC, msg_id, release)))

    def reschedule(self, msg_id: str, trigger_ms: int):
        return self._call(self.h.broker.reschedule(TOPIC, msg_id, trigger_ms))

    def get(self, msg_id: str):
        return self._call(self.h.broker.get(TOPIC, msg_id))

    def state(self, msg_id: str) -> tuple[Status, int]:
        m = self.get(msg_id)
        return m.status, m.retry

    def info(self) -> tuple[int, int, int]:
        """(waiting, ready, consuming) as getTopicInfo counts them."""
        data = self._call(self.h.broker.topic_info(TOPIC))
        return data["waitingQueueSize"], data["readyQueueSize"], data["ackQueueSize"]

    def dead(self, *statuses: Status) -> list[str]:
        messages, cursor = self._call(self.h.broker.list_dead(TOPIC, frozenset(statuses), None, 100))
        assert cursor is None
        return [m.msg_id for m in messages]

    def advance_to(self, target_ms: int) -> None:
        self.h.advance_to(target_ms)

    def advance(self, delta_ms: int) -> None:
        self.h.advance_to(self.now + delta_ms)

    def restart(self, checkpoint: bool = False) -> None:
        self.h.restart(checkpoint)
