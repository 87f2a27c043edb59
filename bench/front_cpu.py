"""The server's own CPU for one request, from its bytes to its answer's
bytes, measured two ways. Prints ONE JSON object.

    .venv/bin/python bench/front_cpu.py --requests 20000

  front_us_<request>      in process: the request's bytes fed to one
                          kept-alive `Connection` of a real node (a store in
                          a temporary directory) over a stand-in transport;
                          CPU is this process's (parser, head decisions,
                          router, API, broker: no socket)
  loopback_us_<request>   over loopback: a `hourglass serve` child, one raw
                          keep-alive client socket, one request at a time;
                          CPU is the server's own (/proc/<pid>/stat)

The requests: `health` (GET /health), `empty_pull` (POST pullMsg of a
topic with nothing ready) and `get_unknown` (POST getMsg of an id that is
not there). On this machine's VM the loopback figure carries the cost of
waking the server for each request, which is larger than the request's
own work on a quiet machine and shrinks when the other core is busy: it
varies with the load; the in-process figure does not.

It needs only `broker` and `bench/harness.py`, and takes the node's app
as it was before the head decisions too (`handler()` and `api.body_cap`),
so the same file measures an older checkout: copy it and harness.py into
that checkout's bench/.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import socket
import tempfile
import time

import uvloop
from harness import Server, cpu_s, free_port

import broker.http.httpd as httpd

try:
    from broker.node.config import ServeConfig
except ImportError:  # a checkout before the node's room
    from broker.config import ServeConfig  # type: ignore[no-redef]

PULL_BODY = b"topic=nothing-here&batch=1"
GET_BODY = b"topic=nothing-here&msgId=no-such-id"
FORM = b"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: %d\r\n\r\n%s"
REQUESTS = {
    "health": b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
    "empty_pull": b"POST /camellia/delayQueue/pullMsg HTTP/1.1\r\nHost: 127.0.0.1\r\n" + FORM % (
        len(PULL_BODY), PULL_BODY),
    "get_unknown": b"POST /camellia/delayQueue/getMsg HTTP/1.1\r\nHost: 127.0.0.1\r\n" + FORM % (
        len(GET_BODY), GET_BODY)}
WARM_UP = 2000


class _Transport:
    """What a Connection writes to, in process: each answer completes a
    future (every answer here ends with its JSON's `}`)."""

    def __init__(self) -> None:
        self.answered: asyncio.Future[None] | None = None

    def write(self, data: bytes) -> None:
        if self.answered is not None and not self.answered.done() and data.endswith(b"}"):
            self.answered.set_result(None)

    def is_closing(self) -> bool:
        return False

    def set_write_buffer_limits(self, high: int | None = None) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        pass


def _disk_node(config: ServeConfig):  # (the node class of the checkout measured)
    try:
        from broker.node.standalone import DiskNode
    except ImportError:
        try:  # before the node's room
            from broker.nodes import DiskNode  # type: ignore[no-redef]
        except ImportError:  # before the node base
            from broker.server import Node as DiskNode  # type: ignore[no-redef]
    return DiskNode(config)


async def front_costs(n: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as directory:
        node = _disk_node(ServeConfig(data_dir=directory))
        node.broker.start()
        app = node.app() if hasattr(node, "app") else None
        if app is not None and not isinstance(app, tuple):  # the gate, which gives each request its command
            shared = httpd._Shared(app.admit, httpd.Limits())
        elif app is not None:  # before the command table: a dispatcher and the gate
            shared = httpd._Shared(*app, httpd.Limits())
        else:  # before the head decisions: the route's body cap only
            shared = httpd._Shared(node.handler(), node.api.body_cap, httpd.Limits())
        connection = httpd.Connection(shared)
        transport = _Transport()
        connection.connection_made(transport)  # (a stand-in for the socket's transport)
        loop = asyncio.get_running_loop()
        out = {}
        for name, raw in REQUESTS.items():
            for i in range(n + WARM_UP):
                if i == WARM_UP:
                    cpu = time.process_time()
                transport.answered = loop.create_future()
                loop.call_soon(connection.data_received, raw)  # from the loop, as a socket's bytes are
                await transport.answered
            out[f"front_us_{name}"] = round((time.process_time() - cpu) / n * 1e6, 2)
        await node.broker.stop()
        node.store.close()
    return out


def loopback_costs(n: int) -> dict[str, float]:
    port = free_port()
    with tempfile.TemporaryDirectory() as directory:
        server = Server.start(os.path.join(directory, "data"), "--log-level", "WARNING", port=port,
                              log_path=os.path.join(directory, "serve.log"))
        try:
            conn = socket.create_connection(("127.0.0.1", port))
            out = {}
            for name, raw in REQUESTS.items():
                for _ in range(200):  # warm up
                    _round_trip(conn, raw)
                cpu = cpu_s(server.proc.pid)
                for _ in range(n):
                    _round_trip(conn, raw)
                out[f"loopback_us_{name}"] = round((cpu_s(server.proc.pid) - cpu) / n * 1e6, 1)
            conn.close()
            return out
        finally:
            server.stop()


def _round_trip(conn: socket.socket, raw: bytes) -> None:
    conn.sendall(raw)
    buf = b""
    while b"\r\n\r\n" not in buf:
        buf += conn.recv(65536)
    head, _, rest = buf.partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length"))
    while len(rest) < length:
        rest += conn.recv(65536)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=20_000, help="requests of each kind, each way")
    parser.add_argument("--in-process-only", action="store_true", help="no loopback measurement")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    figures = uvloop.run(front_costs(args.requests))
    if not args.in_process_only:
        figures.update(loopback_costs(args.requests))
    print(json.dumps({"figures": figures, "parameters": vars(args)}, indent=1))


if __name__ == "__main__":
    main()
