"""Moving partitions' log starts forward: DeleteRecords (docs/design/ecosystem.md, section 2).

``plan`` decides one move from the partition's records, as Kafka's
``Partition.deleteRecordsOnLeader`` does: the topic must be the one asked for
(UNKNOWN_TOPIC_OR_PARTITION), this broker must own the partition (NOT_LEADER_OR_FOLLOWER), the
topic's ``cleanup.policy`` must include ``delete`` (POLICY_VIOLATION), and the offset (-1: the
high watermark) must lie in [0, high watermark] (OFFSET_OUT_OF_RANGE). An offset at or below the
current log start changes nothing: the answer is the current start. ``LogStarts`` runs the plans:
one compare-and-set transaction per partition over its topic record, partition record and leader
key, planned again from fresh reads when another writer got in first (a commit: the committer's
own next compare then fails and it reads the record again); then the owning shard is told
(``ShardNotices``). The entries that end below the new start are deleted by the retention
cleaner's next round.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass

import msgspec
import zmq

from kafscale.ipc import endpoints, messages
from kafscale.ipc.log_admin import (
    HIGH_WATERMARK,
    LogStartMove,
    LogStartMoveResult,
    LogStartMoves,
    MoveLogStart,
)
from kafscale.ipc.routing import shard_for
from kafscale.ipc.rpc import Incoming
from kafscale.metadata import records
from kafscale.metadata.records import Keys, LeaderRecord, PartitionRecord, TopicRecord
from kafscale.metadata.store import Compare, MetadataStore, Put
from kafscale.protocol.errors import ErrorCode

from . import leadership
from .leadership import Leaders

log = logging.getLogger(__name__)

ATTEMPTS = 3  # transactions per partition before the move is answered retriable


@dataclass(frozen=True, slots=True)
class Planned:
    """A move that changes the record: put ``record``."""

    record: PartitionRecord


def plan(
    move: LogStartMove,
    topic: TopicRecord | None,
    current: PartitionRecord | None,
    leader: LeaderRecord | None,
    topic_defaults: Mapping[str, str],
) -> LogStartMoveResult | Planned:
    """The answer to ``move`` without a write, or the partition record to write."""
    if (
        topic is None
        or topic.topic_id != move.topic_id
        or not 0 <= move.partition < topic.partitions
    ):
        return _refused(
            ErrorCode.unknown_topic_or_partition, "This server does not host this topic-partition."
        )
    if current is None or current.topic_id != move.topic_id:
        current = PartitionRecord(topic_id=move.topic_id)
    if leader is None or (current.owner, current.leader_epoch) != (leader.owner, leader.epoch):
        return _refused(
            ErrorCode.not_leader_or_follower,
            f"This broker does not lead {move.topic}-{move.partition}.",
        )
    policy = topic.configs.get("cleanup.policy", topic_defaults["cleanup.policy"])
    if "delete" not in policy.split(","):
        return _refused(
            ErrorCode.policy_violation,
            f"Records of partition {move.topic}-{move.partition} can not be deleted due to the "
            f"configured policy (cleanup.policy={policy})",
        )
    offset = current.high_watermark if move.offset == HIGH_WATERMARK else move.offset
    if offset < 0:
        return _refused(
            ErrorCode.offset_out_of_range,
            f"The offset {move.offset} for partition {move.topic}-{move.partition} should not "
            "be negative.",
        )
    if offset > current.high_watermark:
        return _refused(
            ErrorCode.offset_out_of_range,
            f"Cannot increment the log start offset to {offset} of partition "
            f"{move.topic}-{move.partition} since it is larger than the high watermark "
            f"{current.high_watermark}",
        )
    if offset <= current.log_start_offset:
        return LogStartMoveResult(error_code=0, log_start_offset=current.log_start_offset)
    return Planned(msgspec.structs.replace(current, log_start_offset=offset))


def _refused(code: ErrorCode, message: str) -> LogStartMoveResult:
    return LogStartMoveResult(error_code=int(code), error_message=message)


class ShardNotices:
    """Tells this broker's shards that a partition's log start moved (retention, DeleteRecords).
    A notice to a shard that is restarting is dropped: it reads the start when it loads."""

    def __init__(
        self, context: zmq.Context[zmq.Socket[bytes]], runtime_dir: str, shards: int
    ) -> None:
        self._sockets = []
        for index in range(shards):
            socket = context.socket(zmq.DEALER)
            socket.setsockopt(zmq.LINGER, 0)
            socket.setsockopt(zmq.IMMEDIATE, 1)
            socket.connect(endpoints.address(runtime_dir, "shard", index))
            self._sockets.append(socket)

    def log_start_moved(self, topic: str, topic_id: str, partition: int, log_start: int) -> None:
        socket = self._sockets[shard_for(topic_id, partition, len(self._sockets))]
        notice = messages.LogStartMoved(topic, topic_id, partition, log_start)
        with contextlib.suppress(zmq.Again):
            socket.send_multipart([b"\0" * 8, messages.encode(notice)], flags=zmq.NOBLOCK)

    def close(self) -> None:
        for socket in self._sockets:
            socket.close(linger=0)


class LogStarts:
    def __init__(
        self,
        store: MetadataStore,
        namespace: str,
        leaders: Leaders,
        topic_defaults: Mapping[str, str],
        notices: ShardNotices,
    ) -> None:
        self.store = store
        self.keys = Keys(namespace)
        self.leaders = leaders
        self.topic_defaults = topic_defaults
        self.notices = notices

    def handle(self, incoming: Incoming) -> LogStartMoves:
        assert isinstance(incoming.message, MoveLogStart)
        return LogStartMoves([self.move(move) for move in incoming.message.partitions])

    def move(self, move: LogStartMove) -> LogStartMoveResult:
        topic_key = self.keys.topic(move.topic)
        partition_key = self.keys.partition(move.topic, move.partition)
        for _ in range(ATTEMPTS):
            topic_kv = self.store.get(topic_key)
            partition_kv = self.store.get(partition_key)
            leader = self.leaders.leader(move.topic, move.partition)
            decided = plan(
                move,
                records.decode_topic(topic_kv.value) if topic_kv else None,
                records.decode_partition(partition_kv.value) if partition_kv else None,
                leader,
                self.topic_defaults,
            )
            if isinstance(decided, LogStartMoveResult):
                return decided
            assert topic_kv is not None and leader is not None
            txn = self.store.transaction(
                [
                    Compare(topic_key, mod_revision=topic_kv.mod_revision),
                    Compare(
                        partition_key,
                        mod_revision=partition_kv.mod_revision if partition_kv else 0,
                    ),
                    leadership.fence(self.keys, move.topic, move.partition, leader),
                ],
                [Put(partition_key, records.encode(decided.record))],
            )
            if txn.succeeded:
                start = decided.record.log_start_offset
                self.notices.log_start_moved(move.topic, move.topic_id, move.partition, start)
                log.info(
                    "log start moved",
                    extra={
                        "topic": move.topic,
                        "partition": move.partition,
                        "log_start_offset": start,
                    },
                )
                return LogStartMoveResult(error_code=0, log_start_offset=start)
        return _refused(
            ErrorCode.request_timed_out,
            f"{move.topic}-{move.partition} changed during each of {ATTEMPTS} attempts",
        )
