"""A Redis-backed node's identity: the id it holds its leases under in
Redis (the schedules' and the jobs' leases: broker.redis.schedules,
broker.redis.jobs), kept in `DATA/node-id` so that a node restarted on its
configuration (after a kill -9, a crash) is the same node and takes its
own lease back at once, where another node waits for it to lapse
(docs/redis.md, "Schedules and jobs after a restart").

The file is locked (flock) while the node runs: a second process started
on the same data directory gets a fresh id of its own for its life (and
a warning), never the running node's, so two live processes never hold
one lease between them.
"""

from __future__ import annotations

import fcntl
import logging
import os
import string
import uuid

from storage.fileutil import DIR_MODE, FILE_MODE

log = logging.getLogger("hourglass.redis")

NODE_ID_FILE = "node-id"


def node_identity(data_path: str) -> tuple[str, int | None]:
    """(this node's id, the descriptor holding DATA/node-id's lock: keep
    it open while the node runs; None with a fresh id when another process
    holds the lock). An id is 32 hex digits; a missing or damaged file is
    written anew (fsync'ed)."""
    os.makedirs(data_path, DIR_MODE, exist_ok=True)
    path = os.path.join(data_path, NODE_ID_FILE)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, FILE_MODE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        fresh = uuid.uuid4().hex
        log.warning("%s is held by another process on this data directory: this one runs as node %s, "
                    "and waits for the leases it held like any other node", path, fresh)
        return fresh, None
    kept = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
    if len(kept) == 32 and all(c in string.hexdigits for c in kept):
        return kept, fd
    node_id = uuid.uuid4().hex
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{node_id}\n".encode(), 0)
    os.fsync(fd)
    return node_id, fd
