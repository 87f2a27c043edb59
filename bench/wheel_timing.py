"""Timing-wheel benchmark (real clock, one process, the storage engine
underneath): prints one JSON object.

    .venv/bin/python bench/wheel_timing.py

Scenarios, each on a fresh data directory:
  window   20,000 messages due across a 10 s window starting a few seconds
           ahead: lateness of each release (wall ms at delivery minus its
           trigger ms) -> lateness_ms_p50 / p99 / max; early = releases
           before their trigger (must be 0)
  burst    100,000 messages due at the same millisecond T:
           burst_release_s = (time the last is released) - T
  idle     one message pending 2 h ahead: CPU seconds the process burns
           per minute of waiting, and the dispatcher's wake-ups
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import tempfile
import time

from harness import percentile

from broker.clock import SystemClock
from storage.config import StoreConfig
from storage.store import NewMessage, Store
from wheel.driver import WheelDriver
from wheel.scheduler import Scheduler
from wheel.tick_state import TickStateFile

PAYLOAD = "x" * 100


class Run:
    """A store, a scheduler and a driver on the real clock, recording every
    release's lateness."""

    def __init__(self, directory: str) -> None:
        self.clock = SystemClock()
        now_ms = self.clock.now_ms()
        self.store = Store.open(directory, StoreConfig(), now_ms=now_ms)
        self.scheduler = Scheduler(self.store, None, now_ms)
        self.ticks = TickStateFile(os.path.join(directory, "tick"))
        self.lateness_ms: list[float] = []
        self.last_release_wall_ms = 0.0
        self.driver = WheelDriver(self.scheduler, self.clock, self._deliver, persist_tick=self.ticks.write)

    def _deliver(self, entries) -> None:
        wall_ms = time.time_ns() / 1e6
        self.lateness_ms.extend(wall_ms - e.trigger_ms for e in entries)
        self.last_release_wall_ms = wall_ms

    async def send(self, triggers: list[int], prefix: str, batch: int = 1000) -> None:
        """Store messages in batches (one commit each) and offer the new
        entries to the scheduler, yielding to the loop between batches."""
        for start in range(0, len(triggers), batch):
            now_ms = self.clock.now_ms()
            self.store.send([NewMessage("bench", f"{prefix}{i}", PAYLOAD, now_ms, triggers[i], 60_000, 3)
                             for i in range(start, min(len(triggers), start + batch))], now_ms)
            for entry in self.store.commit():
                self.scheduler.on_new(entry)
            await asyncio.sleep(0)

    async def wait_for(self, count: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.lateness_ms) < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {len(self.lateness_ms)} of {count} released in {timeout_s} s")
            await asyncio.sleep(0.05)

    def close(self) -> None:
        self.ticks.close()
        self.store.close()


async def scenario_window(directory: str, count: int, window_ms: int, lead_ms: int) -> dict:
    run = Run(directory)
    task = asyncio.create_task(run.driver.run())
    start_ms = run.clock.now_ms() + lead_ms
    triggers = [start_ms + i * window_ms // count for i in range(count)]
    await run.send(triggers, "w")
    await run.wait_for(count, timeout_s=lead_ms / 1000 + window_ms / 1000 + 30)
    run.driver.stop()
    await task
    run.close()
    late = sorted(run.lateness_ms)
    return {"lateness_ms_p50": percentile(late, 0.50), "lateness_ms_p99": percentile(late, 0.99),
            "lateness_ms_max": percentile(late, 1.0), "early": sum(1 for x in late if x < 0), "released": len(late)}


async def scenario_burst(directory: str, count: int, lead_ms: int) -> dict:
    run = Run(directory)
    task = asyncio.create_task(run.driver.run())
    trigger_ms = (run.clock.now_ms() + lead_ms) // 1000 * 1000
    t0 = time.perf_counter()
    await run.send([trigger_ms] * count, "b")
    send_s = time.perf_counter() - t0
    await run.wait_for(count, timeout_s=lead_ms / 1000 + 60)
    run.driver.stop()
    await task
    run.close()
    return {"burst_release_s": round((run.last_release_wall_ms - trigger_ms) / 1000, 3),
            "burst_stored_s": round(send_s, 2), "burst_early": sum(1 for x in run.lateness_ms if x < 0)}


async def scenario_idle(directory: str, seconds: float) -> dict:
    run = Run(directory)
    await run.send([run.clock.now_ms() + 2 * 3600 * 1000], "idle")
    task = asyncio.create_task(run.driver.run())
    await asyncio.sleep(0.2)
    polls_before = run.scheduler.stats.polls
    cpu0, t0 = time.process_time(), time.perf_counter()
    await asyncio.sleep(seconds)
    cpu_s, wall_s = time.process_time() - cpu0, time.perf_counter() - t0
    polls = run.scheduler.stats.polls - polls_before
    run.driver.stop()
    await task
    run.close()
    return {"idle_cpu_s_per_min": round(cpu_s / wall_s * 60, 4), "idle_wakeups": polls, "idle_measured_s": round(wall_s, 1)}


async def main_async(args) -> dict:
    base = tempfile.mkdtemp(prefix="hourglass-wheel-")
    try:
        out = {}
        out.update(await scenario_window(os.path.join(base, "w"), args.window_messages, 10_000, args.lead_ms))
        out.update(await scenario_burst(os.path.join(base, "b"), args.burst_messages, args.burst_lead_ms))
        out.update(await scenario_idle(os.path.join(base, "i"), args.idle_s))
        return out
    finally:
        shutil.rmtree(base, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--window-messages", type=int, default=20_000)
    parser.add_argument("--lead-ms", type=int, default=4_000, help="time from start until the window opens")
    parser.add_argument("--burst-messages", type=int, default=100_000)
    parser.add_argument("--burst-lead-ms", type=int, default=15_000)
    parser.add_argument("--idle-s", type=float, default=20.0)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(main_async(args))))


if __name__ == "__main__":
    from storage.files import raise_descriptor_limit

    raise_descriptor_limit()  # as `hourglass serve` does, before any store opens
    main()
