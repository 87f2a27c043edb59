"""Recurring schedules in process, deterministic: N every-minute schedules
(cron `* * * * *`, misfire=once) on a disk Broker (real Store, a fake
clock), the clock moved minute by minute, each minute's runs pulled and
acked. No timing: call counts (cProfile) and bytes (tracemalloc). Prints
ONE JSON object.

    .venv/bin/python -m bench.schedules_profile                     # 10,000 schedules, 3 minutes
    .venv/bin/python -m bench.schedules_profile --top 30            # and cProfile's 30 costliest functions
    .venv/bin/python -m bench.schedules_profile --memory-top 15     # and tracemalloc's 15 largest sites

Run as a module from the project root: the folder it is run from is then
first on the import path, so it profiles this checkout's sources, pure
Python (the counts are Python calls; it also counts the Broker's sends by
replacing its method, which a compiled Broker does not allow), with the
tests' FakeClock (tests/fakes.py).

What it reports:

  runs                  runs released in the minutes profiled (each minute's N)
  calls_per_run         Python calls (cProfile's total) a run, over the
                        minutes profiled: its release, its next run's state
                        write and send, and its pull and ack
  schedule_calls_per_run  the calls the schedules' own code makes a run
                        (a call into the backend counts one) and the calls
                        into it: its share of calls_per_run
  cpu_share             cProfile's cumulative time under some functions of
                        the path (SHARES), over the total: where it goes, not
                        how long (cProfile's own cost inflates small calls)
  state_writes, sends   writes to the schedules' store and backend sends the
                        worker made in the minutes profiled
  store_bytes_per_run   bytes the schedules file grew a run
  bytes_per_schedule_put  tracemalloc: what the schedules' state holds
                        once put, over N (allocations made in
                        SCHEDULE_FILES, and the specs this script makes)
  bytes_per_schedule    the same after --history-minutes minutes of runs
                        (each schedule's last runs and counts filled)
  minute_peak_bytes_per_schedule  the most the heap grew during one
                        minute's releases, next runs, pulls and acks, over
                        N: what a minute's batch holds at once
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import io
import json
import os
import pstats
import shutil
import sys
import tempfile
import tracemalloc
from typing import Any

from broker.core.params import Defaults, PullRequest
from broker.core.recurrence import Misfire
from broker.disk.backend import Broker
from broker.observe.metrics import Metrics
from broker.schedules.file import ScheduleFile
from broker.schedules.keeper import ScheduleLimits, Schedules
from broker.schedules.params import ScheduleSpec
from storage.config import StoreConfig
from storage.store import Store
from tests.fakes import FakeClock

MINUTE_MS = 60_000
START_MS = 1_750_000_020_000  # 20 s into a minute
TOPICS = 8
# functions whose cumulative share of the profiled time is reported
SHARES = ("broker/disk/messages.py:_release", "broker/schedules/keeper.py:on_release", "broker/schedules/keeper.py:_advance",
          "broker/core/recurrence.py:released", "broker/schedules/keeper.py:_write", "broker/disk/requests.py:send",
          "broker/disk/requests.py:pull", "broker/disk/requests.py:ack_many")
SCHEDULE_FILES = ("bench/schedules_profile.py", "broker/schedules/keeper.py", "broker/schedules/params.py", "broker/core/recurrence.py",
                  "broker/schedules/file.py")


class Counting:
    """Counts the worker's state writes and sends."""

    def __init__(self, schedules: Schedules, broker: Broker) -> None:
        self.writes = 0
        self.sends = 0
        store = schedules._file
        name = "write_runs" if hasattr(store, "write_runs") else "write"  # (a batch's progress, where it has it)
        setattr(store, name, self._counted(getattr(store, name)))
        send = broker.send

        async def counted_send(sends: Any) -> Any:
            self.sends += 1
            return await send(sends)
        broker.send = counted_send  # type: ignore[method-assign]

    def _counted(self, write: Any) -> Any:
        async def counted_write(records: Any) -> None:
            self.writes += 1
            await write(records)
        return counted_write


async def drain(broker: Broker) -> int:
    taken = 0
    for t in range(TOPICS):
        while True:
            batch = await broker.pull(PullRequest(f"sched{t}", 60_000, 500, ()))
            if not batch:
                break
            taken += len(batch)
            await broker.ack_many(f"sched{t}", [m.msg_id for m in batch])
    return taken


async def settle(clock: FakeClock, broker: Broker, schedules: Schedules | None = None) -> None:
    """Until the broker is idle and the schedules' worker has followed every release."""
    while True:
        for _ in range(3):
            await clock.settle()
            await broker.commits.flush()
        await clock.settle()
        if schedules is None or _idle(schedules):
            return
        await asyncio.sleep(0.001)


def schedule_bytes(snapshot: tracemalloc.Snapshot, before: tracemalloc.Snapshot) -> int:
    stats = snapshot.compare_to(before, "filename")
    return sum(s.size_diff for s in stats if s.traceback[0].filename.endswith(SCHEDULE_FILES))


async def main(args: argparse.Namespace) -> dict[str, Any]:
    directory = tempfile.mkdtemp(prefix="hourglass-schedprof-", dir="/dev/shm" if os.access("/dev/shm", os.W_OK)
                                 else None)
    clock = FakeClock(START_MS)
    clock.watch_threads()
    store = Store.open(directory, StoreConfig(), now_ms=START_MS)
    broker = Broker(store, clock, Defaults(), Metrics(), tick_path=os.path.join(directory, "tick"))
    path = os.path.join(directory, "schedules")
    schedules = Schedules(ScheduleFile(path, fsync=False), clock,
                          ScheduleLimits(max_schedules=args.schedules + 1, max_bytes=1 << 40))
    broker.on_release = schedules.on_release
    broker.start()
    schedules.start(broker)
    await settle(clock, broker, schedules)
    out: dict[str, Any] = {"schedules": args.schedules, "minutes": args.minutes}
    try:
        gc.collect()
        tracemalloc.start(1)
        before = tracemalloc.take_snapshot()
        for first in range(0, args.schedules, 1000):  # puts in groups, as concurrent clients' share a write
            specs = [ScheduleSpec(f"sched{i % TOPICS}", f"s{i:07d}", "* * * * *", None, "UTC", "run", 3_600_000, 3,
                                  0, "", "", START_MS, None, None, 0, Misfire.ONCE, 60_000, 10)
                     for i in range(first, min(args.schedules, first + 1000))]
            await asyncio.gather(*(schedules.put(spec, None) for spec in specs))
        await settle(clock, broker, schedules)
        gc.collect()
        put = tracemalloc.take_snapshot()
        out["bytes_per_schedule_put"] = round(schedule_bytes(put, before) / args.schedules, 1)
        # minutes of runs under tracemalloc: each schedule's last runs and counts filled, and the
        # largest heap a minute's releases and next runs took above what it started with
        minute = (clock.now_ms() // MINUTE_MS + 1) * MINUTE_MS
        peak = 0
        for _ in range(args.history_minutes):
            gc.collect()
            start, _ = tracemalloc.get_traced_memory()
            tracemalloc.reset_peak()
            await clock.run_until(minute + 1)
            await settle(clock, broker, schedules)
            await drain(broker)
            peak = max(peak, tracemalloc.get_traced_memory()[1] - start)
            minute += MINUTE_MS
        gc.collect()
        after = tracemalloc.take_snapshot()
        out["bytes_per_schedule"] = round(schedule_bytes(after, before) / args.schedules, 1)
        out["minute_peak_bytes_per_schedule"] = round(peak / args.schedules, 1)
        if args.memory_top:
            out["memory_top"] = [f"{s.traceback[0].filename.split('/work/main/')[-1]}:{s.traceback[0].lineno} "
                                 f"{s.size_diff / args.schedules:.1f} B/schedule"
                                 for s in after.compare_to(before, "lineno")[:args.memory_top]]
        tracemalloc.stop()
        del before, put, after
        counting = Counting(schedules, broker)
        file_before = size_of(path)
        profile = cProfile.Profile()
        runs = 0
        profile.enable()
        for _ in range(args.minutes):
            await clock.run_until(minute + 1)
            await settle(clock, broker, schedules)
            runs += await drain(broker)
            minute += MINUTE_MS
        profile.disable()
        stats = pstats.Stats(profile)
        total_calls = sum(v[1] for v in stats.stats.values())  # type: ignore[attr-defined]
        out.update(runs=runs, calls_per_run=round(total_calls / max(1, runs), 1),
                   state_writes=counting.writes, sends=counting.sends,
                   store_bytes_per_run=round((size_of(path) - file_before) / max(1, runs), 1),
                   schedule_calls_per_run=round(_own_calls(stats) / max(1, runs), 1),
                   cpu_share={name: round(share, 3) for name, share in _shares(stats).items()})
        if args.top:
            stream = io.StringIO()
            pstats.Stats(profile, stream=stream).sort_stats("tottime").print_stats(args.top)
            print(stream.getvalue(), file=sys.stderr)
            stream = io.StringIO()
            pstats.Stats(profile, stream=stream).sort_stats("cumulative").print_stats(args.top)
            print(stream.getvalue(), file=sys.stderr)
    finally:
        await schedules.stop()
        schedules.close()
        await broker.stop()
        store.close()
        shutil.rmtree(directory, ignore_errors=True)
    return out


def _idle(schedules: Schedules) -> bool:
    idle = getattr(schedules, "idle", None)  # (a build before Schedules.idle: its own fields)
    return bool(idle()) if idle is not None else not (schedules._released or schedules._lock.locked())


def size_of(path: str) -> int:
    return os.path.getsize(path)


def _own_calls(stats: pstats.Stats) -> int:
    """Calls the schedules' code makes (functions of SCHEDULE_FILES calling
    anything: a call into the backend counts one, not what it does), and
    the calls into it from elsewhere (the disk release's on_release)."""
    table = stats.stats  # type: ignore[attr-defined]
    own = SCHEDULE_FILES[1:]
    total = 0
    for (filename, _, _), (_, _, _, _, callers) in table.items():
        for (caller_file, _, _), edge in callers.items():
            if caller_file.endswith(own) or filename.endswith(own):
                total += edge[0]
    return total


def _shares(stats: pstats.Stats) -> dict[str, float]:
    """Cumulative profiled time under some functions of the path, over the total."""
    table = stats.stats  # type: ignore[attr-defined]
    total = stats.total_tt  # type: ignore[attr-defined]
    shares: dict[str, float] = {}
    for (filename, _, function), (_, _, _, cumulative, _) in table.items():
        for name in SHARES:
            module, _, wanted = name.partition(":")
            if function == wanted and filename.endswith(module):
                shares[name] = shares.get(name, 0.0) + cumulative / max(1e-9, total)
    return shares


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--schedules", type=int, default=10_000)
    p.add_argument("--minutes", type=int, default=3, help="minutes profiled (after a first one not)")
    p.add_argument("--history-minutes", type=int, default=11, help="minutes run under tracemalloc first")
    p.add_argument("--top", type=int, default=0, help="print cProfile's costliest functions to stderr")
    p.add_argument("--memory-top", type=int, default=0, help="the largest allocation sites, per schedule")
    return p.parse_args()


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(parse_args()))))
