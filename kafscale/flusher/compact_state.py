"""The compactor's bookkeeping: every partition's uncompacted chunk records and the accumulator
of their bytes, shared by the flusher's commit thread and the compactor's workers.

No I/O: a lock held for bookkeeping only. Invariants:

- A partition's chunks are kept in base offset order, each base offset once.
- The accumulator holds, per partition, the bytes of a run of chunks from its oldest one (what
  the planner can seal); bytes that would break the run, or not fit under ``bound``, are not
  kept (the chunk is read back later with its write-ahead object).
- ``held`` is the total of the held bytes; it never passes ``bound`` except by one load into an
  empty accumulator (the planner's rule).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from kafscale import metrics
from kafscale.flusher import compact_plan
from kafscale.flusher.compact_plan import Load, PartitionKey, Seal
from kafscale.metadata.records import SegmentRecord

BACKOFF_S = (1.0, 60.0)  # first and longest wait after a failed job


@dataclass
class _Partition:
    topic_id: str
    segment_bytes: int
    chunks: list[SegmentRecord] = field(default_factory=list)
    data: dict[int, bytes] = field(default_factory=dict)  # base offset -> held chunk bytes
    failures: int = 0
    retry_at: float = 0.0


class Accumulator:
    def __init__(self, bound: int, default_segment_bytes: int) -> None:
        self.bound = bound
        self.default_segment_bytes = default_segment_bytes
        self._lock = threading.Lock()
        self._partitions: dict[PartitionKey, _Partition] = {}
        self._paused_objects: dict[str, tuple[int, float]] = {}  # failures, retry at
        self._held = 0

    @property
    def held(self) -> int:
        return self._held

    def committed(
        self,
        key: PartitionKey,
        topic_id: str,
        segment_bytes: int,
        record: SegmentRecord,
        data: bytes | memoryview,
    ) -> None:
        """A chunk committed by the flusher; its bytes are copied if they extend the held run
        and fit. ``segment_bytes`` 0: keep the partition's (the broker's default at first)."""
        with self._lock:
            part = self._partition(key, topic_id)
            part.segment_bytes = segment_bytes or part.segment_bytes
            if any(chunk.base_offset == record.base_offset for chunk in part.chunks):
                return
            part.chunks.append(record)
            part.chunks.sort(key=lambda chunk: chunk.base_offset)
            follows_held = len(part.data) == part.chunks.index(record)
            if follows_held and self._held + record.size <= self.bound:
                part.data[record.base_offset] = bytes(data)
                self._changed(record.size)

    def merge(
        self, key: PartitionKey, topic_id: str, segment_bytes: int, chunks: Iterable[SegmentRecord]
    ) -> None:
        """Add chunk records read from the store (those known already are kept as they are)."""
        with self._lock:
            part = self._partition(key, topic_id)
            part.segment_bytes = segment_bytes
            known = {chunk.base_offset for chunk in part.chunks}
            part.chunks.extend(chunk for chunk in chunks if chunk.base_offset not in known)
            part.chunks.sort(key=lambda chunk: chunk.base_offset)
            self._keep_held_run(part)

    def replace(
        self, key: PartitionKey, topic_id: str | None, stored: Sequence[SegmentRecord]
    ) -> None:
        """The partition's entries as the store has them now (``stored``: every entry, in
        offset order; ``topic_id`` the topic's now, None if it is gone). Chunks added after
        the store was read are kept."""
        with self._lock:
            part = self._partitions.get(key)
            if part is None:
                return
            if topic_id != part.topic_id:
                self._drop(key)
                return
            newest = stored[-1].last_offset if stored else -1
            later = [chunk for chunk in part.chunks if chunk.base_offset > newest]
            part.chunks = [entry for entry in stored if entry.is_chunk] + later
            self._keep_held_run(part)

    def states(self, now: float) -> tuple[list[compact_plan.PartitionState], list[str]]:
        """What the planner needs: each partition's state, and the objects backing off."""
        with self._lock:
            states = [
                compact_plan.PartitionState(
                    key,
                    part.topic_id,
                    part.segment_bytes,
                    tuple(
                        compact_plan.Chunk(chunk, chunk.base_offset in part.data)
                        for chunk in part.chunks
                    ),
                    paused=part.retry_at > now,
                )
                for key, part in self._partitions.items()
                if part.chunks
            ]
            paused = [key for key, (_, at) in self._paused_objects.items() if at > now]
        return states, paused

    def seal_input(self, job: Seal) -> tuple[str, list[bytes]] | None:
        """The topic id and the chunks' bytes of ``job``, or None if its chunks changed."""
        with self._lock:
            part = self._partitions.get(job.key)
            if (
                part is None
                or part.chunks[: len(job.chunks)] != list(job.chunks)
                or any(chunk.base_offset not in part.data for chunk in job.chunks)
            ):
                return None
            return part.topic_id, [part.data[chunk.base_offset] for chunk in job.chunks]

    def topic_id(self, key: PartitionKey) -> str | None:
        with self._lock:
            part = self._partitions.get(key)
            return part.topic_id if part is not None else None

    def loaded(
        self, job: Load, chunks: Mapping[tuple[PartitionKey, int], tuple[int, memoryview]]
    ) -> list[tuple[PartitionKey, int]]:
        """Hold the bytes ``job`` loaded (``chunks``: every chunk of the object, with its
        position); chunks that changed meanwhile are skipped, and the whole load if the room is
        gone. The chunks the object does not hold where their records say (none, normally)."""
        missing: list[tuple[PartitionKey, int]] = []
        with self._lock:
            self._paused_objects.pop(job.object, None)
            if self._held > 0 and self._held + job.size > self.bound:
                return missing
            for key, base_offset in job.chunks:
                part = self._partitions.get(key)
                at = _index(part.chunks, base_offset) if part is not None else None
                if part is None or at is None or len(part.data) != at:
                    continue  # compacted, reloaded or held meanwhile
                record = part.chunks[at]
                position, view = chunks.get((key, base_offset), (-1, memoryview(b"")))
                if (position, len(view)) != (record.position, record.size):
                    missing.append((key, base_offset))
                    break  # what follows would not extend the held run
                part.data[base_offset] = bytes(view)
                self._changed(record.size)
        return missing

    def compacted(self, key: PartitionKey, segment: SegmentRecord) -> None:
        """The chunks ``segment`` covers are compacted: forget them."""
        with self._lock:
            part = self._partitions.get(key)
            if part is None:
                return
            for chunk in part.chunks:
                if chunk.base_offset <= segment.last_offset:
                    self._changed(-len(part.data.pop(chunk.base_offset, b"")))
            part.chunks = [c for c in part.chunks if c.base_offset > segment.last_offset]
            part.failures = 0

    def drop(self, key: PartitionKey) -> None:
        with self._lock:
            self._drop(key)

    def back_off(self, job: compact_plan.Job, now: float) -> None:
        """``job`` failed: leave its partition (a seal) or object (a load) out of plans for a
        while, longer after each failure in a row."""
        with self._lock:
            if isinstance(job, Seal):
                part = self._partitions.get(job.key)
                if part is not None:
                    part.failures += 1
                    part.retry_at = now + backoff(part.failures)
            else:
                failures = self._paused_objects.get(job.object, (0, 0.0))[0] + 1
                self._paused_objects[job.object] = (failures, now + backoff(failures))

    def uncompacted(self, key: PartitionKey) -> list[SegmentRecord]:
        with self._lock:
            part = self._partitions.get(key)
            return list(part.chunks) if part is not None else []

    # --- under the lock ---------------------------------------------------------------------

    def _partition(self, key: PartitionKey, topic_id: str) -> _Partition:
        """The partition's state; a new one if the topic was re-created."""
        part = self._partitions.get(key)
        if part is None or part.topic_id != topic_id:
            self._drop(key)
            part = self._partitions[key] = _Partition(topic_id, self.default_segment_bytes)
        return part

    def _drop(self, key: PartitionKey) -> None:
        part = self._partitions.pop(key, None)
        if part is not None:
            self._changed(-sum(map(len, part.data.values())))

    def _keep_held_run(self, part: _Partition) -> None:
        run = 0
        while run < len(part.chunks) and part.chunks[run].base_offset in part.data:
            run += 1
        keep = {chunk.base_offset for chunk in part.chunks[:run]}
        for base_offset in [base for base in part.data if base not in keep]:
            self._changed(-len(part.data.pop(base_offset)))

    def _changed(self, delta: int) -> None:
        self._held += delta
        metrics.COMPACTION_HELD_BYTES.set(self._held)


def backoff(failures: int) -> float:
    """Seconds to wait after ``failures`` failures in a row: 1, 2, 4 ... at most 60."""
    return float(min(BACKOFF_S[1], BACKOFF_S[0] * 2 ** min(failures - 1, 16)))


def _index(chunks: Sequence[SegmentRecord], base_offset: int) -> int | None:
    return next((i for i, c in enumerate(chunks) if c.base_offset == base_offset), None)
