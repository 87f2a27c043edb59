"""bench/drill_slow_disk.py: the drill's slow disk. The control file's
delay is what each fsync waits, switched on and off while a node runs
(a real node under it: tests/integration/test_drills.py)."""

from __future__ import annotations

import os
import time

import pytest
from drill_slow_disk import MAX_DELAY_MS, Delay, delayed, set_delay


def test_the_delay_follows_the_control_file(tmp_path):
    control = str(tmp_path / "delay")
    delay = Delay(control)
    assert delay.seconds() == 0.0  # no file: the disk as it is
    set_delay(control, 250)
    assert delay.seconds() == 0.25
    set_delay(control, 0)
    assert delay.seconds() == 0.0
    set_delay(control, 40)
    assert delay.seconds() == 0.04
    with open(control, "w") as f:  # written in place, not renamed: still seen (size and mtime changed)
        f.write("7000")
    assert delay.seconds() == 7.0
    with open(control, "w") as f:
        f.write("not a number")
    assert delay.seconds() == 0.0
    os.remove(control)
    assert delay.seconds() == 0.0


@pytest.mark.parametrize("bad", [-1, MAX_DELAY_MS + 1])
def test_a_delay_out_of_range_is_refused_and_changes_nothing(tmp_path, bad):
    control = str(tmp_path / "delay")
    set_delay(control, 100)
    with pytest.raises(ValueError, match="delay_ms"):
        set_delay(control, bad)
    assert Delay(control).seconds() == 0.1


def test_a_delayed_call_waits_then_makes_the_real_call(tmp_path):
    control = str(tmp_path / "delay")
    calls: list[int] = []
    sync = delayed(calls.append, Delay(control))
    set_delay(control, 120)
    started = time.monotonic()
    sync(5)
    assert time.monotonic() - started >= 0.12 and calls == [5]
    set_delay(control, 0)
    sync(6)
    assert calls == [5, 6]
