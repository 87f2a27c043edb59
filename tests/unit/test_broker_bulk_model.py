"""The disk broker's bulk calls (broker.disk.bulk: listMsg, deleteMsgs,
rescheduleMsgs) against a model, on a real Store and a FakeClock.

Sends with keys, tags and trigger times from due now to hours ahead; time
passes (the wheel releases, ack deadlines pass); pulls and acks; lists
(every page, in (trigger time, msgId) order) and counts with random
filters; bulk deletes and bulk reschedules with random filters and
limits; restarts (with a checkpoint or replaying the log). After every
step:

- a list answers exactly the model's matches, in order, a page at a time;
  a count their number;
- a delete ends min(limit, matches) of the live matches (DELETED), `more`
  exactly when matches were left, and changes nothing else;
- a reschedule moves min(limit, matches) of the waiting and ready matches
  to their new trigger times, and nothing else;
- a pull hands out only messages the model has READY (a deleted or moved
  message never at its old place), and an ack of a deleted message
  changes nothing;
- the store's status and trigger time of every message are the model's.
"""

from __future__ import annotations

from dataclasses import dataclass

import hypothesis.strategies as st
from broker_harness import BrokerHarness, HarnessMachine
from hypothesis import HealthCheck, event, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from broker.core.bulk_params import LIVE, BulkFilter, DeleteMsgsRequest, ListMsgRequest, RescheduleMsgsRequest, parse_cursor
from broker.core.params import AckRequest, Defaults, PullRequest
from broker.disk.ready import QueueLimits
from storage.entry import MS_PER_HOUR, Status
from storage.store import NewMessage

TOPIC = "t"
START_MS = 490_000 * MS_PER_HOUR - 20_000
TTL_MS = 48 * MS_PER_HOUR  # nothing expires while a run lasts
DEFAULTS = Defaults()
KEYS = ("", "k1", "k2")
TAGS = ("", "x", "y")

WAITING, READY, CONSUMING, ACKED, DELETED = (Status.WAITING, Status.READY, Status.CONSUMING, Status.ACKED,
                                             Status.DELETED)


@dataclass
class Msg:
    msg_id: str
    key: str
    tag: str
    trigger_ms: int
    state: Status = WAITING  # WAITING stands for "waiting or ready": the time decides
    deadline_ms: int = 0  # CONSUMING: when the broker times the delivery out
    pulled_deadline_ms: int = 0  # ... as the pull asked (kept on disk)

    def status(self, now_ms: int) -> Status:
        if self.state is WAITING:
            return READY if self.trigger_ms <= now_ms else WAITING
        return self.state


filters = st.builds(
    lambda key, tag, prefix, statuses, lo, span: BulkFilter(
        key or None, tag or None, prefix or None, frozenset(statuses) if statuses else LIVE,
        None if lo is None else START_MS + lo, None if lo is None or span is None else START_MS + lo + span),
    st.sampled_from(("", "", *KEYS)), st.sampled_from(("", "", *TAGS)), st.sampled_from(("", "", "a", "b1")),
    st.one_of(st.just(set()), st.sets(st.sampled_from(list(Status)), min_size=1, max_size=4)),
    st.one_of(st.none(), st.none(), st.integers(-60_000, 4 * MS_PER_HOUR)),
    st.one_of(st.none(), st.integers(1, 2 * MS_PER_HOUR)))


class BulkMachine(HarnessMachine, RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.h = BrokerHarness("hourglass-bulk-", START_MS, QueueLimits(), DEFAULTS)
        self.msgs: dict[str, Msg] = {}
        self.sent = 0
        self.h.open_broker()

    def _now(self) -> int:
        return self.clock.now_ms()

    def _matches(self, flt: BulkFilter) -> list[Msg]:
        now = self._now()
        out = [m for m in self.msgs.values()
               if m.status(now) in flt.statuses and flt.in_range(m.trigger_ms)
               and (flt.key is None or m.key == flt.key) and (flt.tag is None or m.tag == flt.tag)
               and (flt.msg_id_prefix is None or m.msg_id.startswith(flt.msg_id_prefix))]
        return sorted(out, key=lambda m: (m.trigger_ms, m.msg_id))

    # -- rules -----------------------------------------------------------------------------

    @rule(specs=st.lists(st.tuples(st.sampled_from(("a", "b")), st.sampled_from(KEYS), st.sampled_from(TAGS),
                                   st.sampled_from((-5_000, 0, 3_000, 30_000, 2 * MS_PER_HOUR, 40 * MS_PER_HOUR))),
                         min_size=1, max_size=8))
    def send(self, specs):
        now = self._now()
        batch = []
        for letter, key, tag, delay_ms in specs:
            msg_id = f"{letter}{self.sent}"
            self.sent += 1
            batch.append(NewMessage(TOPIC, msg_id, "m", now, max(now + delay_ms, 0), TTL_MS, 100, 0, tag, key))

        async def send():
            await self.broker.send(batch)
            await self._quiesce()
        self._run(send())
        for n in batch:
            self.msgs[n.msg_id] = Msg(n.msg_id, n.key, n.tag, n.trigger_ms)

    @rule(ms=st.sampled_from([500, 4_000, 20_000, 61_000]))
    def time_passes(self, ms):
        target = self._now() + ms
        self.h.advance_to(target)
        for m in self.msgs.values():
            if m.state is CONSUMING and m.deadline_ms <= target:
                m.state = WAITING  # READY again (its trigger time has passed)

    @rule(batch=st.integers(1, 5), ack_timeout_ms=st.sampled_from([10_000, 3_600_000]))
    def pull(self, batch, ack_timeout_ms):
        now = self._now()

        async def pull():
            got = await self.broker.pull(PullRequest(TOPIC, ack_timeout_ms, batch, ()))
            await self._quiesce()
            return got
        for message in self._run(pull()):
            m = self.msgs[message.msg_id]
            assert m.status(now) is READY, f"{m.msg_id} delivered while {m.status(now).name}"
            m.state, m.deadline_ms = CONSUMING, now + ack_timeout_ms
            m.pulled_deadline_ms = m.deadline_ms

    @precondition(lambda self: self.msgs)
    @rule(data=st.data())
    def ack(self, data):
        m = data.draw(st.sampled_from(sorted(self.msgs.values(), key=lambda m: m.msg_id)))

        async def ack():
            await self.broker.ack(AckRequest(TOPIC, m.msg_id, True))
            await self._quiesce()
        before = m.status(self._now())
        self._run(ack())
        if before in LIVE:
            m.state = ACKED

    @rule(flt=filters, limit=st.integers(1, 4), via_count=st.booleans())
    def list_pages(self, flt, limit, via_count):
        want = [m.msg_id for m in self._matches(flt)]
        if via_count:
            assert self._run(self.broker.count_msgs(TOPIC, flt)) == len(want)
            return
        got, cursor, pages = [], None, 0
        while True:
            page, text = self._run(self.broker.list_msgs(ListMsgRequest(TOPIC, flt, cursor, limit, False)))
            assert len(page) <= limit
            got += [m.msg_id for m in page]
            pages += 1
            if text is None:
                break
            assert len(page) == limit and pages < 100
            cursor = parse_cursor(text)
        assert got == want
        event("a list of several pages" if pages > 1 else "a list of one page")

    @rule(flt=filters, limit=st.integers(1, 6))
    def delete(self, flt, limit):
        flt = flt.narrowed(LIVE)
        matches = self._matches(flt)

        async def delete():
            answer = await self.broker.delete_msgs(DeleteMsgsRequest(TOPIC, flt, limit))
            await self._quiesce()
            return answer
        deleted, more = self._run(delete())
        assert deleted == min(limit, len(matches)) and more == (len(matches) > limit)
        event("a delete ended some" if deleted else "a delete matched none")
        gone = {m.msg_id for m in matches if self.store.get(TOPIC, m.msg_id).status is DELETED}
        assert len(gone) == deleted
        for m in matches:
            if m.msg_id in gone:
                m.state = DELETED

    @rule(flt=filters, limit=st.integers(1, 6),
          shift_ms=st.sampled_from([-3 * MS_PER_HOUR, -10_000, 5_000, MS_PER_HOUR]))
    def reschedule(self, flt, limit, shift_ms):
        flt = flt.narrowed(frozenset((WAITING, READY)))
        matches = self._matches(flt)
        old = {m.msg_id: m.trigger_ms for m in matches}

        async def move():
            answer = await self.broker.reschedule_msgs(RescheduleMsgsRequest(TOPIC, flt, limit, shift_ms, None))
            await self._quiesce()
            return answer
        moved, more = self._run(move())
        assert moved == min(limit, len(matches)) and more == (len(matches) > limit)
        event("a reschedule moved some" if moved else "a reschedule matched none")
        count = 0
        for m in matches:
            now_trigger = self.store.get(TOPIC, m.msg_id).trigger_ms
            if now_trigger != old[m.msg_id]:
                assert now_trigger == max(old[m.msg_id] + shift_ms, 0)
                m.trigger_ms = now_trigger
                count += 1
        assert count == moved or shift_ms == 0

    @rule(checkpoint_first=st.booleans())
    def restart(self, checkpoint_first):
        if checkpoint_first:
            now = self._now()

            async def checkpoint():
                prepared = await self.broker.commits.at_quiet_point(lambda: self.store.prepare_checkpoint(now))
                self.store.sync_checkpoint()
                self.store.finish_checkpoint(prepared)
            self._run(checkpoint())
        self.h.restart()
        fresh = self._now() + DEFAULTS.ack_timeout_ms
        for m in self.msgs.values():
            if m.state is CONSUMING:
                m.deadline_ms = min(m.pulled_deadline_ms, fresh)  # the pull's, capped from this restart

    @invariant()
    def store_agrees_with_the_model(self):
        now = self._now()
        for m in self.msgs.values():
            stored = self.store.get(TOPIC, m.msg_id)
            assert stored is not None, m
            want = m.status(now)
            if want in (WAITING, READY) and abs(m.trigger_ms - now) < 2_000:
                assert stored.status in (WAITING, READY), (m, stored)  # at its release
            else:
                assert stored.status is want, (m, stored, now)
            assert stored.trigger_ms == m.trigger_ms, (m, stored)


BulkMachine.TestCase.settings = settings(
    max_examples=40, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestBulkAgainstModel = BulkMachine.TestCase
