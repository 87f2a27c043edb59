"""Edge cases of storage.checkpoint."""

from __future__ import annotations

import zlib

import msgpack
import pytest

from storage.checkpoint import HEADER, MAGIC, Checkpoint, HourRecord
from storage.errors import CorruptionError, OlderFormatError


def test_no_file_means_no_checkpoint(tmp_path):
    assert Checkpoint.load(str(tmp_path / "checkpoint")) is None


def test_a_leftover_temporary_file_is_ignored(tmp_path):
    path = str(tmp_path / "checkpoint")
    Checkpoint(7, (HourRecord(490000, 3, 96, 1, 5, {77: [1, 1, 0, 1, 0, 0, 0]}),), 9, {77: "orders"}).save(path)
    (tmp_path / "checkpoint.tmp").write_bytes(b"torn")
    assert Checkpoint.load(path) == Checkpoint(7, (HourRecord(490000, 3, 96, 1, 5, {77: [1, 1, 0, 1, 0, 0, 0]}),), 9, {77: "orders"})


def test_the_default_checkpoint_round_trips():
    assert Checkpoint.decode("ck", Checkpoint().encode()) == Checkpoint()


@pytest.mark.parametrize(("data", "offset"), [(b"", 0), (b"HGCK\x02\x00", 0), (b"HGCX" + bytes(12), 0),
                                          (b"HGCK\x09\x00" + bytes(10), 4)])
def test_a_bad_header_is_refused_with_its_offset(data, offset):
    with pytest.raises(CorruptionError) as caught:
        Checkpoint.decode("ck", data)
    assert (caught.value.path, caught.value.offset) == ("ck", offset)


def test_an_empty_file_is_refused(tmp_path):
    path = tmp_path / "checkpoint"
    path.write_bytes(b"")
    with pytest.raises(CorruptionError):
        Checkpoint.load(str(path))



def version_1(commit_offset: int, hours: list[list[int]], written_ms: int) -> bytes:
    """A checkpoint as the storage engine wrote it before c353983: version
    1, hours without per-topic counts, no topic names."""
    body = msgpack.packb({"commit_offset": commit_offset, "hours": hours, "written_ms": written_ms})
    return HEADER.pack(MAGIC, 1, 0, len(body), zlib.crc32(body)) + body


def test_a_version_1_checkpoint_is_refused_with_what_wrote_it_and_what_to_do(tmp_path):
    path = tmp_path / "checkpoint"
    path.write_bytes(version_1(96, [[490000, 3, 96, 1, 5]], 9))
    with pytest.raises(OlderFormatError) as caught:
        Checkpoint.load(str(path))
    said = str(caught.value)
    assert said.startswith(f"{path}: format 1, older than this hourglass reads (2): written by the storage engine "
                           f"alone, before hourglass served its API (before commit c353983)"), said
    assert "git archive c353983^ storage" in said and "docs/operations.md" in said, said
    assert (caught.value.path, caught.value.offset, caught.value.found, caught.value.reads) == (str(path), 4, 1, 2)


def test_a_version_2_checkpoint_whose_version_byte_reads_1_is_damage_not_the_engine_only_format():
    raw = bytearray(Checkpoint(7, (HourRecord(490000, 3, 96, 1, 5, {77: [1, 1, 0, 1, 0, 0, 0]}),), 9, {77: "o"}).encode())
    raw[4] = 1
    with pytest.raises(CorruptionError, match="unsupported version 1") as caught:
        Checkpoint.decode("ck", bytes(raw))
    assert not isinstance(caught.value, OlderFormatError)
