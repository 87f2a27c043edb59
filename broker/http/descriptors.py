"""How many client connections the process can hold without taking the
file descriptors its storage needs.

A connection is a descriptor. Storage opens descriptors too (commit-log
segments, hour files, a checkpoint's temporary files), and a checkpoint that
meets EMFILE fails the node. So the HTTP server holds at most

    connections <= RLIMIT_NOFILE (soft) - reserved - others

where `others` is every open descriptor that is not a client connection
(storage, logs, listening sockets, the event loop's own). Worked example:
a limit of 400, 128 reserved, 40 others open: at most 232 connections; the
233rd is answered 503 (or takes the place of a stalled one, see
`broker.http.httpd`). Storage may then open 128 more files before it can meet
EMFILE, whatever clients do.

Push connections (broker.push.pusher's, to subscribers) are in the same
budget: while the node has push subscriptions, a pool of

    push pool = min(--push-max-fds, (RLIMIT_NOFILE - reserved - others) // 2)

descriptors (at least one) is set aside for them, and the client ceiling
above is lowered by it (their own descriptors are not counted among
`others`): what storage leaves is halved between clients and pushes.
Push connections never hold more than the pool, each subscription no more
than its share (the pool over the subscriptions running, at least one); a
delivery that finds none free waits (`broker.push.client.PushDescriptors`),
never a client or storage. Worked example: a limit of 400, 128 reserved,
145 others (a store's index files): the pool is 63, three subscriptions
get 21 each, and clients keep 400 - 128 - 145 - 63 = 64 connections
however the subscribers behave.

Counting open descriptors lists /proc/self/fd (Linux) or /dev/fd (macOS,
BSD), about a microsecond a descriptor, so the server recounts once a
second (its deadline sweep), not per connection: `reserved` is also what
covers storage opening files between two counts. Where neither directory
exists, or the limit is unlimited, only `--max-connections` bounds
connections.
"""

from __future__ import annotations

import os

from storage.errors import ConfigError

try:
    import resource
except ImportError:  # pragma: no cover - not on Windows, which the node does not support
    resource = None  # type: ignore[assignment]  # (the module, or None where there is none)

_FD_DIRS = ("/proc/self/fd", "/dev/fd")


def soft_limit() -> int | None:
    """RLIMIT_NOFILE's soft limit, or None when unlimited or unknown."""
    if resource is None:
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else soft


def open_count() -> int | None:
    """Descriptors open in this process now, or None where it cannot tell."""
    for path in _FD_DIRS:
        try:
            return len(os.listdir(path)) - 1  # less the one listdir itself held open
        except OSError:
            continue
    return None


class DescriptorBudget:
    """The connection ceiling that keeps `reserved` descriptors free.

    `measure(connections)` recounts the open descriptors that are not the
    caller's `connections`; `ceiling()` is how many connections fit
    beside them, or None when the descriptors do not bound it.
    """

    def __init__(self, reserved: int, limit: int | None = None) -> None:
        if reserved < 0:
            raise ConfigError(f"reserved descriptors must be >= 0, got {reserved}")
        self.reserved = reserved
        self.limit = soft_limit() if limit is None else limit
        self.others = 0
        self.measured = False
        # Push connections (see the module docstring): the most the pool may
        # be (0 while the node has no push subscription), and those open.
        self.push_max = 0
        self.push_open = 0

    def measure(self, connections: int) -> None:
        count = open_count()
        if count is not None:
            self.others = max(0, count - connections - self.push_open)
            self.measured = True

    def push_pool(self) -> int:
        """Descriptors push connections may hold together now."""
        if self.push_max <= 0:
            return 0
        if self.limit is None:
            return self.push_max
        return max(1, min(self.push_max, (self.limit - self.reserved - self.others) // 2))

    def ceiling(self) -> int | None:
        if self.limit is None or not self.measured:
            return None
        return max(0, self.limit - self.reserved - self.others - max(self.push_pool(), self.push_open))

    def __repr__(self) -> str:
        return (f"DescriptorBudget(limit={self.limit}, reserved={self.reserved}, others={self.others}, "
                f"push={self.push_open}/{self.push_pool()}, ceiling={self.ceiling()})")
