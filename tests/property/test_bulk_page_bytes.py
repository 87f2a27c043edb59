"""broker.core.bulk_params: a `PageKeeper` with a byte budget keeps exactly the
longest prefix, in (trigger time, msgId) order, of the candidates past the
cursor that fits `limit` messages and `max_bytes` bytes of answer (at least
one message), whatever order they are offered in; paging walks every match
once; `cut_page` cuts an answered page the same way."""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import given

from broker.core.bulk_params import Cursor, PageKeeper, answer_bytes, cut_page
from storage.entry import Location, Message, Status


def message(trigger_ms: int, msg_id: str, size: int) -> Message:
    return Message("t", msg_id, "m" * size, 0, trigger_ms, 1000, 1, 0, "", Status.WAITING, 0, Location(0, 0))


candidates = st.dictionaries(st.text(st.characters(codec="utf-8", exclude_characters="\0"), min_size=1, max_size=6),
                             st.tuples(st.integers(0, 20), st.integers(0, 900)), max_size=40)


def expected_page(ordered: list[Message], limit: int, max_bytes: int) -> list[Message]:
    page: list[Message] = []
    size = 0
    for m in ordered:
        size += answer_bytes(m)
        if len(page) == limit or (page and size > max_bytes):
            break
        page.append(m)
    return page


@given(candidates, st.integers(1, 7), st.integers(1, 3000), st.randoms())
def test_a_page_is_the_longest_prefix_that_fits_and_paging_walks_every_candidate(by_id, limit, max_bytes, rnd):
    every = sorted((message(t, i, size) for i, (t, size) in by_id.items()), key=lambda m: (m.trigger_ms, m.msg_id))
    got: list[Message] = []
    cursor: Cursor | None = None
    for _ in range(len(every) + 2):
        rest = [m for m in every if cursor is None or (m.trigger_ms, m.msg_id) > cursor]
        items = list(rest)
        rnd.shuffle(items)
        keeper = PageKeeper(cursor, limit, max_bytes)
        for m in items:
            if keeper.worth(m.trigger_ms):
                keeper.offer(m)
        page, cursor = keeper.page()
        assert page == expected_page(rest, limit, max_bytes)
        got += page
        if cursor is None:
            break
        assert cursor == Cursor(page[-1].trigger_ms, page[-1].msg_id)
    assert got == every


@given(candidates, st.integers(1, 3000))
def test_cut_page_keeps_the_prefix_that_fits(by_id, max_bytes):
    every = sorted((message(t, i, size) for i, (t, size) in by_id.items()), key=lambda m: (m.trigger_ms, m.msg_id))
    page, cursor = cut_page(every, None, max_bytes)
    assert page == expected_page(every, len(every) or 1, max_bytes)
    if len(page) < len(every):
        assert cursor == Cursor(page[-1].trigger_ms, page[-1].msg_id).text()
    else:
        assert cursor is None


def test_answer_bytes_counts_escapes():
    plain, escaped = message(0, "a", 0)._replace(msg="xx"), message(0, "a", 0)._replace(msg="\x01\x02")
    assert answer_bytes(escaped) - answer_bytes(plain) == 10  # "\u0001" is six bytes, "x" one
