"""camellia's health switch for load balancers and deploy scripts:
/camellia/health/status and /check (GET or POST), /online and /offline
(POST only: they change state), no token, as /health.

    path      answer
    status    online: HTTP 200 {"code":200}; offline: HTTP 500 {"code":500}
    check     always HTTP 200 {"code":200} (the process answers)
    online    back online; HTTP 200
    offline   goes offline; HTTP 200 once the node is idle, else HTTP 500
              (a deploy script calls it until it answers 200, then stops
              the node)

Offline, a node still serves every request: a load balancer that checks
`status` (or /health, 503 while offline) stops sending it new ones, and
the node drains. Idle means no API call in flight and none for `idle_s`
(--offline-idle-s, camellia's 20 s) -- camellia counts from the start of
the last call; here from the end, so a long poll held open keeps the node
busy. Going offline answers the long polls held at that moment at once
(empty, or with what they took meanwhile), so their clients re-poll
through the load balancer elsewhere; long polls that arrive later are
served as usual (answering them empty at once would make camellia's SDK
re-poll in a tight loop). The switch is not persisted: a restarted node
is online, as camellia's.

API calls are the POSTs under /camellia/delayQueue/ (sends, pulls, acks,
...); the monitoring GETs (getMonitorData, getTopicInfo, ...) do not keep
a node busy.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import orjson

from .commands import EVERY_SHARD, HERE, CommandTable
from .http_types import Request, Response
from .paths import HEALTH_PREFIX

OK_BODY = orjson.dumps({"code": 200, "msg": "success"})


class ServingStatus:
    """Online or offline, and how busy the node is. `on_offline` is called
    when the node goes offline, to wake the long polls it holds (they then
    see `ends_long_poll()` true). `now_s` is a monotonic clock.

    How busy: the command table (broker.http.commands) marks the API calls
    (`tracks`), and the connection's frame that runs one (broker.http.httpd)
    counts it in `in_flight` while it runs and sets `last_used_s` when it
    ends."""

    def __init__(self, idle_s: float, api_prefix: str, on_offline: Callable[[], None] = lambda: None,
                 now_s: Callable[[], float] = time.monotonic) -> None:
        self.idle_s = idle_s
        self.api_prefix = api_prefix
        self.on_offline = on_offline
        self.now_s = now_s
        self.online = True
        self.in_flight = 0
        self.last_used_s = now_s()  # as camellia: a node just started is not idle yet
        self._offlines = 0  # times the node went offline: a long poll older than the last one ends

    def __repr__(self) -> str:
        return (f"ServingStatus({'online' if self.online else 'offline'}, in_flight={self.in_flight}, "
                f"idle_for={self.now_s() - self.last_used_s:.1f}s of {self.idle_s:g}s)")

    def is_idle(self) -> bool:
        return self.in_flight == 0 and self.now_s() - self.last_used_s >= self.idle_s

    def go_offline(self) -> None:
        self.online = False
        self._offlines += 1
        self.on_offline()

    def ends_long_poll(self) -> Callable[[], bool]:
        """For a long poll starting now: true once the node has gone
        offline since."""
        offlines = self._offlines
        return lambda: self._offlines != offlines

    def tracks(self, method: str, path: str) -> bool:
        """Whether a request is an API call: a POST under the API's prefix."""
        return method == "POST" and path.startswith(self.api_prefix)

    def add_routes(self, table: CommandTable) -> None:
        for name, handle in (("status", self.status), ("check", self.check)):
            for method in ("GET", "POST"):
                table.add(method, HEALTH_PREFIX + name, handle, where=HERE, inline=True)  # (the switch: alike on all)
        # the switch changes state: POST only, so an <img> or a link on a web
        # page cannot take the node out of its load balancer
        table.add("POST", HEALTH_PREFIX + "online", self.set_online, where=EVERY_SHARD, inline=True)
        table.add("POST", HEALTH_PREFIX + "offline", self.set_offline, where=EVERY_SHARD, inline=True)

    async def status(self, request: Request) -> Response:
        return _ok() if self.online else _not_ok("offline")

    async def check(self, request: Request) -> Response:
        return _ok()

    async def set_online(self, request: Request) -> Response:
        self.online = True
        return _ok()

    async def set_offline(self, request: Request) -> Response:
        if self.online:
            self.go_offline()
        if self.is_idle():
            return _ok()
        return _not_ok(f"offline, not idle yet: {self.in_flight} API calls in flight, the last ended "
                       f"{self.now_s() - self.last_used_s:.1f} s ago (idle after {self.idle_s:g} s)")


def _ok() -> Response:
    return Response(200, OK_BODY)


def _not_ok(msg: str) -> Response:
    # HTTP 500 as camellia's: a load balancer or deploy script reads the status
    return Response(500, orjson.dumps({"code": 500, "msg": msg}))
