"""Bare record batches: a run of Kafka v2 batches stored without a segment's header and footer.

A chunk of a write-ahead object (docs/design/write-path.md section 2) is such a run, and so is
any byte range of a segment cut at batch boundaries. Readers fetch it with one ranged GET and
check here what bare batches allow (there is no footer CRC to check): the framing (magic 2,
every size inside the bytes, nothing left over), each batch's own CRC32C, and offsets that run on
without a gap; ``verify_chunk`` adds the offsets the chunk was committed with.

Sans-io: bytes in, spans out. Faults are ``CorruptSegment`` naming where the bytes came from
(an object key, given by the caller) and the object position of the batch at fault.
"""

from __future__ import annotations

from kafscale.storage import segment as segments
from kafscale.storage.segment import BatchSpan, CorruptSegment


def walk_batches(data: bytes | memoryview, where: str, position: int = 0) -> list[BatchSpan]:
    """The batches filling ``data``, read from object position ``position`` of ``where``, every
    CRC32C checked and offsets contiguous. Span positions count from the start of ``data``."""
    view = memoryview(data).cast("B")
    spans: list[BatchSpan] = []
    at = 0
    while at < len(view):
        here = f"{where}: batch at position {position + at}"
        if len(view) - at < segments.BATCH_HEADER_SIZE:
            raise CorruptSegment(
                f"{here}: {len(view) - at} bytes left, a batch header needs "
                f"{segments.BATCH_HEADER_SIZE}"
            )
        header = segments.read_batch_header(view, at)
        if header.magic != 2 or header.size < segments.BATCH_HEADER_SIZE:
            raise CorruptSegment(f"{here}: no record batch (magic {header.magic})")
        if at + header.size > len(view):
            raise CorruptSegment(
                f"{here}: {header.size} bytes claimed, {len(view) - at} left in the range read"
            )
        computed = segments.batch_crc(view[at : at + header.size])
        if computed != header.crc:
            raise CorruptSegment(
                f"{here} (offsets {header.base_offset}..{header.last_offset}) fails its CRC32C: "
                f"stored {header.crc:#010x}, computed {computed:#010x}"
            )
        expected = spans[-1].last_offset + 1 if spans else header.base_offset
        if header.base_offset != expected or header.last_offset_delta < 0:
            raise CorruptSegment(
                f"{here}: offsets {header.base_offset}..{header.last_offset} do not continue "
                f"from {expected}"
            )
        spans.append(BatchSpan(header.base_offset, header.last_offset, at, header.size))
        at += header.size
    return spans


def verify_chunk(
    data: bytes | memoryview, where: str, position: int, base_offset: int, last_offset: int
) -> list[BatchSpan]:
    """``walk_batches`` of a whole chunk, which must hold exactly the offsets
    ``base_offset..last_offset`` it was committed with."""
    spans = walk_batches(data, where, position)
    held = (spans[0].base_offset, spans[-1].last_offset) if spans else None
    if held != (base_offset, last_offset):
        found = f"offsets {held[0]}..{held[1]}" if held else "no batch"
        raise CorruptSegment(
            f"{where}: the chunk at position {position} holds {found}, "
            f"committed as {base_offset}..{last_offset}"
        )
    return spans
