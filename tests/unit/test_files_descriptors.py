"""The descriptor limit: raised once by the server at start-up
(raise_descriptor_limit), read by each store to size its cache of open far
hours (far_hours_limit); opening a store changes no process limit."""

from __future__ import annotations

import resource

import pytest

from storage.config import StoreConfig
from storage.entry import MS_PER_HOUR
from storage.files import OTHER_DESCRIPTORS, far_hours_limit, raise_descriptor_limit
from storage.store import Store


@pytest.fixture
def lowered_soft_limit():
    old = resource.getrlimit(resource.RLIMIT_NOFILE)
    soft = 1000 if old[1] == resource.RLIM_INFINITY else min(1000, old[1])
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, old[1]))
    try:
        yield soft, old[1]
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, old)


def test_far_hours_fit_under_the_soft_limit(lowered_soft_limit):
    soft, _ = lowered_soft_limit
    assert far_hours_limit(100_000) == (soft - OTHER_DESCRIPTORS) // 3
    assert far_hours_limit(10) == 10
    assert far_hours_limit(1) == 4


def test_opening_a_store_leaves_the_limit_alone(lowered_soft_limit, tmp_path):
    soft, hard = lowered_soft_limit
    with Store.open(str(tmp_path), StoreConfig(), now_ms=490_000 * MS_PER_HOUR):
        assert resource.getrlimit(resource.RLIMIT_NOFILE) == (soft, hard)


def test_raise_goes_to_the_hard_limit(lowered_soft_limit):
    soft, hard = lowered_soft_limit
    raised = raise_descriptor_limit()
    assert raised == resource.getrlimit(resource.RLIMIT_NOFILE)[0] >= soft
    if hard != resource.RLIM_INFINITY:
        assert raised == hard
