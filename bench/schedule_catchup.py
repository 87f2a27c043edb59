"""What recurring schedules cost the event loop: a restart a day behind,
and the console's forecast. N every-second cron schedules (`* * * * * *`,
misfire=once) are put by a node whose clock is a day behind, in this
process (a real Store, Broker and schedules file on the data dir, a fake
clock: the node then stopped as `hourglass serve` stops), so the data dir
is one a node left a day ago: each schedule's pending run a message due a
day ago. Then `hourglass serve` opens it at the real time, while a thread
times /health every 10 ms; then the console's forecast is asked for
--forecasts times, /health timed the same way. Prints ONE JSON object.

    PYTHONPATH=tests .venv/bin/python bench/schedule_catchup.py                     # 10,000 schedules a day behind
    PYTHONPATH=tests .venv/bin/python bench/schedule_catchup.py --schedules 100 --behind-s 600
    .venv/bin/python bench/schedule_catchup.py --live --serve-flags="--shards 2"    # put live, then steady
    .venv/bin/python bench/schedule_catchup.py --live --serve-flags="--backend redis://127.0.0.1:6379/0"

--live: no day-behind data dir (its store is one shard's): a fresh node
started with --serve-flags (serve's default node, a node of shards, a
Redis node), the N schedules put over HTTP (putSchedule, 8 at a time;
put_s), then, once each has made a run (hourglass_node_schedule_runs_total
>= N), /health timed for --steady-s: steady_health_ms only.

  ready_s               from the spawn until /health answered 200 (the
                        data dir opened, the schedules file read)
  caught_up_s           from the spawn until every schedule's late run was
                        followed (hourglass_node_schedule_runs_total = N)
  missed                hourglass_node_schedule_missed_total then (each
                        schedule: its late run and the runs never made)
  restart_health_ms     /health's answer time from the first 200 until
                        caught up: count, p50, p99, max
  forecast_ms           each /console/api/forecast call: p50, max
  steady_health_ms      /health's answer time for --steady-s after that, the
                        schedules firing and nothing else asked
  forecast_health_ms    /health's answer time while the forecasts ran
  schedule_runs, cut    the forecast's scheduleRuns and scheduleRunsCut

The node runs this tree's broker, pure Python, or the build installed for
HOURGLASS_SERVE_PYTHON (bench/harness.py); `build` says which. The data
dir is written by the hourglass installed for this script's interpreter,
with the tests' FakeClock (tests/fakes.py, hence PYTHONPATH=tests). A short
run; the machine should be quiet all the same (the figures are latencies).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import os
import re
import shlex
import tempfile
import threading
import time
from typing import Any

from harness import Server, free_port, percentile, request, serve_version, wait_until

TOPIC = "sched"
CRON = "* * * * * *"


def write_day_behind(data_dir: str, count: int, behind_ms: int, cron: str = CRON) -> int:
    """A data dir a node left `behind_ms` ago with `count` schedules of
    `cron` (ids s00000...): put by a node whose clock was that far behind,
    stopped as serve stops (a checkpoint). The nominal time of their
    pending runs (all the same)."""
    from fakes import FakeClock

    from broker.core.params import Defaults
    from broker.core.recurrence import Misfire
    from broker.disk.backend import Broker
    from broker.observe.metrics import Metrics
    from broker.schedules.file import ScheduleFile, schedules_path
    from broker.schedules.keeper import ScheduleLimits, Schedules
    from broker.schedules.params import ScheduleSpec
    from storage.config import StoreConfig
    from storage.store import Store

    then_ms = int(time.time() * 1000) - behind_ms
    clock = FakeClock(then_ms)
    os.makedirs(data_dir, mode=0o700, exist_ok=True)

    async def make() -> int:
        store = Store.open(data_dir, StoreConfig(), now_ms=then_ms)
        broker = Broker(store, clock, Defaults(), Metrics(), tick_path=os.path.join(data_dir, "tick"))
        schedules = Schedules(ScheduleFile(schedules_path(data_dir)), clock,
                              ScheduleLimits(max_schedules=count, max_bytes=1 << 40))
        broker.on_release = schedules.on_release
        broker.start()
        schedules.start(broker)
        specs = [ScheduleSpec(TOPIC, f"s{i:05d}", cron, None, "UTC", "run", 3_600_000, 3, 0, "", "",
                              then_ms - 60_000, None, None, 0, Misfire.ONCE, 60_000, 10) for i in range(count)]
        states = await asyncio.gather(*(schedules.put(spec, None) for spec in specs))
        pending = states[0].pending
        assert pending is not None
        await schedules.stop()
        schedules.close()
        await broker.stop()
        store.checkpoint(clock.now_ms())
        store.close()
        return pending

    return asyncio.run(make())


class HealthTimer(threading.Thread):
    """Times GET /health every `every_s` (a new connection each) until stopped."""

    def __init__(self, base: str, every_s: float = 0.01) -> None:
        super().__init__(daemon=True)
        self.base, self.every_s = base, every_s
        self.times_ms: list[float] = []
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set():
            started = time.perf_counter()
            status, _ = request(self.base + "/health", timeout=60)
            if status == 200:
                self.times_ms.append((time.perf_counter() - started) * 1000)
            self.stopped.wait(self.every_s)

    def stop(self) -> dict[str, Any]:
        self.stopped.set()
        self.join()
        done = sorted(self.times_ms)
        return {"count": len(done), "p50": _ms(percentile(done, 0.5)), "p99": _ms(percentile(done, 0.99)),
                "max": _ms(done[-1] if done else None)}


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def metric(base: str, name: str) -> float:
    status, body = request(base + "/metrics")
    found = re.search(rf"^{name} (\S+)$", body.decode(), re.M) if status == 200 else None
    return float(found.group(1)) if found else 0.0


def main(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="hourglass-schedule-catchup-") as root:
        data = os.path.join(root, "data")
        pending = write_day_behind(data, args.schedules, args.behind_s * 1000)
        started = time.monotonic()
        server = Server.spawn(data, "--port", str(port := free_port()), "--max-schedules", str(args.schedules),
                              base=f"http://127.0.0.1:{port}", log_path=os.path.join(root, "serve.log"))
        try:
            ready_s = server.wait_healthy(300)
            timer = HealthTimer(server.base)
            timer.start()
            wait_until(lambda: metric(server.base, "hourglass_node_schedule_runs_total") >= args.schedules, 600,
                       "every schedule's late run followed", server.process, every_s=0.05)
            caught_up_s = time.monotonic() - started
            restart = timer.stop()
            missed = metric(server.base, "hourglass_node_schedule_missed_total")
            timer = HealthTimer(server.base)
            timer.start()
            time.sleep(args.steady_s)  # the schedules firing, nothing else asked
            steady = timer.stop()
            timer = HealthTimer(server.base)
            timer.start()
            took, answer = [], {}
            for _ in range(args.forecasts):
                t = time.perf_counter()
                status, raw = request(server.base + "/console/api/forecast", timeout=120)
                took.append((time.perf_counter() - t) * 1000)
                assert status == 200, raw[:500]
                answer = json.loads(raw)
            forecast_health = timer.stop()
        finally:
            server.stop()
    took.sort()
    return {"build": serve_version(), "schedules": args.schedules, "behind_s": args.behind_s,
            "pending_ms": pending, "ready_s": round(ready_s, 3), "caught_up_s": round(caught_up_s, 3),
            "missed": missed, "restart_health_ms": restart, "steady_health_ms": steady,
            "forecast_ms": {"p50": _ms(percentile(took, 0.5)), "max": _ms(took[-1])},
            "forecast_health_ms": forecast_health, "schedule_runs": answer.get("scheduleRuns"),
            "cut": answer.get("scheduleRunsCut")}


def live(args: argparse.Namespace) -> dict[str, Any]:
    """--live: the schedules put over HTTP on a fresh node of --serve-flags, then the steady /health."""
    with tempfile.TemporaryDirectory(prefix="hourglass-schedule-live-") as root:
        server = Server.spawn(os.path.join(root, "data"), "--port", str(port := free_port()),
                              "--max-schedules", str(args.schedules), *shlex.split(args.serve_flags),
                              base=f"http://127.0.0.1:{port}", log_path=os.path.join(root, "serve.log"))
        try:
            server.wait_healthy(300)
            started = time.monotonic()

            def put(i: int) -> None:
                status, raw = request(f"{server.base}/camellia/delayQueue/putSchedule",
                                      data=f"topic={TOPIC}&scheduleId=s{i:05d}&cron={CRON}&msg=run".encode(),
                                      headers={"Content-Type": "application/x-www-form-urlencoded"})
                assert status == 200, raw[:300]
            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                list(pool.map(put, range(args.schedules)))
            put_s = time.monotonic() - started
            wait_until(lambda: metric(server.base, "hourglass_node_schedule_runs_total") >= args.schedules, 600,
                       "a run of every schedule", server.process, every_s=0.05)
            timer = HealthTimer(server.base)
            timer.start()
            time.sleep(args.steady_s)  # the schedules firing, nothing else asked
            steady = timer.stop()
        finally:
            server.stop()
    return {"build": serve_version(), "schedules": args.schedules, "serve_flags": args.serve_flags,
            "put_s": round(put_s, 3), "steady_health_ms": steady}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--schedules", type=int, default=10_000)
    p.add_argument("--behind-s", type=int, default=86_400, help="how long ago the node stopped")
    p.add_argument("--forecasts", type=int, default=5, help="console forecasts asked for, one after another")
    p.add_argument("--steady-s", type=float, default=5.0,
                   help="seconds /health is timed after the catch-up with nothing else asked (the schedules firing)")
    p.add_argument("--live", action="store_true", help="put the schedules over HTTP on a fresh node (above)")
    p.add_argument("--serve-flags", default="", help="with --live: more flags for hourglass serve")
    return p.parse_args()


if __name__ == "__main__":
    arguments = parse_args()
    print(json.dumps(live(arguments) if arguments.live else main(arguments)))
