"""Recurring schedules' endpoints (docs/api.md, "Recurring schedules"),
beside camellia's under the same prefix and answered the same way
(broker.http.api: the outcome's code in an HTTP 200):

    POST /camellia/delayQueue/putSchedule     -> schedule
    POST /camellia/delayQueue/deleteSchedule
    POST /camellia/delayQueue/pauseSchedule   -> schedule
    POST /camellia/delayQueue/resumeSchedule  -> schedule
    GET  /camellia/delayQueue/getSchedule     -> schedule, with lastRuns
    GET  /camellia/delayQueue/listSchedules   -> schedules, cursor

Bad parameters: code 400 naming the parameter (broker.schedules.params),
nothing stored; no such schedule: 404; a `version` that is not the
stored one: 409; past --max-schedules or --max-schedule-bytes: 429.
"""

from __future__ import annotations

from collections.abc import Callable

from storage.errors import Conflict, Forbidden, HourglassError, InvalidRequest, LimitReached, NotFound, Unavailable

from ..core import params
from ..core.bodies import BodyLimits
from ..core.params import Defaults
from ..http.api import answer
from ..http.commands import CommandTable, ErrorTable, on_every, on_owner
from ..http.http_types import Request, Response
from ..http.paths import PREFIX
from .keeper import Schedules
from .params import (
    DEFAULT_NEXT,
    parse_get_schedule,
    parse_list_schedules,
    parse_put_schedule,
    parse_schedule_ref,
)

# A schedule's calls run on the shard its scheduleId places it on.
BY_ID = on_owner("scheduleId")

SCHEDULE_ERRORS: ErrorTable = (
    (InvalidRequest, 400, 200),
    (NotFound, 404, 200),
    (Conflict, 409, 200),
    (Forbidden, 403, 200),
    (LimitReached, 429, 429),
    (Unavailable, 503, 503),
)

# Why a node without schedules refuses the calls (code 403).
NO_SCHEDULES = "recurring schedules are not served by this kind of node"


class ScheduleApi:
    """The endpoints over the node's `Schedules` (None: what `absent`
    answers is raised, e.g. 503 on a Redis node that does not hold the
    schedules lease; or, if it answers None, 403: this kind of node has none)."""

    def __init__(self, schedules: Callable[[], Schedules | None], defaults: Defaults, bodies: BodyLimits,
                 max_msg_bytes: int, now_ms: Callable[[], int],
                 absent: Callable[[], HourglassError | None] = lambda: None) -> None:
        self._schedules = schedules
        self._absent = absent
        self._defaults = defaults
        self._bodies = bodies
        self._max_msg_bytes = max_msg_bytes
        self._now_ms = now_ms

    def add_routes(self, table: CommandTable) -> None:
        table.add("POST", PREFIX + "putSchedule", self.put, where=BY_ID, errors=SCHEDULE_ERRORS)
        table.add("POST", PREFIX + "deleteSchedule", self.delete, where=BY_ID, errors=SCHEDULE_ERRORS)
        table.add("POST", PREFIX + "pauseSchedule", self.pause, where=BY_ID, errors=SCHEDULE_ERRORS)
        table.add("POST", PREFIX + "resumeSchedule", self.resume, where=BY_ID, errors=SCHEDULE_ERRORS)
        table.add("GET", PREFIX + "getSchedule", self.get, where=BY_ID, errors=SCHEDULE_ERRORS)
        table.add("GET", PREFIX + "listSchedules", self.list, where=on_every("schedules_page"),
                  errors=SCHEDULE_ERRORS)

    def schedules(self) -> Schedules:
        schedules = self._schedules()
        if schedules is None:
            raise self._absent() or Forbidden(NO_SCHEDULES)
        return schedules

    def _params(self, request: Request) -> params.Params:
        return params.request_params(request.method, request.query, request.body, request.content_type,
                                     self._bodies, self._max_msg_bytes)

    async def put(self, request: Request) -> Response:
        spec, version = parse_put_schedule(self._params(request), now_ms=self._now_ms(), defaults=self._defaults,
                                           max_msg_bytes=self._max_msg_bytes)
        state = await self.schedules().put(spec, version)
        return answer(200, "success", schedule=state.public(DEFAULT_NEXT))

    async def delete(self, request: Request) -> Response:
        topic, schedule_id = parse_schedule_ref(self._params(request))
        await self.schedules().delete(topic, schedule_id)
        return answer(200, "success")

    async def pause(self, request: Request) -> Response:
        topic, schedule_id = parse_schedule_ref(self._params(request))
        state = await self.schedules().pause(topic, schedule_id)
        return answer(200, "success", schedule=state.public(DEFAULT_NEXT))

    async def resume(self, request: Request) -> Response:
        topic, schedule_id = parse_schedule_ref(self._params(request))
        state = await self.schedules().resume(topic, schedule_id)
        return answer(200, "success", schedule=state.public(DEFAULT_NEXT))

    async def get(self, request: Request) -> Response:
        topic, schedule_id, following = parse_get_schedule(self._params(request))
        schedules = self.schedules()
        state = await schedules.fetch(topic, schedule_id)
        last_runs = await schedules.last_runs(state)
        return answer(200, "success", schedule={**state.public(following), "lastRuns": last_runs})

    async def list(self, request: Request) -> Response:
        topic, cursor, limit = parse_list_schedules(self._params(request))
        states, next_cursor = await self.schedules().fetch_page(topic, cursor, limit)
        return answer(200, "success", schedules=[s.public(DEFAULT_NEXT) for s in states], cursor=next_cursor)
