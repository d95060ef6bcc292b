"""What a restarted shard keeps of its predecessor's buffers: pure decisions, no I/O, no clock.

A shard that dies (SIGKILL, a crash) leaves its partition buffers in /dev/shm. They hold every
batch it acknowledged with acks=1 since the last commit, so its successor adopts them
(``kafscale.shards.restart`` does the I/O) after these checks:

- **Verify each buffer.** Walk the batches from the start of the data up to ``committed`` (never
  past the capacity): each must be a whole v2 batch (framing, magic, lengths) whose CRC32C
  matches, with offsets continuing from the header's base offset. The verified prefix is kept;
  a tail that fails was never acknowledged (the shard replies only after ``append`` published the
  batch, and a batch is copied before ``committed`` moves past it) and is dropped. A seqlock left
  odd (``interrupted``: the owner died mid-publish) changes nothing here, since every batch is
  verified anyway, except that its ``sealed`` flag is not trusted.
- **Reconcile with what is committed** (the partition record: high watermark, producer state).
  A buffer whose last offset is below the high watermark was flushed already (its owner died
  between the commit and the destroy): discarded. The others are adopted in base-offset order and
  must continue exactly from the high watermark; at the first gap or overlap the rest is
  discarded loudly, so no offset can ever be held twice. A buffer whose topic no longer exists
  (deleted, or re-created under a new id) is discarded.
- **Rebuild the partition's state**: the next offset continues after the last adopted batch; the
  idempotent producers' state is the committed snapshot plus every adopted batch, in order, so a
  producer retrying a batch whose acknowledgement died with the shard gets its original offsets;
  each adopted buffer carries the producer snapshot as of its end (what its commit writes).
- **Keep flushes deterministic**: a buffer sealed by its owner keeps that seal time and codec
  (the segment's created time and flags), so re-flushing it builds the bytes the flusher may
  already have uploaded; a buffer never sealed is sealed by the successor (all are flushed).
- **Names never collide**: new buffers are numbered after the highest slot found.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kafscale.ipc.shm import BufferOwner, BufferState
from kafscale.protocol import records
from kafscale.protocol.records import BatchHeader
from kafscale.shards.producers import ProducerStates
from kafscale.storage.segment import batch_crc

Snapshot = dict[int, Any]  # ProducerStates.snapshot()
OwnerKey = tuple[str, str, int]  # (topic, topic_id, partition)
MIN_BATCH_LENGTH = records.HEADER.size - records.LOG_OVERHEAD  # a v2 batch with no records


@dataclass(frozen=True, slots=True)
class FoundBuffer:
    """A buffer of the predecessor, as found: its header and its whole data region."""

    name: str
    slot: int
    owner: BufferOwner
    state: BufferState
    capacity: int
    interrupted: bool
    data: bytes | memoryview  # the data region; only [0, committed) is looked at


@dataclass(frozen=True, slots=True)
class Committed:
    """A partition's committed state, read from the metadata store."""

    topic_exists: bool  # the topic exists with the buffer's topic id
    high_watermark: int = 0
    producers: Snapshot | None = None


@dataclass(frozen=True, slots=True)
class Walk:
    """The verified prefix of a buffer's data."""

    size: int  # bytes of whole, verified batches from the start
    starts: tuple[int, ...]  # where each batch starts
    headers: tuple[BatchHeader, ...]
    problem: str | None  # why the walk stopped before ``committed``, if it did


@dataclass(frozen=True, slots=True)
class AdoptedBuffer:
    name: str
    base_offset: int
    next_offset: int
    size: int  # the verified prefix; the header's ``committed`` is truncated to it if larger
    batches: int
    records: int
    max_timestamp: int
    starts: tuple[int, ...]
    lasts: tuple[int, ...]  # each batch's last offset
    sealed_ms: int | None  # the owner's seal; None: never (fully) sealed, the successor seals it
    codec: int
    producers: Snapshot  # producer state as of the buffer's last batch
    truncated: bool
    dropped: str | None  # why a tail was dropped, if one was


@dataclass(frozen=True, slots=True)
class AdoptedPartition:
    owner: BufferOwner
    high_watermark: int
    next_offset: int
    buffers: tuple[AdoptedBuffer, ...]  # in offset order, contiguous from the high watermark
    producers: Snapshot  # after the last adopted batch


@dataclass(frozen=True, slots=True)
class Discarded:
    name: str
    reason: str
    anomaly: bool  # something is wrong (log an error), rather than a routine leftover


@dataclass(frozen=True, slots=True)
class AdoptionPlan:
    partitions: tuple[AdoptedPartition, ...]
    discarded: tuple[Discarded, ...]
    last_slot: int  # the highest slot number seen (-1: none): new buffers get higher ones


def owner_key(owner: BufferOwner) -> OwnerKey:
    return owner.topic, owner.topic_id, owner.partition


def walk(data: bytes | memoryview, end: int, base_offset: int) -> Walk:
    """Verify the batches in ``data[:end]``: the longest prefix of whole, intact, contiguous
    batches starting at ``base_offset``, and why the rest (if any) is not."""
    view = memoryview(data)[:end]
    starts: list[int] = []
    headers: list[BatchHeader] = []
    position, expected, problem = 0, base_offset, None
    while position < end:
        problem = _check_batch(view, position, expected)
        if problem is not None:
            break
        header = records.read_header(view, position)
        starts.append(position)
        headers.append(header)
        position += header.size
        expected = header.last_offset + 1
    return Walk(position, tuple(starts), tuple(headers), problem)


def _check_batch(view: memoryview, position: int, expected: int) -> str | None:
    where = f"batch at byte {position}"
    if len(view) - position < records.HEADER.size:
        return f"{where}: {len(view) - position} bytes cannot hold a batch header"
    header = records.read_header(view, position)
    if header.magic != records.MAGIC:
        return f"{where}: magic {header.magic}"
    if header.batch_length < MIN_BATCH_LENGTH or position + header.size > len(view):
        return f"{where}: length {header.batch_length} does not fit in the data"
    if header.base_offset != expected:
        return f"{where}: base offset {header.base_offset}, expected {expected}"
    if header.last_offset_delta < 0 or header.records_count <= 0:
        return (
            f"{where}: {header.records_count} records, last offset delta {header.last_offset_delta}"
        )
    stored, computed = header.crc, batch_crc(view[position : position + header.size])
    if stored != computed:
        return f"{where}: CRC32C stored {stored:#010x}, computed {computed:#010x}"
    return None


def plan_adoption(
    found: Sequence[FoundBuffer],
    committed: Mapping[OwnerKey, Committed],
    other_slots: Iterable[int] = (),
) -> AdoptionPlan:
    """What to adopt and what to discard. ``committed`` has an entry for every owner in
    ``found``; ``other_slots`` are slots of buffers the caller could not even read."""
    by_partition: dict[OwnerKey, list[FoundBuffer]] = defaultdict(list)
    for buffer in found:
        by_partition[owner_key(buffer.owner)].append(buffer)
    partitions: list[AdoptedPartition] = []
    discarded: list[Discarded] = []
    for key, buffers in sorted(by_partition.items()):
        buffers.sort(key=lambda b: (b.state.base_offset, b.slot))
        adopted = _plan_partition(buffers, committed[key], discarded)
        if adopted is not None:
            partitions.append(adopted)
    slots = [*(b.slot for b in found), *other_slots]
    return AdoptionPlan(tuple(partitions), tuple(discarded), max(slots, default=-1))


def _plan_partition(
    buffers: list[FoundBuffer], committed: Committed, discarded: list[Discarded]
) -> AdoptedPartition | None:
    owner = buffers[0].owner
    if not committed.topic_exists:
        reason = f"topic {owner.topic} ({owner.topic_id}) no longer exists"
        discarded.extend(Discarded(b.name, reason, anomaly=False) for b in buffers)
        return None
    high_watermark = committed.high_watermark
    producers = ProducerStates.restore(committed.producers or {})
    expected = high_watermark
    adopted: list[AdoptedBuffer] = []
    for at, buffer in enumerate(buffers):
        end = min(buffer.state.committed, buffer.capacity)
        found = walk(buffer.data, end, buffer.state.base_offset)
        if buffer.state.committed > buffer.capacity:
            found = _with_problem(found, f"committed {buffer.state.committed} > capacity")
        if not found.headers:
            reason = f"no whole batch ({found.problem})" if found.problem else "empty"
            discarded.append(Discarded(buffer.name, reason, anomaly=found.problem is not None))
            continue
        first, last = buffer.state.base_offset, found.headers[-1].last_offset
        if last < high_watermark:
            reason = f"flushed already: offsets {first}..{last} are below {high_watermark}"
            discarded.append(Discarded(buffer.name, reason, anomaly=False))
            continue
        if first != expected:
            what = "a gap" if first > expected else "an overlap"
            reason = f"{what}: offsets {first}..{last} do not continue from {expected}"
            discarded.extend(Discarded(b.name, reason, anomaly=True) for b in buffers[at:])
            break
        adopted.append(_adopt(buffer, found, producers))
        expected = last + 1
    if not adopted:
        return None
    return AdoptedPartition(owner, high_watermark, expected, tuple(adopted), adopted[-1].producers)


def _with_problem(found: Walk, problem: str) -> Walk:
    return Walk(found.size, found.starts, found.headers, found.problem or problem)


def _adopt(buffer: FoundBuffer, found: Walk, producers: ProducerStates) -> AdoptedBuffer:
    """Adopt the verified prefix, recording its batches into ``producers`` (in place)."""
    for header in found.headers:
        producers.record_batch(header)
    state = buffer.state
    owner_sealed = state.sealed and not buffer.interrupted and state.sealed_ms > 0
    return AdoptedBuffer(
        name=buffer.name,
        base_offset=state.base_offset,
        next_offset=found.headers[-1].last_offset + 1,
        size=found.size,
        batches=len(found.headers),
        records=sum(h.records_count for h in found.headers),
        max_timestamp=max(h.max_timestamp for h in found.headers),
        starts=found.starts,
        lasts=tuple(h.last_offset for h in found.headers),
        sealed_ms=state.sealed_ms if owner_sealed else None,
        codec=state.codec,
        producers=producers.snapshot(),
        truncated=found.size < state.committed,
        dropped=found.problem,
    )
