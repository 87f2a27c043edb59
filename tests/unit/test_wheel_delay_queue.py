"""wheel.delay_queue: earliest expiration first, head changes reported."""

from wheel.delay_queue import DelayQueue


def test_empty_queue_has_no_head():
    q: DelayQueue[str] = DelayQueue()
    assert len(q) == 0
    assert q.peek() is None
    assert q.peek_expiration_ms() is None
    assert q.poll_expired(10**15) is None


def test_docstring_example():
    q: DelayQueue[str] = DelayQueue()
    assert q.offer("b", 5_000) is True
    assert q.offer("a", 2_000) is True
    assert q.offer("c", 9_000) is False
    assert q.peek_expiration_ms() == 2_000
    assert q.poll_expired(1_999) is None
    assert [q.poll_expired(5_000), q.poll_expired(5_000), q.poll_expired(5_000)] == ["a", "b", None]
    assert q.peek() == "c" and len(q) == 1


def test_expires_exactly_at_its_time():
    q: DelayQueue[int] = DelayQueue()
    q.offer(1, 100)
    assert q.poll_expired(99) is None
    assert q.poll_expired(100) == 1


def test_equal_expirations_come_out_in_offer_order_and_items_are_never_compared():
    q: DelayQueue[object] = DelayQueue()
    items = [object() for _ in range(5)]  # not orderable
    for item in items:
        q.offer(item, 7)
    assert [q.poll_expired(7) for _ in items] == items


def test_an_equal_expiration_is_not_a_new_head():
    q: DelayQueue[str] = DelayQueue()
    q.offer("first", 7)
    assert q.offer("second", 7) is False


def test_repr_names_length_and_head():
    q: DelayQueue[str] = DelayQueue()
    assert repr(q) == "DelayQueue(len=0)"
    q.offer("x", 42)
    assert repr(q) == "DelayQueue(len=1, head='x' at 42)"


def test_retain_drops_what_keep_refuses_and_keeps_the_order():
    q: DelayQueue[str] = DelayQueue()
    for item, expiration_ms in (("a", 5), ("stale", 1), ("b", 5), ("c", 3), ("old", 9)):
        q.offer(item, expiration_ms)
    assert q.retain(lambda item, expiration_ms: item not in ("stale", "old")) == 2
    assert len(q) == 3 and q.peek_expiration_ms() == 3
    assert [q.poll_expired(10) for _ in range(4)] == ["c", "a", "b", None]


def test_retain_sees_each_items_expiration_and_may_keep_everything():
    q: DelayQueue[str] = DelayQueue()
    q.offer("x", 7)
    q.offer("y", 8)
    seen: list[tuple[str, int]] = []
    assert q.retain(lambda item, expiration_ms: seen.append((item, expiration_ms)) is None) == 0
    assert sorted(seen) == [("x", 7), ("y", 8)] and q.peek() == "x"
