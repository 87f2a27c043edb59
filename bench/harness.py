"""What every benchmark shares, written once: the processes a benchmark
starts and stops, and the figures it reads from them.

    server = Server.start(work_dir + "/data", "--fsync", "batch")   # a free port, /health answered
    before = cpu_s(server.proc.pid)
    ...                                                              # the load
    used_s = cpu_s(server.proc.pid) - before
    rss_mb = memory_mb(server.proc.pid)["rss_mb"]
    server.stop()                                                    # SIGTERM; SIGKILL after 15 s

Processes: `free_port`, `Process` (any child: redis-server, beanstalkd, a
mover; stopped by its PID, SIGTERM and then SIGKILL), `Server` (`hourglass
serve` on a free loopback port, waited for until /health answers 200),
`wait_until`, and `unwind_on_signals` for a benchmark's own Ctrl-C.

Figures: CPU seconds from /proc/<pid>/stat (`cpu_s`, `tree_cpu_s`,
`CpuMeter`), this process's from getrusage (`own_cpu_s`), the machine's
busy seconds from /proc/stat, memory from /proc/<pid>/status
(`memory_mb`: RSS, peak RSS and its parts), bytes on disk, and
`percentile`: nearest rank, the one definition every benchmark's p50, p99
and max use, so that their figures compare.

A benchmark runs as `.venv/bin/python bench/<name>.py` from the project
root: this folder is then first on sys.path, so `import harness` finds
this file; the tests put it on theirs too (pyproject.toml, pytest's
`pythonpath`), for `Server`, `free_port` and `request`.

The servers a benchmark starts run this source tree's broker (pure Python)
unless HOURGLASS_SERVE_PYTHON names another interpreter: then they run the
hourglass installed for it (`python -P -m broker.cli`: the source tree is
not put on its path), e.g. the compiled build the README's set-up installs.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import resource
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Any, TypeVar

from broker.http.paths import PREFIX

T = TypeVar("T")
# A file or directory as the callers name it: a str, or a pathlib.Path.
PathLike = str | os.PathLike[str]

HOST = "127.0.0.1"
# The project: `python -m broker.cli` runs from here.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STOP_TIMEOUT_S = 15.0
_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


# --- processes ---------------------------------------------------------------------


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on at the moment."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        port: int = s.getsockname()[1]
        return port


def free_ports(count: int) -> list[int]:
    """`count` distinct free ports: each socket is held until all are
    picked (one at a time, the system may hand the same port out twice)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            sockets.append(s)
            s.bind((HOST, 0))
        return [int(s.getsockname()[1]) for s in sockets]
    finally:
        for s in sockets:
            s.close()


class Process:
    """One child process, started here in a session of its own (a Ctrl-C
    meant for the benchmark does not reach it: the benchmark stops it) with
    stdout and stderr appended to `log_path`, and stopped by its PID."""

    def __init__(self, argv: list[str], log_path: PathLike, cwd: str | None = None,
                 preexec_fn: Callable[[], object] | None = None, env: dict[str, str] | None = None) -> None:
        self.argv, self.log_path = argv, str(log_path)
        with open(self.log_path, "ab") as log:
            # preexec_fn: the callers' own are a setrlimit, which takes no lock
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         cwd=cwd, start_new_session=True, preexec_fn=preexec_fn, env=env)
        self.pid = self.proc.pid

    def __repr__(self) -> str:
        return f"Process(pid={self.pid}, {os.path.basename(self.argv[0])}, exit={self.proc.poll()})"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int | None:
        """SIGTERM and wait; SIGKILL if it outlives `timeout_s`. The exit
        code, or None when it had to be killed."""
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def kill(self) -> None:
        """SIGKILL (if it still runs) and reap it."""
        if self.alive():
            self.proc.kill()
        self.proc.wait()

    def log_tail(self, chars: int = 2000) -> str:
        with contextlib.suppress(OSError), open(self.log_path, encoding="utf-8", errors="replace") as f:
            return f.read()[-chars:]
        return ""


def wait_until(check: Callable[[], T], limit_s: float, what: str, process: Process | None = None,
               every_s: float = 0.005) -> T:
    """Call `check` until it returns something true (exceptions count as
    false); that value. RuntimeError after `limit_s`, or at once if
    `process` exited (with its log's tail)."""
    deadline = time.monotonic() + limit_s
    last_error: Exception | None = None
    while True:
        try:
            value = check()
            if value:
                return value
        except Exception as e:
            last_error = e
        if process is not None and not process.alive():
            raise RuntimeError(f"{what}: the process exited ({process}); log: {process.log_tail()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within {limit_s} s (last error: {last_error!r})")
        time.sleep(every_s)


def hourglass_command(*args: str) -> list[str]:
    """The command line of `hourglass ARGS...` (run it with cwd ROOT) on
    the build under test: the hourglass HOURGLASS_SERVE_PYTHON has
    installed, else this tree's sources."""
    serve_python = os.environ.get("HOURGLASS_SERVE_PYTHON")
    head = [serve_python, "-P", "-m", "broker.cli"] if serve_python else [sys.executable, "-m", "broker.cli"]
    return [*head, *args]


def serve_command(data_dir: PathLike, *flags: str, launcher: Sequence[str] = ()) -> list[str]:
    """The command line of `hourglass serve` on `data_dir` (run it with cwd
    ROOT); `launcher`, python's arguments that run the CLI in place of
    `-m broker.cli` (`-m bench.drill_slow_disk CONTROL`)."""
    head = [sys.executable, *launcher] if launcher else hourglass_command()
    if "--shards" not in flags:  # one shard unless asked (HOURGLASS_SHARDS: another count, or auto)
        flags = ("--shards", os.environ.get("HOURGLASS_SHARDS", "1"), *flags)
    return [*head, "serve", "--data-dir", str(data_dir), *flags]


def child_env(*paths: str) -> dict[str, str]:
    """The environment of a child script (bench/*.py, a test's child) that
    imports the broker this run's servers run: `paths` first on its path
    (its sibling modules), then this tree's sources, as `-m broker.cli`
    from the root has them, unless PYTHONSAFEPATH is set (`bash .ci/run`'s
    compiled runs: the servers and the child import the installed build)."""
    tree = [] if os.environ.get("PYTHONSAFEPATH") else [ROOT]
    return {**os.environ, "PYTHONPATH": os.pathsep.join([*paths, *tree, *filter(None, [os.environ.get("PYTHONPATH")])])}


def serve_version() -> str:
    """What `hourglass --version` says of the build serve_command runs
    (pure Python, or compiled with mypyc)."""
    command = serve_command("-")
    head = command[:command.index("serve")]
    return subprocess.run([*head, "--version"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


def request(url: str, *, data: bytes | None = None, headers: dict[str, str] | None = None,
            timeout: float = 30) -> tuple[int, bytes]:
    """(status, body) of one HTTP request; HTTP errors are answers too."""
    req = urllib.request.Request(url, data=data, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


@dataclass
class Server:
    """A real `hourglass serve`: its process, its base URL, and the API's
    calls over HTTP.

        server = Server.start(tmp_path / "data", log_path=tmp_path / "serve.log")
        status, answer = server.post("sendMsg", topic="t", msg="hi")
        server.stop()            # SIGTERM; the exit code (None: killed after 15 s)
        server.kill()            # SIGKILL
    """

    process: Process
    base: str
    data_dir: str
    token: str | None = None
    # The methods get, post and post_json answer (code, body): the API's
    # code -- in the body of an HTTP 200, as camellia answers -- or the HTTP
    # status when it is not 200. `http_status` keeps the last HTTP status.
    http_status: int = 0

    @classmethod
    def spawn(cls, data_dir: PathLike, *flags: str, base: str, log_path: PathLike | None = None,
              token: str | None = None, preexec_fn: Callable[[], object] | None = None,
              launcher: Sequence[str] = ()) -> Server:
        """Start it without waiting (`flags` say where it listens: `base`);
        `preexec_fn` runs in the child first (e.g. to lower a resource limit);
        `launcher` as for `serve_command`."""
        process = Process(serve_command(data_dir, *flags, launcher=launcher), str(log_path or f"{data_dir}.log"),
                          cwd=ROOT, preexec_fn=preexec_fn)
        return cls(process, base, str(data_dir), token)

    @classmethod
    def start(cls, data_dir: PathLike, *flags: str, log_path: PathLike | None = None, port: int | None = None,
              token: str | None = None, wait_s: float = 30, preexec_fn: Callable[[], object] | None = None,
              launcher: Sequence[str] = ()) -> Server:
        """Start it on `port` (default a free one) of 127.0.0.1 and wait
        until /health answers 200."""
        port = port or free_port()
        server = cls.spawn(data_dir, "--port", str(port), *flags, base=f"http://{HOST}:{port}", log_path=log_path,
                           token=token, preexec_fn=preexec_fn, launcher=launcher)
        server.wait_healthy(wait_s)
        return server

    @property
    def proc(self) -> subprocess.Popen[bytes]:
        return self.process.proc

    @property
    def log_path(self) -> str:
        return self.process.log_path

    def wait_healthy(self, wait_s: float = 30) -> float:
        """Seconds until /health answered 200. If it does not within
        `wait_s` (or exits), it is killed and AssertionError quotes its log."""
        started = time.monotonic()
        try:
            wait_until(lambda: request(self.base + "/health", timeout=2)[0] == 200, wait_s, "serve's /health",
                       self.process, every_s=0.02)
        except RuntimeError:
            self.kill()
            raise AssertionError(f"serve did not come up: {self.process.log_tail(4000)}") from None
        return time.monotonic() - started

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int | None:
        return self.process.stop(timeout_s)

    def kill(self) -> None:
        self.process.kill()

    def get(self, path: str, **params: object) -> tuple[int, dict[str, Any] | bytes]:
        query = ("?" + urllib.parse.urlencode(params)) if params else ""
        status, body = request(self.base + _path(path) + query, headers=self.headers())
        return self._code(status, body)

    def post(self, path: str, **params: object) -> tuple[int, dict[str, Any] | bytes]:
        """POST form-encoded parameters (values str()'d)."""
        data = urllib.parse.urlencode({k: str(v) for k, v in params.items()}).encode()
        status, body = request(self.base + _path(path), data=data, headers=self.headers(
            {"Content-Type": "application/x-www-form-urlencoded"}))
        return self._code(status, body)

    def post_json(self, path: str, obj: object) -> tuple[int, dict[str, Any] | bytes]:
        data = json.dumps(obj).encode()
        status, body = request(self.base + _path(path), data=data,
                               headers=self.headers({"Content-Type": "application/json"}))
        return self._code(status, body)

    def headers(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """`extra`, with the bearer token when the server has one."""
        headers = dict(extra or {})
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        return headers

    def _code(self, status: int, raw: bytes) -> tuple[int, dict[str, Any] | bytes]:
        self.http_status = status
        body = decode(raw)
        if status == 200 and isinstance(body, dict) and isinstance(body.get("code"), int):
            return body["code"], body
        return status, body


def _path(path: str) -> str:
    """An API call's name ("sendMsg") is under PREFIX; a path ("/health") is itself."""
    return path if path.startswith("/") else PREFIX + path


def decode(body: bytes) -> Any:
    """The JSON of an answer's body, or the body itself when it is not JSON
    (Any: what a test reads of it is the API's to say)."""
    try:
        return json.loads(body)
    except ValueError:
        return body


def unwind_on_signals() -> None:
    """From now on SIGINT or SIGTERM raises KeyboardInterrupt, once: every
    `finally` runs (servers stopped by PID, work dirs removed). A second
    signal (Ctrl-C sends one to the whole process group, `timeout` one
    more) would cut that short, so later ones are ignored."""
    def unwind(signum: int, frame: FrameType | None) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
        raise KeyboardInterrupt(f"signal {signum}")

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, unwind)


# --- figures -----------------------------------------------------------------------


def percentile(sorted_values: Sequence[float], fraction: float) -> float | None:
    """Nearest rank: the value at rank ceil(fraction * n) (1-based, at
    least 1) of an ascending sequence, rounded to 3 decimals; None when it
    is empty. It is always one of the values: p50 of [1, 2, 3, 4] is 2,
    p99 of 100 values is the 99th, fraction 1.0 is the max."""
    if not sorted_values:
        return None
    rank = max(1, min(len(sorted_values), math.ceil(fraction * len(sorted_values))))
    return round(sorted_values[rank - 1], 3)


def _stat_fields(pid: int) -> list[str]:
    """/proc/<pid>/stat after the command name (which may hold spaces):
    field 3 (state) first, so field N of proc(5) is [N - 3]."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def cpu_s(pid: int) -> float:
    """User + system CPU seconds a process has used so far (utime + stime)."""
    fields = _stat_fields(pid)
    return (int(fields[11]) + int(fields[12])) / _TICKS_PER_S


def run_time_s(pids: Sequence[int]) -> float:
    """CPU seconds the threads of these processes have run so far, to the
    nanosecond (/proc/<pid>/task/<tid>/schedstat's first field): fine
    enough to charge one call of a few ms, where utime's 10 ms ticks are
    not. Threads that exited are not counted: read across calls of a
    node whose threads live long."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            for tid in os.listdir(f"/proc/{pid}/task"):
                with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    total += int(f.read().split()[0])
    return total / 1e9


def tree_cpu_s(root: int, exclude: set[int]) -> float:
    """CPU seconds of `root` and its descendants, less the `exclude`d
    subtrees: utime + stime of the live ones, plus cutime + cstime, the
    children they have reaped (Spark's exited Python workers)."""
    parents: dict[int, int] = {}
    stats: dict[int, list[str]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError):  # it exited meanwhile
                stats[int(name)] = _stat_fields(int(name))
                parents[int(name)] = int(stats[int(name)][1])
    ticks, frontier = 0, [root]
    while frontier:
        pid = frontier.pop()
        if pid in exclude or pid not in stats:
            continue
        ticks += sum(int(x) for x in stats[pid][11:15])
        frontier += [child for child, parent in parents.items() if parent == pid]
    return ticks / _TICKS_PER_S


def machine_busy_cpu_s() -> float:
    """Busy CPU seconds of the whole machine since boot (/proc/stat: all
    but idle and iowait)."""
    with open("/proc/stat") as f:
        user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, f.readline().split()[1:9])
    return (user + nice + system + irq + softirq + steal) / _TICKS_PER_S


def own_cpu_s() -> float:
    """User + system CPU seconds of this process so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class CpuMeter:
    """CPU seconds the given processes, with every process they started
    (a node's shards), used since it was made, each as `<name>_cpu_s`
    (e.g. `server`, and a peer's own helpers such as `redis` or `mover`)."""

    def __init__(self, pids: dict[str, int], parts: dict[str, int] | None = None) -> None:
        self.pids = pids
        self.before = {name: tree_cpu_s(pid, set()) for name, pid in pids.items()}
        # processes within those (a node's shards), each also alone, as `<name>_cpu_share_s`
        self.parts = parts or {}
        self.parts_before = {name: cpu_s(pid) for name, pid in self.parts.items()}

    def used(self) -> dict[str, float]:
        used = {f"{name}_cpu_s": round(tree_cpu_s(pid, set()) - self.before[name], 2)
                for name, pid in self.pids.items()}
        for name, pid in self.parts.items():
            with contextlib.suppress(OSError):  # (it exited)
                used[f"{name}_cpu_share_s"] = round(cpu_s(pid) - self.parts_before[name], 2)
        return used


_MEMORY_FIELDS = {"VmRSS:": "rss_mb", "VmHWM:": "rss_peak_mb", "RssAnon:": "rss_anon_mb", "RssFile:": "rss_file_mb"}


def memory_mb(pid: int) -> dict[str, float]:
    """A process's memory from /proc/<pid>/status, in MB to 0.1: rss_mb
    (VmRSS), rss_peak_mb (VmHWM, the most it has held), and rss_anon_mb
    (the heap) and rss_file_mb, the mapped pages of files (log segments,
    hour files) that happen to be resident, so it moves with the moment."""
    found: dict[str, float] = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, *rest = line.split()
            if key in _MEMORY_FIELDS:
                found[_MEMORY_FIELDS[key]] = round(int(rest[0]) / 1024, 1)
    return {name: found[name] for name in _MEMORY_FIELDS.values() if name in found}


def children(pid: int) -> list[int]:
    """The processes `pid` started (a node's shards), by pid."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError):
                if int(_stat_fields(int(name))[1]) == pid:
                    found.append(int(name))
    return sorted(found)


def tree_memory_mb(pid: int) -> dict[str, float]:
    """memory_mb of `pid` and the processes it started, each figure summed."""
    total: dict[str, float] = {}
    for each in (pid, *children(pid)):
        with contextlib.suppress(OSError):
            for name, value in memory_mb(each).items():
                total[name] = round(total.get(name, 0.0) + value, 1)
    return total


def disk_bytes(directory: str) -> int:
    """Bytes allocated on disk by the files under `directory` (st_blocks:
    what the disk gives, not the files' lengths)."""
    total = 0
    for path, _, files in os.walk(directory):
        for name in files:
            with contextlib.suppress(OSError):  # removed meanwhile
                total += os.stat(os.path.join(path, name)).st_blocks * 512
    return total


def every_message(server: Server) -> tuple[dict[tuple[str, str], dict[str, Any]], int]:
    """Every message the node keeps, whatever its status (each topic of
    getTopicInfoList paged through listMsg), by (topic, msgId); and how
    many were listed twice."""
    found: dict[tuple[str, str], dict[str, Any]] = {}
    twice = 0
    status, answer = server.get("getTopicInfoList")
    assert status == 200 and isinstance(answer, dict), answer
    for info in answer["data"]:
        query: dict[str, Any] = {"topic": info["topic"], "status": "1,2,3,4,5,6,7", "limit": 1000}
        while True:
            status, page = server.get("listMsg", **query)
            assert status == 200 and isinstance(page, dict), page
            for row in page["delayMsgList"]:
                key = (row["topic"], row["msgId"])
                twice += key in found
                found[key] = row
            if page["cursor"] is None:
                break
            query["cursor"] = page["cursor"]
    return found, twice

