"""wheel.tick_state: the value, the two-slot file, and its refusals."""

import os
import struct
import zlib

import pytest

from storage.errors import NewerFormatError
from wheel.tick_state import (
    FILE_SIZE,
    HEADER,
    MAGIC,
    SLOT,
    TickState,
    TickStateError,
    TickStateFile,
    parse,
)


def test_layout_sizes_match_the_docstring_table():
    assert (HEADER.size, SLOT.size, FILE_SIZE) == (16, 32, 80)


def test_tick_state_value():
    t = TickState.at(472_002 * 3600 + 300, 4)
    assert t == TickState(472_002, 300, 4)
    assert t.abs_s == 472_002 * 3600 + 300 and t.position == (t.abs_s, 4)
    assert repr(t) == "TickState(472002:0300#4)"


def test_fresh_file_has_no_state_and_round_trips(tmp_path):
    path = tmp_path / "tick"
    with TickStateFile(path) as f:
        assert f.state is None and f.sequence == 0
        f.write(TickState(472_002, 300, 4))
        f.write(TickState(472_002, 301, 0))
    assert parse(path.read_bytes())[1] == TickState(472_002, 301, 0)
    with TickStateFile(path, fsync=True) as f:
        assert f.state == TickState(472_002, 301, 0) and f.sequence == 2
        f.write(TickState(472_002, 302, 7))
        assert f.writes == 1
        assert "sequence=3" in repr(f)
    assert parse(path.read_bytes())[1] == TickState(472_002, 302, 7)
    assert not os.path.exists(str(path) + ".tmp")


def test_records_alternate_between_the_two_slots(tmp_path):
    path = tmp_path / "tick"
    with TickStateFile(path) as f:
        f.write(TickState(1, 1, 1))  # sequence 1 -> slot 1 (offset 48)
        data = path.read_bytes()
        assert data[16:48] == bytes(32) and data[48:56] == struct.pack("<Q", 1)
        f.write(TickState(2, 2, 2))  # sequence 2 -> slot 0 (offset 16)
        data = path.read_bytes()
        assert data[16:24] == struct.pack("<Q", 2) and data[48:56] == struct.pack("<Q", 1)


def _written(tmp_path, *states: TickState) -> bytes:
    path = tmp_path / "tick"
    with TickStateFile(path) as f:
        for s in states:
            f.write(s)
    return path.read_bytes()


def test_a_torn_newest_slot_falls_back_to_the_previous_record(tmp_path):
    data = bytearray(_written(tmp_path, TickState(1, 1, 1), TickState(2, 2, 2)))
    data[16 + 9] ^= 0xFF  # newest record (sequence 2, slot 0) torn
    assert parse(bytes(data)) == (1, TickState(1, 1, 1))
    (tmp_path / "tick").write_bytes(bytes(data))
    with TickStateFile(tmp_path / "tick") as f:  # and the next write replaces the torn slot
        f.write(TickState(3, 3, 3))
    assert parse((tmp_path / "tick").read_bytes()) == (2, TickState(3, 3, 3))


def test_no_valid_slot_is_an_error_naming_path_offset_and_reason(tmp_path):
    data = bytearray(_written(tmp_path, TickState(1, 1, 1), TickState(2, 2, 2)))
    data[20] ^= 1
    data[60] ^= 1
    (tmp_path / "tick").write_bytes(bytes(data))
    with pytest.raises(TickStateError) as info:
        TickStateFile(tmp_path / "tick")
    err = info.value
    assert err.path == str(tmp_path / "tick") and err.offset == 16
    assert "no valid slot" in err.reason and "slot 0 crc" in err.reason and "slot 1 crc" in err.reason
    assert str(tmp_path / "tick") in str(err) and "offset 16" in str(err)


def test_one_torn_slot_and_one_never_written_is_an_error(tmp_path):
    data = bytearray(_written(tmp_path, TickState(1, 1, 1)))
    data[50] ^= 1
    with pytest.raises(TickStateError, match="offset 48"):
        parse(bytes(data), "p")


@pytest.mark.parametrize(("mutate", "offset", "reason"), [
    (lambda d: d[:79], 79, "file is 79 bytes, expected 80"),
    (lambda d: d + b"\0", 80, "file is 81 bytes, expected 80"),
    (lambda d: b"", 0, "file is 0 bytes"),
    (lambda d: b"XXXX" + d[4:], 0, "magic is b'XXXX'"),
    (lambda d: d[:4] + struct.pack("<H", 0) + d[6:], 4, "version is 0, this build reads 1"),
    (lambda d: d[:6] + struct.pack("<H", 33) + d[8:], 6, "slot size is 33"),
    (lambda d: d[:8] + struct.pack("<I", 3) + d[12:], 8, "slot count is 3"),
    (lambda d: d[:12] + b"\0\0\0\0" + d[16:], 12, "header crc"),
])
def test_bad_files_are_refused(tmp_path, mutate, offset, reason):
    data = mutate(_written(tmp_path, TickState(1, 1, 1)))
    with pytest.raises(TickStateError) as info:
        parse(data, "the-path")
    assert info.value.offset == offset and reason in info.value.reason
    assert info.value.path == "the-path"


def test_a_newer_version_is_refused_as_newer_not_as_damage(tmp_path):
    data = _written(tmp_path, TickState(1, 1, 1))
    with pytest.raises(NewerFormatError) as info:
        parse(data[:4] + struct.pack("<H", 2) + data[6:], "the-path")
    assert (info.value.path, info.value.offset, info.value.found, info.value.reads) == ("the-path", 4, 2, 1)
    assert "written by a newer hourglass (format 2; this one reads 1)" in str(info.value)


def _slot(sequence: int, second: int = 1) -> bytes:
    body = SLOT.pack(sequence, 5, second, 0, 0, 0)[:-4]
    return body + struct.pack("<I", zlib.crc32(body))


def test_a_record_in_the_wrong_slot_is_refused(tmp_path):
    data = _written(tmp_path)
    with pytest.raises(TickStateError, match="slot 0 holds sequence 3, which belongs in slot 1"):
        parse(data[:16] + _slot(3) + data[48:])


def test_a_second_out_of_range_is_refused(tmp_path):
    data = _written(tmp_path)
    with pytest.raises(TickStateError, match="second_tick is 3600") as info:
        parse(data[:48] + _slot(1, second=3600))
    assert info.value.offset == 48 + 16


def test_write_checks_its_argument_and_the_file(tmp_path):
    f = TickStateFile(tmp_path / "tick")
    with pytest.raises(ValueError, match="not a tick state"):
        f.write(TickState(1, 3600, 0))
    f.close()
    f.close()
    with pytest.raises(ValueError, match="closed"):
        f.write(TickState(1, 1, 1))


def test_header_is_what_the_table_says(tmp_path):
    data = _written(tmp_path)
    assert data[:4] == MAGIC
    assert struct.unpack("<HHI", data[4:12]) == (1, 32, 2)
    assert struct.unpack("<I", data[12:16])[0] == zlib.crc32(data[:12])
