"""A pause costs its own change, not a rewrite of every pause of the node
(on disk, broker.flow.file: one record appended to the settings log; on
Redis, broker.redis.flow: the fields it changes written, the topic's other
paused keys neither read nor written), and paused keys have a node-wide
cap (--max-paused-keys-total), on one shard, on a node of two (every shard
carries out every pause, shard 0's files keep them: the count is the
node's, and a pause is written once) and on Redis: 300 pauses of 1 KB
keys writing at most 2 MB whatever the node."""

from __future__ import annotations

import os
import pathlib
import signal
import uuid

import pytest
from harness import children, wait_until
from pauses import settings_bytes, written_bytes
from serving import Server

pytestmark = pytest.mark.slow

NODES = ["1 shard", "2 shards", "redis"]


def _flags(request: pytest.FixtureRequest, node: str) -> list[str]:
    if node == "redis":
        pytest.importorskip("redis", reason="the redis extra is not installed (pip install 'hourglass[redis]')")
        import redis
        url = request.getfixturevalue("redis_url")
        with redis.Redis.from_url(url) as client:  # (the session's server: another test's pauses count too)
            client.flushdb()
        return ["--backend", url]
    return ["--shards", node.split()[0]]


def _read_bytes(server: Server) -> int:
    """/proc/PID/io's rchar summed over the node's processes (files and sockets: on Redis, its answers)."""
    return written_bytes(server, "rchar")


@pytest.mark.parametrize("node", NODES)
def test_300_pauses_of_distinct_1_kb_keys_write_what_they_change(request, tmp_path, node):
    """300 keys of 1 KB paused one after another (the whole file rewritten
    each time wrote some 186 times the keys; on Redis, the topic's hash
    read and written whole: 74 MB written for 300 pauses beside 1,000
    keys); read back after a restart."""
    flags, topic = _flags(request, node), "t-" + uuid.uuid4().hex[:8]
    server = Server.start(tmp_path / "data", *flags)
    try:
        before, read_before = written_bytes(server), _read_bytes(server)
        for i in range(300):
            code, body = server.post("pauseTopic", topic=topic, key=f"{i:04d}" + "k" * 1020)
            assert code == 200, body
        written, read = written_bytes(server) - before, _read_bytes(server) - read_before
        # the node's processes all told (the shards that carried out a forwarded pause answer its
        # success alone: broker.shards.answers' SUCCESS_ONLY)
        assert written <= 2_000_000, written
        assert read <= 2_000_000, read
        if node != "redis":  # each pause appended once for the node: some 1.26 KB of record a pause
            assert settings_bytes(str(tmp_path / "data")) <= 300 * 1_500, settings_bytes(str(tmp_path / "data"))
    finally:
        assert server.stop() == 0
    server = Server.start(tmp_path / "data", *flags)
    try:
        paused = server.get(f"/camellia/delayQueue/getTopicInfo?topic={topic}")[1]["data"]["paused"]
        assert sorted(paused) == sorted(f"{i:04d}" + "k" * 1020 for i in range(300))
    finally:
        assert server.stop() == 0


@pytest.mark.parametrize("node", NODES)
def test_paused_keys_have_a_node_wide_cap(request, tmp_path, node):
    flags, run = _flags(request, node), uuid.uuid4().hex[:8]
    server = Server.start(tmp_path / "data", *flags, "--max-paused-keys-total", "5", "--max-paused-keys", "100")
    try:
        for i in range(5):
            assert server.post("pauseTopic", topic=f"t{i % 2}-{run}", key=f"k{i}")[0] == 200
        code, body = server.post("pauseTopic", topic=f"t9-{run}", key="k9")
        assert code == 429 and "--max-paused-keys-total" in body["msg"], body
        assert server.get(f"/camellia/delayQueue/getTopicInfo?topic=t9-{run}")[1]["data"]["paused"] is False
        assert server.post("pauseTopic", topic=f"t9-{run}")[0] == 200  # a topic's own pause: no key, no cap
        assert server.post("resumeTopic", topic=f"t0-{run}", key="k0")[0] == 200
        assert server.post("pauseTopic", topic=f"t9-{run}", key="k9")[0] == 200
    finally:
        assert server.stop() == 0


def test_a_shard_killed_and_started_again_reads_the_nodes_pauses(tmp_path):
    """On a node of two, shard 0's files keep the node's pauses: shard 1,
    killed (SIGKILL) and started again by the node, reads them there and
    carries them out as before (its own port answers them), and a change
    made since is kept too."""
    server = Server.start(tmp_path / "data", "--shards", "2")
    try:
        assert server.post("pauseTopic", topic="t", key="before")[0] == 200
        assert server.post("setTopicConfig", topic="t", releaseRate=50)[0] == 200
        assert not os.path.exists(tmp_path / "data" / "shard-1" / "topic-settings.log")
        victim = next(pid for pid in children(server.proc.pid)  # shard 1, by its command line
                      if b"--shard-of\x001/2" in pathlib.Path(f"/proc/{pid}/cmdline").read_bytes())
        os.kill(victim, signal.SIGKILL)
        wait_until(lambda: len(children(server.proc.pid)) == 2 and victim not in children(server.proc.pid), 60,
                   "shard 1 started again")
        wait_until(lambda: server.get("/health")[0] == 200, 60, "the node whole again")
        import http.client
        import json

        def shard_1_config() -> dict:  # (a shard started again listens on a port of its own: the map's)
            port = server.get("/camellia/delayQueue/getShardMap")[1]["ports"][1]
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            try:
                connection.request("GET", "/camellia/delayQueue/getTopicConfig?topic=t")
                return json.loads(connection.getresponse().read())["data"]
            finally:
                connection.close()
        def shard_1_answers() -> bool:
            try:
                shard_1_config()
            except OSError:
                return False
            return True
        wait_until(shard_1_answers, 60, "shard 1's port answering")
        config = shard_1_config()
        assert config["releaseRate"] == 50 and config["pausedKeyCount"] == 1, config
        assert server.post("pauseTopic", topic="t", key="after")[0] == 200
        assert shard_1_config()["pausedKeyCount"] == 2
    finally:
        assert server.stop() == 0
