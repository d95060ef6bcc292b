"""DeleteRecords' decisions (``kafscale.coordinator.log_start.plan``), as Kafka's
``Partition.deleteRecordsOnLeader`` makes them."""

from __future__ import annotations

import pytest

from kafscale.coordinator.log_start import Planned, plan
from kafscale.ipc.log_admin import HIGH_WATERMARK, LogStartMove, LogStartMoveResult
from kafscale.metadata.records import LeaderRecord, PartitionRecord, TopicRecord
from kafscale.protocol.errors import ErrorCode

TOPIC_ID = "5b4a1c64-0d6e-4a7e-9c89-3f1e3c8f4a10"
TOPIC = TopicRecord(name="t", topic_id=TOPIC_ID, partitions=2)
LEADER = LeaderRecord(owner=1, epoch=3, lease=7, run_id="r")
CURRENT = PartitionRecord(
    topic_id=TOPIC_ID, high_watermark=100, log_start_offset=10, owner=1, leader_epoch=3
)
DEFAULTS = {"cleanup.policy": "delete"}


def decide(
    offset: int,
    topic: TopicRecord | None = TOPIC,
    current: PartitionRecord | None = CURRENT,
    leader: LeaderRecord | None = LEADER,
    partition: int = 0,
) -> LogStartMoveResult | Planned:
    return plan(LogStartMove("t", TOPIC_ID, partition, offset), topic, current, leader, DEFAULTS)


def code(decided: LogStartMoveResult | Planned) -> ErrorCode:
    assert isinstance(decided, LogStartMoveResult), decided
    return ErrorCode(decided.error_code)


def test_an_offset_up_to_the_high_watermark_moves_the_start() -> None:
    moved = decide(50)
    assert isinstance(moved, Planned)
    assert moved.record.log_start_offset == 50
    assert moved.record.high_watermark == 100  # nothing else changes
    everything = decide(HIGH_WATERMARK)
    assert isinstance(everything, Planned) and everything.record.log_start_offset == 100


def test_an_offset_at_or_below_the_start_changes_nothing_and_answers_the_start() -> None:
    for offset in (0, 5, 10):
        assert decide(offset) == LogStartMoveResult(error_code=0, log_start_offset=10)


@pytest.mark.parametrize("offset", [101, -2, -100])
def test_offsets_past_the_high_watermark_or_negative_are_out_of_range(offset: int) -> None:
    assert code(decide(offset)) is ErrorCode.offset_out_of_range


def test_a_gone_or_recreated_topic_or_a_missing_partition_is_unknown() -> None:
    assert code(decide(5, topic=None)) is ErrorCode.unknown_topic_or_partition
    recreated = TopicRecord(name="t", topic_id="00000000-0000-0000-0000-000000000001", partitions=2)
    assert code(decide(5, topic=recreated)) is ErrorCode.unknown_topic_or_partition
    assert code(decide(5, partition=2)) is ErrorCode.unknown_topic_or_partition


def test_only_the_owner_at_its_epoch_moves_the_start() -> None:
    assert code(decide(50, leader=None)) is ErrorCode.not_leader_or_follower
    other = LeaderRecord(owner=1, epoch=4, lease=7, run_id="r")  # a newer claim
    assert code(decide(50, leader=other)) is ErrorCode.not_leader_or_follower


def test_a_topic_without_the_delete_policy_refuses_deletion() -> None:
    for policy in ("compact", ""):
        topic = TopicRecord(
            name="t", topic_id=TOPIC_ID, partitions=2, configs={"cleanup.policy": policy}
        )
        assert code(decide(50, topic=topic)) is ErrorCode.policy_violation
    both = TopicRecord(
        name="t", topic_id=TOPIC_ID, partitions=2, configs={"cleanup.policy": "compact,delete"}
    )
    assert isinstance(decide(50, topic=both), Planned)
