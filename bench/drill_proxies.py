"""Small TCP proxies between a cluster's nodes, so a drill can cut, slow
or black-hole their peer traffic without a firewall.

Each node of a drill's cluster is started with `--reach-peers`
(docs/configuration.md): node a dials peer b's HTTP and Raft ports at two
proxies of its own, (a -> b), which forward to b's real ports. Six ordered
pairs, two ports each: twelve proxies for three nodes. Clients still reach
every node directly, so a client can talk to an isolated leader (which
must then answer no write: it has no quorum).

    mesh = ProxyMesh({"n1": (8001, 9001), "n2": (8002, 9002), "n3": (8003, 9003)})
    mesh.start()                      # a thread with its own event loop
    mesh.reach_flag("n1")             # "n2=127.0.0.1:P:Q,n3=127.0.0.1:R:S" for n1's --reach-peers
    mesh.isolate("n1", Mode.BLACKHOLE)
    mesh.heal()
    mesh.stop()

Modes, each as a real network might fail:

    PASS       bytes flow both ways
    DELAY      each chunk is held `delay_ms` before it is forwarded (in order)
    BLACKHOLE  bytes are held, not forwarded, until the mode changes (TCP
               retransmitting into a dead link); a new connection is
               accepted and held, then closed at the heal
    DROP       every connection is reset and new ones are closed at once
               (a peer that refuses: "connection refused")

Nothing is ever discarded from the middle of a stream: TCP delivers all
or closes, and a proxy that dropped bytes would corrupt frames no real
network can corrupt.

Processes: the proxies run on an event loop in a process of their own
(`ProxyMesh`; `LocalMesh` is the same in a thread of the caller's), so
neither the drill's workload nor its checker holds up the cluster's
heartbeats; `isolate`, `heal` and `stop` may be called from any thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import os
import subprocess
import sys
import threading
from collections.abc import Coroutine
from typing import Any

HOST = "127.0.0.1"
CHUNK_BYTES = 64 * 1024


class Mode(enum.Enum):
    PASS = "pass"
    DELAY = "delay"
    BLACKHOLE = "blackhole"
    DROP = "drop"


class Proxy:
    """One listening port forwarding to `target`; its mode applies to every
    connection through it. Runs on the mesh's loop only."""

    def __init__(self, name: str, target_port: int) -> None:
        self.name = name
        self.target_port = target_port
        self.port = 0  # set by start()
        self.mode = Mode.PASS
        self.delay_ms = 0
        self._changed = asyncio.Event()  # set (and replaced) at each mode change
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[Any]] = set()  # each connection's
        self._server: asyncio.Server | None = None

    def __repr__(self) -> str:
        return f"Proxy({self.name}, :{self.port} -> :{self.target_port}, {self.mode.value}, {len(self._writers)} open)"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, HOST, 0)
        self.port = self._server.sockets[0].getsockname()[1]

    def set_mode(self, mode: Mode, delay_ms: int = 0) -> None:
        self.mode, self.delay_ms = mode, delay_ms
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
        if mode is Mode.DROP:
            for writer in list(self._writers):
                writer.transport.abort()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        try:
            while self.mode is Mode.BLACKHOLE:  # held, unanswered, until the heal closes it
                await self._changed.wait()
                if self.mode is not Mode.BLACKHOLE:
                    return
            if self.mode is Mode.DROP:
                return
            try:
                up_reader, up_writer = await asyncio.open_connection(HOST, self.target_port)
            except OSError:
                return
            self._writers.add(up_writer)
            try:
                await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
            finally:
                self._writers.discard(up_writer)
                up_writer.transport.abort()
        finally:
            self._writers.discard(writer)
            writer.transport.abort()

    async def _pipe(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await source.read(CHUNK_BYTES):
                while self.mode is Mode.BLACKHOLE:
                    await self._changed.wait()
                if self.mode is Mode.DROP:
                    return
                if self.mode is Mode.DELAY and self.delay_ms:
                    await asyncio.sleep(self.delay_ms / 1000)
                sink.write(data)
                await sink.drain()
        sink.transport.abort()  # one side closed or failed: so does the other


def _unless_cancelled(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    if not isinstance(context.get("exception"), asyncio.CancelledError):
        loop.default_exception_handler(context)


class LocalMesh:
    """A proxy for each ordered pair of nodes and each of their two peer
    ports, on an event loop in a thread of this process. `ports`: node id
    -> (http_port, raft_port), the real ones. `ProxyMesh` runs one in a
    process of its own."""

    def __init__(self, ports: dict[str, tuple[int, int]]) -> None:
        self.ports = ports
        self.proxies: dict[tuple[str, str], tuple[Proxy, Proxy]] = {}  # (from, to) -> (http, raft)
        self._loop = asyncio.new_event_loop()
        self._loop.set_exception_handler(_unless_cancelled)  # (stop cancels the connections' tasks)
        self._thread = threading.Thread(target=self._loop.run_forever, name="drill-proxies", daemon=True)
        self.isolated: dict[str, Mode] = {}

    def __repr__(self) -> str:
        return f"LocalMesh({len(self.proxies)} pairs, isolated={ {n: m.value for n, m in self.isolated.items()} })"

    def _run(self, work: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(work, self._loop).result(30)

    def start(self) -> None:
        self._thread.start()

        async def build() -> None:
            for a in self.ports:
                for b, (http_port, raft_port) in self.ports.items():
                    if a != b:
                        pair = Proxy(f"{a}->{b} http", http_port), Proxy(f"{a}->{b} raft", raft_port)
                        for proxy in pair:
                            await proxy.start()
                        self.proxies[(a, b)] = pair
        self._run(build())

    def reach_flag(self, node: str) -> str:
        """The value of `node`'s --reach-peers: every peer at its proxy."""
        return ",".join(f"{b}={HOST}:{http.port}:{raft.port}" for (a, b), (http, raft) in self.proxies.items()
                        if a == node)

    def isolate(self, node: str, mode: Mode, delay_ms: int = 0) -> None:
        """Every link to and from `node` in `mode` (the others as they were)."""
        self.isolated[node] = mode
        self._set(lambda a, b: a == node or b == node, mode, delay_ms)

    def heal(self) -> None:
        self.isolated.clear()
        self._set(lambda a, b: True, Mode.PASS, 0)

    def _set(self, which: Any, mode: Mode, delay_ms: int) -> None:
        async def apply() -> None:
            for (a, b), pair in self.proxies.items():
                if which(a, b):
                    for proxy in pair:
                        proxy.set_mode(mode, delay_ms)
        self._run(apply())

    def stop(self) -> None:
        if not self._thread.is_alive():
            return

        async def close() -> None:
            for pair in self.proxies.values():
                for proxy in pair:
                    await proxy.close()
        with contextlib.suppress(Exception):
            self._run(close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self._loop.close()


class ProxyMesh:
    """`LocalMesh` in a process of its own (this module run as a script),
    driven over its stdin and stdout: a line of JSON a command, "ok" its
    answer. In the drill's own process the proxies' thread shared the GIL
    with the workload and the checker; a checker pass over a long history
    held it for long enough that the Raft heartbeats the proxies carry
    came later than the leader's lease, and leaders stood down every few
    seconds with no fault at all (docs/drills.md)."""

    def __init__(self, ports: dict[str, tuple[int, int]]) -> None:
        self.ports = ports
        self.isolated: dict[str, Mode] = {}
        self._proc: subprocess.Popen[str] | None = None
        self._reach: dict[str, str] = {}
        self._lock = threading.Lock()  # commands come from the nemesis's threads

    def __repr__(self) -> str:
        pid = None if self._proc is None else self._proc.pid
        return f"ProxyMesh(pid={pid}, isolated={ {n: m.value for n, m in self.isolated.items()} })"

    def start(self) -> None:
        self._proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), json.dumps(self.ports)],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the proxy process exited ({self._proc.wait()}) before it listened")
        self._reach = json.loads(line)

    def reach_flag(self, node: str) -> str:
        """The value of `node`'s --reach-peers: every peer at its proxy."""
        return self._reach[node]

    def isolate(self, node: str, mode: Mode, delay_ms: int = 0) -> None:
        """Every link to and from `node` in `mode` (the others as they were)."""
        self.isolated[node] = mode
        self._ask(["isolate", node, mode.value, delay_ms])

    def heal(self) -> None:
        self.isolated.clear()
        self._ask(["heal"])

    def _ask(self, command: list[Any]) -> None:
        proc = self._proc
        assert proc is not None and proc.stdin is not None and proc.stdout is not None
        with self._lock:
            proc.stdin.write(json.dumps(command) + "\n")
            proc.stdin.flush()
            answer = proc.stdout.readline().strip()
        if answer != "ok":
            raise RuntimeError(f"the proxy process answered {answer!r} to {command}")

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(OSError):
            assert proc.stdin is not None
            proc.stdin.close()  # end of commands: it closes its proxies and exits
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def _serve_commands(ports: dict[str, tuple[int, int]]) -> None:
    """The proxy process: listen, say where, carry out commands until stdin ends."""
    mesh = LocalMesh(ports)
    mesh.start()
    try:
        print(json.dumps({node: mesh.reach_flag(node) for node in ports}), flush=True)
        for line in sys.stdin:
            command = json.loads(line)
            if command[0] == "isolate":
                mesh.isolate(command[1], Mode(command[2]), int(command[3]))
            elif command[0] == "heal":
                mesh.heal()
            else:
                print(f"unknown command {command[0]!r}", flush=True)
                continue
            print("ok", flush=True)
    finally:
        mesh.stop()


if __name__ == "__main__":
    _serve_commands({node: (int(http), int(raft)) for node, (http, raft) in json.loads(sys.argv[1]).items()})
