"""What the compactor does next: which partitions' chunks become one spec segment, and which
write-ahead objects to read back first (docs/design/write-path.md, section 6).

Pure: the state of every partition's uncompacted chunks (whether the accumulator holds their
bytes), the limits and the time in, jobs out. No I/O, no clock.

- A **run** is the partition's chunks from the oldest on, offsets contiguous, one codec (it is cut
  before a codec change), at most ``segment_bytes`` of batches (unless its first chunk alone is
  bigger). A run is **closed** once it cannot grow: it reached ``segment_bytes``, or the chunk
  after it does not fit, changes codec or does not continue the offsets.
- ``Seal`` is planned for a run that is closed, whose oldest chunk is ``max_age_ms`` old, or, while
  the partitions' uncompacted bytes exceed ``buffer_bytes``, of the partitions holding the most
  bytes in the accumulator first, until what is left fits. A seal only takes chunks whose bytes
  are held: a run that lacks some waits for them.
- ``Load`` reads one whole write-ahead object and keeps the chunks that continue a partition's
  held chunks (the accumulator holds, per partition, a run from its oldest chunk: the compactor
  keeps that invariant, so whatever it holds can be sealed). Objects go oldest chunk first; the
  chunks of the partitions waiting for a seal come first, others ride along while they fit. Loads
  never take the accumulator past ``buffer_bytes``, except one load into an empty accumulator
  (else a bound under one chunk could never make progress).
- When a waiting run cannot be loaded for lack of room and nothing else is planned, the held
  part of each waiting run is sealed instead (smaller segments, but memory is freed).
- At most ``max_jobs`` jobs, seals first (they free memory); at most one seal per partition and one
  load per object, so the jobs of one plan can run at once.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from kafscale.metadata.records import SegmentRecord


class PartitionKey(NamedTuple):
    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class Chunk:
    """An uncompacted chunk entry and whether the accumulator holds its bytes."""

    record: SegmentRecord
    held: bool

    @property
    def size(self) -> int:
        return self.record.size


@dataclass(frozen=True, slots=True)
class PartitionState:
    """One partition's uncompacted chunks, in offset order. ``paused``: a job of it failed and is
    backing off: nothing is planned for it, but its bytes count against the bound."""

    key: PartitionKey
    topic_id: str
    segment_bytes: int
    chunks: tuple[Chunk, ...]
    paused: bool = False


@dataclass(frozen=True, slots=True)
class Limits:
    buffer_bytes: int  # KAFSCALE_COMPACTION_BUFFER_BYTES
    max_age_ms: int  # KAFSCALE_COMPACTION_MAX_AGE_MS
    max_jobs: int  # jobs run at once


@dataclass(frozen=True, slots=True)
class Seal:
    """Build one spec segment of ``chunks`` (a run from the partition's oldest chunk, all held)."""

    key: PartitionKey
    chunks: tuple[SegmentRecord, ...]
    reason: str  # "full", "age" or "memory"


@dataclass(frozen=True, slots=True)
class Load:
    """GET write-ahead object ``object`` whole and keep the bytes of ``chunks`` (partition, base
    offset), ``size`` bytes in all."""

    object: str
    chunks: tuple[tuple[PartitionKey, int], ...]
    size: int


Job = Seal | Load


def first_run(state: PartitionState) -> tuple[tuple[Chunk, ...], bool]:
    """The partition's run from its oldest chunk, and whether it is closed."""
    chunks = state.chunks
    if not chunks:
        return (), False
    total = chunks[0].size
    for i in range(1, len(chunks)):
        previous, chunk = chunks[i - 1].record, chunks[i].record
        if (
            chunk.base_offset != previous.last_offset + 1
            or chunk.codec != chunks[0].record.codec
            or total + chunk.size > state.segment_bytes
        ):
            return chunks[:i], True
        total += chunk.size
    return chunks, total >= state.segment_bytes


def held_prefix(chunks: Sequence[Chunk]) -> tuple[Chunk, ...]:
    """The leading chunks whose bytes are held."""
    for i, chunk in enumerate(chunks):
        if not chunk.held:
            return tuple(chunks[:i])
    return tuple(chunks)


def plan(
    partitions: Sequence[PartitionState],
    limits: Limits,
    now_ms: int,
    paused_objects: Iterable[str] = (),
) -> list[Job]:
    """The next jobs (see the module docstring). ``paused_objects``: objects whose load failed
    and is backing off."""
    runs = {state.key: first_run(state)[0] for state in partitions if not state.paused}
    wanted = _wanted(partitions, limits, now_ms)
    seals: list[Seal] = []
    waiting: dict[PartitionKey, str] = {}
    for key, reason in wanted.items():
        run = runs[key]
        if all(chunk.held for chunk in run):
            seals.append(Seal(key, _records(run), reason))
        else:
            waiting[key] = reason
    held = sum(chunk.size for state in partitions for chunk in state.chunks if chunk.held)
    budget = max(0, limits.max_jobs - len(seals))
    loads = _loads(partitions, runs, waiting, held, limits.buffer_bytes, budget, paused_objects)
    if not seals and not loads:
        # No room to bring a waiting run in: seal what each holds, biggest first, to free some.
        prefixes = [(held_prefix(runs[key]), key, reason) for key, reason in waiting.items()]
        prefixes.sort(key=lambda item: (-sum(chunk.size for chunk in item[0]), item[1]))
        seals = [Seal(key, _records(prefix), reason) for prefix, key, reason in prefixes if prefix]
    jobs: list[Job] = [*seals, *loads]
    return jobs[: limits.max_jobs]


def _wanted(
    partitions: Sequence[PartitionState], limits: Limits, now_ms: int
) -> dict[PartitionKey, str]:
    """Partitions to seal and why, in the order their seals should go."""
    demand = sum(chunk.size for state in partitions for chunk in state.chunks)
    wanted: dict[PartitionKey, str] = {}
    candidates = sorted(
        (state for state in partitions if state.chunks and not state.paused),
        key=lambda state: (state.chunks[0].record.created_ms, state.key),
    )
    for state in candidates:
        run, closed = first_run(state)
        if closed or now_ms - run[0].record.created_ms >= limits.max_age_ms:
            wanted[state.key] = "full" if closed else "age"
            demand -= sum(chunk.size for chunk in run)
    if demand > limits.buffer_bytes:
        by_held = sorted(
            (state for state in candidates if state.key not in wanted),
            key=lambda state: (
                -sum(chunk.size for chunk in state.chunks if chunk.held),
                -sum(chunk.size for chunk in state.chunks),
                state.key,
            ),
        )
        for state in by_held:
            if demand <= limits.buffer_bytes:
                break
            wanted[state.key] = "memory"
            demand -= sum(chunk.size for chunk in first_run(state)[0])
    return wanted


def _loads(
    partitions: Sequence[PartitionState],
    runs: dict[PartitionKey, tuple[Chunk, ...]],
    waiting: dict[PartitionKey, str],
    held: int,
    bound: int,
    budget: int,
    paused_objects: Iterable[str],
) -> list[Load]:
    """Loads for the waiting runs, oldest chunk first, within the bound and the budget."""
    paused = set(paused_objects)
    states = {state.key: state for state in partitions if not state.paused}
    # Per partition, the index of its first chunk whose bytes are neither held nor planned.
    nexts = {
        key: len(prefix)
        for key, state in states.items()
        if len(prefix := held_prefix(state.chunks)) < len(state.chunks)
    }
    open_keys = {key for key in waiting if key in nexts}
    projected = held
    loads: list[Load] = []
    while open_keys and len(loads) < budget:
        key = min(open_keys, key=lambda k: (states[k].chunks[nexts[k]].record.created_ms, k))
        target = states[key].chunks[nexts[key]].record.object
        groups = {
            k: _group(states[k].chunks, nexts[k], target)
            for k in sorted(nexts)
            if nexts[k] < len(states[k].chunks)
            and states[k].chunks[nexts[k]].record.object == target
        }
        needed = {k: group for k, group in groups.items() if k in open_keys}
        cost = sum(chunk.size for group in needed.values() for chunk in group)
        if target in paused or (projected + cost > bound and projected > 0):
            open_keys -= needed.keys()  # waits for a later plan
            continue
        taken: list[tuple[PartitionKey, int]] = []
        for k, group in (*needed.items(), *((k, g) for k, g in groups.items() if k not in needed)):
            count = len(group)
            if k not in needed:  # rides along while it fits, from its first chunk on
                count = 0
                while count < len(group) and projected + cost + group[count].size <= bound:
                    cost += group[count].size
                    count += 1
            taken.extend((k, chunk.record.base_offset) for chunk in group[:count])
            nexts[k] += count
        projected += cost
        loads.append(Load(target, tuple(taken), cost))
        open_keys = {k for k in open_keys if nexts[k] < min(len(runs[k]), len(states[k].chunks))}
    return loads


def _group(chunks: Sequence[Chunk], start: int, target: str) -> tuple[Chunk, ...]:
    """The chunks from ``start`` on that lie in ``target`` (one after the other in an object)."""
    end = start
    while end < len(chunks) and chunks[end].record.object == target and not chunks[end].held:
        end += 1
    return tuple(chunks[start:end])


def _records(chunks: Iterable[Chunk]) -> tuple[SegmentRecord, ...]:
    return tuple(chunk.record for chunk in chunks)
