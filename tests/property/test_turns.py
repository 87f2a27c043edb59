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


# Each burst: calls started together (each key's first goes at once; the
# others of its key come while it is carried out, and join one turn).
_CALLS = st.lists(st.tuples(st.sampled_from("abc"), st.lists(st.integers(0, 99), min_size=1, max_size=4)),
                  min_size=1, max_size=12)


@settings(max_examples=200, deadline=None)
@given(bursts=st.lists(_CALLS, min_size=1, max_size=4))
def test_each_call_gets_its_own_results_and_those_that_came_meanwhile_are_one_call(bursts):
    recorder = Recorder()

    async def main() -> list[list[list[int]]]:
        joined = Turns(recorder.carry_out, max_items=1000)
        answers = []
        for calls in bursts:
            answers.append(await asyncio.gather(*(joined.join(key, items) for key, items in calls)))
        return answers

    answers = asyncio.run(main())
    for calls, got in zip(bursts, answers):
        assert got == [[2 * i for i in items] for _, items in calls]
    expected_calls = []
    for calls in bursts:
        for key in dict.fromkeys(key for key, _ in calls):
            mine = [items for k, items in calls if k == key]
            expected_calls.append((key, mine[0]))  # at once
            if mine[1:]:
                expected_calls.append((key, [i for items in mine[1:] for i in items]))  # one turn, after it
    assert sorted(recorder.calls) == sorted(expected_calls)


def test_a_lone_call_goes_at_once_and_waits_for_no_turn():
    recorder = Recorder()

    async def main() -> list[int]:
        joined = Turns(recorder.carry_out, max_items=1000)
        call = asyncio.ensure_future(joined.join("a", [4]))
        await asyncio.sleep(0)  # its first step: carried out already (nothing else of "a" in progress)
        assert recorder.calls == [("a", [4])]
        return await call

    assert asyncio.run(main()) == [8]


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
    assert ("a", [7, 2, 3]) in recorder.calls and ("a", [7]) in recorder.calls  # ([1] went at once)


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


def test_a_cancelled_call_in_progress_lets_the_next_turn_go():
    async def main() -> None:
        never = asyncio.Event()

        async def carry_out(key: str, items: list[int]) -> list[int]:
            if 1 in items:
                await never.wait()
            return items

        joined = Turns(carry_out, max_items=1000)
        first = asyncio.ensure_future(joined.join("a", [1]))
        await asyncio.sleep(0)
        waiting = asyncio.ensure_future(joined.join("a", [2]))
        await asyncio.sleep(0.01)
        assert not waiting.done()  # its turn waits for the call in progress
        first.cancel()
        assert await asyncio.wait_for(waiting, 1) == [2]
        assert await asyncio.wait_for(joined.join("a", [5]), 1) == [5]

    asyncio.run(main())
