"""An online backup under load, and its restore (docs/operations.md,
"Backup and restore"). Prints one JSON object.

    1. a node (--shards, default the default node) holding N messages due
       over the next year (sent with `hourglass import`)
    2. producers sending single messages at --rate a second (paced; each
       send's answer time kept), for --before-s seconds
    3. `hourglass backup` while they go on; the producers' rate during the
       backup against their rate before it; then --after-s seconds more,
       and a second backup to the same place (it fetches only what
       changed: its bytes received and kept), --after-s seconds more
    4. the node stopped (SIGTERM) and started again on its own directory:
       a restart's time to /health 200; stopped again
    5. `hourglass restore` into a new directory, a node started on it (its
       time to /health 200), and every message listed: each one sent
       before the backup began must be there with its trigger time, none
       sent after it ended, nothing listed twice

    HOURGLASS_SERVE_PYTHON=.venv/bin/python .venv/bin/python bench/backup.py --n 1000000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import tempfile
import threading
import time
from typing import Any

import aiohttp
from harness import ROOT, Server, every_message, hourglass_command, unwind_on_signals

PREFIX = "/camellia/delayQueue/"


def command(*args: str) -> dict[str, Any]:
    done = subprocess.run(hourglass_command(*args), cwd=ROOT, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise SystemExit(f"{args[0]} failed: {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


class Producers:
    """Single sends at `rate` a second from `workers` connections, in a thread of their own."""

    def __init__(self, base: str, rate: float, workers: int = 8) -> None:
        self.base, self.rate, self.workers = base, rate, workers
        self.sent: list[tuple[str, int, float, float]] = []  # msgId, trigger ms, began, answered
        self.failed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)

    async def _run(self) -> None:
        started = time.monotonic()
        counter = iter(range(10**9))
        async with aiohttp.ClientSession() as session:
            async def worker() -> None:
                while not self._stop.is_set():
                    i = next(counter)
                    due = started + i / self.rate
                    wait = due - time.monotonic()
                    if wait > 0:
                        await asyncio.sleep(wait)
                    msg_id = f"live-{i}"
                    trigger = int(time.time() * 1000) + 3_600_000 + i
                    began = time.monotonic()
                    try:
                        async with session.post(self.base + PREFIX + "sendMsg", data={
                                "topic": "live", "msgId": msg_id, "msg": f"live message {i}",
                                "triggerTime": str(trigger)}) as r:
                            answer = await r.json(content_type=None)
                        if r.status == 200 and answer.get("code") == 200:
                            self.sent.append((msg_id, trigger, began, time.monotonic()))
                        else:
                            self.failed += 1
                    except aiohttp.ClientError:
                        self.failed += 1
            await asyncio.gather(*(worker() for _ in range(self.workers)))

    def rate_between(self, start: float, end: float) -> float:
        done = sum(1 for _, _, _, answered in self.sent if start <= answered < end)
        return done / (end - start) if end > start else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--rate", type=float, default=2000.0)
    parser.add_argument("--before-s", type=float, default=10.0)
    parser.add_argument("--after-s", type=float, default=5.0)
    parser.add_argument("--shards", default="auto")
    parser.add_argument("--max-rate-mb", default=None, help="passed to hourglass backup (default: its default)")
    args = parser.parse_args()
    unwind_on_signals()
    with tempfile.TemporaryDirectory(prefix="hg-backup-") as work:
        now = int(time.time() * 1000)
        source = os.path.join(work, "source.jsonl")
        expected: dict[tuple[str, str], int] = {}
        with open(source, "w", encoding="utf-8") as f:
            for i in range(args.n):
                trigger = now + 120_000 + (i * 7919 % 31_536_000) * 1000
                topic, msg_id = f"topic-{i % 8}", f"id-{i:08d}"
                expected[(topic, msg_id)] = trigger
                f.write(json.dumps({"topic": topic, "msgId": msg_id, "msg": f"message {i} " + "x" * 40,
                                    "produceTime": now, "triggerTime": trigger, "expireTime": trigger + 86_400_000,
                                    "maxRetry": 5, "retry": 0, "status": 1}) + "\n")
        data = os.path.join(work, "data")
        node = Server.start(data, "--shards", args.shards, log_path=os.path.join(work, "serve.log"))
        out: dict[str, Any] = {"n": args.n, "shards": args.shards, "rate": args.rate, "maxRateMb": args.max_rate_mb}
        try:
            out["fill"] = command("import", "--url", node.base, "--from", source)
            producers = Producers(node.base, args.rate)
            producers.start()
            time.sleep(args.before_s)
            began = time.monotonic()
            rate = () if args.max_rate_mb is None else ("--max-rate-mb", args.max_rate_mb)
            out["backup"] = command("backup", "--url", node.base, "--to", os.path.join(work, "backup"), *rate)
            ended = time.monotonic()
            time.sleep(args.after_s)
            first = (began, ended)
            began = time.monotonic()
            out["secondBackup"] = command("backup", "--url", node.base, "--to", os.path.join(work, "backup"), *rate)
            ended = time.monotonic()  # (the restore is the second backup's: what it must and must not hold)
            time.sleep(args.after_s)
            producers.stop()
            before_rate = producers.rate_between(first[0] - args.before_s + 2, first[0])
            during_rate = producers.rate_between(*first)
            second_rate = producers.rate_between(began, ended)
            out["sends"] = {"beforePerSecond": round(before_rate, 1), "duringPerSecond": round(during_rate, 1),
                            "ratio": round(during_rate / before_rate, 3) if before_rate else None,
                            "backupSeconds": round(first[1] - first[0], 2),
                            "duringSecondPerSecond": round(second_rate, 1),
                            "secondRatio": round(second_rate / before_rate, 3) if before_rate else None,
                            "secondBackupSeconds": round(ended - began, 2), "failed": producers.failed,
                            "answered": len(producers.sent)}
        finally:
            node.stop()
        started = time.monotonic()
        node = Server.start(data, "--shards", args.shards, log_path=os.path.join(work, "serve.log"), wait_s=600)
        out["restartSeconds"] = round(time.monotonic() - started, 2)
        node.stop()
        out["restore"] = command("restore", "--from", os.path.join(work, "backup"), "--data-dir",
                                 os.path.join(work, "restored"))
        started = time.monotonic()
        restored = Server.start(os.path.join(work, "restored"), "--shards", args.shards,
                                log_path=os.path.join(work, "restored.log"), wait_s=600)
        out["restoredStartSeconds"] = round(time.monotonic() - started, 2)
        try:
            rows, twice = every_message(restored)
            stored = {key: row["triggerTime"] for key, row in rows.items()}
        finally:
            restored.stop()
        before = {("live", m): t for m, t, _, answered in producers.sent if answered < began}
        after = {("live", m) for m, _, started_at, _ in producers.sent if started_at > ended}
        must = {**expected, **before}
        out["check"] = {"mustBeThere": len(must), "missing": sum(k not in stored for k in must),
                        "wrongTrigger": sum(k in stored and stored[k] != t for k, t in must.items()),
                        "sentAfterButThere": sum(k in stored for k in after), "sentAfter": len(after),
                        "listedTwice": twice, "stored": len(stored)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
