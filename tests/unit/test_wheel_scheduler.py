"""wheel.scheduler.Scheduler on a fake clock (plain now_ms integers)."""

from collections import Counter

import pytest
from fakes import InMemorySlotSource

from storage.entry import MS_PER_HOUR, MS_PER_SECOND, SECONDS_PER_HOUR, IndexEntry, Status
from wheel.scheduler import Scheduler, SchedulerConfig
from wheel.tick_state import TickState
from wheel.window import release_key

H = 472_000
T0 = H * MS_PER_HOUR  # an hour's start
EXACT = SchedulerConfig(commit_lag_ms=0)


def drive(sched: Scheduler, now_ms: int, until_ms: int) -> list[tuple[int, list[IndexEntry]]]:
    """Poll at every wake-up up to until_ms, as the driver does."""
    polls = []
    while (wakeup := sched.next_wakeup_ms()) is not None and wakeup <= until_ms:
        now_ms = max(now_ms, wakeup)
        polls.append((now_ms, sched.poll(now_ms)))
    return polls


def released(polls) -> list[IndexEntry]:
    return [e for _, batch in polls for e in batch]


def test_two_hours_five_minutes_ahead_costs_three_wakeups():
    src = InMemorySlotSource()
    sched = Scheduler(src, None, T0, EXACT)
    e = src.add(T0 + 2 * MS_PER_HOUR + 300_250, 0, T0)
    assert sched.on_new(e) is True
    assert sched.next_wakeup_ms() == T0 + 2 * MS_PER_HOUR - 10_000
    polls = drive(sched, T0, T0 + 3 * MS_PER_HOUR)
    assert [now - T0 for now, _ in polls] == [7_190_000, 7_490_000, 7_500_250]
    assert polls[-1][1] == [e]
    assert sched.wakeups == 3 and sched.stats.hours_cascaded == 1 and sched.stats.seconds_loaded == 1
    assert sched.next_wakeup_ms() is None


def test_docstring_example_new_message_for_a_preloaded_second_goes_to_ram():
    src = InMemorySlotSource()
    sched = Scheduler(src, None, T0, EXACT)
    base = T0 + 2 * MS_PER_HOUR + 300_000
    e = src.add(base + 250, 0, T0)
    sched.on_new(e)
    drive(sched, T0, base - 10_000)  # cascade, then preload second 300
    assert sched.next_wakeup_ms() == base + 250
    reads = src.seconds_read
    woken = []
    sched.add_wake_listener(woken.append)
    e2 = src.add(base + 100, 0, base - 5_000)
    assert sched.on_new(e2) is True and woken == [base + 100]
    assert src.seconds_read == reads  # straight into RAM, no read
    assert sched.poll(base + 99) == []
    assert sched.poll(base + 100) == [e2]
    assert sched.poll(base + 250) == [e]


def test_a_later_message_does_not_wake():
    src = InMemorySlotSource()
    sched = Scheduler(src, None, T0, EXACT)
    woken = []
    sched.add_wake_listener(woken.append)
    sched.on_new(src.add(T0 + 60_000, 0, T0))
    assert sched.next_wakeup_ms() == T0 + 50_000
    assert sched.on_new(src.add(T0 + 70_000, 0, T0)) is False
    assert sched.on_new(src.add(T0 + 60_000, 0, T0)) is False  # same slot
    assert sched.on_new(src.add(T0 + 5_000, 0, T0)) is True  # preloaded second, earlier
    assert woken == [T0 + 60_000 - 10_000, T0 + 5_000]
    sched.remove_wake_listener(woken.append)
    assert sched.stats.early_wakes == 2


def test_within_a_second_release_is_by_trigger_ms_then_priority_at_the_exact_ms():
    src = InMemorySlotSource()
    base = T0 + 30_000
    x = src.add(base + 500, 0, T0)
    y = src.add(base + 200, 0, T0)
    z = src.add(base + 200, 9, T0)
    w = src.add(base + 900, -5, T0)
    sched = Scheduler(src, None, T0, EXACT)
    polls = [(now, batch) for now, batch in drive(sched, T0, base + 1_000) if batch]
    assert polls == [(base + 200, [z, y]), (base + 500, [x]), (base + 900, [w])]
    assert sched.tick == TickState(H, 30, 4)


def test_a_message_filed_after_its_trigger_is_released_at_once():
    src = InMemorySlotSource()
    sched = Scheduler(src, None, T0, EXACT)
    now = T0 + 12_345
    drive(sched, T0, now)
    late = src.add(now - 60_000, 3, now)
    assert (late.hour, late.second) == (H, 12)
    assert sched.on_new(late) is True
    assert sched.next_wakeup_ms() == now - 60_000  # into RAM, though the idle wheel had not reached second 12
    assert sched.poll(now) == [late]
    assert sched.next_wakeup_ms() is None  # the driver asks after every poll, then sleeps
    late2 = src.add(now - 1, 0, now)
    assert sched.on_new(late2) is True
    assert sched.next_wakeup_ms() == now - 1  # second 12 is in RAM now
    assert sched.poll(now) == [late2]


def test_the_clock_stepping_back_never_releases_early():
    src = InMemorySlotSource()
    sched = Scheduler(src, None, T0, EXACT)
    e = src.add(T0 + 20_000, 0, T0)
    sched.on_new(e)
    assert sched.poll(T0 + 15_000) == []
    assert sched.poll(T0 + 5_000) == []  # stepped back 10 s
    assert sched.next_wakeup_ms() == T0 + 20_000
    assert sched.poll(T0 + 19_999) == []
    assert sched.poll(T0 + 20_000) == [e]
    assert sched.stats.clock_steps_back == 1


def test_cancel_in_ram_and_on_disk():
    src = InMemorySlotSource()
    sched = Scheduler(src, None, T0, EXACT)
    near = src.add(T0 + 3_000, 0, T0)
    far = src.add(T0 + 600_000, 0, T0)
    keep = src.add(T0 + 600_001, 0, T0)
    for e in (near, far, keep):
        sched.on_new(e)
    sched.poll(T0)
    src.set_status(near.location, Status.DELETED)
    assert sched.cancel(near.location) is True
    src.set_status(far.location, Status.DELETED)
    assert sched.cancel(far.location) is False  # still on disk: its status keeps it out
    assert released(drive(sched, T0, T0 + 700_000)) == [keep]
    assert sched.tick.position >= TickState.at(far.hour * SECONDS_PER_HOUR + far.second, 2).position


def test_tick_counts_only_a_fully_released_run_of_local_indexes():
    src = InMemorySlotSource()
    base = T0 + 30_000
    a = src.add(base + 900, 0, T0)  # local 0, due last
    src.add(base + 100, 0, T0)  # local 1
    src.add(base + 200, 0, T0)  # local 2
    sched = Scheduler(src, None, T0, EXACT)
    drive(sched, T0, base + 500)
    assert sched.tick == TickState(H, 30, 0)  # b and c released, a not: local 0 holds it
    assert sched.poll(base + 900) == [a]
    assert sched.tick == TickState(H, 30, 3)
    sched.poll(base + 1_000)
    assert sched.tick == TickState(H, 31, 0)


def test_commit_lag_keeps_the_tick_behind_the_clock():
    src = InMemorySlotSource()
    sched = Scheduler(src, None, T0, SchedulerConfig(commit_lag_ms=1_500))
    sched.poll(T0 + 10_000)
    assert sched.tick == TickState(H, 8, 0)


def test_restart_from_a_tick_releases_what_was_not_and_skips_acked():
    src = InMemorySlotSource()
    base = T0 + 30_000
    entries = [src.add(base + ms, 0, T0) for ms in (900, 100, 200, 1_500)]
    sched = Scheduler(src, None, T0, EXACT)
    first = released(drive(sched, T0, base + 300))
    assert first == [entries[1], entries[2]]
    tick = sched.tick
    assert tick == TickState(H, 30, 0)
    src.set_status(entries[1].location, Status.ACKED)  # acked before the crash; entries[2] was not
    again = Scheduler(src, tick, base + 300, EXACT)
    assert released(drive(again, base + 300, base + 2_000)) == [entries[2], entries[0], entries[3]]


def test_restart_with_the_tick_ahead_of_the_clock_waits():
    src = InMemorySlotSource()
    done = src.add(T0 + 10_000, 0, T0)  # released by the old leader
    todo = src.add(T0 + 20_000, 0, T0)
    tick = TickState(H, 15, 0)
    sched = Scheduler(src, tick, T0 + 5_000, EXACT)  # this node's clock is 10 s behind the tick
    assert sched.poll(T0 + 5_000) == []
    assert sched.tick == tick
    polls = drive(sched, T0 + 5_000, T0 + 30_000)
    assert released(polls) == [todo] and polls[-1][0] == T0 + 20_000
    assert done.location not in {e.location for e in released(polls)}


def test_restart_far_behind_catches_up_in_bounded_batches_and_reports():
    src = InMemorySlotSource()
    entries = [src.add(T0 + 7 * i, i % 3, T0) for i in range(5_000)]  # 35 s of messages, 143/s
    now = T0 + 24 * MS_PER_HOUR
    sched = Scheduler(src, TickState(H, 0, 0), now, SchedulerConfig(max_release_per_poll=300, commit_lag_ms=0))
    batches = []
    while (wakeup := sched.next_wakeup_ms()) is not None and wakeup <= now:
        batches.append(sched.poll(now))
        assert len(sched._window) <= 300 + 200  # the cap plus one second read whole
    assert all(0 < len(b) <= 300 for b in batches)
    out = [e for b in batches for e in b]
    assert out == sorted(entries, key=release_key)
    report = sched.catch_up
    assert report is not None and not report.active
    assert report.started_at_ms == report.finished_at_ms == now
    assert report.released == report.overdue == 5_000
    assert report.max_lateness_ms == now - T0
    assert sched.tick.position >= TickState(H, 35, 0).position


def test_without_a_tick_it_starts_from_the_first_hour_storage_holds():
    src = InMemorySlotSource()
    old = src.add(T0 - 5 * MS_PER_HOUR, 0, T0 - 6 * MS_PER_HOUR)
    sched = Scheduler(src, None, T0, EXACT)
    assert sched.started_at == TickState(H - 5, 0, 0)
    assert sched.poll(T0) == [old]


def test_years_ahead():
    src = InMemorySlotSource()
    sched = Scheduler(src, None, T0, EXACT)
    e = src.add(T0 + 5 * 365 * 24 * MS_PER_HOUR + 1, 0, T0)
    sched.on_new(e)
    polls = drive(sched, T0, e.trigger_ms)
    assert released(polls) == [e] and polls[-1][0] == e.trigger_ms and len(polls) <= 3


def test_messages_across_an_hour_boundary():
    src = InMemorySlotSource()
    end = T0 + MS_PER_HOUR
    entries = [src.add(end + d, 0, T0) for d in (-3_000, -1, 0, 2_500, 20_000)]
    sched = Scheduler(src, None, T0 + 1_000, EXACT)
    polls = [(now, batch) for now, batch in drive(sched, T0 + 1_000, end + 60_000) if batch]
    assert polls == [(e.trigger_ms, [e]) for e in entries]


def test_ram_holds_only_the_preload_window():
    src = InMemorySlotSource()
    for i in range(3_600):
        src.add(T0 + 1_000 * i + 500, 0, T0)  # one message a second for an hour
    sched = Scheduler(src, None, T0, SchedulerConfig(preload_ms=10_000, commit_lag_ms=0))
    peak = 0
    now = T0
    while (wakeup := sched.next_wakeup_ms()) is not None:
        now = max(now, wakeup)
        sched.poll(now)
        peak = max(peak, len(sched._window))
        assert sched._wheel.loaded_below_s * MS_PER_SECOND <= now + 10_000 + 1_000
    assert peak <= 11
    assert sched.stats.released == 3_600


def test_a_late_message_into_a_passed_second_holds_the_tick_back_until_released():
    src = InMemorySlotSource()
    sched = Scheduler(src, None, T0, EXACT)
    sched.poll(T0 + 20_000)
    assert sched.tick == TickState(H, 20, 0)
    # Storage chose the bucket at 18.5 s (its group commit took a while).
    late = src.add(T0 + 18_000, 0, T0 + 18_500)
    sched.on_new(late)
    assert sched.tick == TickState(H, 18, 0)
    assert sched.poll(T0 + 20_001) == [late]
    assert sched.tick == TickState(H, 20, 0)


def test_config_is_validated():
    with pytest.raises(ValueError, match="preload_ms must be >= 0"):
        SchedulerConfig(preload_ms=-1)
    with pytest.raises(ValueError, match="max_release_per_poll must be >= 1"):
        SchedulerConfig(max_release_per_poll=0)
    with pytest.raises(ValueError, match="late_ms"):
        SchedulerConfig(late_ms=-1)
    with pytest.raises(ValueError, match="commit_lag_ms"):
        SchedulerConfig(commit_lag_ms=-1)


def test_repr():
    src = InMemorySlotSource()
    sched = Scheduler(src, TickState(H, 3, 1), T0 + 3_000, EXACT)
    assert repr(sched) == ("Scheduler(tick=TickState(472000:0003#1), held=0, loaded_below=472000:0014, "
                           "pending_slots=0, polls=0)")


def test_a_late_message_during_catch_up_is_released_once_though_its_second_is_still_on_disk():
    src = InMemorySlotSource()
    backlog = [src.add(T0 + 1_000 * i, 0, T0) for i in range(50)]  # 50 seconds of backlog
    now = T0 + MS_PER_HOUR
    on_time = src.add(now + 500, 0, T0)  # filed long ago into the second `now` is in
    sched = Scheduler(src, TickState(H, 0, 0), now, SchedulerConfig(max_release_per_poll=5, commit_lag_ms=0))
    out = sched.poll(now)
    late = src.add(T0 - 1_000, 0, now)  # due before the whole backlog, filed into now's second
    assert (late.hour, late.second) == (on_time.hour, on_time.second)
    sched.on_new(late)
    out += sched.poll(now + 2_000)  # the clock moves on while most of the backlog is on disk
    assert late in out and len(out) == 10
    while (wakeup := sched.next_wakeup_ms()) is not None:
        out += sched.poll(max(now + 2_000, wakeup))
    assert Counter(e.location for e in out) == Counter(e.location for e in [*backlog, on_time, late])


def test_a_new_message_in_a_second_the_previous_leader_released_does_not_stall_the_tick():
    src = InMemorySlotSource()
    old = [src.add(T0 + 10_100, 0, T0), src.add(T0 + 10_200, 0, T0)]  # released before the handover
    tick = TickState(H, 15, 0)
    sched = Scheduler(src, tick, T0 + 5_000, EXACT)  # the new leader's clock is behind the tick
    assert sched.poll(T0 + 10_500) == []
    new = src.add(T0 + 10_200, 0, T0 + 10_500)  # filed into second 10 as local 2
    assert (new.second, new.local_index) == (10, 2)
    sched.on_new(new)
    assert sched.tick == TickState(H, 10, 2)
    assert sched.poll(T0 + 10_500) == [new]
    assert sched.tick == tick
    assert old[0].location not in {e.location for e in released(drive(sched, T0 + 10_500, T0 + 60_000))}


def test_a_message_filed_into_a_retired_second_after_the_clock_stepped_back():
    src = InMemorySlotSource()
    sched = Scheduler(src, None, T0, EXACT)
    first = src.add(T0 + 5_000, 0, T0)
    sched.on_new(first)
    assert released(drive(sched, T0, T0 + 30_000)) == [first]
    sched.poll(T0 + 30_000)
    assert sched.tick == TickState(H, 30, 0)
    again = src.add(T0 + 4_000, 0, T0 + 5_500)  # the wall clock stepped back to 5.5 s
    assert (again.second, again.local_index) == (5, 1)
    sched.on_new(again)
    assert sched.poll(T0 + 5_500) == [again]
    assert sched.tick == TickState(H, 30, 0)


def test_held_entries_not_due_do_not_block_the_catch_up():
    src = InMemorySlotSource()
    overdue = src.add(T0 + 1_500, 0, T0)
    sched = Scheduler(src, TickState(H, 0, 0), T0 + 40_000, SchedulerConfig(max_release_per_poll=1, commit_lag_ms=0))
    late = src.add(T0 + 39_000, 0, T0 + 40_000)  # filed late into second 40: held in RAM at once
    sched.on_new(late)
    # The clock steps back to 10 s: `late` is not due, second 1 is; holding one
    # entry (the cap) must not stop the wheel from reading second 1.
    assert sched.poll(T0 + 10_000) == [overdue]
    polls = drive(sched, T0 + 10_000, T0 + 60_000)  # second 40's read at 30 s finds `late` known
    assert [(now, batch) for now, batch in polls if batch] == [(T0 + 39_000, [late])]


def test_a_message_filed_after_its_trigger_is_late_from_its_filing_second_not_from_its_trigger():
    """triggerTime=1000 sent at T0 + 500 is filed under T0's second: the
    catch-up report counts its lateness from there (it read 1970's)."""
    src = InMemorySlotSource()
    sched = Scheduler(src, None, T0, EXACT)
    prompt = src.add(1_000, 0, T0 + 500)
    sched.on_new(prompt)
    assert sched.poll(T0 + 700) == [prompt]
    assert sched.catch_up is None  # 700 ms after its second began: not overdue (late_ms 1000)
    slow = src.add(0, 0, T0 + 800)
    sched.on_new(slow)
    assert sched.poll(T0 + 3_000) == [slow]
    report = sched.catch_up
    assert report is not None and report.overdue == 1 and report.max_lateness_ms == 3_000


def test_lag_is_how_long_ago_the_earliest_unreleased_entry_was_due_in_ram_or_on_disk():
    src = InMemorySlotSource()
    on_disk = src.add(T0 + 5_000, 0, T0)
    sched = Scheduler(src, None, T0, EXACT)
    assert sched.lag_ms(T0 + 1_000) == 1_000  # an hour not yet read: counted from its start (at most)
    assert sched.poll(T0) == []  # the hour read: its second 5 waits on disk
    assert sched.lag_ms(T0) == 0 and sched.lag_ms(T0 + 5_000) == 0
    assert sched.lag_ms(T0 + 65_000) == 60_000  # its second never read: a minute late already
    assert sched.poll(T0 + 65_000) == [on_disk]
    assert sched.lag_ms(T0 + 65_000) == 0  # released: nothing overdue
    base = T0 + 2 * MS_PER_HOUR + 300_000
    held = src.add(base + 250, 0, T0)
    sched.on_new(held)
    drive(sched, T0 + 65_000, base - 10_000)  # its second read into RAM
    assert len(sched._window) == 1 and sched.lag_ms(base) == 0
    assert sched.lag_ms(base + 1_250) == 1_000  # due, not yet polled
    late = src.add(T0, 0, base + 700)  # a trigger an age ago, filed at base + 700: due from its second, base
    sched.on_new(late)
    assert sched.lag_ms(base + 1_250) == 1_250  # from the start of the second it was filed in, not from T0
    assert sched.poll(base + 1_250) == [late, held]
    assert sched.lag_ms(base + 9_000) == 0
