"""broker.node.base.NodeBase, in process on a fake clock: /health's
states in their order, the app a node's own routes, `routed` and peer
proof make (served by a real HttpServer over loopback), and the API's
backend swapped by the node (serve_with, stop_serving) with going offline
waking whichever one serves."""

import asyncio
import dataclasses

import orjson
from fakes import FakeClock

from broker.http.commands import HERE
from broker.http.http_types import Request, Response
from broker.http.httpd import HttpServer
from broker.node.base import NodeBase
from broker.node.config import ServeConfig
from broker.observe.metrics import Family, Metrics, single_series

PEER_HEADER = "x-test-peer"


class Backend:
    """What the API and the health switch ask of a backend here."""

    def __init__(self) -> None:
        self.woken = 0

    def wake_all(self) -> None:
        self.woken += 1


class NoRecords:
    """Where the test node keeps its features' records: nowhere (it keeps
    no topic settings and runs no schedules, jobs or pushers)."""

    def settings(self) -> "NoRecords":
        return self

    def load(self) -> dict:
        return {}

    async def save(self, settings: dict, changes: dict) -> None:
        return None


class Node(NodeBase):
    """A node whose failure, degradation and peers a test sets."""

    def __init__(self, peers: bool = False) -> None:
        super().__init__(ServeConfig(), FakeClock(now_ms=5_000), Metrics(), None, None, NoRecords())
        self.failed: BaseException | None = None
        self.problem: str | None = None
        self.peers = peers
        self.routed_paths: list[str] = []

    def failure(self) -> BaseException | None:
        return self.failed

    def degraded(self) -> str | None:
        return self.problem

    def health_fields(self) -> dict[str, object]:
        return {"role": "test", "leader": None, "node": "n0"}

    def node_series(self) -> list[Family]:
        return [single_series("test_gauge", "gauge", 1)]

    def add_own_routes(self, table):
        async def call(request: Request) -> Response:
            return Response(200, b"peer call")
        table.add("POST", "/_cluster/call", call, where=HERE)

    def routed(self, command):
        async def route(request: Request):
            self.routed_paths.append(request.path)
            return await command.handler(request)
        return dataclasses.replace(command, handler=route)

    def peer_proof(self):
        if not self.peers:
            return None
        return lambda request: request.headers.get(PEER_HEADER) == "yes"


def health(node: Node) -> tuple[int, dict]:
    response = asyncio.run(node.health(Request("GET", "/health", b"", {}, b"", None)))
    return response.status, orjson.loads(response.body)


def call(node: Node, method: str, path: str, headers: dict | None = None) -> Response:
    """One request to the node's app, served by an HttpServer on loopback."""
    async def main() -> Response:
        server = HttpServer(node.app().admit)
        await server.start("127.0.0.1", 0)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Length: 0",
                     *(f"{k}: {v}" for k, v in (headers or {}).items())]
            writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
            length = next(int(line.partition(":")[2]) for line in head if line.lower().startswith("content-length:"))
            response = Response(int(head[0].split(" ")[1]), await reader.readexactly(length))
            writer.close()
            await writer.wait_closed()
            return response
        finally:
            await server.close(1)
    return asyncio.run(main())


def test_health_is_degraded_then_failed_then_offline_then_ok():
    node = Node()
    assert health(node) == (200, {"code": 200, "msg": "success", "status": "ok", "role": "test", "leader": None,
                                  "node": "n0"})
    node.serving.go_offline()
    status, body = health(node)
    assert (status, body["status"], body["role"]) == (503, "offline", "test")
    node.failed = OSError("disk full")
    status, body = health(node)
    assert (status, body["status"], body["msg"]) == (503, "failed", "failed: disk full")
    node.problem = "Redis is unreachable"
    status, body = health(node)
    assert (status, body["status"], body["msg"], body["node"]) == (503, "degraded", "Redis is unreachable", "n0")


def test_metrics_show_the_nodes_own_series():
    node = Node()
    response = asyncio.run(node.metrics_text(Request("GET", "/metrics", b"", {}, b"", None)))
    assert response.status == 200 and b"test_gauge 1\n" in response.body


def test_without_a_peer_proof_a_nodes_own_routes_go_through_routed():
    node = Node()
    response = call(node, "POST", "/_cluster/call")
    assert (response.status, response.body) == (200, b"peer call")
    assert node.routed_paths == ["/_cluster/call"]
    assert call(node, "GET", "/health").status == 200 and node.routed_paths == ["/_cluster/call", "/health"]


def test_with_a_peer_proof_cluster_calls_need_it_and_skip_routed():
    node = Node(peers=True)
    assert call(node, "POST", "/_cluster/call").status == 403
    response = call(node, "POST", "/_cluster/call", {PEER_HEADER: "yes"})
    assert (response.status, response.body) == (200, b"peer call")
    assert node.routed_paths == []
    assert call(node, "GET", "/health").status == 200 and node.routed_paths == ["/health"]


def test_the_api_serves_the_backend_the_node_hands_it_and_going_offline_wakes_that_one():
    node = Node()
    assert node.api.broker is None
    assert orjson.loads(call(node, "POST", "/camellia/delayQueue/pullMsg").body)["code"] == 503
    node.serving.go_offline()  # no backend: nothing to wake
    first, second = Backend(), Backend()
    node.api.serve_with(first)
    node.serving.go_offline()
    node.api.serve_with(second)
    node.serving.go_offline()
    assert node.api.broker is second and (first.woken, second.woken) == (1, 1)
    node.api.stop_serving()
    node.serving.go_offline()
    assert node.api.broker is None and (first.woken, second.woken) == (1, 1)
