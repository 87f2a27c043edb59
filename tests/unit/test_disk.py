"""Error paths of storage.disk and storage.files: a syncfs that reports a
write-back error fails the checkpoint; a full disk while reserving a
mapped file's blocks is an error, never a sparse file. The disk is a
FaultyDisk the store or file is handed."""

from __future__ import annotations

import errno
import os

import pytest
from fakes import FaultyDisk

from storage import files
from storage.entry import MS_PER_HOUR
from storage.files import MappedFile
from storage.store import NewMessage, Store

NOW = 490_000 * MS_PER_HOUR + 5_000


def a_store_with_a_checkpoint(path, disk: FaultyDisk) -> Store:
    store = Store.open(str(path), now_ms=NOW, disk=disk)
    store.send([NewMessage("t", "a", "body", NOW, NOW + 1000, 60_000, 3)], NOW)
    store.checkpoint(NOW)
    store.send([NewMessage("t", "b", "body", NOW, NOW + 2000, 60_000, 3)], NOW)
    return store


def test_an_eio_from_syncfs_fails_the_checkpoint(tmp_path):
    disk = FaultyDisk()
    store = a_store_with_a_checkpoint(tmp_path, disk)
    checkpoint_before = (tmp_path / "checkpoint").read_bytes()
    disk.syncfs_error, disk.syncfs_calls = errno.EIO, 0
    try:
        with pytest.raises(OSError, match="syncfs of the data directory") as caught:
            store.checkpoint(NOW)
        assert caught.value.errno == errno.EIO
        assert caught.value.filename == str(tmp_path)  # for the log; a failed node's /health shows the repr:
        assert str(tmp_path) not in repr(caught.value)
        assert disk.syncfs_calls == 1 and disk.fsynced == []  # no fallback hides it
        assert (tmp_path / "checkpoint").read_bytes() == checkpoint_before  # nothing recorded as durable
    finally:
        store.close()


def test_only_a_missing_syncfs_falls_back_to_fsyncing_every_file(tmp_path):
    disk = FaultyDisk()
    disk.syncfs_error = errno.ENOSYS
    store = a_store_with_a_checkpoint(tmp_path, disk)
    try:
        disk.fsynced.clear()
        store.checkpoint(NOW)
    finally:
        store.close()
    assert {os.path.relpath(p, tmp_path) for p in disk.fsynced} >= {
        ".", "delay", "checkpoint", "ids/00.hix", "ids/secret", "commitlog/" + os.listdir(tmp_path / "commitlog")[0]}


def test_a_full_disk_while_growing_a_mapped_file_raises_and_the_file_stays_usable(tmp_path):
    path = str(tmp_path / "mapped")
    disk = FaultyDisk()
    f = MappedFile(path, create=True, min_bytes=4096, disk=disk)
    try:
        f.write(0, b"kept")
        disk.full = True
        with pytest.raises(OSError, match="No space left on device") as caught:
            f.write(4000, b"x" * 200)  # needs 8 KiB
        assert caught.value.errno == errno.ENOSPC
        assert os.path.getsize(path) == 4096  # not grown sparse
        assert f.read(0, 4) == b"kept"  # the old mapping is intact
        f.write(8, b"more")
        disk.full = False
        f.write(4000, b"x" * 200)
        assert f.read(4000, 200) == b"x" * 200
        assert disk.refused == 1 and disk.preallocated == [4096, 8192]
    finally:
        f.close()


def test_a_full_disk_while_creating_a_mapped_file_raises_and_leaks_no_descriptor(tmp_path):
    before = len(os.listdir("/proc/self/fd"))
    disk = FaultyDisk()
    disk.full = True
    with pytest.raises(OSError, match="No space left on device"):
        files.MappedFile(str(tmp_path / "new"), create=True, disk=disk)
    assert len(os.listdir("/proc/self/fd")) == before
