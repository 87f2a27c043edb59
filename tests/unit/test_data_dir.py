"""storage.data_dir, and the modes the store makes: under umask 022 every
file and directory of a store is its owner's alone; a data directory is
made private, refused when read-only, and what group or others may reach
in it is found and named with the command that closes it."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess

import pytest
from modes import everything_under, open_to_others, read_only_tmpfs

from storage import data_dir
from storage.config import StoreConfig
from storage.entry import MS_PER_HOUR
from storage.errors import DataDirError
from storage.store import NewMessage, Store

NOW = 490_000 * MS_PER_HOUR + 5_000


@pytest.fixture
def umask_022():
    """The umask most systems give a user: what an older release's files got."""
    before = os.umask(0o022)
    yield
    os.umask(before)


def mode_of(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_a_store_made_under_umask_022_is_its_owner_s_alone(tmp_path, umask_022):
    path = tmp_path / "parent" / "store"  # its parent made by the store as mkdir -p makes it
    # a near hour, a far one, a span, and enough records to roll the commit log
    delays = (1000, 5 * MS_PER_HOUR, 40 * MS_PER_HOUR, 400 * 24 * MS_PER_HOUR)
    store = Store.open(str(path), StoreConfig(segment_bytes=4096), now_ms=NOW)
    try:
        for n in range(20):
            store.send([NewMessage("t", f"{n}-{i}", "body " * 40, NOW, NOW + delay, 60_000, 3)
                        for i, delay in enumerate(delays)], NOW)
            store.commit()
        store.checkpoint(NOW)
    finally:
        store.close()
    shutil.rmtree(path / "ids")  # rebuilt at the next open: a new secret, in ids.new renamed to ids
    Store.open(str(path), now_ms=NOW).close()
    made = everything_under(path)
    assert {"checkpoint", "ids/secret", "ids/00.hix", "delay", "commitlog"} <= made
    assert "commitlog/00000000000000000000.log" not in made  # the one there now was made by a roll
    assert len([p for p in made if p.startswith("delay/")]) >= 9
    assert open_to_others(path) == []
    assert mode_of(path) == 0o700 and mode_of(path / "checkpoint") == 0o600


def test_prepare_makes_a_missing_directory_private(tmp_path, umask_022):
    path = tmp_path / "a" / "data"
    data_dir.prepare(str(path))
    assert mode_of(path) == 0o700
    assert mode_of(tmp_path / "a") == 0o755  # not the store's: made as mkdir -p makes it
    data_dir.prepare(str(path))  # there already: left as it is
    assert os.listdir(path) == []


def test_prepare_refuses_a_file(tmp_path):
    (tmp_path / "data").write_text("not a directory")
    with pytest.raises(DataDirError, match="exists and is not a directory"):
        data_dir.prepare(str(tmp_path / "data"))


def test_prepare_refuses_a_read_only_file_system(tmp_path):
    with read_only_tmpfs(tmp_path / "ro", lambda root: os.mkdir(os.path.join(root, "data"), 0o700)) as root:
        with pytest.raises(DataDirError, match="read-only file system"):
            data_dir.prepare(os.path.join(root, "data"))
        with pytest.raises(DataDirError, match=r"cannot create the data directory .*: Read-only file system"):
            data_dir.prepare(os.path.join(root, "missing"))


def test_prepare_refuses_a_directory_this_user_may_not_write(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root may write any directory: the read-only file system is root's case")
    path = tmp_path / "data"
    path.mkdir(0o500)
    try:
        with pytest.raises(DataDirError, match="not readable and writable by this user"):
            data_dir.prepare(str(path))
    finally:
        path.chmod(0o700)


def test_shared_entries_are_the_directory_and_what_is_directly_in_it(tmp_path):
    path = tmp_path / "my data"
    (path / "delay").mkdir(parents=True)
    (path / "checkpoint").write_bytes(b"x")
    (path / "delay" / "0000000001.log").write_bytes(b"x")
    path.chmod(0o700)
    (path / "delay").chmod(0o700)
    (path / "checkpoint").chmod(0o600)
    (path / "delay" / "0000000001.log").chmod(0o644)  # below the top: not looked at
    assert data_dir.shared_entries(str(path)) == []
    (path / "checkpoint").chmod(0o640)
    path.chmod(0o711)
    assert data_dir.shared_entries(str(path)) == [(str(path), 0o711), (str(path / "checkpoint"), 0o640)]


def test_the_command_named_makes_everything_private_in_a_path_with_spaces(tmp_path):
    path = tmp_path / "my data; dir"
    (path / "ids").mkdir(parents=True, mode=0o755)
    (path / "ids" / "secret").write_bytes(b"k")
    (path / "ids" / "secret").chmod(0o644)
    path.chmod(0o755)
    subprocess.run(data_dir.private_command(str(path)), shell=True, check=True)
    assert open_to_others(path) == []
    assert mode_of(path / "ids" / "secret") == 0o600  # the owner keeps what it had

