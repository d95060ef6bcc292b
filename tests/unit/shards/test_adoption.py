"""The adoption decisions (``kafscale.shards.adoption``) on hand-built buffers: no shared memory,
no store. Each buffer is what a dead shard could leave: whole batches, a torn or corrupt tail, a
seqlock left odd, buffers flushed already, gaps and overlaps, other topics."""

from __future__ import annotations

import uuid

import pytest

from kafscale.ipc.shm import BufferOwner, BufferState
from kafscale.protocol import records
from kafscale.protocol.errors import ErrorCode
from kafscale.shards.adoption import (
    AdoptionPlan,
    Committed,
    FoundBuffer,
    owner_key,
    plan_adoption,
    walk,
)
from kafscale.shards.producers import ProducerStates, Verdict

T0 = 1_700_000_000_000
OWNER = BufferOwner("events", str(uuid.UUID(int=1)), 3, topic_created_ms=T0 - 5)
OTHER = BufferOwner("audit", str(uuid.UUID(int=2)), 0, topic_created_ms=T0 - 9)


def batch(base: int, count: int = 1, pid: int = -1, epoch: int = -1, seq: int = -1) -> bytes:
    """A batch as the shard stores it: offsets assigned from ``base``."""
    values = [(None, f"value-{base + i}".encode(), (), T0 + base + i) for i in range(count)]
    return records.build_batch(
        values, base_offset=base, producer_id=pid, producer_epoch=epoch, base_sequence=seq
    )


def found(
    slot: int,
    base: int,
    *blobs: bytes,
    tail: bytes = b"",
    committed: int | None = None,
    capacity: int | None = None,
    sealed_ms: int = 0,
    codec: int = 0,
    interrupted: bool = False,
    owner: BufferOwner = OWNER,
) -> FoundBuffer:
    data = b"".join(blobs) + tail
    committed = len(data) if committed is None else committed
    capacity = len(data) + 100 if capacity is None else capacity
    state = BufferState(
        generation=0,
        committed=committed,
        base_offset=base,
        sealed=sealed_ms > 0,
        batch_count=len(blobs),
        record_count=0,  # never trusted: counted from the batches
        sealed_ms=sealed_ms,
        codec=codec,
    )
    region = data.ljust(capacity, b"\0")[:capacity]
    return FoundBuffer(f"buf-{slot}", slot, owner, state, capacity, interrupted, region)


def plan(
    *buffers: FoundBuffer, hw: int = 0, producers: dict[int, object] | None = None
) -> AdoptionPlan:
    committed = {owner_key(b.owner): Committed(True, hw, producers) for b in buffers}  # type: ignore[arg-type]
    return plan_adoption(buffers, committed)


def test_whole_buffers_are_adopted_in_offset_order_from_the_high_watermark() -> None:
    first = [batch(10, 2), batch(12, 1)]
    second = [batch(13, 3)]
    result = plan(
        found(8, 13, *second, codec=1),  # the open one, listed first: order comes from offsets
        found(7, 10, *first, sealed_ms=T0 + 500, codec=2),
        hw=10,
    )
    assert result.discarded == ()
    [partition] = result.partitions
    assert (partition.owner, partition.high_watermark, partition.next_offset) == (OWNER, 10, 16)
    sealed, open_ = partition.buffers
    assert (sealed.name, sealed.base_offset, sealed.next_offset) == ("buf-7", 10, 13)
    assert (sealed.size, sealed.batches, sealed.records) == (sum(map(len, first)), 2, 3)
    assert sealed.starts == (0, len(first[0]))
    assert sealed.lasts == (11, 12)
    assert sealed.max_timestamp == T0 + 12
    # sealed by its owner: same created time and codec, so a re-flush builds the same bytes
    assert (sealed.sealed_ms, sealed.codec) == (T0 + 500, 2)
    assert (sealed.truncated, sealed.dropped) == (False, None)
    assert (open_.name, open_.base_offset, open_.next_offset) == ("buf-8", 13, 16)
    assert (open_.sealed_ms, open_.codec) == (None, 1)  # the successor seals it
    assert result.last_slot == 8


@pytest.mark.parametrize(
    ("tail", "problem"),
    [
        (lambda b: b[: len(b) - 5], "does not fit"),  # the copy of the last batch never ended
        (lambda b: b[:30], "cannot hold a batch header"),
        (lambda b: b[:-1] + bytes([b[-1] ^ 0x40]), "CRC32C"),  # a flipped bit in a record
        (lambda b: b[:16] + b"\x07" + b[17:], "magic 7"),
        (lambda b: batch(99), "base offset 99, expected 12"),  # not the offsets that follow
        (lambda b: bytes(len(b)), "magic 0"),  # zeros: never written
        (lambda b: b[:8] + (1 << 20).to_bytes(4, "big") + b[12:], "length 1048576"),
    ],
)
def test_a_bad_tail_is_dropped_and_the_whole_prefix_kept(tail: object, problem: str) -> None:
    whole = [batch(10, 1), batch(11, 1)]
    bad = tail(batch(12, 2))  # type: ignore[operator]
    result = plan(found(1, 10, *whole, tail=bad), hw=10)
    [partition] = result.partitions
    [adopted] = partition.buffers
    assert (adopted.size, adopted.next_offset, adopted.lasts) == (
        sum(map(len, whole)),
        12,
        (10, 11),
    )
    assert adopted.truncated
    assert adopted.dropped is not None and problem in adopted.dropped
    assert partition.next_offset == 12  # offsets 12.. were never acknowledged: given out again


def test_committed_beyond_the_capacity_is_walked_only_up_to_the_capacity() -> None:
    blob = batch(0, 2)
    buffer = found(1, 0, blob, committed=10 * len(blob), capacity=len(blob))
    [partition] = plan(buffer).partitions
    [adopted] = partition.buffers
    assert (adopted.size, adopted.next_offset, adopted.truncated) == (len(blob), 2, True)
    assert adopted.dropped is not None and "capacity" in adopted.dropped


def test_an_interrupted_seqlock_keeps_verified_batches_but_not_the_seal() -> None:
    blob = batch(0, 4)
    buffer = found(1, 0, blob, sealed_ms=T0, codec=3, interrupted=True)
    [partition] = plan(buffer).partitions
    [adopted] = partition.buffers
    assert (adopted.next_offset, adopted.truncated) == (4, False)
    assert adopted.sealed_ms is None  # a seal that never finished was never flushed: seal anew
    assert adopted.codec == 3


def test_buffers_below_the_high_watermark_were_flushed_already() -> None:
    flushed = found(1, 0, batch(0, 5), sealed_ms=T0)
    kept = found(2, 5, batch(5, 2))
    result = plan(flushed, kept, hw=5)
    [discarded] = result.discarded
    assert (discarded.name, discarded.anomaly) == ("buf-1", False)
    assert "flushed already" in discarded.reason
    [partition] = result.partitions
    assert [b.name for b in partition.buffers] == ["buf-2"]
    assert partition.next_offset == 7


def test_everything_flushed_leaves_no_partition_to_adopt() -> None:
    result = plan(found(4, 0, batch(0, 3), sealed_ms=T0), hw=3)
    assert result.partitions == ()
    assert [d.anomaly for d in result.discarded] == [False]
    assert result.last_slot == 4


def test_a_gap_keeps_what_is_contiguous_and_discards_the_rest_loudly() -> None:
    result = plan(
        found(1, 0, batch(0, 3), sealed_ms=T0),
        found(2, 5, batch(5, 2), sealed_ms=T0),  # offsets 3 and 4 are missing
        found(3, 7, batch(7, 2)),
    )
    [partition] = result.partitions
    assert [b.name for b in partition.buffers] == ["buf-1"]
    assert partition.next_offset == 3
    assert [(d.name, d.anomaly) for d in result.discarded] == [("buf-2", True), ("buf-3", True)]
    assert all("a gap" in d.reason for d in result.discarded)


def test_a_buffer_that_does_not_start_at_the_high_watermark_is_not_adopted() -> None:
    result = plan(found(1, 4, batch(4, 2)), hw=0)
    assert result.partitions == ()
    [discarded] = result.discarded
    assert discarded.anomaly and "do not continue from 0" in discarded.reason


def test_an_overlap_with_committed_offsets_is_never_adopted() -> None:
    # offsets 3..7 straddle the high watermark 5: 3 and 4 are committed with other bytes
    result = plan(found(1, 3, batch(3, 5)), found(2, 8, batch(8, 1)), hw=5)
    assert result.partitions == ()
    assert [(d.name, d.anomaly) for d in result.discarded] == [("buf-1", True), ("buf-2", True)]
    assert "an overlap" in result.discarded[0].reason


def test_empty_and_garbage_buffers_are_discarded() -> None:
    empty = found(1, 0)  # created, then the shard died before the first append published
    garbage = found(2, 0, tail=b"\xff" * 80, owner=OTHER)
    result = plan(empty, garbage)
    assert result.partitions == ()
    assert {(d.name, d.anomaly) for d in result.discarded} == {("buf-1", False), ("buf-2", True)}


def test_a_deleted_topic_s_buffers_are_discarded_quietly() -> None:
    ours = found(1, 0, batch(0, 1))
    gone = found(2, 0, batch(0, 1), owner=OTHER)
    committed = {owner_key(OWNER): Committed(True), owner_key(OTHER): Committed(False)}
    result = plan_adoption([ours, gone], committed)
    assert [p.owner for p in result.partitions] == [OWNER]
    [discarded] = result.discarded
    assert (discarded.name, discarded.anomaly) == ("buf-2", False)
    assert "no longer exists" in discarded.reason


def test_partitions_are_decided_independently() -> None:
    result = plan(
        found(1, 0, batch(0, 2)),
        found(2, 40, batch(40, 1), owner=OTHER),  # a gap in OTHER only
        found(3, 2, batch(2, 1)),
    )
    [partition] = result.partitions
    assert (partition.owner, partition.next_offset) == (OWNER, 3)
    assert [d.name for d in result.discarded] == ["buf-2"]


def test_producer_state_is_the_committed_snapshot_plus_the_adopted_batches() -> None:
    committed = ProducerStates()
    committed.record(42, 0, 0, 4, first_offset=0)  # sequences 0..4 at offsets 0..4
    first = found(1, 5, batch(5, 2, pid=42, epoch=0, seq=5), batch(7, 1, pid=43, epoch=2, seq=0))
    second = found(2, 8, batch(8, 1, pid=42, epoch=0, seq=7))
    result = plan(first, second, hw=5, producers=committed.snapshot())
    [partition] = result.partitions
    producers = ProducerStates.restore(partition.producers)

    # a retry of a batch whose acknowledgement died with the shard: its original offsets
    retry = producers.check(42, 0, 5, 1)
    assert retry.verdict is Verdict.DUPLICATE and retry.duplicate_of is not None
    assert (retry.duplicate_of.first_offset, retry.duplicate_of.last_offset) == (5, 6)
    assert producers.check(42, 0, 7, 0).verdict is Verdict.DUPLICATE
    assert producers.check(43, 2, 0, 0).verdict is Verdict.DUPLICATE
    assert producers.check(42, 0, 8, 0).verdict is Verdict.APPEND
    gap = producers.check(42, 0, 9, 0)
    assert (gap.verdict, gap.error) == (Verdict.REFUSE, ErrorCode.out_of_order_sequence_number)

    # each buffer carries the state as of its own end: what its commit writes
    as_of_first = ProducerStates.restore(partition.buffers[0].producers)
    assert as_of_first.check(42, 0, 7, 0).verdict is Verdict.APPEND
    assert as_of_first.check(42, 0, 5, 1).verdict is Verdict.DUPLICATE


def test_slots_continue_past_the_highest_found_even_unreadable_or_discarded() -> None:
    assert plan_adoption([], {}).last_slot == -1
    result = plan(found(3, 0, batch(0, 1), sealed_ms=T0), found(11, 1, batch(1, 1)), hw=1)
    assert result.last_slot == 11  # buf-3 is discarded, its slot still counts
    committed = {owner_key(OWNER): Committed(True)}
    assert plan_adoption([found(2, 0, batch(0, 1))], committed, [17]).last_slot == 17


def test_walk_reports_the_verified_prefix() -> None:
    blobs = [batch(0, 2), batch(2, 1)]
    data = b"".join(blobs)
    whole = walk(data, len(data), 0)
    assert (whole.size, whole.starts, whole.problem) == (len(data), (0, len(blobs[0])), None)
    assert [h.last_offset for h in whole.headers] == [1, 2]
    assert walk(data, len(data), 1).size == 0  # the header's base offset must match
    assert walk(data, len(blobs[0]), 0).size == len(blobs[0])  # never past ``end``
