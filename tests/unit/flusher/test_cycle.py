"""The flush cycle state machine: its triggers, pipelining, commit order and failures."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kafscale.flusher.cycle import (
    CUT_TIMEOUT_MS,
    Answer,
    Build,
    Commit,
    Cycles,
    Instruction,
    Limits,
    SendCut,
    due,
)
from kafscale.ipc.write_path import EntryResult, ShardPending, WalEntry

LIMITS = Limits(flush_interval_ms=250, object_bytes=1000, group_commit_ms=5, max_in_flight=2)
T0 = 1_700_000_000_000


def entry(partition: int, base_offset: int = 0, topic: str = "t") -> WalEntry:
    return WalEntry(
        buffer=f"buf-{topic}-{partition}-{base_offset}",
        generation=1,
        size=100,
        topic=topic,
        topic_id="id",
        partition=partition,
        base_offset=base_offset,
        last_offset=base_offset + 9,
        records=10,
        max_timestamp=T0,
        created_ms=T0,
        codec=0,
        producers={},
    )


def ok(e: WalEntry) -> EntryResult:
    return EntryResult(e.topic, e.partition, e.base_offset, committed=True, high_watermark=10)


def report(shard: int, nbytes: int = 10, oldest: int = T0, urgent: int = -1) -> ShardPending:
    return ShardPending(shard=shard, bytes=nbytes, oldest_ms=oldest, urgent_ms=urgent)


def only(out: Sequence[Instruction], kind: type) -> list[Instruction]:
    return [i for i in out if isinstance(i, kind)]


def cut(cycles: Cycles, shards: Sequence[int], now: int = T0 + 250) -> int:
    """Report bytes old enough from ``shards`` and return the cycle that gets cut."""
    for shard in shards:
        assert cycles.pending(report(shard, oldest=now - 250), now - 1) == []
    sends = only(cycles.tick(now), SendCut)
    assert len(sends) == 1
    send = sends[0]
    assert isinstance(send, SendCut)
    return send.cycle


# -- triggers ---------------------------------------------------------------------------------


def test_nothing_pending_cuts_nothing() -> None:
    cycles = Cycles(LIMITS)
    assert cycles.tick(T0) == []
    assert cycles.wakeup_ms() is None
    assert cycles.pending(report(0, nbytes=0, oldest=-1), T0) == []
    assert cycles.wakeup_ms() is None


def test_oldest_byte_reaching_the_flush_interval_cuts() -> None:
    cycles = Cycles(LIMITS)
    assert cycles.pending(report(0, oldest=T0), T0) == []
    assert cycles.wakeup_ms() == T0 + 250
    assert cycles.tick(T0 + 249) == []
    assert cycles.tick(T0 + 250) == [SendCut(0, (0,), "age")]


def test_pending_bytes_reaching_the_object_bound_cut_at_once() -> None:
    cycles = Cycles(LIMITS)
    assert cycles.pending(report(0, nbytes=600), T0) == []
    assert cycles.pending(report(1, nbytes=400), T0) == [SendCut(0, (0, 1), "bytes")]


def test_an_acks_all_waiter_cuts_after_group_commit_ms() -> None:
    cycles = Cycles(LIMITS)
    assert cycles.pending(report(0, oldest=T0, urgent=T0 + 100), T0 + 100) == []
    assert cycles.wakeup_ms() == T0 + 105
    assert cycles.tick(T0 + 104) == []
    assert cycles.tick(T0 + 105) == [SendCut(0, (0,), "urgent")]


def test_a_zero_group_commit_cuts_an_urgent_report_immediately() -> None:
    cycles = Cycles(Limits(250, 1000, 0, 2))
    assert cycles.pending(report(0, urgent=T0), T0) == [SendCut(0, (0,), "urgent")]


def test_due_measures_over_all_reports() -> None:
    reports = [report(0, nbytes=10, oldest=T0), report(1, nbytes=10, oldest=T0 + 200)]
    assert due(reports, T0 + 249, LIMITS) is None
    assert due(reports, T0 + 250, LIMITS) == "age"
    assert due([report(0, nbytes=0, oldest=T0)], T0 + 10_000, LIMITS) is None


def test_a_cut_goes_to_every_shard_with_pending_data_and_first_cycle_numbers() -> None:
    cycles = Cycles(LIMITS, first_cycle=42)
    cycles.pending(report(3, oldest=T0 + 100), T0 + 100)
    cycles.pending(report(1, oldest=T0), T0 + 100)
    cycles.pending(report(2, nbytes=0, oldest=-1), T0 + 100)  # holds nothing
    assert cycles.tick(T0 + 250) == [SendCut(42, (1, 3), "age")]


def test_a_report_of_nothing_replaces_an_earlier_one() -> None:
    cycles = Cycles(LIMITS)
    cycles.pending(report(0, oldest=T0), T0)
    cycles.pending(report(0, nbytes=0, oldest=-1), T0 + 1)
    assert cycles.tick(T0 + 10_000) == []


def test_shards_being_cut_do_not_trigger_another_cut() -> None:
    cycles = Cycles(Limits(250, 1000, 5, 4))
    assert cut(cycles, [0, 1]) == 0
    assert cycles.tick(T0 + 500) == []
    assert cycles.wakeup_ms() == T0 + 250 + CUT_TIMEOUT_MS  # only the cut's timeout


def test_an_answer_resets_the_shard_report() -> None:
    cycles = Cycles(LIMITS)
    n = cut(cycles, [0])
    out = cycles.cut_answered(n, 0, [entry(0)], T0 + 251)
    assert out == [Build(n, (entry(0),), T0 + 250)]
    assert cycles.tick(T0 + 10_000) == []


def test_a_report_received_after_the_cut_survives_the_answer() -> None:
    cycles = Cycles(Limits(250, 1000, 5, 4))
    n = cut(cycles, [0])
    cycles.pending(report(0, oldest=T0 + 260), T0 + 260)  # new data after the cut
    cycles.cut_answered(n, 0, [entry(0)], T0 + 261)
    assert cycles.tick(T0 + 509) == []
    assert cycles.tick(T0 + 510) == [SendCut(n + 1, (0,), "age")]


# -- pipelining -------------------------------------------------------------------------------


def test_no_more_than_max_in_flight_cycles_then_a_commit_frees_a_slot() -> None:
    cycles = Cycles(LIMITS)  # max_in_flight = 2
    a = cut(cycles, [0])
    cycles.cut_answered(a, 0, [entry(0)], T0 + 250)
    b = cut(cycles, [0])
    cycles.cut_answered(b, 0, [entry(0, 10)], T0 + 250)
    assert cycles.in_flight == 2
    assert cycles.pending(report(0, nbytes=5000), T0 + 250) == []  # full: wait
    assert cycles.wakeup_ms() is None
    assert cycles.uploaded(a, True, None, False) == [Commit(a)]
    assert cycles.committed(a, [ok(entry(0))]) == [Answer(a, 0, [ok(entry(0))])]
    assert cycles.tick(T0 + 260) == [SendCut(b + 1, (0,), "bytes")]


def test_a_cycle_being_cut_counts_towards_the_depth() -> None:
    cycles = Cycles(Limits(250, 1000, 5, 1))
    cut(cycles, [0])
    assert cycles.pending(report(1, nbytes=5000), T0 + 250) == []


def test_commits_go_in_cycle_order_when_uploads_finish_out_of_order() -> None:
    cycles = Cycles(Limits(250, 1000, 5, 3))
    numbers = []
    for i in range(3):
        n = cut(cycles, [0])
        assert cycles.cut_answered(n, 0, [entry(0, 10 * i)], T0 + 250) != []
        numbers.append(n)
    a, b, c = numbers
    assert cycles.uploaded(c, True, None, False) == []
    assert cycles.uploaded(b, True, None, False) == []
    assert cycles.uploaded(a, True, None, False) == [Commit(a)]
    out = cycles.committed(a, [ok(entry(0, 0))])
    assert out == [Answer(a, 0, [ok(entry(0, 0))]), Commit(b)]
    out = cycles.committed(b, [ok(entry(0, 10))])
    assert out == [Answer(b, 0, [ok(entry(0, 10))]), Commit(c)]
    assert cycles.committed(c, [ok(entry(0, 20))]) == [Answer(c, 0, [ok(entry(0, 20))])]
    assert cycles.idle


def test_one_commit_at_a_time() -> None:
    cycles = Cycles(Limits(250, 1000, 5, 3))
    a = cut(cycles, [0])
    cycles.cut_answered(a, 0, [entry(0)], T0 + 250)
    b = cut(cycles, [0])
    cycles.cut_answered(b, 0, [entry(0, 10)], T0 + 250)
    assert cycles.uploaded(a, True, None, False) == [Commit(a)]
    assert cycles.uploaded(b, True, None, False) == []  # a is still committing


def test_answers_go_to_each_shard_with_its_own_entries_in_order() -> None:
    cycles = Cycles(LIMITS)
    n = cut(cycles, [1, 0])
    assert cycles.cut_answered(n, 1, [entry(5), entry(6)], T0 + 251) == []
    out = cycles.cut_answered(n, 0, [entry(2)], T0 + 252)
    assert out == [Build(n, (entry(2), entry(5), entry(6)), T0 + 250)]
    assert cycles.uploaded(n, True, None, False) == [Commit(n)]
    results = [ok(entry(2)), ok(entry(5)), ok(entry(6))]
    assert cycles.committed(n, results) == [
        Answer(n, 0, [ok(entry(2))]),
        Answer(n, 1, [ok(entry(5)), ok(entry(6))]),
    ]


# -- empty cycles, timeouts, late answers -----------------------------------------------------


def test_a_cut_that_gathers_nothing_finishes_at_once() -> None:
    cycles = Cycles(LIMITS)
    n = cut(cycles, [0, 1])
    assert cycles.cut_answered(n, 0, [], T0 + 251) == []
    assert cycles.cut_answered(n, 1, [], T0 + 252) == []
    assert cycles.idle


def test_an_empty_cycle_unblocks_the_commit_of_a_later_one() -> None:
    cycles = Cycles(Limits(250, 1000, 5, 3))
    a = cut(cycles, [0])  # shard 0 is slow
    b = cut(cycles, [1])
    cycles.cut_answered(b, 1, [entry(1)], T0 + 251)
    assert cycles.uploaded(b, True, None, False) == []
    assert cycles.cut_answered(a, 0, [], T0 + 300) == [Commit(b)]


def test_a_shard_that_does_not_answer_is_left_out_and_its_report_dropped() -> None:
    cycles = Cycles(LIMITS)
    n = cut(cycles, [0, 1])
    cycles.cut_answered(n, 0, [entry(0)], T0 + 251)
    assert cycles.tick(T0 + 250 + CUT_TIMEOUT_MS - 1) == []
    out = cycles.tick(T0 + 250 + CUT_TIMEOUT_MS)
    assert out == [Build(n, (entry(0),), T0 + 250)]
    assert cycles.tick(T0 + 100_000) == []  # shard 1's report went with the timeout


def test_a_timed_out_shard_that_reported_after_the_cut_is_cut_again() -> None:
    cycles = Cycles(Limits(250, 1000, 5, 4))
    n = cut(cycles, [0])
    cycles.pending(report(0, oldest=T0 + 300), T0 + 300)  # its successor, say
    out = cycles.tick(T0 + 250 + CUT_TIMEOUT_MS)
    assert out == [SendCut(n + 1, (0,), "age")]
    assert cycles.in_flight == 1  # the empty cycle n finished


def test_a_late_answer_is_answered_at_once_as_not_committed() -> None:
    cycles = Cycles(LIMITS)
    n = cut(cycles, [0])
    cycles.tick(T0 + 250 + CUT_TIMEOUT_MS)
    assert cycles.idle
    out = cycles.cut_answered(n, 0, [entry(0)], T0 + 2000)
    assert len(out) == 1
    answer = out[0]
    assert isinstance(answer, Answer) and (answer.cycle, answer.shard) == (n, 0)
    (result,) = answer.results
    assert not result.committed and not result.storage_error
    assert (result.topic, result.partition, result.base_offset) == ("t", 0, 0)
    assert cycles.cut_answered(n, 0, [], T0 + 2000) == []


def test_an_answer_from_a_shard_that_was_not_asked_is_refused() -> None:
    cycles = Cycles(LIMITS)
    n = cut(cycles, [0])
    out = cycles.cut_answered(n, 7, [entry(9)], T0 + 251)
    assert [type(i) for i in out] == [Answer]
    assert cycles.cut_answered(n, 0, [entry(0)], T0 + 251) == [Build(n, (entry(0),), T0 + 250)]


# -- failures ---------------------------------------------------------------------------------


def test_a_failed_upload_answers_every_entry_as_a_storage_error() -> None:
    cycles = Cycles(LIMITS)
    n = cut(cycles, [0, 1])
    cycles.cut_answered(n, 0, [entry(0)], T0 + 251)
    cycles.cut_answered(n, 1, [entry(1)], T0 + 251)
    out = cycles.uploaded(n, False, "S3 is down", True)
    assert out == [
        Answer(n, 0, [EntryResult("t", 0, 0, False, error="S3 is down", storage_error=True)]),
        Answer(n, 1, [EntryResult("t", 1, 0, False, error="S3 is down", storage_error=True)]),
    ]
    assert cycles.idle


def test_later_cycles_still_commit_after_a_failed_upload() -> None:
    cycles = Cycles(Limits(250, 1000, 5, 3))
    a = cut(cycles, [0])
    cycles.cut_answered(a, 0, [entry(0)], T0 + 250)
    b = cut(cycles, [0])
    cycles.cut_answered(b, 0, [entry(0, 10)], T0 + 250)
    assert cycles.uploaded(b, True, None, False) == []
    out = cycles.uploaded(a, False, "timeout", True)
    assert [type(i) for i in out] == [Answer, Commit]
    assert out[1] == Commit(b)


def test_a_failed_later_upload_is_answered_before_the_earlier_commit() -> None:
    cycles = Cycles(Limits(250, 1000, 5, 3))
    a = cut(cycles, [0])
    cycles.cut_answered(a, 0, [entry(0)], T0 + 250)
    b = cut(cycles, [0])
    cycles.cut_answered(b, 0, [entry(0, 10)], T0 + 250)
    assert [type(i) for i in cycles.uploaded(b, False, None, False)] == [Answer]
    assert cycles.uploaded(a, True, None, False) == [Commit(a)]


def test_events_for_cycles_in_another_phase_are_bugs() -> None:
    cycles = Cycles(LIMITS)
    n = cut(cycles, [0])
    with pytest.raises(ValueError):
        cycles.uploaded(n, True, None, False)
    cycles.cut_answered(n, 0, [entry(0)], T0 + 251)
    with pytest.raises(ValueError):
        cycles.committed(n, [ok(entry(0))])
    cycles.uploaded(n, True, None, False)
    with pytest.raises(ValueError):
        cycles.committed(n, [])


def test_stop_cuts_nothing_more_but_finishes_what_is_in_flight() -> None:
    cycles = Cycles(LIMITS)
    n = cut(cycles, [0])
    cycles.stop()
    assert cycles.pending(report(1, nbytes=5000), T0 + 251) == []
    assert cycles.wakeup_ms() == T0 + 250 + CUT_TIMEOUT_MS
    cycles.cut_answered(n, 0, [entry(0)], T0 + 251)
    assert cycles.uploaded(n, True, None, False) == [Commit(n)]
    assert cycles.committed(n, [ok(entry(0))]) == [Answer(n, 0, [ok(entry(0))])]
    assert cycles.idle


# -- property: commits in order, every entry answered once -------------------------------------

SHARDS = 3

actions = st.lists(
    st.tuples(
        # weighted towards progress, so that most runs pipeline and commit several cycles
        st.sampled_from(
            ["report"] * 3 + ["tick", "silence", "fail"] + ["answer", "upload", "commit"] * 3
        ),
        st.integers(0, 10),
        st.sampled_from([0, 1, 5, 100, 300]),
    ),
    min_size=20,
    max_size=150,
)


@settings(max_examples=300, deadline=None)
@given(actions, st.integers(1, 4))
def test_commits_are_in_cycle_order_and_every_entry_is_answered_once(
    steps: list[tuple[str, int, int]], depth: int
) -> None:
    cycles = Cycles(Limits(250, 1000, 5, depth))
    now = T0
    next_base = 0
    cuts: dict[int, set[int]] = {}  # cycle -> shards asked and not yet answered
    building: list[int] = []
    uploaded: set[int] = set()
    committing: int | None = None
    built: dict[int, tuple[WalEntry, ...]] = {}
    handed: list[tuple[int, WalEntry]] = []  # (cycle, entry) every shard gave
    answered: list[tuple[int, tuple[str, int, int]]] = []
    commits: list[int] = []

    def run(out: list[Instruction]) -> None:
        nonlocal committing
        for instruction in out:
            if isinstance(instruction, SendCut):
                assert instruction.cycle not in cuts
                cuts[instruction.cycle] = set(instruction.shards)
            elif isinstance(instruction, Build):
                building.append(instruction.cycle)
                built[instruction.cycle] = instruction.entries
            elif isinstance(instruction, Commit):
                assert committing is None, "one commit at a time"
                assert instruction.cycle in uploaded
                assert not commits or instruction.cycle > commits[-1]
                commits.append(instruction.cycle)
                committing = instruction.cycle
            else:
                for result in instruction.results:
                    key = (result.topic, result.partition, result.base_offset)
                    answered.append((instruction.cycle, key))

    for action, pick, dt in steps:
        now += dt
        if action == "report":
            run(cycles.pending(report(pick % SHARDS, nbytes=pick * 100, oldest=now - dt), now))
        elif action == "tick":
            run(cycles.tick(now))
        elif action in ("answer", "silence") and cuts:
            n = sorted(cuts)[pick % len(cuts)]
            if not cuts[n]:
                continue
            shard = sorted(cuts[n])[pick % len(cuts[n])]
            cuts[n].discard(shard)
            if action == "answer":
                entries = [entry(shard * 100 + i, next_base) for i in range(pick % 3)]
                next_base += 1
                handed += [(n, e) for e in entries]
                run(cycles.cut_answered(n, shard, entries, now))
        elif action in ("upload", "fail") and building:
            n = building.pop(pick % len(building))
            if action == "upload":
                uploaded.add(n)
                run(cycles.uploaded(n, True, None, False))
            else:
                run(cycles.uploaded(n, False, "down", True))
        elif action == "commit" and committing is not None:
            n, committing = committing, None
            run(cycles.committed(n, [ok(e) for e in built[n]]))

    # Drain: no more cuts; silent shards time out, uploads succeed, commits succeed.
    cycles.stop()
    for _ in range(100):
        now += CUT_TIMEOUT_MS
        run(cycles.tick(now))
        while building:
            n = building.pop()
            uploaded.add(n)
            run(cycles.uploaded(n, True, None, False))
        if committing is not None:
            n, committing = committing, None
            run(cycles.committed(n, [ok(e) for e in built[n]]))
        if cycles.idle and not building:
            break
    for n, shards in cuts.items():  # answers arriving after everything closed
        for shard in shards:
            late = [entry(shard * 100 + 50, next_base)]
            next_base += 1
            handed += [(n, e) for e in late]
            run(cycles.cut_answered(n, shard, late, now))
    assert cycles.idle
    expected = sorted((n, (e.topic, e.partition, e.base_offset)) for n, e in handed)
    assert sorted(answered) == expected
