"""What opening a schedules file costs in memory: N every-minute schedules
(each with its last runs full) written as one file, then opened in a
fresh process as a restarted node opens it (broker.schedules.file, then
broker.schedules.keeper building the states), its memory read from
/proc/self/status at each step. Prints ONE JSON object.

    PYTHONPATH=tests .venv/bin/python bench/schedule_open.py                     # 100,000 schedules
    PYTHONPATH=tests .venv/bin/python bench/schedule_open.py --schedules 10000

It opens the file with the hourglass installed for the interpreter
(`build` says which: a compiled build's states are smaller), and the
tests' FakeClock (tests/fakes.py, hence PYTHONPATH=tests).

  file_bytes            the schedules file
  start, opened, built  bench/harness.py memory_mb of the opening process:
                        before, after ScheduleFile opened it, after
                        Schedules built its states (and the file's rows
                        were let go)

No fsync, no node, no timing: the figures are the process's memory.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time

from harness import memory_mb

from broker.build_info import describe


def memory() -> dict[str, float]:
    return memory_mb(os.getpid())


def make(path: str, count: int) -> None:
    from broker.core.params import Defaults
    from broker.schedules.file import LAST_RUNS, ScheduleFile
    from broker.schedules.keeper import ScheduleState
    from broker.schedules.params import parse_put_schedule

    file = ScheduleFile(path, fsync=False)
    now = int(time.time() * 1000)
    for at in range(0, count, 1000):
        records = []
        for i in range(at, min(count, at + 1000)):
            spec, _ = parse_put_schedule({"topic": f"sched{i % 8}", "scheduleId": f"s{i:07d}",
                                          "cron": f"{i % 60} * * * * *", "msg": "run", "ttlMillis": "3600000"},
                                         now_ms=now, defaults=Defaults(), max_msg_bytes=65536)
            state = ScheduleState(spec, spec.recurrence(), 1, pending=now + 60_000, runs=LAST_RUNS + 1)
            for k in range(LAST_RUNS):
                state.note_release(now - (LAST_RUNS - k) * 60_000, 5, False)
            records.append({"put": state.row()})
        file.append(records)
    file.close()


def open_it(path: str) -> dict[str, object]:
    from fakes import FakeClock

    from broker.schedules.file import ScheduleFile
    from broker.schedules.keeper import Schedules

    start = memory()
    file = ScheduleFile(path, fsync=False)
    opened = memory()
    schedules = Schedules(file, FakeClock(now_ms=1_000))
    gc.collect()
    built = memory()
    return {"schedules": len(schedules), "start": start, "opened": opened, "built": built}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--schedules", type=int, default=100_000)
    p.add_argument("--open", help=argparse.SUPPRESS)  # (the child: open this file)
    args = p.parse_args()
    if args.open:
        print(json.dumps(open_it(args.open)))
        return
    with tempfile.TemporaryDirectory(prefix="hourglass-schedule-open-") as root:
        path = os.path.join(root, "schedules")
        make(path, args.schedules)
        child = subprocess.run([sys.executable, os.path.abspath(__file__), "--open", path], capture_output=True,
                               text=True, check=True)
        result = {"build": describe(), "file_bytes": os.path.getsize(path), **json.loads(child.stdout)}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
