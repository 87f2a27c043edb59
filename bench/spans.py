"""Far-future messages: files, checkpoint size and the cost of moving spans.

    .venv/bin/python bench/spans.py [--messages 1000000] [--years 10] [--step-hours 24]

Sends --messages messages (100-byte payloads, batches of 1,000) with
trigger times spread uniformly over --years, then lets the years pass in
steps of --step-hours: at each step every due span's waiting messages are
moved (Store.refile, storage.spans), messages that come due are acked,
and a checkpoint retires what is done (3 days after it ended, as a node
does). --send-only stops after sending. Prints one JSON object:

  files_after_send          files under delay/ once everything is sent
  checkpoint_bytes          the checkpoint file's size then
  send_msgs_per_s           batched sends, fsync'ed per batch
  max_files                 most files under delay/ after any step's checkpoint
  moves_per_msg             MOVE items written / messages
  move_cpu_us_per_move      process CPU per message moved (refile + commit)
  cpu_s                     process CPU of the whole simulated time
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import tempfile
import time

from storage.entry import MS_PER_HOUR, Status
from storage.store import NewMessage, StateChange, Store

NOW_MS = 500_000 * MS_PER_HOUR


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--years", type=float, default=10)
    parser.add_argument("--step-hours", type=int, default=24)
    parser.add_argument("--send-only", action="store_true")
    args = parser.parse_args()
    directory = tempfile.mkdtemp(prefix="hourglass-spans-")
    try:
        print(json.dumps(run(directory, args.messages, args.years, args.step_hours, args.send_only), indent=2))
    finally:
        shutil.rmtree(directory)


def run(directory: str, messages: int, years: float, step_hours: int, send_only: bool) -> dict:
    rnd = random.Random(1)
    spread_ms = int(years * 8766 * MS_PER_HOUR)
    store = Store.open(directory, now_ms=NOW_MS)
    delay = os.path.join(directory, "delay")
    started = time.perf_counter()
    body = "x" * 100
    for b in range(0, messages, 1000):
        store.send([NewMessage("t", str(b + i), body, NOW_MS, NOW_MS + rnd.randrange(spread_ms), 0, 0)
                    for i in range(min(1000, messages - b))], NOW_MS)
        store.commit()
    send_s = time.perf_counter() - started
    store.checkpoint(NOW_MS)
    out = {"messages": messages, "years": years, "files_after_send": len(os.listdir(delay)),
           "checkpoint_bytes": os.path.getsize(os.path.join(directory, "checkpoint")),
           "send_msgs_per_s": round(messages / send_s)}
    if send_only:
        store.close()
        return out
    moves = 0
    move_cpu = 0.0
    max_files = out["files_after_send"]
    cpu0 = time.process_time()
    now = NOW_MS
    end = NOW_MS + spread_ms + 2 * MS_PER_HOUR
    while now < end:
        now = min(now + step_hours * MS_PER_HOUR, end)
        c0 = time.process_time()
        while n := store.refile(now):
            moves += n
            store.commit()
        move_cpu += time.process_time() - c0
        due = [e for hour, _, _ in store.hours() if hour < now // MS_PER_HOUR
               for e in store.hour_entries(hour) if e.status == Status.WAITING and e.trigger_ms <= now]
        if due:  # delivered and acked: their hours can retire
            store.update([StateChange(e.location, Status.ACKED, 0) for e in due], now)
            store.commit()
        store.checkpoint(now)
        max_files = max(max_files, len(os.listdir(delay)))
    store.close()
    out.update(max_files=max_files, moves_per_msg=round(moves / messages, 2),
               move_cpu_us_per_move=round(move_cpu / max(moves, 1) * 1e6, 1),
               cpu_s=round(time.process_time() - cpu0, 1), files_at_end=len(os.listdir(delay)))
    return out


if __name__ == "__main__":
    from storage.files import raise_descriptor_limit

    raise_descriptor_limit()  # as `hourglass serve` does, before any store opens
    main()
