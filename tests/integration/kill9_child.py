"""The child process of test_kill9: appends committed batches until killed.

    python kill9_child.py DIRECTORY RUN START_MS

Opens the store in DIRECTORY and loops: send a batch of 1..16 messages with
ids "RUN-<n>", commit() (fsync=batch), then print the batch's ids on one
line and flush. A printed id is therefore durable. Every 40th batch it also
checkpoints, so a kill can land in a checkpoint too. Its clock is START_MS
plus 10 ms per batch; nothing reads a real clock.
"""

from __future__ import annotations

import sys

from storage.config import FsyncPolicy, StoreConfig
from storage.entry import MS_PER_HOUR
from storage.store import NewMessage, Store

TOPIC = "kill9"
CONFIG = StoreConfig(fsync=FsyncPolicy.BATCH, segment_bytes=256 * 1024)


def body_for(msg_id: str) -> str:
    """The body of message `msg_id`, so the parent can check what it reads."""
    n = int(msg_id.rsplit("-", 1)[1])
    return f"{msg_id}:" + "é" * (n % 97) + "x" * (n % 1013)


def main(directory: str, run: str, start_ms: int) -> None:
    store = Store.open(directory, CONFIG, now_ms=start_ms)
    n = 0
    batch_no = 0
    while True:
        now_ms = start_ms + batch_no * 10
        size = 1 + batch_no % 16
        ids = [f"{run}-{n + i}" for i in range(size)]
        # triggers spread over two days: many hours, some far, some due at once
        store.send([NewMessage(TOPIC, msg_id, body_for(msg_id), now_ms,
                               now_ms + (int(msg_id.rsplit("-", 1)[1]) * 7919) % (48 * MS_PER_HOUR), 60_000, 3)
                    for msg_id in ids], now_ms)
        store.commit()
        print(" ".join(ids), flush=True)
        n += size
        batch_no += 1
        if batch_no % 40 == 0:
            store.checkpoint(now_ms)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
