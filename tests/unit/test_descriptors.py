"""broker.http.descriptors: the connection ceiling that keeps descriptors free."""

from __future__ import annotations

import os

import pytest

from broker.http.descriptors import DescriptorBudget, open_count


def test_open_count_sees_a_new_descriptor():
    before = open_count()
    fd = os.open(os.devnull, os.O_RDONLY)
    try:
        assert open_count() == before + 1
    finally:
        os.close(fd)


def test_ceiling_is_the_limit_less_the_reserve_and_what_else_is_open():
    budget = DescriptorBudget(reserved=10, limit=10_000)
    assert budget.ceiling() is None  # nothing counted yet: only --max-connections bounds
    budget.measure(connections=0)
    others = budget.others
    assert others == open_count() and budget.ceiling() == 10_000 - 10 - others
    budget.measure(connections=3)  # three of the open descriptors are the caller's connections
    assert budget.others == max(0, open_count() - 3)
    assert DescriptorBudget(reserved=20_000, limit=10_000).ceiling() is None
    tight = DescriptorBudget(reserved=20_000, limit=10_000)
    tight.measure(0)
    assert tight.ceiling() == 0


def test_unlimited_means_no_ceiling_and_a_negative_reserve_is_refused():
    budget = DescriptorBudget(reserved=10)
    budget.limit = None
    budget.measure(0)
    assert budget.ceiling() is None
    with pytest.raises(ValueError, match="reserved"):
        DescriptorBudget(reserved=-1)
    assert "ceiling" in repr(budget)
