"""A real Prometheus for tests (Debian's `prometheus` package; .ci/run
installs it): started on a free loopback port with a generated scrape
configuration, read through its HTTP API, stopped by PID.

    prom = Prometheus.start(tmp_path, {"hourglass": ["127.0.0.1:8080"]}, rule_files=[rules])
    prom.wait_data('up{job="hourglass"} == 1')   # once a scrape succeeded
    prom.query("hourglass_node_sends_total")     # the instant vector's samples
    prom.wait_alert("HourglassNodeDown", instance="127.0.0.1:8080")
    prom.stop()

`fast_rules` turns deploy/prometheus's rules into ones a test can watch
fire and resolve within seconds: every `for:` 1 s, every range 15 s.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import time
import urllib.parse
from collections.abc import Sequence
from typing import Any

import pytest
from harness import HOST, Process, free_port, request

SCRAPE_INTERVAL_S = 1


def binary(name: str) -> str:
    """The path of `name` (prometheus, promtool), or the test is skipped."""
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (Debian: apt-get install -y prometheus)")
    return path


def fast_rules(text: str) -> str:
    """Alert rules with every `for:` at 1 s and every range at 15 s: the
    same expressions and thresholds, on a test's time scale."""
    return re.sub(r"\[\d+[smh]\]", "[15s]", re.sub(r"\bfor: \S+", "for: 1s", text))


class Prometheus:
    def __init__(self, process: Process, base: str) -> None:
        self.process, self.base = process, base

    @classmethod
    def start(cls, workdir: str | os.PathLike[str], jobs: dict[str, Sequence[str]],
              rule_files: Sequence[str] = (), wait_s: float = 30) -> Prometheus:
        """Scrape each job's targets (host:port, /metrics) every second."""
        prometheus = binary("prometheus")
        workdir = os.fspath(workdir)
        os.makedirs(workdir, exist_ok=True)
        config = {
            "global": {"scrape_interval": f"{SCRAPE_INTERVAL_S}s", "evaluation_interval": "1s",
                       "scrape_timeout": f"{SCRAPE_INTERVAL_S}s"},
            "rule_files": [os.path.abspath(path) for path in rule_files],
            "scrape_configs": [{"job_name": job, "static_configs": [{"targets": list(targets)}]}
                               for job, targets in jobs.items()],
        }
        config_path = os.path.join(workdir, "prometheus.yml")
        with open(config_path, "w") as f:
            json.dump(config, f, indent=1)  # (JSON is YAML)
        port = free_port()
        process = Process([prometheus, f"--config.file={config_path}",
                           f"--storage.tsdb.path={os.path.join(workdir, 'tsdb')}",
                           f"--web.listen-address={HOST}:{port}"], os.path.join(workdir, "prometheus.log"))
        server = cls(process, f"http://{HOST}:{port}")
        deadline = time.monotonic() + wait_s
        while True:
            try:
                if request(server.base + "/-/ready", timeout=2)[0] == 200:
                    return server
            except OSError:
                pass
            if not process.alive() or time.monotonic() > deadline:
                process.kill()
                raise AssertionError(f"prometheus did not start: {process.log_tail()}")
            time.sleep(0.1)

    def api(self, path: str, **params: str) -> Any:
        status, body = request(f"{self.base}/api/v1/{path}?{urllib.parse.urlencode(params)}", timeout=10)
        answer = json.loads(body)
        assert status == 200 and answer["status"] == "success", (path, params, answer)
        return answer["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector `expr` evaluates to now: [{"metric": {...}, "value": [t, "v"]}, ...]."""
        data = self.api("query", query=expr)
        assert data["resultType"] == "vector", (expr, data)
        result: list[dict[str, Any]] = data["result"]
        return result

    def wait_data(self, expr: str, timeout_s: float = 60) -> list[dict[str, Any]]:
        """The samples of `expr` once it has some with a number (not NaN)."""
        deadline = time.monotonic() + timeout_s
        while True:
            result = self.query(expr)
            if any(math.isfinite(float(sample["value"][1])) for sample in result):
                return result
            if time.monotonic() > deadline:
                raise AssertionError(f"no data for {expr} within {timeout_s} s: {result}")
            time.sleep(0.5)

    def alerts(self, name: str, **labels: str) -> list[dict[str, Any]]:
        """The active (pending or firing) alerts named `name` with `labels`."""
        return [a for a in self.api("alerts")["alerts"] if a["labels"].get("alertname") == name
                and all(a["labels"].get(k) == v for k, v in labels.items())]

    def wait_alert(self, name: str, timeout_s: float = 60, **labels: str) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            firing = [a for a in self.alerts(name, **labels) if a["state"] == "firing"]
            if firing:
                return firing[0]
            if time.monotonic() > deadline:
                raise AssertionError(f"{name} {labels} did not fire within {timeout_s} s")
            time.sleep(0.25)

    def wait_resolved(self, name: str, timeout_s: float = 60, **labels: str) -> None:
        deadline = time.monotonic() + timeout_s
        while self.alerts(name, **labels):
            if time.monotonic() > deadline:
                raise AssertionError(f"{name} {labels} still active after {timeout_s} s: {self.alerts(name, **labels)}")
            time.sleep(0.25)

    def stop(self) -> None:
        self.process.stop()
