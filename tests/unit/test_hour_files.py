"""Edge cases of storage.hour_files and the per-entry codecs it reads through
(storage.delay_index, storage.second_table)."""

from __future__ import annotations

import os

import pytest

from storage import delay_index, second_table
from storage.errors import CorruptionError
from storage.hour_files import HourFiles, hour_paths

HOUR = 490_000


def make_hour(directory, slots=((17, 41, 3),)) -> None:
    files = HourFiles(str(directory), HOUR, mapped=False, create=True)
    for second, last, count in slots:
        files.write_slot(second, last, count)
    files.close(0, 0)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("mapped", [False, True])
@pytest.mark.parametrize("create", [False, True])
def test_a_short_second_table_is_refused_not_grown_with_empty_seconds(tmp_path, mapped, create):
    # A mapped open grows a file with zeros, and an all-zero slot reads as an
    # empty second: second 17's three messages would silently disappear.
    make_hour(tmp_path, slots=[(3599, 41, 3)])
    _, _, sec_path = hour_paths(str(tmp_path), HOUR)
    os.truncate(sec_path, second_table.slot_offset(3599))
    with pytest.raises(CorruptionError) as caught:
        HourFiles(str(tmp_path), HOUR, mapped=mapped, create=create)
    assert caught.value.path == sec_path
    assert os.path.getsize(sec_path) == second_table.slot_offset(3599)  # refusing changed nothing


@pytest.mark.parametrize("mapped", [False, True])
def test_existing_files_are_checked_even_when_asked_to_create(tmp_path, mapped):
    make_hour(tmp_path)
    _, idx_path, _ = hour_paths(str(tmp_path), HOUR)
    with open(idx_path, "r+b") as f:
        f.seek(8)
        f.write((HOUR + 1).to_bytes(8, "little"))
    with pytest.raises(CorruptionError) as caught:
        HourFiles(str(tmp_path), HOUR, mapped=mapped, create=True)
    assert caught.value.path == idx_path


@pytest.mark.parametrize("mapped", [False, True])
def test_a_refused_open_leaks_no_file_descriptor(tmp_path, mapped):
    make_hour(tmp_path)
    log_path, _, _ = hour_paths(str(tmp_path), HOUR)
    with open(log_path, "r+b") as f:
        f.write(b"XXXX")
    before = open_fds()
    for _ in range(3):
        with pytest.raises(CorruptionError):
            HourFiles(str(tmp_path), HOUR, mapped=mapped, create=False)
    assert open_fds() == before


def test_an_entry_past_the_end_of_the_index_is_refused(tmp_path):
    make_hour(tmp_path)
    files = HourFiles(str(tmp_path), HOUR, mapped=False, create=False)
    try:
        with pytest.raises(CorruptionError) as caught:
            files.read_entry(0)
        assert caught.value.offset == delay_index.entry_offset(0)
    finally:
        files.close(0, 0)


def test_short_entry_bytes_are_refused_by_the_codec():
    raw = delay_index.pack_entry(1, 2, 3, 0, 5, -1, 7, 8, 9, 10)
    with pytest.raises(CorruptionError) as caught:
        delay_index.unpack_entry("idx", HOUR, 5, raw[:-1])
    assert (caught.value.path, caught.value.offset) == ("idx", delay_index.entry_offset(5))


def test_no_previous_entry_round_trips_as_minus_one():
    raw = delay_index.pack_entry(1, 2, 3, 0, 5, -1, 7, 8, 9, 10)
    assert raw[24:28] == b"\xff\xff\xff\xff"
    entry, _, _, _ = delay_index.unpack_entry("idx", HOUR, 5, raw)
    assert entry.pre_global_index == -1


def test_second_3600_is_refused():
    raw = delay_index.pack_entry(1, 2, 3, 0, 5, -1, 7, 8, 9, 3600)
    with pytest.raises(CorruptionError):
        delay_index.unpack_entry("idx", HOUR, 5, raw)


def test_short_slot_bytes_are_refused_by_the_codec():
    with pytest.raises(CorruptionError) as caught:
        second_table.unpack_slot("sec", 17, second_table.pack_slot(17, 41, 3)[:-1])
    assert (caught.value.path, caught.value.offset) == ("sec", second_table.slot_offset(17))


def test_an_all_zero_slot_is_an_empty_second():
    assert second_table.unpack_slot("sec", 17, bytes(second_table.SLOT_BYTES)) == (-1, 0)


@pytest.mark.parametrize(("last", "count"), [(0, 0), (1, 3)])
def test_a_slot_with_a_good_checksum_but_impossible_counts_is_refused(last, count):
    # count 0 is written as an all-zero slot; a second cannot hold more
    # entries than the hour has up to its last one.
    with pytest.raises(CorruptionError):
        second_table.unpack_slot("sec", 17, second_table.pack_slot(17, last, count))


def test_counts_reads_every_second_from_the_table_bytes(tmp_path):
    make_hour(tmp_path, slots=[(0, 4, 5), (17, 41, 3), (3599, 99, 1)])
    files = HourFiles(str(tmp_path), HOUR, mapped=True, create=False)
    try:
        counts = files.counts()
        assert len(counts) == second_table.SECONDS
        assert (counts[0], counts[17], counts[3599], sum(counts)) == (5, 3, 1, 9)
    finally:
        files.close(0, 0)
