"""LeaderLog: a write is answered once a quorum has fetched past it; fetches
read the log, carry the tick, and expose stale or diverged followers; a
follower replays the answers into a store of its own, byte for byte."""

from __future__ import annotations

import asyncio

import pytest

from broker.clock import SystemClock
from broker.disk.group_commit import GroupCommit
from broker.observe.metrics import Metrics
from replication.config import Acks, ClusterConfig, Peer
from replication.epochs import Epochs
from replication.log_stream import LeaderLog, serve_catchup
from storage.entry import MS_PER_HOUR
from storage.errors import Unavailable
from storage.store import NewMessage, Store
from wheel.tick_state import TickState

NOW = 490_000 * MS_PER_HOUR
PEERS = {n: Peer(n, "127.0.0.1", 9000 + i, 9100 + i) for i, n in enumerate(("n1", "n2", "n3"))}
TICK = TickState(490_000, 12, 3)


def config(**changes) -> ClusterConfig:
    return ClusterConfig("n1", PEERS, insecure=True, write_timeout_ms=changes.pop("write_timeout_ms", 2000), **changes)


def send(store: Store, count: int, start: int = 0) -> int:
    for i in range(start, start + count):
        store.send([NewMessage("t", f"m{i}", "body", NOW, NOW + 60_000, 60_000, 1)], NOW)
    store.commit()
    return store.log_end_offset


def fetch(offset: int, node: str = "n2", epoch: int = 5, last_epoch: int = 5, wait_ms: int = 0) -> dict:
    return {"node": node, "epoch": epoch, "offset": offset, "last_epoch": last_epoch, "wait_ms": wait_ms}


def leader_log(store: Store, **changes) -> LeaderLog:
    return LeaderLog(store, config(**changes), 5, Epochs(5, ((5, 0),)), lambda: TICK, SystemClock())


def test_a_write_waits_for_a_quorum_of_fetches(tmp_path):
    store = Store.open(str(tmp_path / "leader"), now_ms=NOW)

    async def main():
        log = leader_log(store)
        end = send(store, 3)
        waiting = asyncio.create_task(log.replicated(end))
        await asyncio.sleep(0.05)
        assert not waiting.done()  # only the leader has it
        answer = await log.fetch(fetch(0, "n3"))  # n3 reads it: not yet an acknowledgement
        assert answer["status"] == "ok" and len(answer["records"]) == 3 and answer["tick"] == list(TICK)
        await asyncio.sleep(0.01)
        assert not waiting.done()
        await log.fetch(fetch(end, "n3"))  # fetching from `end` says it has everything before
        await asyncio.wait_for(waiting, 1)
        assert log.quorum_offset() == end
    asyncio.run(main())


def test_only_members_fetches_acknowledge(tmp_path):
    store = Store.open(str(tmp_path), now_ms=NOW)

    async def main():
        log = leader_log(store, write_timeout_ms=200)
        end = send(store, 2)
        for stranger in ("x", "n1"):  # not in --cluster; the leader itself
            answer = await log.fetch(fetch(end, stranger))
            assert answer["status"] == "not_a_member" and "records" not in answer
        assert log.followers == {} and log.quorum_offset() == 0
        with pytest.raises(Unavailable, match="no quorum"):
            await log.replicated(end)
    asyncio.run(main())


def test_a_write_without_quorum_is_unavailable_and_close_fails_waiters(tmp_path):
    store = Store.open(str(tmp_path), now_ms=NOW)

    async def main():
        log = leader_log(store, write_timeout_ms=100)
        end = send(store, 1)
        with pytest.raises(Unavailable, match="no quorum"):
            await log.replicated(end)
        timed_out = [future for _, _, future in log._waiters]
        assert len(timed_out) == 1 and timed_out[0].cancelled()  # close() fails no future nobody awaits
        end = send(store, 1, start=1)
        waiting = asyncio.create_task(log.replicated(end))
        await asyncio.sleep(0.01)
        log.close("stood down")
        with pytest.raises(Unavailable, match="stood down"):
            await waiting
        with pytest.raises(Unavailable):
            await log.replicated(end)
    asyncio.run(main())


def test_acks_leader_answers_at_once_but_only_with_a_lease(tmp_path):
    store = Store.open(str(tmp_path), now_ms=NOW)

    async def main():
        log = leader_log(store, acks=Acks.LEADER)
        end = send(store, 1)
        with pytest.raises(Unavailable, match="majority"):
            await log.replicated(end)  # no follower has fetched lately
        await log.fetch(fetch(0))
        await asyncio.wait_for(log.replicated(end), 1)
    asyncio.run(main())


def test_a_fetch_of_a_higher_epoch_deposes_and_a_diverged_tail_is_named(tmp_path):
    store = Store.open(str(tmp_path), now_ms=NOW)

    async def main():
        log = leader_log(store)
        end = send(store, 2)
        assert (await log.fetch(fetch(0, epoch=6)))["status"] == "stale"
        assert log.deposed.is_set()
        log2 = leader_log(store)
        log2.durable_offset = end
        # a follower whose last records are of epoch 4 past where epoch 5 began
        assert (await log2.fetch(fetch(10, last_epoch=4)))["status"] == "diverged"
        assert (await log2.fetch(fetch(end + 1)))["status"] == "diverged"
    asyncio.run(main())


def test_a_fetch_with_nothing_new_waits_until_a_write_arrives(tmp_path):
    store = Store.open(str(tmp_path), now_ms=NOW)

    async def main():
        log = leader_log(store, acks=Acks.LEADER)
        await log.fetch(fetch(0))
        pending = asyncio.create_task(log.fetch(fetch(0, wait_ms=5000)))
        await asyncio.sleep(0.05)
        assert not pending.done()
        end = send(store, 2)
        await log.replicated(end)
        answer = await asyncio.wait_for(pending, 1)
        assert answer["records"][0][0] == 0 and answer["end_offset"] == end
    asyncio.run(main())


def test_a_follower_replaying_fetches_holds_the_same_log_and_messages(tmp_path):
    leader = Store.open(str(tmp_path / "leader"), now_ms=NOW)
    follower = Store.open(str(tmp_path / "follower"), now_ms=NOW)
    end = send(leader, 50)
    offset = 0
    while offset < end:
        for at, body in leader.read_log(offset, end, 300):
            follower.append_replicated(at, body)
            offset = follower.log_end_offset
        follower.commit()
    assert follower.log_end_offset == end
    assert [b for _, b in follower.read_log(0, end, 1 << 20)] == [b for _, b in leader.read_log(0, end, 1 << 20)]
    assert follower.get("t", "m49").msg == "body"
    with pytest.raises(ValueError, match="does not continue"):
        follower.append_replicated(0, leader.read_log(0, end, 1)[0][1])
    # a node that is not the leader serves the same records to a catching-up candidate
    answer = serve_catchup(follower, Epochs(5, ((5, 0),)), {"offset": 0, "last_epoch": 0})
    assert answer["status"] == "ok" and answer["records"][0][0] == 0


def test_group_commit_answers_only_after_replication(tmp_path):
    store = Store.open(str(tmp_path), now_ms=NOW)

    async def main():
        gate = asyncio.Event()
        seen = []

        async def replicated(end_offset):
            seen.append(end_offset)
            await gate.wait()

        commits = GroupCommit(store, lambda entries: None, Metrics(), replicated)
        runner = asyncio.create_task(commits.run())
        store.send([NewMessage("t", "a", "x", NOW, NOW + 60_000, 60_000, 1)], NOW)
        answered = commits.durable()
        await asyncio.sleep(0.05)
        assert not answered.done() and seen == [store.log_end_offset]
        gate.set()
        await asyncio.wait_for(answered, 1)
        runner.cancel()
    asyncio.run(main())
