"""The compactor's bookkeeping: every partition's uncompacted chunk records and the accumulator
of their bytes, shared by the flusher's commit thread and the compactor's workers.

No I/O: a lock held for bookkeeping only. Invariants:

- A partition's chunks are kept in base offset order, each base offset once.
- A chunk of a merged object (the merge level: ``merged_objects``) is never held: a seal reads it
  by range. Merges take held runs that follow a partition's merged chunks, so those lead.
- The accumulator holds, per partition, the bytes of a run of chunks right after its merged
  ones (what the planner can seal or merge); bytes that would break the run, or not fit under
  ``bound``, are not kept (the chunk is read back later with its write-ahead object).
- ``held`` is the total of the held bytes; it never passes ``bound`` except by one load into an
  empty accumulator (the planner's rule).
- A partition's ``summary`` (``compact_plan.Summary``) describes its chunks as they are: updated
  on the common path (a commit appending a chunk), recomputed after any other change.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from kafscale import metrics
from kafscale.flusher import compact_plan
from kafscale.flusher.compact_plan import Load, Merge, PartitionKey, Seal
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
    summary: compact_plan.Summary | None = None  # None: recompute from ``chunks``


class Accumulator:
    def __init__(self, bound: int, default_segment_bytes: int) -> None:
        self.bound = bound
        self.default_segment_bytes = default_segment_bytes
        self._lock = threading.Lock()
        self._partitions: dict[PartitionKey, _Partition] = {}
        self._paused_objects: dict[str, tuple[int, float]] = {}  # failures, retry at
        self._merged_objects: set[str] = set()
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
            if not part.chunks or record.base_offset > part.chunks[-1].base_offset:
                self._appended(part, record)  # the usual case: commits come in offset order
                part.chunks.append(record)
                position = len(part.chunks) - 1
            elif any(chunk.base_offset == record.base_offset for chunk in part.chunks):
                return
            else:
                part.chunks.append(record)
                part.chunks.sort(key=lambda chunk: chunk.base_offset)
                part.summary = None
                position = part.chunks.index(record)
            follows_held = self._held_start(part) + len(part.data) == position
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
            part.summary = None
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
            part.summary = None
            self._keep_held_run(part)

    def may_have_work(self, limits: compact_plan.Limits, now_ms: int, now: float) -> bool:
        """Whether a plan could find a job now (``compact_plan.may_have_work``: O(partitions));
        ``now_ms`` is wall-clock (chunks' seal times), ``now`` monotonic (back-offs)."""
        with self._lock:
            summaries = [
                self._summary(key, part, now)
                for key, part in self._partitions.items()
                if part.chunks
            ]
        return compact_plan.may_have_work(summaries, limits, now_ms)

    def states(self, now: float) -> tuple[list[compact_plan.PartitionState], list[str]]:
        """What the planner needs: each partition's state, and the objects backing off."""
        with self._lock:
            states = [
                self._state(key, part, now) for key, part in self._partitions.items() if part.chunks
            ]
            paused = [key for key, (_, at) in self._paused_objects.items() if at > now]
        return states, paused

    def seal_input(self, job: Seal) -> tuple[str, list[bytes | None]] | None:
        """The topic id and the chunks' bytes of ``job`` (None for a chunk of a merged object:
        the caller reads it by range), or None if its chunks changed."""
        with self._lock:
            part = self._partitions.get(job.key)
            if part is None or part.chunks[: len(job.chunks)] != list(job.chunks):
                return None
            data = [part.data.get(chunk.base_offset) for chunk in job.chunks]
            if any(
                found is None and chunk.object not in self._merged_objects
                for chunk, found in zip(job.chunks, data, strict=True)
            ):
                return None
            return part.topic_id, data

    def merged_chunks(self, seals: Iterable[Seal]) -> list[SegmentRecord]:
        """The chunks of merged objects (read by range, never held) that ``seals`` take."""
        with self._lock:
            return [
                chunk
                for job in seals
                for chunk in job.chunks
                if chunk.object in self._merged_objects
            ]

    def merge_input(self, job: Merge) -> list[tuple[PartitionKey, str, list[bytes]]]:
        """Per run of ``job`` whose chunks are still held as planned: the partition, its topic
        id and the chunks' bytes (runs that changed meanwhile are left out)."""
        found = []
        with self._lock:
            for key, chunks in job.runs:
                part = self._partitions.get(key)
                if part is None:
                    continue
                start = self._held_start(part)
                if part.chunks[start : start + len(chunks)] != list(chunks):
                    continue
                if all(chunk.base_offset in part.data for chunk in chunks):
                    found.append((key, part.topic_id, [part.data[c.base_offset] for c in chunks]))
        return found

    def merged_objects(self, keys: Iterable[str]) -> None:
        """``keys`` are merged objects: their chunks are read by range, never held."""
        with self._lock:
            self._merged_objects.update(keys)
            for part in self._partitions.values():
                part.summary = None
                self._keep_held_run(part)

    def merged(self, key: PartitionKey, chunk: SegmentRecord) -> None:
        """The partition's chunks ``chunk`` covers are now ``chunk``, of a merged object (known
        by ``merged_objects`` already): their held bytes are released."""
        with self._lock:
            part = self._partitions.get(key)
            if part is None:
                return
            covered = [
                c for c in part.chunks if chunk.base_offset <= c.base_offset <= chunk.last_offset
            ]
            for c in covered:
                self._changed(-len(part.data.pop(c.base_offset, b"")))
            kept = [c for c in part.chunks if c not in covered]
            part.chunks = sorted([*kept, chunk], key=lambda c: c.base_offset)
            part.summary = None
            self._keep_held_run(part)

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
                if part is None or at is None or self._held_start(part) + len(part.data) != at:
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
            part.summary = None
            part.failures = 0

    def drop(self, key: PartitionKey) -> None:
        with self._lock:
            self._drop(key)

    def back_off(self, job: compact_plan.Job, now: float) -> None:
        """``job`` failed: leave its partition (a seal) or object (a load) out of plans for a
        while, longer after each failure in a row."""
        with self._lock:
            if isinstance(job, Seal | Merge):
                for key in [job.key] if isinstance(job, Seal) else [key for key, _ in job.runs]:
                    part = self._partitions.get(key)
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

    def _state(
        self, key: PartitionKey, part: _Partition, now: float = 0.0
    ) -> compact_plan.PartitionState:
        return compact_plan.PartitionState(
            key,
            part.topic_id,
            part.segment_bytes,
            tuple(
                compact_plan.Chunk(
                    chunk, chunk.base_offset in part.data, chunk.object in self._merged_objects
                )
                for chunk in part.chunks
            ),
            paused=part.retry_at > now,
        )

    def _appended(self, part: _Partition, record: SegmentRecord) -> None:
        """Update the partition's summary for ``record`` about to follow its last chunk."""
        summary = part.summary
        if summary is None or not part.chunks:
            part.summary = None
            return
        last, first = part.chunks[-1], part.chunks[0]
        part.summary = compact_plan.Summary(
            summary.segment_bytes,
            summary.total + record.size,
            summary.merged + (record.size if record.object in self._merged_objects else 0),
            summary.oldest_ms,
            summary.broken
            or record.base_offset != last.last_offset + 1
            or record.codec != first.codec,
            chunks=summary.chunks + 1,
        )

    def _summary(self, key: PartitionKey, part: _Partition, now: float) -> compact_plan.Summary:
        summary = part.summary
        if summary is None:
            summary = part.summary = compact_plan.summarize(self._state(key, part))
        # segment.bytes may change with any commit, a back-off with time: read them now.
        return dataclasses.replace(
            summary, segment_bytes=part.segment_bytes, paused=part.retry_at > now
        )

    def _held_start(self, part: _Partition) -> int:
        """The number of the partition's leading chunks of merged objects."""
        start = 0
        while start < len(part.chunks) and part.chunks[start].object in self._merged_objects:
            start += 1
        return start

    def _keep_held_run(self, part: _Partition) -> None:
        start = run = self._held_start(part)
        while run < len(part.chunks) and part.chunks[run].base_offset in part.data:
            run += 1
        keep = {chunk.base_offset for chunk in part.chunks[start:run]}
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
