"""What a cluster node runs while it leads, and the three ways that starts
or ends, each an action of replication.roles carried out for the role
loop (broker.cluster.role_loop):

    action        what it does
    StartLeading  `start`: record epoch T from the log end, build the
                  broker over the store (its wheel from the streamed tick)
                  and its LeaderLog, the node's features attached to it
                  (their records read from the Raft group's state); the
                  API serves the broker, the features run on it
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
from typing import Protocol

from broker.disk.backend import Broker
from broker.http.api import Api
from broker.observe.metrics import Metrics
from replication.log_stream import LeaderLog
from storage.errors import InvariantError
from wheel.tick_state import TickStateFile

from .state import NodeState

log = logging.getLogger("hourglass.cluster")

HANDOVER_TIMEOUT_S = 3.0


class Features(Protocol):
    """The node's features (broker.node.features): flow, push, schedules,
    jobs, run on the leader's broker for its term."""

    def attach(self, broker: Broker) -> None: ...
    def start(self, broker: Broker) -> None: ...
    async def stop(self) -> None: ...


class Lead:
    """The leader's broker over `state`'s store, served through `api`, the
    node's `features` run on it, counting into `metrics`."""

    def __init__(self, state: NodeState, api: Api, features: Features, metrics: Metrics) -> None:
        self.state = state
        self.api = api
        self.features = features
        self.metrics = metrics

    def start(self, term: int) -> None:
        """Lead `term` (its claim committed): the broker and its LeaderLog
        built and served, the features run on it."""
        state = self.state
        if state.tick_file is None:
            raise InvariantError("only a follower starts leading")
        state.set_epochs(state.epochs.begin(term, state.store.log_end_offset))
        state.tick_file.close()
        state.tick_file = None
        config, clock = state.config, state.clock
        leader_log = LeaderLog(state.store, state.cluster, term, state.epochs, lambda: broker.tick, clock)
        broker = Broker(state.store, clock, config.defaults, self.metrics, tick_path=state.tick_path,
                        replicated=leader_log.replicated, apply_lock=state.apply_lock, limits=config.queues)
        broker.on_fatal = lambda error: None  # a failed broker makes this node stand down
        # only the leader pushes, makes schedules' runs and runs jobs, from the records Raft holds
        # (broker.cluster.records); the pauses the last leader replicated carried out before anything is
        # handed out
        self.features.attach(broker)
        broker.start()
        state.leader_log, state.broker = leader_log, broker
        self.api.serve_with(broker)
        self.features.start(broker)
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
        self.api.stop_serving()
        await self.features.stop()  # what the pushers have in flight, and what the rest leave, the next leader does
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
            # first: what the pushers have in flight the next leader delivers again, a release the
            # schedules did not follow yet it follows
            await self.features.stop()
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
