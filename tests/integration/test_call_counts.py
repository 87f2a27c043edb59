"""Python-level calls a request makes in a running node of the build users
run, the compiled one (bench/calls.py: the real server object, the
request's real bytes, a profile hook counting `call` events, the least of
several repeats). Counts, not times: the same on any machine. A call
between compiled functions is a C call and is not counted, so what a
ceiling bounds is the Python still on the path (uncompiled modules, the
standard library, the loop's callbacks). The ceilings are today's path
(docs/benchmarks.md, "Python calls a request makes"); a change that adds
calls to a hot path fails here and must say why or lower them."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench")

# What the compiled build counted at the rooms' layout (2, 4, 2 and 3: the
# loop's timeouts and the fsync's thread hand-off), with room for a
# callback more; a module falling out of the compiled build counts dozens.
CEILINGS = {
    "send": 4,              # sendMsg
    "send_batch": 8,        # sendMsgBatch of 100
    "pull_ack": 4,          # pullMsg of one, then its ackMsg
    "pull_ack_many": 6,     # pullMsg of 100, then one ackMsg of them (msgIds), the least of 3
}


def test_requests_of_the_compiled_build_stay_within_their_call_ceilings(tmp_path):
    """In a process of its own (what the suite's other tests left behind in
    this one is not counted), importing the installed build as a user's
    script does: PYTHONSAFEPATH and a working directory outside the tree
    keep the sources off sys.path."""
    env = {**os.environ, "PYTHONSAFEPATH": "1"}
    env.pop("PYTHONPATH", None)
    done = subprocess.run([sys.executable, os.path.abspath(os.path.join(BENCH, "calls.py")), "--repeat", "5"],
                          capture_output=True, timeout=300, cwd=tmp_path, env=env)
    if done.returncode and b"ModuleNotFoundError" in done.stderr:
        pytest.skip("the installed build is not this tree's (a module bench/calls.py imports is missing): "
                    "install the tree again as the README's set-up does")
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    result = json.loads(done.stdout)
    if "(mypyc: " not in result["build"]:
        pytest.skip(f"the ceilings are the compiled build's, the one users run; installed here: {result['build']} "
                    "(the README's set-up command installs the compiled build)")
    if result["loop"] != "uvloop":
        pytest.skip("uvloop: the loop `hourglass serve` runs on, whose scheduling the counts include")
    counted = {name: result[name]["python_calls"] for name in CEILINGS}
    over = {name: (counted[name], ceiling) for name, ceiling in CEILINGS.items() if counted[name] > ceiling}
    assert not over, f"over the ceiling (counted, ceiling): {over}"
    assert result["send_batch"]["python_calls"] < 100 * result["send"]["python_calls"] / 4  # batching pays
