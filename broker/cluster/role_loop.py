"""A cluster node's role loop: the driver of replication.roles.step.

Every POLL_S it feeds what it sees (Raft's view, a deposing peer, a failed
broker) to the step function as a `Polled` event, and carries out the
actions that come back, in order. An action with a result (positions
gathered, caught up, claim answered, leading) feeds it back as the next
event; an action that raises is fed back as `ActionFailed`. The decisions
(when to try, when to give up, when to stand down) are all in
replication.roles; this module is only the I/O: the follower task, the
peers' promises and positions, the catch-up, the claim, leadership.log;
the broker's start and end are broker.cluster.lead's.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os

from replication.epochs import Epochs
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

from .lead import Lead
from .peer_client import PeerClient
from .snapshots import Snapshots
from .state import NodeState

log = logging.getLogger("hourglass.cluster")

POLL_S = 0.02
POSITION_TIMEOUT_S = 0.5
# A follower whose snapshot failed waits this long before the next.
SNAPSHOT_RETRY_S = 0.5


class RoleLoop:
    """Moves `state` between roles: asks the peers through `peers`, takes
    snapshots through `snapshots`, starts and ends the lead through
    `lead`."""

    def __init__(self, state: NodeState, peers: PeerClient, snapshots: Snapshots, lead: Lead) -> None:
        self.state = state
        self.peers = peers
        self.snapshots = snapshots
        self.lead = lead
        self._follow_task: asyncio.Task[None] | None = None  # the follower loop, while following

    async def run(self) -> None:
        """Follow, and lead whenever Raft elects this node; until stopped."""
        self.state.deposed = asyncio.Event()
        await self._feed(Started())
        while not self.state.roles.stopping:
            await self.state.clock.sleep(POLL_S)
            await self._feed(self._poll())

    async def handover(self) -> None:
        """SIGTERM: if leading, hand the lead over; then leave the group."""
        await self._feed(Stop())

    def _poll(self) -> Polled:
        state = self.state
        election, leader_log, broker = state.election, state.leader_log, state.broker
        deposed = state.deposed.is_set() or (leader_log is not None and leader_log.deposed.is_set())
        failure = None if broker is None or broker.failed is None else repr(broker.failed)
        return Polled(election.is_leader, election.term, election.leader_id, deposed, failure)

    def _now_ms(self) -> int:
        return int(self.state.clock.monotonic_s() * 1000)

    async def _feed(self, event: Event) -> None:
        """One step, then its actions in order (each result fed back)."""
        self.state.roles, actions = step(self.state.roles, event, self._now_ms())
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
        state = self.state
        if isinstance(action, StartFollowing):
            self._follow_task = asyncio.create_task(self._follow(), name="follower")
        elif isinstance(action, StopFollowing):
            if state.roles.role is Role.CANDIDATE:  # Raft elected this node: the attempt to lead begins
                state.elected_s = state.clock.monotonic_s()
            await self._stop_following()
        elif isinstance(action, GatherPositions):
            return await self._gather_positions(action.term)
        elif isinstance(action, CatchUp):
            await self._catch_up(action.source, action.position)
            return CaughtUp(action.term, state.election.is_leader, state.election.term)
        elif isinstance(action, Claim):
            committed = await state.election.claim(action.term)
            return ClaimDone(action.term, committed, state.epochs.promised, state.election.is_leader)
        elif isinstance(action, StartLeading):
            state.deposed = asyncio.Event()  # a promise asked before this term deposes it no more
            self.lead.start(action.term)
            return Leading(action.term)
        elif isinstance(action, RecordLeadership):
            self._record_leadership(action.term, action.event)
        elif isinstance(action, StandDown):
            await self.lead.stand_down(action.reason)
        elif isinstance(action, HandOver):
            await self.lead.hand_over()
        elif isinstance(action, CloseElection):
            if await state.election.transfer_lead():  # (a planned leave: the next leader at once, no timeout)
                log.info("handed Raft's lead to %s", state.election.leader_id)
            state.election.close()
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
        await self.snapshots.finish_install()
        # A fetch cancelled during its fsync (a worker thread) left its records
        # appended and not applied: a broker built on this store would not
        # know them (an ack among them: the message held as consuming and
        # handed out again at its ack timeout, seen by a fault drill).
        async with self.state.apply_lock:
            if self.state.store.pending_records:
                self.state.store.commit()

    async def _follow(self) -> None:
        follower = self.state.follower
        while True:
            await follower.run()
            source = follower.needs_snapshot
            if source is not None:
                try:
                    await self.snapshots.take_snapshot(source)
                except Exception as e:
                    log.warning("snapshot from %s failed: %r; retrying", source, e)
                    await self.state.clock.sleep(SNAPSHOT_RETRY_S)

    # == becoming leader ==========================================================

    async def _gather_positions(self, term: int) -> PositionsGathered:
        """Promise `term` here, then ask every peer for its promise and
        position, until a majority (this node counted) has promised, a peer
        refuses, or POSITION_TIMEOUT_S has passed; those that have not
        answered by then are left out. Any majority will do: every record a
        quorum acknowledged is on at least one of its nodes, and waiting for
        a peer cut off (a partition) would only delay the failover."""
        state, cluster = self.state, self.state.cluster
        state.set_epochs(state.epochs.promise(term))
        end = state.store.log_end_offset
        positions = [(cluster.node_id, Position(state.epochs.last_epoch(end), end, state.epochs.history))]
        refusals: list[tuple[str, int]] = []
        asking = {asyncio.ensure_future(self.peers.post(p.node_id, "position", {"node": cluster.node_id, "epoch": term},
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
        return PositionsGathered(term, tuple(positions), tuple(refusals), state.election.is_leader, state.election.term)

    async def _catch_up(self, source: str, position: Position) -> None:
        state = self.state
        target, history = position.end_offset, position.history
        source_epochs = Epochs(0, history)
        end = state.store.log_end_offset
        if source_epochs.diverges(state.epochs.last_epoch(end), end, target):
            log.info("catching up from %s by snapshot (this log diverged at %d)", source, end)
            await self.snapshots.take_snapshot(source)
            return
        log.info("catching up from %s: offsets %d..%d", source, end, target)
        while state.store.log_end_offset < target:
            end = state.store.log_end_offset
            result = await self.peers.post(source, "fetch", {"node": state.cluster.node_id, "epoch": 0, "offset": end,
                                                             "last_epoch": state.epochs.last_epoch(end), "wait_ms": 0,
                                                             "catchup": True})
            if result["status"] == "snapshot":
                # the source no longer keeps the log from here (its retention):
                # its snapshot, as a follower that far behind gets (a fault
                # drill saw a candidate retry this catch-up for minutes)
                log.info("catching up from %s by snapshot (its log starts after %d)", source, end)
                await self.snapshots.take_snapshot(source)
                return
            if result["status"] != "ok" or not result.get("records"):
                raise ConnectionError(f"catch-up from {source} stopped at {end}: {result['status']}")
            await state.follower.apply({**result, "tick": None, "history": history})

    def _record_leadership(self, term: int, event: LeadershipEvent) -> None:
        """leadership.log: one line per start and end of leading, so a drill
        can check that no two nodes ever led the same term."""
        state = self.state
        with open(os.path.join(state.data_dir, "leadership.log"), "a") as f:
            f.write(json.dumps({"term": term, "node": state.cluster.node_id, "event": event.value,
                                "wall_ms": state.clock.now_ms()}) + "\n")
