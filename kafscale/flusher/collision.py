"""What the flusher does when a segment key it uploads to already holds other bytes.

Pure: decided from the object found, the object we built, and the metadata -- the segment record
committed under that base offset (if any) and the creation time of the topic as its metadata
record has it -- never from a timestamp guess alone. Invariants:

- A committed object (a segment record references its key) is never deleted or rewritten.
- Identical bytes are ours: an earlier attempt whose answer was lost, or the same buffer flushed
  again (a restarted shard re-sending what its previous incarnation had sent).
- The same batches under another header time are ours too (the same buffer, sealed again): the
  object already holds exactly our records, so it is used as it is.
- An object no record references is replaced only when it provably belongs to a deleted topic
  of the same name: it was sealed before the current topic was created. An object of the current
  topic that no record references yet may be another writer's upload whose commit is still on its
  way: replacing it could leave that commit pointing at our bytes, so it is left alone.
- Anything else is a conflict: refused loudly, the object untouched, the shard keeps its buffer.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from kafscale.metadata.records import SegmentRecord
from kafscale.storage import segment as segments


class Verdict(enum.Enum):
    OURS = "ours"  # the object holds our records: use it, commit (or find it committed)
    REPLACE = "replace"  # a deleted topic's leftover that no record references
    CONFLICT = "conflict"  # someone else's segment: never touch it


@dataclass(frozen=True, slots=True)
class Judgement:
    verdict: Verdict
    reason: str


def judge_segment(
    existing: bytes, ours: bytes, committed: SegmentRecord | None, topic_created_ms: int
) -> Judgement:
    """The verdict on ``existing``, found under the key of our segment ``ours``. ``committed``
    is the segment record under that base offset, ``topic_created_ms`` the creation time of the
    topic we flush for, from its metadata record (0 when unknown: then nothing is replaced)."""
    if existing == ours:
        return Judgement(Verdict.OURS, "the same bytes")
    try:
        theirs = segments.parse_segment(existing)
        mine = segments.parse_segment(ours, verify=False)
    except segments.CorruptSegment as exc:
        if committed is not None:
            return Judgement(Verdict.CONFLICT, f"a committed segment that does not parse: {exc}")
        return _uncommitted(None, topic_created_ms, f"an object that does not parse ({exc})")
    if _same_records(theirs, mine):
        return Judgement(Verdict.OURS, "the same records, sealed at another time")
    if committed is not None:
        return Judgement(
            Verdict.CONFLICT,
            f"a committed segment with other records (offsets {committed.base_offset}-"
            f"{committed.last_offset}, {committed.size} bytes)",
        )
    return _uncommitted(theirs.created_ms, topic_created_ms, "an uncommitted segment")


def _uncommitted(sealed_ms: int | None, topic_created_ms: int, what: str) -> Judgement:
    if sealed_ms is not None and topic_created_ms > 0 and sealed_ms < topic_created_ms:
        return Judgement(
            Verdict.REPLACE,
            f"{what} sealed at {sealed_ms}, before the topic was created at {topic_created_ms}: "
            "a leftover of a deleted topic of the same name",
        )
    return Judgement(
        Verdict.CONFLICT,
        f"{what} of this topic that no record references (another writer's upload, "
        "perhaps still to be committed)",
    )


def _same_records(theirs: segments.Segment, mine: segments.Segment) -> bool:
    return (
        theirs.base_offset == mine.base_offset
        and theirs.last_offset == mine.last_offset
        and theirs.record_count == mine.record_count
        and theirs.flags == mine.flags
        and theirs.body == mine.body
    )


def may_replace_index(committed: SegmentRecord | None) -> bool:
    """Whether an index with other bytes than ours may be replaced once our segment is in place:
    only while no record references it (an index follows its segment; a committed one stays)."""
    return committed is None
