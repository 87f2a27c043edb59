"""Disk backend against Redis backend: bench/http_load.py's scenarios run on
`hourglass serve --backend disk` and on `hourglass serve --backend
redis://127.0.0.1:PORT/0` in one run, each scenario on disk and then at once
on Redis, so that the shared machine's drift touches both alike.

    .venv/bin/python bench/compare.py                      # 1,000,000-message backlog; several minutes
    .venv/bin/python bench/compare.py --scale 0.02         # every count x0.02: a quick check
    .venv/bin/python bench/compare.py --redis-appendonly everysec    # Redis with AOF, fsync every second
    .venv/bin/python bench/compare.py --only backlog --keep

Scenarios, counts and knobs are bench/http_load.py's (its --help says what each
figure is): ingest-batch, ingest-single, dispatch (lateness p50/p99/max,
early, lost, duplicates), roundtrip, backlog (--backlog-msgs, default
1,000,000, pending over 30 days: memory, then restart).

Each scenario gets a fresh state: on disk a new data directory, on Redis a
new `redis-server` (--redis-server, default the one on PATH) on a free
loopback port with its own directory, no RDB snapshots and by default no
AOF (--redis-appendonly everysec or always: AOF with that fsync policy).
hourglass serve runs with --fsync batch (every answer of 200 is on disk).
Every process is started by this program and stopped by its PID at the
end of its scenario (SIGTERM, SIGKILL after 15 s), also on Ctrl-C, SIGTERM
or an error.

Memory (backlog): VmRSS from /proc/<pid>/status of the hourglass process,
plus, on Redis, of the redis-server process (`rss_total_mb`); Redis's own
INFO used_memory is reported beside it. Restart (backlog): hourglass serve is
killed (SIGKILL) and started again, timed until /health answers and
getTopicInfo counts the whole backlog. On disk that reloads the backlog's
indexes; on Redis the backlog stays in redis-server, so only the hourglass
process restarts. `restart_full_s` restarts every process that holds the
backlog: on disk that is restart_s again; on Redis, only with AOF on (without
it a restarted redis-server is empty), it kills redis-server too and times
its AOF load plus the hourglass restart.

Output: stdout gets a table (figure, disk, redis, disk/redis) and then ONE
JSON object (the lines from the first "{"), with the ratios disk/redis
(`*_ratio_disk_over_redis`: above 1 means disk's figure is larger, which is
better for a throughput and worse for a time or a size), the figures of both
backends, each scenario's details, the scale and the machine's
calibration_ms. Progress goes to stderr. Exit status 1 if a scenario failed
or a problem (an early, lost or duplicate message, an error answer) was seen.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import time
from collections.abc import Iterator

import http_load
import redis
from harness import Process, Server, disk_bytes, free_port, memory_mb, unwind_on_signals, wait_until
from http_load import Bench, DiskBackend, log

MB = 1024 * 1024


class RedisBackend(DiskBackend):
    """`--backend redis://127.0.0.1:PORT/0` on a redis-server of its own per
    scenario (no RDB; AOF as --redis-appendonly says)."""

    name = "redis"

    def __init__(self, work_dir: str, binary: str, appendonly: str) -> None:
        self.work_dir, self.binary, self.appendonly = work_dir, binary, appendonly
        self.proc: Process | None = None
        self.port = 0
        self.dir = ""
        self.restart_scope = ("hourglass serve only, killed (SIGKILL) and started again on the same Redis: the "
                              "backlog stays in redis-server, which keeps running")
        if appendonly != "no":
            self.restart_scope += ("; restart_full_s (restart_with_redis_s) also kills redis-server (SIGKILL) and restarts it on "
                                   "its AOF, timed until hourglass serves the whole backlog again")

    def persistence(self) -> list[str]:
        if self.appendonly == "no":
            return ["--appendonly", "no"]
        return ["--appendonly", "yes", "--appendfsync", self.appendonly]

    def describe(self) -> dict:
        """Which Redis and persistence this run used (asks a scratch redis-server)."""
        with self.state("version"):
            version = self.client().info("server")["redis_version"]
        return {"binary": self.binary, "version": version, "appendonly": self.appendonly,
                "persistence": "none (no RDB, no AOF)" if self.appendonly == "no"
                else f"AOF, appendfsync {self.appendonly} (no RDB)",
                "args": ["--save", "", *self.persistence()]}

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5)

    def serve_flags(self) -> list[str]:
        return ["--backend", f"redis://127.0.0.1:{self.port}/0"]

    def _spawn(self, wait_s: float) -> None:
        """Start redis-server on self.port and self.dir (its log beside
        the dir); return once it answers PING (while it loads its AOF it
        answers LOADING)."""
        self.proc = Process([self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                             *self.persistence(), "--dir", self.dir], self.dir + ".log")
        with contextlib.closing(self.client()) as client:
            wait_until(client.ping, wait_s, f"redis-server on port {self.port}", self.proc, every_s=0.02)

    def _stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
            self.proc = None

    @contextlib.contextmanager
    def state(self, scenario: str) -> Iterator[None]:
        self.dir = os.path.join(self.work_dir, scenario + ".redis")
        os.makedirs(self.dir, exist_ok=True)
        self.port = free_port()
        try:
            self._spawn(wait_s=30)
            log(f"redis-server pid {self.proc.pid} on 127.0.0.1:{self.port} for {scenario}")
            yield
        finally:
            self._stop()

    def pids(self) -> dict[str, int]:
        return {"redis": self.proc.pid} if self.proc else {}

    def memory(self) -> dict:
        with contextlib.closing(self.client()) as client:
            info, keys = client.info("memory"), client.dbsize()
        return {**memory_mb(self.proc.pid), "used_memory_mb": round(info["used_memory"] / MB, 1),
                "used_memory_peak_mb": round(info["used_memory_peak"] / MB, 1), "keys": keys}

    def disk_bytes(self) -> int:
        return disk_bytes(self.dir)

    def restart_everything(self, bench: Bench, scenario: str, server: Server, count: int) -> tuple[Server, dict]:
        if self.appendonly == "no":
            return server, {}  # a restarted redis-server would be empty
        log(f"{scenario}: SIGKILL hourglass serve and redis-server, restart both")
        server.kill()
        self.proc.kill()
        spawned = time.monotonic()
        self._spawn(wait_s=bench.args.restart_timeout_s)
        redis_load_s = round(time.monotonic() - spawned, 3)
        server, restart = bench.respawn(scenario, count, spawned)
        return server, {"restart_with_redis_s": restart["restart_s"], "redis_load_s": redis_load_s}


# --- the figures side by side -------------------------------------------------

# (figure, its top-level ratio key or None); the figures come from figures().
ROWS = (
    ("ingest_batch_msgs_per_s", "ingest_batch_ratio_disk_over_redis"),
    ("ingest_batch_server_cpu_us_per_msg", None),
    ("ingest_single_msgs_per_s", "ingest_single_ratio_disk_over_redis"),
    ("ingest_single_server_cpu_us_per_msg", None),
    ("lateness_ms_p50", "lateness_p50_ratio_disk_over_redis"),
    ("lateness_ms_p99", "lateness_p99_ratio_disk_over_redis"),
    ("lateness_ms_max", None),
    ("early", None),
    ("lost", None),
    ("duplicates", None),
    ("roundtrip_ms_p50", "roundtrip_p50_ratio_disk_over_redis"),
    ("roundtrip_ms_p99", None),
    ("backlog_msgs", None),
    ("rss_total_mb", "rss_ratio_disk_over_redis"),
    ("rss_hourglass_mb", None),
    ("rss_redis_mb", None),
    ("redis_used_memory_mb", None),
    ("disk_bytes_per_msg", None),
    ("restart_s", "restart_ratio_disk_over_redis"),
    ("restart_full_s", "restart_full_ratio_disk_over_redis"),
)
HEADLINES = ("ingest_batch_msgs_per_s", "ingest_single_msgs_per_s", "lateness_ms_p50", "lateness_ms_p99",
             "lateness_ms_max", "early", "lost", "duplicates", "roundtrip_ms_p50", "roundtrip_ms_p99")


def figures(headline: dict, details: dict, backlog_scenario: str) -> dict:
    """One backend's figures, by the names of ROWS."""
    out = {k: headline[k] for k in HEADLINES if k in headline}
    for scenario in ("ingest-batch", "ingest-single"):
        d = details.get(scenario, {})
        if d.get("msgs"):
            cpu_s = d.get("server_cpu_s", 0) + d.get("redis_cpu_s", 0)
            out[f"{scenario.replace('-', '_')}_server_cpu_us_per_msg"] = round(cpu_s / d["msgs"] * 1e6, 1)
    backlog = details.get(backlog_scenario, {})
    if "rss_total_mb" in backlog:
        redis_memory = backlog.get("backend_memory", {})
        out.update({"backlog_msgs": backlog["msgs"], "rss_total_mb": backlog["rss_total_mb"],
                    "rss_hourglass_mb": backlog["memory"]["rss_mb"], "disk_bytes_per_msg": backlog["disk_bytes_per_msg"]})
        if redis_memory:
            out.update({"rss_redis_mb": redis_memory["rss_mb"], "redis_used_memory_mb": redis_memory["used_memory_mb"]})
        out["restart_s"] = headline.get(backlog_scenario.replace("backlog-", "restart_s_"))
        # Every process that holds the backlog: on disk that is hourglass, so
        # restart_s; on Redis only measured with AOF (else it comes back empty).
        out["restart_full_s"] = backlog.get("restart_with_redis_s") if redis_memory else out["restart_s"]
    return out


def ratio(disk, redis_value) -> float | None:
    if isinstance(disk, (int, float)) and isinstance(redis_value, (int, float)) and redis_value:
        return round(disk / redis_value, 3)
    return None


def table(by_backend: dict[str, dict], ratios: dict[str, float | None]) -> str:
    def cell(value) -> str:
        if value is None:
            return "-"
        return f"{value:,}" if isinstance(value, int) or abs(value) >= 1000 else f"{value:g}"
    lines = [f"{'figure':<38}{'disk':>14}{'redis':>14}{'disk/redis':>12}"]
    for figure, _ in ROWS:
        disk, red = by_backend["disk"].get(figure), by_backend["redis"].get(figure)
        if disk is None and red is None:
            continue
        lines.append(f"{figure:<38}{cell(disk):>14}{cell(red):>14}{cell(ratios.get(figure)):>12}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = http_load.build_parser(__doc__)
    parser.add_argument("--redis-appendonly", choices=("no", "everysec", "always"), default="no",
                        help="redis-server's AOF: no (default: no persistence at all), or its appendfsync policy")
    parser.add_argument("--redis-server", default=shutil.which("redis-server"),
                        help="the redis-server program (default: the one on PATH)")
    args = http_load.parse_args(argv, parser)
    if not args.redis_server:
        parser.error("no redis-server on PATH (apt-get install -y redis-server) and no --redis-server given")
    unwind_on_signals()
    work_dir = http_load.make_work_dir(args)
    backends = {"disk": DiskBackend(), "redis": RedisBackend(os.path.join(work_dir, "redis"), args.redis_server,
                                                             args.redis_appendonly)}
    benches: dict[str, Bench] = {}
    for name, backend in backends.items():
        os.makedirs(os.path.join(work_dir, name))
        benches[name] = Bench(args, os.path.join(work_dir, name), backend)
    headlines: dict[str, dict] = {name: {} for name in benches}
    details: dict[str, dict] = {name: {} for name in benches}
    failed = False
    try:
        redis_used = backends["redis"].describe()
        log(f"redis-server {redis_used['version']}, persistence: {redis_used['persistence']}")
        machine = http_load.machine_info()
        runs = {name: http_load.scenario_runs(bench) for name, bench in benches.items()}
        for i, (scenario, _) in enumerate(runs["disk"]):
            for name in benches:
                log(f"=== {scenario} on {name}")
                headline, details[name][scenario], ok = http_load.run_scenario(f"{name} {scenario}", runs[name][i][1])
                headlines[name].update(headline)
                failed = failed or not ok
    finally:
        if not args.keep:
            shutil.rmtree(work_dir, ignore_errors=True)
    machine["calibration_ms_after"] = http_load.calibration_ms()
    backlog_scenario = f"backlog-{http_load.count_label(args.backlog_msgs)}"
    by_backend = {name: figures(headlines[name], details[name], backlog_scenario) for name in benches}
    ratios = {figure: ratio(by_backend["disk"].get(figure), by_backend["redis"].get(figure)) for figure, _ in ROWS
              if figure in by_backend["disk"] or figure in by_backend["redis"]}
    problems = [{"backend": name, **p} for name, bench in benches.items() for p in bench.problems]
    out: dict = {key: ratios.get(figure) for figure, key in ROWS if key}
    out.update({
        "ratio_meaning": "disk figure / redis figure: above 1, disk's is larger (better for msgs_per_s, worse for "
                         "times and sizes)",
        "scale": args.scale,
        "counts": {k: getattr(args, k) for k in ("batch_msgs", "single_msgs", "dispatch_msgs", "roundtrip_iters",
                                                 "backlog_msgs")},
        "redis": redis_used,
        "restart_scope": {name: backend.restart_scope for name, backend in backends.items()},
        "figures": by_backend,
        "ratios_disk_over_redis": ratios,
        "machine": machine,
        "source": http_load.source_state(),
        "parameters": vars(args),
        "scenarios": details,
        "problems": problems,
        "total_wall_s": round(time.monotonic() - http_load._started, 2),
    })
    print(table(by_backend, ratios))
    print(json.dumps(out, indent=1), flush=True)
    return 1 if failed or problems else 0


if __name__ == "__main__":
    sys.exit(main())
