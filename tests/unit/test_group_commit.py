"""GroupCommit: many requests, one fsync, run off the event loop (broker
.syncer) while the next commit fills; a failed fsync; and a quiet point
(nothing pending, the wheel told of everything) reached even while appends
never stop."""

import asyncio
import threading
import time

import pytest
from fakes import FaultyDisk

from broker.disk import group_commit
from broker.disk.group_commit import GroupCommit
from broker.observe.metrics import Metrics
from storage.disk import Disk
from storage.entry import MS_PER_HOUR
from storage.errors import Unavailable
from storage.store import NewMessage, Store

NOW = 490_000 * MS_PER_HOUR


def test_a_quiet_point_is_reached_under_continuous_appends(tmp_path):
    store = Store.open(str(tmp_path), now_ms=NOW)
    told = []
    commits = GroupCommit(store, told.extend, Metrics())

    async def main():
        runner = asyncio.create_task(commits.run())
        stop = False
        waits = []

        async def produce():
            i = 0
            while not stop:
                store.send([NewMessage("t", f"m{i}", "x", NOW, NOW + 60_000, 60_000, 1)], NOW)
                waits.append(commits.durable())
                i += 1
                await asyncio.sleep(0)

        producer = asyncio.create_task(produce())
        await asyncio.sleep(0.05)
        seen = [await asyncio.wait_for(commits.at_quiet_point(lambda: (store.pending_records, len(told))), 5)
                for _ in range(3)]
        stop = True
        await producer
        await asyncio.gather(*waits)
        runner.cancel()
        return seen

    seen = asyncio.run(main())
    assert all(pending == 0 for pending, _ in seen)  # nothing appended was left unapplied
    assert seen[0][1] > 0 and seen[-1][1] > seen[0][1]  # and the appends went on in between
    store.close()


class HeldDisk(Disk):
    """A disk whose every fdatasync waits until `release` is set (one that
    takes 50 ms or more), noting the store's pending records as it starts."""

    def __init__(self) -> None:
        self.store: Store | None = None
        self.release = threading.Event()
        self.in_sync = threading.Event()
        self.syncs: list[int] = []

    def fdatasync(self, fd: int) -> None:
        self.syncs.append(self.store.pending_records)
        self.in_sync.set()
        self.release.wait(10)
        super().fdatasync(fd)


def test_a_slow_fsync_does_not_stall_the_loop_and_the_next_commit_fills_meanwhile(tmp_path):
    """An fsync held for as long as the test likes: while it runs, the loop
    reads, appends and answers what needs no fsync; what is appended
    meanwhile is made durable by the next fsync, one for all of it; nobody
    is answered before their fsync ends."""
    disk = HeldDisk()
    store = disk.store = Store.open(str(tmp_path), now_ms=NOW, disk=disk)
    release, in_sync, syncs = disk.release, disk.in_sync, disk.syncs
    commits = GroupCommit(store, lambda entries: None, Metrics())

    def send(msg_id):
        store.send([NewMessage("t", msg_id, "x", NOW, NOW + 60_000, 60_000, 1)], NOW)
        return commits.durable()

    async def main():
        runner = asyncio.create_task(commits.run())
        first = send("a")
        while not in_sync.is_set():  # the first fsync has started, in its thread
            await asyncio.sleep(0.001)
        later = [send(f"b{i}") for i in range(5)]  # appended while it runs
        ticks = 0
        for _ in range(50):  # the loop keeps turning: 50 ms of sleeps, each a turn of the loop
            await asyncio.sleep(0.001)
            ticks += 1
        assert ticks == 50 and not first.done() and not any(f.done() for f in later)
        assert store.pending_records == 6  # none applied before its fsync ends
        release.set()
        await asyncio.wait_for(first, 5)
        await asyncio.wait_for(asyncio.gather(*later), 5)
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)

    asyncio.run(main())
    assert syncs == [1, 5]  # the five appended during the first fsync took one more
    assert store.get("t", "b4") is not None
    store.close()


def test_a_failed_fsync_answers_every_waiting_request_503_and_nothing_after(tmp_path):
    disk = FaultyDisk()
    disk.fdatasync_error = OSError(5, "Input/output error")
    store = Store.open(str(tmp_path), now_ms=NOW, disk=disk)
    commits = GroupCommit(store, lambda entries: None, Metrics())

    async def main():
        runner = asyncio.create_task(commits.run())
        store.send([NewMessage("t", "a", "x", NOW, NOW + 60_000, 60_000, 1)], NOW)
        with pytest.raises(Unavailable):
            await asyncio.wait_for(commits.durable(), 5)
        with pytest.raises(OSError, match="Input/output error"):
            await runner
        with pytest.raises(Unavailable):  # and nothing appended later can be answered either
            commits.durable()

    asyncio.run(main())
    assert disk.fdatasyncs == 1
    disk.fdatasync_error = None  # closing commits what is pending
    store.close()


def test_a_record_nobody_waits_for_rides_with_the_next_commit_or_goes_alone_soon(tmp_path):
    """A pull's record (kick_soon): synced with the next request's commit if
    one comes, else alone within UNWAITED_COMMIT_DELAY_S."""
    store = Store.open(str(tmp_path), now_ms=NOW)
    commits = GroupCommit(store, lambda entries: None, Metrics())

    def append(msg_id):
        store.send([NewMessage("t", msg_id, "x", NOW, NOW + 60_000, 60_000, 1)], NOW)

    async def main():
        runner = asyncio.create_task(commits.run())
        append("pulled")
        commits.kick_soon()
        append("acked")
        await commits.durable()
        assert commits.rounds == 1 and store.pending_records == 0  # one commit for both
        append("alone")
        commits.kick_soon()
        for _ in range(1000):  # (real time: the delay is a real timer)
            if store.pending_records == 0:
                break
            await asyncio.sleep(0.001)
        assert commits.rounds == 2 and store.pending_records == 0
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)

    asyncio.run(main())
    store.close()


def test_a_quiet_point_waited_for_when_the_node_stops_leading_is_answered(tmp_path):
    """A checkpoint begun while leading waits for a quiet point; the node
    stands down and its commits are abandoned (their task cancelled): the
    wait ends with Unavailable instead of lasting for ever (it held the
    checkpoint lock a snapshot install needs: docs/drills.md), and a quiet
    point asked for afterwards is refused at once."""
    store = Store.open(str(tmp_path), now_ms=NOW)
    commits = GroupCommit(store, lambda entries: None, Metrics())

    async def main():
        runner = asyncio.create_task(commits.run())
        store.send([NewMessage("t", "a", "x", NOW, NOW + 60_000, 60_000, 1)], NOW)
        waiting = asyncio.create_task(commits.at_quiet_point(lambda: "prepared"))
        runner.cancel()  # the broker abandoned: no round comes
        await asyncio.gather(runner, return_exceptions=True)
        await asyncio.sleep(0)
        assert not waiting.done()
        commits.abandon()
        with pytest.raises(Unavailable, match="stopped leading"):
            await asyncio.wait_for(waiting, 5)
        with pytest.raises(Unavailable, match="no more commits"):
            await commits.at_quiet_point(lambda: "prepared")

    asyncio.run(main())
    store.close()


class ThreadedDisk(FaultyDisk):
    """Notes which thread each fdatasync ran on; `slow_s` makes them slow."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: list[str] = []
        self.slow_s = 0.0

    def fdatasync(self, fd: int) -> None:  # (no real fsync: the test is about where it runs, not the disk)
        self.threads.append("loop" if threading.current_thread() is threading.main_thread() else "syncer")
        if self.slow_s:
            time.sleep(self.slow_s)


def test_small_rounds_on_a_fast_disk_fsync_on_the_loop_and_a_slow_fsync_hands_them_back(tmp_path, monkeypatch):
    """Rounds of one record: the first INLINE_SYNC_AFTER fsync in the
    syncer thread, the next on the loop once they were all fast; one slow
    fsync and the thread takes over again; a round of many records always
    syncs in the thread."""
    monkeypatch.setattr(group_commit, "INLINE_SYNC_MAX_S", 0.05)  # fast: whatever else the machine runs
    disk = ThreadedDisk()
    store = Store.open(str(tmp_path), now_ms=NOW, disk=disk)
    commits = GroupCommit(store, lambda entries: None, Metrics())
    n = 0

    async def send(count=1):
        nonlocal n
        for _ in range(count):
            n += 1
            store.send([NewMessage("t", f"m{n}", "x", NOW, NOW + 60_000, 60_000, 1)], NOW)
        await asyncio.wait_for(commits.durable(), 5)

    async def main():
        runner = asyncio.create_task(commits.run())
        for _ in range(group_commit.INLINE_SYNC_AFTER + 3):
            await send()
        disk.slow_s = 0.1
        await send()
        disk.slow_s = 0.0
        await send()
        del disk.threads[:]
        for _ in range(group_commit.INLINE_SYNC_AFTER - 1):
            await send()
        await send(group_commit.INLINE_SYNC_RECORDS + 1)
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
        return commits.inline_syncs

    disk.threads.clear()
    synced = asyncio.run(main())
    assert disk.threads[-1] == "syncer"  # a round of many records
    assert disk.threads[:-1] == ["syncer"] * (group_commit.INLINE_SYNC_AFTER - 1)  # the count starts anew
    assert synced == 4  # 3 after the first run of fast ones, and the slow one itself
    store.close()


@pytest.mark.parametrize("in_flight", [False, True])
def test_a_cancelled_waiter_leaves_the_commit_it_shares_to_the_others(tmp_path, in_flight):
    """Every request of a commit awaits one future. A task that waits on it
    too (the wheel's releases, a pusher's pull) and is cancelled (the node
    stands down and abandons its broker, pushers stop) must not cancel it
    for the others: a request's frame that ended with CancelledError wrote
    no answer, and the follower that had forwarded it waited for ever (a
    drill saw a SIGTERM'd node wait its 10 s shutdown grace for it). Both
    while the records wait for their round (`in_flight` False) and while
    a quorum is awaited after the fsync (True); the request is called from
    a loop callback, as the HTTP server runs one (no Task), and from a Task."""
    store = Store.open(str(tmp_path), now_ms=NOW)
    quorum = asyncio.Event()

    async def replicated(end_offset: int) -> None:
        await quorum.wait()

    commits = GroupCommit(store, lambda entries: None, Metrics(), replicated=replicated)

    async def main():
        loop = asyncio.get_running_loop()
        runner = asyncio.create_task(commits.run())
        store.send([NewMessage("t", "a", "x", NOW, NOW + 60_000, 60_000, 1)], NOW)
        outside = []  # a request's frame, run from a callback: no current Task
        loop.call_soon(lambda: outside.append(commits.durable()))
        request = asyncio.ensure_future(_await_durable(commits))
        background = asyncio.ensure_future(_await_durable(commits))
        await asyncio.sleep(0)
        if in_flight:
            for _ in range(1000):  # the round took them: fsync'ed, waiting for the quorum
                if store.pending_records == 0:
                    break
                await asyncio.sleep(0.001)
            assert store.pending_records == 0
        background.cancel()
        await asyncio.gather(background, return_exceptions=True)
        assert background.cancelled()
        assert not outside[0].cancelled() and not request.done()
        quorum.set()
        await asyncio.wait_for(asyncio.gather(outside[0], request), 5)  # answered, not cancelled
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)

    asyncio.run(main())
    store.close()


async def _await_durable(commits: GroupCommit) -> None:
    await commits.durable()


def test_a_commit_cancelled_while_it_waits_for_the_apply_lock_is_answered_by_abandon(tmp_path):
    """The round waits for the apply lock (a snapshot copying the store's
    files holds it) when the node stands down and cancels it: the requests
    of that round are still the group commit's to answer, and `abandon`
    answers them 503 (they waited for ever)."""
    store = Store.open(str(tmp_path), now_ms=NOW)
    lock = asyncio.Lock()
    commits = GroupCommit(store, lambda entries: None, Metrics(), apply_lock=lock)

    async def main():
        await lock.acquire()  # a snapshot copying the files
        runner = asyncio.create_task(commits.run())
        store.send([NewMessage("t", "a", "x", NOW, NOW + 60_000, 60_000, 1)], NOW)
        request = asyncio.ensure_future(_await_durable(commits))
        for _ in range(5):  # the round starts, and waits for the lock
            await asyncio.sleep(0)
        runner.cancel()  # the broker abandoned
        await asyncio.gather(runner, return_exceptions=True)
        commits.abandon()
        with pytest.raises(Unavailable, match="stopped leading"):
            await asyncio.wait_for(request, 5)
        lock.release()

    asyncio.run(main())
    store.close()
