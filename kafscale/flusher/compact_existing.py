"""What the compactor does when the spec key of the segment it built already holds an object.

Pure: decided from the object found, the chunks being compacted (records and bytes) and the
record committed under that key. Compaction builds deterministic bytes, so a retry after a crash
between PUT and commit finds its own object: the same bytes, used as they are. A retry may
however plan a different run from the same first chunk (more chunks arrived meanwhile, or memory
ran short): then the object found is

- a segment of the first ``k`` of our chunks, byte for byte (an earlier, shorter attempt): it is
  used as it is, and the compaction commits those ``k`` chunks (``Adopt``);
- a segment built by a compactor from the same first chunk (same base offset, codec and created
  time: the first chunk's) but of other chunks: an earlier attempt no record references, replaced
  (``Replace``). Only the partition's owner compacts it, so no other writer can be about to commit
  it (issue 16's ownership fences a stale one);
- anything else is judged as the flusher judges a segment key (``kafscale.flusher.collision``): a
  deleted topic's leftover is replaced, the rest is a conflict, never overwritten (``Conflict``).

A key whose record is already a spec segment was compacted by an earlier attempt whose answer was
lost: the caller checks that before asking here, and never replaces such an object.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kafscale.flusher import collision
from kafscale.flusher.collision import Verdict
from kafscale.metadata.records import SegmentRecord
from kafscale.storage import segment as segments


@dataclass(frozen=True, slots=True)
class Adopt:
    chunks: int  # how many of our chunks the object holds (from the first)
    created_ms: int


@dataclass(frozen=True, slots=True)
class Replace:
    reason: str


@dataclass(frozen=True, slots=True)
class Conflict:
    reason: str


Decision = Adopt | Replace | Conflict


def judge(
    existing: bytes,
    ours: bytes,
    chunks: Sequence[SegmentRecord],
    data: Sequence[bytes],
    topic_created_ms: int,
) -> Decision:
    """The decision on ``existing`` found under the key of ``ours``, the segment built from
    ``chunks`` (whose batch bytes are ``data``, in order). ``topic_created_ms``: the topic's
    creation time from its metadata record (0 when unknown)."""
    if existing == ours:
        return Adopt(len(chunks), chunks[0].created_ms)
    try:
        theirs = segments.parse_segment(existing)
    except segments.CorruptSegment:
        theirs = None
    first = chunks[0]
    if theirs is not None and (theirs.base_offset, theirs.flags) == (
        first.base_offset,
        first.codec,
    ):
        count = _chunks_held(theirs, chunks, data)
        if count:
            return Adopt(count, theirs.created_ms)
        if theirs.created_ms == first.created_ms:
            return Replace("an earlier compaction of the same first chunk that was never committed")
    judgement = collision.judge_segment(existing, ours, None, topic_created_ms)
    if judgement.verdict is Verdict.REPLACE:
        return Replace(judgement.reason)
    return Conflict(judgement.reason)


def _chunks_held(
    theirs: segments.Segment, chunks: Sequence[SegmentRecord], data: Sequence[bytes]
) -> int:
    """How many of our chunks, from the first, ``theirs`` holds exactly (0: not a prefix)."""
    body = theirs.body
    position = 0
    for count, (chunk, chunk_data) in enumerate(zip(chunks, data, strict=True), start=1):
        end = position + len(chunk_data)
        if end > len(body) or body[position:end] != chunk_data:
            return 0
        position = end
        if chunk.last_offset == theirs.last_offset:
            return count if position == len(body) else 0
    return 0
