"""The systems bench/peers.py runs side by side. Each is a server this
benchmark starts on 127.0.0.1 (a free port, a fresh data directory) and
stops by PID, plus the asyncio client its producer and consumer processes
use:

  hourglass   `python -m broker.cli serve --fsync batch` (answers 200 only
              once the write is fsync'ed); camellia's HTTP API over raw
              HTTP/1.1 keep-alive connections (no HTTP library in the way)
  redis       redis-server (AOF, no RDB) holding a Dyno-queues /
              camellia-delay-queue layout per topic T:
                dq:{T}:msgs     hash  id -> payload
                dq:{T}:waiting  zset  id scored by trigger ms
                dq:{T}:ready    list  ids due, popped from the left
                dq:{T}:unack    zset  id scored by its ack deadline
              and the mover: this file run as a script (`peer_systems.py
              mover ...`), a process that every --tick-ms (5) runs one Lua
              script moving due ids waiting -> ready and expired ids unack
              -> ready and publishing a wake-up on dq:{T}:wake. Send: HSET +
              ZADD per message, pipelined (or RPUSH for a message already
              due, as camellia does), or one Lua call per batch (HSETNX, so
              a re-sent id is ignored). Pull: a Lua call LPOPs up to n ids,
              ZADDs them to unack and HGETs their payloads; an empty pull
              waits for the wake-up (camellia's long poll). Ack: ZREM unack
              + HDEL msgs in one round trip. Clients are redis-py's asyncio
              client (with hiredis when installed). The AOF's fsync policy
              is the system's: `appendfsync always` (the answer comes after
              the fsync) or `everysec` (at most a second of answered writes
              lost to a crash of the machine).
  beanstalkd  `beanstalkd -b DIR [-f MS]` (a binlog); `-f 0` fsyncs every
              write before the answer, no -f is beanstalkd's own default
              (fsync at most every 50 ms, as `beanstalkd -h` of 1.12 says);
              its text protocol written and parsed here over an asyncio
              socket: `put` (the delay in whole seconds, rounded up so that
              nothing is early), `reserve-with-timeout` (one job per
              reserve, so a pull of n sends one blocking reserve and then
              n-1 `reserve-with-timeout 0` pipelined), `delete`.

Every message carries a payload of --payload-bytes that starts with
"<index>|<trigger_ms>|<effective_ms>|": the consumer learns from it which
message it got and when it was due, on every system alike. effective_ms
is the deadline the system was actually given (beanstalkd's whole seconds);
it equals trigger_ms on the other two.

A "request" is one round trip a client makes: an HTTP request; a Redis
pipeline or script call; a beanstalkd command or pipelined run of commands.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import zlib
from dataclasses import dataclass

from harness import HOST, ROOT, Process, children, disk_bytes, free_port, request, tree_memory_mb, wait_until

from broker.http.paths import PREFIX

try:
    import orjson

    json_loads, json_dumps = orjson.loads, orjson.dumps
except ImportError:  # the standard library does the same, slower
    json_loads = json.loads

    def json_dumps(obj) -> bytes:
        return json.dumps(obj, separators=(",", ":")).encode()

TOPIC = "bench"
# A topic never sent to: a pull on it is how a restart is seen to serve pulls.
PROBE_TOPIC = "probe"
FORM = b"application/x-www-form-urlencoded"
JSON = b"application/json"


class PeerError(Exception):
    """A system answered a request with an error (or not at all): the
    request and the answer, for the report's evidence."""

    def __init__(self, request: str, answer: str) -> None:
        super().__init__(f"{request} -> {answer}")
        self.request, self.answer = request, answer


def _client_errors() -> tuple[type[BaseException], ...]:
    errors: tuple[type[BaseException], ...] = (PeerError, OSError, asyncio.IncompleteReadError)
    try:
        import redis
    except ImportError:
        return errors
    return (*errors, redis.RedisError)


# What a request of a client can fail with (a consumer records it and goes on).
CLIENT_ERRORS = _client_errors()


@dataclass(frozen=True)
class Counts:
    """A system's own count of a topic's messages, by state."""
    waiting: int
    ready: int
    consuming: int

    @property
    def total(self) -> int:
        return self.waiting + self.ready + self.consuming


def now_ms() -> int:
    return int(time.time() * 1000)


# --- payloads -------------------------------------------------------------------


def encode_payload(index: int, trigger_ms: int, effective_ms: int, size_bytes: int) -> bytes:
    head = b"%d|%d|%d|" % (index, trigger_ms, effective_ms)
    return head + b"x" * (size_bytes - len(head)) if len(head) < size_bytes else head


def decode_payload(payload: bytes | str) -> tuple[int, int, int]:
    """(index, trigger_ms, effective_ms) of a payload made by encode_payload."""
    if isinstance(payload, str):
        payload = payload.encode()
    index, trigger, effective, _ = payload.split(b"|", 3)
    return int(index), int(trigger), int(effective)


# --- processes this benchmark starts ----------------------------------------------


# --- the systems, as the parent sees them ------------------------------------------


class System:
    """A server under test: start it on a fresh data dir, ask it for its
    counts, kill and restart it on the same data, stop it. Its clients are
    made in child processes from `client_config()` (plain data)."""

    name = "?"
    # What a 200 / OK answer to a write means, for the report.
    durability = "?"
    # Whether a killed server comes back with what it had (no: nothing on disk).
    restartable = True
    # Exit codes of a clean stop on SIGTERM (beanstalkd does not catch it).
    clean_exits: tuple[int, ...] = (0,)

    def __init__(self, work_dir: str) -> None:
        self.work_dir = work_dir
        self.port = 0
        self.data_dir = ""
        self.server: Process | None = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name}, port={self.port}, server={self.server})"

    def start(self, data_dir: str, limit_s: float = 60) -> None:
        self.data_dir = data_dir
        os.makedirs(data_dir, 0o700, exist_ok=True)  # hourglass refuses one group or others may reach
        self.port = free_port()
        self._spawn()
        try:
            wait_until(self.serves_pulls, limit_s, f"{self.name} start", self.server)
        except BaseException:  # not serving: stopped by its PID all the same, not left running
            self.stop()
            raise
        self._started()

    def stop(self) -> dict:
        """Stop every process (SIGTERM, by PID); `server_exit` if the
        server did not exit cleanly (None: killed after 15 s)."""
        out: dict = {}
        if self.server is not None:
            code = self.server.stop()
            if code not in self.clean_exits:
                out["server_exit"] = code
            self.server = None
        return out

    def kill_and_restart(self, expected: int, limit_s: float) -> dict:
        """SIGKILL the server, start it on the same data dir and port, and
        time it until a pull answers and the counts are whole again."""
        self._before_kill()
        self.server.kill()
        started = time.monotonic()
        self._spawn()
        first_pull_s = None
        counts: Counts | None = None
        deadline = started + limit_s
        while True:
            with contextlib.suppress(Exception):  # not up yet, in whatever way
                if first_pull_s is None and self.serves_pulls():
                    first_pull_s = time.monotonic() - started
                if first_pull_s is not None and self.serves_pulls():
                    counts = self.counts()
            if counts is not None and counts.total == expected:
                break
            if not self.server.alive():
                raise RuntimeError(f"{self.name} exited while restarting: {self.server.log_tail()}")
            if time.monotonic() > deadline:
                break
            time.sleep(0.005)
        restart_s = time.monotonic() - started
        self._started()
        return {"restart_s": round(restart_s, 3) if counts and counts.total == expected else None,
                "restart_first_pull_s": None if first_pull_s is None else round(first_pull_s, 3),
                "recovered_ok": bool(counts and counts.total == expected),
                "counts_after_restart": None if counts is None else counts.__dict__}

    def pids(self) -> dict[str, int]:
        """The processes whose CPU and memory count as the server's, by role."""
        return {"server": self.server.pid}

    def memory(self) -> dict:
        """VmRSS (MB) of each process of pids() with those it started (a
        node's shards) summed, as `<role>_rss_mb`."""
        return {f"{role}_rss_mb": tree_memory_mb(pid)["rss_mb"] for role, pid in self.pids().items()}

    def parts(self) -> dict[str, int]:
        """Processes within the server whose CPU is also told alone (a node's shards)."""
        return {f"shard{i}": pid for i, pid in enumerate(children(self.server.pid))} if self.server else {}

    def disk_bytes(self) -> int:
        return disk_bytes(self.data_dir)

    def settle(self) -> None:
        """Wait until what was answered is as durable as this system makes
        it (before a SIGKILL)."""

    def supports_batch_ack(self) -> bool:
        return True

    # -- each system's own ------------------------------------------------------------

    def _spawn(self) -> None:
        raise NotImplementedError

    def _started(self) -> None:
        """After the server answers (again): start helper processes."""

    def _before_kill(self) -> None:
        """Before the server is killed: stop helper processes."""

    def serves_pulls(self) -> bool:
        """A pull on a topic never sent to answers (empty)."""
        raise NotImplementedError

    def counts(self) -> Counts:
        raise NotImplementedError

    def describe(self) -> dict:
        raise NotImplementedError

    def client_config(self) -> dict:
        raise NotImplementedError


class HourglassSystem(System):
    name = "hourglass"
    durability = "fsync'ed before the answer (--fsync batch: group commit)"

    def __init__(self, work_dir: str, extra_args: list[str], keys: int = 0, python: str | None = None,
                 name: str = "hourglass") -> None:
        super().__init__(work_dir)
        self.name = name  # hourglass_1: the same with --shards 1 (one process)
        self.extra_args = extra_args
        self.keys = keys  # > 0: messages carry serial keys k0..k{keys-1} (SPEC `key`)
        # None: this source tree's broker, run by this interpreter; else an
        # interpreter whose installed hourglass runs (from outside the tree:
        # the build the README's set-up installs, compiled where it can be)
        self.python = python

    def _command(self, *args: str) -> tuple[list[str], str]:
        """(command line, working directory) of `hourglass <args>`."""
        if self.python is None:
            return [sys.executable, "-m", "broker.cli", *args], ROOT
        return [self.python, "-m", "broker.cli", *args], self.work_dir

    def _spawn(self) -> None:
        command, cwd = self._command("serve", "--data-dir", self.data_dir, "--host", HOST, "--port", str(self.port),
                                     "--fsync", "batch", *self.extra_args)
        self.server = Process(command, self.data_dir + ".log", cwd=cwd)

    def _call(self, method: str, path: str, params: dict) -> tuple[int, dict]:
        """(code, answer) of one request. The code is the JSON body's
        `code`, whatever the HTTP status (camellia answers HTTP 200 with
        the outcome in the body; older hourglass used status = code)."""
        query = urllib.parse.urlencode(params)
        url = f"http://{HOST}:{self.port}{PREFIX}{path}"
        if method == "GET":
            status, body = request(url + "?" + query, timeout=10)
        else:
            status, body = request(url, data=query.encode(), headers={"Content-Type": FORM.decode()}, timeout=10)
        try:
            decoded = json_loads(body)
        except ValueError:
            return status, {"body": body[:500].decode("utf-8", "replace")}
        return (decoded.get("code", status) if isinstance(decoded, dict) else status), decoded

    def serves_pulls(self) -> bool:
        code, _ = self._call("POST", "pullMsg", {"topic": PROBE_TOPIC, "batch": 1})
        return code == 200

    def counts(self) -> Counts:
        code, answer = self._call("GET", "getTopicInfo", {"topic": TOPIC})
        if code == 404:
            return Counts(0, 0, 0)
        if code != 200:
            raise PeerError(f"GET getTopicInfo?topic={TOPIC}", json.dumps(answer)[:500])
        data = answer["data"]
        return Counts(data["waitingQueueSize"], data["readyQueueSize"], data["ackQueueSize"])

    def supports_batch_ack(self) -> bool:
        """Whether ackMsg takes msgIds: two due messages on a topic of
        their own, pulled, acked in one request, and then not consuming."""
        topic = "ackprobe"
        for msg_id in ("a1", "a2"):
            self._call("POST", "sendMsg", {"topic": topic, "msgId": msg_id, "msg": "probe", "delayMillis": 0})
        code, answer = self._call("POST", "pullMsg", {"topic": topic, "batch": 2, "ackTimeoutMillis": 600_000})
        if code != 200 or len(answer.get("delayMsgList") or ()) != 2:
            return False
        code, _ = self._call("POST", "ackMsg", {"topic": topic, "msgIds": "a1,a2"})
        if code != 200:
            return False
        code, info = self._call("GET", "getTopicInfo", {"topic": topic})
        return code == 200 and info["data"]["ackQueueSize"] == 0 and info["data"]["readyQueueSize"] == 0

    def describe(self) -> dict:
        command, cwd = self._command("--version")
        version = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=60).stdout.strip()
        return {"command": " ".join(["python -m broker.cli serve --fsync batch", *self.extra_args]),
                "python": self.python or "source tree", "version": version, "durability": self.durability}

    def client_config(self) -> dict:
        return {"system": "hourglass", "port": self.port, "keys": self.keys}


class RedisSystem(System):
    """redis-server and the mover process (see the module docstring)."""

    durability = "written to the AOF before the answer, fsync'ed every second (appendfsync everysec)"

    def __init__(self, work_dir: str, binary: str, appendfsync: str, tick_ms: float, move_limit: int,
                 send: str = "pipeline", name: str = "redis") -> None:
        super().__init__(work_dir)
        self.binary, self.appendfsync, self.tick_ms, self.move_limit, self.send = (
            binary, appendfsync, tick_ms, move_limit, send)
        self.name = name
        if appendfsync == "off":
            self.durability = "none: no AOF, no RDB (a restart comes back empty)"
            self.restartable = False
        elif appendfsync == "always":
            self.durability = "AOF fsync'ed before the answer (appendfsync always)"
        self.mover: Process | None = None
        self.mover_stats_path = ""
        self.mover_stats: list[dict] = []

    def _persistence(self) -> list[str]:
        if self.appendfsync == "off":
            return ["--appendonly", "no"]
        return ["--appendonly", "yes", "--appendfsync", self.appendfsync]

    def _spawn(self) -> None:
        self.server = Process([self.binary, "--port", str(self.port), "--bind", HOST, "--save", "",
                               *self._persistence(), "--dir", self.data_dir], self.data_dir + ".log")

    def _started(self) -> None:
        self.mover_stats_path = f"{self.data_dir}.mover-{len(self.mover_stats)}.json"
        self.mover = Process([sys.executable, os.path.abspath(__file__), "mover", str(self.port), TOPIC,
                              str(self.tick_ms), str(self.move_limit), self.mover_stats_path],
                             self.data_dir + ".mover.log")

    def _stop_mover(self) -> None:
        if self.mover is None:
            return
        self.mover.stop()
        with contextlib.suppress(OSError, ValueError), open(self.mover_stats_path) as f:
            self.mover_stats.append(json.load(f))
        self.mover = None

    def _before_kill(self) -> None:
        self._stop_mover()

    def stop(self) -> dict:
        self._stop_mover()
        out = super().stop()
        if self.mover_stats:
            out["mover"] = {"ticks": sum(s["ticks"] for s in self.mover_stats),
                            "moved": sum(s["moved"] for s in self.mover_stats),
                            "requeued": sum(s["requeued"] for s in self.mover_stats),
                            "max_tick_gap_ms": max(s["max_tick_gap_ms"] for s in self.mover_stats)}
        self.mover_stats = []
        return out

    def pids(self) -> dict[str, int]:
        out = super().pids()
        if self.mover is not None:
            out["mover"] = self.mover.pid
        return out

    def _client(self):
        import redis
        return redis.Redis(host=HOST, port=self.port, socket_timeout=10)

    def serves_pulls(self) -> bool:
        with contextlib.closing(self._client()) as r:
            keys = redis_keys(PROBE_TOPIC)
            r.eval(POP_SCRIPT, 3, keys.ready, keys.unack, keys.msgs, 1, now_ms() + 60_000)
        return True

    def counts(self) -> Counts:
        keys = redis_keys(TOPIC)
        with contextlib.closing(self._client()) as r:
            waiting, ready, consuming = r.pipeline(transaction=False).zcard(keys.waiting).llen(keys.ready).zcard(
                keys.unack).execute()
        return Counts(waiting, ready, consuming)

    def memory(self) -> dict:
        out = super().memory()
        with contextlib.closing(self._client()) as r:
            out["redis_used_memory_mb"] = round(r.info("memory")["used_memory"] / 2**20, 1)
        return out

    def settle(self) -> None:
        """No AOF rewrite running, then one appendfsync period (none with
        `always`: every answered write is on disk already)."""
        if self.appendfsync == "off":
            return
        with contextlib.closing(self._client()) as r:
            wait_until(lambda: not (r.info("persistence")["aof_rewrite_in_progress"]
                                    or r.info("persistence")["aof_rewrite_scheduled"]), 300, "AOF rewrite",
                       every_s=0.1)
        if self.appendfsync == "everysec":
            time.sleep(1.2)

    def describe(self) -> dict:
        with contextlib.closing(self._client()) as r:
            version = r.info("server")["redis_version"]
        try:
            from redis.utils import HIREDIS_AVAILABLE
        except ImportError:
            HIREDIS_AVAILABLE = False
        return {"version": version, "binary": self.binary, "args": ["--save", "", *self._persistence()],
                "durability": self.durability, "mover_tick_ms": self.tick_ms, "move_limit": self.move_limit,
                "send": "pipelined HSET+ZADD per message" if self.send == "pipeline" else "one Lua call per batch",
                "client": "redis-py asyncio, " + ("hiredis parser" if HIREDIS_AVAILABLE else "pure-Python parser")}

    def client_config(self) -> dict:
        return {"system": "redis", "port": self.port, "send": self.send}


# beanstalkd's fsync period when no -f is given (`beanstalkd -h` of 1.12).
BEANSTALKD_DEFAULT_FSYNC_MS = 50


class BeanstalkdSystem(System):
    """beanstalkd with its binlog in the data dir. `fsync_ms`: its -f (0:
    fsync every write before the answer); None gives no -f, beanstalkd's
    own default."""

    clean_exits = (0, -signal.SIGTERM)

    def __init__(self, work_dir: str, binary: str, fsync_ms: int | None, name: str = "beanstalkd") -> None:
        super().__init__(work_dir)
        self.binary, self.fsync_ms, self.name = binary, fsync_ms, name
        self.fsync_args = [] if fsync_ms is None else ["-f", str(fsync_ms)]
        if fsync_ms == 0:
            self.durability = "binlog fsync'ed before the answer (-f 0)"
        elif fsync_ms is None:
            self.durability = (f"binlog written before the answer, fsync'ed at most every "
                               f"{BEANSTALKD_DEFAULT_FSYNC_MS} ms (beanstalkd's default, no -f)")
        else:
            self.durability = f"binlog written before the answer, fsync'ed at most every {fsync_ms} ms"

    def _spawn(self) -> None:
        self.server = Process([self.binary, "-l", HOST, "-p", str(self.port), "-b", self.data_dir,
                               *self.fsync_args], self.data_dir + ".log")

    def _command(self, line: bytes) -> tuple[bytes, bytes]:
        """One command on a fresh connection: (reply line, body if any)."""
        with socket.create_connection((HOST, self.port), timeout=10) as s:
            s.sendall(line + b"\r\n")
            f = s.makefile("rb")
            reply = f.readline().rstrip(b"\r\n")
            body = b""
            if reply.startswith((b"OK ", b"RESERVED ")):
                body = f.read(int(reply.split()[-1]) + 2)[:-2]
            return reply, body

    def _stats(self, command: bytes) -> dict[str, str]:
        reply, body = self._command(command)
        if reply == b"NOT_FOUND":
            return {}
        if not reply.startswith(b"OK "):
            raise PeerError(command.decode(), reply.decode("utf-8", "replace"))
        return dict(line.split(": ", 1) for line in body.decode().splitlines() if ": " in line)

    def serves_pulls(self) -> bool:
        with socket.create_connection((HOST, self.port), timeout=10) as s:
            s.sendall(b"watch %s\r\nreserve-with-timeout 0\r\n" % PROBE_TOPIC.encode())
            f = s.makefile("rb")
            return f.readline().startswith(b"WATCHING") and f.readline().startswith(b"TIMED_OUT")

    def counts(self) -> Counts:
        stats = self._stats(b"stats-tube " + TOPIC.encode())
        return Counts(int(stats.get("current-jobs-delayed", 0)), int(stats.get("current-jobs-ready", 0)),
                      int(stats.get("current-jobs-reserved", 0)))

    def settle(self) -> None:
        fsync_ms = BEANSTALKD_DEFAULT_FSYNC_MS if self.fsync_ms is None else self.fsync_ms
        time.sleep(fsync_ms / 1000 + 0.2)

    def describe(self) -> dict:
        return {"version": self._stats(b"stats").get("version", "").strip('"'), "binary": self.binary,
                "args": ["-b", "DIR", *self.fsync_args], "durability": self.durability,
                "client": "the text protocol over an asyncio socket (this file)"}

    def client_config(self) -> dict:
        return {"system": "beanstalkd", "port": self.port}


# --- clients (in producer and consumer processes) -----------------------------------


class Client:
    """What a producer or consumer process does with a system. `prepare`
    encodes a batch of (index, trigger_ms) into what `send` puts on the
    wire (so producers can encode before the clock starts); `pull` is a
    long poll answering [(handle, payload)]; acks go through `acker()`,
    which is this client itself when acks must use the pulling connection
    (`acks_inline`), else a client on connections of its own."""

    acks_inline = False

    def __init__(self, config: dict, payload_bytes: int = 100, ack_timeout_ms: int = 300_000) -> None:
        self.config, self.port = config, config["port"]
        self.payload_bytes, self.ack_timeout_ms = payload_bytes, ack_timeout_ms

    def effective_ms(self, trigger_ms: int, now: int) -> int:
        """The deadline the system is given for `trigger_ms`."""
        return trigger_ms

    def payloads(self, msgs: list[tuple[int, int]], now: int) -> list[tuple[int, int, bytes]]:
        """(index, trigger_ms, payload) of each message."""
        return [(index, trigger, encode_payload(index, trigger, self.effective_ms(trigger, now), self.payload_bytes))
                for index, trigger in msgs]

    async def connect(self) -> None:
        raise NotImplementedError

    def prepare(self, msgs: list[tuple[int, int]], now: int):
        raise NotImplementedError

    async def send(self, prepared) -> None:
        raise NotImplementedError

    async def pull(self, n: int, timeout_s: float) -> list[tuple[object, bytes | str]]:
        raise NotImplementedError

    async def acker(self) -> Client:
        raise NotImplementedError

    async def ack_one(self, handle) -> None:
        raise NotImplementedError

    async def ack_many(self, handles: list) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        pass


def make_client(config: dict, payload_bytes: int = 100, ack_timeout_ms: int = 300_000) -> Client:
    kind = {"hourglass": HourglassClient, "redis": RedisClient, "beanstalkd": BeanstalkClient}[config["system"]]
    return kind(config, payload_bytes, ack_timeout_ms)


class HttpConnection:
    """One HTTP/1.1 keep-alive connection: a request is written whole and
    its answer read by Content-Length (or chunks); reconnects when the
    server closes."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.head = b"Host: %s:%d\r\nContent-Type: " % (HOST.encode(), port)

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(HOST, self.port)

    async def request(self, method: bytes, path: bytes, body: bytes = b"", content_type: bytes = FORM) -> tuple[int, bytes]:
        """(status, body). A kept-alive connection the server closed while
        idle fails before any answer: then once more on a new one (every
        request here is idempotent: sends carry their msgId)."""
        reused = self.writer is not None
        for attempt in (1, 2):
            if self.writer is None:
                await self.open()
            self.writer.write(b"%s %s HTTP/1.1\r\n%s%s\r\nContent-Length: %d\r\n\r\n%s" % (
                method, path, self.head, content_type, len(body), body))
            try:
                return await self._answer()
            except (asyncio.IncompleteReadError, ConnectionError) as e:
                await self.close()
                if not reused or attempt == 2 or (isinstance(e, asyncio.IncompleteReadError) and e.partial):
                    raise
        raise AssertionError("unreachable")

    async def _answer(self) -> tuple[int, bytes]:
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length, chunked, close = None, False, False
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            elif name == b"connection":
                close = value.strip().lower() == b"close"
        if chunked:
            parts = []
            while size := int((await self.reader.readline()).split(b";")[0], 16):
                parts.append(await self.reader.readexactly(size))
                await self.reader.readexactly(2)
            await self.reader.readuntil(b"\r\n")
            body = b"".join(parts)
        elif length is not None:
            body = await self.reader.readexactly(length)
        else:
            body = await self.reader.read()
            close = True
        if close:
            await self.close()
        return status, body

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(Exception):
                await self.writer.wait_closed()
        self.reader = self.writer = None


class HourglassClient(Client):
    """hourglass's lightest client: one kept-alive connection for pulls,
    and on a node of many shards one to each shard's own port (its
    getShardMap), where each send and ack goes to the message's shard
    (docs/api.md, "Shards": CRC-32 of the msgId), a batch split by shard."""

    def __init__(self, *a) -> None:
        super().__init__(*a)
        self.http = HttpConnection(self.port)
        self.shards: list[HttpConnection] = []
        self.pull_bodies: dict[tuple[int, int], bytes] = {}
        self.topic_q = urllib.parse.quote(TOPIC).encode()

    async def connect(self) -> None:
        await self.http.open()
        status, body = await self.http.request(b"GET", PREFIX.encode() + b"getShardMap")
        if status == 200:
            ports = json_loads(body).get("ports") or []
            if len(ports) > 1:
                self.shards = [HttpConnection(p) for p in ports]

    def owner(self, msg_id: str) -> HttpConnection:
        if not self.shards:
            return self.http
        return self.shards[zlib.crc32(msg_id.encode()) % len(self.shards)]

    async def _call(self, path: bytes, body: bytes, content_type: bytes = FORM) -> dict:
        return await self._call_on(self.http, path, body, content_type)

    async def _call_on(self, http: HttpConnection, path: bytes, body: bytes, content_type: bytes = FORM) -> dict:
        """The decoded answer; PeerError unless HTTP 200 with code 200."""
        status, answer = await http.request(b"POST", PREFIX.encode() + path, body, content_type)
        try:
            decoded = json_loads(answer)
            code = decoded.get("code")
        except (ValueError, AttributeError):
            decoded, code = None, None
        if status != 200 or code != 200:
            raise PeerError(f"POST {path.decode()} {body[:200]!r}",
                            f"HTTP {status} {answer[:500].decode('utf-8', 'replace')}")
        return decoded

    def prepare(self, msgs: list[tuple[int, int]], now: int) -> list[tuple[HttpConnection, bytes, bytes, bytes]]:
        """sendMsg (a form) for one message, sendMsgBatch (JSON) for more,
        each to the message's shard (a batch: a part for each shard).
        A message already due goes with delayMillis=0, the others with
        their absolute triggerTime (an extension, docs/api.md)."""
        items = self.payloads(msgs, now)
        keys = self.config.get("keys") or 0
        if len(items) == 1:
            index, trigger, payload = items[0]
            when = b"delayMillis=0" if trigger <= now else b"triggerTime=%d" % trigger
            key = b"&key=k%d" % (index % keys) if keys else b""
            return [(self.owner(f"k{index % keys}" if keys else str(index)), b"sendMsg",
                     b"topic=%s&msgId=%d&msg=%s&%s%s" % (
                         self.topic_q, index, urllib.parse.quote_from_bytes(payload).encode(), when, key), FORM)]
        parts: dict[int, tuple[HttpConnection, list]] = {}
        for index, trigger, payload in items:
            http = self.owner(f"k{index % keys}" if keys else str(index))
            parts.setdefault(id(http), (http, []))[1].append(
                {"msgId": str(index), "msg": payload.decode(), "triggerTime": trigger,
                 **({"key": f"k{index % keys}"} if keys else {})})
        return [(http, b"sendMsgBatch", json_dumps({"topic": TOPIC, "msgs": part}), JSON)
                for http, part in parts.values()]

    async def send(self, prepared) -> None:
        await asyncio.gather(*(self._call_on(http, path, body, ctype) for http, path, body, ctype in prepared))

    async def pull(self, n: int, timeout_s: float) -> list[tuple[object, bytes | str]]:
        body = self.pull_bodies.get((n, int(timeout_s * 1000)))
        if body is None:
            body = self.pull_bodies[(n, int(timeout_s * 1000))] = b"topic=%s&batch=%d&ackTimeoutMillis=%d&longPollingTimeoutMillis=%d" % (
                self.topic_q, n, self.ack_timeout_ms, int(timeout_s * 1000))
        answer = await self._call(b"longPollingMsg", body)
        return [(m["msgId"], m["msg"]) for m in answer.get("delayMsgList") or ()]

    async def acker(self) -> Client:
        other = HourglassClient(self.config, self.payload_bytes, self.ack_timeout_ms)
        await other.connect()
        return other

    async def ack_one(self, handle) -> None:
        await self._call_on(self.owner(handle), b"ackMsg",
                            b"topic=%s&msgId=%s" % (self.topic_q, urllib.parse.quote(handle).encode()))

    async def ack_many(self, handles: list) -> None:
        """ackMsg with msgIds (an extension, docs/api.md): one request for
        many (a node of many shards: one for each shard's).
        A server without it answers an error (no msgId): PeerError."""
        parts: dict[int, tuple[HttpConnection, list]] = {}
        for handle in handles:
            http = self.owner(handle)
            parts.setdefault(id(http), (http, []))[1].append(handle)
        answers = await asyncio.gather(*(self._call_on(http, b"ackMsg", b"topic=%s&msgIds=%s" % (
            self.topic_q, urllib.parse.quote(",".join(part)).encode())) for http, part in parts.values()))
        # Per-id results, where the server gives them: each must be a success.
        for answer in answers:
            for result in _per_id_results(answer):
                if isinstance(result, dict) and result.get("code", 200) != 200:
                    raise PeerError("POST ackMsg msgIds", json.dumps(result)[:500])

    async def close(self) -> None:
        await self.http.close()
        for http in self.shards:
            await http.close()


def _per_id_results(answer: dict) -> list:
    for key in ("results", "data", "ackResults"):
        value = answer.get(key)
        if isinstance(value, list):
            return value
    return []


@dataclass(frozen=True)
class RedisKeys:
    msgs: str
    waiting: str
    ready: str
    unack: str
    wake: str


def redis_keys(topic: str) -> RedisKeys:
    # {topic} is a hash tag: every key of a topic on one Redis Cluster slot.
    base = f"dq:{{{topic}}}:"
    return RedisKeys(base + "msgs", base + "waiting", base + "ready", base + "unack", base + "wake")


# KEYS: msgs waiting ready; ARGV: now_ms, wake channel, then id trigger payload per message.
SEND_SCRIPT = """
local now = tonumber(ARGV[1])
local due = 0
for i = 3, #ARGV, 3 do
  if redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[i + 2]) == 1 then
    local trigger = tonumber(ARGV[i + 1])
    if trigger <= now then
      redis.call('RPUSH', KEYS[3], ARGV[i])
      due = due + 1
    else
      redis.call('ZADD', KEYS[2], trigger, ARGV[i])
    end
  end
end
if due > 0 then redis.call('PUBLISH', ARGV[2], '1') end
return due
"""

# KEYS: ready unack msgs; ARGV: n, ack deadline ms. Returns id, payload, id, payload...
POP_SCRIPT = """
local out = {}
for _ = 1, tonumber(ARGV[1]) do
  local id = redis.call('LPOP', KEYS[1])
  if not id then break end
  local payload = redis.call('HGET', KEYS[3], id)
  if payload then
    redis.call('ZADD', KEYS[2], ARGV[2], id)
    out[#out + 1] = id
    out[#out + 1] = payload
  end
end
return out
"""

# KEYS: waiting ready unack; ARGV: now_ms, limit, wake channel. Returns {moved, requeued}.
MOVE_SCRIPT = """
local function move(from, to)
  local ids = redis.call('ZRANGEBYSCORE', from, '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
  if #ids > 0 then
    redis.call('ZREM', from, unpack(ids))
    redis.call('RPUSH', to, unpack(ids))
  end
  return #ids
end
local moved = move(KEYS[1], KEYS[2])
local requeued = move(KEYS[3], KEYS[2])
if moved + requeued > 0 then redis.call('PUBLISH', ARGV[3], '1') end
return {moved, requeued}
"""


class RedisClient(Client):
    def __init__(self, *a) -> None:
        super().__init__(*a)
        self.keys = redis_keys(TOPIC)
        self.mode = self.config.get("send", "pipeline")
        self.redis = None
        self.pubsub = None

    async def connect(self) -> None:
        import redis.asyncio
        self.redis = redis.asyncio.Redis(host=HOST, port=self.port, socket_timeout=60)
        self.send_script = self.redis.register_script(SEND_SCRIPT)
        self.pop_script = self.redis.register_script(POP_SCRIPT)
        await self.redis.ping()

    def prepare(self, msgs: list[tuple[int, int]], now: int):
        items = [(str(index), trigger, payload) for index, trigger, payload in self.payloads(msgs, now)]
        if self.mode == "lua":
            return [x for item in items for x in item]
        return items

    async def send(self, prepared) -> None:
        now = now_ms()
        k = self.keys
        if self.mode == "lua":
            await self.send_script(keys=[k.msgs, k.waiting, k.ready], args=[now, k.wake, *prepared])
            return
        pipe = self.redis.pipeline(transaction=False)
        due = False
        for msg_id, trigger, payload in prepared:
            pipe.hset(k.msgs, msg_id, payload)
            if trigger <= now:  # camellia: a message already due goes straight to ready
                pipe.rpush(k.ready, msg_id)
                due = True
            else:
                pipe.zadd(k.waiting, {msg_id: trigger})
        if due:
            pipe.publish(k.wake, 1)
        await pipe.execute()

    async def _pop(self, n: int) -> list[tuple[object, bytes]]:
        flat = await self.pop_script(keys=[self.keys.ready, self.keys.unack, self.keys.msgs],
                                     args=[n, now_ms() + self.ack_timeout_ms])
        return list(zip(flat[::2], flat[1::2], strict=True))

    async def pull(self, n: int, timeout_s: float) -> list[tuple[object, bytes]]:
        """Pop; if nothing is ready, wait for the mover's (or a sender's)
        wake-up and pop again, until `timeout_s`. Subscribed before the
        first pop, so a wake-up published after it is never missed."""
        if self.pubsub is None:
            self.pubsub = self.redis.pubsub()
            await self.pubsub.subscribe(self.keys.wake)
            await self.pubsub.get_message(timeout=1.0)  # the subscribe confirmation
        deadline = time.monotonic() + timeout_s
        while True:
            while await self.pubsub.get_message(ignore_subscribe_messages=True, timeout=0.0):
                pass  # wake-ups from before this pop: it sees what they announced
            items = await self._pop(n)
            remaining = deadline - time.monotonic()
            if items or remaining <= 0:
                return items
            await self.pubsub.get_message(ignore_subscribe_messages=True, timeout=remaining)

    async def acker(self) -> Client:
        return self  # redis-py's pool gives concurrent calls connections of their own

    async def ack_one(self, handle) -> None:
        await self.redis.pipeline(transaction=False).zrem(self.keys.unack, handle).hdel(self.keys.msgs, handle).execute()

    async def ack_many(self, handles: list) -> None:
        await self.redis.pipeline(transaction=False).zrem(self.keys.unack, *handles).hdel(
            self.keys.msgs, *handles).execute()

    async def close(self) -> None:
        if self.pubsub is not None:
            await self.pubsub.aclose()
        if self.redis is not None:
            await self.redis.aclose()


class BeanstalkClient(Client):
    """beanstalkd's protocol: a reserved job can only be deleted on the
    connection that reserved it, so acks go inline on the pulling one."""

    acks_inline = True
    PRIORITY = 1024

    def __init__(self, *a) -> None:
        super().__init__(*a)
        self.ttr_s = max(1, self.ack_timeout_ms // 1000)

    def effective_ms(self, trigger_ms: int, now: int) -> int:
        delay_s = self.delay_s(trigger_ms, now)
        return trigger_ms if delay_s == 0 else now + delay_s * 1000

    @staticmethod
    def delay_s(trigger_ms: int, now: int) -> int:
        """Whole seconds, rounded up: never before the trigger."""
        return max(0, math.ceil((trigger_ms - now) / 1000))

    async def connect(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(HOST, self.port)
        t = TOPIC.encode()
        self.writer.write(b"use %s\r\nwatch %s\r\nignore default\r\n" % (t, t))
        for expected in (b"USING", b"WATCHING", b"WATCHING"):
            await self._reply(expected, b"use/watch")

    async def _reply(self, expected: bytes, request: bytes) -> bytes:
        line = await self.reader.readline()
        if not line.startswith(expected):
            raise PeerError(request[:200].decode("utf-8", "replace"), line.decode("utf-8", "replace") or "closed")
        return line

    def prepare(self, msgs: list[tuple[int, int]], now: int) -> tuple[bytes, int]:
        puts = [b"put %d %d %d %d\r\n%s\r\n" % (self.PRIORITY, self.delay_s(trigger, now), self.ttr_s, len(payload), payload)
                for _, trigger, payload in self.payloads(msgs, now)]
        return b"".join(puts), len(puts)

    async def send(self, prepared) -> None:
        data, count = prepared
        self.writer.write(data)
        for _ in range(count):
            await self._reply(b"INSERTED", data)

    async def _reserve_reply(self) -> tuple[bytes, bytes] | None:
        line = await self.reader.readline()
        if line.startswith(b"RESERVED"):
            _, job_id, size = line.split()
            return job_id, (await self.reader.readexactly(int(size) + 2))[:-2]
        if line.startswith((b"TIMED_OUT", b"DEADLINE_SOON")):
            return None
        raise PeerError("reserve-with-timeout", line.decode("utf-8", "replace") or "closed")

    async def pull(self, n: int, timeout_s: float) -> list[tuple[object, bytes]]:
        """One blocking reserve; once it has a job, n-1 non-blocking ones
        pipelined (beanstalkd reserves one job per command)."""
        self.writer.write(b"reserve-with-timeout %d\r\n" % math.ceil(timeout_s))
        first = await self._reserve_reply()
        if first is None:
            return []
        items = [first]
        if n > 1:
            self.writer.write(b"reserve-with-timeout 0\r\n" * (n - 1))
            for _ in range(n - 1):
                item = await self._reserve_reply()
                if item is not None:
                    items.append(item)
        return items

    async def acker(self) -> Client:
        return self

    async def ack_one(self, handle) -> None:
        self.writer.write(b"delete %s\r\n" % handle)
        await self._reply(b"DELETED", b"delete")

    async def ack_many(self, handles: list) -> None:
        self.writer.write(b"".join(b"delete %s\r\n" % h for h in handles))
        for _ in handles:
            await self._reply(b"DELETED", b"delete")

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(Exception):
            await self.writer.wait_closed()


# --- the Redis mover (a process of its own) ------------------------------------------


def run_mover(port: int, topic: str, tick_ms: float, limit: int, stats_path: str) -> None:
    """Every `tick_ms` run MOVE_SCRIPT with now; again at once while a
    call hits `limit`. On SIGTERM, write its statistics to `stats_path`."""
    import redis
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    keys = redis_keys(topic)
    client = redis.Redis(host=HOST, port=port, socket_timeout=10)
    script = client.register_script(MOVE_SCRIPT)
    stats = {"ticks": 0, "moved": 0, "requeued": 0, "max_tick_gap_ms": 0.0, "errors": 0}
    tick_s = tick_ms / 1000
    next_tick = last = time.monotonic()
    while not stopping:
        try:
            moved, requeued = script(keys=[keys.waiting, keys.ready, keys.unack], args=[now_ms(), limit, keys.wake])
        except redis.RedisError:  # loading after a restart, or gone
            stats["errors"] += 1
            time.sleep(0.01)
            continue
        now = time.monotonic()
        stats["ticks"] += 1
        stats["moved"] += moved
        stats["requeued"] += requeued
        stats["max_tick_gap_ms"] = max(stats["max_tick_gap_ms"], round((now - last) * 1000, 2))
        last = now
        if moved >= limit or requeued >= limit:
            continue
        next_tick = max(next_tick + tick_s, now)
        time.sleep(max(0.0, next_tick - time.monotonic()))
    with open(stats_path, "w") as f:
        json.dump(stats, f)


if __name__ == "__main__":
    if len(sys.argv) == 7 and sys.argv[1] == "mover":
        run_mover(int(sys.argv[2]), sys.argv[3], float(sys.argv[4]), int(sys.argv[5]), sys.argv[6])
    else:
        sys.exit("usage: peer_systems.py mover PORT TOPIC TICK_MS LIMIT STATS_PATH (bench/peers.py starts it)")
