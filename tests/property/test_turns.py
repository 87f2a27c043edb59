"""broker.core.turns: calls of one key that start in one turn of the loop
are carried out as one call, and each gets what it alone would have got."""

from __future__ import annotations

import asyncio

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
        joined = Turns(recorder.carry_out, max_items=1000)
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


def test_a_refused_turn_has_each_call_carry_its_own_out_alone():
    """A turn the carry-out refuses fails none of its calls for another's
    items: each then meets what it alone meets."""
    recorder = Recorder(fail_on=7)

    async def main() -> list[object]:
        joined = Turns(recorder.carry_out, max_items=1000)
        return await asyncio.gather(joined.join("a", [1]), joined.join("a", [7]), joined.join("a", [2, 3]),
                                    joined.join("b", [3]), return_exceptions=True)

    first, second, third, other = asyncio.run(main())
    assert first == [2] and third == [4, 6] and other == [6]
    assert isinstance(second, ValueError)
    assert ("a", [1, 7, 2, 3]) in recorder.calls and ("a", [7]) in recorder.calls


@settings(max_examples=100, deadline=None)
@given(sizes=st.lists(st.integers(1, 5), min_size=1, max_size=20), max_items=st.integers(5, 12))
def test_a_full_turn_is_carried_out_and_the_next_call_starts_another(sizes, max_items):
    recorder = Recorder()

    async def main() -> list[list[int]]:
        joined = Turns(recorder.carry_out, max_items=max_items)
        calls = [list(range(sum(sizes[:i]), sum(sizes[:i + 1]))) for i in range(len(sizes))]
        return await asyncio.gather(*(joined.join("a", items) for items in calls))

    answers = asyncio.run(main())
    assert [i for a in answers for i in a] == [2 * i for i in range(sum(sizes))]
    assert all(len(items) <= max_items for _, items in recorder.calls)
    assert -(-sum(sizes) // max_items) <= len(recorder.calls) <= len(sizes)


def test_a_cancelled_call_leaves_the_others_answered():
    recorder = Recorder()

    async def main() -> tuple[list[int], bool]:
        joined = Turns(recorder.carry_out, max_items=1000)
        leader = asyncio.ensure_future(joined.join("a", [1]))
        follower = asyncio.ensure_future(joined.join("a", [2]))
        late = asyncio.ensure_future(joined.join("a", [3]))
        await asyncio.sleep(0)  # each has joined
        follower.cancel()
        answers = await asyncio.gather(leader, late)
        return answers[0] + answers[1], follower.cancelled()

    got, cancelled = asyncio.run(main())
    assert got == [2, 6] and cancelled


def test_a_cancelled_first_call_leaves_those_that_joined_it_to_carry_their_own_out():
    async def main() -> None:
        never = asyncio.Event()

        async def carry_out(key: str, items: list[int]) -> list[int]:
            if 1 in items:
                await never.wait()
            return items

        joined = Turns(carry_out, max_items=1000)
        leader = asyncio.ensure_future(joined.join("a", [1]))
        follower = asyncio.ensure_future(joined.join("a", [2]))
        await asyncio.sleep(0.01)
        leader.cancel()
        assert await asyncio.wait_for(follower, 1) == [2]
        # a call after it is a turn of its own, not the cancelled one's
        assert await asyncio.wait_for(joined.join("a", [5]), 1) == [5]

    asyncio.run(main())
