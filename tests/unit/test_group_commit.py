"""GroupCommit: many requests, one fsync; and a quiet point (nothing
pending, the wheel told of everything) reached even while appends never stop."""

import asyncio

from broker.group_commit import GroupCommit
from broker.metrics import Metrics
from storage.entry import MS_PER_HOUR
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
                waits.append(asyncio.create_task(commits.durable()))
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
