"""Serial keys (docs/api.md, Tags and serial keys) in broker.disk.backend.Broker,
against a model, on a real Store and a FakeClock: messages of three keys (and none) come due in
a small window (4, at most 2 of one key), consumers pull, ack, nack, let
ack deadlines pass, and the broker restarts. After every step:

- no two messages of one key are ever consuming at once (a pull never
  hands out a message whose key is busy, nor two of one key);
- a pull takes something whenever a READY message of a free key (or of no
  key) exists and the caps leave room: a busy key never blocks the others,
  even when it has far more ready messages than the window holds;
- the window never holds more than `key_window` messages of one key;
- a drain (pull and ack until nothing is READY) delivers every message
  once.
"""

from __future__ import annotations

import asyncio
import os

import hypothesis.strategies as st
from broker_harness import CONFIG, BrokerHarness, HarnessMachine
from fakes import FakeClock
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from broker.core.params import AckRequest, Defaults, PullRequest
from broker.disk.backend import Broker
from broker.disk.ready import QueueLimits
from broker.observe.metrics import Metrics
from storage.entry import MS_PER_HOUR, Status
from storage.store import NewMessage, Store

LIMITS = QueueLimits(window=4, window_total=4, inflight=5, inflight_total=5, key_window=2)
DEFAULTS = Defaults()
KEYS = ("k1", "k2", "k3", "")
START_MS = 490_000 * MS_PER_HOUR + 5_000
TTL_MS = 24 * MS_PER_HOUR
READY, CONSUMING, ACKED, ENDED = Status.READY, Status.CONSUMING, Status.ACKED, Status.ENDED


def open_broker(directory: str, clock: FakeClock, limits: QueueLimits = LIMITS) -> tuple[Store, Broker]:
    store = Store.open(directory, CONFIG, now_ms=clock.now_ms())
    return store, Broker(store, clock, DEFAULTS, Metrics(), tick_path=os.path.join(directory, "tick"),
                         limits=limits)


class KeyMachine(HarnessMachine, RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.h = BrokerHarness("hourglass-keys-", START_MS, LIMITS, DEFAULTS)
        self.state: dict[str, Status] = {}
        self.key: dict[str, str] = {}
        self.deliveries: dict[str, int] = {}
        self.max_retry: dict[str, int] = {}
        self.deadline: dict[str, int] = {}
        self.sent = 0
        self.h.open_broker()

    def _busy(self) -> set[str]:
        return {self.key[i] for i, s in self.state.items() if s is CONSUMING and self.key[i]}

    def _pullable(self) -> int:
        busy = self._busy()
        return sum(1 for i, s in self.state.items() if s is READY and (not self.key[i] or self.key[i] not in busy))

    def _in_flight(self) -> int:
        return sum(1 for s in self.state.values() if s is CONSUMING)

    def _not_acked(self, msg_id: str) -> Status:
        return ENDED if self.deliveries[msg_id] > self.max_retry[msg_id] else READY

    @rule(specs=st.lists(st.tuples(st.sampled_from(KEYS), st.integers(-2, 2), st.sampled_from([0, 3])),
                         min_size=1, max_size=10))
    def send(self, specs):
        now = self.clock.now_ms()
        batch = []
        for key, priority, max_retry in specs:
            msg_id = f"m{self.sent}"
            self.sent += 1
            batch.append(NewMessage("t", msg_id, "x", now, now, TTL_MS, max_retry, priority, key=key))
            self.state[msg_id], self.key[msg_id], self.deliveries[msg_id] = READY, key, 0
            self.max_retry[msg_id] = max_retry

        async def send():
            answered = await self.broker.send(batch)
            await self._quiesce()
            return answered
        assert all(m.status is READY and m.key == n.key for m, n in zip(self._run(send()), batch))

    @rule(batch=st.integers(1, 5), ack_timeout_ms=st.sampled_from([1_000, 60_000]))
    def pull(self, batch, ack_timeout_ms):
        self._pull(batch, ack_timeout_ms)

    def _pull(self, batch: int, ack_timeout_ms: int) -> list[str]:
        busy, pullable = self._busy(), self._pullable()
        room = min(batch, LIMITS.inflight - self._in_flight())
        now = self.clock.now_ms()

        async def pull():
            got = await self.broker.pull(PullRequest("t", ack_timeout_ms, batch, ()))
            await self._quiesce()
            return got
        got = self._run(pull())
        keys = [m.key for m in got if m.key]
        assert len(keys) == len(set(keys)), f"one pull handed out two messages of one key: {keys}"
        assert not busy & set(keys), f"a pull handed out a message of a busy key: {keys} (busy {busy})"
        if room > 0 and pullable:
            assert got, f"{pullable} pullable messages, room {room}, and the pull took none (busy keys {busy})"
        for m in got:
            assert self.state[m.msg_id] is READY, (m.msg_id, self.state[m.msg_id])
            self.state[m.msg_id] = CONSUMING
            self.deliveries[m.msg_id] += 1
            self.deadline[m.msg_id] = now + ack_timeout_ms
        return [m.msg_id for m in got]

    @precondition(lambda self: any(s is CONSUMING for s in self.state.values()))
    @rule(data=st.data(), ack=st.booleans())
    def ack(self, data, ack):
        msg_id = data.draw(st.sampled_from(sorted(i for i, s in self.state.items() if s is CONSUMING)))
        self.state[msg_id] = ACKED if ack else self._not_acked(msg_id)

        async def ack_one():
            await self.broker.ack(AckRequest("t", msg_id, ack))
            await self._quiesce()
        self._run(ack_one())

    @rule(ms=st.sampled_from([500, 1_500, 61_000]))
    def time_passes(self, ms):
        target = self.clock.now_ms() + ms

        async def advance():
            await self.clock.run_until(target)
            await self._quiesce()
        self._run(advance())
        for msg_id, s in self.state.items():
            if s is CONSUMING and self.deadline[msg_id] <= target:
                self.state[msg_id] = self._not_acked(msg_id)

    @rule()
    def restart(self):
        self.h.close_broker()
        self.h.open_broker()
        fresh = self.clock.now_ms() + DEFAULTS.ack_timeout_ms
        for msg_id, s in self.state.items():
            if s is CONSUMING:
                self.deadline[msg_id] = min(self.deadline[msg_id], fresh)

    @precondition(lambda self: self.state)
    @rule()
    def drain(self):
        for msg_id in [i for i, s in self.state.items() if s is CONSUMING]:
            self.state[msg_id] = ACKED
            self._run(self.broker.ack(AckRequest("t", msg_id, True)))
        self._run(self._quiesce())
        for _ in range(len(self.state) + 2):
            if not any(s is READY for s in self.state.values()):
                break
            taken = self._pull(LIMITS.inflight, 60_000)
            for msg_id in taken:
                self.state[msg_id] = ACKED
                self._run(self.broker.ack(AckRequest("t", msg_id, True)))
            self._run(self._quiesce())
        assert not any(s is READY for s in self.state.values()), "a drain left messages ready"

    @invariant()
    def the_window_is_bounded_per_key(self):
        queue = self.broker.topics.get("t")
        if queue is None:
            return
        assert len(queue.ready) <= LIMITS.window + LIMITS.inflight
        for key, held in queue.by_key.items():
            assert len(held) <= LIMITS.key_window, key
        assert queue.parked <= LIMITS.window
        assert self.broker.key_spilled_total == queue.key_spills.count <= LIMITS.window_total
        assert queue.key_spills.count == sum(len(places) for places in queue.key_spills.places.values())
        assert queue.parked == self.broker.parked_total == sum(
            len(held) for key, held in queue.by_key.items() if key in queue.busy)
        busy = {live.serial_key for live in self.broker.live.values()
                if live.status is CONSUMING and live.serial_key}
        assert set(queue.busy) == busy


TestKeys = KeyMachine.TestCase
TestKeys.settings = settings(max_examples=60, stateful_step_count=30, deadline=None,
                             suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def test_a_hot_key_does_not_starve_the_others(tmp_path):
    """200 ready messages of one key and one each of five others, a window
    of 4: the first pull takes one of the hot key and every other key's."""
    clock = FakeClock(START_MS)

    async def body() -> list[str]:
        store, broker = open_broker(str(tmp_path), clock, QueueLimits(window=4, window_total=4, inflight=20,
                                                                      inflight_total=20, key_window=2))
        broker.start()
        hot = [NewMessage("t", f"hot{i}", "x", START_MS, START_MS, TTL_MS, 3, 5, key="hot") for i in range(200)]
        cold = [NewMessage("t", f"cold{i}", "x", START_MS, START_MS, TTL_MS, 3, 0, key=f"c{i}") for i in range(5)]
        await broker.send(hot)
        await broker.send(cold)
        got = [m.msg_id for m in await broker.pull(PullRequest("t", 60_000, 10, ()))]
        got += [m.msg_id for m in await broker.pull(PullRequest("t", 60_000, 10, ()))]
        await broker.stop()
        store.close()
        return got

    got = asyncio.run(body())
    assert got[0] == "hot0" and sorted(got[1:]) == [f"cold{i}" for i in range(5)], got
