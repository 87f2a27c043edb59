"""What a cluster node runs while it leads, and the three ways that starts
or ends, each an action of replication.roles carried out for the role
loop (broker.cluster.role_loop):

    action        what it does
    StartLeading  `start`: record epoch T from the log end, build the
                  broker over the store (its wheel from the streamed tick),
                  its LeaderLog and the schedules; the API serves the
                  broker, the pushers and the schedules run on it
    StandDown     `stand_down`: the reverse; requests waiting for
                  followers are answered 503, and a broker that failed
                  fails the node
    HandOver      `hand_over` (SIGTERM on the leader): a graceful stand
                  down, below

The graceful handover: stop taking requests, stop the wheel (its tick
persisted) and commit, wait up to HANDOVER_TIMEOUT_S until every live
follower has fetched everything, give them one more fetch round for the
final tick; the role loop then records the end of the term and leaves the
Raft group. The next leader starts exactly where this one stopped, so
nothing is released twice (an ack that misses its deadline while the lead
moves brings its message back: docs/cluster.md). `ClusterNode.close`
(node.py) then closes the node.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, Protocol

from broker.disk.backend import Broker
from broker.http.api import Api
from broker.jobs.runner import RedriveJobs
from broker.observe.metrics import Metrics
from broker.schedules.keeper import Schedules
from replication.log_stream import LeaderLog
from storage.errors import InvariantError
from wheel.tick_state import TickStateFile

from .jobs import RaftJobs
from .schedules import RaftScheduleStore
from .state import NodeState

if TYPE_CHECKING:
    from broker.flow.keeper import TopicFlow
    from broker.push.pusher import Pushers

log = logging.getLogger("hourglass.cluster")

HANDOVER_TIMEOUT_S = 3.0


class Serving(Protocol):
    """What serves the leader's broker: the node's base (NodeBase,
    broker.node_base) -- its API, its pushers (None: it pushes nothing),
    its `schedules` (the leader's, None while following), and the metrics
    the broker counts into."""

    api: Api
    pushers: Pushers | None
    flow: TopicFlow | None
    schedules: Schedules | None
    jobs: RedriveJobs | None
    metrics: Metrics


class Lead:
    """The leader's broker over `state`'s store, served through `serving`."""

    def __init__(self, state: NodeState, serving: Serving) -> None:
        self.state = state
        self.serving = serving

    def start(self, term: int) -> None:
        """Lead `term` (its claim committed): the broker, its LeaderLog and
        the schedules built and served."""
        state = self.state
        if state.tick_file is None:
            raise InvariantError("only a follower starts leading")
        state.set_epochs(state.epochs.begin(term, state.store.log_end_offset))
        state.tick_file.close()
        state.tick_file = None
        config, clock = state.config, state.clock
        leader_log = LeaderLog(state.store, state.cluster, term, state.epochs, lambda: broker.tick, clock)
        serving = self.serving
        broker = Broker(state.store, clock, config.defaults, serving.metrics, tick_path=state.tick_path,
                        replicated=leader_log.replicated, apply_lock=state.apply_lock, limits=config.queues)
        broker.on_fatal = lambda error: None  # a failed broker makes this node stand down
        # only the leader makes schedules' runs, from the state Raft holds (broker.cluster.schedules)
        schedules = Schedules(RaftScheduleStore(state.election), clock, config.schedules)
        broker.on_release, broker.on_cancel = schedules.on_release, schedules.on_cancel
        broker.on_hold, schedules.holds = schedules.on_hold, broker  # (runs a pause holds back)
        if serving.flow is not None:  # the pauses the last leader replicated, before anything is handed out
            serving.flow.start(broker, schedules)
        broker.start()
        state.leader_log, state.broker = leader_log, broker
        serving.api.serve_with(broker)
        if serving.pushers is not None:  # only the leader pushes (broker.cluster.push)
            serving.pushers.start(broker)
        schedules.start(broker)
        serving.schedules = schedules
        # only the leader runs redriveMsgs jobs, from the records Raft holds (broker.cluster.jobs)
        jobs = RedriveJobs(RaftJobs(state.election), clock, config.jobs)
        jobs.start(broker)
        serving.jobs = jobs
        log.info("leading term %d from offset %d, tick %s, %.3f s after Raft elected it", term,
                 state.store.log_end_offset, broker.tick, clock.monotonic_s() - state.elected_s)

    async def stand_down(self, reason: str) -> None:
        """Lead no more: serve and push nothing, fail what waits for the
        followers, abandon the broker, keep the leader's tick again."""
        state = self.state
        broker, leader_log = state.broker, state.leader_log
        if broker is None or leader_log is None:
            raise InvariantError("only a leader stands down")
        failed = broker.failed  # why it stands down, if its broker failed (not what abandoning it fails)
        state.broker = state.leader_log = None
        self.serving.api.stop_serving()
        if self.serving.flow is not None:
            self.serving.flow.stop()
        if self.serving.pushers is not None:  # what they have in flight the next leader delivers again
            await self.serving.pushers.stop()
        await self.stop_schedules()
        leader_log.close(f"this node no longer leads ({reason}); retry")
        await broker.abandon()
        state.tick_file = TickStateFile(state.tick_path, fsync=True)
        state.follower.forget_tick()  # (the broker's wheel wrote the tick file meanwhile)
        if failed is not None:
            # Its RAM and disk may disagree, and Raft keeps this node its
            # leader while it lives: it could not claim its own term again,
            # and no other node would be elected (a fault drill saw a
            # cluster without a working leader for minutes). It leaves; the
            # others elect, and it rejoins from its disk when restarted.
            state.fail(failed, f"the broker of term {state.roles.term}")

    async def hand_over(self) -> None:
        """Stop the wheel and commit, let every live follower fetch all of
        it and the last tick, then fail what still waits."""
        state = self.state
        broker, leader_log, clock = state.broker, state.leader_log, state.clock
        if broker is not None and leader_log is not None:
            if self.serving.pushers is not None:  # first: what they have in flight the next leader delivers again
                await self.serving.pushers.stop()
            await self.stop_schedules()  # a release not followed yet, the next leader follows
            broker.begin_stop()
            with contextlib.suppress(Exception):
                await clock.wait_for(broker.stop(), HANDOVER_TIMEOUT_S)
            deadline_s = clock.monotonic_s() + HANDOVER_TIMEOUT_S
            end = state.store.log_end_offset
            while clock.monotonic_s() < deadline_s:
                live = [p for p in leader_log.followers.values() if clock.monotonic_s() - p.seen_s < 1.0]
                if live and all(p.offset >= end for p in live):
                    break
                await clock.sleep(0.01)
            # one more round, so each follower's last fetch answer carries the final tick
            await clock.sleep(2 * state.cluster.tick_sync_ms / 1000)
            leader_log.close("this node is stopping; retry")
            log.info("handed over at offset %d, tick %s", end, broker.tick)

    async def stop_schedules(self) -> None:
        """The leader's schedules stop making runs and its jobs stop
        (standing down, handing over); what they leave undone the next
        leader does."""
        jobs, self.serving.jobs = self.serving.jobs, None
        if jobs is not None:
            await jobs.stop()
        schedules, self.serving.schedules = self.serving.schedules, None
        if schedules is not None:
            await schedules.stop()
            schedules.close()
