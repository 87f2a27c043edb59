"""The three files of one hour, reached mapped (near hours) or plain (far).

`HourFiles` knows where things are in each file and nothing about the
commit log; the byte layouts are in `delay_log`, `delay_index` and
`second_table`.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Iterable

from . import delay_index, delay_log, second_table
from .disk import DISK, Disk
from .entry import IndexEntry
from .errors import CorruptionError
from .files import MappedFile, PlainFile
from .fileutil import create_file, refuse_newer


def hour_paths(directory: str, hour: int) -> tuple[str, str, str]:
    stem = os.path.join(directory, f"{hour:010d}")
    return stem + ".log", stem + ".idx", stem + ".sec"


def parse_hour_name(name: str) -> int | None:
    stem, dot, ext = name.partition(".")
    if dot and ext in ("log", "idx", "sec") and stem.isascii() and stem.isdigit():
        return int(stem)
    return None


class HourFiles:
    """Delay log, index and second table of `hour`.

    Worked example: the 3rd message of second 17 of hour 490000 went to
    index entry g=41; second 17's slot holds (last=41, count=3) and entry 41
    holds pre=12, entry 12 holds pre=5, entry 5 holds pre=none. Reading
    second 17 costs three entry reads, whatever else the hour holds.
    """

    def __init__(self, directory: str, hour: int, mapped: bool, create: bool, disk: Disk = DISK) -> None:
        """Open (`create`: or make) the hour's files; mapped ones reserve
        their blocks through `disk` (storage.disk)."""
        self.hour = hour
        self.mapped = mapped
        paths = hour_paths(directory, hour)
        fresh = create and not any(os.path.exists(p) for p in paths)
        if fresh:
            self._write_headers(paths)
        else:
            # Before mapping: a mapped open grows a short file with zeros,
            # and an all-zero second-table slot reads as an empty second.
            least_bytes = (delay_log.HEADER_BYTES, delay_index.HEADER_BYTES, second_table.FILE_BYTES)
            for path, least in zip(paths, least_bytes):
                size = os.path.getsize(path)
                if size < least:
                    raise CorruptionError(path, size, f"file is {size} bytes, shorter than {least}")
        opened: list[MappedFile | PlainFile] = []
        try:
            for path in paths:
                opened.append(MappedFile(path, disk=disk) if mapped else PlainFile(path))
        except BaseException:  # a full disk while mapping one: close the others
            for f in opened:
                f.close()
            raise
        self.log, self.idx, self.sec = opened
        # Entries and delay-log bytes the files hold without growing (a
        # lower bound: mapped files only grow while open), so a send that
        # fits calls no `reserve`; plain files never need one.
        self.room_entries = self.room_log_bytes = 1 << 62
        if mapped:
            self._note_room()
        if not fresh:
            try:
                self._check_headers()
            except CorruptionError:
                for f in (self.log, self.idx, self.sec):
                    f.close()
                raise

    def _write_headers(self, paths: tuple[str, str, str]) -> None:
        log_path, idx_path, sec_path = paths
        for path, head, size in ((log_path, delay_log.header_bytes(self.hour), delay_log.HEADER_BYTES),
                                 (idx_path, delay_index.header_bytes(self.hour), delay_index.HEADER_BYTES),
                                 (sec_path, second_table.header_bytes(self.hour), second_table.FILE_BYTES)):
            with open(create_file(path, os.O_WRONLY | os.O_TRUNC), "wb") as f:
                f.write(head)
                f.truncate(size)

    def _check_headers(self) -> None:
        delay_log.check_file_header(self.log.path, self.log.read(0, delay_log.HEADER_BYTES), self.hour)
        for f, module in ((self.idx, delay_index), (self.sec, second_table)):
            head = f.read(0, module.HEADER_BYTES)
            fields = module.HEADER.unpack(head) if len(head) == module.HEADER_BYTES else None
            if fields is not None and fields[0] == module.MAGIC:
                refuse_newer(f.path, fields[1], module.VERSION)
            if fields is None or fields[0] != module.MAGIC or fields[1] != module.VERSION or fields[3] != self.hour:
                raise CorruptionError(f.path, 0, f"bad header for hour {self.hour}: {fields}")

    # -- index ----------------------------------------------------------------

    def read_entry(self, global_index: int) -> tuple[IndexEntry, int, int, int]:
        raw = self.idx.read(delay_index.entry_offset(global_index), delay_index.ENTRY_BYTES)
        if len(raw) != delay_index.ENTRY_BYTES:
            raise CorruptionError(self.idx.path, delay_index.entry_offset(global_index), "index entry past end of file")
        return delay_index.unpack_entry(self.idx.path, self.hour, global_index, raw)

    def write_staged(self, log_offset8: int, frames: bytes | bytearray, first_global_index: int,
                     entries: bytes | bytearray, slots: Iterable[tuple[int, tuple[int, int]]] | None) -> None:
        """An hour's stage written in one call (storage.hour's `flush`):
        delay-log frames at `log_offset8`, index entries from
        `first_global_index`, second-table slots."""
        if frames:
            self.write_frames(log_offset8, frames)
        if entries:
            self.write_entries(first_global_index, entries)
        if slots:
            self.write_slots(slots)

    def write_entries(self, first_global_index: int, data: bytes | bytearray) -> None:
        self.idx.write(delay_index.entry_offset(first_global_index), data)

    def write_state_bytes(self, global_index: int, mutable: bytes) -> None:
        """Overwrite an entry's status, flags and retry (delay_index.MUTABLE)."""
        self.write_states(((global_index, mutable),))

    def write_states(self, states: Iterable[tuple[int, bytes]]) -> None:
        """`write_state_bytes` of each (globalIndex, mutable bytes), in one call."""
        first, size = delay_index.HEADER_BYTES + delay_index.MUTABLE_OFFSET, delay_index.ENTRY_BYTES
        writes = []  # (a loop, not a comprehension: one call less a flush)
        for gi, mutable in states:
            writes.append((first + gi * size, mutable))
        self.idx.write_many(writes)

    # -- delay log ------------------------------------------------------------

    def read_body(self, log_offset8: int, size: int) -> bytes:
        offset = delay_log.HEADER_BYTES + log_offset8 * delay_log.ALIGN_BYTES
        return delay_log.decode_body_frame(self.log.path, self.log.read(offset, size), offset)

    def write_frames(self, log_offset8: int, data: bytes | bytearray) -> None:
        self.log.write(delay_log.HEADER_BYTES + log_offset8 * delay_log.ALIGN_BYTES, data)

    # -- second table ---------------------------------------------------------

    def read_slot(self, second: int) -> tuple[int, int]:
        raw = self.sec.read(second_table.slot_offset(second), second_table.SLOT_BYTES)
        return second_table.unpack_slot(self.sec.path, second, raw)

    def write_slot(self, second: int, last_global_index: int, count: int) -> None:
        self.write_slots(((second, (last_global_index, count)),))

    def write_slots(self, slots: Iterable[tuple[int, tuple[int, int]]]) -> None:
        """`write_slot` of each (second, (last, count)), in one call."""
        self.sec.write_many(second_table.packed_slots(slots))

    def counts(self) -> array[int]:
        """Entries per second of the hour (3600 values, storage.second_table)."""
        return second_table.counts(self.sec.read(0, second_table.FILE_BYTES))

    # -- lifetime ---------------------------------------------------------------

    def reserve(self, entries: int, log_bytes: int) -> int:
        """Mapped files: grow them now to hold `entries` entries and
        `log_bytes` of delay log, so applying them needs no disk room (a
        full disk raises OSError here); returns the bytes they grew by.
        Plain files need nothing: a pwrite on a full disk fails cleanly."""
        log, idx = self.log, self.idx
        if isinstance(log, MappedFile) and isinstance(idx, MappedFile):  # (both, or neither)
            grown = log.reserve(delay_log.HEADER_BYTES + log_bytes) + idx.reserve(delay_index.entry_offset(entries))
            self._note_room()
            return grown
        return 0

    def _note_room(self) -> None:
        self.room_entries = (self.idx.file_bytes() - delay_index.HEADER_BYTES) // delay_index.ENTRY_BYTES
        self.room_log_bytes = self.log.file_bytes() - delay_log.HEADER_BYTES

    def exact_sizes(self, entries: int, log_bytes: int) -> tuple[int, int]:
        return delay_log.HEADER_BYTES + log_bytes, delay_index.entry_offset(entries)

    def flush(self) -> None:
        for f in (self.log, self.idx, self.sec):
            f.flush()

    def shed(self) -> None:
        for f in (self.log, self.idx, self.sec):
            f.shed()

    def close(self, entries: int, log_bytes: int) -> None:
        """Close, cutting the log and index to their exact sizes (a mapped
        file was grown ahead of its data)."""
        log_size, idx_size = self.exact_sizes(entries, log_bytes)
        for f, size in ((self.log, log_size), (self.idx, idx_size), (self.sec, None)):
            f.close()
            if size is not None and os.path.getsize(f.path) != size:
                os.truncate(f.path, size)

    def __repr__(self) -> str:
        return f"HourFiles(hour={self.hour}, {'mapped' if self.mapped else 'plain'})"
