"""broker.schedules.keeper on a disk Broker (real Store, FakeClock), against a model
of docs/api.md's "Recurring schedules": schedules put (created, replaced
with the right or a wrong version), paused, resumed and deleted, time
passing while the node runs, and restarts, some after a downtime in which
runs came due (misfire skip, once, all with maxCatchUp, within and past
misfireGraceMillis). A consumer pulls every READY run after each step.

The same machine runs over a cluster's store (broker.cluster.schedules:
the Raft group's entries, a FakeElection's here), a restart being the next
leader reading what the last one committed.

The model, per schedule (everyMillis, started at its put: nominal times
put + k * every): the one pending run; a release on time delivers it and
makes the next; a release after a downtime is late by (restart time -
nominal) and, past the grace, skip ends it unseen, once delivers it and
goes on after now, all delivers up to maxCatchUp runs in a row, then goes
on after now. After every step the runs delivered are exactly the model's
(each once, none missing), the schedules' versions, paused flags and next
fire times are the model's, and `--max-schedules` holds. A schedule owns
its progress: a pending run deleted (deleteMsg, deleteMsgs by a filter, a
purge) is never delivered, and its schedule's next run is made at once,
the run after it (counted in `runs`, against `limit`).

The topic is paused and resumed too (broker.flow's TopicFlow, each
`onResume`): while paused, a run that falls due is held back waiting and
no later run is made; the resume releases it then, judged by the misfire
rule against the resume time as a restart's release is (the model's same
`release_due`), whatever `onResume` -- across restarts during the pause.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import hypothesis.strategies as st
from broker_harness import CONFIG, BrokerHarness, HarnessMachine
from fakes import FakeElection
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from broker.cluster.schedules import RaftScheduleStore
from broker.core.bulk_params import BulkFilter, DeleteMsgsRequest
from broker.core.params import Defaults, DeleteRequest, PullRequest
from broker.core.recurrence import Misfire, parse_run_msg_id
from broker.disk.backend import Broker
from broker.disk.ready import QueueLimits
from broker.flow.file import SettingsFile, settings_path
from broker.flow.keeper import HeldRuns, TopicFlow
from broker.flow.settings import OnResume, PauseRequest
from broker.observe.metrics import Metrics
from broker.schedules.file import ScheduleFile
from broker.schedules.keeper import ScheduleLimits, Schedules, ScheduleStore
from broker.schedules.params import ScheduleSpec
from storage.entry import MS_PER_HOUR, Location
from storage.errors import Conflict, LimitReached, NotFound
from storage.store import Store

TOPIC = "t"
IDS = ("a", "b", "c", "d")
MAX_SCHEDULES = 3
START_MS = 490_000 * MS_PER_HOUR - 30_000
GRACE_MS = 5_000


@dataclass
class Model:
    every_ms: int
    start_ms: int
    misfire: Misfire
    max_catch_up: int
    limit: int | None
    version: int = 1
    paused: bool = False
    pending: int | None = None
    runs: int = 0
    catch_up: int = 0
    delivered: list[int] = field(default_factory=list)

    def first_after(self, ms: int) -> int:
        k = max(1, (ms - self.start_ms) // self.every_ms + 1)
        return self.start_ms + k * self.every_ms

    def make(self, nominal: int | None) -> None:
        if nominal is not None and self.limit is not None and self.runs >= self.limit:
            nominal = None
        self.pending = nominal
        if nominal is not None:
            self.runs += 1

    def release_due(self, now_ms: int) -> None:
        """Every run due by now_ms, each released at max(its time, now_ms's
        moment of release): on time while the node runs (`now_ms` = the
        nominal time itself), or at a restart."""
        while self.pending is not None and self.pending <= now_ms:
            nominal = self.pending
            late = now_ms - nominal
            if late <= GRACE_MS:
                self.delivered.append(nominal)
                self.catch_up = 0
                self.make(nominal + self.every_ms)
            elif self.misfire is Misfire.ALL and self.catch_up + 1 < self.max_catch_up:
                self.delivered.append(nominal)
                self.catch_up += 1
                self.make(nominal + self.every_ms)
            else:
                if self.misfire is not Misfire.SKIP:
                    self.delivered.append(nominal)
                self.catch_up = 0
                self.make(self.first_after(now_ms))


class GoneBeforeRelease:
    """The schedules as a resume sees them when the node is gone right
    after the gate opened: the shift or expire leaves their held runs out
    as ever, and their release never happens."""

    def __init__(self, runs: HeldRuns) -> None:
        self.runs = runs

    def held_places(self, topic: str, key: str | None) -> frozenset[Location]:
        return self.runs.held_places(topic, key)

    async def resumed(self, topic: str, key: str | None) -> int:
        return 0


class SchedulesMachine(HarnessMachine, RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.h = BrokerHarness("hourglass-schedules-", START_MS, QueueLimits(), Defaults())
        self.path = os.path.join(self.h.directory, "schedules")
        self.schedules: Schedules | None = None
        self.models: dict[str, Model] = {}
        self.delivered: dict[str, list[int]] = {sid: [] for sid in IDS}
        self.topic_paused = False
        self._open()

    # -- the node ------------------------------------------------------------------------

    def _open(self) -> None:
        h = self.h
        h.store = Store.open(h.directory, CONFIG, now_ms=self.clock.now_ms())
        h.broker = Broker(h.store, self.clock, h.defaults, Metrics(), tick_path=os.path.join(h.directory, "tick"),
                          limits=h.limits)
        self.schedules = Schedules(self._store(), self.clock, ScheduleLimits(max_schedules=MAX_SCHEDULES))
        h.broker.on_release, h.broker.on_cancel = self.schedules.on_release, self.schedules.on_cancel
        h.broker.on_hold, self.schedules.holds = self.schedules.on_hold, h.broker
        self.flow = TopicFlow(SettingsFile(settings_path(h.directory)), self.clock.now_ms, 100)
        self.flow.start(h.broker, self.schedules)

        async def start() -> None:
            h.broker.start()
            self.schedules.start(h.broker)
            await self._quiesce()
        self._run(start())

    def _store(self) -> ScheduleStore:
        return ScheduleFile(self.path, fsync=False)

    def _close(self) -> None:
        assert self.schedules is not None
        self._run(self.schedules.stop())
        self.schedules.close()
        self.h.close_broker()

    def teardown(self) -> None:
        if self.schedules is not None and self.h.broker is not None:
            self._run(self.schedules.stop())
            self.schedules.close()
        super().teardown()

    def _drain(self) -> None:
        """Pull every READY run (and ack it), recording what was delivered."""
        async def pull_all() -> list[str]:
            ids = []
            while True:
                batch = await self.broker.pull(PullRequest(TOPIC, 60_000, 100, ()))
                if not batch:
                    return ids
                ids += [m.msg_id for m in batch]
                await self.broker.ack_many(TOPIC, [m.msg_id for m in batch])
        for msg_id in self._run(pull_all()):
            run = parse_run_msg_id(msg_id)
            assert run is not None, msg_id
            self.delivered[run[0]].append(run[1])

    def _advance(self, target_ms: int) -> None:
        """Time passes with the node up: each run released at its time
        (none while the topic is paused: held back)."""
        while not self.topic_paused:
            due = [m.pending for m in self.models.values() if m.pending is not None and m.pending <= target_ms]
            if not due:
                break
            at = min(due)
            self.h.advance_to(at)
            for m in self.models.values():
                m.release_due(at)
            self._drain()
        self.h.advance_to(target_ms)
        self._drain()

    # -- rules -----------------------------------------------------------------------------

    @rule(sid=st.sampled_from(IDS), every_s=st.integers(1, 20), misfire=st.sampled_from(list(Misfire)),
          max_catch_up=st.integers(1, 4), limit=st.one_of(st.none(), st.integers(1, 6)),
          version=st.one_of(st.none(), st.just("right"), st.just("wrong"), st.just(0)))
    def put(self, sid, every_s, misfire, max_catch_up, limit, version):
        now = self.clock.now_ms()
        old = self.models.get(sid)
        stored = 0 if old is None else old.version
        asked = None if version is None else stored if version == "right" else stored + 7 if version == "wrong" \
            else 0
        spec = ScheduleSpec(TOPIC, sid, None, every_s * 1000, "UTC", f"run of {sid}", 3_600_000, 3, 0, "", "",
                            now, None, limit, 0, misfire, GRACE_MS, max_catch_up)
        assert self.schedules is not None
        try:
            state = self._run(self.schedules.put(spec, asked))
        except Conflict:
            assert asked is not None and asked != stored
            return
        except LimitReached:
            assert old is None and len(self.models) >= MAX_SCHEDULES
            return
        assert asked is None or asked == stored
        assert old is not None or len(self.models) < MAX_SCHEDULES
        model = Model(every_s * 1000, now, misfire, max_catch_up, limit, stored + 1, old is not None and old.paused)
        if old is not None:
            model.delivered = old.delivered
        if not model.paused:
            model.make(model.first_after(now))
        self.models[sid] = model
        assert state.version == model.version
        self._run(self._quiesce())
        self._drain()

    @precondition(lambda self: self.models)
    @rule(data=st.data())
    def pause(self, data):
        sid = data.draw(st.sampled_from(sorted(self.models)))
        assert self.schedules is not None
        self._run(self.schedules.pause(TOPIC, sid))
        m = self.models[sid]
        if not m.paused:
            m.paused, m.version, m.catch_up = True, m.version + 1, 0
            if m.pending is not None:
                m.pending, m.runs = None, m.runs - 1
        self._run(self._quiesce())
        self._drain()

    @precondition(lambda self: self.models)
    @rule(data=st.data())
    def resume(self, data):
        sid = data.draw(st.sampled_from(sorted(self.models)))
        assert self.schedules is not None
        self._run(self.schedules.resume(TOPIC, sid))
        m = self.models[sid]
        if m.paused:
            m.paused, m.version = False, m.version + 1
            m.make(m.first_after(self.clock.now_ms()))
        self._run(self._quiesce())
        self._drain()

    @rule(sid=st.sampled_from(IDS))
    def delete(self, sid):
        assert self.schedules is not None
        try:
            self._run(self.schedules.delete(TOPIC, sid))
        except NotFound:
            assert sid not in self.models
            return
        del self.models[sid]
        self._run(self._quiesce())
        self._drain()
        self.delivered[sid].clear()

    @precondition(lambda self: any(m.pending is not None for m in self.models.values()))
    @rule(data=st.data(), how=st.sampled_from(["deleteMsg", "deleteMsgs", "purge"]))
    def pending_run_deleted(self, data, how):
        """A client deletes a pending run (a purge: every one of the topic)."""
        sid = data.draw(st.sampled_from(sorted(s for s, m in self.models.items() if m.pending is not None)))
        broker = self.broker
        if how == "deleteMsg":
            self._run(broker.delete(DeleteRequest(TOPIC, f"{sid}@{self.models[sid].pending}", False)))
        else:
            flt = BulkFilter(msg_id_prefix=f"{sid}@") if how == "deleteMsgs" else BulkFilter()
            self._run(broker.delete_msgs(DeleteMsgsRequest(TOPIC, flt, 1000)))
        now = self.clock.now_ms()
        for other, m in self.models.items():
            if m.pending is not None and (other == sid or how == "purge"):
                # the run after it (or after now: one a pause held back), at once (nothing ends: `make` counts it)
                m.make(m.first_after(max(m.pending, now)))
        self._run(self._quiesce())
        self._drain()

    @rule(ms=st.integers(1, 45_000))
    def time_passes(self, ms):
        self._advance(self.clock.now_ms() + ms)

    @rule(downtime_ms=st.sampled_from([0, 0, 1_500, 4_000, 12_000, 40_000]), checkpoint=st.booleans())
    def restart(self, downtime_ms, checkpoint):
        """Stop the node; the clock moves on while it is down; start it again."""
        self._run(self.schedules.stop())  # type: ignore[union-attr]
        self.schedules.close()  # type: ignore[union-attr]
        self.h.close_broker(checkpoint)
        self.clock.set(self.clock.now_ms() + downtime_ms)
        self._open()
        now = self.clock.now_ms()
        if not self.topic_paused:
            for m in self.models.values():
                m.release_due(now)
        self._run(self._quiesce())
        self._drain()

    @rule(on_resume=st.sampled_from(list(OnResume)))
    def topic_paused_(self, on_resume):
        """pauseTopic: its due runs held back from now on."""
        self._run(self.flow.pause(PauseRequest(TOPIC, None, on_resume)))
        self.topic_paused = True
        self._run(self._quiesce())
        self._drain()

    @precondition(lambda self: self.topic_paused)
    @rule(downtime_ms=st.sampled_from([0, 3_000, 20_000]))
    def topic_resumed_then_crash(self, downtime_ms):
        """resumeTopic saved, the node gone before it released the held
        runs: the restart finds them due and waiting, and releases them."""
        runs = self.flow._runs
        assert runs is not None
        self.flow._runs = GoneBeforeRelease(runs)
        self._run(self.flow.resume(PauseRequest(TOPIC, None, None)))
        self.flow._runs = runs
        self.topic_paused = False
        self.restart(downtime_ms, False)

    @precondition(lambda self: self.topic_paused)
    @rule()
    def topic_resumed(self):
        """resumeTopic: the held runs released now, judged by misfire."""
        self._run(self.flow.resume(PauseRequest(TOPIC, None, None)))
        self.topic_paused = False
        now = self.clock.now_ms()
        for m in self.models.values():
            m.release_due(now)
        self._run(self._quiesce())
        self._drain()

    # -- what must hold --------------------------------------------------------------------

    @invariant()
    def runs_delivered_are_the_models(self):
        for sid in IDS:
            model = self.models.get(sid)
            expected = [] if model is None else model.delivered
            assert self.delivered[sid] == expected, (sid, self.delivered[sid], expected)

    @invariant()
    def schedules_are_the_models(self):
        assert self.schedules is not None
        self.schedules.check()
        assert len(self.schedules) == len(self.models) <= MAX_SCHEDULES
        for sid, model in self.models.items():
            state = self.schedules.get(TOPIC, sid)
            assert (state.version, state.paused, state.pending, state.runs) == (
                model.version, model.paused, model.pending, model.runs), (sid, state, model)
            assert state.next_fire_times(3) == ([] if model.pending is None else [
                t for t in (model.pending + k * model.every_ms for k in range(3))
                if model.limit is None or (t - model.pending) // model.every_ms < model.limit - model.runs + 1])


SchedulesMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=25, deadline=None,
                                              suppress_health_check=[HealthCheck.too_slow])
TestSchedules = SchedulesMachine.TestCase



class RaftSchedulesMachine(SchedulesMachine):
    """The same over a cluster's store (broker.cluster.schedules: the Raft
    group's entries, here a FakeElection's, which outlive the node): a
    restart is the next leader reading what the last one committed."""

    def _store(self) -> ScheduleStore:
        if not hasattr(self, "election"):
            self.election = FakeElection("n1", term=1, leader_id="n1")
        return RaftScheduleStore(self.election)


RaftSchedulesMachine.TestCase.settings = SchedulesMachine.TestCase.settings
TestRaftSchedules = RaftSchedulesMachine.TestCase
