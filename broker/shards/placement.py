"""Which shard owns a message: a stable hash of its msgId, or of its key
when it has one (docs/api.md, "Shards").

CRC-32 (zlib), never Python's `hash` (salted per process): every shard
process, every release and every client computes the same owner. A
schedule's run (`<scheduleId>@<digits>`) is placed by its scheduleId, so a
schedule and all its runs live on one shard.
"""

from __future__ import annotations

import os
import zlib


def owner(name: str, count: int) -> int:
    """The shard of `count` that owns `name` (a msgId, a key, a scheduleId)."""
    if count == 1:
        return 0
    at = name.find("@")
    if at > 0:  # a schedule's run lives with its schedule
        name = name[:at]
    return zlib.crc32(name.encode()) % count


def message_owner(msg_id: str, key: str, count: int) -> int:
    """The shard of a message: its key's when it has one, else its msgId's."""
    return owner(key or msg_id, count)


def new_id_on(shard: int, count: int) -> str:
    """A new random msgId (32 hex digits, as broker.backend.new_msg_id) that
    `shard` owns: drawn again until it lands there (`count` draws on
    average), so that a send without a msgId is stored where it arrived."""
    while True:
        msg_id = os.urandom(16).hex()
        if count == 1 or zlib.crc32(msg_id.encode()) % count == shard:
            return msg_id
