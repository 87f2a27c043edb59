"""bench/redrive.py, the redriveMsgs job's figure: a small run makes its
dead letters, re-drives every one of them and prints one JSON object of
the documented shape (the build it ran named)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from harness import ROOT


def test_a_small_run_redrives_every_dead_letter_and_prints_its_figures():
    done = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "redrive.py"), "--msgs", "1500",
                           "--rate", "3000", "--shards", "2"], capture_output=True, timeout=240, cwd=ROOT)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    result = json.loads(done.stdout)
    assert (result["state"], result["matched"], result["redriven"]) == ("done", 1500, 1500)
    assert result["ideal_s"] == 0.5 and result["health_samples"] > 0 and result["server_cpu_s"] > 0
    assert result["build"].startswith("hourglass ")
