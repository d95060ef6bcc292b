"""Moving a partition's log start: DeleteRecords (frontend -> its coordinator).

The frontend asks the coordinator of its own broker, which commits partitions it owns
(docs/design/ecosystem.md, section 2). The reply answers each asked partition, in order.
"""

from __future__ import annotations

import msgspec

from kafscale.ipc.base import Message

HIGH_WATERMARK = -1  # DeleteRecords' offset meaning "up to the high watermark"


class LogStartMove(msgspec.Struct, frozen=True):
    topic: str
    topic_id: str
    partition: int
    offset: int  # the new log start, or HIGH_WATERMARK


class MoveLogStart(Message, frozen=True):
    partitions: list[LogStartMove]


class LogStartMoveResult(msgspec.Struct, frozen=True):
    error_code: int  # a Kafka error code; 0 when the log now starts at ``log_start_offset``
    log_start_offset: int = -1  # DeleteRecords' ``low_watermark``
    error_message: str | None = None


class LogStartMoves(Message, frozen=True):
    """The reply to ``MoveLogStart``: one result per asked partition, in order."""

    results: list[LogStartMoveResult]
