"""The commit log, streamed from the leader to followers by offset.

Leader side, `LeaderLog`: the group commit tells it each offset that is on
the leader's disk and waits (`replicated`) until a quorum has it; followers'
fetches (replication.protocol) both read the log and acknowledge it.

    leader durable end   1000          quorum of 3 = 2 nodes
    follower n2 fetched   900   ->  offsets sorted: 1000, 900, 400
    follower n3 fetched   400       quorum offset = 900: writes ending at or
                                    before 900 are answered

Follower side, `Follower`: fetches from the leader named by the election
(the node that claimed the highest term), appends the records byte for
byte (same offsets), fsyncs, applies them to its delay logs and indexes,
and persists the leader's tick state; so it is ready to lead at any time.
A follower refuses records of an epoch below the one it has promised, and
answers for a diverged or too-old log are handled by taking a snapshot.

Both run on the event loop; fsyncs run in worker threads. Every reading
of time and every wait goes through the injected clock (wheel.clock).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from storage.errors import Unavailable
from storage.store import Store
from wheel.clock import Clock
from wheel.tick_state import TickState

from .config import Acks, ClusterConfig
from .election import Election
from .epochs import Epochs
from .protocol import FETCH_MAX_BYTES

log = logging.getLogger("hourglass.replication")

# A fetch answers within its wait_ms when the leader is alive; a frozen or
# partitioned leader must not hold a follower that could follow the next one.
FETCH_TIMEOUT_S = 1.0


@dataclass
class Progress:
    offset: int  # the follower has every record before this on disk
    seen_s: float  # monotonic time of its last fetch


class LeaderLog:
    """What the leader of `epoch` knows of its followers."""

    def __init__(self, store: Store, config: ClusterConfig, epoch: int, epochs: Epochs,
                 tick: Callable[[], TickState | None], clock: Clock) -> None:
        self.store = store
        self.clock = clock
        self.config = config
        self.epoch = epoch
        self.epochs = epochs
        self._tick = tick
        self.durable_offset = store.log_end_offset  # a new leader's whole log is on its disk
        self.followers: dict[str, Progress] = {}
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []  # (offset, seq, future)
        self._seq = itertools.count()
        self._new_data = asyncio.Event()
        self.deposed = asyncio.Event()  # a follower knows a higher epoch
        self._closed: BaseException | None = None

    # == the group commit's side ==============================================

    async def replicated(self, end_offset: int) -> None:
        """Return once a quorum has every record before `end_offset` on disk
        (acks=leader: at once); raise Unavailable after write_timeout_ms or
        if this node stops leading."""
        if self._closed is not None:
            raise Unavailable(str(self._closed))
        if end_offset > self.durable_offset:
            self.durable_offset = end_offset
            self._new_data.set()
            self._new_data = asyncio.Event()
        if self.config.acks is Acks.LEADER:
            if not self.has_lease():
                raise Unavailable("this leader has not heard from a majority lately; retry")
            return
        if self.quorum_offset() >= end_offset:
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (end_offset, next(self._seq), future))
        try:
            await self.clock.wait_for(asyncio.shield(future), self.config.write_timeout_ms / 1000)
        except TimeoutError:
            future.cancel()  # nobody waits for it now: close() must not fail it unseen
            raise Unavailable(f"no quorum acknowledged offset {end_offset} within "
                              f"{self.config.write_timeout_ms} ms; retry") from None

    def quorum_offset(self) -> int:
        offsets = sorted([self.durable_offset, *(p.offset for p in self.followers.values())], reverse=True)
        need = self.config.quorum
        return offsets[need - 1] if len(offsets) >= need else 0

    def has_lease(self, now_s: float | None = None) -> bool:
        """Has a majority (this node counted) fetched within lease_ms?"""
        now_s = self.clock.monotonic_s() if now_s is None else now_s
        fresh = sum(1 for p in self.followers.values() if now_s - p.seen_s <= self.config.lease_ms / 1000)
        return 1 + fresh >= self.config.quorum

    def _release_waiters(self) -> None:
        quorum = self.quorum_offset()
        while self._waiters and self._waiters[0][0] <= quorum:
            _, _, future = heapq.heappop(self._waiters)
            if not future.done():
                future.set_result(None)

    def keep_log_from(self) -> int:
        """Oldest offset a follower still needs, within the retention cap."""
        end = self.store.log_end_offset
        wanted = min((p.offset for p in self.followers.values()), default=end)
        return max(wanted, end - self.config.retain_log_bytes)

    def close(self, reason: str) -> None:
        """This node stopped leading: fail every write still waiting."""
        self._closed = Unavailable(reason)
        for _, _, future in self._waiters:
            if not future.done():
                future.set_exception(Unavailable(reason))
        self._waiters.clear()
        self._new_data.set()

    # == followers' fetches =====================================================

    async def fetch(self, request: dict[str, Any]) -> dict[str, Any]:
        node, offset = request["node"], int(request["offset"])
        if node not in self.config.peers or node == self.config.node_id:
            # only a member's fetch acknowledges: a quorum is of members
            return {"status": "not_a_member", "epoch": self.epoch}
        if int(request["epoch"]) > self.epoch:
            self.deposed.set()
            return {"status": "stale", "epoch": self.epoch}
        if self._closed is not None:  # (it stopped leading, or promised a newer candidate: nothing to follow)
            return {"status": "not_leader", "epoch": self.epoch}
        answer = {"epoch": self.epoch, "leader": self.config.node_id, "history": self.epochs.history,
                  "end_offset": self.durable_offset, "log_start": self.store.log_start_offset}
        if self.epochs.diverges(int(request["last_epoch"]), offset, self.durable_offset) \
                or offset > self.durable_offset:
            return {**answer, "status": "diverged"}
        if offset < self.store.log_start_offset:
            return {**answer, "status": "snapshot"}
        self.followers[node] = Progress(offset, self.clock.monotonic_s())
        self._release_waiters()
        if offset >= self.durable_offset and self._closed is None:
            new_data = self._new_data
            with contextlib.suppress(TimeoutError):
                await self.clock.wait_for(new_data.wait(), max(0, int(request.get("wait_ms", 0))) / 1000)
        records = []
        if offset < self.durable_offset:
            records = self.store.read_log(offset, self.durable_offset, FETCH_MAX_BYTES)
        tick = self._tick()
        return {**answer, "status": "ok", "end_offset": self.durable_offset, "records": records,
                "tick": None if tick is None else list(tick)}


def serve_catchup(store: Store, epochs: Epochs, request: dict[str, Any]) -> dict[str, Any]:
    """A node that is not the leader serves its log to a candidate catching
    up (no waiting, no acknowledgement counted)."""
    end = store.log_end_offset
    offset = int(request["offset"])
    answer = {"epoch": epochs.last_epoch(end), "leader": None, "history": epochs.history,
              "end_offset": end, "log_start": store.log_start_offset, "tick": None}
    if epochs.diverges(int(request["last_epoch"]), offset, end) or offset > end:
        return {**answer, "status": "diverged"}
    if offset < store.log_start_offset:
        return {**answer, "status": "snapshot"}
    records = store.read_log(offset, end, FETCH_MAX_BYTES) if offset < end else []
    return {**answer, "status": "ok", "records": records}


class Replica(Protocol):
    """What a `Follower` needs of the node it keeps in step (the cluster
    node, broker.cluster, is one)."""

    @property
    def election(self) -> Election: ...

    @property
    def store(self) -> Store: ...  # the node may replace it (a snapshot installed)

    @property
    def epochs(self) -> Epochs: ...

    @property
    def apply_lock(self) -> asyncio.Lock: ...  # held while records are applied

    def set_epochs(self, epochs: Epochs) -> None:
        """Persist and keep a new epoch history (or promise)."""
        ...

    def write_tick(self, tick: TickState) -> None:
        """Persist the leader's tick state."""
        ...

    async def post(self, node_id: str, call: str, message: dict[str, Any], timeout_s: float = ...) -> dict[str, Any]:
        """Make a /_cluster/ call to a peer; raise if it fails or refuses."""
        ...


class Follower:
    """Keeps this node's commit log, delay logs and tick file in step with
    the leader's. `run()` is the fetch loop; it returns when the node is to
    take a snapshot (`needs_snapshot` says from whom, until the next run)
    or is stopped. It alone writes its fields; the node reads them."""

    def __init__(self, node: Replica, config: ClusterConfig, clock: Clock) -> None:
        self.node = node
        self.config = config
        self.clock = clock
        self.needs_snapshot: str | None = None
        self.fetched_records = 0
        self.last_tick: TickState | None = None

    async def run(self) -> None:
        node, config = self.node, self.config
        self.needs_snapshot = None
        while True:
            term, leader_id = node.election.claimed
            if leader_id is None or leader_id == config.node_id or term < node.epochs.promised:
                await self.clock.sleep(config.tick_sync_ms / 1000)
                continue
            store = node.store
            end = store.log_end_offset
            request = {"node": config.node_id, "epoch": term, "offset": end,
                       "last_epoch": node.epochs.last_epoch(end), "wait_ms": config.tick_sync_ms, "catchup": False}
            try:
                answer = await node.post(leader_id, "fetch", request, FETCH_TIMEOUT_S)
            except Exception as e:  # leader down or restarting: the election will tell
                log.debug("fetch from %s failed: %r", leader_id, e)
                await self.clock.sleep(config.tick_sync_ms / 1000)
                continue
            status = answer.get("status")
            if status in ("diverged", "snapshot"):
                log.warning("log at %d is %s against leader %s (epoch %d): taking a snapshot", end,
                            "diverged" if status == "diverged" else "behind the retained log", leader_id, term)
                self.needs_snapshot = leader_id
                return
            if status != "ok" or int(answer["epoch"]) < node.epochs.promised:
                await self.clock.sleep(config.tick_sync_ms / 1000)
                continue
            await self.apply(answer)

    def forget_tick(self) -> None:
        """The tick file was written by another meanwhile (the node's own
        wheel, while it led): the next tick fetched is written even if it
        is the last one taken."""
        self.last_tick = None

    async def apply(self, answer: dict[str, Any]) -> int:
        """Append, fsync and apply the records of a fetch answer; persist the
        leader's history and tick. Returns how many records it took."""
        node = self.node
        history = tuple(tuple(h) for h in answer["history"])
        if history != node.epochs.history:
            node.set_epochs(node.epochs.follow(history))
        records = answer.get("records") or []
        if records:
            async with node.apply_lock:
                store = node.store
                for offset, body in records:
                    store.append_replicated(offset, body)
                store.advance(self.clock.now_ms())
                await asyncio.to_thread(store.sync_log)
                store.apply_pending()
            self.fetched_records += len(records)
        tick = answer.get("tick")
        # The tick may only cover releases this log holds: take it once
        # every record the leader had when it answered is here.
        if tick is not None and node.store.log_end_offset >= int(answer["end_offset"]):
            tick = TickState(*tick)
            if tick != self.last_tick:
                node.write_tick(tick)
                self.last_tick = tick
        return len(records)
