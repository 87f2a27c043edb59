"""broker.core.bulk_params: a `PageKeeper` offered candidates in any order
keeps exactly the first `limit` past the cursor in (trigger time, msgId)
order, and its cursor resumes after them, so paging walks every match
once; a cursor it answers parses back to itself."""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import given

from broker.core.bulk_params import Cursor, PageKeeper, parse_cursor
from storage.entry import Location, Message, Status


def message(trigger_ms: int, msg_id: str) -> Message:
    return Message("t", msg_id, "m", 0, trigger_ms, 1000, 1, 0, "", Status.WAITING, 0, Location(0, 0))


candidates = st.dictionaries(st.text(st.characters(codec="utf-8", exclude_characters="\0"), min_size=1, max_size=6),
                             st.integers(0, 20), max_size=40)


def walk(by_id: dict[str, int], limit: int, rnd, narrowed: bool) -> list[tuple[int, str]]:
    """Every page in turn, each offered the candidates in a random order
    (`narrowed`: only those in the page's `scan_range` when offered, as
    the disk broker's listMsg scan reads only the files in it)."""
    got: list[tuple[int, str]] = []
    cursor = None
    for _ in range(len(by_id) + 2):
        items = [message(t, i) for i, t in by_id.items()]
        rnd.shuffle(items)
        keeper = PageKeeper(cursor, limit)
        for m in items:
            low, high = keeper.scan_range() if narrowed else (None, None)
            if (low is None or m.trigger_ms >= low) and (high is None or m.trigger_ms < high) and \
                    keeper.worth(m.trigger_ms):
                keeper.offer(m)
        page, cursor = keeper.page()
        assert len(page) <= limit
        got += [(m.trigger_ms, m.msg_id) for m in page]
        if cursor is None:
            break
        assert len(page) == limit
        assert parse_cursor(cursor.text()) == cursor
    return got


@given(candidates, st.integers(1, 7), st.randoms())
def test_paging_walks_every_candidate_once_in_order(by_id, limit, rnd):
    assert walk(by_id, limit, rnd, narrowed=False) == sorted((t, i) for i, t in by_id.items())


@given(candidates, st.integers(1, 7), st.randoms())
def test_a_scan_narrowed_to_the_pages_range_still_walks_every_candidate_once(by_id, limit, rnd):
    """What a narrowed scan leaves out never changes a page, and a page
    ends the walk only at the end."""
    assert walk(by_id, limit, rnd, narrowed=True) == sorted((t, i) for i, t in by_id.items())


@given(st.integers(0, 10**15), st.text(st.characters(codec="utf-8", exclude_characters="\0"), min_size=1))
def test_a_cursor_parses_back(trigger_ms, msg_id):
    assert parse_cursor(Cursor(trigger_ms, msg_id).text()) == Cursor(trigger_ms, msg_id)
