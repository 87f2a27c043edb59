"""`--max-connections` for the node, whichever shard the kernel hands a
connection to (docs/configuration.md, "--shards").

Every shard accepts on the node's port (SO_REUSEPORT), so no shard sees
the others' connections. They share one small file, `links/connections`:
a slot a shard, [pid, connections], each written by its own shard only,
and every read-and-write made under an exclusive `flock` of the file.

    take      a shard about to adopt a connection sums the other slots and
              its own count: under the cap, it writes its count + 1 and
              adopts; at the cap it refuses (or sheds a stalled one of its
              own first: broker.http.httpd). The check and the write are
              one locked step, so two shards never both take the last place
    publish   a connection closed: the shard writes its new count
    a shard   a slot whose pid no longer runs (a shard killed, not yet
    dies      started again) is read as 0, and zeroed, when it would refuse:
              its connections died with it

Cost: two flock calls and a read of 16 bytes a shard per connection opened
and closed, never per request. The lock is held for microseconds; one not
had within LOCK_WAIT_S (a shard stopped while holding it: SIGSTOP, a
debugger), or a file system without locks, leaves the shard to its own
count for that connection, logged: a stopped shard never stops the others.
The supervisor removes the file before it starts the shards: a node's
board starts empty.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import mmap
import os
import struct
import time
from collections.abc import Iterator

log = logging.getLogger("hourglass.shards")

SLOT = struct.Struct("=qq")  # pid, connections
FILE_NAME = "connections"
# How long a shard tries for the board's lock before it counts alone.
LOCK_WAIT_S = 0.02
LOCK_RETRY_S = 0.0005


def _running(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process took the pid: not a shard of this node
        return False
    return True


class ConnectionBoard:
    """Shard `index` of `count`'s view of the node's connections."""

    def __init__(self, links_dir: str, index: int, count: int) -> None:
        self.index = index
        self.count = count
        self.pid = os.getpid()
        size = SLOT.size * count
        self.fd = os.open(os.path.join(links_dir, FILE_NAME), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            if os.fstat(self.fd).st_size < size:
                os.ftruncate(self.fd, size)
            self.map = mmap.mmap(self.fd, size)
        except OSError:
            os.close(self.fd)
            raise
        self.publish(0)

    def __repr__(self) -> str:
        return f"ConnectionBoard(shard {self.index} of {self.count}, node {self.total()})"

    def take(self, here: int, cap: int) -> bool:
        """True, and this shard counted at `here` + 1, if the node holds
        fewer than `cap` connections with this shard's `here` (without the
        lock: `here` < `cap`, this shard alone)."""
        with self._locked() as locked:
            if not locked:
                return here < cap
            others = self._others(stale_too=False)
            if others + here >= cap:
                others = self._others(stale_too=True)
                if others + here >= cap:
                    return False
            SLOT.pack_into(self.map, self.index * SLOT.size, self.pid, here + 1)
            return True

    def publish(self, here: int) -> None:
        """This shard holds `here` connections now."""
        with self._locked() as locked:
            if locked:
                SLOT.pack_into(self.map, self.index * SLOT.size, self.pid, here)

    def total(self) -> int:
        """The node's connections, as the slots say now."""
        with self._locked():
            here: int = SLOT.unpack_from(self.map, self.index * SLOT.size)[1]
            return self._others(stale_too=False) + here

    @contextlib.contextmanager
    def _locked(self) -> Iterator[bool]:
        """The board's lock, held for the block: True; not had within
        LOCK_WAIT_S, or the file system has none: False, logged."""
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() < deadline:
                    time.sleep(LOCK_RETRY_S)
                    continue
                log.warning("the node's connection board (%s) stayed locked for %.0f ms: shard %d counts its "
                            "own connections for this one", FILE_NAME, LOCK_WAIT_S * 1000, self.index)
            except OSError as e:
                log.warning("the node's connection board (%s) cannot be locked (%s): shard %d counts its own "
                            "connections for this one", FILE_NAME, e.strerror, self.index)
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(self.fd, fcntl.LOCK_UN)

    def _others(self, stale_too: bool) -> int:
        """The other shards' connections (the lock held); with `stale_too`,
        a slot of a process that no longer runs is zeroed first."""
        held = 0
        for i in range(self.count):
            if i == self.index:
                continue
            pid, connections = SLOT.unpack_from(self.map, i * SLOT.size)
            if stale_too and connections and not _running(pid):
                SLOT.pack_into(self.map, i * SLOT.size, 0, 0)
                continue
            held += connections
        return held

    def close(self) -> None:
        try:
            self.publish(0)
        finally:
            self.map.close()
            os.close(self.fd)
