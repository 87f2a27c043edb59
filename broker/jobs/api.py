"""redriveMsgs jobs' endpoints (docs/api.md, "Re-driving by filter"), beside
camellia's under the same prefix and answered the same way
(broker.http.api: the outcome's code in an HTTP 200):

    POST     /camellia/delayQueue/redriveMsgs  -> jobId, job
    GET/POST /camellia/delayQueue/getJob       -> job (with jobId), or jobs
    POST     /camellia/delayQueue/cancelJob    -> job

Bad parameters: code 400 naming the parameter (broker.core.bulk_params'
`parse_redrive_msgs`), no job made; no such job: 404; past --max-jobs:
429; a node whose jobs are not there yet (starting, a cluster without a
leader): 503.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from storage.errors import Conflict, Forbidden, HourglassError, InvalidRequest, LimitReached, NotFound, Unavailable

from ..core import params
from ..core.bodies import BodyLimits
from ..core.bulk_params import RedriveMsgsRequest, parse_job_id, parse_redrive_msgs
from ..http.api import answer
from ..http.commands import NODE, CommandTable, ErrorTable
from ..http.http_types import Request, Response
from ..http.paths import PREFIX
from .runner import RedriveJobs

JOB_ERRORS: ErrorTable = (
    (InvalidRequest, 400, 200),
    (NotFound, 404, 200),
    (Conflict, 409, 200),
    (Forbidden, 403, 200),
    (LimitReached, 429, 429),
    (Unavailable, 503, 503),
)

class JobCalls(Protocol):
    """How the node's jobs are made, found and cancelled: on this process's
    `RedriveJobs` (`LocalJobs`), or on every shard of a node of many
    (broker.shards.jobs' `ShardJobs`), as public records."""

    async def create(self, jobs: RedriveJobs, request: RedriveMsgsRequest) -> dict[str, Any]: ...
    async def one(self, jobs: RedriveJobs, op: str, job_id: str) -> dict[str, Any]: ...
    async def list(self, jobs: RedriveJobs) -> list[dict[str, Any]]: ...


class LocalJobs:
    """The node's jobs are this process's."""

    async def create(self, jobs: RedriveJobs, request: RedriveMsgsRequest) -> dict[str, Any]:
        return (await jobs.create(request)).public()

    async def one(self, jobs: RedriveJobs, op: str, job_id: str) -> dict[str, Any]:
        """`op` ("job_get", "job_cancel") of one job."""
        if op == "job_get":
            await jobs.sync()  # (a shared store's records as they are now: broker.redis.jobs)
            return jobs.get(job_id).public()
        return (await jobs.cancel(job_id)).public()

    async def list(self, jobs: RedriveJobs) -> list[dict[str, Any]]:
        return [job.public() for job in await jobs.jobs()]


class JobApi:
    """The endpoints over the node's `RedriveJobs` (None: what `absent`
    answers is raised -- 503 on a cluster node while no leader serves, on a
    Redis node while it reads the records --, or, if it answers None,
    Unavailable); `calls`: where the node's jobs are (a node of shards: on
    every shard, broker.shards.jobs)."""

    def __init__(self, jobs: Callable[[], RedriveJobs | None], bodies: BodyLimits, max_msg_bytes: int,
                 now_ms: Callable[[], int], absent: Callable[[], HourglassError | None] = lambda: None) -> None:
        self._jobs = jobs
        self._absent = absent
        self._bodies = bodies
        self._max_msg_bytes = max_msg_bytes
        self._now_ms = now_ms
        self.calls: JobCalls = LocalJobs()

    def __repr__(self) -> str:
        return f"JobApi({self.calls!r})"

    def add_routes(self, table: CommandTable) -> None:
        table.add("POST", PREFIX + "redriveMsgs", self.redrive_msgs, where=NODE, errors=JOB_ERRORS)  # (on every
        # shard under one jobId, by the job calls below)
        table.add("GET", PREFIX + "getJob", self.get, where=NODE, errors=JOB_ERRORS)
        table.add("POST", PREFIX + "getJob", self.get, where=NODE, errors=JOB_ERRORS)
        table.add("POST", PREFIX + "cancelJob", self.cancel, where=NODE, errors=JOB_ERRORS)

    def jobs(self) -> RedriveJobs:
        jobs = self._jobs()
        if jobs is None:
            raise self._absent() or Unavailable("the node's redriveMsgs jobs are not open yet; retry")
        return jobs

    def _params(self, request: Request) -> params.Params:
        return params.request_params(request.method, request.query, request.body, request.content_type,
                                     self._bodies, self._max_msg_bytes)

    async def redrive_msgs(self, request: Request) -> Response:
        r = parse_redrive_msgs(self._params(request), self._now_ms())
        job = await self.calls.create(self.jobs(), r)
        return answer(200, "success", jobId=job["jobId"], job=job)

    async def get(self, request: Request) -> Response:
        job_id = parse_job_id(self._params(request), required=False)
        jobs = self.jobs()
        if job_id is None:
            return answer(200, "success", jobs=await self.calls.list(jobs))
        return answer(200, "success", job=await self.calls.one(jobs, "job_get", job_id))

    async def cancel(self, request: Request) -> Response:
        job_id = parse_job_id(self._params(request))
        assert job_id is not None
        return answer(200, "success", job=await self.calls.one(self.jobs(), "job_cancel", job_id))
