from hypothesis import given
from hypothesis import strategies as st

from kafscale.protocol.errors import ErrorCode
from kafscale.shards.producers import (
    MAX_SEQUENCE,
    BatchMetadata,
    ProducerStates,
    Verdict,
    next_sequence,
)

PID = 1000


def append(
    states: ProducerStates, first_sequence: int, count: int, offset: int, epoch: int = 0
) -> Verdict:
    check = states.check(PID, epoch, first_sequence, count - 1)
    if check.verdict is Verdict.APPEND:
        states.record(PID, epoch, first_sequence, count - 1, offset)
    return check.verdict


def test_non_idempotent_batches_are_never_checked() -> None:
    states = ProducerStates()
    for _ in range(3):
        assert states.check(-1, -1, -1, 9).verdict is Verdict.APPEND
        states.record(-1, -1, -1, 9, 0)
    assert states.producers == {}


def test_in_sequence_batches_append_and_a_resend_is_a_duplicate() -> None:
    states = ProducerStates()
    assert append(states, 0, 5, offset=0) is Verdict.APPEND
    assert append(states, 5, 3, offset=5) is Verdict.APPEND
    check = states.check(PID, 0, 0, 4)  # the first batch again, e.g. after a lost response
    assert check.verdict is Verdict.DUPLICATE
    assert check.duplicate_of == BatchMetadata(0, 4, 0, 4)
    assert states.check(PID, 0, 5, 2).duplicate_of == BatchMetadata(5, 7, 5, 7)


def test_a_gap_is_out_of_order() -> None:
    states = ProducerStates()
    append(states, 0, 5, offset=0)
    check = states.check(PID, 0, 6, 0)
    assert check.verdict is Verdict.REFUSE
    assert check.error == ErrorCode.out_of_order_sequence_number
    assert "expected 5" in (check.message or "")


def test_only_the_last_five_batches_are_remembered() -> None:
    states = ProducerStates()
    for i in range(7):
        append(states, i, 1, offset=i)
    assert states.check(PID, 0, 1, 0).verdict is Verdict.REFUSE  # forgotten: not a duplicate
    assert states.check(PID, 0, 2, 0).verdict is Verdict.DUPLICATE


def test_unknown_producer_may_start_anywhere() -> None:
    assert ProducerStates().check(PID, 3, 12345, 0).verdict is Verdict.APPEND


def test_epochs() -> None:
    states = ProducerStates()
    append(states, 0, 2, offset=0, epoch=1)
    stale = states.check(PID, 0, 2, 0)
    assert (stale.verdict, stale.error) == (Verdict.REFUSE, ErrorCode.invalid_producer_epoch)
    bumped_wrong = states.check(PID, 2, 7, 0)
    assert bumped_wrong.error == ErrorCode.out_of_order_sequence_number
    assert append(states, 0, 1, offset=2, epoch=2) is Verdict.APPEND
    assert states.producers[PID].epoch == 2
    assert [b.first_offset for b in states.producers[PID].batches] == [2]  # history reset


def test_sequences_wrap() -> None:
    assert next_sequence(MAX_SEQUENCE) == 0
    assert next_sequence(MAX_SEQUENCE - 1, 3) == 1
    states = ProducerStates()
    append(states, MAX_SEQUENCE - 1, 2, offset=0)
    assert states.producers[PID].last_sequence == MAX_SEQUENCE
    assert append(states, 0, 1, offset=2) is Verdict.APPEND


@given(st.lists(st.integers(min_value=1, max_value=20), min_size=1, max_size=12))
def test_snapshot_round_trip_keeps_duplicate_detection(counts: list[int]) -> None:
    states = ProducerStates()
    sequence = offset = 0
    for count in counts:
        append(states, sequence, count, offset)
        sequence, offset = sequence + count, offset + count
    restored = ProducerStates.restore(states.snapshot())
    assert restored.snapshot() == states.snapshot()
    last = counts[-1]
    check = restored.check(PID, 0, sequence - last, last - 1)
    assert check.verdict is Verdict.DUPLICATE
    assert restored.check(PID, 0, sequence, 0).verdict is Verdict.APPEND


def test_expiry() -> None:
    states = ProducerStates()
    states.record(PID, 0, 0, 0, 0, max_timestamp=100)
    states.record(PID + 1, 0, 0, 0, 1, max_timestamp=500)
    assert states.expire(older_than_timestamp=200) == [PID]
    assert list(states.producers) == [PID + 1]
