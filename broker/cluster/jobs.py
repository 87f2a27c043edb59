"""A cluster's redriveMsgs jobs (docs/api.md, "Re-driving by filter"): each
job's record kept in the Raft group's replicated state, beside the
recurring schedules (replication.election's `set_schedules`, under the key
["j", "", jobId], which broker.cluster.schedules passes over), so a job
answered is on a majority and every node that comes to lead reads it.
Only the leader runs jobs: it builds broker.jobs.runner's `RedriveJobs`
over this store when it starts leading (its claim committed: every entry
an older leader committed is applied by then) and resumes the running ones
from their cursors; it stops them when it stands down.

A running job's progress is written at most every SAVE_EVERY_S (a Raft
command each), not every slice: a new leader resumes from the last cursor
written, passing the messages re-driven since (no longer dead: each slice's
moves are in the replicated log before its cursor is), and its counts miss
those of the slices since that write.
"""

from __future__ import annotations

from collections.abc import Mapping

import orjson

from replication.election import Election
from storage.errors import ContractError, InvalidRequest, Unavailable

from .schedules import COMMAND_BYTES, entry_key

# Seconds between two writes of a running job's progress.
SAVE_EVERY_S = 0.5
KIND = "j"


def job_key(job_id: str) -> str:
    return entry_key(KIND, ("", job_id))


class RaftJobs:
    """broker.jobs.runner's JobStore over the Raft group's state."""

    save_every_s = SAVE_EVERY_S

    def __init__(self, election: Election) -> None:
        self._election = election

    def __repr__(self) -> str:
        return "RaftJobs()"

    def load(self) -> list[dict[str, object]]:
        return [orjson.loads(value) for raw_key, value in self._election.schedules().items()
                if orjson.loads(raw_key)[0] == KIND]

    async def save(self, record: Mapping[str, object]) -> None:
        job_id = record["jobId"]
        assert isinstance(job_id, str)
        value = orjson.dumps(record)
        if len(value) > COMMAND_BYTES - 100:
            raise InvalidRequest("key", f"the job's filter is too long to replicate ({len(value)} bytes of record, "
                                 f"at most {COMMAND_BYTES - 100}); use shorter key, tag or msgIdPrefix")
        await self._write(job_key(job_id), value)

    async def remove(self, job_id: str) -> None:
        await self._write(job_key(job_id), None)

    async def fetch(self) -> tuple[list[dict[str, object]], set[str]] | None:
        return None  # only the leader writes them: its RAM is the truth

    async def ask_cancel(self, job_id: str) -> None:
        raise ContractError("RaftJobs is written by one node: its RedriveJobs cancels in RAM")

    async def _write(self, key: str, value: bytes | None) -> None:
        if not await self._election.set_schedules([(key, value)]):
            raise Unavailable("the job's record did not reach a majority of the cluster in time; retry")
