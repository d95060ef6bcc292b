import contextlib
import gzip
import os
import struct

import lz4.frame
import pytest
import snappy
import zstandard
from hypothesis import given
from hypothesis import strategies as st

from kafscale.protocol.compression import (
    MAX_FRAMES,
    XERIAL_BLOCK_BYTES,
    Codec,
    CorruptCompressedData,
    DecompressedTooLarge,
    compress,
    decompress,
)
from kafscale.protocol.errors import DecodeError

LIMIT = 1 << 30


def _decompress(codec: int, data: bytes | bytearray | memoryview) -> bytes:
    return decompress(codec, data, LIMIT)


CODECS = list(Codec)
COMPRESSED = [codec for codec in Codec if codec != Codec.NONE]
SMALL = b"kafscale " * 11
# Half incompressible, half repetitive: several snappy and lz4 blocks of both kinds.
MIB = os.urandom(512 * 1024) + bytes(range(256)) * 2048

# What Java's xerial SnappyOutputStream writes first, as Kafka's client captured it (magic,
# version 1, compatible version 1): see test_records.py's JAVA_BATCHES.
XERIAL_HEADER = b"\x82SNAPPY\x00" + b"\x00\x00\x00\x01" * 2


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("data", [b"", SMALL, MIB], ids=["empty", "small", "1MiB"])
def test_round_trip(codec: Codec, data: bytes) -> None:
    for given_as in (data, bytearray(data), memoryview(data)):
        compressed = compress(codec, given_as)
        assert isinstance(compressed, bytes)
        assert _decompress(codec, compressed) == data
        assert _decompress(codec, memoryview(compressed)) == data


@pytest.mark.parametrize("codec", COMPRESSED)
def test_levels_round_trip(codec: Codec) -> None:
    for level in (1, 9):
        assert _decompress(codec, compress(codec, MIB, level)) == MIB


def test_unknown_codec() -> None:
    with pytest.raises(ValueError):
        compress(5, b"x")
    with pytest.raises(CorruptCompressedData):
        _decompress(7, b"x")


def _xerial_chunks(data: bytes) -> list[int]:
    assert data[:16] == XERIAL_HEADER
    lengths, pos = [], 16
    while pos < len(data):
        (length,) = struct.unpack_from(">i", data, pos)
        lengths.append(length)
        pos += 4 + length
    assert pos == len(data)
    return lengths


def test_snappy_writes_xerial_framing_in_32k_blocks() -> None:
    compressed = compress(Codec.SNAPPY, MIB)
    assert len(_xerial_chunks(compressed)) == len(MIB) // XERIAL_BLOCK_BYTES
    assert _xerial_chunks(compress(Codec.SNAPPY, b"")) == []


def test_snappy_reads_xerial_and_raw() -> None:
    raw = snappy.compress(SMALL)
    assert not raw.startswith(b"\x82SNAPPY")
    assert _decompress(Codec.SNAPPY, raw) == SMALL
    xerial = XERIAL_HEADER + struct.pack(">i", len(raw)) + raw
    assert _decompress(Codec.SNAPPY, xerial) == SMALL
    # xerial's reader also takes concatenated streams, each with its own header.
    assert _decompress(Codec.SNAPPY, xerial + compress(Codec.SNAPPY, MIB)) == SMALL + MIB


def test_snappy_interoperates_with_python_clients() -> None:
    from aiokafka import codec as aiokafka_codec
    from kafka import codec as kafka_codec

    for data in (SMALL, MIB):
        assert aiokafka_codec.snappy_decode(compress(Codec.SNAPPY, data)) == data
        assert kafka_codec.snappy_decode(compress(Codec.SNAPPY, data)) == data
        assert _decompress(Codec.SNAPPY, aiokafka_codec.snappy_encode(data)) == data
        assert _decompress(Codec.SNAPPY, kafka_codec.snappy_encode(data)) == data
        raw = aiokafka_codec.snappy_encode(data, xerial_compatible=False)
        assert _decompress(Codec.SNAPPY, raw) == data


def test_lz4_writes_what_kafkas_reader_reads() -> None:
    # Kafka's Lz4BlockInputStream decompresses each block alone (KIP-57).
    info = lz4.frame.get_frame_info(compress(Codec.LZ4, MIB))
    assert info["block_linked"] is False
    assert info["block_size"] == 64 * 1024
    assert info["content_checksum"] is False
    assert info["block_checksum"] is False


def test_lz4_reads_linked_blocks_checksums_and_concatenated_frames() -> None:
    linked = lz4.frame.compress(MIB, block_linked=True, content_checksum=True, store_size=True)
    assert _decompress(Codec.LZ4, linked) == MIB
    assert _decompress(Codec.LZ4, linked + compress(Codec.LZ4, SMALL)) == MIB + SMALL


def test_lz4_forged_content_size_is_not_trusted() -> None:
    # lz4.frame.decompress would allocate the declared 1 TiB before noticing the lie.
    compressor = lz4.frame.LZ4FrameCompressor(auto_flush=True)
    end_mark = b"\x00" * 4  # written by hand: the compressor's flush() refuses the lie
    frame = compressor.begin(source_size=1 << 40) + compressor.compress(SMALL) + end_mark
    assert lz4.frame.get_frame_info(frame)["content_size"] == 1 << 40
    with pytest.raises(CorruptCompressedData):
        _decompress(Codec.LZ4, frame)


def test_zstd_writes_content_size_and_reads_frames_without_it() -> None:
    assert zstandard.get_frame_parameters(compress(Codec.ZSTD, MIB)).content_size == len(MIB)
    unsized = zstandard.ZstdCompressor(write_content_size=False).compress(MIB)
    streaming = zstandard.ZstdCompressor().compressobj()
    streamed = streaming.compress(SMALL) + streaming.flush()
    for frame in (unsized, streamed):
        assert zstandard.get_frame_parameters(frame).content_size == zstandard.CONTENTSIZE_UNKNOWN
    assert _decompress(Codec.ZSTD, unsized) == MIB
    assert _decompress(Codec.ZSTD, streamed) == SMALL
    assert _decompress(Codec.ZSTD, unsized + compress(Codec.ZSTD, SMALL)) == MIB + SMALL


def test_gzip_reads_concatenated_members() -> None:
    assert _decompress(Codec.GZIP, gzip.compress(SMALL) + gzip.compress(MIB)) == SMALL + MIB


@pytest.mark.parametrize("codec", COMPRESSED)
def test_empty_input_is_corrupt(codec: Codec) -> None:
    with pytest.raises(CorruptCompressedData):
        _decompress(codec, b"")


@pytest.mark.parametrize("codec", [Codec.GZIP, Codec.LZ4, Codec.ZSTD])
def test_every_truncation_is_corrupt(codec: Codec) -> None:
    compressed = compress(codec, SMALL * 3)
    for cut in range(len(compressed)):
        with pytest.raises(CorruptCompressedData):
            _decompress(codec, compressed[:cut])


def test_snappy_truncation_inside_a_chunk_is_corrupt() -> None:
    # xerial has no end marker: a cut at a chunk boundary is a shorter valid stream.
    compressed = compress(Codec.SNAPPY, MIB[:100_000])
    boundaries, pos = {len(XERIAL_HEADER)}, len(XERIAL_HEADER)
    for length in _xerial_chunks(compressed):
        pos += 4 + length
        boundaries.add(pos)
    for cut in range(len(XERIAL_HEADER), len(compressed), 97):
        if cut not in boundaries:
            with pytest.raises(CorruptCompressedData):
                _decompress(Codec.SNAPPY, compressed[:cut])
    with pytest.raises(CorruptCompressedData):
        _decompress(Codec.SNAPPY, snappy.compress(SMALL)[:-1])


def test_corrupt_is_a_decode_error() -> None:
    assert issubclass(CorruptCompressedData, DecodeError)


@given(codec=st.sampled_from(COMPRESSED), data=st.binary(max_size=512))
def test_garbage_raises_only_the_decode_error(codec: Codec, data: bytes) -> None:
    with contextlib.suppress(CorruptCompressedData):  # anything else fails the test
        _decompress(codec, data)


@given(
    codec=st.sampled_from(COMPRESSED),
    edits=st.lists(st.tuples(st.integers(min_value=0), st.integers(0, 255)), min_size=1),
)
def test_damaged_frames_raise_only_the_decode_error(
    codec: Codec, edits: list[tuple[int, int]]
) -> None:
    damaged = bytearray(compress(codec, SMALL * 20))
    for position, byte in edits:
        damaged[position % len(damaged)] = byte
    with contextlib.suppress(CorruptCompressedData):
        _decompress(codec, damaged)


@given(codec=st.sampled_from(CODECS), data=st.binary(max_size=4096))
def test_round_trip_property(codec: Codec, data: bytes) -> None:
    assert _decompress(codec, compress(codec, data)) == data


# -- the output bound ---------------------------------------------------------------------------


@pytest.mark.parametrize("codec", CODECS)
def test_the_bound_is_exact(codec: Codec) -> None:
    compressed = compress(codec, MIB)
    assert decompress(codec, compressed, len(MIB)) == MIB
    with pytest.raises(DecompressedTooLarge) as raised:
        decompress(codec, compressed, len(MIB) - 1)
    assert raised.value.limit == len(MIB) - 1
    assert isinstance(raised.value, CorruptCompressedData)  # callers that catch it are safe


@pytest.mark.parametrize("codec", COMPRESSED)
def test_the_bound_holds_across_concatenated_frames(codec: Codec) -> None:
    twice = compress(codec, SMALL) + compress(codec, SMALL)
    if codec == Codec.SNAPPY:
        twice = compress(codec, SMALL + SMALL)  # xerial: chunks in one stream
    assert decompress(codec, twice, 2 * len(SMALL)) == SMALL * 2
    with pytest.raises(DecompressedTooLarge):
        decompress(codec, twice, 2 * len(SMALL) - 1)


@pytest.mark.parametrize("codec", [Codec.GZIP, Codec.LZ4, Codec.ZSTD])
def test_at_most_max_frames_concatenated_frames_are_read(codec: Codec) -> None:
    """Thousands of tiny frames would cost a decoder and a copy of the rest each (seconds for a
    few MiB); every maintained client writes one frame, so past MAX_FRAMES it is refused."""
    frame = compress(codec, SMALL)
    assert decompress(codec, frame * MAX_FRAMES, LIMIT) == SMALL * MAX_FRAMES
    with pytest.raises(CorruptCompressedData, match=f"more than {MAX_FRAMES} concatenated"):
        decompress(codec, frame * (MAX_FRAMES + 1), LIMIT)
    # 4 MiB of empty frames: refused after MAX_FRAMES of them, not walked to the end.
    empty = compress(codec, b"")
    with pytest.raises(CorruptCompressedData, match="concatenated"):
        decompress(codec, empty * (4 * 1024 * 1024 // len(empty)), LIMIT)


def _zstd_rle_bomb(blocks: int) -> bytes:
    """A frame of ``blocks`` RLE blocks of 128 KiB zeros: 4 input bytes per block."""
    out = bytearray(struct.pack("<I", 0xFD2FB528) + bytes([0x00, 7 << 3]))
    for i in range(blocks):
        out += struct.pack("<I", (128 * 1024) << 3 | 2 | (i == blocks - 1))[:3] + b"\x00"
    return bytes(out)


def test_a_zstd_bomb_stops_one_block_past_the_bound() -> None:
    bomb = _zstd_rle_bomb(8192)  # 32 KiB that would be 1 GiB
    assert len(bomb) < 33_000
    assert len(decompress(Codec.ZSTD, _zstd_rle_bomb(8), 1 << 20)) == 1 << 20
    with pytest.raises(DecompressedTooLarge):
        decompress(Codec.ZSTD, bomb, 1 << 20)


@pytest.mark.parametrize("codec", [Codec.GZIP, Codec.LZ4, Codec.ZSTD])
def test_compressor_made_bombs_are_refused(codec: Codec) -> None:
    bomb = compress(codec, bytes(64 << 20))  # 64 MiB of zeros in a few KiB or less
    assert len(bomb) < 300_000
    with pytest.raises(DecompressedTooLarge):
        decompress(codec, bomb, 1 << 20)


def test_a_snappy_block_is_judged_by_its_declared_length() -> None:
    block = snappy.compress(bytes(1 << 20))
    with pytest.raises(DecompressedTooLarge):
        decompress(Codec.SNAPPY, block, (1 << 20) - 1)
    forged = b"\xff\xff\xff\xff\x0f" + block[3:]  # claims 4 GiB
    with pytest.raises(DecompressedTooLarge):
        decompress(Codec.SNAPPY, forged, 1 << 30)


def test_zstd_skippable_frames_and_checksums_are_read() -> None:
    skippable = struct.pack("<II", 0x184D2A53, 3) + b"abc"
    checked = zstandard.ZstdCompressor(write_checksum=True).compress(SMALL)
    assert decompress(Codec.ZSTD, skippable + checked + skippable, len(SMALL)) == SMALL
    with pytest.raises(CorruptCompressedData):
        decompress(Codec.ZSTD, checked[:-1], LIMIT)
    with pytest.raises(CorruptCompressedData):
        decompress(Codec.ZSTD, skippable[:-1], LIMIT)


def test_gzip_zero_padding_after_the_last_member_is_allowed() -> None:
    assert decompress(Codec.GZIP, gzip.compress(SMALL) + bytes(8), LIMIT) == SMALL
    with pytest.raises(CorruptCompressedData):
        decompress(Codec.GZIP, gzip.compress(SMALL) + b"xyz", LIMIT)


@given(codec=st.sampled_from(COMPRESSED), data=st.binary(max_size=2048), cut=st.integers(0, 64))
def test_bounded_decompression_agrees_with_unbounded(codec: Codec, data: bytes, cut: int) -> None:
    compressed = compress(codec, data)
    limit = len(data) - cut
    if limit < 0:
        return  # a negative bound: nothing to judge
    if cut == 0:
        assert decompress(codec, compressed, limit) == data
    else:
        with pytest.raises(DecompressedTooLarge):
            decompress(codec, compressed, limit)
