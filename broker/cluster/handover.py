"""Stopping a cluster node (SIGTERM).

On the leader, a graceful handover (`hand_over`, the HandOver action of
replication.roles): stop taking requests, stop the wheel (its tick
persisted) and commit, wait up to HANDOVER_TIMEOUT_S until every live
follower has fetched everything, give them one more fetch round for the
final tick; the role loop then records the end of the term and leaves the
Raft group. The next leader starts exactly where this one stopped, so
nothing is released twice (an ack that misses its deadline while the lead
moves brings its message back: docs/cluster.md). `close` then releases the
HTTP session, the tick file and the store, with a last checkpoint unless the node failed
(the next start replays the commit log from the one before); a last
checkpoint the disk refuses is such a failure (exit 1, logged, no
traceback).
"""

from __future__ import annotations

import contextlib
import logging

from .parts import NodeParts

log = logging.getLogger("hourglass.cluster")

HANDOVER_TIMEOUT_S = 3.0


class Handover(NodeParts):
    async def hand_over(self) -> None:
        """Stop the wheel and commit, let every live follower fetch all of
        it and the last tick, then fail what still waits."""
        broker, leader_log = self.broker, self.leader_log
        if broker is not None and leader_log is not None:
            if self.pushers is not None:  # first: what they have in flight the next leader delivers again
                await self.pushers.stop()
            await self.stop_schedules()  # a release not followed yet, the next leader follows
            broker.begin_stop()
            with contextlib.suppress(Exception):
                await self.clock.wait_for(broker.stop(), HANDOVER_TIMEOUT_S)
            deadline_s = self.clock.monotonic_s() + HANDOVER_TIMEOUT_S
            end = self.store.log_end_offset
            while self.clock.monotonic_s() < deadline_s:
                live = [p for p in leader_log.followers.values() if self.clock.monotonic_s() - p.seen_s < 1.0]
                if live and all(p.offset >= end for p in live):
                    break
                await self.clock.sleep(0.01)
            # one more round, so each follower's last fetch answer carries the final tick
            await self.clock.sleep(2 * self.cluster.tick_sync_ms / 1000)
            leader_log.close("this node is stopping; retry")
            log.info("handed over at offset %d, tick %s", end, broker.tick)

    async def close(self) -> None:
        for session in (self._session, self._forward_session):
            if session is not None:
                await session.close()
        if self.tick_file is not None:
            self.tick_file.close()
        try:
            if self.failed is None:  # as a standalone node: no last checkpoint after a failure
                self.store.checkpoint(self.clock.now_ms())
        except OSError as e:  # a full disk: the next start replays the commit log instead
            self.fail(e, "the last checkpoint")
        finally:
            self.store.close()
