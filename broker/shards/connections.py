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
and closed, never per request.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import struct

SLOT = struct.Struct("=qq")  # pid, connections
FILE_NAME = "connections"


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
        fewer than `cap` connections with this shard's `here`."""
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        try:
            others = self._others(stale_too=False)
            if others + here >= cap:
                others = self._others(stale_too=True)
                if others + here >= cap:
                    return False
            SLOT.pack_into(self.map, self.index * SLOT.size, self.pid, here + 1)
            return True
        finally:
            fcntl.flock(self.fd, fcntl.LOCK_UN)

    def publish(self, here: int) -> None:
        """This shard holds `here` connections now."""
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        try:
            SLOT.pack_into(self.map, self.index * SLOT.size, self.pid, here)
        finally:
            fcntl.flock(self.fd, fcntl.LOCK_UN)

    def total(self) -> int:
        """The node's connections, as the slots say now."""
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        try:
            here: int = SLOT.unpack_from(self.map, self.index * SLOT.size)[1]
            return self._others(stale_too=False) + here
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
