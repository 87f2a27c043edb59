"""Real `hourglass serve` processes for the tests. Starting one on a free
loopback port, talking to it over HTTP and stopping it by PID is
bench/harness.py's (the benchmarks use the same), and is imported from here
as the tests always have:

    server = Server.start(tmp_path / "data", log_path=tmp_path / "serve.log")
    status, answer = server.post("sendMsg", topic="t", msg="hi")
    server.stop()            # SIGTERM; returns the exit code
    server.kill()            # SIGKILL

`MonitorWatch` is the tests' own: getMonitorData's intervals while a test
runs; so is `PushSubscriber`, bench/push_subscriber.py in its own process.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from harness import ROOT, Server, decode, free_port, request

from broker.http.paths import PREFIX

__all__ = ["PREFIX", "ROOT", "MonitorWatch", "PushSubscriber", "Server", "free_port", "request"]


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
        self.intervals: list[dict[str, Any]] = []  # getMonitorData's data, oldest first, each once
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def __enter__(self) -> MonitorWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _poll(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                status, body = request(self.server.base + PREFIX + "getMonitorData", headers=self.server.headers())
            except OSError:
                continue
            data = decode(body).get("data") if status == 200 else None
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

    def wait_intervals(self, n: int, timeout_s: float = 15) -> list[dict[str, Any]]:
        """The next `n` intervals published from now."""
        seen = len(self.intervals)
        deadline = time.monotonic() + timeout_s
        while len(self.intervals) < seen + n:
            assert time.monotonic() < deadline, "getMonitorData published no new interval"
            time.sleep(self.poll_s)
        return self.intervals[seen:seen + n]


class PushSubscriber:
    """bench/push_subscriber.py in its own process, and what it received."""

    def __init__(self, tmp_path: Path, mode: str = "ok") -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/hook"
        self.record = tmp_path / f"received-{self.port}.jsonl"
        self.record.touch()
        self.proc = subprocess.Popen([sys.executable, str(Path(ROOT) / "bench" / "push_subscriber.py"), str(self.port),
                                      str(self.record), mode])
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                self.mode(mode)
                return
            except OSError:
                time.sleep(0.05)
        raise TimeoutError("the subscriber did not start")

    def mode(self, mode: str) -> None:
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}/_mode", json.dumps({"mode": mode}).encode(),
                                         {"Content-Type": "application/json"})
        urllib.request.urlopen(request, timeout=5).read()

    def received(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.record.read_text().splitlines() if line]

    def wait_received(self, count: int, timeout_s: float = 10) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            got = self.received()
            if len(got) >= count:
                return got
            time.sleep(0.02)
        raise AssertionError(f"{len(self.received())} requests received, {count} expected")

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def wait_for(check: Any, limit_s: float, what: str) -> Any:
    """Poll `check()` every 50 ms until it returns something true (that
    value); AssertionError naming `what` after `limit_s` seconds."""
    deadline = time.monotonic() + limit_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {limit_s} s")
        time.sleep(0.05)


def status(server: Server, topic: str, msg_id: str) -> int:
    """The stored status of a message (getMsg)."""
    answer = server.post("getMsg", topic=topic, msgId=msg_id)[1]
    assert isinstance(answer, dict), answer
    code: int = answer["delayMsg"]["status"]
    return code
