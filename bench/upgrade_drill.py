"""The rolling upgrade drill: a 3-node cluster started on an older commit's
code is upgraded to this tree's one node at a time while a producer sends
and consumers pull and ack (docs/operations.md, "Upgrades and downgrades").

    .venv/bin/python bench/upgrade_drill.py [--from COMMIT] [--rate 40] [--settle-s 3]

prints one JSON object. The older code is the commit's tree from this
repository's history (`git archive`, into a temporary directory), run as
`python -m broker.cli serve` from that tree's root with this interpreter.
Then, for each node, followers first and the leader last: SIGTERM (the
leader hands its lead over first), `chmod -R go-rwx` its data directory
(older releases made it 0755: docs/operations.md, "The directory's
mode"), start it on this tree's code with the same data directory and
flags, and wait until it has caught up (its /health names the same leader
as the others and its log end has reached what the leader's was just
before) before the next node is stopped. A commit from before cluster
secrets (39499f4, e.g. 96890dc) ran its clusters without one: the drill
then runs the upgraded nodes with --insecure-cluster, as an operator
must.

Sends have delays of 0..3 s, and every tenth one an hour (still waiting
at the end). At the end every send answered 200 is accounted for: the
short ones delivered and acked (getMsg answers ACKED), the long ones
waiting with the trigger time their send was answered; `lost` counts the
others, `early` the deliveries before their trigger time. The bounded
test is tests/integration/test_rolling_upgrade.py.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any

from cluster import NODE_IDS, Cluster
from harness import ROOT

# The newest commit of the last release before the current one whose nodes
# a rolling upgrade starts from (tests/fixtures/upgrade/ holds a data
# directory it wrote).
DEFAULT_FROM = "bdb57f3"
# The oldest commit drilled: a fixture's too, from before cluster secrets.
BEFORE_SECRETS = "96890dc"
LONG_DELAY_MS = 3_600_000
WAITING, ACKED = 1, 4
# What a node runs (every commit drilled has the four layers).
PACKAGES = ("storage", "wheel", "replication", "broker")


def has_commit(commit: str, repo: str = ROOT) -> bool:
    """Whether `repo`'s history holds `commit` (a shallow clone may not)."""
    return subprocess.run(["git", "-C", repo, "cat-file", "-e", f"{commit}^{{commit}}"],
                          capture_output=True).returncode == 0


def old_tree(commit: str, into: str, repo: str = ROOT) -> str:
    """The source tree of `commit` written under `into` (git archive of its
    packages): the directory a node of that commit runs from."""
    tree = os.path.join(into, f"hourglass-{commit}")
    os.makedirs(tree)
    archive = subprocess.run(["git", "-C", repo, "archive", "--format=tar", commit, *PACKAGES], capture_output=True,
                             check=True)
    subprocess.run(["tar", "-x", "-C", tree], input=archive.stdout, check=True)
    return tree


def knows_secrets(tree: str) -> bool:
    """Whether the nodes of the source tree `tree` take a cluster secret."""
    with open(os.path.join(tree, "broker", "cli.py")) as f:
        return '"--cluster-secret-file"' in f.read()


def caught_up(cluster: Cluster, node: str) -> bool:
    """`node` follows or leads, every live node names the same leader, and
    its log end has reached the leader's as read just before."""
    leader = cluster.leader()
    if leader is None:
        return False
    leader_health = cluster.health(leader[0])
    health = cluster.health(node)
    if not leader_health or not health or health.get("role") not in ("leader", "follower"):
        return False
    leaders = {(cluster.health(n) or {}).get("leader") for n in NODE_IDS if cluster.alive(n)}
    return leaders == {leader[0]} and health["log_end_offset"] >= leader_health["log_end_offset"]


def upgrade_one(cluster: Cluster, node: str, wait_s: float = 60) -> dict[str, Any]:
    """SIGTERM `node`, start it on this tree's code, wait until it caught up."""
    role = (cluster.health(node) or {}).get("role")
    started = time.monotonic()
    exit_code = cluster.terminate(node)
    # the directory's mode, as docs/operations.md says: older releases made it with the umask (0755)
    subprocess.run(["chmod", "-R", "go-rwx", os.path.join(cluster.root, node)], check=True)
    cluster.code.pop(node, None)
    cluster.restart(node)
    deadline = time.monotonic() + wait_s
    while not caught_up(cluster, node):
        if time.monotonic() > deadline:
            raise AssertionError(f"{node} did not catch up within {wait_s} s: {cluster.nodes[node].process.log_tail()}")
        time.sleep(0.05)
    return {"node": node, "was": role, "exit": exit_code, "caught_up_s": round(time.monotonic() - started, 3),
            "leader_after": (cluster.leader() or ("?", 0))[0]}


def upgrade_order(cluster: Cluster) -> list[str]:
    """The followers, then the leader."""
    leader = cluster.wait_leader()
    cluster.wait_known(leader)
    return [n for n in NODE_IDS if n != leader] + [leader]


async def _drive(cluster: Cluster, *, rate: int, settle_s: float, delay_ms: tuple[int, int],
                 long_every: int) -> dict[str, Any]:
    from broker.client import DelayQueueClient

    topic = f"upgrade-{uuid.uuid4().hex[:8]}"
    sent: dict[str, int] = {}  # id -> trigger ms, as its send was answered
    long_ids: set[str] = set()
    deliveries: list[tuple[str, int, int]] = []  # id, received ms, trigger ms
    acked: set[str] = set()
    send_errors = 0
    producing = asyncio.Event()
    stop = asyncio.Event()
    all_acked = asyncio.Event()
    steps: list[dict[str, Any]] = []

    async def produce(client: DelayQueueClient) -> None:
        nonlocal send_errors
        i = 0
        while not producing.is_set():
            msg_id = f"{topic}-{i}"
            long = long_every > 0 and i % long_every == long_every - 1
            i += 1
            try:
                m = await client.send(topic, "x" * 32, msg_id=msg_id,
                                      delay_ms=LONG_DELAY_MS if long else random.randint(*delay_ms))
                sent[msg_id] = m.trigger_time
                if long:
                    long_ids.add(msg_id)
            except Exception:
                send_errors += 1
            await asyncio.sleep(1 / rate)

    async def consume(client: DelayQueueClient) -> None:
        while not stop.is_set():
            try:
                msgs = await client.long_poll(topic, timeout_ms=500, batch=32, ack_timeout_ms=4000)
            except Exception:
                await asyncio.sleep(0.05)
                continue
            now = int(time.time() * 1000)
            deliveries.extend((m.msg_id, now, m.trigger_time) for m in msgs)
            for m in msgs:
                with contextlib.suppress(Exception):
                    await client.ack(topic, m.msg_id)
                    acked.add(m.msg_id)
            if producing.is_set() and set(sent) - long_ids <= acked:
                all_acked.set()

    def roll() -> None:
        time.sleep(settle_s)  # traffic on the old version first
        for node in upgrade_order(cluster):
            steps.append(upgrade_one(cluster, node))
            time.sleep(settle_s)

    clients = [DelayQueueClient(cluster.urls[i:] + cluster.urls[:i], timeout_s=2.0, retries=12, max_backoff_s=0.5)
               for i in range(3)]
    try:
        consumers = [asyncio.create_task(consume(c)) for c in clients[1:]]
        producer = asyncio.create_task(produce(clients[0]))
        await asyncio.to_thread(roll)
        producing.set()
        await producer
        short = set(sent) - long_ids
        deadline = time.monotonic() + max(0, max(sent.values(), default=0) / 1000 - time.time()) + 20
        while time.monotonic() < deadline and not short <= acked:
            with contextlib.suppress(TimeoutError):  # a consumer sets it on its last ack; time runs out otherwise
                await asyncio.wait_for(all_acked.wait(), 0.1)
        stop.set()
        await asyncio.gather(*consumers, return_exceptions=True)
        final: dict[str, tuple[int, int] | None] = {}
        for msg_id in sent:
            m = await clients[0].get(topic, msg_id)
            final[msg_id] = None if m is None else (int(m.status), m.trigger_time)
    finally:
        for c in clients:
            await c.close()

    delivered = {d[0] for d in deliveries}
    done = {i for i in short if i in delivered and final[i] == (ACKED, sent[i])}
    waiting = {i for i in long_ids if i not in delivered and final[i] == (WAITING, sent[i])}
    lost = set(sent) - done - waiting
    ends = cluster.log_ends()
    return {
        "sent": len(sent), "short": len(short), "long": len(long_ids), "send_errors": send_errors,
        "delivered_and_acked": len(done), "waiting": len(waiting), "lost": len(lost),
        "lost_status": sorted({str(final[i]) for i in lost}),
        "early": sum(1 for _, received, trigger in deliveries if received < trigger),
        "deliveries": len(deliveries), "redeliveries": len(deliveries) - len(delivered),
        "delivered_long": len(long_ids & delivered),
        "steps": steps, "log_ends": ends, "rejoined": None not in ends.values() and len(set(ends.values())) == 1,
    }


def drill(root: str, old_commit: str = DEFAULT_FROM, *, rate: int = 40, settle_s: float = 3.0,
          delay_ms: tuple[int, int] = (0, 3000), long_every: int = 10) -> dict[str, Any]:
    """A 3-node cluster on `old_commit`'s code under `root`, upgraded node by
    node to this tree's under traffic; what happened (see the module)."""
    tree = old_tree(old_commit, root)
    # a cluster from before cluster secrets (39499f4) runs without one: its upgraded nodes too, --insecure-cluster
    insecure = not knows_secrets(tree)
    cluster = Cluster.start(os.path.join(root, "cluster"), *(("--insecure-cluster",) if insecure else ()),
                            code=dict.fromkeys(NODE_IDS, tree))
    try:
        # each node runs the old tree (its process's working directory, first on its path)
        started_old = {n: os.readlink(f"/proc/{cluster.nodes[n].process.pid}/cwd") == tree for n in NODE_IDS}
        result = asyncio.run(_drive(cluster, rate=rate, settle_s=settle_s, delay_ms=delay_ms,
                                    long_every=long_every))
        result["from"] = old_commit
        result["insecure_cluster"] = insecure
        result["started_on_old_code"] = started_old
        result["running_old_code"] = sorted(cluster.code)
    finally:
        cluster.stop()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--from", dest="old", default=DEFAULT_FROM, help="the older commit the nodes start on")
    parser.add_argument("--rate", type=int, default=40, help="sends per second")
    parser.add_argument("--settle-s", type=float, default=3.0, help="traffic before the first and after each node")
    args = parser.parse_args()
    if not has_commit(args.old):
        sys.exit(f"{args.old}: not in this repository's history (a shallow clone? git fetch --unshallow)")
    with tempfile.TemporaryDirectory(prefix="upgrade-drill-") as root:
        print(json.dumps(drill(root, args.old, rate=args.rate, settle_s=args.settle_s), indent=1))


if __name__ == "__main__":
    main()
