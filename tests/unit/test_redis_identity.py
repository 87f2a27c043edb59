"""A Redis-backed node's id (broker.redis.identity): kept in DATA/node-id
across restarts, never shared by two live processes on one data
directory, written anew when missing or damaged."""

from __future__ import annotations

import os

from broker.redis.identity import NODE_ID_FILE, node_identity


def test_the_id_is_kept_across_restarts_and_not_shared_while_held(tmp_path):
    data = str(tmp_path / "data")
    first, lock = node_identity(data)
    assert len(first) == 32 and lock is not None
    assert oct(os.stat(os.path.join(data, NODE_ID_FILE)).st_mode & 0o777) == "0o600"
    other, no_lock = node_identity(data)  # a second process on the same directory, while the first runs
    assert other != first and no_lock is None
    os.close(lock)  # the first process ends (a kill -9 drops its lock the same way)
    again, lock = node_identity(data)
    assert again == first and lock is not None
    os.close(lock)


def test_a_damaged_id_is_written_anew(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / NODE_ID_FILE).write_text("not an id at all, and longer than any id could be\n")
    made, lock = node_identity(str(data))
    assert lock is not None and len(made) == 32 and (data / NODE_ID_FILE).read_text() == made + "\n"
    os.close(lock)
    kept, lock = node_identity(str(data))
    assert kept == made and lock is not None
    os.close(lock)
