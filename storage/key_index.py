"""On-disk index from (topic, key) to the locations of the messages sent
with that serial key, so a lookup by key (listMsg, deleteMsgs and
rescheduleMsgs with `key`: docs/api.md, Bulk calls) reads its own
messages, not the topic's, and RAM does not grow with messages or keys.

Directory `keys/`, in the id index's format (storage.id_index: the same
`secret` file and `<shard:02x>.hix` shards, byte for byte, 64 shards of
open-addressing slots, each doubling on its own), with its own secret:
a slot's 64-bit key is BLAKE2b(topic, key) where the id index hashes
(topic, msgId). A key shared by many messages is a run of equal slot keys
that a lookup reads whole; a bigger shard cannot part it, so a run longer
than the id index's probe bound is probed on (once the shard is a quarter
full), never split.

What is put, and when (storage.applying): every message whose body has a
serial key (an 8-item delay-log body, storage.delay_log) when its SEND is
applied; when a MOVE is applied, the slot of its old place is pointed at
its new one (`IdIndex.move`). Nothing is removed: a slot of a retired hour
is dead and reused or dropped when its shard doubles; a slot of a
released message stays until its hour retires (the reader skips it:
`read_message` answers None for it). Unlike
the id index, a put does not look whether an equal key's slot points at
a released message (that would read an entry per message of the key on
every keyed send), so a key's run is its messages in live hours.

Derived data, as the id index: a crash replays the commit log's puts
(idempotent); an index that is missing -- deleted, or a data directory
from before it -- is rebuilt from the delay logs of the checkpointed hours
(`open_key_index`) in `keys.new/` and swapped in, then the log replays the
rest; so is one whose shard is torn or damaged (its header refused on
opening), and a slot whose check byte fails at a lookup makes that lookup
fall back to a scan (`Store.keyed` answers None). A lookup's candidates are confirmed against the message bodies they
point at, so a hash collision costs a read, never a wrong answer.
"""

from __future__ import annotations

import os
import shutil

from . import delay_log
from .config import StoreConfig
from .delay_index import FLAG_RELEASED
from .errors import CorruptionError
from .hour_table import HourTable
from .id_index import IdIndex

# The first byte of a delay-log body with a serial key: a msgpack fixarray of 8.
KEYED_BODY = 0x98


def key_of_body(index: IdIndex, body: bytes | memoryview) -> int | None:
    """The slot key of a delay-log body's (topic, serial key); None when it has no key."""
    if body[0] != KEYED_BODY:
        return None
    b = delay_log.unpack_body(bytes(body))
    return index.key(b.topic, b.key) if b.key else None


def open_key_index(directory: str, config: StoreConfig, hours: HourTable) -> IdIndex:
    """The key index in `directory`, or a new one (new secret) holding every
    keyed, unreleased message of the checkpointed hours when it is
    missing: every entry and every keyed body read once; replaying the
    log adds the rest."""
    if IdIndex.is_current(directory):
        try:
            return IdIndex.open(directory, config.id_shard_initial_slots, hours.__contains__)
        except CorruptionError:  # a torn or damaged shard: derived data, made again
            shutil.rmtree(directory)
    keys = IdIndex.build(directory, config.id_shard_initial_slots, hours.__contains__)
    try:
        for h in hours.ascending():
            files = hours.files(h)
            for gi in range(h.entries):
                _, offset8, size, flags = files.read_entry(gi)
                if not flags & FLAG_RELEASED:
                    key = key_of_body(keys, files.read_body(offset8, size))
                    if key is not None:
                        keys.put(key, h.hour, gi)
        keys.publish()
    except BaseException:
        keys.close()
        raise
    return keys


def key_dir(directory: str) -> str:
    """Where a data directory keeps its key index."""
    return os.path.join(directory, "keys")
