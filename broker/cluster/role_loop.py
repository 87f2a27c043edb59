"""A cluster node's roles: follow, lead whenever Raft elects this node,
stand down when its term is over.

`run` polls every 20 ms. A follower that Raft calls leader becomes a
candidate and tries to lead its term (`_lead`, the steps in
broker.cluster's docstring); a failed attempt waits 0.2 s before the next.
A leader stands down when Raft moves to another term or leader, when a
peer knows a newer epoch, or when its broker failed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os

from broker.service import Broker
from replication.epochs import Epochs
from replication.log_stream import LeaderLog
from wheel.tick_state import TickStateFile

from .parts import NodeParts

log = logging.getLogger("hourglass.cluster")

POSITION_TIMEOUT_S = 0.5


class RoleLoop(NodeParts):
    """(Calls post, of broker.cluster.peers, and take_snapshot, of
    broker.cluster.snapshots.)"""

    async def run(self) -> None:
        """Follow, and lead whenever Raft elects this node; until stopped."""
        self._deposed = asyncio.Event()
        self._start_following()
        while not self.stopping:
            await self.clock.sleep(0.02)
            term = self.election.term
            if self.role == "follower":
                if self.election.is_leader and self.clock.monotonic_s() >= self._next_try_s:
                    await self._try_to_lead(term)
            elif (reason := self._stand_down_reason()) is not None:
                await self._stand_down(reason)

    def _start_following(self) -> None:
        self.role = "follower"
        self._follow_task = asyncio.create_task(self._follow(), name="follower")

    async def _stop_following(self) -> None:
        if self._follow_task is not None:
            self._follow_task.cancel()
            await asyncio.gather(self._follow_task, return_exceptions=True)
            self._follow_task = None

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
                    await self.clock.sleep(0.5)

    def _stand_down_reason(self) -> str | None:
        """Why this leader must stand down now (None: it need not)."""
        election = self.election
        if not election.is_leader or election.term != self.leading_term:
            return f"Raft moved on (term {election.term}, leader {election.leader_id})"
        if self._deposed.is_set() or (self.leader_log is not None and self.leader_log.deposed.is_set()):
            return "a peer knows a newer epoch"
        if self.broker is not None and self.broker.failed is not None:
            return f"the broker failed: {self.broker.failed!r}"
        return None

    async def _try_to_lead(self, term: int) -> None:
        await self._stop_following()
        self.role = "candidate"
        try:
            led = await self._lead(term)
        except Exception as e:
            log.warning("term %d: could not take the lead: %r", term, e)
            led = False
        if not led:  # Raft may keep this node leader: try again shortly
            self._next_try_s = self.clock.monotonic_s() + 0.2
            self._start_following()

    async def _lead(self, term: int) -> bool:
        cluster = self.cluster
        self.set_epochs(self.epochs.promise(term))
        end = self.store.log.end_offset
        positions = {cluster.node_id: (self.epochs.last_epoch(end), end, self.epochs.history)}
        answers = await asyncio.gather(*(self.post(p.node_id, "position", {"node": cluster.node_id, "epoch": term},
                                                   POSITION_TIMEOUT_S) for p in cluster.others),
                                       return_exceptions=True)
        for peer, a in zip(cluster.others, answers):
            if isinstance(a, BaseException):
                continue
            if a["status"] != "ok":
                log.info("term %d: %s has promised term %d", term, peer.node_id, a["promised"])
                return False
            positions[peer.node_id] = (int(a["last_epoch"]), int(a["end_offset"]), tuple(map(tuple, a["history"])))
        if len(positions) < cluster.quorum:
            log.info("term %d: %d of %d nodes answered, a majority is needed", term, len(positions), len(cluster.peers))
            return False
        best = max(positions, key=lambda n: positions[n][:2])
        if best != cluster.node_id and positions[best][:2] > positions[cluster.node_id][:2]:
            await self._catch_up(best, positions[best])
        if not self.election.is_leader or self.election.term != term:
            return False
        if not await self.election.claim(term):
            log.info("term %d: the claim was not committed", term)
            return False
        if self.epochs.promised > term or not self.election.is_leader:
            log.info("term %d: a newer term appeared while claiming", term)
            return False
        self._start_leading(term)
        return True

    async def _catch_up(self, source: str, position: tuple) -> None:
        last_epoch, target, history = position
        source_epochs = Epochs(0, history)
        end = self.store.log.end_offset
        if source_epochs.diverges(self.epochs.last_epoch(end), end, target):
            log.info("catching up from %s by snapshot (this log diverged at %d)", source, end)
            await self.take_snapshot(source)
            return
        log.info("catching up from %s: offsets %d..%d", source, end, target)
        while self.store.log.end_offset < target:
            end = self.store.log.end_offset
            result = await self.post(source, "fetch", {"node": self.cluster.node_id, "epoch": 0, "offset": end,
                                                       "last_epoch": self.epochs.last_epoch(end), "wait_ms": 0,
                                                       "catchup": True})
            if result["status"] != "ok" or not result.get("records"):
                raise ConnectionError(f"catch-up from {source} stopped at {end}: {result['status']}")
            await self.follower.apply({**result, "tick": None, "history": history})

    def _start_leading(self, term: int) -> None:
        self.set_epochs(self.epochs.begin(term, self.store.log.end_offset))
        self.tick_file.close()
        self.tick_file = None
        self._deposed = asyncio.Event()
        leader_log = LeaderLog(self.store, self.cluster, term, self.epochs, lambda: broker.tick, self.clock)
        broker = Broker(self.store, self.clock, self.config.defaults, self.metrics, tick_path=self.tick_path,
                        replicated=leader_log.replicated, apply_lock=self.apply_lock, limits=self.config.queues)
        broker.on_fatal = lambda error: None  # a failed broker makes this node stand down
        broker.start()
        self.leader_log, self.broker, self.api.broker = leader_log, broker, broker
        self.leading_term = term
        self.role = "leader"
        self._record_leadership(term, "start")
        log.info("leading term %d from offset %d, tick %s", term, self.store.log.end_offset, broker.tick)

    def _record_leadership(self, term: int, event: str) -> None:
        """leadership.log: one line per start and end of leading, so a drill
        can check that no two nodes ever led the same term."""
        with open(os.path.join(self.data_dir, "leadership.log"), "a") as f:
            f.write(json.dumps({"term": term, "node": self.cluster.node_id, "event": event,
                                "wall_ms": self.clock.now_ms()}) + "\n")

    async def _stand_down(self, reason: str) -> None:
        log.warning("term %d: standing down: %s", self.leading_term, reason)
        self.role = "follower"
        broker, leader_log = self.broker, self.leader_log
        self.broker = self.api.broker = self.leader_log = None
        leader_log.close(f"this node no longer leads ({reason}); retry")
        await broker.abandon()
        self._record_leadership(self.leading_term, "end")
        self.tick_file = TickStateFile(self.tick_path, fsync=True)
        self.follower.last_tick = None
        self._start_following()
