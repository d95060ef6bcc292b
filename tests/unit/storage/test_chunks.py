"""Bare record batches (a write-ahead object's chunk, or a range of a segment) verified alone."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafscale.protocol import records
from kafscale.protocol.compression import Codec
from kafscale.storage.chunks import verify_chunk, walk_batches
from kafscale.storage.segment import CorruptSegment

OBJECT = "ns/!wal/0/00000000000000ab/0000000007.wal"


def batches(first: int, sizes: list[int], codec: int = Codec.NONE) -> list[bytes]:
    out, offset = [], first
    for count in sizes:
        rows: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]], int]] = [
            (None, f"v{offset + i}".encode(), [], 1_000 + offset + i) for i in range(count)
        ]
        out.append(records.build_batch(rows, base_offset=offset, codec=codec))
        offset += count
    return out


@given(
    st.integers(0, 2**40),
    st.lists(st.integers(1, 20), min_size=1, max_size=8),
    st.sampled_from([Codec.NONE, Codec.GZIP, Codec.ZSTD]),
)
def test_a_chunk_walks_to_exactly_its_batches(first: int, sizes: list[int], codec: int) -> None:
    written = batches(first, sizes, codec)
    data = b"".join(written)
    spans = verify_chunk(data, OBJECT, 4096, first, first + sum(sizes) - 1)
    assert [bytes(data[s.position : s.position + s.length]) for s in spans] == written
    assert spans[0].base_offset == first and spans[-1].last_offset == first + sum(sizes) - 1


def test_a_flipped_byte_is_named_by_object_and_position() -> None:
    written = batches(100, [3, 3, 3])
    data = bytearray(b"".join(written))
    data[len(written[0]) + 70] ^= 0x01  # inside the second batch's records
    second = 4096 + len(written[0])
    with pytest.raises(CorruptSegment, match=f"{OBJECT}: batch at position {second} .*CRC32C"):
        walk_batches(bytes(data), OBJECT, 4096)


def test_offsets_must_continue_and_match_the_committed_record() -> None:
    gap = batches(0, [2]) + batches(5, [2])
    with pytest.raises(CorruptSegment, match="do not continue from 2"):
        walk_batches(b"".join(gap), OBJECT)
    data = b"".join(batches(10, [2, 2]))
    assert len(verify_chunk(data, OBJECT, 0, 10, 13)) == 2
    with pytest.raises(CorruptSegment, match=r"holds offsets 10\.\.13, committed as 10\.\.14"):
        verify_chunk(data, OBJECT, 0, 10, 14)
    with pytest.raises(CorruptSegment, match="holds no batch"):
        verify_chunk(b"", OBJECT, 64, 10, 13)


def test_truncated_or_trailing_bytes_are_refused() -> None:
    data = b"".join(batches(0, [4, 4]))
    with pytest.raises(CorruptSegment, match="claimed"):
        walk_batches(data[:-1], OBJECT)
    with pytest.raises(CorruptSegment, match="a batch header needs 61"):
        walk_batches(data + b"\0" * 10, OBJECT)
    with pytest.raises(CorruptSegment, match="no record batch"):
        walk_batches(data + b"\0" * 80, OBJECT)
