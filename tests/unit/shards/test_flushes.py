"""The shard's cycle bookkeeping (``kafscale.shards.flushes``): pure, no buffers, no clock."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from kafscale.ipc.write_path import ShardPending
from kafscale.shards.flushes import (
    FLUSH_TIMEOUT_MS,
    MAX_RETRY_MS,
    RESEND_MS,
    RETRY_MS,
    Holds,
    Key,
    Outcome,
    PendingReport,
)

T0 = 1_700_000_000_000
A: Key = ("a", 0)
B: Key = ("b", 3)


@dataclass
class Buf:
    base_offset: int
    size: int = 100


def bufs(*bases: int) -> list[Buf]:
    return [Buf(base) for base in bases]


def bases(taken: list[tuple[Key, Buf]]) -> list[tuple[Key, int]]:
    return [(key, buffer.base_offset) for key, buffer in taken]


# -- holds -------------------------------------------------------------------------------------


def test_a_cut_takes_every_buffer_no_cycle_holds_in_the_order_offered() -> None:
    holds = Holds()
    taken = holds.cut(1, T0, [(A, bufs(0, 10)), (B, bufs(5))])
    assert bases(taken) == [(A, 0), (A, 10), (B, 5)]
    assert holds.held_bytes == 300
    assert [holds.holder(A, 0), holds.holder(A, 10), holds.holder(B, 5)] == [1, 1, 1]
    # The next cut gets only what is new.
    assert bases(holds.cut(2, T0 + 5, [(A, bufs(0, 10, 20)), (B, bufs(5))])) == [(A, 20)]
    assert holds.holder(A, 20) == 2 and holds.held_bytes == 400
    assert holds.cut(3, T0 + 9, [(A, bufs(0, 10, 20))]) == []


def test_committed_results_end_their_holds() -> None:
    holds = Holds()
    holds.cut(1, T0, [(A, bufs(0, 10))])
    assert holds.settle(1, A, 0, committed=True) is Outcome.COMMITTED
    assert holds.holder(A, 0) is None and holds.holder(A, 10) == 1
    assert holds.held_bytes == 100
    assert holds.settle(1, A, 10, committed=True) is Outcome.COMMITTED
    assert holds.held_bytes == 0
    assert holds.answered(1) == set()
    assert holds.oldest_cut_ms() is None


def test_a_buffer_not_committed_releases_it_and_every_later_one_of_its_partition() -> None:
    holds = Holds()
    holds.cut(1, T0, [(A, bufs(0, 10)), (B, bufs(0))])
    holds.cut(2, T0 + 5, [(A, bufs(0, 10, 20))])
    assert holds.settle(1, A, 10, committed=False) is Outcome.RELEASED
    # 10 (cycle 1) and 20 (cycle 2) would be refused for not starting at the high watermark.
    assert [holds.holder(A, b) for b in (0, 10, 20)] == [1, None, None]
    assert holds.holder(B, 0) == 1  # another partition is not concerned
    assert holds.held_bytes == 200
    # Cycle 2's answer about 20 is ignored now; the next cut offers 10 and 20 again, in order.
    assert holds.settle(2, A, 20, committed=True) is Outcome.IGNORED
    assert bases(holds.cut(3, T0 + 9, [(A, bufs(0, 10, 20))])) == [(A, 10), (A, 20)]


def test_a_result_for_a_buffer_its_cycle_no_longer_holds_is_ignored() -> None:
    holds = Holds(timeout_ms=1000)
    holds.cut(1, T0, [(A, bufs(0))])
    assert holds.expire(T0 + 1000) == [(1, {A})]
    holds.cut(2, T0 + 1001, [(A, bufs(0))])  # a later cycle took it
    assert holds.settle(1, A, 0, committed=False) is Outcome.IGNORED
    assert holds.settle(1, A, 0, committed=True) is Outcome.IGNORED
    assert holds.holder(A, 0) == 2
    assert holds.settle(7, B, 0, committed=True) is Outcome.IGNORED  # never held at all


def test_an_answer_releases_what_it_did_not_name() -> None:
    holds = Holds()
    holds.cut(1, T0, [(A, bufs(0)), (B, bufs(0))])
    holds.settle(1, A, 0, committed=True)
    assert holds.answered(1) == {B}
    assert holds.holder(B, 0) is None and holds.held_bytes == 0
    assert holds.answered(1) == set()  # once


def test_cycles_unanswered_in_time_are_released() -> None:
    holds = Holds()
    holds.cut(1, T0, [(A, bufs(0))])
    holds.cut(2, T0 + 500, [(B, bufs(0))])
    assert holds.oldest_cut_ms() == T0
    assert holds.expire(T0 + FLUSH_TIMEOUT_MS - 1) == []
    assert holds.expire(T0 + FLUSH_TIMEOUT_MS) == [(1, {A})]
    assert holds.holder(A, 0) is None and holds.holder(B, 0) == 2
    assert holds.oldest_cut_ms() == T0 + 500
    assert holds.expire(T0 + 500 + FLUSH_TIMEOUT_MS) == [(2, {B})]
    assert holds.held_bytes == 0


def test_a_cut_that_takes_nothing_leaves_no_cycle_waiting() -> None:
    # The flusher answers only the shards its object holds: a cycle that took nothing here
    # must not wait for an answer (it would count as a slow store and refuse produce).
    holds = Holds()
    holds.cut(1, T0, [(A, bufs(0))])
    assert holds.cut(2, T0 + 50, [(A, bufs(0))]) == []
    assert holds.cut(3, T0 + 60, []) == []
    assert holds.oldest_cut_ms() == T0
    assert holds.settle(1, A, 0, committed=True) is Outcome.COMMITTED
    assert holds.answered(1) == set()
    assert holds.oldest_cut_ms() is None
    assert holds.expire(T0 + 60 + FLUSH_TIMEOUT_MS) == []


def test_a_cycle_number_seen_again_keeps_the_old_holds_until_it_is_answered() -> None:
    # A new flusher may count cycles from where a dead one did.
    holds = Holds()
    holds.cut(5, T0, [(A, bufs(0))])
    assert bases(holds.cut(5, T0 + 100, [(A, bufs(0, 10))])) == [(A, 10)]
    assert holds.oldest_cut_ms() == T0 + 100
    holds.settle(5, A, 10, committed=False)  # only the new cycle's entry is named
    assert holds.answered(5) == {A}
    assert holds.held_bytes == 0


def test_freed_and_forgotten_buffers_are_held_no_more() -> None:
    holds = Holds()
    holds.cut(1, T0, [(A, bufs(0, 10)), (B, bufs(0))])
    holds.freed(A, 0)
    holds.freed(A, 99)  # not held: nothing happens
    assert holds.holder(A, 0) is None and holds.held_bytes == 200
    holds.forget(A)
    assert holds.holder(A, 10) is None and holds.held_bytes == 100
    assert holds.answered(1) == {B}


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["cut", "ok", "fail", "answer", "expire", "forget"]),
            st.integers(0, 3),  # cycle
            st.sampled_from([A, B]),
            st.integers(0, 4),  # buffer index
        ),
        max_size=40,
    )
)
def test_held_bytes_is_the_size_of_what_cycles_hold(
    events: list[tuple[str, int, Key, int]],
) -> None:
    holds = Holds(timeout_ms=50)
    sizes = {b: 10 + b for b in range(5)}
    now = T0
    for kind, cycle, key, index in events:
        now += 10
        base = index * 100
        if kind == "cut":
            offered = [(k, [Buf(b * 100, sizes[b]) for b in range(5)]) for k in (A, B)]
            holds.cut(cycle, now, offered)
        elif kind in ("ok", "fail"):
            before = holds.holder(key, base)
            outcome = holds.settle(cycle, key, base, committed=kind == "ok")
            assert (outcome is Outcome.IGNORED) == (before != cycle)
            if outcome is Outcome.RELEASED:
                assert all(holds.holder(key, b * 100) is None for b in range(index, 5))
        elif kind == "answer":
            holds.answered(cycle)
            assert all(holds.holder(k, b * 100) != cycle for k in (A, B) for b in range(5))
        elif kind == "expire":
            holds.expire(now)
        else:
            holds.forget(key)
        held = [sizes[b] for k in (A, B) for b in range(5) if holds.holder(k, b * 100) is not None]
        assert holds.held_bytes == sum(held)


# -- pending reports ---------------------------------------------------------------------------


def never() -> int:
    raise AssertionError("the oldest pending byte was asked for without a report")


def test_pending_bytes_appearing_are_reported_once() -> None:
    report = PendingReport(shard=2, object_bytes=4000)
    assert report.report(T0, 0, never) is None
    assert report.report(T0, 10, lambda: T0 - 5) == ShardPending(2, 10, T0 - 5, -1)
    assert report.report(T0 + 1, 500, never) is None  # not on every append


def test_each_quarter_of_the_object_bound_is_reported() -> None:
    report = PendingReport(shard=0, object_bytes=4000)
    assert report.report(T0, 10, lambda: T0) is not None
    assert report.report(T0, 999, never) is None
    assert report.report(T0, 1000, lambda: T0) == ShardPending(0, 1000, T0, -1)
    assert report.report(T0, 1999, never) is None
    notice = report.report(T0, 3500, lambda: T0)  # two quarters at once: one notice
    assert notice is not None and notice.bytes == 3500
    assert report.report(T0, 3999, never) is None


def test_a_waiter_makes_pending_bytes_urgent_once() -> None:
    report = PendingReport(shard=0, object_bytes=4000)
    report.report(T0, 10, lambda: T0)
    report.urgent(T0 + 3)
    assert report.report(T0 + 4, 20, lambda: T0) == ShardPending(0, 20, T0, T0 + 3)
    report.urgent(T0 + 9)  # a later waiter: the flusher already knows since when
    assert report.report(T0 + 10, 30, never) is None
    report.urgent(T0 + 1)  # one waiting from earlier (buffers given back)
    notice = report.report(T0 + 11, 30, lambda: T0)
    assert notice is not None and notice.urgent_ms == T0 + 1


def test_a_cut_starts_afresh() -> None:
    report = PendingReport(shard=0, object_bytes=4000)
    report.urgent(T0)
    report.report(T0, 10, lambda: T0)
    report.cut()
    # Appends that arrive after the cut, in the same loop turn, are news to the flusher.
    assert report.report(T0 + 1, 5, lambda: T0 + 1) == ShardPending(0, 5, T0 + 1, -1)


def test_nothing_pending_clears_urgency() -> None:
    report = PendingReport(shard=0, object_bytes=4000)
    report.urgent(T0)
    assert report.report(T0, 0, never) is None  # everything is in cycles already
    assert report.report(T0 + 1, 5, lambda: T0) == ShardPending(0, 5, T0, -1)


def test_a_report_is_sent_again_while_bytes_stay_pending() -> None:
    report = PendingReport(shard=0, object_bytes=4000)
    report.report(T0, 10, lambda: T0)
    assert report.report(T0 + RESEND_MS - 1, 10, never) is None
    assert report.report(T0 + RESEND_MS, 10, lambda: T0) == ShardPending(0, 10, T0, -1)


def test_failed_cycles_back_off_and_a_commit_ends_that() -> None:
    report = PendingReport(shard=0, object_bytes=4000)
    report.failed(T0)
    assert report.report(T0 + RETRY_MS - 1, 10, never) is None
    assert report.report(T0 + RETRY_MS, 10, lambda: T0) is not None
    report.cut()
    report.failed(T0)
    assert report.report(T0 + 2 * RETRY_MS - 1, 10, never) is None  # longer each time
    for _ in range(50):
        report.failed(T0)
    assert report.report(T0 + MAX_RETRY_MS - 1, 10, never) is None
    assert report.report(T0 + MAX_RETRY_MS, 10, lambda: T0) is not None
    report.cut()
    report.failed(T0)
    report.succeeded()
    assert report.report(T0, 10, lambda: T0) is not None
