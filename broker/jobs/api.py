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

On a node of many shards (broker.shards) the shard a call reaches speaks
for the node (`ShardJobs`): a redriveMsgs makes one job on every shard
under one jobId, each over its own dead letters, the limit split evenly
between them (`share`), the rate split too but its shares moved to the
shards whose part still runs (broker.shards.rates: the node's job keeps
its rate whichever shards hold the dead letters); getJob merges the shards' records
(counts summed, running while any runs); cancelJob cancels on every shard.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from storage.errors import Conflict, Forbidden, HourglassError, InvalidRequest, LimitReached, NotFound, Unavailable

from ..core import params
from ..core.bodies import BodyLimits
from ..core.bulk_params import MAX_REDRIVE, DeadFilter, RedriveMsgsRequest, parse_job_id, parse_redrive_msgs
from ..http.api import answer
from ..http.commands import NODE, CommandTable, ErrorTable
from ..http.http_types import Request, Response
from ..http.paths import PREFIX
from .runner import JobState, RedriveJobs, new_job_id

JOB_ERRORS: ErrorTable = (
    (InvalidRequest, 400, 200),
    (NotFound, 404, 200),
    (Conflict, 409, 200),
    (Forbidden, 403, 200),
    (LimitReached, 429, 429),
    (Unavailable, 503, 503),
)

class ShardCalls(Protocol):
    """What a node of many shards offers the jobs' endpoints (broker.shards.router)."""

    async def everywhere(self, op: str, args: list[Any], here: Callable[[], Awaitable[Any]]) -> list[Any]: ...

    index: int
    count: int


def share(total: int, index: int, count: int) -> int:
    """Shard `index`'s part of `total` split evenly over `count` shards (the
    parts sum to `total`; each at least 1 while `total` is, so a small
    rate still paces every shard)."""
    if total == 0:
        return 0
    return max(1, total // count + (1 if index < total % count else 0))


def request_fields(r: RedriveMsgsRequest) -> list[Any]:
    return [r.topic, r.filter.fields(), r.trigger_ms, r.rate, r.limit]


def request_of(fields: Sequence[Any]) -> RedriveMsgsRequest:
    return RedriveMsgsRequest(fields[0], DeadFilter.of(fields[1]), fields[2], fields[3], fields[4])


async def serve_job_call(jobs: RedriveJobs, op: str, args: Sequence[Any], index: int, count: int) -> Any:
    """A job call another shard made of this one (broker.shards.router)."""
    if op == "job_create":
        r = request_of(args[0])
        # an explicit limit split evenly, the parts summing to it (a part may be 0: that shard re-drives
        # none); without one (MAX_REDRIVE) each shard re-drives all of its own
        limit = r.limit if r.limit >= MAX_REDRIVE else r.limit // count + (1 if index < r.limit % count else 0)
        node_rate = r.rate  # (each shard's share of it moved by demand: broker.shards.rates)
        r = r._replace(rate=share(r.rate, index, count), limit=limit)
        return (await jobs.create(r, args[1], node_rate, drop=args[2] if len(args) > 2 else ())).public()
    if op == "job_get":
        return jobs.get(args[0]).public()
    if op == "job_list":
        return [job.public() for job in await jobs.jobs()]
    if op == "job_cancel":
        return (await jobs.cancel(args[0])).public()
    raise InvalidRequest("op", f"no job call {op!r}")


def merge_jobs(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One job's records on several shards as one: counts, rate and limit
    summed (the limit at most MAX_REDRIVE, as the call's); running while any runs, else failed if any failed, else
    cancelled if any was, else done; ended when the last ended."""
    merged = dict(records[0])
    for field in ("matched", "redriven", "skipped", "rate", "limit"):
        merged[field] = sum(r[field] for r in records)
    merged["limit"] = min(merged["limit"], MAX_REDRIVE)  # (no limit given: each shard's is MAX_REDRIVE)
    states = {r["state"] for r in records}
    for state in (JobState.RUNNING, JobState.FAILED, JobState.CANCELLED, JobState.DONE):
        if state.value in states:
            merged["state"] = state.value
            break
    merged["createTime"] = min(r["createTime"] for r in records)
    ends = [r["endTime"] for r in records]
    merged["endTime"] = None if merged["state"] == JobState.RUNNING.value or None in ends else max(ends)
    merged["error"] = next((r["error"] for r in records if r.get("error")), None)
    return merged


class JobApi:
    """The endpoints over the node's `RedriveJobs` (None: what `absent`
    answers is raised -- 503 on a cluster node while no leader serves, on a
    Redis node while it reads the records --, or, if it answers None,
    Unavailable); `shards`: the node's other shards."""

    def __init__(self, jobs: Callable[[], RedriveJobs | None], bodies: BodyLimits, max_msg_bytes: int,
                 now_ms: Callable[[], int], absent: Callable[[], HourglassError | None] = lambda: None) -> None:
        self._jobs = jobs
        self._absent = absent
        self._bodies = bodies
        self._max_msg_bytes = max_msg_bytes
        self._now_ms = now_ms
        self.shards: ShardCalls | None = None

    def __repr__(self) -> str:
        return f"JobApi(shards={self.shards is not None})"

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
        jobs = self.jobs()
        shards = self.shards
        if shards is None:
            job = (await jobs.create(r)).public()
        else:  # the node's running jobs (a job runs while any shard's part does) against --max-jobs first
            listed = await self._list(jobs)
            limit = jobs.limits.max_jobs
            running = sum(r["state"] == JobState.RUNNING.value for r in listed)
            if running >= limit:
                raise LimitReached(f"the node runs {running} redriveMsgs jobs and --max-jobs is {limit}: a job "
                                   f"more is refused until one ends (cancelJob ends one); retry later")
            # the records that make room, the node's oldest ended jobs: the same dropped on every shard
            ended = sorted((rec for rec in listed if rec["state"] != JobState.RUNNING.value),
                           key=lambda rec: (rec["createTime"], rec["jobId"]))
            drop = [rec["jobId"] for rec in ended[:max(0, len(listed) - limit + 1)]]
            job_id = new_job_id()
            args = [request_fields(r), job_id, drop]
            job = merge_jobs(await shards.everywhere(
                "job_create", args, lambda: serve_job_call(jobs, "job_create", args, shards.index, shards.count)))
        return answer(200, "success", jobId=job["jobId"], job=job)

    async def get(self, request: Request) -> Response:
        job_id = parse_job_id(self._params(request), required=False)
        jobs = self.jobs()
        if job_id is None:
            return answer(200, "success", jobs=await self._list(jobs))
        return answer(200, "success", job=await self._one(jobs, "job_get", job_id))

    async def cancel(self, request: Request) -> Response:
        job_id = parse_job_id(self._params(request))
        assert job_id is not None
        return answer(200, "success", job=await self._one(self.jobs(), "job_cancel", job_id))

    async def _one(self, jobs: RedriveJobs, op: str, job_id: str) -> dict[str, Any]:
        shards = self.shards
        if shards is None:
            if op == "job_get":
                await jobs.sync()  # (a shared store's records as they are now: broker.redis.jobs)
                return jobs.get(job_id).public()
            return (await jobs.cancel(job_id)).public()
        found: list[Any] = await shards.everywhere(
            op + "_or_none", [job_id], lambda: _or_none(serve_job_call(jobs, op, [job_id], shards.index,
                                                                       shards.count)))
        records = [r for r in found if r is not None]
        if not records:
            jobs.get(job_id)  # this shard's NotFound: it says if the job's record was dropped, and why
            raise NotFound(f"no job {job_id!r}")
        return merge_jobs(records)

    async def _list(self, jobs: RedriveJobs) -> list[dict[str, Any]]:
        shards = self.shards
        if shards is None:
            return [job.public() for job in await jobs.jobs()]
        lists = await shards.everywhere("job_list", [], lambda: serve_job_call(jobs, "job_list", [], shards.index,
                                                                                 shards.count))
        by_id: dict[str, list[dict[str, Any]]] = {}
        for records in lists:
            for record in records:
                by_id.setdefault(record["jobId"], []).append(record)
        merged = [merge_jobs(records) for records in by_id.values()]
        return sorted(merged, key=lambda r: (-r["createTime"], r["jobId"]))


async def _or_none(call: Awaitable[Any]) -> Any:
    """`call`'s answer, or None for NotFound (a shard that has not the job)."""
    try:
        return await call
    except NotFound:
        return None


# The job calls a shard answers for the others (serve_shard_call).
JOB_OPS = ("job_create", "job_list", "job_get_or_none", "job_cancel_or_none")


async def serve_shard_call(jobs: RedriveJobs | None, op: str, args: Sequence[Any], index: int, count: int) -> Any:
    """A job call another shard made of this one: `job_*` (and
    `job_get_or_none`, `job_cancel_or_none`: None for a job it has not)."""
    if jobs is None:
        raise Unavailable("the shard is starting; retry")
    if op.endswith("_or_none"):
        return await _or_none(serve_job_call(jobs, op.removesuffix("_or_none"), args, index, count))
    return await serve_job_call(jobs, op, args, index, count)

