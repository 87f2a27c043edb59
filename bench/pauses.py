"""What a pause costs on a node with many keys paused (docs/api.md, "Flow:
pauses and topic settings"): --keys serial keys of one topic paused
first, then --pauses pauses of distinct keys of --key-bytes each, one
call at a time, each timed; the bytes the node's processes wrote meanwhile
(/proc/PID/io: wchar, files and sockets -- the answers, the shards'
forwards --, and write_bytes, to the disk), and how much the settings
files grew. Prints ONE JSON object.

    .venv/bin/python bench/pauses.py                          # 10,000 keys paused, then 300 pauses of 1 KB keys
    HOURGLASS_SERVE_PYTHON=.venv/bin/python .venv/bin/python bench/pauses.py   # the installed (compiled) build
    .venv/bin/python bench/pauses.py --serve-flags="--shards 2"

Targets (issue 62): 300 pauses of distinct 1 KB keys write <= 2 MB, and
a pause's p99 <= 5 ms with 10,000 keys paused.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import tempfile
import time

from harness import Server, children, percentile, serve_version


def written_bytes(server: Server, field: str = "wchar") -> int:
    """/proc/PID/io's `field` summed over the node's processes: wchar, what
    they passed to write calls (files and sockets: the answers, the
    forwards between shards); write_bytes, what they sent to the disk."""
    total = 0
    for pid in [server.proc.pid, *children(server.proc.pid)]:
        with open(f"/proc/{pid}/io") as f:
            fields = dict(line.split(": ") for line in f.read().splitlines())
        total += int(fields[field])
    return total


def settings_bytes(data_dir: str) -> int:
    total = 0
    for root, _, files in os.walk(data_dir):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files if f.startswith("topic-settings"))
    return total


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--keys", type=int, default=10_000, help="keys paused before the timed pauses (10,000)")
    p.add_argument("--pauses", type=int, default=300, help="timed pauses of distinct keys (300)")
    p.add_argument("--key-bytes", type=int, default=1024, help="each timed key's length (1,024)")
    p.add_argument("--serve-flags", default="", help="more flags for hourglass serve")
    args = p.parse_args()
    flags = ["--max-paused-keys", str(args.keys + args.pauses), *shlex.split(args.serve_flags)]
    with tempfile.TemporaryDirectory(prefix="hg-pauses-") as root:
        data = os.path.join(root, "data")
        server = Server.start(data, *flags, log_path=os.path.join(root, "serve.log"))
        try:
            began = time.monotonic()
            for i in range(args.keys):
                code, body = server.post("pauseTopic", topic="t", key=f"pre-{i}")
                assert code == 200, body
            setup_s = time.monotonic() - began
            before, disk_before = written_bytes(server), written_bytes(server, "write_bytes")
            files_before = settings_bytes(data)
            took = []
            for i in range(args.pauses):
                key = f"{i:06d}-" + "k" * (args.key_bytes - 7)
                began = time.perf_counter()
                code, body = server.post("pauseTopic", topic="t", key=key)
                took.append((time.perf_counter() - began) * 1000)
                assert code == 200, body
            written = written_bytes(server) - before
            time.sleep(1)  # (write_bytes counts at writeback; the appends were fdatasync'ed already)
            to_disk = written_bytes(server, "write_bytes") - disk_before
            took.sort()
            print(json.dumps({
                "benchmark": "bench/pauses.py", "build": serve_version(), "flags": flags,
                "keys_paused_first": args.keys, "setup_s": round(setup_s, 1), "pauses": args.pauses,
                "key_bytes": args.key_bytes, "pause_ms_p50": round(percentile(took, 0.5), 2),
                "pause_ms_p99": round(percentile(took, 0.99), 2), "pause_ms_max": round(took[-1], 2),
                "written_bytes": written, "written_per_pause_bytes": written // args.pauses,
                "disk_write_bytes": to_disk, "settings_files_grew_bytes": settings_bytes(data) - files_before,
                "settings_files_bytes": settings_bytes(data),
            }, indent=1))
        finally:
            server.stop()


if __name__ == "__main__":
    main()
