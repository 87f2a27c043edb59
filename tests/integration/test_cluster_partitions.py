"""A real 3-node cluster whose peer traffic runs through proxies
(bench/drill_proxies.py, `--reach-peers`): what a network partition must
not do. Every process is stopped by PID; each test is bounded in time."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
from drill_nodes import Nodes
from drill_proxies import Mode

from broker.http.paths import PREFIX

pytestmark = [pytest.mark.slow, pytest.mark.serial]  # (failover deadlines, rates: not beside another worker)

# More than aiohttp's default connection pool (100): requests a follower
# forwards to the leader, held there by long polls.
HELD_POLLS = 120


@pytest.fixture
def nodes(tmp_path):
    n = Nodes.start(str(tmp_path / "cluster"), cluster=True)
    yield n
    n.stop()


def _wait(predicate, wait_s: float, what: str):
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"{what} not within {wait_s} s")


async def _hold_long_polls(urls: list[str], started: asyncio.Event) -> None:
    """HELD_POLLS long polls on each of `urls` (followers: each forwards
    them to the leader, which holds them on an empty topic)."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        async def poll(url: str) -> None:
            form = {"topic": "empty", "longPollingTimeoutMillis": "120000"}
            async with session.post(url + PREFIX + "longPollingMsg", data=form,
                                    timeout=aiohttp.ClientTimeout(total=180)) as r:
                await r.read()

        tasks = [asyncio.create_task(poll(u)) for u in urls for _ in range(HELD_POLLS)]
        await asyncio.sleep(2.0)  # each is forwarded and held by the leader
        started.set()
        await asyncio.gather(*tasks, return_exceptions=True)


def test_requests_hung_on_a_cut_off_leader_do_not_stop_the_others_electing(nodes):
    """Followers forward API requests to the leader; when the leader is cut
    off (its links black-holed), those forwards hang. They once shared one
    connection pool of 100 with the peers' own calls, so a follower with
    100 forwards hung could not ask for promises or fetch: no node led
    until the partition healed."""
    leader, term = nodes.wait_leader()
    _wait(lambda: all((nodes.health(n) or {}).get("leader") == leader for n in nodes.ids), 30, "leader known")
    followers = [n for n in nodes.ids if n != leader]
    started = asyncio.Event()
    loop = asyncio.new_event_loop()
    holding = loop.create_task(_hold_long_polls([nodes.url(f) for f in followers], started))
    loop.run_until_complete(started.wait())
    assert nodes.mesh is not None
    nodes.mesh.isolate(leader, Mode.BLACKHOLE)
    try:
        new, new_term = nodes.wait_leader(exclude=leader, above_term=term, wait_s=30)
        assert new in followers and new_term > term
        status, body = nodes.servers[new].post("sendMsg", topic="t", msg="after the cut", msgId="m1", delayMillis=0)
        assert status == 200, body
    finally:
        nodes.mesh.heal()
        holding.cancel()
        loop.run_until_complete(asyncio.gather(holding, return_exceptions=True))
        loop.close()
