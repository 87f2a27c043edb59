"""The processes a fault drill runs: one standalone node, or a 3-node
cluster whose peer traffic goes through the drill's proxies.

    nodes = Nodes.start(root, cluster=True)       # n1..n3, secret, proxies
    nodes.leader()                                 # ("n2", term) or None
    nodes.kill("n2"); nodes.restart("n2")          # SIGKILL by PID, same data dir
    nodes.pause("n1"); nodes.resume("n1")          # SIGSTOP / SIGCONT
    nodes.mesh.isolate("n3", Mode.DROP); nodes.mesh.heal()
    nodes.fill_disk("n3"); nodes.free_disk("n3")   # root only: a tmpfs data dir
    nodes.slow_disk("n1", 300); nodes.slow_disk("n1", 0)  # with slow_disks: fsync delayed 300 ms, then not
    nodes.stop()                                   # every process by PID, the tmpfs unmounted

Every node is a real `hourglass serve` (bench/harness.py `Server`),
started from this checkout; a node's log is `<root>/<node>.log`, appended
across its restarts.

A full disk: when built with `small_disk_mb` and run as root, the last
node's data directory is a tmpfs of that size; `fill_disk` writes a
ballast file until the tmpfs is full, `free_disk` removes it. Without
root there is no full-disk fault (`disk_note` says why): filling a real
disk would hurt the machine.

A slow disk: built with `slow_disks`, every node runs under
bench/drill_slow_disk.py, which delays each fsync and fdatasync of the
node by what `<root>/<node>.fsync-delay-ms` says; `slow_disk` sets it.
No root needed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

from drill_proxies import ProxyMesh
from drill_slow_disk import set_delay
from harness import HOST, Server, free_port, free_ports, request

CLUSTER_IDS = ("n1", "n2", "n3")
STANDALONE_ID = "s1"
BALLAST = "drill-ballast"
# python's arguments before the control file's name (run with cwd the project root, as Server runs it):
# bench/drill_slow_disk.py run by its path from `-c`, which puts the working directory on the import
# path exactly when `-m broker.cli` would (not under PYTHONSAFEPATH): its broker is the one the
# drill's other nodes run, the tree's or the installed build
_SLOW_DISK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "drill_slow_disk.py")
SLOW_DISK_LAUNCHER = ("-c", f"import runpy; runpy.run_path({_SLOW_DISK!r}, run_name='__main__')")


@dataclass
class Nodes:
    root: str
    ids: tuple[str, ...]
    http_ports: dict[str, int]
    flags: dict[str, tuple[str, ...]]  # node -> its serve flags
    mesh: ProxyMesh | None = None
    small_disk: str | None = None  # the node whose data dir is a tmpfs
    disk_note: str = ""
    slow_disks: bool = False  # every node under drill_slow_disk.py
    servers: dict[str, Server] = field(default_factory=dict)
    paused: set[str] = field(default_factory=set)

    def __repr__(self) -> str:
        alive = [n for n in self.ids if self.alive(n)]
        return f"Nodes({self.root}, alive={alive}, paused={sorted(self.paused)}, small_disk={self.small_disk})"

    @classmethod
    def start(cls, root: str, *, cluster: bool, small_disk_mb: int = 0, slow_disks: bool = False,
              extra: tuple[str, ...] = (), wait_s: float = 60) -> Nodes:
        os.makedirs(root, exist_ok=True)
        if not cluster:
            port = free_port()
            nodes = cls(root, (STANDALONE_ID,), {STANDALONE_ID: port}, {STANDALONE_ID: ("--port", str(port), *extra)})
        else:
            ports = free_ports(2 * len(CLUSTER_IDS))  # distinct: two nodes on one port would not start
            http = dict(zip(CLUSTER_IDS, ports[:len(CLUSTER_IDS)]))
            raft = dict(zip(CLUSTER_IDS, ports[len(CLUSTER_IDS):]))
            spec = ",".join(f"{n}={HOST}:{http[n]}:{raft[n]}" for n in CLUSTER_IDS)
            secret = os.path.join(root, "cluster-secret")
            with open(os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
                f.write(os.urandom(24).hex())
            mesh = ProxyMesh({n: (http[n], raft[n]) for n in CLUSTER_IDS})
            mesh.start()
            flags = {n: ("--node-id", n, "--cluster", spec, "--cluster-secret-file", secret,
                         "--reach-peers", mesh.reach_flag(n), *extra) for n in CLUSTER_IDS}
            nodes = cls(root, CLUSTER_IDS, http, flags, mesh)
        if small_disk_mb:
            nodes._mount_small_disk(nodes.ids[-1], small_disk_mb)
        nodes.slow_disks = slow_disks
        for n in nodes.ids if slow_disks else ():
            nodes.slow_disk(n, 0)  # (a --root reused from a drill stopped mid-fault)
        try:
            for n in nodes.ids:
                nodes.restart(n, wait=False)
            for n in nodes.ids:
                nodes.servers[n].wait_healthy(wait_s)
        except BaseException:
            nodes.stop()
            raise
        return nodes

    def _mount_small_disk(self, node: str, size_mb: int) -> None:
        path = self.data_dir(node)
        os.makedirs(path, mode=0o700, exist_ok=True)
        if os.geteuid() != 0:
            self.disk_note = "full disk skipped: mounting a tmpfs for a data directory needs root"
            return
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m,mode=0700", "tmpfs", path],
                              capture_output=True, text=True)
        if done.returncode != 0:
            self.disk_note = f"full disk skipped: cannot mount a tmpfs here ({done.stderr.strip()})"
            return
        self.small_disk = node

    def data_dir(self, node: str) -> str:
        return os.path.join(self.root, node)

    def url(self, node: str) -> str:
        return f"http://{HOST}:{self.http_ports[node]}"

    @property
    def urls(self) -> list[str]:
        return [self.url(n) for n in self.ids]

    @property
    def cluster(self) -> bool:
        return self.mesh is not None

    # -- processes ---------------------------------------------------------------------

    def restart(self, node: str, wait: bool = True, wait_s: float = 60) -> None:
        """Start `node` again on its data directory (after a kill, or the first time)."""
        self.paused.discard(node)
        launcher = (*SLOW_DISK_LAUNCHER, self._fsync_control(node)) if self.slow_disks else ()
        self.servers[node] = Server.spawn(self.data_dir(node), *self.flags[node], base=self.url(node),
                                          log_path=os.path.join(self.root, f"{node}.log"), launcher=launcher)
        if wait:
            self.servers[node].wait_healthy(wait_s)

    def alive(self, node: str) -> bool:
        return node in self.servers and self.servers[node].proc.poll() is None

    def kill(self, node: str) -> None:
        self.paused.discard(node)
        self.servers[node].kill()

    def pause(self, node: str) -> None:
        self.servers[node].proc.send_signal(signal.SIGSTOP)
        self.paused.add(node)

    def resume(self, node: str) -> None:
        self.servers[node].proc.send_signal(signal.SIGCONT)
        self.paused.discard(node)

    def stop(self) -> None:
        """Every node stopped by PID (resumed first), the proxies closed, the
        tmpfs unmounted."""
        for server in self.servers.values():
            with contextlib.suppress(ProcessLookupError):
                server.proc.send_signal(signal.SIGCONT)
        for server in self.servers.values():
            server.stop()
        if self.mesh is not None:
            self.mesh.stop()
        if self.small_disk is not None:
            subprocess.run(["umount", "-l", self.data_dir(self.small_disk)], check=False, capture_output=True)
            self.small_disk = None

    # -- disk --------------------------------------------------------------------------

    def fill_disk(self, node: str) -> int:
        """Write a ballast file into `node`'s tmpfs until it is full; its bytes."""
        path = os.path.join(self.data_dir(node), BALLAST)
        written = 0
        with open(path, "wb", buffering=0) as f:  # unbuffered: nothing left to fail at close
            for block in (b"\0" * (1 << 20), b"\0" * 4096):  # megabytes, then what is left in pages
                with contextlib.suppress(OSError):
                    while True:
                        written += f.write(block)
        return written

    def free_disk(self, node: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(self.data_dir(node), BALLAST))

    def _fsync_control(self, node: str) -> str:
        return os.path.join(self.root, f"{node}.fsync-delay-ms")

    def slow_disk(self, node: str, delay_ms: int) -> None:
        """From now on every fsync and fdatasync of `node` waits `delay_ms`
        first (0: the disk as it is); the delay outlives a restart."""
        if not self.slow_disks:
            raise RuntimeError("the nodes were started without slow_disks")
        set_delay(self._fsync_control(node), delay_ms)

    # -- what the nodes say ------------------------------------------------------------

    def health(self, node: str) -> dict[str, Any] | None:
        if node in self.paused or not self.alive(node):
            return None
        try:
            status, body = request(self.url(node) + "/health", timeout=1)
        except OSError:
            return None
        if status != 200:
            return None
        answer: dict[str, Any] = json.loads(body)
        return answer

    def leader(self, exclude: str | None = None) -> tuple[str, int] | None:
        """(node, term) of a node that says it leads (the standalone node
        always does, term 0)."""
        for n in self.ids:
            if n == exclude:
                continue
            h = self.health(n)
            if h and h.get("role") in ("leader", "standalone"):
                return n, int(h.get("term") or 0)
        return None

    def wait_leader(self, exclude: str | None = None, above_term: int = -1, wait_s: float = 30) -> tuple[str, int]:
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            found = self.leader(exclude)
            if found and found[1] > above_term:
                return found
            time.sleep(0.01)
        raise TimeoutError(f"no leader within {wait_s} s ({self})")

    def log_ends(self) -> dict[str, int | None]:
        ends: dict[str, int | None] = {}
        for n in self.ids:
            h = self.health(n)
            ends[n] = None if h is None else h.get("log_end_offset")
        return ends

    def converged(self, at_least: int | None = None) -> bool:
        """One leader that every node names, and every node's log at
        `at_least` (or, without it, all log ends equal)."""
        healths = [self.health(n) for n in self.ids]
        if any(h is None for h in healths):
            return False
        if not self.cluster:
            return True
        leaders = {h.get("leader") for h in healths if h}
        roles = sorted(str(h.get("role")) for h in healths if h)
        if len(leaders) != 1 or None in leaders or roles != ["follower", "follower", "leader"]:
            return False
        ends = [int(h.get("log_end_offset") or 0) for h in healths if h]
        return min(ends) >= at_least if at_least is not None else len(set(ends)) == 1

    def leaderships(self) -> list[dict[str, Any]]:
        """Every node's leadership.log lines."""
        lines: list[dict[str, Any]] = []
        for n in self.ids:
            path = os.path.join(self.data_dir(n), "leadership.log")
            with contextlib.suppress(OSError), open(path) as f:
                lines.extend(json.loads(line) for line in f if line.strip())
        return lines
