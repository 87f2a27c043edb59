"""A topic's dedup window over many ended ids, on a real node: the node's
memory before and after N ids ended under the window, the end index's
bytes on disk, and the answer time of a duplicate send the window answers
against a new id's (docs/api.md, "Deduplication window"). Prints ONE
JSON object.

    .venv/bin/python bench/dedup.py                        # 10,000,000 ended ids, a 10-minute window
    .venv/bin/python bench/dedup.py --ids 200000
    HOURGLASS_SERVE_PYTHON=.venv/bin/python .venv/bin/python bench/dedup.py   # the installed (compiled) build

The ids end the way users end them: sent (sendMsgBatch of 1,000), pulled
(pullMsg of 1,000) and acked (ackMsg of 1,000 msgIds). Then --probes
sendMsg of ended ids, one at a time, each answered by the window (status
4, counted), and as many of new ids. RSS is read as the last ack is
answered, and again 2 s later ("settled": the checkpoints, every second,
have returned the mapped pages to the page cache). The target (issue 54): 10,000,000
ended ids under a 10-minute window cost the node less than 64 MB of RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time

from harness import Server, disk_bytes, percentile, serve_version, tree_memory_mb

BATCH = 1000


def end_ids(server: Server, topic: str, count: int) -> None:
    """`count` ids of `topic` sent, pulled and acked (status 4)."""
    for first in range(0, count, BATCH):
        msgs = [{"msgId": f"id-{i}", "msg": "x"} for i in range(first, min(count, first + BATCH))]
        code, body = server.post_json("sendMsgBatch", {"topic": topic, "msgs": msgs})
        assert code == 200, body
        pulled: list[str] = []
        while len(pulled) < len(msgs):
            code, body = server.post("pullMsg", topic=topic, batch=len(msgs) - len(pulled), ackTimeoutMillis=600_000)
            assert code == 200 and isinstance(body, dict), body
            pulled += [m["msgId"] for m in body["delayMsgList"]]
        code, body = server.post_json("ackMsg", {"topic": topic, "msgIds": pulled})
        assert code == 200, body


def send_times_ms(server: Server, topic: str, msg_ids: list[str]) -> tuple[list[float], int]:
    """Each sendMsg's answer time (ms), sorted, and how many answered an ended message (status 4)."""
    took, ended = [], 0
    for msg_id in msg_ids:
        began = time.perf_counter()
        code, body = server.post("sendMsg", topic=topic, msgId=msg_id, msg="again")
        took.append((time.perf_counter() - began) * 1000)
        assert code == 200 and isinstance(body, dict), body
        ended += body["delayMsg"]["status"] == 4
    return sorted(took), ended


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ids", type=int, default=10_000_000, help="ids ended under the window")
    parser.add_argument("--window-ms", type=int, default=600_000, help="the topic's dedupWindowMillis")
    parser.add_argument("--probes", type=int, default=2_000, help="duplicate sends timed (and as many new ones)")
    parser.add_argument("--shards", default="1", help="the node's --shards")
    parser.add_argument("--index-resident-mb", type=int, default=None,
                        help="the node's --index-resident-mb (default: the node's own, 8)")
    args = parser.parse_args()
    topic = "dedup"
    with tempfile.TemporaryDirectory(prefix="hourglass-dedup-") as work:
        data = f"{work}/data"
        flags = ["--shards", args.shards]
        if args.index_resident_mb is not None:
            flags += ["--index-resident-mb", str(args.index_resident_mb)]
        server = Server.start(data, *flags, log_path=f"{work}/serve.log")
        try:
            code, body = server.post("setTopicConfig", topic=topic, dedupWindowMillis=args.window_ms)
            assert code == 200, body
            pid = server.proc.pid
            before = tree_memory_mb(pid)
            began = time.perf_counter()
            end_ids(server, topic, args.ids)
            ended_s = time.perf_counter() - began
            after = tree_memory_mb(pid)
            time.sleep(2)  # a checkpoint or two (every second): mapped pages back to the page cache
            settled = tree_memory_mb(pid)
            rng = random.Random(54)
            duplicates = [f"id-{rng.randrange(args.ids)}" for _ in range(args.probes)]
            duplicate_ms, answered_ended = send_times_ms(server, topic, duplicates)
            new_ms, _ = send_times_ms(server, topic, [f"new-{i}" for i in range(args.probes)])
            probed = tree_memory_mb(pid)
        finally:
            server.stop()
        ends_bytes = sum(disk_bytes(os.path.join(root, "ends")) for root, dirs, _ in os.walk(data) if "ends" in dirs)
        data_bytes = disk_bytes(data)
    print(json.dumps({
        "ids": args.ids, "window_ms": args.window_ms, "shards": args.shards,
        "index_resident_mb": args.index_resident_mb, "build": serve_version(),
        "ended_s": round(ended_s, 1), "ids_ended_per_s": round(args.ids / ended_s),
        "rss_mb_before": before.get("rss_mb"), "rss_mb_after": after.get("rss_mb"),
        "rss_growth_mb": round(after.get("rss_mb", 0) - before.get("rss_mb", 0), 1),
        "rss_anon_mb_after": after.get("rss_anon_mb"), "rss_file_mb_after": after.get("rss_file_mb"),
        "rss_peak_mb": after.get("rss_peak_mb"), "rss_mb_settled": settled.get("rss_mb"),
        "rss_growth_mb_settled": round(settled.get("rss_mb", 0) - before.get("rss_mb", 0), 1),
        "rss_anon_mb_settled": settled.get("rss_anon_mb"), "rss_mb_after_probes": probed.get("rss_mb"),
        "rss_peak_mb_after_probes": probed.get("rss_peak_mb"),  # (VmHWM: the ending and the probes)
        "end_index_bytes": ends_bytes, "end_index_bytes_per_id": round(ends_bytes / max(1, args.ids), 1),
        "data_dir_bytes": data_bytes,
        "duplicate_sends": args.probes, "answered_ended": answered_ended,
        "duplicate_send_ms_p50": percentile(duplicate_ms, 0.5), "duplicate_send_ms_p99": percentile(duplicate_ms, 0.99),
        "new_send_ms_p50": percentile(new_ms, 0.5), "new_send_ms_p99": percentile(new_ms, 0.99),
    }, indent=2))


if __name__ == "__main__":
    main()
