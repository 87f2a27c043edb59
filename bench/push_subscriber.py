"""A real push subscriber for bench/push.py and the tests: an aiohttp
server in its own process that writes one JSON line per request it gets
(receive time in ms, path, headers, body) to a file, and answers as its
mode says; POST /_mode {"mode": ...} changes the mode while it runs.

    python bench/push_subscriber.py PORT RECORD_PATH [MODE]

Modes: ok (200), fail (500), redirect (302 to /elsewhere), hang (never
answers), stream (200 and a body that never ends), retry-after (503 with
Retry-After: 2).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from aiohttp import web


def main() -> None:
    port, record_path = int(sys.argv[1]), sys.argv[2]
    state = {"mode": sys.argv[3] if len(sys.argv) > 3 else "ok"}
    record = open(record_path, "a", buffering=1)  # noqa: SIM115 -- open while the process lives

    async def set_mode(request: web.Request) -> web.Response:
        state["mode"] = (await request.json())["mode"]
        return web.Response(text="ok")

    async def deliver(request: web.Request) -> web.StreamResponse:
        received_ms = time.time() * 1000
        body = await request.read()
        record.write(json.dumps({"receivedMs": received_ms, "path": request.path,
                                 "headers": dict(request.headers), "body": body.decode()}) + "\n")
        mode = state["mode"]
        if mode == "fail":
            return web.Response(status=500, text="down")
        if mode == "retry-after":
            return web.Response(status=503, headers={"Retry-After": "2"})
        if mode == "redirect":
            raise web.HTTPFound("/elsewhere")
        if mode == "hang":
            await asyncio.sleep(3600)
        if mode == "stream":
            response = web.StreamResponse()
            await response.prepare(request)
            while True:
                await response.write(b"x" * 65536)
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/_mode", set_mode)
    app.router.add_route("*", "/{tail:.*}", deliver)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


if __name__ == "__main__":
    main()
