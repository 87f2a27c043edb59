"""broker.disk.backend.Broker with small ready windows and in-flight caps,
against a model of docs/api.md's lifecycle, on a real Store and a FakeClock.

Consumers stay away while many messages of two topics come due (far more
than a window of 3, 5 over both topics), then pull, ack, nack and batch-ack
(known, unknown and repeated ids together), let ack deadlines pass, and
restart the broker (stop, close the store, reopen both; sometimes after a
checkpoint). After every step:

- RAM stays bounded: the windows hold at most `window_total` READY
  messages (plus what the last pull's batch may add), and no topic has more
  than `inflight` CONSUMING, nor all more than `inflight_total`;
- no READY message is lost: each is in its topic's window or on disk with
  the topic marked spilled from a position at or before it, and every
  CONSUMING one is held with the ack deadline the model gives it (its own
  deadline across a restart, capped at the default ack timeout from then);
- a message a send leaves on disk ranks after everything in its topic's
  window (a better-ranked arrival evicts the window's last);
- a pull hands out only messages the model has READY, each once, counting
  the delivery; it takes at least one while any is READY and the caps leave
  room, and it takes them in priority order: what stays in the window ranks
  after everything taken;
- an acked message is never delivered again; a drain pulls every READY
  message of a topic.
"""

from __future__ import annotations

from dataclasses import dataclass

import hypothesis.strategies as st
from broker_harness import BrokerHarness, HarnessMachine
from hypothesis import HealthCheck, event, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from broker.core.params import AckRequest, Defaults, PullRequest
from broker.disk.ready import QueueLimits
from storage.entry import MS_PER_HOUR, Location, Status
from storage.store import NewMessage

LIMITS = QueueLimits(window=3, window_total=5, inflight=4, inflight_total=6)
DEFAULTS = Defaults()
TOPICS = ("a", "b")
START_MS = 490_000 * MS_PER_HOUR - 20_000  # time passing crosses an hour: messages filed in two hours
TTL_MS = 24 * MS_PER_HOUR  # nothing expires while a run lasts

READY, CONSUMING, ACKED, ENDED = Status.READY, Status.CONSUMING, Status.ACKED, Status.ENDED


@dataclass
class Msg:
    msg_id: str
    topic: str
    priority: int
    trigger_ms: int
    max_retry: int
    location: Location
    state: Status = READY
    deliveries: int = 0
    deadline_ms: int = 0  # CONSUMING: when the broker times the delivery out
    pulled_deadline_ms: int = 0  # ... as the pull asked (kept on disk)

    @property
    def key(self) -> tuple[int, int, Location]:
        """The pull order's key (broker.disk.ready.HeldMessage.key)."""
        return (-self.priority, self.trigger_ms, self.location)


class BrokerWindowMachine(HarnessMachine, RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.h = BrokerHarness("hourglass-window-", START_MS, LIMITS, DEFAULTS)
        self.msgs: dict[str, Msg] = {}
        self.by_location: dict[Location, Msg] = {}
        self.sent = 0
        self.last_batch = 0
        self._open()

    # -- running the broker --------------------------------------------------------------

    def _open(self) -> None:
        self.h.open_broker()

    def _close(self) -> None:
        self.h.close_broker()

    # -- the model -------------------------------------------------------------------------

    def _in(self, topic: str, state: Status) -> list[Msg]:
        return [m for m in self.msgs.values() if m.topic == topic and m.state is state]

    def _consuming_total(self) -> int:
        return sum(1 for m in self.msgs.values() if m.state is CONSUMING)

    def _room(self, topic: str, batch: int) -> int:
        return max(0, min(batch, LIMITS.inflight - len(self._in(topic, CONSUMING)),
                          LIMITS.inflight_total - self._consuming_total()))

    def _not_acked(self, m: Msg) -> Status:
        """A delivery not acked (nack, ack timeout): READY again, or ENDED
        after max_retry + 1 deliveries."""
        return ENDED if m.deliveries > m.max_retry else READY

    # -- rules -----------------------------------------------------------------------------

    @rule(topic=st.sampled_from(TOPICS),
          specs=st.lists(st.tuples(st.integers(-2, 2), st.integers(0, 3_000), st.sampled_from([0, 1, 5])),
                         min_size=1, max_size=12))
    def send_due_now(self, topic, specs):
        """Messages due now (or a little overdue) with random priorities."""
        now = self.clock.now_ms()
        batch = []
        for priority, overdue_ms, max_retry in specs:
            batch.append(NewMessage(topic, f"{topic}{self.sent}", f"body {self.sent}", now, now - overdue_ms,
                                    TTL_MS, max_retry, priority))
            self.sent += 1

        async def send():
            answered = await self.broker.send(batch)
            await self._quiesce()
            return answered
        answered = self._run(send())
        window = [held.key for held in self.broker.topics[topic].ready.values()]
        for new, message in zip(batch, answered):
            assert message.status is READY, message
            m = Msg(new.msg_id, topic, new.priority, new.trigger_ms, new.max_retry, message.location)
            self.msgs[m.msg_id] = m
            self.by_location[m.location] = m
            if m.location not in self.broker.live:  # left on disk: it ranks after the whole window
                assert all(key < m.key for key in window), f"{m.msg_id} was spilled, a worse one kept"

    @rule(topic=st.sampled_from(TOPICS), batch=st.integers(1, 6),
          ack_timeout_ms=st.sampled_from([1_000, 5_000, 60_000]))
    def pull(self, topic, batch, ack_timeout_ms):
        self._pull(topic, batch, ack_timeout_ms)

    def _pull(self, topic: str, batch: int, ack_timeout_ms: int) -> list[Msg]:
        room, ready = self._room(topic, batch), len(self._in(topic, READY))
        now = self.clock.now_ms()

        async def pull():
            got = await self.broker.pull(PullRequest(topic, ack_timeout_ms, batch, ()))
            queue = self.broker.topics.get(topic)
            left = [held.key for held in queue.ready.values()] if queue is not None else []
            await self._quiesce()
            return got, left
        got, left_in_window = self._run(pull())
        self.last_batch = batch
        ids = [message.msg_id for message in got]
        assert len(set(ids)) == len(ids), f"a pull handed out a message twice: {ids}"
        assert len(got) <= room, f"pulled {len(got)} with room for {room} (batch {batch})"
        if room and ready:
            assert got, f"{ready} READY in {topic!r}, room for {room}, and the pull took none"
        if len(got) < min(room, ready):
            event("a pull took fewer than it had room for")
        taken = []
        for message in got:
            m = self.msgs.get(message.msg_id)
            assert m is not None and m.topic == topic, message
            assert m.state is READY, f"{m.msg_id} delivered while {m.state.name}"
            m.state, m.deliveries = CONSUMING, m.deliveries + 1
            m.deadline_ms = m.pulled_deadline_ms = now + ack_timeout_ms
            assert message.retry == m.deliveries and message.status is CONSUMING, (message, m)
            taken.append(m)
        keys = [m.key for m in taken]
        assert keys == sorted(keys), f"a pull's messages are out of priority order: {ids}"
        if keys:
            assert all(key > keys[-1] for key in left_in_window), "a better-ranked message stayed in the window"
        return taken

    @rule(topic=st.sampled_from(TOPICS), data=st.data(), ack=st.booleans())
    def ack_many(self, topic, data, ack):
        """Acks (or nacks) of ids in any state, unknown ones, ids of the other
        topic, and repeats, in one call."""
        known = sorted(self.msgs)
        in_flight = sorted(m.msg_id for m in self._in(topic, CONSUMING))
        picks = st.sampled_from(["nope", "a-x", "b-x"])
        if known:
            picks = st.one_of(st.sampled_from(known), picks)
        if in_flight:
            picks = st.one_of(st.sampled_from(in_flight), picks)
        ids = data.draw(st.lists(picks, min_size=1, max_size=8), label="msg_ids")
        if len(ids) > 1 and data.draw(st.booleans(), label="repeat one"):
            ids.append(ids[0])
        self._ack(topic, ids, ack)

    def _ack(self, topic: str, ids: list[str], ack: bool) -> None:
        expected: dict[str, Status | None] = {}
        for msg_id in ids:
            if msg_id in expected:
                continue
            m = self.msgs.get(msg_id)
            if m is None or m.topic != topic:
                expected[msg_id] = None
            elif ack and m.state in (READY, CONSUMING):
                m.state = ACKED
            elif not ack and m.state is CONSUMING:
                m.state = self._not_acked(m)
            if m is not None and m.topic == topic:
                expected[msg_id] = m.state

        async def ack_many():
            after = await self.broker.ack_many(topic, ids, ack)
            await self._quiesce()
            return after
        after = self._run(ack_many())
        assert after == [expected[msg_id] for msg_id in ids], ids

    @precondition(lambda self: any(m.state is CONSUMING for m in self.msgs.values()))
    @rule(data=st.data(), ack=st.booleans())
    def ack_in_flight(self, data, ack):
        """Single acks or nacks (Broker.ack) of messages being consumed: a
        nacked one goes back to its window, or to disk behind it."""
        topic = data.draw(st.sampled_from(sorted({m.topic for m in self.msgs.values() if m.state is CONSUMING})),
                          label="topic")
        picked = data.draw(st.lists(st.sampled_from(sorted(m.msg_id for m in self._in(topic, CONSUMING))),
                                    min_size=1, max_size=4, unique=True), label="msg_ids")
        for msg_id in picked:
            m = self.msgs[msg_id]
            m.state = ACKED if ack else self._not_acked(m)

        async def acks():
            for msg_id in picked:
                await self.broker.ack(AckRequest(topic, msg_id, ack))
            await self._quiesce()
        self._run(acks())

    @rule(ms=st.sampled_from([200, 1_000, 5_000, 30_000, 61_000]))
    def time_passes(self, ms):
        """Ack deadlines pass: READY again, or ENDED after the last retry."""
        target = self.clock.now_ms() + ms

        async def advance():
            await self.clock.run_until(target)
            await self._quiesce()
        self._run(advance())
        for m in self.msgs.values():
            if m.state is CONSUMING and m.deadline_ms <= target:
                m.state = self._not_acked(m)

    @rule(checkpoint_first=st.booleans())
    def restart(self, checkpoint_first):
        if checkpoint_first:
            now = self.clock.now_ms()

            async def checkpoint():
                prepared = await self.broker.commits.at_quiet_point(lambda: self.store.prepare_checkpoint(now))
                self.store.sync_checkpoint()
                self.store.finish_checkpoint(prepared)
            self._run(checkpoint())
        self._close()
        self._open()
        fresh = self.clock.now_ms() + DEFAULTS.ack_timeout_ms
        for m in self.msgs.values():
            if m.state is CONSUMING:  # the pull's deadline, capped by the default ack timeout from this restart
                m.deadline_ms = min(m.pulled_deadline_ms, fresh)

    @precondition(lambda self: self.msgs)
    @rule(topic=st.sampled_from(TOPICS))
    def drain(self, topic):
        """Ack what is in flight, then pull and ack until nothing is READY:
        every READY message comes out, each once."""
        consuming = [m.msg_id for m in self._in(topic, CONSUMING)]
        if consuming:
            self._ack(topic, consuming, True)
        seen: set[str] = set()
        for _ in range(len(self.msgs) + 2):
            if not self._in(topic, READY):
                break
            taken = self._pull(topic, LIMITS.inflight, 60_000)
            assert not seen & {m.msg_id for m in taken}
            seen |= {m.msg_id for m in taken}
            self._ack(topic, [m.msg_id for m in taken], True)
        assert not self._in(topic, READY)
        got = self._run(self.broker.pull(PullRequest(topic, 60_000, 10, ())))
        assert got == [], "a drained topic delivered again"

    # -- invariants ------------------------------------------------------------------------

    @invariant()
    def ram_is_bounded(self):
        broker = self.broker
        windows = sum(len(q.ready) for q in broker.topics.values())
        assert windows == broker.window_total
        assert windows <= LIMITS.window_total + self.last_batch
        for q in broker.topics.values():
            assert len(q.ready) <= LIMITS.window + self.last_batch, q.name
            assert len(q.flying) <= LIMITS.inflight, q.name
        assert broker.consuming_total == sum(len(q.flying) for q in broker.topics.values())
        assert broker.consuming_total <= LIMITS.inflight_total
        assert len(broker.live) == broker.window_total + broker.consuming_total

    @invariant()
    def ram_agrees_with_the_model(self):
        broker = self.broker
        for location, live in broker.live.items():
            m = self.by_location[location]
            assert live.status is m.state, (m, live)
            if m.state is CONSUMING:
                assert live.deadline_ms == m.deadline_ms, (m, live)
        for topic in TOPICS:
            queue = broker.topics.get(topic)
            consuming = self._in(topic, CONSUMING)
            assert (set(queue.flying) if queue else set()) == {m.msg_id for m in consuming}, topic
            for m in consuming:
                assert m.location in broker.live, f"{m.msg_id} is CONSUMING but not held: it would never time out"
            for m in self._in(topic, READY):
                if m.location in broker.live:
                    continue
                # on disk only: a refill must still reach it
                assert queue is not None and queue.spilled and queue.scan is not None, (m, queue)
                assert queue.scan <= m.location, (m, queue.scan)

    @invariant()
    def store_agrees_with_the_model(self):
        for m in self.msgs.values():
            stored = self.store.get(m.topic, m.msg_id)
            assert stored.status is m.state, (m, stored)
            assert stored.retry == m.deliveries, (m, stored)


BrokerWindowMachine.TestCase.settings = settings(
    max_examples=25, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestBrokerWindowAgainstModel = BrokerWindowMachine.TestCase
