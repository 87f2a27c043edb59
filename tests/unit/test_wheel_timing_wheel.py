"""wheel.timing_wheel: where a second goes, when slots expire, how L moves."""

import pytest

from storage.entry import MS_PER_HOUR, SECONDS_PER_HOUR
from wheel.timing_wheel import Level, Slot, TimingWheel, format_second

H = 472_000
H_S = H * SECONDS_PER_HOUR  # absolute second of hour H's start
T0 = H * MS_PER_HOUR
LEAD = 10_000


def counts_with(*seconds: int) -> list[int]:
    counts = [0] * SECONDS_PER_HOUR
    for s in seconds:
        counts[s] += 1
    return counts


def test_docstring_example_two_hours_five_minutes():
    wheel = TimingWheel(H_S, LEAD)
    target = (H + 2) * SECONDS_PER_HOUR + 300
    assert wheel.offer(target) == (Level.HOURS, (H + 2) * MS_PER_HOUR - LEAD)
    wheel.advance(T0)
    assert wheel.loaded_below_s == H_S + 11
    assert wheel.next_expiration_ms() == T0 + 2 * MS_PER_HOUR - LEAD  # 11:59:50

    now = T0 + 2 * MS_PER_HOUR - LEAD
    assert wheel.pop_expired(now - 1) is None
    slot = wheel.pop_expired(now)
    assert slot == Slot(Level.HOURS, (H + 2) * SECONDS_PER_HOUR) and slot.hour == H + 2
    assert wheel.loaded_below_s == (H + 2) * SECONDS_PER_HOUR
    assert wheel.cascade(H + 2, counts_with(300)) == 1
    wheel.advance(now)
    assert wheel.loaded_below_s == (H + 2) * SECONDS_PER_HOUR + 1

    now = T0 + 2 * MS_PER_HOUR + 300_000 - LEAD  # 12:04:50
    assert wheel.next_expiration_ms() == now
    slot = wheel.pop_expired(now)
    assert slot is not None and (slot.level, slot.hour, slot.second) == (Level.SECONDS, H + 2, 300)
    assert wheel.loaded_below_s == target + 1
    assert len(wheel) == 0 and wheel.next_expiration_ms() is None


def test_offer_levels():
    wheel = TimingWheel(H_S + 100, LEAD)
    assert wheel.offer(H_S + 99) == (Level.MEMORY, None)
    assert wheel.offer(H_S + 100) == (Level.SECONDS, T0 + 100_000 - LEAD)
    assert wheel.offer(H_S + 100) == (Level.SECONDS, None)  # the slot exists already
    assert wheel.offer(H_S + 3599).level is Level.SECONDS
    assert wheel.offer(H_S + 3600) == (Level.HOURS, T0 + MS_PER_HOUR - LEAD)
    assert wheel.offer(H_S + 7000) == (Level.HOURS, None)  # same hour slot
    assert len(wheel) == 3


def test_years_ahead_is_one_slot():
    wheel = TimingWheel(H_S, LEAD)
    years = 5 * 365 * 24
    offer = wheel.offer((H + years) * SECONDS_PER_HOUR + 17)
    assert offer == (Level.HOURS, (H + years) * MS_PER_HOUR - LEAD)
    assert len(wheel) == 1


def test_cascade_adds_only_seconds_from_l_on_and_checks_the_table():
    wheel = TimingWheel(H_S + 50, LEAD)
    assert wheel.cascade(H, counts_with(10, 50, 51, 51)) == 2  # 10 is before L
    assert wheel.first_pending_s == H_S + 50
    with pytest.raises(ValueError, match="3599 values, expected 3600"):
        wheel.cascade(H, [0] * 3599)
    with pytest.raises(ValueError, match="before the wheel reached it"):
        wheel.cascade(H + 1, counts_with(0))


def test_advance_stops_at_the_first_pending_slot_and_never_moves_back():
    wheel = TimingWheel(H_S, LEAD)
    wheel.offer(H_S + 5)
    wheel.advance(T0 + 60_000)
    assert wheel.loaded_below_s == H_S + 5  # second 5 is not loaded yet
    assert wheel.pop_expired(T0 + 60_000) == Slot(Level.SECONDS, H_S + 5)
    wheel.advance(T0 + 60_000)
    assert wheel.loaded_below_s == H_S + 71
    wheel.advance(T0)  # the clock stepped back: what is loaded stays loaded
    assert wheel.loaded_below_s == H_S + 71


def test_peek_expired_does_not_remove():
    wheel = TimingWheel(H_S, LEAD)
    wheel.offer(H_S + 20)
    assert wheel.peek_expired(T0 + 9_999) is None
    assert wheel.peek_expired(T0 + 10_000) == Slot(Level.SECONDS, H_S + 20)
    assert len(wheel) == 1


def test_an_hour_slot_starting_before_l_stands_for_its_seconds_from_l():
    wheel = TimingWheel(H_S + 1800, LEAD)  # restarted mid-hour
    wheel.add_hour(H)
    assert wheel.first_pending_s == H_S + 1800
    assert wheel.pop_expired(T0) == Slot(Level.HOURS, H_S)
    assert wheel.loaded_below_s == H_S + 1800
    assert wheel.cascade(H, counts_with(1799, 1800)) == 1


def test_seconds_wheel_slot_is_reused_an_hour_later():
    wheel = TimingWheel(H_S, 0)
    wheel.offer(H_S + 7)
    assert wheel.pop_expired(T0 + 7_000) is not None
    wheel.advance(T0 + MS_PER_HOUR)
    assert wheel.offer(H_S + SECONDS_PER_HOUR + 7) == (Level.SECONDS, T0 + MS_PER_HOUR + 7_000)


def test_negative_lead_is_refused():
    with pytest.raises(ValueError, match="lead_ms must be >= 0"):
        TimingWheel(0, -1)


def test_repr_and_format():
    wheel = TimingWheel(H_S + 11, LEAD)
    wheel.offer(H_S + 300)
    wheel.offer(H_S + 3600 * 2)
    assert format_second(H_S + 300) == "472000:0300"
    assert repr(wheel) == ("TimingWheel(loaded_below=472000:0011, second_slots=1, "
                           "hour_slots=[472002], head=Slot(second 472000:0300))")
    assert repr(Slot(Level.HOURS, H_S)) == "Slot(hour 472000)"
