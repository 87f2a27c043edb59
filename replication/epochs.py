"""The epoch file: which leader's log this node's commit log follows.

An *epoch* is the Raft term in which a node became leader (see
replication.election). Every commit-log record belongs to the epoch of the
leader that appended it, and a leader's log is its predecessors' logs (up
to where each ended) plus its own records. The history
`[(epoch, start_offset), ...]` says where each epoch's records begin; a
node's log is a prefix of the leader's exactly when the node's offset is
not past the point where its last epoch ended in the leader's history (see
`diverges`). This is Kafka's leader-epoch check.

`promised` is the highest epoch this node has promised a candidate: from
then on it takes no records from a leader of a lower epoch. A candidate
needs that promise from a majority before it leads, so a deposed leader can
never again reach a quorum.

File `epochs`, replaced atomically (write, fsync, rename), little-endian:

    offset  size  field
    ------  ----  ---------------------------------------------
         0     4  magic        b"HGEP"
         4     2  version      u16 = 1
         6     2  reserved     0
         8     8  promised     u64: highest epoch promised
        16     4  count        u32: history entries
        20  16*n  entries      (epoch u64, start_offset u64), epochs rising
     20+16n    4  crc          u32 crc32 of every byte before it

Opening refuses a wrong magic, version, length or CRC, or a history that is
not rising, with `EpochFileError` naming the path, offset and reason; a
version above 1 (a newer hourglass's) with NewerFormatError, which says
what to do.
"""

from __future__ import annotations

import contextlib
import os
import struct
import zlib
from dataclasses import dataclass, field

from storage.errors import ContractError, CorruptionError
from storage.fileutil import atomic_write, refuse_newer, refuse_newer_file

MAGIC = b"HGEP"
VERSION = 1
HEADER = struct.Struct("<4sHHQI")
ENTRY = struct.Struct("<QQ")
CRC = struct.Struct("<I")


class EpochFileError(CorruptionError):
    """The epoch file's bytes do not match the format above."""


@dataclass(frozen=True)
class Epochs:
    promised: int = 0
    history: tuple[tuple[int, int], ...] = field(default_factory=tuple)  # (epoch, start_offset)

    def __post_init__(self) -> None:
        for (e1, o1), (e2, o2) in zip(self.history, self.history[1:]):
            if not (e1 < e2 and o1 <= o2):
                raise ContractError(f"epoch history must rise: ({e1}, {o1}) then ({e2}, {o2})")

    def last_epoch(self, end_offset: int) -> int:
        """Epoch of the last record before `end_offset` (0: none)."""
        last = 0
        for epoch, start in self.history:
            if start < end_offset:
                last = epoch
        return last

    def end_of(self, epoch: int, end_offset: int) -> int:
        """Where records of epochs <= `epoch` end in this log."""
        for e, start in self.history:
            if e > epoch:
                return start
        return end_offset

    def diverges(self, other_epoch: int, other_end: int, end_offset: int) -> bool:
        """Is a log whose last record is of `other_epoch`, ending at
        `other_end`, NOT a prefix of this log (which ends at `end_offset`)?
        An epoch this log has no record of (a leader's that reached none of
        the next leader's majority) diverges wherever it ends: its records
        lie where this log holds an earlier epoch's (epoch 0: the records
        of a store from before its cluster, every node's alike)."""
        if other_epoch and all(epoch != other_epoch for epoch, _ in self.history):
            return True
        return other_end > self.end_of(other_epoch, end_offset)

    def begin(self, epoch: int, start_offset: int) -> Epochs:
        """This node leads `epoch` from `start_offset` on."""
        history = tuple((e, o) for e, o in self.history if e < epoch and o <= start_offset)
        return Epochs(max(self.promised, epoch), (*history, (epoch, start_offset)))

    def promise(self, epoch: int) -> Epochs:
        return Epochs(max(self.promised, epoch), self.history)

    def follow(self, history: tuple[tuple[int, int], ...]) -> Epochs:
        """Take the leader's history (this log is a prefix of its log)."""
        return Epochs(max(self.promised, history[-1][0] if history else 0), tuple((epoch, offset) for epoch, offset in history))

    # == the file ================================================================

    def encode(self) -> bytes:
        body = HEADER.pack(MAGIC, VERSION, 0, self.promised, len(self.history))
        body += b"".join(ENTRY.pack(e, o) for e, o in self.history)
        return body + CRC.pack(zlib.crc32(body))

    @classmethod
    def decode(cls, data: bytes, path: str = "<bytes>") -> Epochs:
        if len(data) < HEADER.size + CRC.size:
            raise EpochFileError(path, len(data), f"file is {len(data)} bytes, shorter than its header")
        magic, version, _, promised, count = HEADER.unpack_from(data)
        if magic != MAGIC:
            raise EpochFileError(path, 0, f"magic is {magic!r}, expected {MAGIC!r}")
        refuse_newer(path, version, VERSION)  # a newer hourglass's: refused with what to do, never rewritten
        if version != VERSION:
            raise EpochFileError(path, 4, f"version {version} is not {VERSION}")
        size = HEADER.size + count * ENTRY.size + CRC.size
        if len(data) != size:
            raise EpochFileError(path, len(data), f"file is {len(data)} bytes, {count} entries need {size}")
        (crc,) = CRC.unpack_from(data, size - CRC.size)
        if crc != zlib.crc32(data[:size - CRC.size]):
            raise EpochFileError(path, size - CRC.size, "crc mismatch")
        history = tuple(ENTRY.unpack_from(data, HEADER.size + i * ENTRY.size) for i in range(count))
        try:
            return cls(promised, history)
        except ValueError as e:
            raise EpochFileError(path, HEADER.size, str(e)) from None

    @classmethod
    def load(cls, path: str) -> Epochs:
        try:
            with open(path, "rb") as f:
                return cls.decode(f.read(), path)
        except FileNotFoundError:
            return cls()

    def save(self, path: str) -> None:
        atomic_write(path, self.encode())

    @staticmethod
    def refuse_if_newer(path: str) -> None:
        """NewerFormatError if the file at `path` is of a newer version
        than this build reads: checked when a node starts, before anything
        in its data directory is written (a missing file passes)."""
        with contextlib.suppress(FileNotFoundError):
            refuse_newer_file(path, MAGIC, VERSION)

    @staticmethod
    def path(data_dir: str) -> str:
        return os.path.join(data_dir, "epochs")
