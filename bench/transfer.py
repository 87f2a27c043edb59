"""Moving messages in and out (docs/operations.md, "Moving messages"):
`hourglass import --from-camellia`, `hourglass export` and `hourglass
import --from`, run as a user runs them, against real processes. Prints
one JSON object.

    --part camellia   a real redis-server filled with N messages in
                      camellia-delay-queue's layout (camellia_layout.py,
                      as its server writes them), imported into a node,
                      the import killed with SIGKILL once about 40% is
                      sent and run again with its --state; then every
                      message the node holds is listed: lost, listed
                      twice, a wrong trigger time
    --part lines      N messages due over the next year imported into node
                      A from a file of lines, exported, imported into node
                      B twice (the second: nothing stored twice) and into
                      a node on Redis (--redis), each node's messages then
                      listed and compared field by field with A's; the
                      node on Redis exported in turn and imported into a
                      disk node C (and back), compared alike

Rates are messages a second of each command's own run; the node's CPU
(every process of it, from /proc) a message beside it.

    .venv/bin/python bench/transfer.py --part camellia --n 100000
    HOURGLASS_SERVE_PYTHON=.venv/bin/python .venv/bin/python bench/transfer.py --part lines --n 1000000 \
        --redis-n 100000
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

from camellia_layout import populate
from harness import ROOT, Process, Server, every_message, free_port, hourglass_command, tree_cpu_s, unwind_on_signals, wait_until

LIVE_AND_DEAD = "1,2,3,4,5,6,7"
FIELDS = ("msg", "triggerTime", "expireTime", "maxRetry", "retry", "priority", "tag", "key", "status")


def timed(node: Server, *args: str, already: int = 0) -> dict[str, Any]:
    """One command to its end: its JSON, with its wall seconds and the node's CPU a message (of
    those it moved: `already` of its counts were sent by a run before, as a state file keeps them)."""
    before, started = tree_cpu_s(node.proc.pid, set()), time.monotonic()
    done = subprocess.run(hourglass_command(*args), cwd=ROOT, capture_output=True, text=True, timeout=3600)
    seconds = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"{args[0]} failed: {done.stderr[-2000:]}")
    outcome: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    moved = outcome.get("sent", outcome.get("written", 0)) - already
    cpu = tree_cpu_s(node.proc.pid, set()) - before
    return {**outcome, "wallSeconds": round(seconds, 2), "rate": round(moved / seconds) if seconds else 0,
            "nodeCpuUsPerMsg": round(cpu / moved * 1e6, 1) if moved else None}


def say(figures: dict[str, Any]) -> dict[str, Any]:
    """A stage's figures, also on stderr as it ends."""
    print(json.dumps(figures), file=sys.stderr, flush=True)
    return figures


def camellia(args: argparse.Namespace, work: str) -> dict[str, Any]:
    import redis

    port = free_port()
    redis_proc = Process(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                "--appendonly", "no"], os.path.join(work, "redis.log"))
    url = f"redis://127.0.0.1:{port}/0"
    r = redis.Redis(port=port)
    wait_until(lambda: r.ping(), 10, "redis-server")
    now = int(time.time() * 1000)
    started = time.monotonic()
    populated = populate(r, "prod", args.n, now)
    filled_s = time.monotonic() - started
    node = Server.start(os.path.join(work, "data"), "--shards", args.shards, log_path=os.path.join(work, "serve.log"))
    state = os.path.join(work, "import.state")
    command = ("import", "--url", node.base, "--from-camellia", url, "--namespace", "prod", "--state", state)
    try:
        first = subprocess.Popen(hourglass_command(*command), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        target = 0.4 * len(populated.expected)

        def sent() -> int:
            try:
                with open(state, encoding="utf-8") as f:
                    return int(json.load(f)["counts"]["sent"])
            except (OSError, ValueError, KeyError):
                return 0

        wait_until(lambda: sent() >= target or first.poll() is not None, 600, "40% sent")
        first.send_signal(signal.SIGKILL)
        first.wait()
        at_kill = sent()
        rerun = timed(node, *command, already=at_kill)
        stored, twice = every_message(node)
        lost = [k for k in populated.expected if k not in stored]
        extra = [k for k in stored if k not in populated.expected]
        wrong = [k for k, t in populated.expected.items() if k in stored and stored[k]["triggerTime"] != t]
        return {"part": "camellia", "n": args.n, "shards": args.shards, "fillSeconds": round(filled_s, 1),
                "pending": len(populated.expected), "leftByRule": populated.left, "sentBeforeKill": at_kill,
                "rerun": rerun, "stored": len(stored), "lost": len(lost), "listedTwice": twice,
                "notPending": len(extra), "wrongTrigger": len(wrong)}
    finally:
        node.stop()
        redis_proc.stop()


def compare(node: Server, want: dict[Any, dict[str, Any]]) -> dict[str, Any]:
    """Every message `node` holds against `want` (A's rows), field by field."""
    got, twice = every_message(node)
    return {"stored": len(got), "listedTwice": twice,
            "missing": sum(k not in got for k in want), "extra": sum(k not in want for k in got),
            "differing": {f: n for f in FIELDS
                          if (n := sum(got[k].get(f) != row.get(f) for k, row in want.items() if k in got))},
            "statusNote": "a status differs where a message fell due between the two listings"}


def lines(args: argparse.Namespace, work: str) -> dict[str, Any]:
    now = int(time.time() * 1000)
    source = os.path.join(work, "source.jsonl")
    with open(source, "w", encoding="utf-8") as f:
        for i in range(args.n):
            trigger = now + 60_000 + (i * 7919 % 31_536_000) * 1000
            row = {"topic": f"topic-{i % 8}", "msgId": f"id-{i:08d}", "msg": f"message {i} " + "x" * 40,
                   "produceTime": now, "triggerTime": trigger, "expireTime": trigger + 86_400_000, "maxRetry": 5,
                   "retry": 0, "status": 1, "priority": i % 3, "tag": f"tag{i % 5}" if i % 2 else "",
                   "key": ""}
            f.write(json.dumps(row) + "\n")
    nodes = {"a": Server.start(os.path.join(work, "a"), "--shards", args.shards, log_path=os.path.join(work, "a.log")),
             "b": Server.start(os.path.join(work, "b"), "--shards", args.shards, log_path=os.path.join(work, "b.log"))}
    redis_proc = None
    if args.redis_n:
        port = free_port()
        redis_proc = Process(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                    "--appendonly", "no"], os.path.join(work, "redis.log"))
        time.sleep(0.5)
        nodes["redis"] = Server.start(os.path.join(work, "r"), "--backend", f"redis://127.0.0.1:{port}/0",
                                      log_path=os.path.join(work, "r.log"))
    exported = os.path.join(work, "export.jsonl")
    try:
        out: dict[str, Any] = {"part": "lines", "n": args.n, "shards": args.shards}
        out["importIntoA"] = say(timed(nodes["a"], "import", "--url", nodes["a"].base, "--from", source))
        out["export"] = say(timed(nodes["a"], "export", "--url", nodes["a"].base, "--out", exported))
        a, _ = every_message(nodes["a"])
        for name in [n for n in nodes if n != "a"]:
            source_of = exported
            if name == "redis":  # the first --redis-n lines (listing a Redis topic pages through all of it)
                source_of = os.path.join(work, "redis.jsonl")
                with open(exported, encoding="utf-8") as f, open(source_of, "w", encoding="utf-8") as part:
                    kept = [line for _, line in zip(range(args.redis_n), f, strict=False)]
                    part.writelines(kept)
                keys = {(row["topic"], row["msgId"]) for row in map(json.loads, kept)}
            else:
                keys = set(a)
            out[f"importInto_{name}"] = say(timed(nodes[name], "import", "--url", nodes[name].base, "--from",
                                                  source_of))
            out[f"importInto_{name}_again"] = say(timed(nodes[name], "import", "--url", nodes[name].base, "--from",
                                                        source_of))
            out[f"compare_{name}"] = say(compare(nodes[name], {k: a[k] for k in keys}))
        if "redis" in nodes:  # and back: Redis -> a disk node
            back = os.path.join(work, "back.jsonl")
            out["exportFromRedis"] = say(timed(nodes["redis"], "export", "--url", nodes["redis"].base, "--out", back))
            nodes["c"] = Server.start(os.path.join(work, "c"), "--shards", args.shards,
                                      log_path=os.path.join(work, "c.log"))
            out["importInto_c"] = say(timed(nodes["c"], "import", "--url", nodes["c"].base, "--from", back))
            out["compare_c"] = say(compare(nodes["c"], {k: a[k] for k in keys}))
        return out
    finally:
        for node in nodes.values():
            node.stop()
        if redis_proc is not None:
            redis_proc.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=("camellia", "lines"), required=True)
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--shards", default="auto", help="the nodes' --shards (default auto: the default node)")
    parser.add_argument("--redis-n", type=int, default=0,
                        help="--part lines: also import the export's first this many lines into a node on Redis")
    args = parser.parse_args()
    unwind_on_signals()
    with tempfile.TemporaryDirectory(prefix="hg-transfer-") as work:
        result = camellia(args, work) if args.part == "camellia" else lines(args, work)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
