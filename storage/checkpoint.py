"""Checkpoint: the commit-log offset up to which derived files are durable.

File `checkpoint`, replaced atomically (write, fsync, rename):

    offset  size  field
    0       4     magic        b"HGCK"
    4       2     version      u16 = 2 (1: refused, see ENGINE_ONLY)
    6       2     reserved     0
    8       4     body_length  u32
    12      4     crc32        u32 of the body
    16      ...   body: msgpack map
                    commit_offset  int: replay starts here
                    hours          [[hour, entries, log_bytes, ended,
                                     last_end_ms, topics], ...]
                                   topics: {topic_hash: [count of status
                                   1, 2, ..., 7]} of the hour's messages
                    topic_names    {topic_hash: topic} of every topic that
                                   has a message in a listed hour
                    written_ms     int: when it was taken
                    consuming      [hour, globalIndex, ack deadline ms,
                                    ...] flat: every CONSUMING message at
                                   commit_offset (deadline 0: unknown).
                                   Absent in files written before it was
                                   kept: then unknown (see Store.consuming)
                    deliveries     [delivery, ...]: each of those's
                                   hand-over (docs/api.md, "Leases"), in
                                   the same order; absent in files written
                                   before it was kept: then 0, unknown
                    layout         int: 2 when an hour number of 2**23 or
                                   more names a span of hours
                                   (storage.spans); 1, or absent, before

Everything derived from records before `commit_offset` was fsync'ed before
this file was written; recovery cuts every hour back to the sizes listed
here and replays the log from `commit_offset`.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import msgpack

from .entry import Fields
from .errors import CorruptionError, OlderFormatError
from .fileutil import atomic_write, check_header

HEADER = struct.Struct("<4sHHII")
MAGIC = b"HGCK"
VERSION = 2
# Version 1 (no per-topic counts or topic names) was written only by the
# storage engine of the first commits, before the HTTP API (c353983 made
# version 2 and read no version 1): no release reads it, none converts it.
ENGINE_ONLY = 1
ENGINE_ONLY_ADVICE = ("written by the storage engine alone, before hourglass served its API (before commit c353983); "
                      "no release reads it or converts it, and none that served the API wrote it: open this "
                      "directory with that engine (git archive c353983^ storage) to read its messages, then send "
                      "them to a node on a new data directory")


@dataclass(frozen=True)
class HourRecord:
    hour: int
    entries: int
    log_bytes: int
    ended: int
    last_end_ms: int
    topics: dict[int, list[int]] = field(default_factory=dict)  # topic_hash -> count per status 1..7


@dataclass(frozen=True)
class Checkpoint:
    commit_offset: int = 0
    hours: tuple[HourRecord, ...] = field(default_factory=tuple)
    written_ms: int = 0
    topic_names: dict[int, str] = field(default_factory=dict)
    # (hour, global_index, deadline_ms, delivery) of every CONSUMING
    # message; None: the file predates the key, so the set is unknown.
    consuming: tuple[tuple[int, int, int, int], ...] | None = ()
    layout: int = 2  # see storage.spans.LAYOUT

    def encode(self) -> bytes:
        body: bytes = msgpack.packb({
            "commit_offset": self.commit_offset,
            "hours": [[h.hour, h.entries, h.log_bytes, h.ended, h.last_end_ms, h.topics] for h in self.hours],
            "written_ms": self.written_ms,
            "topic_names": self.topic_names,
            "layout": self.layout,
            # None (unknown, an old file's) stays unknown: the key is left out
            **({} if self.consuming is None else _consuming_fields(self.consuming)),
        })
        return HEADER.pack(MAGIC, VERSION, 0, len(body), zlib.crc32(body)) + body

    @classmethod
    def decode(cls, path: str, data: bytes) -> Checkpoint:
        if _engine_only(data):
            raise OlderFormatError(path, ENGINE_ONLY, VERSION, ENGINE_ONLY_ADVICE)
        _, _, _, length, crc = check_header(path, data, HEADER, MAGIC, VERSION)
        body = data[HEADER.size:]
        if len(body) != length:
            raise CorruptionError(path, HEADER.size, f"body is {len(body)} bytes, header says {length}")
        if zlib.crc32(body) != crc:
            raise CorruptionError(path, HEADER.size, "checkpoint checksum mismatch")
        fields = msgpack.unpackb(body, strict_map_key=False)
        flat = fields.get("consuming")
        deliveries = fields.get("deliveries") or [0] * (len(flat or ()) // 3)  # (a file from before them: 0, unknown)
        consuming = None if flat is None else tuple(zip(flat[0::3], flat[1::3], flat[2::3], deliveries))
        return cls(fields["commit_offset"], tuple(HourRecord(*h) for h in fields["hours"]), fields["written_ms"],
                   fields["topic_names"], consuming, fields.get("layout", 1))

    @classmethod
    def load(cls, path: str) -> Checkpoint | None:
        if not os.path.exists(path):
            return None
        with open(path, "rb") as f:
            return cls.decode(path, f.read())

    def save(self, path: str) -> None:
        atomic_write(path, self.encode())


def _engine_only(data: bytes) -> bool:
    """A whole version 1 file: its checksum right and its body without the
    topic names every version 2 body has (a damaged version byte of a
    version 2 file stays damage)."""
    if len(data) < HEADER.size or data[:4] != MAGIC:
        return False
    _, version, _, length, crc = HEADER.unpack_from(data, 0)
    body = data[HEADER.size:]
    if version != ENGINE_ONLY or len(body) != length or zlib.crc32(body) != crc:
        return False
    try:
        fields = msgpack.unpackb(body, strict_map_key=False)
    except (ValueError, TypeError):  # not msgpack, or a map key it cannot hold
        return False
    return isinstance(fields, dict) and "commit_offset" in fields and "topic_names" not in fields


def _consuming_fields(rows: Sequence[Fields]) -> dict[str, list[object]]:
    """The in-flight rows as the file keeps them, flat: "consuming" the
    (hour, globalIndex, deadline) of each, "deliveries" the delivery. (The
    rows read as objects: their ints go into the lists as they are, not
    boxed anew by the compiled build, some 100,000 a second with that many
    messages in flight.)"""
    return {"consuming": [v for row in rows for v in row[:3]], "deliveries": [row[3] for row in rows]}
