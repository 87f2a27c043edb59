"""Fairness between tenants (docs/api.md) in broker.disk.backend.Broker,
against a model, on a real Store and a FakeClock: a fair topic whose
window (24) holds every group's share (2 of 4 groups, or a pull's batch),
messages of groups A (often a backlog of many at once), B, C and none,
some with serial keys and priorities, come due; consumers pull, ack,
nack, let ack deadlines pass, and the broker restarts. After every step:

- a group with a message a pull may take waits a round at most: until it
  is handed one, no other group is handed two (across pulls too);
- no two messages of one key are ever consuming at once, and a pull takes
  something whenever a message may be taken and the caps leave room;
- a group holds its share of the order (or a batch), plus parked ones come
  back, at most; the places remembered on disk are counted once;
- a drain (pull and ack until nothing is READY) delivers every message
  once.
"""

from __future__ import annotations

import asyncio

import hypothesis.strategies as st
from broker_harness import BrokerHarness, HarnessMachine
from fakes import FakeClock
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from test_broker_keys_model import open_broker

from broker.core.params import AckRequest, Defaults, PullRequest
from broker.disk.ready import QueueLimits
from storage.entry import MS_PER_HOUR, Status
from storage.store import NewMessage

LIMITS = QueueLimits(window=24, window_total=24, inflight=6, inflight_total=6, key_window=2, fair_window=2,
                     fair_topics=frozenset({"t"}))
MAX_BATCH = 5
DEFAULTS = Defaults()
GROUPS = ("A", "B", "C", "")
KEYS = ("k1", "k2", "", "", "")
START_MS = 490_000 * MS_PER_HOUR + 5_000
TTL_MS = 24 * MS_PER_HOUR
READY, CONSUMING, ACKED, ENDED = Status.READY, Status.CONSUMING, Status.ACKED, Status.ENDED


class FairMachine(HarnessMachine, RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.h = BrokerHarness("hourglass-fair-", START_MS, LIMITS, DEFAULTS)
        self.state: dict[str, Status] = {}
        self.key: dict[str, str] = {}
        self.group: dict[str, str] = {}
        self.deliveries: dict[str, int] = {}
        self.deadline: dict[str, int] = {}
        self.trigger: dict[str, int] = {}
        # group waiting (a message a pull may take) -> the groups handed one since it was, or was last served
        self.since: dict[str, set[str]] = {}
        self.sent = 0
        self.h.open_broker()

    def _busy(self) -> set[str]:
        return {self.key[i] for i, s in self.state.items() if s is CONSUMING and self.key[i]}

    def _pullable(self, busy: set[str]) -> list[str]:
        return [i for i, s in self.state.items() if s is READY and (not self.key[i] or self.key[i] not in busy)]

    def _in_flight(self) -> int:
        return sum(1 for s in self.state.values() if s is CONSUMING)

    @rule(group=st.sampled_from(GROUPS), copies=st.sampled_from([1, 1, 2, 30]), key=st.sampled_from(KEYS),
          priority=st.integers(-1, 1), delay_ms=st.sampled_from([0, 0, 1_000]))
    def send(self, group, copies, key, priority, delay_ms):
        now = self.clock.now_ms()
        batch = []
        for _ in range(copies):
            msg_id = f"m{self.sent}"
            self.sent += 1
            batch.append(NewMessage("t", msg_id, "x", now, now + delay_ms, TTL_MS, 100, priority, key=key,
                                    fair_key=group))
            self.state[msg_id] = READY if not delay_ms else Status.WAITING
            self.trigger[msg_id] = now + delay_ms
            self.key[msg_id], self.group[msg_id], self.deliveries[msg_id] = key, group, 0

        async def send():
            answered = await self.broker.send(batch)
            await self._quiesce()
            return answered
        assert all(m.fair_key == n.fair_key for m, n in zip(self._run(send()), batch))

    @rule(batch=st.integers(1, MAX_BATCH), ack_timeout_ms=st.sampled_from([1_000, 60_000]))
    def pull(self, batch, ack_timeout_ms):
        self._pull(batch, ack_timeout_ms)

    def _pull(self, batch: int, ack_timeout_ms: int) -> list[str]:
        busy = self._busy()
        pullable = self._pullable(busy)
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
            assert got, f"{len(pullable)} pullable messages, room {room}, and the pull took none"
        # a round at most: a group waits while it has a message this pull could hand out (not of a key it took)
        takeable = [i for i in pullable if not (self.key[i] and self.key[i] in keys)]
        handed: set[str] = set()

        def waiting() -> set[str]:
            return {self.group[i] for i in takeable if i not in handed}
        self.since = {g: self.since.get(g, set()) for g in waiting()}
        for m in got:
            assert m.fair_key == self.group[m.msg_id]
            still = waiting()
            for other, served in self.since.items():
                if other != m.fair_key and other in still:
                    assert m.fair_key not in served, \
                        f"group {m.fair_key!r} handed two while {other!r} waits: {[x.fair_key for x in got]}"
                    served.add(m.fair_key)
            self.since[m.fair_key] = set()
            handed.add(m.msg_id)
        still = waiting()
        self.since = {g: served for g, served in self.since.items() if g in still}
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
        self.state[msg_id] = ACKED if ack else READY

        async def ack_one():
            await self.broker.ack(AckRequest("t", msg_id, ack))
            await self._quiesce()
        self._run(ack_one())

    @rule(ms=st.sampled_from([500, 1_500, 61_000]))
    def time_passes(self, ms):
        target = self.clock.now_ms() + ms
        self.h.advance_to(target)
        for msg_id, s in self.state.items():
            due = self.deadline[msg_id] if s is CONSUMING else self.trigger[msg_id]
            if s in (CONSUMING, Status.WAITING) and due <= target:
                self.state[msg_id] = READY

    @rule()
    def restart(self):
        self.h.close_broker()
        self.h.open_broker()
        self.since = {}  # (the turns are RAM's: they start again)
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
            for msg_id in self._pull(MAX_BATCH, 60_000):
                self.state[msg_id] = ACKED
                self._run(self.broker.ack(AckRequest("t", msg_id, True)))
            self._run(self._quiesce())
        assert not any(s is READY for s in self.state.values()), "a drain left messages ready"
        assert all(self.deliveries[i] >= 1 for i, s in self.state.items() if s is ACKED)

    @invariant()
    def a_group_holds_its_share(self):
        queue = self.broker.topics.get("t")
        if queue is None:
            return
        assert queue.fair
        for name, group in queue.groups.items():
            assert group.ordered <= max(LIMITS.fair_window, MAX_BATCH) + LIMITS.key_window * 2, name
        assert self.broker.key_spilled_total == queue.key_spills.count + queue.fair_spills.count
        assert self.broker.key_spilled_total <= LIMITS.window_total
        assert queue.fair_spills.count == sum(len(p) for p in queue.fair_spills.places.values())


TestFairness = FairMachine.TestCase
TestFairness.settings = settings(max_examples=60, stateful_step_count=30, deadline=None,
                                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def _run_pulls(tmp_path, limits: QueueLimits, sends: list[list[NewMessage]], pulls: int, batch: int,
               turn_off: bool = False) -> list[list[str]]:
    clock = FakeClock(START_MS)

    async def body() -> list[list[str]]:
        store, broker = open_broker(str(tmp_path), clock, limits)
        broker.start()
        for batch_of in sends:
            await broker.send(batch_of)
        if turn_off:
            broker.set_fairness("t", False)
        got = []
        for _ in range(pulls):
            taken = await broker.pull(PullRequest("t", 60_000, batch, ()))
            got.append([m.msg_id for m in taken])
            for m in taken:
                await broker.ack(AckRequest("t", m.msg_id, True))
        await broker.stop()
        store.close()
        return got

    return asyncio.run(body())


def test_a_backlog_bigger_than_the_window_holds_another_group_a_round_at_most(tmp_path):
    """A's 300 due messages (window 8), then B's one: the first pull of 2
    hands out one of A's and B's. Without fairness B's waits behind A's."""
    a = [NewMessage("t", f"a{i}", "x", START_MS, START_MS, TTL_MS, 3, fair_key="A") for i in range(300)]
    b = [NewMessage("t", "b", "x", START_MS, START_MS, TTL_MS, 3, fair_key="B")]
    fair = QueueLimits(window=8, window_total=8, fair_window=2, fair_topics=frozenset({"t"}))
    assert _run_pulls(tmp_path / "fair", fair, [a, b], 1, 2) == [["a0", "b"]]
    plain = QueueLimits(window=8, window_total=8)
    assert _run_pulls(tmp_path / "plain", plain, [a, b], 1, 2) == [["a0", "a1"]]


def test_one_group_alone_still_takes_whole_batches(tmp_path):
    a = [NewMessage("t", f"a{i:03}", "x", START_MS, START_MS, TTL_MS, 3, fair_key="A") for i in range(100)]
    fair = QueueLimits(window=64, window_total=64, fair_window=2, fair_topics=frozenset({"t"}))
    got = _run_pulls(tmp_path, fair, [a], 3, 40)
    assert [len(g) for g in got] == [40, 40, 20]
    assert sorted(i for g in got for i in g) == [f"a{i:03}" for i in range(100)]


def test_fairness_turned_off_leaves_nothing_on_disk_behind(tmp_path):
    """A group's messages remembered on disk go back to the topic's scan:
    every one is still handed out."""
    a = [NewMessage("t", f"a{i:03}", "x", START_MS, START_MS, TTL_MS, 3, fair_key="A") for i in range(50)]
    b = [NewMessage("t", f"b{i:03}", "x", START_MS, START_MS, TTL_MS, 3, fair_key="B") for i in range(50)]
    fair = QueueLimits(window=8, window_total=8, fair_window=2, fair_topics=frozenset({"t"}))
    got = _run_pulls(tmp_path, fair, [a, b], 30, 5, turn_off=True)
    assert sorted(i for g in got for i in g) == sorted(m.msg_id for m in a + b)
