"""The write path's IPC messages: shard -> flusher -> coordinator (docs/design/write-path.md).

The shards hand their sealed buffers to the flusher (``ShardPending``, ``Cut``/``CutEntries``),
the flusher commits each write-ahead object with the coordinator (``CommitObject``) and tells the
shards the outcome (``ObjectCommitted``); compaction replaces chunks by spec segments or merged
chunks (``CommitCompaction``, ``CommitMerge``, ``SegmentsCompacted``). ``CommitSegment`` commits
one spec segment (``kafscale.shards.recovery`` adopting a previous version's upload); its reply
``SegmentCommitted`` also answers compaction commits.

The wire layout, ``encode`` and ``decode`` are in ``kafscale.ipc.messages``, whose ``AnyMessage``
union lists every message here (one missing from it cannot be decoded).
"""

from __future__ import annotations

import msgspec

from kafscale.ipc.base import Message
from kafscale.metadata.records import SegmentRecord, WalRecord

# -- spec segments (shard -> coordinator; the reply also answers compaction commits) ---------


class CommitSegment(Message, frozen=True):
    """Make a segment uploaded to the object store part of the partition's committed log: the
    high watermark moves to ``segment.last_offset + 1`` if it is still ``segment.base_offset``
    and the topic is still the one with ``topic_id``."""

    topic: str
    topic_id: str
    partition: int
    segment: SegmentRecord
    producers: dict[int, tuple[int, int, list[tuple[int, int, int, int]]]]


class SegmentCommitted(Message, frozen=True):
    """``committed`` false means nothing changed; ``high_watermark`` is the partition's
    committed high watermark after the call, ``error`` says why it was refused."""

    committed: bool
    high_watermark: int
    error: str | None = None


# -- write path v2 (docs/design/write-path.md) -------------------------------------------------
#
#   shard -> flusher   ShardPending (notice)         what the shard holds that no cycle has taken
#   flusher -> shard   Cut -> CutEntries              seal everything; hand over the sealed buffers
#   flusher -> shard   ObjectCommitted (notice)       the outcome of each entry of a cycle
#   flusher -> coord.  CommitObject -> ObjectCommitResult
#   flusher -> coord.  CommitCompaction -> SegmentCommitted
#   flusher -> coord.  CommitMerge -> MergeCommitted  runs of many partitions moved to one object
#   flusher -> shard   SegmentsCompacted (notice)     chunks replaced by a segment or merged chunk
#   coord. -> shard    SealPartition (notice)         hand a partition over: commit, then unload
#   shard -> coord.    PartitionSealed (notice)       done: nothing of it is left uncommitted

Producers = dict[int, tuple[int, int, list[tuple[int, int, int, int]]]]  # ProducerStates.snapshot


class ShardPending(Message, frozen=True):
    """What a shard holds that no cycle has taken yet (sent when it changes in a way that can
    move the flusher's decision to cut). ``oldest_ms``: the first append time of the oldest such
    byte; ``urgent_ms``: since when an acks=all request or a flush waits on such bytes; -1: none."""

    shard: int
    bytes: int
    oldest_ms: int = -1
    urgent_ms: int = -1


class Cut(Message, frozen=True):
    """Seal every open buffer; answer ``CutEntries`` with every sealed buffer no cycle holds."""

    cycle: int


class WalEntry(msgspec.Struct, frozen=True):
    """One sealed buffer for a cycle: bytes ``[0, size)`` of shared-memory ``buffer``
    (generation ``generation``) hold offsets ``[base_offset, last_offset]`` of a partition."""

    buffer: str
    generation: int
    size: int
    topic: str
    topic_id: str
    partition: int
    base_offset: int
    last_offset: int
    records: int
    max_timestamp: int
    created_ms: int  # the buffer's seal time (deterministic: an adopted buffer keeps it)
    codec: int  # applied by the flusher to batches that arrived uncompressed
    producers: Producers
    topic_created_ms: int = 0
    segment_bytes: int = 0  # the topic's segment.bytes (the compaction target); 0: the broker's
    leader_epoch: int = 0  # the partition's leader epoch the batches were appended at


class CutEntries(Message, frozen=True):
    cycle: int
    shard: int
    entries: list[WalEntry]


class EntryResult(msgspec.Struct, frozen=True):
    """The outcome of one ``WalEntry``: ``committed`` with the partition's high watermark and
    the chunk's record, or not (the shard offers the buffer again), with ``error``."""

    topic: str
    partition: int
    base_offset: int
    committed: bool
    high_watermark: int = -1
    error: str | None = None
    storage_error: bool = False  # S3 or the metadata store failed: a health signal
    topic_gone: bool = False  # the topic was deleted: the shard drops the partition's data
    # The committed entry, for the shard's segment list; None when committed by an earlier
    # attempt (the shard reads the partition's entries back).
    segment: SegmentRecord | None = None


class ObjectCommitted(Message, frozen=True):
    cycle: int
    results: list[EntryResult]
    upload_ms: int = 0


class ObjectChunk(msgspec.Struct, frozen=True):
    """One entry of a write-ahead object to commit: ``chunk.base_offset`` must be the
    partition's high watermark (or follow the object's previous chunk of that partition)."""

    topic: str
    topic_id: str
    partition: int
    chunk: SegmentRecord
    producers: Producers  # the idempotence state as of ``chunk.last_offset``
    # The leader epoch the batches were appended at: committed only while this broker owns the
    # partition at that epoch. ``ANY_EPOCH``: whatever epoch it owns it at (boot recovery of an
    # object this broker uploaded before it crashed, adopted at the high watermark only).
    leader_epoch: int = 0


ANY_EPOCH = -1


class CommitObject(Message, frozen=True):
    wal: WalRecord
    chunks: list[ObjectChunk]


class ChunkCommitted(msgspec.Struct, frozen=True):
    topic: str
    partition: int
    base_offset: int
    committed: bool
    high_watermark: int  # the partition's committed high watermark after the call; -1 unknown
    error: str | None = None
    topic_gone: bool = False
    # Committed by an earlier attempt (a retry after a lost answer, a re-offered buffer): the
    # log lists the chunk of that attempt's object, not of this one; nothing was written.
    earlier: bool = False


class ObjectCommitResult(Message, frozen=True):
    results: list[ChunkCommitted]  # one per ``CommitObject.chunks``, same order


class CommitCompaction(Message, frozen=True):
    """Replace the partition's entries from ``first_base`` through ``last_offset`` (chunks) by
    ``segment``: a spec segment uploaded at its spec keys, or a chunk of a merged write-ahead
    object whose ``WalRecord`` exists; refused if the entry at ``first_base`` changed."""

    topic: str
    topic_id: str
    partition: int
    first_base: int
    last_offset: int
    segment: SegmentRecord


class CommitMerge(Message, frozen=True):
    """The merge level of compaction: put ``wal`` (a merged write-ahead object, uploaded), then
    per run replace the partition's chunks ``first_base..last_offset`` by ``run.segment``, the
    chunk of ``wal.key`` holding the same batches. Each run is committed or refused alone."""

    wal: WalRecord
    runs: list[CommitCompaction]


class MergeCommitted(Message, frozen=True):
    results: list[SegmentCommitted]  # one per ``CommitMerge.runs``, same order


class SegmentsCompacted(Message, frozen=True):
    """The partition's entries covered by ``segment`` are now that entry (a spec segment, or a
    chunk of a merged write-ahead object)."""

    topic: str
    topic_id: str
    partition: int
    segment: SegmentRecord


# -- hand-over (docs/design/scale-out.md, section 5) --------------------------------------------


class SealPartition(Message, frozen=True):
    """Stop accepting appends to the partition (``NOT_LEADER_OR_FOLLOWER``), commit what the
    shard holds of it and unload it; answer ``PartitionSealed``. Sent again until answered: a
    partition the shard holds nothing of is sealed at once."""

    topic: str
    partition: int
    leader_epoch: int


class PartitionSealed(Message, frozen=True):
    topic: str
    partition: int
    leader_epoch: int
