"""redriveMsgs jobs on a node of many shards (docs/api.md, "Re-driving by
filter"): the shard a call reaches speaks for the node (`ShardJobs`, the
endpoints' `JobCalls`: broker.jobs.api). A redriveMsgs makes one job on
every shard under one jobId, each over its own dead letters, the limit
split evenly between them (`share`), the rate split too but its shares
moved to the shards whose part still runs (broker.shards.rates: the
node's job keeps its rate whichever shards hold the dead letters); getJob
merges the shards' records (counts summed, running while any runs);
cancelJob cancels on every shard.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import Any

from storage.errors import InvalidRequest, LimitReached, NotFound, Unavailable

from ..core.bulk_params import MAX_REDRIVE, DeadFilter, RedriveMsgsRequest
from ..jobs.runner import JobState, RedriveJobs, new_job_id
from .router import ShardRouter


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


class ShardJobs:
    """The node's jobs, one part on every shard under one jobId (see the module docstring)."""

    def __init__(self, router: ShardRouter) -> None:
        self._router = router

    def __repr__(self) -> str:
        return f"ShardJobs(shard {self._router.index} of {self._router.count})"

    async def create(self, jobs: RedriveJobs, request: RedriveMsgsRequest) -> dict[str, Any]:
        """The node's running jobs (a job runs while any shard's part does) against --max-jobs first."""
        router = self._router
        listed = await self.list(jobs)
        limit = jobs.limits.max_jobs
        running = sum(r["state"] == JobState.RUNNING.value for r in listed)
        if running >= limit:
            raise LimitReached(f"the node runs {running} redriveMsgs jobs and --max-jobs is {limit}: a job "
                               f"more is refused until one ends (cancelJob ends one); retry later")
        # the records that make room, the node's oldest ended jobs: the same dropped on every shard
        ended = sorted((rec for rec in listed if rec["state"] != JobState.RUNNING.value),
                       key=lambda rec: (rec["createTime"], rec["jobId"]))
        drop = [rec["jobId"] for rec in ended[:max(0, len(listed) - limit + 1)]]
        args = [request_fields(request), new_job_id(), drop]
        return merge_jobs(await router.everywhere(
            "job_create", args, lambda: serve_job_call(jobs, "job_create", args, router.index, router.count)))

    async def one(self, jobs: RedriveJobs, op: str, job_id: str) -> dict[str, Any]:
        router = self._router
        found: list[Any] = await router.everywhere(
            op + "_or_none", [job_id], lambda: _or_none(serve_job_call(jobs, op, [job_id], router.index,
                                                                       router.count)))
        records = [r for r in found if r is not None]
        if not records:
            jobs.get(job_id)  # this shard's NotFound: it says if the job's record was dropped, and why
            raise NotFound(f"no job {job_id!r}")
        return merge_jobs(records)

    async def list(self, jobs: RedriveJobs) -> list[dict[str, Any]]:
        router = self._router
        lists = await router.everywhere("job_list", [], lambda: serve_job_call(jobs, "job_list", [], router.index,
                                                                                 router.count))
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

