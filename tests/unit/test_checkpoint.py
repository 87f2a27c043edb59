"""Edge cases of storage.checkpoint."""

from __future__ import annotations

import pytest

from storage.checkpoint import Checkpoint, HourRecord
from storage.errors import CorruptionError


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

