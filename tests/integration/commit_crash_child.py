"""The child process of test_commit_crash: the group commit killed at one
point of one commit.

    python commit_crash_child.py DIRECTORY POINT COMMIT

Opens the store in DIRECTORY (fsync=batch) and runs a GroupCommit (its
fsyncs in the syncer thread, broker.disk.syncer) under 8 concurrent senders,
each sending one message at a time with ids "<sender>-<n>" and printing
the id, flushed, once `durable()` has answered it: a printed id is one a
client was told is stored. At the COMMIT-th commit it SIGKILLs itself at
POINT:

    before-write  in the append of a record, before its bytes are written
    after-write   right after its bytes are written to the log's mapping
    before-sync   in the syncer thread, before the fdatasync
    after-sync    in the syncer thread, after the fdatasync, before any
                  request of that commit is answered

Its clock is fixed; nothing reads a real clock but the fsync's own timing.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys

from broker.disk.group_commit import GroupCommit
from broker.observe.metrics import Metrics
from storage.config import FsyncPolicy, StoreConfig
from storage.entry import MS_PER_HOUR
from storage.store import NewMessage, Store

TOPIC = "crash"
NOW_MS = 490_000 * MS_PER_HOUR
CONFIG = StoreConfig(fsync=FsyncPolicy.BATCH, segment_bytes=256 * 1024)
SENDERS = 8


def body_for(msg_id: str) -> str:
    return f"{msg_id}:" + "x" * (sum(msg_id.encode()) % 300)


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def main(directory: str, point: str, at_commit: int) -> None:
    store = Store.open(directory, CONFIG, now_ms=NOW_MS)
    appends = [0]
    syncs = [0]
    log = store.log
    real_append, real_sync = log.append, store.sync_log

    def append(body: bytes) -> int:
        appends[0] += 1
        if point == "before-write" and appends[0] == at_commit * 2:
            die()
        offset = real_append(body)
        if point == "after-write" and appends[0] == at_commit * 2:
            die()
        return offset

    def sync() -> None:
        syncs[0] += 1
        if point == "before-sync" and syncs[0] == at_commit:
            die()
        real_sync()
        if point == "after-sync" and syncs[0] == at_commit:
            die()

    log.append = append  # type: ignore[method-assign]
    store.sync_log = sync
    commits = GroupCommit(store, lambda entries: None, Metrics())

    async def sender(k: int) -> None:
        n = 0
        while True:
            msg_id = f"{k}-{n}"
            store.send([NewMessage(TOPIC, msg_id, body_for(msg_id), NOW_MS, NOW_MS + 60_000 + n, 3_600_000, 3)],
                       NOW_MS)
            await commits.durable()
            print(msg_id, flush=True)
            n += 1

    async def run() -> None:
        runner = asyncio.create_task(commits.run())
        await asyncio.gather(runner, *(sender(k) for k in range(SENDERS)))

    asyncio.run(run())


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
