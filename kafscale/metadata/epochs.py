"""A partition's leader epoch history: pure functions over ``PartitionRecord.epochs``.

The history is Kafka's leader-epoch checkpoint: ``(epoch, start_offset)`` pairs, epochs strictly
increasing, start offsets non-decreasing, where ``start_offset`` is the first offset written at
that epoch (the high watermark when the epoch's owner claimed the partition). KafScale never
truncates committed data, so an entry is never rewritten: claims append (``started``), retention
forgets what lies wholly before the log start (``truncated``). OffsetForLeaderEpoch answers from it
(``end_offset_for``) the way Kafka's ``LeaderEpochFileCache.endOffsetFor`` does, which is what
clients' truncation detection (KIP-320) expects; ListOffsets names the epoch of the offset it
finds (``epoch_for_offset``, Kafka's ``epochForOffset``).

A record written before epochs existed has no history but a leader epoch (0): ``history`` reads
it as one epoch starting at the log start.
"""

from __future__ import annotations

from collections.abc import Sequence

UNDEFINED_EPOCH = -1
UNDEFINED_OFFSET = -1

History = list[tuple[int, int]]


def history(epochs: Sequence[Sequence[int]], leader_epoch: int, log_start_offset: int) -> History:
    """The record's history, or the one epoch an older record implies."""
    if epochs:
        return [(int(e), int(s)) for e, s in epochs]
    return [(leader_epoch, log_start_offset)]


def started(entries: History, epoch: int, start_offset: int) -> History:
    """The history once ``epoch`` starts at ``start_offset``. An earlier epoch that starts at the
    same offset wrote nothing and is dropped (as Kafka's cache does), which keeps the history of a
    partition that moves often while idle short."""
    if entries and epoch <= entries[-1][0]:
        raise ValueError(f"epoch {epoch} does not follow {entries[-1][0]}")
    if entries and start_offset < entries[-1][1]:
        raise ValueError(f"epoch {epoch} starts at {start_offset}, before {entries[-1]}")
    kept = [(e, s) for e, s in entries if s < start_offset]
    return [*kept, (epoch, start_offset)]


def truncated(entries: History, log_start_offset: int) -> History:
    """The history without the epochs that ended at or before ``log_start_offset``: the last
    epoch starting at or before it is kept (it covers the log start)."""
    first = 0
    for index, (_, start) in enumerate(entries):
        if start <= log_start_offset:
            first = index
    return entries[first:]


def end_offset_for(entries: History, requested: int, log_end_offset: int) -> tuple[int, int]:
    """(epoch, end offset) for OffsetForLeaderEpoch: the largest epoch at or below ``requested``
    and the offset where the next one starts (the log end for the current epoch). An epoch newer
    than every known one, or ``UNDEFINED_EPOCH``, is (-1, -1); one older than every known one is
    answered with itself and the first known epoch's start."""
    if requested == UNDEFINED_EPOCH or not entries:
        return UNDEFINED_EPOCH, UNDEFINED_OFFSET
    if requested == entries[-1][0]:
        return requested, log_end_offset
    higher = next(((e, s) for e, s in entries if e > requested), None)
    if higher is None:
        return UNDEFINED_EPOCH, UNDEFINED_OFFSET
    floor = [(e, s) for e, s in entries if e <= requested]
    if not floor:
        return requested, higher[1]
    return floor[-1][0], higher[1]


def epoch_for_offset(entries: History, offset: int) -> int:
    """The epoch that wrote ``offset``: the last one starting at or before it; -1 before the
    first (start offsets are distinct: ``started`` keeps them so)."""
    found = UNDEFINED_EPOCH
    for epoch, start in entries:
        if start > offset:
            break
        found = epoch
    return found
