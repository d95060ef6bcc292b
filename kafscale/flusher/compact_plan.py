"""What the compactor does next: which partitions' chunks become one spec segment, and which
write-ahead objects to read back first (docs/design/write-path.md, section 6).

Pure: the state of every partition's uncompacted chunks (whether the accumulator holds their
bytes), the limits and the time in, jobs out. No I/O, no clock.

- A **run** is the partition's chunks from the oldest on, offsets contiguous, one codec (it is cut
  before a codec change), at most ``segment_bytes`` of batches (unless its first chunk alone is
  bigger) in at most ``MAX_RUN_CHUNKS`` chunks. A run is **closed** once it cannot grow: it
  reached ``segment_bytes`` or ``MAX_RUN_CHUNKS``, or the chunk after it does not fit, changes
  codec or does not continue the offsets.
- ``Seal`` is planned for a run that is closed, or whose oldest chunk is ``max_age_ms`` old;
  once one is due by age, so is every run whose oldest chunk is ``SWEEP_AGE`` of that old (a
  sweep: partitions written at one pace age together, and are sealed together). A seal only
  takes chunks it can read cheaply: held ones, and chunks of merged objects (read by range, with
  those of the plan's other seals: ``kafscale.flusher.compact_reads``); a run that lacks some
  waits for them (``Load``); once ``SEAL_PREFIX_CHUNKS`` leading chunks of it are readable,
  those are sealed at once while the loads of the rest go on.
- The merge level (section 11 of the design): while the
  bytes not in merged objects exceed ``MERGE_AT`` of ``buffer_bytes``, partitions that will seal
  soon are sealed ("memory") and the held runs of the others, oldest first, are written into one
  merged object of about ``MERGE_BYTES`` of the bound (``Merge``), which frees their memory. Past
  ``buffer_bytes`` still, the partitions holding the most bytes are sealed ("memory") until what
  is left fits.
- ``Load`` reads one whole write-ahead object and keeps the chunks that continue a partition's
  held chunks (the accumulator holds, per partition, a run from its oldest chunk: the compactor
  keeps that invariant, so whatever it holds can be sealed). Objects go oldest chunk first; the
  chunks of the partitions waiting for a seal come first, others ride along while they fit. Loads
  never take the accumulator past ``buffer_bytes``, except one load into an empty accumulator
  (else a bound under one chunk could never make progress).
- When a waiting run cannot be loaded for lack of room and nothing else is planned, the held
  part of each waiting run is sealed instead (smaller segments, but memory is freed).
- Seals first (they free memory): the memory seals, then the others in (topic, partition) order,
  so that one plan's partitions lie side by side in the merged objects and their chunks are read
  with few ranged GETs; at most ``SEAL_BATCH`` seals, reading at most ``seal_read_bytes`` of
  merged chunks in all (at least one seal). Then at most ``max_jobs`` loads and merges, fewer by
  the seals up to ``max_jobs``. At most one seal per partition and one load per object, so the
  jobs of one plan can run at once (a load after a sealing prefix lands after it either way).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from kafscale.metadata.records import SegmentRecord

MERGE_AT = 0.75  # of buffer_bytes: leaves room for what commits while a merge uploads
MERGE_BYTES = 0.5  # of buffer_bytes: the size of one merged object
# Of segment_bytes: a partition this full is sealed, not merged, when memory is short. Merging
# it once more costs a part of a ranged GET at its seal; sealing it smaller costs PUTs (12.5x a
# GET): 3/4 made segments ~15% smaller than 9/10 (write-path.md, section 10).
SEAL_SOON = 0.9
# Chunks a run may have: a partition written by small requests (acks=all, a chunk per group
# commit) is sealed at this many even while small and young. Every chunk is an etcd record (in
# each process's metadata view, read by each load of the partition) and pins its write-ahead
# object (the coordinator loads every reference at boot): the chaos run grew 21,000 chunks a
# partition in 20 minutes and 78,000 references (54 s of coordinator boot at load 19).
MAX_RUN_CHUNKS = 4096
# Chunks of a due run that are sealed without waiting for the rest of it. A broker that takes
# a partition over holds none of its chunks, and loads them one write-ahead object a chunk,
# oldest first: a closed run of MAX_RUN_CHUNKS is that many GETs. When the partition moves again
# first (the chaos run: a fault every 30-60 s), all of them are lost; sealed in steps of this
# many, the work done so far stays done.
SEAL_PREFIX_CHUNKS = 256
MAX_MERGED = 64  # merged chunks a partition may have (chunk records, ranges read at its seal)
SWEEP_AGE = 0.9  # of max_age_ms: once one run is due by age, runs this old are sealed with it
SEAL_BATCH = 64  # seals in one plan
MIN_SEAL_READ_BYTES = 64 << 20  # the default seal_read_bytes is this or a quarter of the buffer


class PartitionKey(NamedTuple):
    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class Chunk:
    """An uncompacted chunk entry, whether the accumulator holds its bytes, and whether it is
    a chunk of a merged object (read with one ranged GET, never loaded whole)."""

    record: SegmentRecord
    held: bool
    merged: bool = False

    @property
    def readable(self) -> bool:
        return self.held or self.merged

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
    max_jobs: int  # loads and merges run at once
    seal_read_bytes: int | None = None  # merged chunks one plan's seals read (None: no bound)


def seal_read_bytes(buffer_bytes: int) -> int:
    """The default bound on the merged chunks one plan's seals read."""
    return max(MIN_SEAL_READ_BYTES, buffer_bytes // 4)


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


@dataclass(frozen=True, slots=True)
class Merge:
    """Write the held ``runs`` (per partition, chunks after its merged ones, contiguous, one
    codec) into one merged object, each run one chunk; ``size`` bytes of chunks in all."""

    runs: tuple[tuple[PartitionKey, tuple[SegmentRecord, ...]], ...]
    size: int


Job = Seal | Load | Merge


@dataclass(frozen=True, slots=True)
class Summary:
    """What decides whether a partition can give the planner work, kept up to date as chunks
    come (``kafscale.flusher.compact_state``) instead of walking them: the bytes of its
    uncompacted chunks, those of them in merged objects, when its oldest chunk was sealed, and
    whether its chunks break a run anywhere (offsets that do not continue, a codec change)."""

    segment_bytes: int
    total: int
    merged: int
    oldest_ms: int  # the first chunk's seal time (the age rule's)
    broken: bool
    paused: bool = False  # backing off after a failure
    chunks: int = 0  # how many


def summarize(state: PartitionState) -> Summary:
    """The summary of a partition's chunks, walking them (the accumulator keeps it up to date
    without walking on its common path)."""
    records = [chunk.record for chunk in state.chunks]
    return Summary(
        state.segment_bytes,
        sum(record.size for record in records),
        sum(chunk.size for chunk in state.chunks if chunk.merged),
        records[0].created_ms if records else 0,
        any(
            chunk.base_offset != previous.last_offset + 1 or chunk.codec != records[0].codec
            for previous, chunk in itertools.pairwise(records)
        ),
        state.paused,
        len(records),
    )


def may_have_work(summaries: Iterable[Summary], limits: Limits, now_ms: int) -> bool:
    """False only if ``plan`` would return no job for these partitions (whatever the
    accumulator holds of them): no run can be closed (every partition holds less than its
    ``segment_bytes`` in fewer than ``MAX_RUN_CHUNKS`` unbroken chunks) or aged, and the bytes
    not in merged objects stay under ``MERGE_AT`` of the bound. O(partitions), where a plan is
    O(chunks): the compactor plans only when this says so. A partition backing off after a
    failure (``paused``) gets no job from ``plan`` either, but its bytes count against the
    bound."""
    demand = 0
    for summary in summaries:
        if summary.total <= 0:
            continue
        demand += summary.total - summary.merged
        if not summary.paused and (
            summary.broken
            or summary.total >= summary.segment_bytes
            or summary.chunks >= MAX_RUN_CHUNKS
            or now_ms - summary.oldest_ms >= limits.max_age_ms
        ):
            return True
    return demand > limits.buffer_bytes * MERGE_AT


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
            or i >= MAX_RUN_CHUNKS
        ):
            return chunks[:i], True
        total += chunk.size
    return chunks, total >= state.segment_bytes or len(chunks) >= MAX_RUN_CHUNKS


def readable_prefix(chunks: Sequence[Chunk]) -> tuple[Chunk, ...]:
    """The leading chunks a seal can read without a load (held, or merged)."""
    for i, chunk in enumerate(chunks):
        if not chunk.readable:
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
    wanted, merge = _wanted(partitions, limits, now_ms)
    seals: list[Seal] = []
    waiting: dict[PartitionKey, str] = {}
    for key, reason in wanted.items():
        run = runs[key]
        prefix = readable_prefix(run)
        if len(prefix) == len(run) or len(prefix) >= SEAL_PREFIX_CHUNKS:
            seals.append(Seal(key, _records(prefix), reason))
        if len(prefix) < len(run):
            waiting[key] = reason  # loads go on beside a prefix's seal
    held = sum(chunk.size for state in partitions for chunk in state.chunks if chunk.held)
    merges: list[Job] = [merge] if merge is not None else []
    budget = max(0, limits.max_jobs - min(len(seals), limits.max_jobs) - len(merges))
    loads = _loads(partitions, runs, waiting, held, limits.buffer_bytes, budget, paused_objects)
    if not seals and not loads and not merges:
        # No room to bring a waiting run in: seal what each holds, biggest first, to free some.
        prefixes = [(readable_prefix(runs[key]), key, reason) for key, reason in waiting.items()]
        prefixes.sort(key=lambda item: (-sum(chunk.size for chunk in item[0]), item[1]))
        seals = [Seal(key, _records(prefix), reason) for prefix, key, reason in prefixes if prefix]
    others: list[Job] = [*merges, *loads]
    return [*_batch(seals, partitions, limits), *others[: limits.max_jobs]]


def _batch(seals: list[Seal], partitions: Sequence[PartitionState], limits: Limits) -> list[Seal]:
    """The seals of one plan: memory seals first (as planned), then the others in key order
    (neighbours in the merged objects), at most ``SEAL_BATCH``, reading at most
    ``seal_read_bytes`` of merged chunks (at least one seal)."""
    states = {state.key: state for state in partitions}
    ordered = [seal for seal in seals if seal.reason == "memory"]
    ordered += sorted((seal for seal in seals if seal.reason != "memory"), key=lambda s: s.key)
    bound = limits.seal_read_bytes
    out: list[Seal] = []
    read = 0
    for seal in ordered[:SEAL_BATCH]:
        # a seal takes a run from the partition's oldest chunk: a prefix of its chunks
        taken = states[seal.key].chunks[: len(seal.chunks)]
        size = sum(chunk.size for chunk in taken if chunk.merged)
        if out and bound is not None and read + size > bound:
            break
        out.append(seal)
        read += size
    return out


def _wanted(
    partitions: Sequence[PartitionState], limits: Limits, now_ms: int
) -> tuple[dict[PartitionKey, str], Merge | None]:
    """Partitions to seal and why, in the order their seals should go, and the merge to do."""
    demand = sum(c.size for state in partitions for c in state.chunks if not c.merged)
    wanted: dict[PartitionKey, str] = {}
    candidates = sorted(
        (state for state in partitions if state.chunks and not state.paused),
        key=lambda state: (state.chunks[0].record.created_ms, state.key),
    )
    # Candidates go oldest first: once one is due by age, the sweep takes the ones nearly as old.
    age_line = limits.max_age_ms
    for state in candidates:
        run, closed = first_run(state)
        age = now_ms - run[0].record.created_ms
        if closed or age >= age_line:
            wanted[state.key] = "full" if closed else "age"
            demand -= sum(chunk.size for chunk in run if not chunk.merged)
            if not closed:
                age_line = min(age_line, int(limits.max_age_ms * SWEEP_AGE))
    merge = None
    if demand > limits.buffer_bytes * MERGE_AT:
        soon, merge = _choose_merge(
            [state for state in candidates if state.key not in wanted],
            int(limits.buffer_bytes * MERGE_BYTES),
        )
        demand -= merge.size if merge is not None else 0
        for state in soon:
            if demand <= limits.buffer_bytes * MERGE_AT:
                break
            wanted[state.key] = "memory"
            demand -= sum(chunk.size for chunk in first_run(state)[0] if not chunk.merged)
    merging = {key for key, _ in merge.runs} if merge is not None else set()
    if demand > limits.buffer_bytes:
        by_held = sorted(
            (state for state in candidates if state.key not in wanted and state.key not in merging),
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
            demand -= sum(chunk.size for chunk in first_run(state)[0] if not chunk.merged)
    return wanted, merge


def _choose_merge(
    states: Sequence[PartitionState], target: int
) -> tuple[list[PartitionState], Merge | None]:
    """Of ``states`` (partitions not sealing), those that will seal soon (biggest held first),
    and the merge of the others' held runs, oldest first, until ``target`` bytes are taken."""
    soon: list[PartitionState] = []
    runs: list[tuple[int, PartitionKey, tuple[Chunk, ...]]] = []
    for state in states:
        merged = 0
        while merged < len(state.chunks) and state.chunks[merged].merged:
            merged += 1
        total = sum(chunk.size for chunk in state.chunks)
        if total >= state.segment_bytes * SEAL_SOON or merged >= MAX_MERGED:
            soon.append(state)
        elif run := _held_run(state.chunks[merged:]):
            runs.append((run[0].record.created_ms, state.key, run))
    soon.sort(key=lambda state: (-sum(c.size for c in state.chunks if c.held), state.key))
    runs.sort(key=lambda item: item[:2])
    taken: list[tuple[PartitionKey, tuple[SegmentRecord, ...]]] = []
    size = 0
    for _, key, run in runs:
        if size >= target:
            break
        taken.append((key, _records(run)))
        size += sum(chunk.size for chunk in run)
    return soon, Merge(tuple(sorted(taken)), size) if taken else None


def _held_run(chunks: Sequence[Chunk]) -> tuple[Chunk, ...]:
    """The leading held chunks whose bytes make one chunk: contiguous offsets, one codec."""
    end = 0
    while (
        end < len(chunks)
        and chunks[end].held
        and (
            end == 0
            or (
                chunks[end].record.base_offset == chunks[end - 1].record.last_offset + 1
                and chunks[end].record.codec == chunks[0].record.codec
            )
        )
    ):
        end += 1
    return tuple(chunks[:end])


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
        if len(prefix := readable_prefix(state.chunks)) < len(state.chunks)
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
