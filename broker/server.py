"""`hourglass serve`: the process around the store.

This version opens (and recovers) the data directory, keeps it
checkpointed, and answers GET /health and GET /metrics; the camellia
message API is not served yet. SIGTERM or SIGINT: stop accepting, take a
last checkpoint, close, exit 0.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import signal
import time

from aiohttp import web

from storage.store import Store

from .clock import SystemClock
from .config import ServeConfig

log = logging.getLogger("hourglass.server")


def json_answer(code: int, msg: str, **extra) -> web.Response:
    """Every answer is a JSON object with `code` and `msg`; status = code."""
    return web.json_response({"code": code, "msg": msg, **extra}, status=code)


class Node:
    """A standalone node: the store, its checkpoint loop, the HTTP app."""

    def __init__(self, config: ServeConfig) -> None:
        self.config = config
        self.clock = SystemClock()
        started = time.perf_counter()
        self.store = Store.open(config.data_path, config.store, now_ms=self.clock.now_ms())
        self.opened_s = time.perf_counter() - started
        self.checkpoints = 0
        self.checkpoint_seconds = 0.0
        log.info("opened %s in %.3f s: %s", config.data_path, self.opened_s, self.store)

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._auth])
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics)
        return app

    @web.middleware
    async def _auth(self, request: web.Request, handler):
        token = self.config.auth_token
        if token is not None and request.path != "/health":
            given = request.headers.get("Authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
                return json_answer(401, "missing or wrong bearer token")
        return await handler(request)

    async def health(self, request: web.Request) -> web.Response:
        return json_answer(200, "success", status="ok", role="standalone", leader=None, node=None)

    async def metrics(self, request: web.Request) -> web.Response:
        hours = self.store.hours()
        lines = [
            "# TYPE hourglass_hours gauge", f"hourglass_hours {len(hours)}",
            "# TYPE hourglass_stored_messages gauge", f"hourglass_stored_messages {sum(h[1] for h in hours)}",
            "# TYPE hourglass_ended_messages gauge", f"hourglass_ended_messages {sum(h[2] for h in hours)}",
            "# TYPE hourglass_commit_log_end_offset gauge",
            f"hourglass_commit_log_end_offset {self.store.log.end_offset}",
            "# TYPE hourglass_checkpoints_total counter", f"hourglass_checkpoints_total {self.checkpoints}",
            "# TYPE hourglass_checkpoint_seconds_total counter",
            f"hourglass_checkpoint_seconds_total {self.checkpoint_seconds:.6f}",
            "# TYPE hourglass_open_seconds gauge", f"hourglass_open_seconds {self.opened_s:.6f}",
        ]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    async def checkpoint_loop(self) -> None:
        interval_s = self.config.checkpoint_interval_ms / 1000
        while True:
            await asyncio.sleep(interval_s)
            self.checkpoint()

    def checkpoint(self) -> None:
        started = time.perf_counter()
        self.store.checkpoint(self.clock.now_ms())
        self.checkpoints += 1
        self.checkpoint_seconds += time.perf_counter() - started

    def close(self) -> None:
        self.checkpoint()
        self.store.close()


async def run(config: ServeConfig) -> None:
    node = Node(config)
    runner = web.AppRunner(node.app(), handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port)
    await site.start()
    log.info("serving on http://%s:%d (standalone)", config.host, config.port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    checkpoints = asyncio.create_task(node.checkpoint_loop())
    await stop.wait()
    log.info("stopping: finishing requests, last checkpoint")
    checkpoints.cancel()
    await runner.cleanup()
    node.close()
    log.info("stopped")


def serve(config: ServeConfig) -> int:
    asyncio.run(run(config))
    return 0
