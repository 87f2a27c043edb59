"""A rolling upgrade of a real 3-node cluster (bench/upgrade_drill.py):
started on an older commit's code (its tree from this repository's
history), each node in turn, followers first, is stopped by SIGTERM and
started on this tree's code with the same data directory while sends,
pulls and acks go on; every send answered 200 is then accounted for
(delivered and acked, or still waiting with its trigger time), none early
(docs/operations.md, "Upgrades and downgrades"). Nodes are stopped by PID;
the drill stops by itself."""

from __future__ import annotations

import shutil

import pytest
from upgrade_drill import BEFORE_SECRETS, DEFAULT_FROM, drill, has_commit

pytestmark = [pytest.mark.slow, pytest.mark.serial]  # (failover deadlines, rates: not beside another worker)


@pytest.mark.parametrize("old", [DEFAULT_FROM, BEFORE_SECRETS])
def test_a_rolling_upgrade_from_an_older_commit_loses_nothing_and_delivers_nothing_early(old, tmp_path):
    """From the last release (bdb57f3), and from one before cluster
    secrets (96890dc: the upgraded nodes run with --insecure-cluster)."""
    if shutil.which("git") is None or not has_commit(old):
        pytest.skip(f"the older code comes from git history: no git, or {old} not in this clone "
                    f"(a shallow clone: git fetch --unshallow)")
    result = drill(str(tmp_path), old, rate=20, settle_s=1.0)

    assert result["insecure_cluster"] == (old == BEFORE_SECRETS), result
    assert result["started_on_old_code"] == {"n1": True, "n2": True, "n3": True}, result
    assert result["running_old_code"] == [], result  # every node ends on this tree's code
    assert [s["was"] for s in result["steps"]] == ["follower", "follower", "leader"], result
    assert [s["exit"] for s in result["steps"]] == [0, 0, 0], result
    assert result["short"] > 20 and result["long"] > 2, result
    assert result["lost"] == 0 and result["early"] == 0, result
    assert result["delivered_and_acked"] == result["short"], result
    assert result["waiting"] == result["long"] and result["delivered_long"] == 0, result
    assert result["rejoined"], result
