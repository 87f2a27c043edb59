"""A cluster node's role loop: the driver of replication.roles.step.

Every POLL_S it feeds what it sees (Raft's view, a deposing peer, a failed
broker) to the step function as a `Polled` event, and carries out the
actions that come back, in order. An action with a result (positions
gathered, caught up, claim answered, leading) feeds it back as the next
event; an action that raises is fed back as `ActionFailed`. The decisions
(when to try, when to give up, when to stand down) are all in
replication.roles; this module is only the I/O: the follower task, the
peers' promises and positions, the catch-up, the claim, the broker.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os

from broker.disk_broker import Broker
from broker.schedules import Schedules
from replication.epochs import Epochs
from replication.log_stream import LeaderLog
from replication.roles import (
    Action,
    ActionFailed,
    CatchUp,
    CaughtUp,
    Claim,
    ClaimDone,
    CloseElection,
    Crash,
    Event,
    GatherPositions,
    HandOver,
    LeadershipEvent,
    Leading,
    Log,
    Polled,
    Position,
    PositionsGathered,
    RecordLeadership,
    Role,
    StandDown,
    Started,
    StartFollowing,
    StartLeading,
    Stop,
    StopFollowing,
    step,
)
from storage.errors import InvariantError
from wheel.tick_state import TickStateFile

from .parts import NodeParts
from .schedules import RaftScheduleStore

log = logging.getLogger("hourglass.cluster")

POLL_S = 0.02
POSITION_TIMEOUT_S = 0.5
# A follower whose snapshot failed waits this long before the next.
SNAPSHOT_RETRY_S = 0.5


class RoleLoop(NodeParts):
    """(Calls post, of broker.cluster.peers, take_snapshot, of
    broker.cluster.snapshots, and hand_over, of broker.cluster.handover.)"""

    async def run(self) -> None:
        """Follow, and lead whenever Raft elects this node; until stopped."""
        self._deposed = asyncio.Event()
        await self._feed(Started())
        while not self.roles.stopping:
            await self.clock.sleep(POLL_S)
            await self._feed(self._poll())

    async def handover(self) -> None:
        """SIGTERM: if leading, hand the lead over; then leave the group."""
        await self._feed(Stop())

    def _poll(self) -> Polled:
        election, leader_log, broker = self.election, self.leader_log, self.broker
        deposed = self._deposed.is_set() or (leader_log is not None and leader_log.deposed.is_set())
        failure = None if broker is None or broker.failed is None else repr(broker.failed)
        return Polled(election.is_leader, election.term, election.leader_id, deposed, failure)

    def _now_ms(self) -> int:
        return int(self.clock.monotonic_s() * 1000)

    async def _feed(self, event: Event) -> None:
        """One step, then its actions in order (each result fed back)."""
        self.roles, actions = step(self.roles, event, self._now_ms())
        for action in actions:
            if isinstance(action, Crash):
                raise action.error
            try:
                result = await self._do(action)
            except Exception as e:
                await self._feed(ActionFailed(action, e))
                break  # what followed the failed action is void
            if result is not None:
                await self._feed(result)

    async def _do(self, action: Action) -> Event | None:
        if isinstance(action, StartFollowing):
            self._follow_task = asyncio.create_task(self._follow(), name="follower")
        elif isinstance(action, StopFollowing):
            if self.roles.role is Role.CANDIDATE:  # Raft elected this node: the attempt to lead begins
                self._elected_s = self.clock.monotonic_s()
            await self._stop_following()
        elif isinstance(action, GatherPositions):
            return await self._gather_positions(action.term)
        elif isinstance(action, CatchUp):
            await self._catch_up(action.source, action.position)
            return CaughtUp(action.term, self.election.is_leader, self.election.term)
        elif isinstance(action, Claim):
            committed = await self.election.claim(action.term)
            return ClaimDone(action.term, committed, self.epochs.promised, self.election.is_leader)
        elif isinstance(action, StartLeading):
            self._start_leading(action.term)
            return Leading(action.term)
        elif isinstance(action, RecordLeadership):
            self._record_leadership(action.term, action.event)
        elif isinstance(action, StandDown):
            await self._stand_down(action.reason)
        elif isinstance(action, HandOver):
            await self.hand_over()
        elif isinstance(action, CloseElection):
            self.election.close()
        elif isinstance(action, Log):
            log.log(action.level, "%s", action.text)
        return None

    # == following ================================================================

    async def _stop_following(self) -> None:
        if self._follow_task is not None:
            self._follow_task.cancel()
            await asyncio.gather(self._follow_task, return_exceptions=True)
            self._follow_task = None
        # A snapshot install the cancel found under way goes on in a task of
        # its own: it ends before this node builds on its store (or takes
        # another snapshot, over the files its threads still write).
        await self.finish_install()
        # A fetch cancelled during its fsync (a worker thread) left its records
        # appended and not applied: a broker built on this store would not
        # know them (an ack among them: the message held as consuming and
        # handed out again at its ack timeout, seen by a fault drill).
        async with self.apply_lock:
            if self.store.pending_records:
                self.store.commit()

    async def _follow(self) -> None:
        while True:
            self.follower.needs_snapshot = None
            await self.follower.run()
            source = self.follower.needs_snapshot
            if source is not None:
                try:
                    await self.take_snapshot(source)
                except Exception as e:
                    log.warning("snapshot from %s failed: %r; retrying", source, e)
                    await self.clock.sleep(SNAPSHOT_RETRY_S)

    # == becoming leader ==========================================================

    async def _gather_positions(self, term: int) -> PositionsGathered:
        """Promise `term` here, then ask every peer for its promise and
        position, until a majority (this node counted) has promised, a peer
        refuses, or POSITION_TIMEOUT_S has passed; those that have not
        answered by then are left out. Any majority will do: every record a
        quorum acknowledged is on at least one of its nodes, and waiting for
        a peer cut off (a partition) would only delay the failover."""
        cluster = self.cluster
        self.set_epochs(self.epochs.promise(term))
        end = self.store.log_end_offset
        positions = [(cluster.node_id, Position(self.epochs.last_epoch(end), end, self.epochs.history))]
        refusals: list[tuple[str, int]] = []
        asking = {asyncio.ensure_future(self.post(p.node_id, "position", {"node": cluster.node_id, "epoch": term},
                                                  POSITION_TIMEOUT_S)): p.node_id for p in cluster.others}
        pending = set(asking)  # (each call times out by itself, after POSITION_TIMEOUT_S)
        try:
            while pending and len(positions) < cluster.quorum and not refusals:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for answered in done:
                    if answered.exception() is not None:
                        continue
                    a = answered.result()
                    if a["status"] != "ok":
                        refusals.append((asking[answered], int(a["promised"])))
                        continue
                    history = tuple((int(epoch), int(offset)) for epoch, offset in a["history"])
                    positions.append((asking[answered],
                                      Position(int(a["last_epoch"]), int(a["end_offset"]), history)))
        finally:
            for unanswered in pending:
                unanswered.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        return PositionsGathered(term, tuple(positions), tuple(refusals), self.election.is_leader, self.election.term)

    async def _catch_up(self, source: str, position: Position) -> None:
        target, history = position.end_offset, position.history
        source_epochs = Epochs(0, history)
        end = self.store.log_end_offset
        if source_epochs.diverges(self.epochs.last_epoch(end), end, target):
            log.info("catching up from %s by snapshot (this log diverged at %d)", source, end)
            await self.take_snapshot(source)
            return
        log.info("catching up from %s: offsets %d..%d", source, end, target)
        while self.store.log_end_offset < target:
            end = self.store.log_end_offset
            result = await self.post(source, "fetch", {"node": self.cluster.node_id, "epoch": 0, "offset": end,
                                                       "last_epoch": self.epochs.last_epoch(end), "wait_ms": 0,
                                                       "catchup": True})
            if result["status"] == "snapshot":
                # the source no longer keeps the log from here (its retention):
                # its snapshot, as a follower that far behind gets (a fault
                # drill saw a candidate retry this catch-up for minutes)
                log.info("catching up from %s by snapshot (its log starts after %d)", source, end)
                await self.take_snapshot(source)
                return
            if result["status"] != "ok" or not result.get("records"):
                raise ConnectionError(f"catch-up from {source} stopped at {end}: {result['status']}")
            await self.follower.apply({**result, "tick": None, "history": history})

    def _start_leading(self, term: int) -> None:
        if self.tick_file is None:
            raise InvariantError("only a follower starts leading")
        self.set_epochs(self.epochs.begin(term, self.store.log_end_offset))
        self.tick_file.close()
        self.tick_file = None
        self._deposed = asyncio.Event()
        leader_log = LeaderLog(self.store, self.cluster, term, self.epochs, lambda: broker.tick, self.clock)
        broker = Broker(self.store, self.clock, self.config.defaults, self.metrics, tick_path=self.tick_path,
                        replicated=leader_log.replicated, apply_lock=self.apply_lock, limits=self.config.queues)
        broker.on_fatal = lambda error: None  # a failed broker makes this node stand down
        # only the leader makes schedules' runs, from the state Raft holds (broker.cluster.schedules)
        schedules = Schedules(RaftScheduleStore(self.election), self.clock, self.config.schedules)
        broker.on_release = schedules.on_release
        broker.start()
        self.leader_log, self.broker = leader_log, broker
        self.api.serve_with(broker)
        if self.pushers is not None:  # only the leader pushes (broker.cluster.push)
            self.pushers.start(broker)
        schedules.start(broker)
        self.schedules = schedules
        log.info("leading term %d from offset %d, tick %s, %.3f s after Raft elected it", term,
                 self.store.log_end_offset, broker.tick, self.clock.monotonic_s() - self._elected_s)

    def _record_leadership(self, term: int, event: LeadershipEvent) -> None:
        """leadership.log: one line per start and end of leading, so a drill
        can check that no two nodes ever led the same term."""
        with open(os.path.join(self.data_dir, "leadership.log"), "a") as f:
            f.write(json.dumps({"term": term, "node": self.cluster.node_id, "event": event.value,
                                "wall_ms": self.clock.now_ms()}) + "\n")

    # == standing down ============================================================

    async def _stand_down(self, reason: str) -> None:
        broker, leader_log = self.broker, self.leader_log
        if broker is None or leader_log is None:
            raise InvariantError("only a leader stands down")
        failed = broker.failed  # why it stands down, if its broker failed (not what abandoning it fails)
        self.broker = self.leader_log = None
        self.api.stop_serving()
        if self.pushers is not None:  # what they have in flight the next leader delivers again
            await self.pushers.stop()
        await self.stop_schedules()
        leader_log.close(f"this node no longer leads ({reason}); retry")
        await broker.abandon()
        self.tick_file = TickStateFile(self.tick_path, fsync=True)
        self.follower.last_tick = None
        if failed is not None:
            # Its RAM and disk may disagree, and Raft keeps this node its
            # leader while it lives: it could not claim its own term again,
            # and no other node would be elected (a fault drill saw a
            # cluster without a working leader for minutes). It leaves; the
            # others elect, and it rejoins from its disk when restarted.
            self.fail(failed, f"the broker of term {self.roles.term}")
