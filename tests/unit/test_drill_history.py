"""bench/drill_history.py: the fault drills' checker on hand-made
histories, those that must pass (what a correct broker may do under
faults: deliver again after a nack or an ack timeout, apply a call whose
answer was lost) and those that must fail, one rule at a time."""

from __future__ import annotations

from drill_history import Delivery, Fault, History, Op, Sent, check

T = "t"


def sent(msg_id: str, trigger: int, key: str | None = None, expire: int = 10**9) -> Sent:
    return Sent(T, msg_id, trigger, expire, 10, key, trigger - 5)


def got(msg_id: str, start: int, received: int, trigger: int, key: str | None = None, retry: int = 1,
        ack_timeout: int = 5000) -> Delivery:
    return Delivery(T, msg_id, start, received, retry, trigger, key, ack_timeout)


def op(kind: str, msg_id: str, start: int, end: int, ok: bool = True, applied: bool = True,
       new_trigger: int | None = None) -> Op:
    return Op(kind, T, msg_id, start, end, ok, applied, new_trigger)


def history(**parts) -> History:
    h = History(**parts)
    h.end_ms = 1_000_000
    return h


def test_a_clean_history_passes():
    h = history(sent=[sent("a", 100), sent("b", 200, key="k"), sent("c", 200, key="k")],
                deliveries=[got("a", 90, 101, 100), got("b", 150, 201, 200, key="k"),
                            got("c", 210, 260, 200, key="k")],
                ops=[op("ack", "a", 102, 110), op("ack", "b", 205, 209), op("ack", "c", 261, 270)])
    found = check(h)
    assert found.failed == [] and found.duplicates == 0


def test_a_send_answered_200_and_never_delivered_is_lost():
    found = check(history(sent=[sent("a", 100), sent("b", 100)], deliveries=[got("b", 90, 101, 100)]))
    assert (found.lost, found.failed) == (1, ["lost"])
    assert found.examples["lost"][0].startswith("t/a")


def test_deleted_expired_and_moved_past_the_end_are_not_lost():
    h = history(sent=[sent("d", 100), sent("e", 100, expire=500), sent("m", 100)],
                ops=[op("delete", "d", 50, 60, ok=False, applied=False),  # outcome unknown: may have applied
                     op("reschedule", "m", 50, 60, new_trigger=2_000_000)])
    h.end_ms = 1000
    assert check(h).lost == 0


def test_delivered_before_its_trigger_is_early():
    found = check(history(sent=[sent("a", 100)], deliveries=[got("a", 90, 99, 100)]))
    assert (found.early, found.failed) == (1, ["early"])


def test_a_rescheduled_message_is_early_at_its_old_time_once_the_move_was_answered():
    moved = op("reschedule", "a", 50, 60, new_trigger=500)
    assert check(history(sent=[sent("a", 100)], ops=[moved], deliveries=[got("a", 70, 101, 100)])).early == 1
    assert check(history(sent=[sent("a", 100)], ops=[moved], deliveries=[got("a", 70, 501, 500)])).early == 0
    # a pull that started before the move's answer may have met either time
    racing = op("reschedule", "a", 50, 95, new_trigger=500)
    assert check(history(sent=[sent("a", 100)], ops=[racing], deliveries=[got("a", 90, 101, 100)])).early == 0
    # a move refused (409: it was consuming) changes nothing
    refused = op("reschedule", "a", 50, 60, applied=False)
    assert check(history(sent=[sent("a", 100)], ops=[refused], deliveries=[got("a", 70, 101, 100)])).early == 0


def test_a_pull_after_an_answered_ack_must_not_hand_it_out():
    h = history(sent=[sent("a", 100)], deliveries=[got("a", 90, 101, 100), got("a", 120, 130, 100, retry=2)],
                ops=[op("ack", "a", 105, 110)])
    found = check(h)
    assert (found.after_ack, found.failed) == (1, ["after_ack"])


def test_an_ack_not_answered_or_not_applied_allows_a_redelivery():
    for ack in (op("ack", "a", 105, 110, ok=False, applied=False), op("ack", "a", 105, 110, applied=False)):
        h = history(sent=[sent("a", 100)], deliveries=[got("a", 90, 101, 100), got("a", 120, 130, 100, retry=2)],
                    ops=[ack])
        found = check(h)
        assert found.failed == [] and found.duplicates == 1  # not asked for: counted, not failed


def test_a_pull_racing_the_ack_is_not_after_it():
    h = history(sent=[sent("a", 100)], deliveries=[got("a", 90, 101, 100), got("a", 108, 130, 100, retry=2)],
                ops=[op("ack", "a", 105, 110)])
    assert check(h).after_ack == 0


def test_a_pull_after_an_answered_delete_must_not_hand_it_out():
    h = history(sent=[sent("a", 100)], deliveries=[got("a", 120, 130, 100)], ops=[op("delete", "a", 50, 60)])
    found = check(h)
    assert (found.after_delete, found.failed) == (1, ["after_delete"])
    h = history(sent=[sent("a", 100)], deliveries=[got("a", 120, 130, 100)],
                ops=[op("delete", "a", 50, 60, applied=False)])  # 404: nothing was deleted
    assert check(h).after_delete == 0


def test_two_messages_of_a_key_consumed_at_once_is_a_violation():
    h = history(sent=[sent("a", 100, key="k"), sent("b", 100, key="k")],
                deliveries=[got("a", 90, 101, 100, key="k"), got("b", 120, 130, 100, key="k")],
                ops=[op("ack", "a", 200, 210), op("ack", "b", 220, 230)])
    found = check(h)
    assert (found.key_violations, found.failed) == (1, ["key_violations"])


def test_a_key_is_free_after_the_ack_started_or_the_ack_timeout():
    acked = history(sent=[sent("a", 100, key="k"), sent("b", 100, key="k")],
                    deliveries=[got("a", 90, 101, 100, key="k"), got("b", 120, 130, 100, key="k")],
                    ops=[op("ack", "a", 115, 140)])  # the ack may have applied before b's pull was answered
    assert check(acked).key_violations == 0
    timed_out = history(sent=[sent("a", 100, key="k"), sent("b", 100, key="k")],
                        deliveries=[got("a", 90, 101, 100, key="k", ack_timeout=20),
                                    got("b", 120, 130, 100, key="k")])
    assert check(timed_out).key_violations == 0
    other_key = history(sent=[sent("a", 100, key="k"), sent("b", 100, key="j")],
                        deliveries=[got("a", 90, 101, 100, key="k"), got("b", 120, 130, 100, key="j")])
    assert check(other_key).key_violations == 0


def test_a_pull_answered_in_the_millisecond_the_ack_began_is_no_violation():
    """Times are whole milliseconds: an ack begun in the millisecond a long
    poll was answered may have reached the node first and woken it (47 such
    pairs in a 100-kill standalone drill, none a real violation); one
    millisecond earlier is a violation."""
    def pair(b_received):
        return history(sent=[sent("a", 100, key="k"), sent("b", 100, key="k")],
                       deliveries=[got("a", 90, 101, 100, key="k"), got("b", 101, b_received, 100, key="k")],
                       ops=[op("ack", "a", 130, 140)])
    assert check(pair(130)).key_violations == 0
    assert check(pair(129)).key_violations == 1


def test_duplicates_are_counted_with_the_nearest_fault_and_nacks_excuse_them():
    faults = [Fault("kill", "n1", True, 1000, 1500), Fault("pause", "n2", True, 50_000, 52_000)]
    h = history(sent=[sent("a", 100), sent("b", 100)], faults=faults,
                deliveries=[got("a", 90, 101, 100), got("a", 1200, 1300, 100, retry=2),
                            got("b", 90, 101, 100), got("b", 300, 310, 100, retry=2)],
                ops=[op("nack", "b", 150, 160)])
    found = check(h)
    assert found.failed == []
    assert (found.duplicates, found.duplicates_by_fault) == (1, {"kill-leader": 1})


def test_on_a_standalone_node_a_kill_may_undo_a_pull_and_free_its_key():
    def keyed(durable: bool) -> History:
        h = history(sent=[sent("a", 100, key="k"), sent("b", 100, key="k")],
                    deliveries=[got("a", 90, 101, 100, key="k"), got("b", 120, 130, 100, key="k")],
                    faults=[Fault("kill", "s1", True, 105, 110)])
        h.pulls_durable = durable
        return h
    assert check(keyed(durable=False)).key_violations == 0
    assert check(keyed(durable=True)).key_violations == 1  # a cluster's pull survives a kill


def test_a_delivery_before_the_send_was_answered_is_judged_by_the_trigger_it_names():
    """A send whose answer came late (a retry of an attempt that was stored
    and delivered meanwhile): the delivery is early only by its own
    trigger, and must bear the trigger the answer names."""
    late_answer = Sent(T, "a", 100, 10**9, 10, None, 1_500)  # answered at 1,500, stored with trigger 100
    assert check(history(sent=[late_answer], deliveries=[got("a", 90, 120, 100)],
                         ops=[op("ack", "a", 125, 130)])).failed == []
    assert check(history(sent=[late_answer], deliveries=[got("a", 90, 99, 100)])).early == 1


def test_a_delivery_that_bears_another_trigger_than_its_sends_answer_is_a_mismatch():
    """The drill's sends are strictly idempotent: every answer for an id
    names the one message stored under it. A delivery before the answer
    with another trigger means a node answered 200 for a message it did
    not store (camellia's rule, storing an ended id anew, is off)."""
    retried = Sent(T, "a", 2_000, 10**9, 10, None, 1_500)  # the answer names trigger 2,000
    found = check(history(sent=[retried], deliveries=[got("a", 90, 120, 100)], ops=[op("ack", "a", 125, 130)]))
    assert found.answer_mismatch == 1 and found.early == 0 and found.failed == ["answer_mismatch"]
    # so is one after the answer, with no reschedule of the message
    assert check(history(sent=[Sent(T, "c", 100, 10**9, 10, None, 95)], deliveries=[got("c", 400, 401, 400)],
                         )).answer_mismatch == 1
    # once a reschedule began, a delivery's trigger is the reschedules' business, not this rule's
    moved = check(history(sent=[Sent(T, "b", 100, 10**9, 10, None, 95)], deliveries=[got("b", 3_000, 3_001, 3_000)],
                          ops=[op("reschedule", "b", 200, 210, new_trigger=3_000)]))
    assert moved.answer_mismatch == 0 and moved.failed == []


def test_a_saved_history_reads_back_whole_and_rechecks(tmp_path, capsys):
    """`drills.py --history` writes `dataclasses.asdict`; `--recheck` reads
    it back (`History.from_dict`) and counts as the run would have."""
    import dataclasses
    import json

    from drills import recheck

    h = history(sent=[sent("a", 100), sent("b", 100)], deliveries=[got("a", 90, 99, 100)],
                ops=[op("ack", "a", 120, 125)], faults=[Fault("kill", "s1", True, 50, 60)])
    h.send_attempts, h.pulls_durable = 3, False
    path = tmp_path / "history.json"
    path.write_text(json.dumps(dataclasses.asdict(h)))
    assert History.from_dict(json.loads(path.read_text())) == h
    assert recheck(str(path)) == 1
    counts = json.loads(capsys.readouterr().out)
    assert (counts["early"], counts["lost"], counts["failed"]) == (1, 1, ["lost", "early"])


def run(nominal: int, produce: int, received: int, schedule: str = "s", jitter: int = 0,
        msg_id: str | None = None) -> Delivery:
    """A delivery of a recurring schedule's run (msgId `<schedule>@<nominal>`)."""
    return Delivery(T, msg_id or f"{schedule}@{nominal}", received - 5, received, 0, nominal + jitter, None, 5000,
                    produce, nominal)


def test_one_message_a_run_none_early_passes():
    """Runs each made once; one of them delivered twice (the same message,
    its ack timeout passed: the same produceTime) is a duplicate, not a
    run made twice; another schedule may run at the same nominal time."""
    h = history(deliveries=[run(1_000, 10, 1_001), run(2_000, 1_001, 2_003, jitter=2),
                            run(2_000, 1_001, 7_010, jitter=2), run(2_000, 1_500, 2_001, schedule="other"),
                            run(3_000, 2_003, 3_000)])
    found = check(h)
    assert found.failed == [] and found.runs_twice == found.runs_early == 0 and found.duplicates == 1


def test_a_run_made_twice_fails():
    """The same nominal time with two produceTimes: a second node (or a
    restart) made the run again rather than finding it made."""
    h = history(deliveries=[run(1_000, 10, 1_001), run(2_000, 1_001, 2_003), run(2_000, 1_900, 2_050),
                            run(3_000, 2_003, 3_001)])
    found = check(h)
    assert (found.runs_twice, found.failed) == (1, ["runs_twice"])
    assert found.examples["runs_twice"][0].startswith("t/s@2000 made 2 times")


def test_a_run_before_its_nominal_time_or_not_named_by_it_fails():
    early = check(history(deliveries=[run(1_000, 10, 999)]))
    assert early.runs_early == 1 and "runs_early" in early.failed
    renamed = check(history(deliveries=[run(1_000, 10, 1_001, msg_id="s@2000")]))
    assert (renamed.runs_twice, renamed.failed) == (1, ["runs_twice"])
    plain = check(history(deliveries=[got("x@5", 90, 101, 100)]))  # no scheduledTime: not a run
    assert plain.failed == []
