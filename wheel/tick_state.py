"""Tick state: how far dispatch has come, and its file.

`TickState(hour_tick, second_tick, local_index)` means: every entry filed
under a second before (hour_tick, second_tick) has been released, and so
has every entry of that second with a smaller local_index. Release within
a second follows trigger time, not local_index, so local_index only covers
a fully released run. A new leader (or a restarted node) starts its wheel
there and re-reads what follows; entries acked meanwhile are no longer
WAITING in storage and are skipped, so nothing acked is re-released.

The file is written every ~50 ms, so a write is one 32-byte `pwrite`, and
fsync is optional. Two slots alternate (record n goes to slot n % 2), so
a write torn by a crash leaves the previous record intact in the other
slot; reading takes the valid slot with the higher sequence number.

File layout (little-endian, 80 bytes):

    offset  size  field
    ------  ----  -----------------------------------------------------
         0     4  magic            b"HGTS"
         4     2  version          u16 = 1
         6     2  slot_size        u16 = 32
         8     4  slot_count       u32 = 2
        12     4  header_crc       u32 crc32 of bytes 0..11
        16    32  slot 0           (records with an even sequence)
        48    32  slot 1           (records with an odd sequence)

Slot layout (offsets within the slot):

    offset  size  field
    ------  ----  -----------------------------------------------------
         0     8  sequence         u64, 1, 2, 3, ...; a slot of 32 zero
                                   bytes has never been written
         8     8  hour_tick        i64, UTC hours since the epoch
        16     4  second_tick      u32, 0..3599
        20     4  local_index      u32
        24     4  reserved         u32 = 0
        28     4  crc              u32 crc32 of slot bytes 0..27

Reading refuses, with `TickStateError` naming the path, the byte offset
and the reason: a wrong length, magic, version, slot size or count, or
header CRC; a slot whose sequence does not match its position; no valid
slot while some slot is not empty. One torn slot next to a valid one is
the expected trace of a crash and is not an error.
"""

from __future__ import annotations

import os
import struct
import zlib
from typing import NamedTuple

from storage.entry import SECONDS_PER_HOUR
from storage.errors import ContractError, CorruptionError
from storage.fileutil import atomic_write, refuse_newer

MAGIC = b"HGTS"
VERSION = 1
HEADER = struct.Struct("<4sHHII")  # magic, version, slot_size, slot_count, header_crc
SLOT = struct.Struct("<QqIIII")  # sequence, hour_tick, second_tick, local_index, reserved, crc
SLOT_COUNT = 2
FILE_SIZE = HEADER.size + SLOT_COUNT * SLOT.size
_EMPTY_SLOT = bytes(SLOT.size)


class TickStateError(CorruptionError):
    """A tick-state file's bytes do not match the format above. Raised when
    opening or reading; names the file, the byte offset and the reason."""

    def __init__(self, path: str, offset: int, reason: str) -> None:
        super().__init__(path, offset, f"bad tick state: {reason}")


class TickState(NamedTuple):
    """Dispatch progress (see the module docstring)."""

    hour_tick: int  # UTC hours since the epoch
    second_tick: int  # 0..3599 within the hour
    local_index: int  # entries of this second below it are released

    @classmethod
    def at(cls, abs_s: int, local_index: int = 0) -> TickState:
        """The tick at an absolute second (seconds since the epoch)."""
        hour, second = divmod(abs_s, SECONDS_PER_HOUR)
        return cls(hour, second, local_index)

    @property
    def abs_s(self) -> int:
        return self.hour_tick * SECONDS_PER_HOUR + self.second_tick

    @property
    def position(self) -> tuple[int, int]:
        """(abs_s, local_index): ticks compare in this order."""
        return (self.abs_s, self.local_index)

    def __repr__(self) -> str:
        return f"TickState({self.hour_tick}:{self.second_tick:04d}#{self.local_index})"


def _header_bytes() -> bytes:
    body = HEADER.pack(MAGIC, VERSION, SLOT.size, SLOT_COUNT, 0)[:-4]
    return body + struct.pack("<I", zlib.crc32(body))


def _slot_offset(index: int) -> int:
    return HEADER.size + index * SLOT.size


def _pack_slot(sequence: int, state: TickState) -> bytes:
    body = SLOT.pack(sequence, state.hour_tick, state.second_tick, state.local_index, 0, 0)[:-4]
    return body + struct.pack("<I", zlib.crc32(body))


def parse(data: bytes, path: str = "<bytes>") -> tuple[int, TickState | None]:
    """(sequence, state) of the newest valid record in a tick-state file's
    bytes; (0, None) when no record was ever written."""
    if len(data) != FILE_SIZE:
        raise TickStateError(path, min(len(data), FILE_SIZE), f"file is {len(data)} bytes, expected {FILE_SIZE}")
    magic, version, slot_size, slot_count, header_crc = HEADER.unpack_from(data, 0)
    if magic != MAGIC:
        raise TickStateError(path, 0, f"magic is {magic!r}, expected {MAGIC!r}")
    refuse_newer(path, version, VERSION)
    if version != VERSION:
        raise TickStateError(path, 4, f"version is {version}, this build reads {VERSION}")
    if slot_size != SLOT.size:
        raise TickStateError(path, 6, f"slot size is {slot_size}, expected {SLOT.size}")
    if slot_count != SLOT_COUNT:
        raise TickStateError(path, 8, f"slot count is {slot_count}, expected {SLOT_COUNT}")
    computed = zlib.crc32(data[:HEADER.size - 4])
    if header_crc != computed:
        raise TickStateError(path, 12, f"header crc is {header_crc:#010x}, computed {computed:#010x}")

    best: tuple[int, TickState | None] = (0, None)
    problems: list[tuple[int, str]] = []
    for index in range(SLOT_COUNT):
        offset = _slot_offset(index)
        raw = data[offset:offset + SLOT.size]
        if raw == _EMPTY_SLOT:
            continue
        sequence, hour_tick, second_tick, local_index, _, crc = SLOT.unpack(raw)
        computed = zlib.crc32(raw[:-4])
        if crc != computed:
            problems.append((offset, f"slot {index} crc is {crc:#010x}, computed {computed:#010x}"))
            continue
        if sequence == 0 or sequence % SLOT_COUNT != index:
            raise TickStateError(path, offset, f"slot {index} holds sequence {sequence}, "
                                               f"which belongs in slot {sequence % SLOT_COUNT}")
        if second_tick >= SECONDS_PER_HOUR:
            raise TickStateError(path, offset + 16, f"slot {index} second_tick is {second_tick}, "
                                                    f"expected 0..{SECONDS_PER_HOUR - 1}")
        if sequence > best[0]:
            best = (sequence, TickState(hour_tick, second_tick, local_index))
    if best[1] is None and problems:
        offset = problems[0][0]
        raise TickStateError(path, offset, f"no valid slot: {'; '.join(r for _, r in problems)}")
    return best


class TickStateFile:
    """The tick-state file of one node, kept open for cheap rewrites.

        f = TickStateFile(path)          # creates it (atomically) if missing
        f.state                          # None on a fresh node
        f.write(TickState(472002, 300, 4))   # one pwrite, fsync if asked
        TickStateFile(path).state        # -> TickState(472002:0300#4)

    `fsync=True` makes each write durable before it returns (an fdatasync);
    without it a crash of the machine (not the process) may lose the last
    writes, which costs re-dispatching, never loss. One writer per file.
    """

    def __init__(self, path: str | os.PathLike[str], *, fsync: bool = False) -> None:
        self.path = os.fspath(path)
        self.fsync = fsync
        if not os.path.exists(self.path):
            self._create()
        self._fd = os.open(self.path, os.O_RDWR)
        try:
            data = os.pread(self._fd, FILE_SIZE + 1, 0)
            self._sequence, self._state = parse(data, self.path)
        except BaseException:
            os.close(self._fd)
            raise
        self.writes = 0

    def _create(self) -> None:
        """A file with its header and two empty slots, made atomically: a
        crash leaves none (made again at the next open) or all of it."""
        atomic_write(self.path, _header_bytes() + bytes(SLOT_COUNT * SLOT.size))

    @property
    def state(self) -> TickState | None:
        """The last state written or read; None if none ever was."""
        return self._state

    @property
    def sequence(self) -> int:
        return self._sequence

    def write(self, state: TickState) -> None:
        if self._fd < 0:
            raise ContractError(f"{self.path}: tick-state file is closed")
        if not 0 <= state.second_tick < SECONDS_PER_HOUR or state.local_index < 0:
            raise ContractError(f"not a tick state: {state!r}")
        sequence = self._sequence + 1
        os.pwrite(self._fd, _pack_slot(sequence, state), _slot_offset(sequence % SLOT_COUNT))
        if self.fsync:
            os.fdatasync(self._fd)
        self._sequence, self._state = sequence, state
        self.writes += 1

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> TickStateFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"TickStateFile({self.path!r}, sequence={self._sequence}, state={self._state!r})"
