"""The commit planner of a write-ahead object (docs/design/write-path.md, section 5): pure.

Given a ``CommitObject`` and the current records of the topics and partitions it touches, it
decides for every chunk what happens to it (``Verdict``) and which metadata transactions commit
the chunks that go in (``PlannedTxn``). No I/O: the coordinator (``partitions.py``) reads the
records, runs the transactions and answers.

Rules, per partition (its chunks taken in base offset order):

- the topic must exist with the chunk's topic id, and so must a partition record if there is
  one (else the topic is gone); the partition must be one of the topic's;
- a chunk that ends below the committed high watermark was committed by an earlier attempt;
- a partition this broker does not own (``CommitState.leaders`` has no leader record for it),
  whose record names another owner or epoch, or whose chunk was appended at another leader
  epoch, refuses the rest ("fenced"); every transaction compares each partition's leader key to
  our leader record, so a claim by anyone else in between fails it
  (docs/design/scale-out.md);
- the rest must follow on from the high watermark, contiguously; the first that does not is
  refused, with every chunk after it.

Transactions are filled in (topic, partition) order. A partition is never split: its
``Compare(partition record)``, ``Put(partition record)`` and one ``Put(chunk record)`` per chunk
go in one transaction with the partition's leader-key fence, with one ``Compare(topic record)``
per topic the transaction touches; the
first transaction also puts the ``WalRecord``. A transaction closes before ``max(compares,
puts)`` would pass ``max_ops`` or its encoded size ``max_bytes``; a partition too big for any
transaction is put alone (``CommitPlan.oversized`` names it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Generic, TypeVar

import msgspec

from kafscale.coordinator import leadership
from kafscale.ipc.write_path import ANY_EPOCH, CommitCompaction, CommitObject, ObjectChunk
from kafscale.metadata import records
from kafscale.metadata.records import (
    Keys,
    LeaderRecord,
    PartitionRecord,
    SegmentRecord,
    TopicRecord,
)
from kafscale.metadata.store import Compare, Put
from kafscale.storage import wal

R = TypeVar("R")
PartitionId = tuple[str, int]

OP_OVERHEAD = 16  # bytes an operation costs in an etcd request besides its key and value


@dataclass(frozen=True, slots=True)
class Stored(Generic[R]):
    """A decoded record as read from the store, with the key's ``mod_revision``."""

    record: R
    mod_revision: int


@dataclass(frozen=True, slots=True)
class CommitState:
    """The current records of what a commit touches; ``None`` (or missing): the key is absent."""

    topics: Mapping[str, Stored[TopicRecord] | None]
    partitions: Mapping[PartitionId, Stored[PartitionRecord] | None]
    # This broker's leader record of each partition it owns; any other partition is fenced.
    leaders: Mapping[PartitionId, LeaderRecord] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Limits:
    max_ops: int
    max_bytes: int


class Outcome(Enum):
    COMMIT = "commit"  # in one of the planned transactions
    COMMITTED = "committed"  # by an earlier attempt: answered committed, nothing written
    REFUSED = "refused"
    TOPIC_GONE = "topic gone"


@dataclass(frozen=True, slots=True)
class Verdict:
    """What happens to one chunk. ``high_watermark``: for ``COMMIT`` the partition's after its
    transaction, else the committed one now (-1: unknown, the topic is gone)."""

    outcome: Outcome
    high_watermark: int
    error: str | None = None


@dataclass(slots=True)
class PlannedTxn:
    compares: list[Compare] = field(default_factory=list)
    puts: list[Put] = field(default_factory=list)
    chunks: list[int] = field(default_factory=list)  # indexes into CommitObject.chunks
    partitions: dict[PartitionId, PartitionRecord] = field(default_factory=dict)  # as put
    holds_wal: bool = False
    size: int = 0  # encoded bytes, as counted against ``Limits.max_bytes``
    topics: set[str] = field(default_factory=set)  # whose Compare it holds

    @property
    def ops(self) -> int:
        """What etcd counts against ``--max-txn-ops``."""
        return max(len(self.compares), len(self.puts))


@dataclass(frozen=True, slots=True)
class CommitPlan:
    verdicts: list[Verdict]  # one per CommitObject.chunks, same order
    transactions: list[PlannedTxn]
    oversized: list[PartitionId]  # each alone in a transaction that passes the limits


def touched(request: CommitObject) -> tuple[set[str], set[PartitionId]]:
    """The topics and partitions whose records ``plan_commit`` needs."""
    return (
        {chunk.topic for chunk in request.chunks},
        {(chunk.topic, chunk.partition) for chunk in request.chunks},
    )


def wal_record_key(keys: Keys, object_key: str) -> str:
    """The ``WalRecord`` key of the write-ahead object at ``object_key``."""
    return keys.wal_object(wal.object_name(object_key))


def plan_commit(
    request: CommitObject,
    state: CommitState,
    limits: Limits,
    keys: Keys,
    include_wal: bool = True,
) -> CommitPlan:
    """Decide every chunk of ``request`` and plan the transactions (see the module docstring).
    ``include_wal=False`` leaves the ``WalRecord`` out (an earlier transaction wrote it)."""
    verdicts: list[Verdict | None] = [None] * len(request.chunks)
    groups: dict[PartitionId, list[int]] = {}
    for index, chunk in enumerate(request.chunks):
        groups.setdefault((chunk.topic, chunk.partition), []).append(index)
    staged: list[_Partition] = []
    for pid in sorted(groups):
        indexes = sorted(groups[pid], key=lambda i: request.chunks[i].chunk.base_offset)
        judged = _judge(request, [(i, request.chunks[i]) for i in indexes], state)
        for index, verdict in judged.verdicts.items():
            verdicts[index] = verdict
        if judged.updated is not None:
            staged.append(judged)
    wal_put = None
    if include_wal:
        wal_put = Put(wal_record_key(keys, request.wal.key), records.encode(request.wal))
    transactions, oversized = _pack(staged, state, limits, keys, wal_put)
    assert all(verdict is not None for verdict in verdicts)
    return CommitPlan([v for v in verdicts if v is not None], transactions, oversized)


@dataclass(slots=True)
class _Partition:
    """One partition's decision: the verdict per chunk index and, when some commit, the
    partition record to put and the chunks (in offset order) whose records go with it."""

    pid: PartitionId
    verdicts: dict[int, Verdict]
    updated: PartitionRecord | None = None
    leader: LeaderRecord | None = None
    committing: list[tuple[int, ObjectChunk]] = field(default_factory=list)


def _judge(
    request: CommitObject, chunks: Sequence[tuple[int, ObjectChunk]], state: CommitState
) -> _Partition:
    first = chunks[0][1]
    pid = (first.topic, first.partition)
    judged = _Partition(pid, {})
    topic = state.topics.get(first.topic)
    stored = state.partitions.get(pid)
    current = stored.record if stored is not None else None
    for index, chunk in chunks:
        gone = _gone_reason(chunk, topic.record if topic else None, current)
        if gone is not None:
            judged.verdicts[index] = Verdict(Outcome.TOPIC_GONE, -1, gone)
    live = [(i, c) for i, c in chunks if i not in judged.verdicts]
    if not live:
        return judged
    assert topic is not None
    record = current or PartitionRecord(topic_id=topic.record.topic_id)
    high_watermark = record.high_watermark
    judged.leader = state.leaders.get(pid)
    refusal = _fenced(pid, record, judged.leader)
    if not 0 <= first.partition < topic.record.partitions:
        refusal = f"topic {first.topic} has no partition {first.partition}"
    next_offset = high_watermark
    for index, chunk in live:
        entry = chunk.chunk
        if entry.last_offset < high_watermark:
            judged.verdicts[index] = Verdict(Outcome.COMMITTED, high_watermark)
            continue
        if refusal is None and judged.leader is not None:
            refusal = _other_epoch(chunk, judged.leader)
        if refusal is None and entry.base_offset == next_offset:
            judged.committing.append((index, chunk))
            next_offset = entry.last_offset + 1
        else:
            refusal = refusal or (
                f"chunk {entry.base_offset}..{entry.last_offset} does not start at the"
                f" partition's next offset {next_offset}"
            )
            judged.verdicts[index] = Verdict(Outcome.REFUSED, high_watermark, refusal)
    if judged.committing:
        judged.updated = msgspec.structs.replace(
            record,
            high_watermark=next_offset,
            producers=judged.committing[-1][1].producers,
            wal_committed=True,
        )
        for index, _ in judged.committing:
            judged.verdicts[index] = Verdict(Outcome.COMMIT, next_offset)
    return judged


def _gone_reason(
    chunk: ObjectChunk, topic: TopicRecord | None, partition: PartitionRecord | None
) -> str | None:
    if topic is None or topic.topic_id != chunk.topic_id:
        return f"topic {chunk.topic} ({chunk.topic_id}) no longer exists"
    if partition is not None and partition.topic_id != chunk.topic_id:
        return f"partition {chunk.partition} belongs to another topic {chunk.topic} now"
    return None


def _fenced(pid: PartitionId, record: PartitionRecord, leader: LeaderRecord | None) -> str | None:
    """Why this broker cannot commit to the partition at all, or None."""
    if leader is None:
        return f"fenced: this broker does not own {pid[0]}/{pid[1]}"
    if (record.owner, record.leader_epoch) != (leader.owner, leader.epoch):
        return (
            f"fenced: the partition is owned by broker {record.owner} at leader epoch"
            f" {record.leader_epoch}, not broker {leader.owner} at {leader.epoch}"
        )
    return None


def _other_epoch(chunk: ObjectChunk, leader: LeaderRecord) -> str | None:
    if chunk.leader_epoch in (leader.epoch, ANY_EPOCH):
        return None
    return (
        f"fenced: appended at leader epoch {chunk.leader_epoch}, the partition is at"
        f" {leader.epoch} now"
    )


def _pack(
    staged: Iterable[_Partition],
    state: CommitState,
    limits: Limits,
    keys: Keys,
    wal_put: Put | None,
) -> tuple[list[PlannedTxn], list[PartitionId]]:
    transactions: list[PlannedTxn] = []
    oversized: list[PartitionId] = []
    current = _opened(wal_put)
    for partition in staged:
        compares, puts = _operations(partition, state, keys, current)
        if current.chunks and not _fits(current, compares, puts, limits):
            transactions.append(current)
            current = _opened(None)
            compares, puts = _operations(partition, state, keys, current)
        if not _fits(current, compares, puts, limits):
            oversized.append(partition.pid)
        current.compares += compares
        current.puts += puts
        current.size += _sizes(compares, puts)
        current.chunks += [index for index, _ in partition.committing]
        assert partition.updated is not None
        current.partitions[partition.pid] = partition.updated
        current.topics.add(partition.pid[0])
    if current.chunks:
        transactions.append(current)
    return transactions, oversized


def _opened(wal_put: Put | None) -> PlannedTxn:
    txn = PlannedTxn()
    if wal_put is not None:
        txn.puts.append(wal_put)
        txn.size = _size(wal_put)
        txn.holds_wal = True
    return txn


def _operations(
    partition: _Partition, state: CommitState, keys: Keys, txn: PlannedTxn
) -> tuple[list[Compare], list[Put]]:
    """What ``partition`` adds to ``txn``: its compares (with the topic's, if ``txn`` has none
    yet) and its puts."""
    topic, number = partition.pid
    compares = []
    if topic not in txn.topics:
        stored_topic = state.topics.get(topic)
        assert stored_topic is not None  # a committing partition's topic exists
        compares.append(Compare(keys.topic(topic), mod_revision=stored_topic.mod_revision))
    stored = state.partitions.get(partition.pid)
    partition_key = keys.partition(topic, number)
    compares.append(Compare(partition_key, mod_revision=stored.mod_revision if stored else 0))
    assert partition.leader is not None  # a committing partition is ours
    compares.append(leadership.fence(keys, topic, number, partition.leader))
    assert partition.updated is not None
    puts = [Put(partition_key, records.encode(partition.updated))]
    puts += [
        Put(keys.segment(topic, number, chunk.chunk.base_offset), records.encode(chunk.chunk))
        for _, chunk in partition.committing
    ]
    return compares, puts


def _fits(txn: PlannedTxn, compares: list[Compare], puts: list[Put], limits: Limits) -> bool:
    ops = max(len(txn.compares) + len(compares), len(txn.puts) + len(puts))
    size = txn.size + _sizes(compares, puts)
    return ops <= limits.max_ops and size <= limits.max_bytes


def _size(op: Compare | Put) -> int:
    value = op.value if isinstance(op, Put) else b""
    return len(op.key.encode()) + len(value) + OP_OVERHEAD


def _sizes(compares: list[Compare], puts: list[Put]) -> int:
    return sum(map(_size, compares)) + sum(map(_size, puts))


def compaction_refusal(request: CommitCompaction, replaced: Sequence[SegmentRecord]) -> str | None:
    """Why ``request`` cannot replace ``replaced`` (the partition's entries whose base offsets
    lie in ``first_base..last_offset``, in offset order), or None: they must be chunks covering
    exactly that range, contiguously, and the segment (a spec segment, or a chunk of a merged
    object) must hold that range."""
    segment, first, last = request.segment, request.first_base, request.last_offset
    if (segment.base_offset, segment.last_offset) != (first, last):
        return (
            f"the segment holds {segment.base_offset}..{segment.last_offset}, not {first}..{last}"
        )
    if not replaced or replaced[0].base_offset != first:
        return f"no entry starts at {first}"
    next_offset = first
    for entry in replaced:
        if not entry.is_chunk:
            return f"the entry at {entry.base_offset} is a segment, not a chunk"
        if entry.base_offset != next_offset:
            return f"the entries have a gap or an overlap at {entry.base_offset}"
        next_offset = entry.last_offset + 1
    if next_offset != last + 1:
        return f"the entries end at {next_offset - 1}, not {last}"
    return None
