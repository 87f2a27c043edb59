"""The conformance suite: one set of API and lifecycle tests, run against a
real `hourglass serve` of every backend -- `--backend disk` and `--backend
redis://...` on a real redis-server (the session's, from tests/conftest.py).

Each test gets `api` (an `Api` over the backend's server, shared by the
session; fresh topic names keep tests apart) or `serve` (starts its own
servers of that backend, for restarts and signals). Where the backends
cannot agree, the test says so: `@pytest.mark.not_on("redis", reason=...)`
skips it there with the reason, or it asks `api.backend` and states both
expectations. What the lifecycle does at the millisecond (ack timeouts,
ttl, reschedules, restarts) is tested in process on a fake clock, for
each backend (tests/unit/test_broker_lifecycle.py, tests/integration/
test_redis_lifecycle.py); here a delayed send, an ack-timeout retry, a
ttl expiry and the long polls still run end to end in real time.
"""

from __future__ import annotations

import socket
import time
import urllib.parse
import uuid

import pytest
from serving import Server

# The disk backend three times: one shard, two (the default node on this project's
# 2-core machine) and three (what an even split hides): a node of shard processes,
# every message on the shard its msgId or key names, the others forwarded (broker.shards).
BACKENDS = ("disk", "disk-2-shards", "disk-3-shards", "redis")
MAX_MSG_BYTES = 1000


def pytest_configure(config):
    config.addinivalue_line("markers", "not_on(backend, reason): the backends disagree here; skip on that one")


@pytest.fixture(scope="session", params=BACKENDS)
def backend_flags(request) -> tuple[str, tuple[str, ...]]:
    """(backend name, the `hourglass serve` flags that select it)."""
    if request.param == "disk":
        return "disk", ("--backend", "disk", "--shards", "1")
    if request.param in ("disk-2-shards", "disk-3-shards"):
        return "disk", ("--backend", "disk", "--shards", request.param[5])
    pytest.importorskip("redis", reason="the redis extra is not installed (pip install 'hourglass[redis]')")
    return "redis", ("--backend", request.getfixturevalue("redis_url"))


@pytest.fixture(scope="session")
def shared_server(backend_flags, tmp_path_factory):
    name, flags = backend_flags
    server = Server.start(tmp_path_factory.mktemp(name) / "data", "--max-msg-bytes", str(MAX_MSG_BYTES),
                          "--monitor-interval-s", "1", *flags)  # getMonitorData per 1 s interval
    yield server
    code = server.stop()
    assert code == 0, f"exit {code} (None: it outlived SIGTERM and was killed); log: {server.process.log_tail(4000)}"


def _skip_if_marked(request, backend: str) -> None:
    for mark in request.node.iter_markers("not_on"):
        if mark.args[0] == backend:
            pytest.skip(f"not on {backend}: {mark.kwargs['reason']}")


@pytest.fixture
def api(request, backend_flags, shared_server) -> Api:
    _skip_if_marked(request, backend_flags[0])
    return Api(shared_server, backend_flags[0])


# The Redis database a server started with own_state=True uses (flushed
# first); the shared server and the others use database 0.
OWN_REDIS_DB = 15


@pytest.fixture
def serve(request, backend_flags, tmp_path):
    """serve(*flags) starts a server of this backend (data in tmp_path), as
    an `Api`; every one started is killed at the end of the test.
    `own_state=True`: one whose state starts empty on Redis too (its own
    database, flushed at the test's first such start: a later one, a
    restart, finds what the earlier ones left), for tests that count every
    topic or restart the only node of a Redis."""
    name, backend = backend_flags
    _skip_if_marked(request, name)
    started: list[Server] = []
    flushed = False

    def start(*flags: str, own_state: bool = False) -> Api:
        nonlocal flushed
        selected = backend
        if own_state and name == "redis":
            import redis

            url = backend[1].rpartition("/")[0] + f"/{OWN_REDIS_DB}"
            if not flushed:
                with redis.Redis.from_url(url) as client:
                    client.flushdb()
                flushed = True
            selected = ("--backend", url)
        started.append(Server.start(tmp_path / "data", *selected, *flags, log_path=tmp_path / "serve.log"))
        return Api(started[-1], name)
    yield start
    for server in started:
        server.kill()


@pytest.fixture
def topic() -> str:
    return "t-" + uuid.uuid4().hex[:12]


class Api:
    """A serving process and the calls tests make; `send`, `pull`, `info`
    assert the call succeeded."""

    def __init__(self, server: Server, backend: str) -> None:
        self.server = server
        self.backend = backend
        self.max_msg_bytes = MAX_MSG_BYTES  # shared_server's --max-msg-bytes
        self.post = server.post
        self.post_json = server.post_json
        self.get = server.get

    def __repr__(self) -> str:
        return f"Api({self.backend}, {self.server.base})"

    def send(self, topic: str, msg: str = "m", **params) -> dict:
        status, body = self.post("sendMsg", topic=topic, msg=msg, **params)
        assert status == 200, body
        return body["delayMsg"]

    def pull(self, topic: str, **params) -> list[dict]:
        status, body = self.post("pullMsg", topic=topic, **params)
        assert status == 200, body
        return body["delayMsgList"]

    def message(self, topic: str, msg_id: str) -> dict | int:
        """getMsg's delayMsg, or the status code if not 200."""
        status, body = self.post("getMsg", topic=topic, msgId=msg_id)
        return body["delayMsg"] if status == 200 else status

    def info(self, topic: str) -> dict | int:
        """getTopicInfo's data, or the status code if not 200."""
        status, body = self.get("getTopicInfo", topic=topic)
        return body["data"] if status == 200 else status

    def is_empty(self, topic: str) -> bool:
        """Nothing stored in the topic (getTopicInfo answers zeros)."""
        data = self.info(topic)
        return (isinstance(data, dict) and data["waitingQueueSize"] == data["readyQueueSize"]
                == data["ackQueueSize"] == 0)

    def pull_until(self, topic: str, count: int, timeout_s: float = 5, **params) -> list[dict]:
        """Long-poll until `count` messages came (or the timeout)."""
        got, deadline = [], time.monotonic() + timeout_s
        while len(got) < count and time.monotonic() < deadline:
            status, body = self.post("longPollingMsg", topic=topic, batch=count - len(got),
                                     longPollingTimeoutMillis=300, **params)
            assert status == 200, body
            got += body["delayMsgList"]
        return got

    def wait_status(self, topic: str, msg_id: str, statuses: set[int], timeout_s: float = 5) -> dict:
        """getMsg until its status is one of `statuses` (or the timeout;
        none yet, 404, is waited for too)."""
        deadline = time.monotonic() + timeout_s
        while True:
            m = self.message(topic, msg_id)
            if (isinstance(m, dict) and m["status"] in statuses) or time.monotonic() > deadline:
                return m
            time.sleep(0.02)

    def abandoned_long_poll(self, topic: str, **params) -> None:
        """Start a long poll and hang up before it is answered."""
        host, port = self.server.base.removeprefix("http://").split(":")
        body = urllib.parse.urlencode({"topic": topic, **params}).encode()
        with socket.create_connection((host, int(port))) as s:
            s.sendall(b"POST /camellia/delayQueue/longPollingMsg HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                      b"Content-Type: application/x-www-form-urlencoded\r\n"
                      + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            time.sleep(0.3)
