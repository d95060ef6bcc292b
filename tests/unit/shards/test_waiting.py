"""Requests waiting for commits (``kafscale.shards.waiting``) and the shard's admission of
appends (``kafscale.shards.admission``): pure."""

from __future__ import annotations

from dataclasses import dataclass

from kafscale.ipc import messages
from kafscale.ipc.rpc import Incoming
from kafscale.protocol.errors import ErrorCode
from kafscale.shards.admission import SLOW_PENALTY_MS, Admission
from kafscale.shards.waiting import Waiters, Waiting

T0 = 1_700_000_000_000


@dataclass
class Log:
    high_watermark: int = 0


def incoming(n: int) -> Incoming:
    return Incoming(b"frontend", bytes([n]), messages.Ping())


def test_an_acks_all_request_is_answered_once_every_partition_passed_its_offset() -> None:
    a, b = Log(), Log()
    results = [messages.AppendResult(base_offset=0), messages.AppendResult(base_offset=4)]
    waiters = Waiters()
    assert waiters.add(Waiting(incoming(1), results, {0: (a, 0), 1: (b, 4)}, T0 + 100, T0)) == []
    assert waiters.since_ms() == T0
    a.high_watermark = 1
    assert waiters.committed() == []
    b.high_watermark = 5
    [(asked, reply)] = waiters.committed()
    assert asked == incoming(1) and reply == messages.Appended(results=results)
    assert len(waiters) == 0 and waiters.since_ms() is None


def test_at_the_deadline_the_uncommitted_partitions_time_out() -> None:
    a, b = Log(high_watermark=1), Log()
    results = [messages.AppendResult(base_offset=0), messages.AppendResult(base_offset=4)]
    waiters = Waiters()
    waiters.add(Waiting(incoming(1), results, {0: (a, 0), 1: (b, 4)}, T0 + 100, T0))
    assert waiters.expire(T0 + 99) == []
    [(_, reply)] = waiters.expire(T0 + 100)
    assert isinstance(reply, messages.Appended)
    assert reply.results[0] == results[0]
    assert reply.results[1].error_code == ErrorCode.request_timed_out
    assert waiters.expire(T0 + 200) == []


def test_a_flush_with_nothing_to_wait_for_is_answered_at_once() -> None:
    waiters = Waiters()
    [(_, reply)] = waiters.add(Waiting(incoming(2), [], {}, T0 + 100, T0, flush_all=True))
    assert reply == messages.FlushedAll(partitions=0)
    log = Log()
    waiters.add(Waiting(incoming(3), [], {0: (log, 9)}, T0 + 100, T0, flush_all=True))
    [(_, late)] = waiters.expire(T0 + 100)
    assert late == messages.FlushedAll(partitions=1, error="not everything was committed in time")


def test_admission_refuses_while_full_failing_slow_or_stopping() -> None:
    gate = Admission(budget=1000)
    assert gate.refusal(T0, 1000) is None and gate.healthy(T0)
    gate.unflushed = 600
    assert "full" in (gate.refusal(T0, 401) or "")
    gate.failed([("a", 0)])
    assert "failing" in (gate.refusal(T0, 1) or "") and not gate.healthy(T0)
    gate.recovered(("a", 0))
    assert gate.slow(T0) is True and gate.slow(T0 + 1) is False  # once per slow spell
    assert "slow" in (gate.refusal(T0 + 1, 1) or "")
    assert gate.refusal(T0 + 1 + SLOW_PENALTY_MS, 1) is None
    gate.stopping = True
    assert "stopping" in (gate.refusal(T0 + 1 + SLOW_PENALTY_MS, 1) or "")
