"""Storage-engine benchmark: prints one JSON object.

    .venv/bin/python bench/engine.py [--messages 1000000] [--batch 1000]

Figures (each phase runs in a fresh child process so RSS is its own):
  append_msgs_per_s        batched sends (100-byte payloads, fsync=batch,
                           one commit per batch), triggers spread over 30 days
  append_near_msgs_per_s   the same with triggers within the next hour
                           (only memory-mapped files touched)
  rss_growth_mb_1m         RSS after storing --messages pending (30 days
                           spread, checkpointed every second as the broker
                           does) minus RSS of the opened empty store
  disk_bytes_per_msg       bytes allocated on disk by the data dir / messages
  reopen_s_1m              Store.open after SIGKILL of the writer, until ready
  read_us_per_msg_10       read_second of a second holding 10 messages, per msg
  read_us_per_msg_10000    the same for 10,000 messages
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from harness import memory_mb

from storage.config import FsyncPolicy, StoreConfig
from storage.entry import hour_and_second
from storage.store import NewMessage, Store

DAY_MS = 24 * 3600 * 1000
PAYLOAD = "x" * 100


def disk_parts(directory: str) -> dict[str, int]:
    """Allocated bytes by kind of file: where the disk goes."""
    parts: dict[str, int] = {}
    for root, _, names in os.walk(directory):
        for name in names:
            kind = os.path.basename(root) + "/*" + os.path.splitext(name)[1] if root != directory else name
            parts[kind] = parts.get(kind, 0) + os.stat(os.path.join(root, name)).st_blocks * 512
    return parts


def batches(count: int, batch: int, now_ms: int, spread_ms: int, seed: int):
    rng = random.Random(seed)
    for start in range(0, count, batch):
        yield [NewMessage("bench", f"m{i:09d}", PAYLOAD, now_ms, now_ms + rng.randrange(1000, spread_ms), 60_000, 3)
               for i in range(start, min(count, start + batch))]


def child_fill(directory: str, count: int, batch: int, spread_ms: int, checkpoint_every_s: float, kill_wait: bool) -> None:
    """Write `count` messages, report figures as JSON on stdout; if
    `kill_wait`, then print READY and sleep until killed."""
    now_ms = int(time.time() * 1000)
    store = Store.open(directory, StoreConfig(fsync=FsyncPolicy.BATCH), now_ms=now_ms)
    rss_before = memory_mb(os.getpid())["rss_mb"]
    elapsed = 0.0
    last_checkpoint = time.perf_counter()
    for msgs in batches(count, batch, now_ms, spread_ms, seed=1):
        t0 = time.perf_counter()  # building the batch is the client's work: not timed
        store.send(msgs, now_ms)
        store.commit()
        if t0 - last_checkpoint >= checkpoint_every_s:
            store.checkpoint(now_ms)
            last_checkpoint = time.perf_counter()
        elapsed += time.perf_counter() - t0
    store.checkpoint(now_ms)
    del msgs
    out = {"msgs_per_s": count / elapsed, "rss_growth_mb": memory_mb(os.getpid())["rss_mb"] - rss_before,
           "disk_bytes": store.disk_bytes(), "disk_parts": disk_parts(directory), "now_ms": now_ms}
    print(json.dumps(out), flush=True)
    if kill_wait:
        print("READY", flush=True)
        time.sleep(3600)
    store.close()


def child_reopen(directory: str) -> None:
    t0 = time.perf_counter()
    store = Store.open(directory, StoreConfig(fsync=FsyncPolicy.BATCH))
    opened = time.perf_counter() - t0
    total = sum(entries for _, entries, _ in store.hours())
    print(json.dumps({"reopen_s": opened, "entries": total}), flush=True)


def child_read(directory: str) -> None:
    now_ms = int(time.time() * 1000)
    store = Store.open(directory, StoreConfig(fsync=FsyncPolicy.BATCH), now_ms=now_ms)
    out = {}
    for n, offset_s in ((10, 5), (10_000, 7)):
        trigger = (now_ms // 1000 + offset_s) * 1000
        for start in range(0, n, 1000):
            store.send([NewMessage("bench", f"r{n}-{i}", PAYLOAD, now_ms, trigger + i % 1000, 60_000, 3)
                        for i in range(start, min(n, start + 1000))], now_ms)
            store.commit()
        hour, second = hour_and_second(trigger)
        reps = max(1, 20_000 // n)
        t0 = time.perf_counter()
        for _ in range(reps):
            got = store.read_second(hour, second)
        per_msg_us = (time.perf_counter() - t0) / (reps * n) * 1e6
        assert len(got) == n, (len(got), n)
        out[f"read_us_per_msg_{n}"] = per_msg_us
    print(json.dumps(out), flush=True)
    store.close()


def run_child(*args: str, kill_after_ready: bool = False) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    result = json.loads(proc.stdout.readline())
    if kill_after_ready:
        assert proc.stdout.readline().strip() == "READY"
        proc.send_signal(signal.SIGKILL)
    proc.wait()
    if not kill_after_ready and proc.returncode:
        raise RuntimeError(f"child {args} failed with {proc.returncode}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--dir", default=None, help="where to put data (default: a temp dir, removed after)")
    parser.add_argument("--child", nargs="*")
    args = parser.parse_args()
    if args.child:
        kind, *rest = args.child
        if kind == "fill":
            directory, count, batch, spread, kill = rest
            child_fill(directory, int(count), int(batch), int(spread), 1.0, kill == "kill")
        elif kind == "reopen":
            child_reopen(rest[0])
        elif kind == "read":
            child_read(rest[0])
        return

    base = tempfile.mkdtemp(prefix="hourglass-bench-", dir=args.dir)
    try:
        near_count = min(args.messages, 200_000)
        near = run_child("fill", os.path.join(base, "near"), str(near_count), str(args.batch), str(3_000_000), "no")
        shutil.rmtree(os.path.join(base, "near"))
        spread_dir = os.path.join(base, "spread")
        spread = run_child("fill", spread_dir, str(args.messages), str(args.batch), str(30 * DAY_MS), "kill",
                           kill_after_ready=True)
        reopen = run_child("reopen", spread_dir)
        assert reopen["entries"] == args.messages, reopen
        shutil.rmtree(spread_dir)
        read = run_child("read", os.path.join(base, "read"))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    suffix = "1m" if args.messages == 1_000_000 else f"{args.messages}"
    print(json.dumps({
        "messages": args.messages,
        "batch": args.batch,
        "append_msgs_per_s": round(spread["msgs_per_s"]),
        "append_near_msgs_per_s": round(near["msgs_per_s"]),
        f"rss_growth_mb_{suffix}": round(spread["rss_growth_mb"], 1),
        "disk_bytes_per_msg": round(spread["disk_bytes"] / args.messages, 1),
        "disk_bytes_per_msg_by_file": {k: round(v / args.messages, 1) for k, v in sorted(spread["disk_parts"].items())},
        f"reopen_s_{suffix}": round(reopen["reopen_s"], 3),
        "read_us_per_msg_10": round(read["read_us_per_msg_10"], 2),
        "read_us_per_msg_10000": round(read["read_us_per_msg_10000"], 2),
    }))


if __name__ == "__main__":
    from storage.files import raise_descriptor_limit

    raise_descriptor_limit()  # as `hourglass serve` does, before any store opens
    main()
