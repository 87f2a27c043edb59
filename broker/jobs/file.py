"""The jobs directory: a node's redriveMsgs jobs on disk (docs/internals.md,
"Files"), one file a job, `jobs/<jobId>.job`, replaced whole at each
change:

    offset  size  field
    0       4     magic b"HGJB"
    4       2     version (1), little-endian
    6       2     zero
    8       4     length of the body, in bytes (u32 LE)
    12      4     CRC-32 of the body (u32 LE)
    16      n     body: the job's record, a JSON object (broker.jobs.runner's
                  `Job.stored`: its parameters, cursor, counts, state, times)

A write is `storage.fileutil.atomic_write`: the whole file to
`<jobId>.job.tmp`, fsync'ed, renamed over the job's file, the directory
fsync'ed -- so a crash leaves the job's old record or its new one, never a
mix, and a `.tmp` left behind (a write the crash cut short, never acted
on) is removed at open. A job removed (past its retention) is its file
unlinked.

Opening validates each file: a wrong magic or version, a length that is
not the file's, a CRC that fails or a body that is no job's record raises
CorruptionError naming the path, the offset and the reason: the node
refuses to start rather than forget or re-run a job (remove the file to
drop the job).
"""

from __future__ import annotations

import asyncio
import os
import struct
import zlib
from collections.abc import Mapping

import orjson

from storage.errors import ContractError, CorruptionError
from storage.fileutil import atomic_write, fsync_dir, make_dir

MAGIC = b"HGJB"
VERSION = 1
HEADER = struct.Struct("<4sHHII")
SUFFIX = ".job"
# A record is a few hundred bytes; a longer body is none this module wrote.
MAX_BODY_BYTES = 64 * 1024

Record = dict[str, object]


def jobs_path(data_path: str) -> str:
    return os.path.join(data_path, "jobs")


def encode(record: Mapping[str, object]) -> bytes:
    """A job's file: the header and its record's JSON."""
    body = orjson.dumps(record)
    return HEADER.pack(MAGIC, VERSION, 0, len(body), zlib.crc32(body)) + body


def decode(path: str, data: bytes) -> Record:
    """The record a job's file holds; CorruptionError (path, offset, reason)
    if it holds none."""
    if len(data) < HEADER.size:
        raise CorruptionError(path, 0, f"{len(data)} bytes, shorter than the {HEADER.size}-byte header")
    magic, version, zero, length, crc = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise CorruptionError(path, 0, f"magic {magic!r}, not {MAGIC!r}")
    if version != VERSION or zero:
        raise CorruptionError(path, 4, f"version {version} (reserved {zero}), this build reads {VERSION}")
    if length > MAX_BODY_BYTES or HEADER.size + length != len(data):
        raise CorruptionError(path, 8, f"body length {length}, the file holds {len(data) - HEADER.size}")
    body = data[HEADER.size:]
    if zlib.crc32(body) != crc:
        raise CorruptionError(path, 12, "the body's CRC-32 does not match")
    try:
        record = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise CorruptionError(path, HEADER.size, f"the body is not JSON: {e}") from e
    if not isinstance(record, dict) or not isinstance(record.get("jobId"), str):
        raise CorruptionError(path, HEADER.size, "the body is not a job's record")
    return record


class JobFiles:
    """The jobs directory of a data directory (broker.jobs.runner's
    `JobStore`): `load()` once at start, then `save` and `remove` (each
    durable when it returns; run in a worker thread, the loop free)."""

    # A running job's progress is saved at most this often (a write and two
    # fsyncs each, awaited between slices: every slice's was a fifth of a
    # paced job's time).
    save_every_s = 0.2

    def __init__(self, directory: str, fsync: bool = True) -> None:
        self._directory = directory
        self._fsync = fsync

    def __repr__(self) -> str:
        return f"JobFiles({self._directory!r})"

    def _path(self, job_id: str) -> str:
        return os.path.join(self._directory, job_id + SUFFIX)

    def load(self) -> list[Record]:
        """Every job's record, by file name; `.tmp` files removed."""
        if not os.path.isdir(self._directory):
            return []
        records = []
        for name in sorted(os.listdir(self._directory)):
            path = os.path.join(self._directory, name)
            if name.endswith(".tmp"):
                os.unlink(path)
                continue
            if not name.endswith(SUFFIX):
                continue
            with open(path, "rb") as f:
                record = decode(path, f.read())
            if f"{record['jobId']}{SUFFIX}" != name:
                raise CorruptionError(path, HEADER.size, f"holds job {record['jobId']!r}, not the one it is named for")
            records.append(record)
        return records

    async def save(self, record: Mapping[str, object]) -> None:
        job_id = record["jobId"]
        assert isinstance(job_id, str)
        await asyncio.to_thread(self._write, self._path(job_id), encode(record))

    def _write(self, path: str, data: bytes) -> None:
        make_dir(self._directory)
        if self._fsync:
            atomic_write(path, data)
            return
        with open(path + ".tmp", "wb") as f:
            f.write(data)
        os.replace(path + ".tmp", path)

    async def remove(self, job_id: str) -> None:
        await asyncio.to_thread(self._unlink, self._path(job_id))

    async def fetch(self) -> tuple[list[dict[str, object]], set[str]] | None:
        return None  # only this node writes them: its RAM is the truth

    async def ask_cancel(self, job_id: str) -> None:
        raise ContractError("JobFiles is written by one node: its RedriveJobs cancels in RAM")

    def _unlink(self, path: str) -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            return
        if self._fsync:
            fsync_dir(self._directory)
