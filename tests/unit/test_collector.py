"""broker.node.server's ShortCollections (docs/internals.md, "The collector"):
what survives a full collection is frozen, so the next ones walk only
what came since; a cycle of frozen objects that dies is found once the
frozen objects have grown past their bound, or THAW_S after the last
walk of everything, by one collection that walks them all. In a fresh interpreter: the collector is the process's."""

from __future__ import annotations

import json
import subprocess
import sys

_PROBE = """
import gc, json, weakref
from broker.node.server import FROZEN_GROWTH, FROZEN_SLACK, THAW_S, ShortCollections

class Node:
    def __init__(self):
        self.me = self  # a cycle: only the collector frees it

out = {}
clock = [0.0]
collections = ShortCollections.install(lambda: clock[0])
kept = [Node() for _ in range(1000)]
frozen_before = gc.get_freeze_count()
gc.collect()
out["survivors_frozen"] = gc.get_freeze_count() - frozen_before
# a cycle that dies once frozen is not found by the collections that walk only what is new
dying = Node()
gc.collect()
gone = weakref.ref(dying)
del dying
for _ in range(3):
    gc.collect()
out["dead_cycle_kept_while_frozen"] = gone() is not None
out["walks_before"] = collections.walks
# the frozen objects grow past their bound: thawed, and the next full collection walks them all
more = [Node() for _ in range(FROZEN_GROWTH * collections.walked + FROZEN_SLACK)]
gc.collect()  # leaves the many frozen: past the bound, the next one walks everything
out["thawed"] = collections.thawed or collections.walks > 0
gc.collect()
out["walks_after"] = collections.walks
out["dead_cycle_found"] = gone() is None
out["alive_kept"] = all(n.me is n for n in kept) and len(more) > 0
out["frozen_again"] = gc.get_freeze_count() >= len(kept) + len(more)
# THAW_S after that walk, a dead frozen cycle is found too, however few the frozen
late = Node()
gc.collect()
late_gone = weakref.ref(late)
del late
gc.collect()
out["late_kept_before_thaw_s"] = late_gone() is not None and collections.walks == 1
clock[0] += THAW_S + 1
gc.collect()
gc.collect()
out["late_found_after_thaw_s"] = late_gone() is None and collections.walks == 2
collections.uninstall()
out["uninstalled"] = gc.get_freeze_count() == 0 and collections.on_gc not in gc.callbacks
print(json.dumps(out))
"""


def test_survivors_are_frozen_and_a_dead_frozen_cycle_is_found_once_the_frozen_grow_past_their_bound():
    done = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout)
    assert out["survivors_frozen"] >= 1000, out  # the 1,000 kept (and their attributes) frozen
    assert out["dead_cycle_kept_while_frozen"] is True, out
    assert out["walks_before"] == 0 and out["thawed"] is True, out
    assert out["walks_after"] == 1 and out["dead_cycle_found"] is True, out
    assert out["alive_kept"] is True and out["frozen_again"] is True, out
    assert out["late_kept_before_thaw_s"] is True and out["late_found_after_thaw_s"] is True, out
    assert out["uninstalled"] is True, out


_CHURN = """
import gc, json
from broker.node.server import FROZEN_GROWTH, FROZEN_SLACK, YOUNG_THRESHOLD, ShortCollections

class Leaf:  # tracked by the collector, freed by its count of references
    pass

counted = []
exact = gc.get_freeze_count
gc.get_freeze_count = lambda: counted.append(1) or exact()
before = gc.get_threshold()
collections = ShortCollections.install(lambda: 0.0)
young = gc.get_threshold()[0]
counted.clear()
batch = (FROZEN_GROWTH * collections.walked + FROZEN_SLACK) // 20
for _ in range(20):  # each round's leaves frozen by a full collection, then freed
    leaves = [Leaf() for _ in range(batch)]
    gc.collect()
    del leaves
out = {"young": young, "young_wanted": YOUNG_THRESHOLD, "full_collections": 20, "exact_counts": len(counted),
       "walks": collections.walks, "thawed": collections.thawed, "frozen_bound": collections.frozen,
       "frozen": exact(), "limit": FROZEN_GROWTH * collections.walked + FROZEN_SLACK}
collections.uninstall()
out["restored"] = gc.get_threshold() == before
print(json.dumps(out))
"""


def test_frozen_objects_that_come_and_go_are_counted_exactly_only_when_their_bound_passes_the_limit():
    """Survivors frozen and freed again and again (held messages replaced by
    their extensions): the frozen set is walked to count it only when the
    bound passes the limit, not at every full collection, and the churn
    alone does not thaw it."""
    done = subprocess.run([sys.executable, "-c", _CHURN], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout)
    assert 1 <= out["exact_counts"] <= 4, out  # the bound grows by a twentieth of the limit a round
    assert out["walks"] == 0 and out["thawed"] is False, out
    assert out["frozen"] <= out["frozen_bound"] <= out["limit"], out
    assert out["young"] == out["young_wanted"] and out["restored"] is True, out  # (the youngest's threshold, and back)
