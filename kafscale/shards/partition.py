"""One partition's write state inside its owning shard: offsets, producers, buffers, commits.

Appends go to the open buffer (shared memory) after the idempotence check, with the batch's base
offset patched to the next offset (outside the CRC: no re-encoding). A buffer is sealed when it
reaches ``segment_bytes`` or when the flusher cuts a cycle (``seal``). Sealed buffers wait for a
cycle to commit them; several may be in flight at once (in one cycle or several), and they commit
in offset order because every commit is conditional on the high watermark. Only a commit moves
the high watermark (``committed``). Which cycle holds which buffer is ``kafscale.shards.flushes``'
business, not this module's.

Invariants: ``high_watermark <= next_offset``; ``sealed`` holds consecutive offset ranges starting
at ``high_watermark``; the open buffer starts where the last sealed one ends; an offset is given
out once (``next_offset`` moves in the same step as the buffer's ``committed``). Clock and buffer
allocation are passed in, so this is testable without a process.

A buffer records, when sealed, the time (the chunk's created time) and the codec the flusher
applies, in shared memory too: a successor shard that adopts the buffers of a crashed one
(``adopt``, decided by ``kafscale.shards.adoption``) offers them again as the very same entries.
"""

from __future__ import annotations

import bisect
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kafscale.ipc.shm import PartitionBuffer
from kafscale.ipc.write_path import WalEntry
from kafscale.protocol import records
from kafscale.protocol.errors import ErrorCode
from kafscale.protocol.records import BatchHeader
from kafscale.shards.adoption import AdoptedPartition
from kafscale.shards.cache import Chunk
from kafscale.shards.producers import ProducerStates, Verdict
from kafscale.shards.segments import CommittedSegments

log = logging.getLogger(__name__)


class StaleTopic(Exception):
    """A request names a deleted topic that a newer topic of the same name has replaced."""


@dataclass
class BufferedSegment:
    """A buffer's worth of batches: open for appends, then sealed and committed."""

    buffer: PartitionBuffer
    base_offset: int
    next_offset: int
    first_append_ms: int
    size: int = 0
    records: int = 0
    max_timestamp: int = -1
    sealed_ms: int = 0
    codec: int = 0  # the codec the flusher applies, as of the seal
    producers: dict[int, Any] = field(default_factory=dict)  # snapshot at seal
    starts: list[int] = field(default_factory=list)  # where each batch starts in the buffer
    lasts: list[int] = field(default_factory=list)  # each batch's last offset

    @property
    def last_offset(self) -> int:
        return self.next_offset - 1

    def chunk(self, offset: int, max_bytes: int) -> Chunk:
        """A copy of the batches from the one holding ``offset``: at least one, more while they
        fit in ``max_bytes``. The copy outlives the buffer (which is reused once flushed)."""
        i = bisect.bisect_left(self.lasts, offset)
        j = i + 1
        while j < len(self.starts) and self._end(j) - self.starts[i] <= max_bytes:
            j += 1
        return self._copy(i, j)

    def whole(self) -> Chunk:
        """A copy of every batch in the buffer."""
        return self._copy(0, len(self.starts))

    def _copy(self, i: int, j: int) -> Chunk:
        start = self.starts[i]
        data = self.buffer.read(start, self._end(j - 1))
        assert data is not None, "the owner's own buffer cannot change under it"
        first = self.base_offset if i == 0 else self.lasts[i - 1] + 1
        starts = tuple(position - start for position in self.starts[i:j])
        return Chunk(
            data, first, starts, tuple(self.lasts[i:j]), complete=(i, j) == (0, len(self.starts))
        )

    def _end(self, i: int) -> int:
        return self.starts[i + 1] if i + 1 < len(self.starts) else self.size


@dataclass(frozen=True, slots=True)
class AppendOutcome:
    error: ErrorCode = ErrorCode.none
    base_offset: int = -1
    last_offset: int = -1
    log_append_time: int = -1
    message: str | None = None
    duplicate: bool = False  # a resend of a batch appended before: nothing was appended now


class PartitionLog:
    def __init__(
        self,
        topic: str,
        topic_id: str,
        partition: int,
        high_watermark: int,
        producers: ProducerStates,
        segment_bytes: int,
        new_buffer: Callable[[int, int, int], PartitionBuffer],
        segments: CommittedSegments | None = None,
        log_start_offset: int = 0,
        topic_created_ms: int = 0,
        leader_epoch: int = 0,
        epochs: list[tuple[int, int]] | None = None,
    ) -> None:
        self.topic, self.topic_id, self.partition = topic, topic_id, partition
        # The epoch this shard appends at (stamped into every batch) and the partition's
        # leader epoch history (``kafscale.metadata.epochs``) as of the load.
        self.leader_epoch = leader_epoch
        self.epochs = epochs if epochs is not None else [(leader_epoch, log_start_offset)]
        self.high_watermark = high_watermark
        self.next_offset = high_watermark
        self.producers = producers
        self.segment_bytes = segment_bytes
        self.topic_created_ms = topic_created_ms  # tells a re-created topic's requests apart
        self._new_buffer = new_buffer  # (capacity, base_offset, codec) -> buffer
        self.codec = 0  # the topic's compression codec for the flusher, as of the last append
        self.open: BufferedSegment | None = None
        self.sealed: deque[BufferedSegment] = deque()
        self.segments = segments if segments is not None else CommittedSegments()
        self.log_start_offset = log_start_offset

    @property
    def unflushed_bytes(self) -> int:
        return sum(s.size for s in self.sealed) + (self.open.size if self.open else 0)

    def append(
        self, batch: memoryview, header: BatchHeader, now_ms: int, log_append_time: bool
    ) -> AppendOutcome:
        """Append one validated batch; the offsets it got, or why it was refused."""
        check = self.producers.check(
            header.producer_id,
            header.producer_epoch,
            header.base_sequence,
            header.last_offset_delta,
        )
        if check.verdict is Verdict.DUPLICATE:
            assert check.duplicate_of is not None
            return AppendOutcome(
                base_offset=check.duplicate_of.first_offset,
                last_offset=check.duplicate_of.last_offset,
                duplicate=True,
            )
        if check.verdict is Verdict.REFUSE:
            return AppendOutcome(error=check.error, message=check.message)
        data = bytearray(batch)
        base_offset = self.next_offset
        records.patch_base_offset(data, 0, base_offset)
        records.patch_leader_epoch(data, 0, self.leader_epoch)
        timestamp = -1
        max_timestamp = header.max_timestamp
        if log_append_time:
            records.set_log_append_time(data, 0, now_ms)
            timestamp = max_timestamp = now_ms
        segment = self._segment_for(len(data), now_ms)
        segment.buffer.append(data, records=header.records_count)
        # Published: from here on nothing may fail before next_offset has moved past the batch.
        self.next_offset = base_offset + header.last_offset_delta + 1
        segment.starts.append(segment.size)
        self.producers.record(
            header.producer_id,
            header.producer_epoch,
            header.base_sequence,
            header.last_offset_delta,
            base_offset,
            max_timestamp,
        )
        segment.next_offset = self.next_offset
        segment.lasts.append(self.next_offset - 1)
        segment.size += len(data)
        segment.records += header.records_count
        segment.max_timestamp = max(segment.max_timestamp, max_timestamp)
        if segment.size >= self.segment_bytes:
            self.seal(now_ms)
        return AppendOutcome(
            base_offset=base_offset, last_offset=self.next_offset - 1, log_append_time=timestamp
        )

    def _segment_for(self, size: int, now_ms: int) -> BufferedSegment:
        """The open segment if ``size`` more bytes fit, else a fresh one."""
        if self.open is not None:
            if self.open.size + size <= self.open.buffer.capacity:
                return self.open
            self.seal(now_ms)
        capacity = max(self.segment_bytes, size)
        buffer = self._new_buffer(capacity, self.next_offset, self.codec)
        self.open = BufferedSegment(
            buffer=buffer,
            base_offset=self.next_offset,
            next_offset=self.next_offset,
            first_append_ms=now_ms,
        )
        return self.open

    def seal(self, now_ms: int) -> None:
        """Close the open buffer to appends; it waits in ``sealed`` for a cycle to commit it."""
        if self.open is None:
            return
        segment, self.open = self.open, None
        if segment.size == 0:
            segment.buffer.destroy()
            return
        segment.buffer.seal(sealed_ms=now_ms, codec=self.codec)
        segment.sealed_ms, segment.codec = now_ms, self.codec
        segment.producers = self.producers.snapshot()
        self.sealed.append(segment)

    def adopt(self, adopted: AdoptedPartition, buffers: list[PartitionBuffer], now_ms: int) -> None:
        """Take over a crashed predecessor's buffers (verified, contiguous from the high
        watermark): all are sealed and offered at the next cut, offsets continue after them."""
        if self.open is not None or self.sealed or self.next_offset != adopted.high_watermark:
            raise ValueError(f"{self.topic}-{self.partition}: adopt into a fresh log only")
        for info, buffer in zip(adopted.buffers, buffers, strict=True):
            if info.sealed_ms is None:  # never sealed (or the seal was interrupted)
                buffer.seal(sealed_ms=now_ms, codec=info.codec)
            self.sealed.append(
                BufferedSegment(
                    buffer=buffer,
                    base_offset=info.base_offset,
                    next_offset=info.next_offset,
                    first_append_ms=now_ms,
                    size=info.size,
                    records=info.records,
                    max_timestamp=info.max_timestamp,
                    sealed_ms=now_ms if info.sealed_ms is None else info.sealed_ms,
                    codec=info.codec,
                    producers=info.producers,
                    starts=list(info.starts),
                    lasts=list(info.lasts),
                )
            )
        self.next_offset = adopted.next_offset
        self.producers = ProducerStates.restore(adopted.producers)
        if adopted.buffers:
            self.codec = adopted.buffers[-1].codec

    def sealed_at(self, base_offset: int) -> BufferedSegment | None:
        """The sealed buffer starting at ``base_offset``, if one does."""
        for segment in self.sealed:
            if segment.base_offset == base_offset:
                return segment
        return None

    def committed(self, high_watermark: int) -> list[BufferedSegment]:
        """A commit moved the high watermark to ``high_watermark``: every sealed buffer below it
        is committed and goes (destroyed). Returns them (their offsets and sizes), oldest first."""
        self.high_watermark = max(self.high_watermark, high_watermark)
        freed = []
        while self.sealed and self.sealed[0].last_offset < self.high_watermark:
            segment = self.sealed.popleft()
            segment.buffer.destroy()
            freed.append(segment)
        return freed

    def buffered(self, offset: int) -> BufferedSegment | None:
        """The sealed or open buffer holding ``offset``, if one does."""
        for segment in [*self.sealed, *([self.open] if self.open else [])]:
            if segment.base_offset <= offset < segment.next_offset:
                return segment
        return None

    def wal_entry(self, segment: BufferedSegment) -> WalEntry:
        """What the flusher gets for a sealed buffer: everything in it comes from the buffer as
        sealed, so a successor that adopted the buffer offers the very same entry."""
        return WalEntry(
            buffer=segment.buffer.name,
            generation=segment.buffer.generation,
            size=segment.size,
            topic=self.topic,
            topic_id=self.topic_id,
            partition=self.partition,
            base_offset=segment.base_offset,
            last_offset=segment.last_offset,
            records=segment.records,
            max_timestamp=segment.max_timestamp,
            created_ms=segment.sealed_ms,
            codec=segment.codec,
            producers=segment.producers,
            topic_created_ms=self.topic_created_ms,
            segment_bytes=self.segment_bytes,
            leader_epoch=self.leader_epoch,
        )

    def close(self) -> int:
        """Drop every buffer (unflushed data is lost); returns the bytes freed."""
        freed = self.unflushed_bytes
        for segment in [*self.sealed, *([self.open] if self.open else [])]:
            segment.buffer.destroy()
        self.sealed.clear()
        self.open = None
        return freed
