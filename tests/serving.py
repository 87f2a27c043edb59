"""Real `hourglass serve` processes for tests and benchmarks: start one on a
free loopback port, talk to it over HTTP, stop it by PID.

    server = Server.start(tmp_path / "data", log_path=tmp_path / "serve.log")
    status, answer = server.post("sendMsg", topic="t", msg="hi")
    server.stop()            # SIGTERM; returns the exit code
    server.kill()            # SIGKILL
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

PREFIX = "/camellia/delayQueue/"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(url: str, *, data: bytes | None = None, headers: dict | None = None,
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
    proc: subprocess.Popen
    base: str
    data_dir: str
    log_path: str
    token: str | None = None

    @classmethod
    def start(cls, data_dir, *flags: str, log_path=None, port: int | None = None, token: str | None = None,
              wait_s: float = 30, preexec_fn=None) -> Server:
        """`preexec_fn` runs in the child before it starts (e.g. to lower a
        resource limit)."""
        port = port or free_port()
        log_path = str(log_path or f"{data_dir}.log")
        with open(log_path, "ab") as log:
            # preexec_fn: the tests' own are a setrlimit, which takes no lock
            proc = subprocess.Popen(
                [sys.executable, "-m", "broker.cli", "serve", "--port", str(port), "--data-dir", str(data_dir),
                 *flags], stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                preexec_fn=preexec_fn)
        server = cls(proc, f"http://127.0.0.1:{port}", str(data_dir), log_path, token)
        server.wait_healthy(wait_s)
        return server

    def wait_healthy(self, wait_s: float = 30) -> float:
        """Seconds until /health answered 200."""
        started = time.monotonic()
        while time.monotonic() - started < wait_s:
            if self.proc.poll() is not None:
                break
            try:
                if request(self.base + "/health", timeout=2)[0] == 200:
                    return time.monotonic() - started
            except OSError:
                pass
            time.sleep(0.02)
        self.kill()
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            raise AssertionError(f"serve did not come up: {f.read()[-4000:]}")

    def _headers(self, extra: dict | None = None) -> dict:
        headers = dict(extra or {})
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        return headers

    # The methods below answer (code, body): the API's code -- in the body of
    # an HTTP 200, as camellia answers -- or the HTTP status when it is not
    # 200. `http_status` keeps the last HTTP status itself.
    http_status = 0

    def get(self, path: str, **params) -> tuple[int, dict | bytes]:
        query = ("?" + urllib.parse.urlencode(params)) if params else ""
        status, body = request(self.base + _path(path) + query, headers=self._headers())
        return self._code(status, body)

    def post(self, path: str, **params) -> tuple[int, dict | bytes]:
        """POST form-encoded parameters (values str()'d)."""
        data = urllib.parse.urlencode({k: str(v) for k, v in params.items()}).encode()
        status, body = request(self.base + _path(path), data=data, headers=self._headers(
            {"Content-Type": "application/x-www-form-urlencoded"}))
        return self._code(status, body)

    def post_json(self, path: str, obj) -> tuple[int, dict | bytes]:
        data = json.dumps(obj).encode()
        status, body = request(self.base + _path(path), data=data,
                               headers=self._headers({"Content-Type": "application/json"}))
        return self._code(status, body)

    def _code(self, status: int, raw: bytes) -> tuple[int, dict | bytes]:
        self.http_status = status
        body = _decode(raw)
        if status == 200 and isinstance(body, dict) and isinstance(body.get("code"), int):
            return body["code"], body
        return status, body

    def stop(self, timeout: float = 15) -> int:
        """SIGTERM, then wait; SIGKILL if it does not exit in time."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.kill()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


class MonitorWatch:
    """Every interval getMonitorData publishes while the watch runs (a
    thread polls it every 50 ms; run the server with a short
    --monitor-interval-s). camellia's counts are per interval: what one
    burst of calls did is the sum over the intervals it spanned.

        with MonitorWatch(server) as watch:
            ... calls on a fresh topic ...
            totals = watch.totals(topic, {"sendMsg": 2})   # waits for them
    """

    def __init__(self, server: Server, poll_s: float = 0.05) -> None:
        self.server = server
        self.poll_s = poll_s
        self.intervals: list[dict] = []  # getMonitorData's data, oldest first, each once
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def __enter__(self) -> MonitorWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _poll(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                status, body = request(self.server.base + PREFIX + "getMonitorData", headers=self.server._headers())
            except OSError:
                continue
            data = _decode(body).get("data") if status == 200 else None
            if data and "intervalEndTime" in data and (
                    not self.intervals or data["intervalEndTime"] != self.intervals[-1]["intervalEndTime"]):
                self.intervals.append(data)

    def _check_contiguous(self) -> None:
        for before, after in zip(self.intervals, self.intervals[1:]):
            assert after["intervalStartTime"] == before["intervalEndTime"], (
                f"an interval was missed between {before['intervalEndTime']} and {after['intervalStartTime']}: "
                f"the watch polled too slowly")

    def sums(self, topic: str, key: str = "requestStatsList") -> dict[str, float]:
        """The topic's entries of `key`, summed over the intervals seen
        (for time-gap lists: `count` summed, `max` the largest)."""
        self._check_contiguous()
        out: dict[str, float] = {}
        for data in list(self.intervals):
            for entry in data[key]:
                if entry["topic"] == topic:
                    for name, value in entry.items():
                        if name != "topic":
                            out[name] = max(out.get(name, 0), value) if name == "max" else out.get(name, 0) + value
        return out

    def totals(self, topic: str, expected: dict[str, int], timeout_s: float = 15) -> dict[str, float]:
        """requestStatsList sums for `topic` once they reach `expected` (or
        at the timeout), then one more interval, so a count beyond it shows."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            got = self.sums(topic)
            if all(got.get(k, 0) >= v for k, v in expected.items()):
                self.wait_intervals(1)
                return self.sums(topic)
            time.sleep(self.poll_s)
        return self.sums(topic)

    def wait_intervals(self, n: int, timeout_s: float = 15) -> list[dict]:
        """The next `n` intervals published from now."""
        seen = len(self.intervals)
        deadline = time.monotonic() + timeout_s
        while len(self.intervals) < seen + n:
            assert time.monotonic() < deadline, "getMonitorData published no new interval"
            time.sleep(self.poll_s)
        return self.intervals[seen:seen + n]


def _path(path: str) -> str:
    return path if path.startswith("/") else PREFIX + path


def _decode(body: bytes):
    try:
        return json.loads(body)
    except ValueError:
        return body
