"""Python-level calls a request makes in a running node (bench/calls.py:
the real server object, the request's real bytes, a profile hook counting
`call` events, the least of several repeats). Counts, not times: the
same on any machine. The ceilings are today's path (docs/benchmarks.md,
"Python calls a request makes"); a change that adds calls to a hot path
fails here and must say why or lower them."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench")

CEILINGS = {
    "send": 70,              # sendMsg (70): the budget, sendMsg <= 70
    "send_batch": 490,       # sendMsgBatch of 100 (482); the budget, <= 1,000
    "pull_ack": 100,         # pullMsg of one, then its ackMsg (99): the budget, <= 100 together
    "pull_ack_many": 810,    # pullMsg of 100, then one ackMsg of them (msgIds): 802, the least of 3
}


def test_requests_stay_within_their_call_ceilings():
    """In a process of its own: what the suite's other tests left behind
    in this one (a logger's level, a hook, a collector) is not counted."""
    done = subprocess.run([sys.executable, os.path.join(BENCH, "calls.py"), "--repeat", "5"], capture_output=True,
                          timeout=300, check=True)
    result = json.loads(done.stdout)
    if result["loop"] != "uvloop":
        pytest.skip("uvloop: the loop `hourglass serve` runs on, whose scheduling the counts include")
    counted = {name: result[name]["python_calls"] for name in CEILINGS}
    over = {name: (counted[name], ceiling) for name, ceiling in CEILINGS.items() if counted[name] > ceiling}
    assert not over, f"over the ceiling (counted, ceiling): {over}"
    assert result["send_batch"]["python_calls"] < 100 * result["send"]["python_calls"] / 4  # batching pays
