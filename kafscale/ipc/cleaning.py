"""The log cleaner's messages (docs/design/ecosystem.md, section 4.3).

  cleaner (flusher) -> coordinator   CommitCleaning -> SegmentCommitted
  cleaner (flusher) -> shard         SegmentsCleaned (notice)

A cleaning replaces a run of a compacted partition's segments by the segments it wrote at their
next generation's keys, covering exactly the same offsets.
"""

from __future__ import annotations

from kafscale.ipc.base import Message
from kafscale.metadata.records import SegmentRecord


class CommitCleaning(Message, frozen=True):
    """Replace the partition's segments ``replaced`` -- (base offset, mod revision as the cleaner
    read it), every entry from the first's base to the last's end -- by ``segments``, which cover
    the same offsets. Refused (``SegmentCommitted.committed`` false) if any of them changed, the
    topic was re-created or this broker no longer owns the partition."""

    topic: str
    topic_id: str
    partition: int
    replaced: list[tuple[int, int]]
    segments: list[SegmentRecord]


class SegmentsCleaned(Message, frozen=True):
    """The partition's entries covered by ``segments`` are now those segments (whose batches
    are not the same: records were removed)."""

    topic: str
    topic_id: str
    partition: int
    segments: list[SegmentRecord]
