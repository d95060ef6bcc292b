"""The merged chunks a plan's seals need, read with few ranged GETs
(docs/design/write-path.md, section 11.2).

Every merged object holds a chunk of each partition it merged, side by side in (topic,
partition) order, and the planner batches seals of neighbouring partitions: so the chunks one
plan needs from an object mostly touch or lie close. ``coalesce`` (pure) groups them into
ranges, one GET each; ``read_range`` reads one range and cuts it into chunks, each checked as a
single chunk's read would be (``verify_chunk``): batch framing, every batch's CRC32C, the
chunk's first offset and size.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from kafscale.metadata.records import SegmentRecord
from kafscale.storage import chunks
from kafscale.storage.objects import ObjectStore
from kafscale.storage.segment import CorruptSegment

MAX_GAP = 1 << 20  # bytes between two chunks that are read rather than paid a GET for
MAX_RANGE = 64 << 20  # bytes one ranged GET may bring

ChunkAt = tuple[str, int]  # a chunk's object and position: what a read result is keyed by


class ChunkUnreadable(Exception):
    """The bytes read are not the chunk's batches (the object changed or is corrupt)."""


@dataclass(frozen=True, slots=True)
class Range:
    """Bytes ``[start, end)`` of ``object``, holding ``chunks`` (in position order)."""

    object: str
    start: int
    end: int
    chunks: tuple[SegmentRecord, ...]


def coalesce(
    chunks: Iterable[SegmentRecord], max_gap: int = MAX_GAP, max_range: int = MAX_RANGE
) -> list[Range]:
    """The ranges to GET for ``chunks`` (each once, whatever the number of times it is named):
    per object, chunks in position order; one joins the range before it when it starts at most
    ``max_gap`` bytes after the range's end and the range stays within ``max_range`` bytes (a
    chunk bigger than that is a range of its own)."""
    by_object: dict[str, dict[int, SegmentRecord]] = {}
    for chunk in chunks:
        by_object.setdefault(chunk.object, {})[chunk.position] = chunk
    out: list[Range] = []
    for name in sorted(by_object):
        start, end, taken = 0, 0, list[SegmentRecord]()
        for position in sorted(by_object[name]):
            chunk = by_object[name][position]
            chunk_end = position + chunk.size
            if taken and position - end <= max_gap and max(end, chunk_end) - start <= max_range:
                end = max(end, chunk_end)
                taken.append(chunk)
                continue
            if taken:
                out.append(Range(name, start, end, tuple(taken)))
            start, end, taken = position, chunk_end, [chunk]
        if taken:
            out.append(Range(name, start, end, tuple(taken)))
    return out


def read_range(objects: ObjectStore, found: Range) -> dict[ChunkAt, bytes]:
    """The chunks of ``found`` read with one ranged GET, each verified. Raises ObjectNotFound
    (the object is gone: compacted or deleted meanwhile), ObjectStoreError, or ChunkUnreadable
    for the first chunk that does not verify."""
    data = memoryview(objects.get(found.object, found.start, found.end - found.start))
    out: dict[ChunkAt, bytes] = {}
    for chunk in found.chunks:
        at = chunk.position - found.start
        out[(chunk.object, chunk.position)] = verify_chunk(chunk, data[at : at + chunk.size])
    return out


def verify_chunk(chunk: SegmentRecord, data: bytes | memoryview) -> bytes:
    """``data`` as the bytes of ``chunk`` once they are its size and its batches
    (``kafscale.storage.chunks.verify_chunk``: framing, every CRC32C, exactly the offsets it was
    committed with); else ChunkUnreadable."""
    if len(data) != chunk.size:
        raise ChunkUnreadable(
            f"{chunk.object}@{chunk.position}: {len(data)} bytes, committed as {chunk.size}"
        )
    try:
        chunks.verify_chunk(
            data, chunk.object, chunk.position, chunk.base_offset, chunk.last_offset
        )
    except CorruptSegment as exc:
        raise ChunkUnreadable(str(exc)) from None
    return bytes(data)


# Merged chunks read for a plan's seals, by (object, position): the bytes, or why not.
Found = dict[ChunkAt, bytes | Exception]


def read_all(
    objects: ObjectStore,
    chunks: Iterable[SegmentRecord],
    run: Callable[[Callable[[Range], None], list[Range]], object],
) -> Found:
    """``chunks`` read with the ranges ``coalesce`` gives, ``run(read, ranges)`` calling
    ``read`` for each (on a pool: at once). A range that fails is that failure for each of its
    chunks: only the seals needing them fail, as they would have reading alone."""
    out: Found = {}

    def read(found: Range) -> None:
        try:
            out.update(read_range(objects, found))
        except Exception as exc:
            out.update({(chunk.object, chunk.position): exc for chunk in found.chunks})

    run(read, coalesce(chunks))
    return out


def take(objects: ObjectStore, chunk: SegmentRecord, found: Found) -> bytes:
    """``chunk``'s bytes as ``read_all`` found them (read alone if it was not asked for: the
    partition changed between the plan and its reads); raises what reading it raised."""
    got = found.get((chunk.object, chunk.position))
    if got is None:
        alone = Range(chunk.object, chunk.position, chunk.position + chunk.size, (chunk,))
        got = read_range(objects, alone)[(chunk.object, chunk.position)]
    if isinstance(got, Exception):
        raise got
    return got
