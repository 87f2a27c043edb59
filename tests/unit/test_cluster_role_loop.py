"""broker.cluster.role_loop, the driver of replication.roles.step: a real
`ClusterNode` over a real Store, with a FakeElection for Raft, a FakeClock
for every wait, and the other two nodes of the cluster as in-process fakes
answering at the node's own peer-call seam (its PeerClient's `post`). No
sockets, no real sleeps: time passes only when the test lets it.

Each move is checked by what the node shows: its role (and /health), its
broker (running or stopped), its epochs file, its leadership.log, and what
it posted to which peer. Covered: an elected follower gathering positions,
claiming and leading; no majority, a refusal, a claim not committed, Raft
moving on mid-claim -> following again, retrying RETRY_MS later; the Raft
term moving on, or a newer candidate's promise, making the leader stand
down and follow the new one; catching up from a peer with a longer log in
a later epoch before leading, or by snapshot from one whose log starts
after this node's end; a fetch cancelled in its fsync by an election,
its records applied before the broker starts; a failed broker making the
leader leave; stopping (SIGTERM) a leader (a handover) and a follower.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from typing import NamedTuple

import orjson
import pytest
from fakes import FakeClock, FakeElection

from broker.cluster.lead import HANDOVER_TIMEOUT_S
from broker.cluster.peer_client import PeerClient
from broker.cluster.role_loop import POLL_S, POSITION_TIMEOUT_S
from broker.cluster.snapshots import Snapshots
from broker.core.bulk_params import BulkFilter, RescheduleMsgsRequest
from broker.disk.backend import Broker
from broker.disk.bulk import MOVE_SLICE
from broker.http.http_types import Request
from broker.node.cluster import ClusterNode
from broker.node.config import ServeConfig
from replication import protocol, snapshot
from replication.config import ClusterConfig, Peer
from replication.epochs import Epochs
from replication.log_stream import LeaderLog, serve_catchup
from replication.roles import RETRY_MS, Role
from storage.config import StoreConfig
from storage.entry import MS_PER_HOUR, Status
from storage.errors import CorruptionError, Unavailable
from storage.store import NewMessage, Store
from storage.types import StateChange

START_MS = 490_000 * MS_PER_HOUR
POLL_MS = int(POLL_S * 1000)
STORE = StoreConfig(segment_bytes=64 * 1024, id_shard_initial_slots=16)
PEERS = {n: Peer(n, "127.0.0.1", 9000 + i, 9100 + i) for i, n in enumerate(("n1", "n2", "n3"))}


def cluster(node_id: str) -> ClusterConfig:
    return ClusterConfig(node_id, PEERS, insecure=True)


@pytest.fixture(autouse=True)
def threads_inline(monkeypatch):
    """fsyncs run in worker threads (asyncio.to_thread); run them inline, so
    that when FakeClock.settle finds every task asleep, none is still
    waiting for a thread while the fake time jumps."""
    async def inline(func, /, *args, **kwargs):
        return func(*args, **kwargs)
    monkeypatch.setattr(asyncio, "to_thread", inline)


class Posted(NamedTuple):
    at_ms: int
    to: str
    call: str
    message: dict


class FakePeer:
    """Another node of the cluster, as its /_cluster/ calls answer: a real
    store of its own, its epochs, and a LeaderLog while it leads.

    `position` answers as PeerCalls.on_position does (promising the epoch
    unless it promised a later one or leads it), a candidate's catch-up
    fetch as replication.log_stream.serve_catchup, a follower's fetch from
    its LeaderLog (or "not_leader"). `cut(call, how)` makes a call fail:
    "down" (refused at once) or "silent" (no answer until the caller's
    timeout, on the fake clock)."""

    def __init__(self, node_id: str, directory: str, clock: FakeClock) -> None:
        self.node_id = node_id
        self.clock = clock
        self.store = Store.open(directory, STORE, now_ms=clock.now_ms())
        self.epochs = Epochs()
        self.leader_log: LeaderLog | None = None
        self.cuts: dict[str, str] = {}

    def cut(self, *calls: str, how: str = "down") -> None:
        for call in calls or ("position", "fetch"):
            self.cuts[call] = how

    def heal(self) -> None:
        self.cuts.clear()

    def lead(self, term: int) -> None:
        self.epochs = self.epochs.begin(term, self.store.log.end_offset)
        self.leader_log = LeaderLog(self.store, cluster(self.node_id), term, self.epochs, lambda: None, self.clock)

    async def answer(self, call: str, message: dict, timeout_s: float) -> dict:
        how = self.cuts.get(call)
        if how == "down":
            raise ConnectionError(f"{self.node_id} refused the connection")
        if how == "silent":
            await self.clock.sleep(timeout_s)
            raise TimeoutError(f"{self.node_id} did not answer {call}")
        if call == "position":
            return self._position(int(message["epoch"]))
        if message.get("catchup"):
            return serve_catchup(self.store, self.epochs, message)
        if self.leader_log is not None:
            return await self.leader_log.fetch(message)
        return {"status": "not_leader", "epoch": self.epochs.promised}

    def _position(self, epoch: int) -> dict:
        end = self.store.log.end_offset
        answer = {"promised": self.epochs.promised, "end_offset": end, "last_epoch": self.epochs.last_epoch(end),
                  "history": self.epochs.history}
        if epoch < self.epochs.promised or (self.leader_log is not None and epoch <= self.leader_log.epoch):
            return {**answer, "status": "refused"}
        self.epochs = self.epochs.promise(epoch)
        return {**answer, "status": "ok", "promised": epoch}


class FakeCalls(PeerClient):
    """A node's calls to its peers, to FakePeers, through the same msgpack
    encoding as the wire, recorded in `posted`."""

    def __init__(self, clock: FakeClock, peers: dict[str, FakePeer]) -> None:
        super().__init__(cluster("n1"), None)
        self.clock = clock
        self.peers = peers
        self.posted: list[Posted] = []

    async def post(self, node_id: str, call: str, message: dict, timeout_s: float = 5.0) -> dict:
        message = protocol.unpack(protocol.pack(message))
        self.posted.append(Posted(self.clock.now_ms(), node_id, call, message))
        await asyncio.sleep(0)  # a call always lets other tasks run, as a socket's does
        answer = await self.peers[node_id].answer(call, message, timeout_s)
        return protocol.unpack(protocol.pack(answer))


class DrivenNode(ClusterNode):
    """A ClusterNode whose peer calls go to FakePeers (FakeCalls)."""

    def __init__(self, config: ServeConfig, clock: FakeClock, election: FakeElection,
                 peers: dict[str, FakePeer]) -> None:
        self.calls = FakeCalls(clock, peers)
        super().__init__(config, config.cluster, clock, election, self.calls)

    @property
    def posted(self) -> list[Posted]:
        return self.calls.posted


class Harness:
    """Node n1 of a 3-node cluster (n2 and n3 are FakePeers), started as
    `run_cluster` starts it; `stop` stops it as SIGTERM does."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.clock = FakeClock(START_MS)
        self.election = FakeElection("n1")
        self.peers = {n: FakePeer(n, os.path.join(directory, n), self.clock) for n in ("n2", "n3")}
        self.node: DrivenNode | None = None
        self.task: asyncio.Task[None] | None = None

    @property
    def data_dir(self) -> str:
        return os.path.join(self.directory, "n1")

    async def start(self) -> DrivenNode:
        config = ServeConfig(data_dir=self.data_dir, store=STORE, cluster=cluster("n1"))
        self.node = DrivenNode(config, self.clock, self.election, self.peers)
        self.task = asyncio.create_task(self.node.run(), name="roles")
        await self.clock.settle()
        return self.node

    async def run_for(self, ms: int) -> None:
        await self.clock.run_until(self.clock.now_ms() + ms)

    async def until(self, done, within_ms: int, step_ms: int = 10) -> int:
        """Let time pass in steps until done(); returns the time it took."""
        started = self.clock.now_ms()
        await self.clock.settle()
        while not done():
            assert self.clock.now_ms() - started < within_ms, f"not done within {within_ms} ms"
            await self.run_for(step_ms)
        return self.clock.now_ms() - started

    async def elect(self, term: int, leader: str = "n1") -> None:
        """Raft elects `leader` in `term`; the role loop sees it on its next poll."""
        self.election.term, self.election.leader_id = term, leader
        await self.run_for(POLL_MS)

    async def complete(self, coro, within_ms: int) -> int:
        """Run `coro` to its end, letting time pass; returns the time it took."""
        task = asyncio.create_task(coro)
        took = await self.until(task.done, within_ms)
        await task
        return took

    async def stop(self) -> int:
        """SIGTERM, as broker.node.server.run_cluster handles it: the role loop
        cancelled, the lead handed over, the node closed. Returns how long
        the handover took."""
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        took = await self.complete(self.node.handover(), within_ms=10_000)
        await self.node.close()
        return took

    def close_peers(self) -> None:
        for peer in self.peers.values():
            peer.store.close()


def drive(tmp_path, scenario) -> None:
    """Run `scenario(harness)` on an event loop of its own; stop the node
    (if the scenario left it running) and close the peers."""
    h = Harness(str(tmp_path))

    async def main():
        try:
            await scenario(h)
        finally:
            if h.task is not None and not h.node.state.stopping:
                await h.stop()
            h.close_peers()
    asyncio.run(main())


# == what the node shows ===========================================================

def leadership(node: ClusterNode) -> list[tuple[int, str, str]]:
    """leadership.log as (term, node, event) lines."""
    path = os.path.join(node.state.data_dir, "leadership.log")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [(line["term"], line["node"], line["event"]) for line in map(json.loads, f)]


def epochs_file(node: ClusterNode) -> Epochs:
    return Epochs.load(Epochs.path(node.state.data_dir))


async def health(node: ClusterNode) -> tuple[str, int]:
    """(role, term) as GET /health answers them."""
    body = orjson.loads((await node.health(Request("GET", "/health", b"", {}, b"", None))).body)
    return body["role"], body["term"]


def posted(node: DrivenNode, call: str) -> list[tuple[str, dict]]:
    return [(p.to, p.message) for p in node.posted if p.call == call]


def broker_stopped(broker) -> bool:
    return all(task.done() for task in broker._tasks)


async def leading(h: Harness, term: int) -> tuple[DrivenNode, Broker]:
    """Start n1 and let Raft elect it in `term`: it leads; returns its broker."""
    node = await h.start()
    await h.elect(term)
    assert node.state.leads and leadership(node) == [(term, "n1", "start")]
    return node, node.state.broker


def stood_down(node: ClusterNode, broker: Broker, term: int) -> bool:
    """The leader of `term` stood down: following, its broker stopped and
    gone, the end of its term in leadership.log."""
    return (node.state.roles.role is Role.FOLLOWER and node.state.broker is None and node.api.broker is None
            and node.state.leader_log is None and broker_stopped(broker)
            and leadership(node) == [(term, "n1", "start"), (term, "n1", "end")])


async def fetched_by(node: ClusterNode, peer: str, term: int) -> dict:
    """`peer`, following `node`, fetches from its log end (so acknowledges
    all of it), through the node's own /_cluster/fetch handler."""
    end = node.state.store.log.end_offset
    fetch = {"node": peer, "epoch": term, "offset": end, "last_epoch": node.state.epochs.last_epoch(end), "wait_ms": 0,
             "catchup": False}
    response = await node.peer_calls.on_fetch(Request("POST", "/_cluster/fetch", b"", {}, protocol.pack(fetch), None))
    return protocol.unpack(response.body)


def send(store: Store, ids: range) -> int:
    for i in ids:
        store.send([NewMessage("t", f"m{i}", "body", START_MS, START_MS + 60_000, 60_000, 1)], START_MS)
    store.commit()
    return store.log.end_offset


# == a follower becomes leader ======================================================

def test_a_follower_elected_by_raft_gathers_positions_claims_and_leads(tmp_path):
    async def scenario(h: Harness):
        node = await h.start()
        await h.run_for(5 * POLL_MS)  # Raft names no leader: nothing is tried
        assert node.state.roles.role is Role.FOLLOWER and node.state.broker is None and node.posted == []
        assert await health(node) == ("follower", 0)
        assert node.role_loop._follow_task is not None and not node.role_loop._follow_task.done()

        await h.elect(3)
        assert posted(node, "position") == [("n2", {"node": "n1", "epoch": 3}), ("n3", {"node": "n1", "epoch": 3})]
        assert h.peers["n2"].epochs.promised == h.peers["n3"].epochs.promised == 3
        assert h.election.claims == [3] and h.election.claimed == (3, "n1")
        assert node.state.roles.role is Role.LEADER and node.state.leads and node.state.leading_term == 3
        assert node.state.broker is not None and node.api.broker is node.state.broker and not broker_stopped(node.state.broker)
        assert node.state.leader_log is not None and node.state.leader_log.epoch == 3
        assert node.role_loop._follow_task is None  # a leader fetches from no one
        assert node.state.tick_file is None  # the broker's wheel writes the tick now
        assert epochs_file(node) == node.state.epochs == Epochs(3, ((3, 0),))
        assert leadership(node) == [(3, "n1", "start")]
        assert await health(node) == ("leader", 3)
        assert node.state.known_leader() == "n1"
        assert posted(node, "fetch") == []  # nothing to catch up: every log is empty

        await h.run_for(20 * POLL_MS)  # Raft keeps it leader: it goes on leading
        assert node.state.leads and leadership(node) == [(3, "n1", "start")] and h.election.claims == [3]
    drive(tmp_path, scenario)


def test_a_majority_answering_is_enough_a_silent_peer_is_not_waited_for(tmp_path):
    """A peer cut off without a word (a black-holed link) would answer only
    at POSITION_TIMEOUT_S: with the other peer's promise the node has its
    majority and leads at once (a fault drill's failover took 3.2 s so)."""
    async def scenario(h: Harness):
        h.peers["n3"].cut("position", how="silent")
        node = await h.start()
        await h.elect(5)
        assert [to for to, _ in posted(node, "position")] == ["n2", "n3"]
        assert node.state.leads and node.state.leading_term == 5  # within the election's poll, not POSITION_TIMEOUT_S later
        assert h.peers["n3"].epochs.promised == 0
    drive(tmp_path, scenario)


def test_one_peer_answering_is_a_majority_of_three(tmp_path):
    async def scenario(h: Harness):
        h.peers["n3"].cut(how="down")
        node = await h.start()
        await h.elect(5)
        assert [to for to, _ in posted(node, "position")] == ["n2", "n3"]
        assert node.state.leads and node.state.leading_term == 5 and node.state.broker is not None
        assert h.peers["n3"].epochs.promised == 0  # never reached
        assert leadership(node) == [(5, "n1", "start")]
    drive(tmp_path, scenario)


# == an attempt given up: following again, retrying RETRY_MS later ===================

def test_without_a_majority_it_stays_a_follower_and_tries_again_after_the_retry(tmp_path):
    async def scenario(h: Harness):
        for peer in h.peers.values():
            peer.cut("position", how="silent")
        node = await h.start()
        await h.elect(3)
        first = node.posted[0].at_ms
        assert [to for to, _ in posted(node, "position")] == ["n2", "n3"]
        assert node.state.roles.role is Role.CANDIDATE and await health(node) == ("follower", 0)

        # the peers' answers are awaited POSITION_TIMEOUT_S, then the attempt is given up
        gave_up_ms = first + int(POSITION_TIMEOUT_S * 1000)
        await h.clock.run_until(gave_up_ms - 1)
        assert node.state.roles.role is Role.CANDIDATE
        await h.clock.run_until(gave_up_ms)
        assert node.state.roles.role is Role.FOLLOWER and node.state.roles.next_try_ms == gave_up_ms + RETRY_MS
        assert node.role_loop._follow_task is not None and not node.role_loop._follow_task.done()
        assert node.state.broker is None and h.election.claims == [] and leadership(node) == []
        assert epochs_file(node) == Epochs(3, ())  # it promised itself term 3, and leads nothing

        # Raft still calls it leader: no new attempt before RETRY_MS, one at the first poll after
        await h.clock.run_until(gave_up_ms + RETRY_MS - 1)
        assert len(posted(node, "position")) == 2
        for peer in h.peers.values():
            peer.heal()
        await h.clock.run_until(gave_up_ms + RETRY_MS + POLL_MS)
        second = [p.at_ms for p in node.posted if p.call == "position"][2:]
        assert len(second) == 2 and gave_up_ms + RETRY_MS <= second[0] < gave_up_ms + RETRY_MS + POLL_MS
        assert node.state.leads and node.state.leading_term == 3 and h.election.claims == [3]
        assert leadership(node) == [(3, "n1", "start")]
    drive(tmp_path, scenario)


def test_a_peer_that_promised_a_later_term_makes_it_give_up_at_once(tmp_path):
    async def scenario(h: Harness):
        h.peers["n2"].epochs = Epochs(4, ())  # another candidate got its promise of term 4
        node = await h.start()
        await h.elect(3)
        asked_ms = node.posted[0].at_ms
        assert node.state.roles.role is Role.FOLLOWER and node.state.roles.next_try_ms == asked_ms + RETRY_MS
        assert node.state.broker is None and h.election.claims == [] and leadership(node) == []
        assert h.peers["n3"].epochs.promised == 3  # n3 promised; one refusal is enough to give up
    drive(tmp_path, scenario)


def test_a_claim_that_is_not_committed_leaves_it_a_follower(tmp_path):
    async def scenario(h: Harness):
        h.election.claims_commit = False
        node = await h.start()
        await h.elect(3)
        assert h.election.claims == [3] and h.election.claimed == (0, None)
        assert node.state.roles.role is Role.FOLLOWER and node.state.broker is None and node.state.leader_log is None
        assert leadership(node) == [] and await health(node) == ("follower", 0)
        assert node.role_loop._follow_task is not None and not node.role_loop._follow_task.done()
        assert epochs_file(node) == Epochs(3, ())  # promised, never begun

        await h.run_for(RETRY_MS + POLL_MS)  # Raft still calls it leader: it tries again
        assert h.election.claims == [3, 3] and node.state.broker is None
        h.election.claims_commit = True
        await h.run_for(RETRY_MS + POLL_MS)
        assert h.election.claims == [3, 3, 3] and node.state.leads and leadership(node) == [(3, "n1", "start")]
    drive(tmp_path, scenario)


class DeposedWhileClaiming(FakeElection):
    """Raft elects another node while this one's claim is in flight."""

    async def claim(self, term: int) -> bool:
        committed = await super().claim(term)
        self.term, self.leader_id = term + 1, "n2"
        return committed


def test_raft_moving_on_while_it_claims_leaves_it_a_follower(tmp_path):
    async def scenario(h: Harness):
        h.election = DeposedWhileClaiming("n1")
        node = await h.start()
        await h.elect(3)
        assert h.election.claims == [3]
        assert node.state.roles.role is Role.FOLLOWER and node.state.broker is None and leadership(node) == []
        await h.run_for(RETRY_MS + 2 * POLL_MS)  # Raft no longer calls it leader: no new attempt
        assert h.election.claims == [3] and len(posted(node, "position")) == 2
    drive(tmp_path, scenario)


# == a leader stands down ============================================================

def test_the_raft_term_moving_on_makes_the_leader_stand_down_and_follow_the_new_one(tmp_path):
    async def scenario(h: Harness):
        node, broker = await leading(h, 3)
        leader_log = node.state.leader_log

        h.peers["n2"].lead(4)  # n2 is elected in term 4 and claims it
        h.election.claimed = (4, "n2")
        await h.elect(4, leader="n2")
        assert stood_down(node, broker, 3)
        with pytest.raises(Unavailable, match="no longer leads"):  # a write waiting for followers: 503
            await leader_log.replicated(leader_log.durable_offset + 1)
        assert node.state.tick_file is not None  # following again: the leader's streamed tick is kept here
        assert await health(node) == ("follower", 4) and node.state.known_leader() == "n2"

        await h.run_for(5 * POLL_MS)  # the follower loop fetches from the new leader
        fetches = posted(node, "fetch")
        assert fetches and all(to == "n2" and m["epoch"] == 4 and not m["catchup"] for to, m in fetches)
        assert "n1" in h.peers["n2"].leader_log.followers
        assert epochs_file(node) == node.state.epochs == Epochs(4, ((4, 0),))  # the new leader's history
        assert node.state.broker is None and h.election.claims == [3]
    drive(tmp_path, scenario)


def test_a_newer_candidates_promise_makes_the_leader_stand_down(tmp_path):
    async def scenario(h: Harness):
        node, broker = await leading(h, 3)
        request = Request("POST", "/_cluster/position", b"", {}, protocol.pack({"node": "n2", "epoch": 4}), None)
        answer = protocol.unpack((await node.peer_calls.on_position(request)).body)
        assert answer["status"] == "ok" and answer["promised"] == 4
        assert epochs_file(node) == Epochs(4, ((3, 0),))
        await h.run_for(POLL_MS)
        assert stood_down(node, broker, 3)

        # Raft has not told this node yet and still calls it leader of term 3,
        # but it promised term 4: it does not lead term 3 again
        await h.run_for(3 * RETRY_MS)
        assert stood_down(node, broker, 3)
    drive(tmp_path, scenario)


def test_a_leader_that_promised_a_newer_candidate_answers_no_write_past_what_it_reported(tmp_path):
    """The candidate n2 of term 4 has this leader's promise and catches up
    to the log end it reported. A send reaching the leader before its role
    loop's next poll was answered 200 once n3 -- which never promised term
    4, n2 having its majority already -- fetched it: a record past the end
    n2 leads from, lost with this node's tail (a fault drill lost such a
    message). A leader's log now stops acknowledging at its promise."""
    async def scenario(h: Harness):
        node, broker = await leading(h, 3)
        request = Request("POST", "/_cluster/position", b"", {}, protocol.pack({"node": "n2", "epoch": 4}), None)
        answer = protocol.unpack((await node.peer_calls.on_position(request)).body)
        assert answer["status"] == "ok"
        reported = answer["end_offset"]
        sending = asyncio.create_task(broker.send([NewMessage("t", "late", "body", START_MS, START_MS + 60_000,
                                                              60_000, 1)]))
        for _ in range(500):  # (its fsync runs in a real thread: real time, the fake clock stands still)
            if sending.done() or node.state.store.log.end_offset > reported:
                break
            await asyncio.sleep(0.01)
        await fetched_by(node, "n3", 3)  # n3 follows term 3 still, and acknowledges the whole log
        await h.clock.settle()
        await asyncio.wait({sending}, timeout=5)
        assert sending.done() and isinstance(sending.exception(), Unavailable), sending
    drive(tmp_path, scenario)


def test_a_leader_promising_in_the_middle_of_a_bulk_reschedule_stands_down_and_stays(tmp_path):
    """The promise cuts the reschedule's slices short (their commits fail):
    a stop's doing, not a failure of the broker. The node stands down as
    a follower; it does not exit."""
    async def scenario(h: Harness):
        node, broker = await leading(h, 3)
        messages = 8 * MOVE_SLICE
        await fetched_by(node, "n3", 3)
        sending = asyncio.create_task(broker.send([NewMessage("t", f"m{i}", "body", START_MS, START_MS + MS_PER_HOUR + i,
                                                              0, 1) for i in range(messages)]))
        while not sending.done():
            await fetched_by(node, "n3", 3)
            await asyncio.sleep(0.01)
        await sending
        moving = asyncio.create_task(broker.reschedule_msgs(RescheduleMsgsRequest("t", BulkFilter(), messages,
                                                                                 24 * MS_PER_HOUR, None)))
        await asyncio.sleep(0.01)  # (a slice or so appended, waiting for the followers)
        request = Request("POST", "/_cluster/position", b"", {}, protocol.pack({"node": "n2", "epoch": 4}), None)
        assert protocol.unpack((await node.peer_calls.on_position(request)).body)["status"] == "ok"
        await asyncio.wait({moving}, timeout=5)
        assert moving.done() and isinstance(moving.exception(), Unavailable), moving
        await h.run_for(POLL_MS)
        assert stood_down(node, broker, 3)
        assert node.state.failed is None and broker.failed is None
    drive(tmp_path, scenario)


def test_a_failed_broker_makes_the_leader_stand_down_and_leave(tmp_path):
    """Raft would keep the node its leader, unable to claim its own term
    again: it stands down and stops, so that another node is elected."""
    async def scenario(h: Harness):
        node, broker = await leading(h, 3)
        broker.failed = OSError("disk full")
        await h.run_for(POLL_MS)
        assert stood_down(node, broker, 3)
        assert isinstance(node.state.failed, OSError) and node.stop_asked.is_set()
    drive(tmp_path, scenario)


# == catching up before leading =======================================================

def longer_log_on_n2(h: Harness) -> tuple[int, int]:
    """n2's log: records of epoch 1 (n1 has them too, as their follower),
    then records of epoch 2 that only n2 has. Returns where each ends."""
    n2 = h.peers["n2"]
    shared = send(n2.store, range(0, 2))
    longer = send(n2.store, range(2, 5))
    n2.epochs = Epochs(2, ((1, 0), (2, shared)))
    store = Store.open(h.data_dir, STORE, now_ms=START_MS)
    for offset, body in n2.store.read_log(0, shared, 1 << 20):
        store.append_replicated(offset, body)
    store.advance(START_MS)
    store.sync_log()
    store.apply_pending()
    store.close()
    Epochs(1, ((1, 0),)).save(Epochs.path(h.data_dir))
    return shared, longer


def test_a_peer_with_a_longer_log_in_a_later_epoch_is_caught_up_from_before_leading(tmp_path):
    async def scenario(h: Harness):
        shared, longer = longer_log_on_n2(h)
        node = await h.start()
        assert node.state.store.log.end_offset == shared
        await h.elect(3)
        assert posted(node, "fetch") == [("n2", {"node": "n1", "epoch": 0, "offset": shared, "last_epoch": 1,
                                                  "wait_ms": 0, "catchup": True})]
        assert node.state.store.log.end_offset == longer
        assert node.state.store.read_log(0, longer, 1 << 20) == h.peers["n2"].store.read_log(0, longer, 1 << 20)
        assert node.state.leads and h.election.claims == [3] and leadership(node) == [(3, "n1", "start")]
        assert epochs_file(node) == node.state.epochs == Epochs(3, ((1, 0), (2, shared), (3, longer)))
        assert node.state.leader_log.durable_offset == longer
        assert (await node.state.broker.get("t", "m4")).msg_id == "m4"  # a record only n2 had
        assert node.state.leader_log.quorum_offset() == 0  # n2 has all of it, but has not said so yet
        assert (await fetched_by(node, "n2", 3))["status"] == "ok"
        assert node.state.leader_log.quorum_offset() == longer
    drive(tmp_path, scenario)


def test_a_peer_whose_log_starts_after_this_ones_end_is_caught_up_from_by_snapshot(tmp_path, monkeypatch):
    """The most advanced peer no longer keeps the log from where this
    node's ends (it deleted it after a checkpoint): the catch-up takes its
    snapshot, as a follower that far behind does, instead of failing and
    retrying (a fault drill saw a candidate do that for minutes)."""
    async def scenario(h: Harness):
        n2 = h.peers["n2"]
        n2.epochs = Epochs(2, ((2, 0),))
        for i in range(200):  # about 200 KB: several 64 KiB segments
            n2.store.send([NewMessage("t", f"m{i}", "x" * 1000, START_MS, START_MS + 60_000, 60_000, 1)], START_MS)
        n2.store.commit()
        end = n2.store.log.end_offset
        n2.store.finish_checkpoint(n2.store.prepare_checkpoint(START_MS))
        assert n2.store.log_start_offset > 0  # what n1 would fetch from 0 is gone
        taken: list[str] = []

        async def take_snapshot(source: str) -> None:  # as snapshots.py does, by a copy instead of HTTP
            taken.append(source)
            copy = os.path.join(h.directory, "n2-snapshot")
            shutil.copytree(os.path.join(h.directory, source), copy)
            node.state.store.close()
            node.state.store = Store.open(copy, STORE, now_ms=START_MS)
            node.state.set_epochs(Epochs(node.state.epochs.promised, ()).follow(n2.epochs.history))

        node = await h.start()
        monkeypatch.setattr(node.snapshots, "take_snapshot", take_snapshot)
        await h.elect(3)
        assert taken == ["n2"]
        assert [m["offset"] for _, m in posted(node, "fetch")] == [0]  # one try, answered "snapshot"
        assert node.state.leads and node.state.store.log.end_offset == end
    drive(tmp_path, scenario)


def test_a_catch_up_that_fails_leaves_it_a_follower_until_the_peer_answers(tmp_path):
    async def scenario(h: Harness):
        shared, longer = longer_log_on_n2(h)
        h.peers["n2"].cut("fetch", how="down")
        node = await h.start()
        await h.elect(3)
        asked_ms = node.posted[0].at_ms
        assert [to for to, _ in posted(node, "fetch")] == ["n2"]
        assert node.state.roles.role is Role.FOLLOWER and node.state.roles.next_try_ms == asked_ms + RETRY_MS
        assert node.state.broker is None and h.election.claims == [] and leadership(node) == []
        assert node.state.store.log.end_offset == shared and epochs_file(node) == Epochs(3, ((1, 0),))

        h.peers["n2"].heal()
        await h.run_for(RETRY_MS + POLL_MS)
        assert node.state.leads and node.state.store.log.end_offset == longer and h.election.claims == [3]
        assert epochs_file(node) == Epochs(3, ((1, 0), (2, shared), (3, longer)))
        await fetched_by(node, "n2", 3)  # n2 follows: the new leader's log reaches a quorum
        assert node.state.leader_log.quorum_offset() == longer
    drive(tmp_path, scenario)


# == stopping (SIGTERM) =============================================================

def test_stopping_the_leader_hands_over_to_a_caught_up_follower_then_leaves(tmp_path):
    async def scenario(h: Harness):
        node, broker = await leading(h, 3)
        end = node.state.store.log.end_offset
        assert (await fetched_by(node, "n2", 3))["status"] == "ok"
        assert node.state.leader_log.followers["n2"].offset == end
        leader_log = node.state.leader_log

        took = await h.stop()
        # n2 has everything: no waiting, only the last round that carries the final tick
        assert took == 2 * node.state.cluster.tick_sync_ms
        assert leadership(node) == [(3, "n1", "start"), (3, "n1", "end")]
        assert broker_stopped(broker) and os.path.exists(node.state.tick_path)
        with pytest.raises(Unavailable, match="stopping"):
            await leader_log.replicated(end + 1)
        assert h.election.closed and node.state.stopping and node.role_loop._follow_task is None
        assert posted(node, "position") == [("n2", {"node": "n1", "epoch": 3}), ("n3", {"node": "n1", "epoch": 3})]
    drive(tmp_path, scenario)


def test_stopping_the_leader_without_live_followers_waits_out_the_handover_timeout(tmp_path):
    async def scenario(h: Harness):
        node, broker = await leading(h, 3)
        took = await h.stop()
        assert HANDOVER_TIMEOUT_S * 1000 <= took <= HANDOVER_TIMEOUT_S * 1000 + 2 * node.state.cluster.tick_sync_ms
        assert leadership(node) == [(3, "n1", "start"), (3, "n1", "end")]
        assert broker_stopped(broker) and h.election.closed and node.state.stopping
    drive(tmp_path, scenario)


def test_stopping_a_follower_only_leaves_the_group(tmp_path):
    async def scenario(h: Harness):
        node = await h.start()
        await h.run_for(5 * POLL_MS)
        follow_task = node.role_loop._follow_task
        took = await h.stop()
        assert took == 0 and h.election.closed and node.state.stopping
        assert follow_task.done() and node.role_loop._follow_task is None
        assert node.state.broker is None and leadership(node) == [] and node.posted == []
    drive(tmp_path, scenario)


def test_records_a_cancelled_fetch_left_appended_are_applied_before_it_leads(tmp_path, monkeypatch):
    """A follower's fetch appends the leader's records, fsyncs them (in a
    worker thread: a point where its task may be cancelled), then applies
    them. Elected while that fsync ran, the node cancelled the fetch and
    built its broker on records appended and not applied: an ack among
    them was unknown to it, so it held the acked message as consuming and
    handed it out again at its ack timeout (a fault drill saw acks
    answered 200 come back after a failover). They are applied first."""
    hold, held, release = [False], asyncio.Event(), asyncio.Event()

    async def to_thread(func, /, *args, **kwargs):
        if hold[0] and getattr(func, "__qualname__", "") == "CommitLog.sync":  # (store.sync_log)
            held.set()
            await release.wait()  # the fsync of a fetch's records, still running
        return func(*args, **kwargs)
    monkeypatch.setattr(asyncio, "to_thread", to_thread)

    async def scenario(h: Harness):
        leader = h.peers["n2"]
        leader.lead(2)
        store = leader.store
        [sent] = store.send([NewMessage("t", "m0", "body", START_MS, START_MS, 3_600_000, 5)], START_MS)
        store.commit()
        where = sent.message.location
        store.update([StateChange(where, Status.READY, 0)], START_MS)
        store.update([StateChange(where, Status.CONSUMING, 1, deadline_ms=START_MS + 5_000)], START_MS)
        store.commit()
        leader.leader_log.durable_offset = store.log.end_offset
        h.election.claimed = (2, "n2")
        h.election.term, h.election.leader_id = 2, "n2"
        node = await h.start()
        await h.until(lambda: node.state.store.log.end_offset == store.log.end_offset, within_ms=5_000)
        await h.run_for(POLL_MS)
        assert node.state.store.status(where) is Status.CONSUMING

        hold[0] = True  # the next fetch's fsync is still running when n1 is elected
        store.update([StateChange(where, Status.ACKED, 1)], START_MS + 100)
        store.commit()
        leader.leader_log.durable_offset = store.log.end_offset
        await h.until(held.is_set, within_ms=5_000)
        await h.elect(3)
        hold[0] = False
        release.set()
        assert node.state.leads and node.state.leading_term == 3
        assert node.state.broker.consuming_total == 0  # the ack is known: nothing is held for it
        for _ in range(10):  # past the pull's ack deadline, n2 following
            await h.run_for(1_000)
            await fetched_by(node, "n2", 3)
        assert node.state.store.status(where) is Status.ACKED and node.state.leads
    drive(tmp_path, scenario)


def test_an_ack_that_changes_nothing_waits_for_the_quorum_of_what_it_reports(tmp_path):
    """A new leader holds, at the end of its log, a record of the last term
    no follower has yet: the ack of m0. The client, whose first attempt
    went to the old term, repeats the ack; the message is acked already,
    so the ack changes nothing, and it was answered at once. Had this node
    then been cut off, the next leader would not have had the ack (a fault
    drill saw it hand such a message out again). The answer now waits
    until a quorum has the log it reports on."""
    async def scenario(h: Harness):
        store = Store.open(h.data_dir, STORE, now_ms=START_MS)
        [sent] = store.send([NewMessage("t", "m0", "body", START_MS, START_MS, 3_600_000, 5)], START_MS)
        store.commit()
        store.update([StateChange(sent.message.location, Status.ACKED, 0)], START_MS)
        store.commit()
        store.close()
        Epochs(2, ((2, 0),)).save(Epochs.path(h.data_dir))
        node = await h.start()
        await h.elect(3)
        assert node.state.leads and node.state.leader_log.quorum_offset() < node.state.store.log.end_offset
        acking = asyncio.create_task(node.state.broker.ack_many("t", ["m0"]))
        await h.run_for(100)
        assert not acking.done()  # what it would report is on this node only
        assert (await fetched_by(node, "n2", 3))["status"] == "ok"
        await h.run_for(10)
        assert acking.done() and acking.result() == [Status.ACKED]
    drive(tmp_path, scenario)


# == a snapshot install, then the lead ===============================================

UNPACK_MS = 500  # how long the unpack's worker thread takes, in fake time


def compacted_leader_n2(h: Harness) -> int:
    """n2 leads term 2 and no longer keeps its log from offset 0 (a
    checkpoint deleted it): a follower starting from 0 needs its snapshot.
    Raft names n2 leader of term 2. Returns n2's log end."""
    n2 = h.peers["n2"]
    n2.lead(2)
    for i in range(200):  # about 200 KB: several 64 KiB segments
        n2.store.send([NewMessage("t", f"m{i}", "x" * 1000, START_MS, START_MS + 60_000, 60_000, 1)], START_MS)
    n2.store.commit()
    n2.store.finish_checkpoint(n2.store.prepare_checkpoint(START_MS))
    assert n2.store.log_start_offset > 0
    n2.leader_log.durable_offset = n2.store.log.end_offset
    h.election.claimed = (2, "n2")
    h.election.term, h.election.leader_id = 2, "n2"
    return n2.store.log.end_offset


def snapshots_by_copy(h: Harness, monkeypatch) -> list[str]:
    """Snapshots come from the peers' stores through replication.snapshot
    (capture, write_tar), without HTTP: the rest of take_snapshot (unpack,
    swap, open) is the node's own. Returns the list of sources taken from."""
    taken: list[str] = []

    async def download_snapshot(snapshots: Snapshots, source: str) -> tuple[str, tuple[tuple[int, int], ...]]:
        taken.append(source)
        peer, peer_dir = h.peers[source], os.path.join(h.directory, source)
        part = os.path.join(snapshots.state.data_dir, "snapshot.tar.part")
        snapshot.write_tar(peer_dir, snapshot.capture(peer_dir, peer.store.log_segment_ends()), part)
        return part, peer.epochs.history
    monkeypatch.setattr(Snapshots, "download_snapshot", download_snapshot)
    return taken


def test_an_election_during_a_snapshot_install_leads_from_the_installed_store(tmp_path, monkeypatch):
    """A follower behind the leader's retained log takes its snapshot; Raft
    elects it while the unpack's worker thread runs. Cancelling the install
    there left that thread unpacking (asyncio.to_thread's thread goes on),
    while the candidate, still on its old store, took another snapshot into
    the same files: the two installs' threads met in snapshot.new and the
    tar (the attempt to lead failed, and a mix of two snapshots could be
    swapped in). The install now ends first, and the node leads from it."""
    unpacks: list[asyncio.Task[None]] = []

    async def to_thread(func, /, *args, **kwargs):
        if func is not snapshot.unpack:
            return func(*args, **kwargs)
        done: asyncio.Future = asyncio.get_running_loop().create_future()

        async def worker() -> None:  # a thread: cancelling the caller does not stop it
            await clock[0].sleep(UNPACK_MS / 1000)
            try:
                result = func(*args, **kwargs)
            except Exception as e:
                if not done.done():
                    done.set_exception(e)
                return
            if not done.done():
                done.set_result(result)
        unpacks.append(asyncio.create_task(worker()))
        return await done
    monkeypatch.setattr(asyncio, "to_thread", to_thread)
    clock: list[FakeClock] = []

    async def scenario(h: Harness):
        clock.append(h.clock)
        end = compacted_leader_n2(h)
        taken = snapshots_by_copy(h, monkeypatch)
        node = await h.start()
        await h.until(lambda: unpacks, within_ms=5_000)  # the follower's install is unpacking
        await h.elect(3)
        await h.until(lambda: node.state.leads, within_ms=5_000)
        assert node.state.failed is None and h.election.claims == [3]
        assert taken == ["n2"]  # one snapshot, installed; no second one over its files
        assert all(t.done() for t in unpacks) and len(unpacks) == 1
        assert [m["catchup"] for _, m in posted(node, "fetch")] == [False]  # nothing left to catch up
        assert node.state.store.log.end_offset == end and node.state.leader_log.durable_offset == end
        assert (await node.state.broker.get("t", "m199")).msg == "x" * 1000
        assert not os.path.exists(os.path.join(node.state.data_dir, snapshot.UNPACKED))
        assert not os.path.exists(os.path.join(node.state.data_dir, snapshot.REPLACED))
    drive(tmp_path, scenario)


def test_a_snapshot_that_does_not_open_stops_the_node(tmp_path, monkeypatch):
    """Once swapped in, a snapshot's store that does not open leaves the
    node no store (the old one is closed): it stops (exit 1), as a failed
    swap does, rather than following on the closed store."""
    async def scenario(h: Harness):
        compacted_leader_n2(h)
        snapshots_by_copy(h, monkeypatch)

        class Refused:  # the Store that broker.cluster.snapshots opens an installed snapshot with
            @staticmethod
            def open(directory, config=None, now_ms=None):
                raise CorruptionError(directory, 0, "a store that does not open")
        monkeypatch.setattr("broker.cluster.snapshots.Store", Refused)
        node = await h.start()
        await h.until(lambda: node.state.failed is not None, within_ms=5_000)
        assert isinstance(node.state.failed, CorruptionError) and node.stop_asked.is_set()
    drive(tmp_path, scenario)
