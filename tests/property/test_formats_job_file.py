"""The jobs directory (broker.jobs.file): a job's record reads back as it
was saved, across a reopen; a file cut short, grown, or with any byte of
it changed is refused at open with a CorruptionError naming the file and
the offset (never read as another record); a `.tmp` a crash left behind
is removed; a file named for another job is refused.
"""

from __future__ import annotations

import asyncio
import os
import tempfile

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from broker.core.bulk_params import DeadFilter
from broker.jobs import file as job_file
from broker.jobs.file import JobFiles
from broker.jobs.runner import Job, JobState
from storage.entry import Location, Status
from storage.errors import CorruptionError

names = st.one_of(st.none(), st.text(min_size=1, max_size=20))
times = st.one_of(st.none(), st.integers(0, 2**42))
counts = st.integers(0, 2**40)
jobs = st.builds(
    Job, st.text("0123456789abcdef", min_size=16, max_size=16), st.text(min_size=1, max_size=30),
    st.builds(DeadFilter, names, names, names,
              st.sampled_from([frozenset({Status.EXPIRED}), frozenset({Status.ENDED}),
                               frozenset({Status.EXPIRED, Status.ENDED})]), times, times),
    times, st.integers(0, 10**6), st.integers(1, 10**8), st.integers(0, 2**42),
    st.builds(Location, st.integers(0, 2**24), st.integers(0, 2**32)), counts, counts,
    st.sampled_from(list(JobState)), times, st.one_of(st.none(), st.text(max_size=40)))


@settings(max_examples=200, deadline=None)
@given(jobs)
def test_a_record_reads_back_as_saved(job):
    data = job_file.encode(job.stored())
    assert Job.from_stored(job_file.decode("j", data)) == job


@settings(max_examples=30, deadline=None)
@given(st.lists(jobs, min_size=1, max_size=4, unique_by=lambda j: j.job_id))
def test_a_directory_reads_back_every_job_across_a_reopen(saved):
    with tempfile.TemporaryDirectory() as directory:
        files = JobFiles(os.path.join(directory, "jobs"))
        for job in saved:
            asyncio.run(files.save(job.stored()))
        asyncio.run(files.save(saved[0].stored()))  # saved again: replaced
        loaded = {j.job_id: j for j in map(Job.from_stored, JobFiles(os.path.join(directory, "jobs")).load())}
        assert loaded == {j.job_id: j for j in saved}
        asyncio.run(files.remove(saved[0].job_id))
        assert saved[0].job_id not in {r["jobId"] for r in files.load()}


JOB = Job("00112233aabbccdd", "t", DeadFilter(tag="red"), None, 500, 2000, 1_700_000_000_000, Location(480_000, 7),
          300, 290)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_a_damaged_file_is_refused_naming_file_and_offset(data):
    good = job_file.encode(JOB.stored())
    how = data.draw(st.sampled_from(["cut", "grown", "flipped"]))
    if how == "cut":
        bad = good[:data.draw(st.integers(0, len(good) - 1))]
    elif how == "grown":
        bad = good + data.draw(st.binary(min_size=1, max_size=20))
    else:
        at = data.draw(st.integers(0, len(good) - 1))
        bad = good[:at] + bytes([good[at] ^ data.draw(st.integers(1, 255))]) + good[at + 1:]
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, JOB.job_id + job_file.SUFFIX)
        with open(path, "wb") as f:
            f.write(bad)
        with pytest.raises(CorruptionError) as raised:
            JobFiles(directory).load()
        assert raised.value.path == path and 0 <= raised.value.offset <= job_file.HEADER.size


def test_a_leftover_tmp_is_removed_and_a_misnamed_file_refused():
    with tempfile.TemporaryDirectory() as directory:
        with open(os.path.join(directory, JOB.job_id + ".job.tmp"), "wb") as f:
            f.write(b"HGJB half a write")
        assert JobFiles(directory).load() == []
        assert os.listdir(directory) == []
        with open(os.path.join(directory, "ffffffffffffffff.job"), "wb") as f:
            f.write(job_file.encode(JOB.stored()))
        with pytest.raises(CorruptionError, match="not the one it is named for"):
            JobFiles(directory).load()
