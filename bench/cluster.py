"""A real 3-node hourglass cluster on loopback, and the failover drill that
tests and bench/failover.py run against it.

    cluster = Cluster.start(tmp_path)          # n1, n2, n3 on free ports
    leader = cluster.wait_leader()             # its id, once one leads
    cluster.kill(leader)                       # SIGKILL (freeze/thaw/terminate too)
    cluster.restart(leader)
    cluster.stop()                             # SIGTERM every node, by PID

A node runs another checkout's code (an older commit's tree: the rolling
upgrade drill, bench/upgrade_drill.py) while `cluster.code[node]` names
that tree: it is started there, `python -m broker.cli` from its root.

`drill(cluster, fault)` drives producers and long-polling consumers through
the Python client (given every node's address), applies `fault` to the
leader mid-run, and returns what happened (see `DrillResult`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field

from harness import Process, Server, free_ports, percentile, request

NODE_IDS = ("n1", "n2", "n3")
# The cluster secret every test cluster shares (tests/integration/test_cluster_auth.py
# proves what a caller without it cannot do).
SECRET = "test-cluster-secret-0123456789"
MIN_SENT_GRACE_S = 15.0  # how long past run_s a drill may send to reach min_sent


@dataclass
class Cluster:
    root: str
    spec: str
    ports: dict[str, int]
    flags: tuple[str, ...]
    nodes: dict[str, Server] = field(default_factory=dict)
    code: dict[str, str] = field(default_factory=dict)  # node -> the source tree it runs (absent: this one)

    @classmethod
    def start(cls, root, *flags: str, wait_s: float = 30, code: dict[str, str] | None = None) -> Cluster:
        root = str(root)
        os.makedirs(root, exist_ok=True)
        picked = free_ports(2 * len(NODE_IDS))  # distinct: two nodes on one port would not start
        ports = dict(zip(NODE_IDS, picked[:len(NODE_IDS)]))
        raft = dict(zip(NODE_IDS, picked[len(NODE_IDS):]))
        spec = ",".join(f"{n}=127.0.0.1:{ports[n]}:{raft[n]}" for n in NODE_IDS)
        if "--insecure-cluster" not in flags and "--cluster-secret-file" not in flags:
            secret_file = os.path.join(root, "cluster-secret")
            with open(os.open(secret_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
                f.write(SECRET)
            flags = ("--cluster-secret-file", secret_file, *flags)
        cluster = cls(root, spec, ports, flags, code=dict(code or {}))
        for n in NODE_IDS:
            cluster.restart(n, wait=False)
        for n in NODE_IDS:
            cluster.nodes[n].wait_healthy(wait_s)
        return cluster

    def url(self, node: str) -> str:
        return f"http://127.0.0.1:{self.ports[node]}"

    @property
    def urls(self) -> list[str]:
        return [self.url(n) for n in NODE_IDS]

    def restart(self, node: str, wait: bool = True) -> None:
        self.nodes[node] = _spawn(os.path.join(self.root, node), node, self)
        if wait:
            self.nodes[node].wait_healthy(30)

    def health(self, node: str) -> dict | None:
        try:
            status, body = request(self.url(node) + "/health", timeout=1)
        except OSError:
            return None
        return json.loads(body) if status == 200 else None

    def leader(self, exclude: str | None = None) -> tuple[str, int] | None:
        """(node, term) of a node that says it leads, if any."""
        for n in NODE_IDS:
            if n == exclude or not self.alive(n):
                continue
            h = self.health(n)
            if h and h.get("role") == "leader":
                return n, h["term"]
        return None

    def wait_leader(self, exclude: str | None = None, above_term: int = 0, wait_s: float = 30) -> str:
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            found = self.leader(exclude)
            if found and found[1] > above_term:
                return found[0]
            time.sleep(0.01)
        raise AssertionError(f"no leader within {wait_s} s")

    def wait_known(self, leader: str, wait_s: float = 30) -> None:
        """Until every live node names `leader` in its /health (a follower
        learns it from the leader's first message, shortly after the vote)."""
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if all((self.health(n) or {}).get("leader") == leader for n in NODE_IDS if self.alive(n)):
                return
            time.sleep(0.01)
        raise AssertionError(f"not every node knows {leader} leads within {wait_s} s")

    def answer(self, method: str, path: str, wait_s: float = 30, **params: object) -> dict:
        """The first live node's answer with code 200 to an API call (a
        follower forwards it to the leader), asked again while a leader is
        elected; AssertionError if none answers within `wait_s`."""
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            for n in NODE_IDS:
                if not self.alive(n):
                    continue
                try:
                    status, body = (self.nodes[n].post if method == "POST" else self.nodes[n].get)(path, **params)
                except OSError:
                    continue
                if status == 200 and isinstance(body, dict) and body.get("code") == 200:
                    return body
            time.sleep(0.2)
        raise AssertionError(f"no node answered {method} {path} {params}")

    def alive(self, node: str) -> bool:
        return self.nodes[node].proc.poll() is None

    def kill(self, node: str) -> None:
        self.nodes[node].kill()

    def freeze(self, node: str) -> None:
        self.nodes[node].proc.send_signal(signal.SIGSTOP)

    def thaw(self, node: str) -> None:
        self.nodes[node].proc.send_signal(signal.SIGCONT)

    def terminate(self, node: str) -> int:
        return self.nodes[node].stop()

    def stop(self) -> None:
        for server in self.nodes.values():
            server.proc.send_signal(signal.SIGCONT)  # a frozen node must be able to stop
        for server in self.nodes.values():
            server.stop()

    def leaderships(self) -> list[dict]:
        """Every node's leadership.log lines."""
        lines = []
        for n in NODE_IDS:
            path = os.path.join(self.root, n, "leadership.log")
            if os.path.exists(path):
                with open(path) as f:
                    lines.extend(json.loads(line) for line in f if line.strip())
        return lines

    def log_ends(self) -> dict[str, int | None]:
        return {n: (h or {}).get("log_end_offset") for n in NODE_IDS for h in [self.health(n)]}


def _spawn(data: str, node: str, cluster: Cluster) -> Server:
    """Start a node without waiting for it (the others may not be up yet):
    this tree's code, or the tree `cluster.code` names for it (its own
    sources first on the path, whatever HOURGLASS_SERVE_PYTHON says)."""
    flags = ("--node-id", node, "--cluster", cluster.spec, *cluster.flags)
    tree = cluster.code.get(node)
    if tree is None:
        return Server.spawn(data, *flags, base=cluster.url(node))
    with open(os.path.join(tree, "broker", "cli.py")) as f:
        cli = f.read()
    shards = ("--shards", "1") if '"--shards"' in cli else ()  # one shard, where that tree's nodes had shards
    if '"--insecure-cluster"' not in cli:  # before cluster secrets (39499f4) every cluster ran without one
        flags = tuple(flag for flag in flags if flag != "--insecure-cluster")
    command = [sys.executable, "-m", "broker.cli", "serve", "--data-dir", data, *shards, *flags]
    # its sources first on the path by name too: with PYTHONSAFEPATH (`bash .ci/run`'s compiled
    # runs) the working directory is not on it
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([tree, *filter(None, [os.environ.get("PYTHONPATH")])])}
    return Server(Process(command, f"{data}.log", cwd=tree, env=env), cluster.url(node), data)


@dataclass
class DrillResult:
    fault: str
    old_leader: str
    new_leader: str
    failover_s: float  # fault -> a new leader (in a higher term) dispatches
    # sigterm: the SIGTERM -> the old leader's process exited (its handover,
    # then its HTTP server's requests in flight; None for the other faults)
    exit_s: float | None
    sent: int  # messages answered 200
    delivered: int  # distinct ids delivered
    lost: int  # answered 200, never delivered
    duplicates: int  # deliveries beyond the first
    # each delivery beyond the first by its cause: "redelivered, its ack late
    # or failed (retry>0)" (at least once: the ack missed its deadline, as an
    # ack sent into a failover may); "redelivered after its ack" (answered 200
    # before the delivery came: never right); "released twice (retry=0)"
    duplicate_causes: dict
    due_near_fault: int  # messages due within 100 ms of the fault
    lateness_ms_near_fault: dict  # p50/p99/max of messages due in [fault - 1 s, fault + 3 s]
    early: int  # delivered before their trigger time
    double_dispatch_terms: list  # terms in which two nodes led (must be empty)
    rejoined: bool  # every node ended with the same log end
    send_errors: int
    lost_status: dict  # status (getMsg) of each lost id, e.g. {"3": 1}: consuming, its answer lost with the leader


async def _drive(cluster: Cluster, fault: str, *, rate: int, run_s: float, fault_at_s: float,
                 delay_ms: tuple[int, int], freeze_s: float, min_sent: int) -> DrillResult:
    from broker.client import DelayQueueClient

    topic = f"drill-{uuid.uuid4().hex[:8]}"
    sent: dict[str, int] = {}  # id -> trigger ms
    deliveries: list[tuple[str, int, int, int]] = []  # id, received ms, trigger ms, retry
    acked_ms: dict[int, int] = {}  # index in deliveries -> when its ack was answered 200
    send_errors = 0
    stop = asyncio.Event()
    old_leader = cluster.wait_leader()
    old_term = cluster.health(old_leader)["term"]
    fault_ms = 0
    failover_s = float("nan")
    exit_s: float | None = None

    async def produce(client):
        nonlocal send_errors
        loop_started = time.monotonic()
        i = 0
        # run_s, and past it until min_sent were answered 200 (a loaded
        # machine's sends are slower), within MIN_SENT_GRACE_S
        while (time.monotonic() - loop_started < run_s
               or (len(sent) < min_sent and time.monotonic() - loop_started < run_s + MIN_SENT_GRACE_S)):
            msg_id = f"{topic}-{i}"
            i += 1
            delay = random.randint(*delay_ms)
            try:
                m = await client.send(topic, "x" * 32, msg_id=msg_id, delay_ms=delay)
                sent[msg_id] = m.trigger_time
            except Exception:
                send_errors += 1
            await asyncio.sleep(1 / rate)

    async def consume(client):
        while not stop.is_set():
            try:
                msgs = await client.long_poll(topic, timeout_ms=500, batch=32, ack_timeout_ms=4000)
            except Exception:
                await asyncio.sleep(0.05)
                continue
            now = int(time.time() * 1000)
            first = len(deliveries)
            for m in msgs:
                deliveries.append((m.msg_id, now, m.trigger_time, m.retry))
            for i, m in enumerate(msgs, first):
                with contextlib.suppress(Exception):
                    await client.ack(topic, m.msg_id)
                    acked_ms[i] = int(time.time() * 1000)

    def stopped_after(started: float) -> float:
        cluster.terminate(old_leader)  # (waits for the exit; SIGKILL past harness.STOP_TIMEOUT_S)
        return time.monotonic() - started

    async def strike():
        nonlocal fault_ms, failover_s, exit_s
        await asyncio.sleep(fault_at_s)
        fault_ms = int(time.time() * 1000)
        started = time.monotonic()
        exiting = None
        if fault == "sigkill":
            cluster.kill(old_leader)
        elif fault == "sigstop":
            cluster.freeze(old_leader)
        else:  # the new leader is waited for while the old one exits, each timed from the SIGTERM
            cluster.nodes[old_leader].proc.send_signal(signal.SIGTERM)
            exiting = asyncio.create_task(asyncio.to_thread(stopped_after, started))
        new = await asyncio.to_thread(cluster.wait_leader, old_leader, old_term)
        failover_s = time.monotonic() - started
        if exiting is not None:
            exit_s = await exiting
        if fault == "sigstop":
            await asyncio.sleep(max(0.0, freeze_s - (time.monotonic() - started)))
            cluster.thaw(old_leader)
        else:
            await asyncio.to_thread(cluster.restart, old_leader)
        return new

    clients = [DelayQueueClient(cluster.urls[i:] + cluster.urls[:i], timeout_s=2.0, retries=12,
                                max_backoff_s=0.5) for i in range(3)]
    try:
        consumers = [asyncio.create_task(consume(c)) for c in clients[1:]]
        striking = asyncio.create_task(strike())
        await produce(clients[0])
        new_leader = await striking
        # wait for everything sent to be due and delivered (bounded)
        last_due_ms = max(sent.values(), default=0)
        deadline = time.monotonic() + max(0, last_due_ms / 1000 - time.time()) + 15
        while time.monotonic() < deadline and not set(sent) <= {d[0] for d in deliveries}:
            await asyncio.sleep(0.1)
        stop.set()
        await asyncio.gather(*consumers, return_exceptions=True)
        lost_status: dict[str, int] = {}
        for msg_id in set(sent) - {d[0] for d in deliveries}:
            m = await clients[0].get(topic, msg_id)
            key = "missing" if m is None else str(int(m.status))
            lost_status[key] = lost_status.get(key, 0) + 1
    finally:
        for c in clients:
            await c.close()

    seen: dict[str, int] = {}
    last: dict[str, int] = {}  # id -> index in deliveries of its latest delivery
    causes = {"redelivered, its ack late or failed (retry>0)": 0, "redelivered after its ack": 0,
              "released twice (retry=0)": 0}
    for i, (msg_id, received_ms, _, retry) in enumerate(deliveries):
        seen[msg_id] = seen.get(msg_id, 0) + 1
        if seen[msg_id] > 1:
            acked = acked_ms.get(last[msg_id])
            if acked is not None and acked <= received_ms:
                causes["redelivered after its ack"] += 1
            elif retry == 0:
                causes["released twice (retry=0)"] += 1
            else:
                causes["redelivered, its ack late or failed (retry>0)"] += 1
        last[msg_id] = i
    near = sorted(received - trigger for _, received, trigger, _ in deliveries
                  if fault_ms - 1000 <= trigger <= fault_ms + 3000)
    terms: dict[int, set] = {}
    for line in cluster.leaderships():
        if line["event"] == "start":
            terms.setdefault(line["term"], set()).add(line["node"])
    ends = {}
    for _ in range(100):
        ends = cluster.log_ends()
        if None not in ends.values() and len(set(ends.values())) == 1:
            break
        await asyncio.sleep(0.1)
    return DrillResult(
        fault=fault, old_leader=old_leader, new_leader=new_leader, failover_s=round(failover_s, 3),
        exit_s=None if exit_s is None else round(exit_s, 3),
        sent=len(sent), delivered=len(seen), lost=len(set(sent) - set(seen)),
        duplicates=sum(c - 1 for c in seen.values()), duplicate_causes=causes,
        due_near_fault=sum(1 for t in sent.values() if abs(t - fault_ms) <= 100),
        lateness_ms_near_fault=_percentiles(near), early=sum(1 for _, r, t, _ in deliveries if r < t),
        double_dispatch_terms=sorted(t for t, nodes in terms.items() if len(nodes) > 1),
        rejoined=None not in ends.values() and len(set(ends.values())) == 1, send_errors=send_errors,
        lost_status=lost_status)


def _percentiles(values: list[int]) -> dict:
    """p50, p99 and max of an ascending list (harness.percentile: nearest rank)."""
    return {"p50": percentile(values, 0.5), "p99": percentile(values, 0.99), "max": percentile(values, 1.0),
            "count": len(values)}


def drill(cluster: Cluster, fault: str, *, rate: int = 100, run_s: float = 4.0, fault_at_s: float = 1.5,
          delay_ms: tuple[int, int] = (300, 2500), freeze_s: float = 5.0, min_sent: int = 0) -> dict:
    """One failover drill (fault: sigkill | sigstop | sigterm); returns a
    DrillResult as a dict. The producer sends for run_s seconds, and on
    until min_sent messages were stored (at most MIN_SENT_GRACE_S more)."""
    if fault not in ("sigkill", "sigstop", "sigterm"):
        raise ValueError(f"fault must be sigkill, sigstop or sigterm, got {fault!r}")
    result = asyncio.run(_drive(cluster, fault, rate=rate, run_s=run_s, fault_at_s=fault_at_s,
                                delay_ms=delay_ms, freeze_s=freeze_s, min_sent=min_sent))
    return asdict(result)
