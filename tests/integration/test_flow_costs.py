"""A pause costs its own change (broker.flow.file: one record appended to
the settings log), not a rewrite of every pause of the node, and paused
keys have a node-wide cap (--max-paused-keys-total), on one shard and on
a node of two (every shard keeps every pause: the count is the node's),
300 pauses of 1 KB keys writing at most 2 MB whatever the shards."""

from __future__ import annotations

import pytest
from pauses import written_bytes
from serving import Server

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("shards", ["1", "2"])
def test_300_pauses_of_distinct_1_kb_keys_write_what_they_change(tmp_path, shards):
    """300 keys of 1 KB paused one after another (the whole file rewritten
    each time wrote some 186 times the keys); read back after a restart."""
    server = Server.start(tmp_path / "data", "--shards", shards)
    try:
        before = written_bytes(server)
        for i in range(300):
            code, body = server.post("pauseTopic", topic="t", key=f"{i:04d}" + "k" * 1020)
            assert code == 200, body
        written = written_bytes(server) - before
        # the node's processes all told (each shard keeps every pause; the shards that carried out a
        # forwarded pause answer its success alone: broker.shards.answers' SUCCESS_ONLY)
        assert written <= 2_000_000, written
    finally:
        assert server.stop() == 0
    server = Server.start(tmp_path / "data", "--shards", shards)
    try:
        paused = server.get("/camellia/delayQueue/getTopicInfo?topic=t")[1]["data"]["paused"]
        assert sorted(paused) == sorted(f"{i:04d}" + "k" * 1020 for i in range(300))
    finally:
        assert server.stop() == 0


@pytest.mark.parametrize("shards", ["1", "2"])
def test_paused_keys_have_a_node_wide_cap(tmp_path, shards):
    server = Server.start(tmp_path / "data", "--shards", shards, "--max-paused-keys-total", "5",
                          "--max-paused-keys", "100")
    try:
        for i in range(5):
            assert server.post("pauseTopic", topic=f"t{i % 2}", key=f"k{i}")[0] == 200
        code, body = server.post("pauseTopic", topic="t9", key="k9")
        assert code == 429 and "--max-paused-keys-total" in body["msg"], body
        assert server.get("/camellia/delayQueue/getTopicInfo?topic=t9")[1]["data"]["paused"] is False
        assert server.post("pauseTopic", topic="t9")[0] == 200  # a topic's own pause: no key, no cap
        assert server.post("resumeTopic", topic="t0", key="k0")[0] == 200
        assert server.post("pauseTopic", topic="t9", key="k9")[0] == 200
    finally:
        assert server.stop() == 0
