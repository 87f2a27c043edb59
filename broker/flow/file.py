"""The topic settings file: a node's topic settings and pauses on disk
(`<data-dir>/topic-settings`, docs/internals.md, "Files"), replaced whole
on each change (written, fsync'ed, renamed, the directory fsync'ed:
storage.fileutil.atomic_write), so a change answered survives kill -9 and
a crash leaves the old file or the new.

    offset  size  field
    0       4     magic b"HGTS"
    4       2     version (1), little-endian
    6       2     zero
    8       4     length n of the body, in bytes (u32 LE)
    12      4     CRC-32 of the body (u32 LE)
    16      n     body: a JSON object {entry name: entry value as a
                  JSON string}, the
                  entries of broker.flow.settings (one per topic with
                  settings, one per paused serial key)

Opening validates and fails loudly: a short header, a wrong magic or
version, a length other than the file's, a CRC that fails or a body that
is not the entries raises CorruptionError naming the path, the offset and
the reason (atomic_write never leaves a torn file: one is damage).
"""

from __future__ import annotations

import asyncio
import os
import struct
import zlib

import orjson

from storage.errors import CorruptionError
from storage.fileutil import atomic_write, check_header

from .settings import Entries, TopicSettings, entries, rows

MAGIC = b"HGTS"
VERSION = 1
HEADER = struct.Struct("<4sHHII")
FILE_NAME = "topic-settings"


def settings_path(data_path: str) -> str:
    return os.path.join(data_path, FILE_NAME)


def encode(kept: Entries) -> bytes:
    """The file's bytes for these entries."""
    body = orjson.dumps({k: kept[k].decode() for k in sorted(kept)})
    return HEADER.pack(MAGIC, VERSION, 0, len(body), zlib.crc32(body)) + body


def decode(path: str, data: bytes) -> Entries:
    """The entries of the file's bytes; CorruptionError if they are not a file `encode` wrote."""
    _, _, zero, length, crc = check_header(path, data, HEADER, MAGIC, VERSION)
    if zero != 0:
        raise CorruptionError(path, 6, f"reserved field is {zero}, expected 0")
    if length != len(data) - HEADER.size:
        raise CorruptionError(path, 8, f"body length {length} but the file holds {len(data) - HEADER.size} "
                                       f"bytes after its header")
    body = data[HEADER.size:]
    if zlib.crc32(body) != crc:
        raise CorruptionError(path, 12, f"body CRC {zlib.crc32(body):#010x}, expected {crc:#010x}")
    try:
        kept = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise CorruptionError(path, HEADER.size, f"body is not JSON: {e}") from None
    if not isinstance(kept, dict) or not all(isinstance(v, str) for v in kept.values()):
        raise CorruptionError(path, HEADER.size, "body is not an object of entries")
    out = {str(k): v.encode() for k, v in kept.items()}
    try:
        rows(out)
    except ValueError as e:
        raise CorruptionError(path, HEADER.size, str(e)) from None
    return out


class SettingsFile:
    """broker.flow.keeper's SettingsStore on a node's disk."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __repr__(self) -> str:
        return f"SettingsFile({self.path!r})"

    def load(self) -> dict[str, TopicSettings]:
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return {}
        return rows(decode(self.path, data))

    async def save(self, settings: dict[str, TopicSettings]) -> None:
        """Durable once it returns (fsync'ed, renamed)."""
        await asyncio.to_thread(atomic_write, self.path, encode(entries(settings.values())))
