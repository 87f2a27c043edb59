"""broker.core.turns: calls of one key that start in one turn of the loop
are carried out as one call, and each gets what it alone would have got."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.core.turns import Turns


class Recorder:
    """carry_out: each item doubled, every call recorded."""

    def __init__(self, fail_on: int | None = None) -> None:
        self.calls: list[tuple[str, list[int]]] = []
        self.fail_on = fail_on

    async def carry_out(self, key: str, items: list[int]) -> list[int]:
        self.calls.append((key, list(items)))
        await asyncio.sleep(0)
        if self.fail_on is not None and self.fail_on in items:
            raise ValueError(f"{self.fail_on} refused")
        return [2 * i for i in items]


# Each turn: the calls started in it, each (key, items).
_CALLS = st.lists(st.tuples(st.sampled_from("abc"), st.lists(st.integers(0, 99), min_size=1, max_size=4)),
                  min_size=1, max_size=12)


@settings(max_examples=200, deadline=None)
@given(turns=st.lists(_CALLS, min_size=1, max_size=4))
def test_each_call_gets_its_own_results_and_each_key_is_one_call_a_turn(turns):
    recorder = Recorder()

    async def main() -> list[list[list[int]]]:
        joined = Turns(recorder.carry_out)
        answers = []
        for calls in turns:  # the calls of one turn start together, then the turn ends
            answers.append(await asyncio.gather(*(joined.join(key, items) for key, items in calls)))
        return answers

    answers = asyncio.run(main())
    for calls, got in zip(turns, answers):
        assert got == [[2 * i for i in items] for _, items in calls]
    expected_calls = []
    for calls in turns:
        keys = list(dict.fromkeys(key for key, _ in calls))
        expected_calls += [(key, [i for k, items in calls if k == key for i in items]) for key in keys]
    assert sorted(recorder.calls) == sorted(expected_calls)


def test_a_refused_turn_fails_every_call_that_joined_it_and_no_other():
    recorder = Recorder(fail_on=7)

    async def main() -> list[object]:
        joined = Turns(recorder.carry_out)
        return await asyncio.gather(joined.join("a", [1]), joined.join("a", [7]), joined.join("b", [3]),
                                    return_exceptions=True)

    first, second, other = asyncio.run(main())
    assert isinstance(first, ValueError) and isinstance(second, ValueError)
    assert other == [6]


def test_a_cancelled_call_leaves_the_others_answered():
    recorder = Recorder()

    async def main() -> tuple[list[int], bool]:
        joined = Turns(recorder.carry_out)
        leader = asyncio.ensure_future(joined.join("a", [1]))
        follower = asyncio.ensure_future(joined.join("a", [2]))
        late = asyncio.ensure_future(joined.join("a", [3]))
        await asyncio.sleep(0)  # each has joined
        follower.cancel()
        answers = await asyncio.gather(leader, late)
        return answers[0] + answers[1], follower.cancelled()

    got, cancelled = asyncio.run(main())
    assert got == [2, 6] and cancelled


def test_a_cancelled_first_call_cancels_those_that_waited_on_it():
    async def main() -> None:
        never = asyncio.Event()

        async def carry_out(key: str, items: list[int]) -> list[int]:
            if 1 in items:
                await never.wait()
            return items

        joined = Turns(carry_out)
        leader = asyncio.ensure_future(joined.join("a", [1]))
        follower = asyncio.ensure_future(joined.join("a", [2]))
        await asyncio.sleep(0.01)
        leader.cancel()
        with pytest.raises(asyncio.CancelledError):
            await follower
        # a call after it is a turn of its own, not the cancelled one's
        assert await asyncio.wait_for(joined.join("a", [5]), 1) == [5]

    asyncio.run(main())
