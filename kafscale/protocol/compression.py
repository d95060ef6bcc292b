"""Kafka's record compression codecs, framed exactly as Kafka's clients write and read them.

Owns the codec ids of a v2 batch's attributes (bits 0-2) and ``compress``/``decompress`` of a
batch's records section. Invariants: ``decompress(c, compress(c, data)) == data`` for every codec;
what ``compress`` writes is read by Kafka's Java client, librdkafka and aiokafka; ``decompress``
accepts every framing a maintained client writes, and on malformed input raises
``CorruptCompressedData`` and nothing else.

- gzip (1): RFC 1952 members, as Java's GZIPOutputStream writes; concatenated members are read.
- snappy (2): Java clients write xerial's SnappyOutputStream framing (a 16-byte header, then
  length-prefixed raw snappy blocks of at most 32 KiB) and librdkafka writes the same; both also
  read a bare raw block, and so do we. python-snappy has no xerial support, so the framing is here.
  https://github.com/xerial/snappy-java/blob/master/src/main/java/org/xerial/snappy/SnappyOutputStream.java
- lz4 (3): the LZ4 frame format with independent 64 KiB blocks and no content checksum, as Kafka's
  Lz4BlockOutputStream writes: Kafka's reader decompresses every block on its own and cannot follow
  linked blocks (KIP-57, https://cwiki.apache.org/confluence/display/KAFKA/KIP-57).
- zstd (4): one frame with its content size; frames without one (Java's ZstdOutputStream,
  librdkafka's streaming writer) and concatenated frames are read too.

Decompression streams rather than trusting a declared content size, so a forged size in a frame
header cannot make us allocate it (``lz4.frame.decompress`` would).
"""

from __future__ import annotations

import enum
import gzip
import struct
import zlib

import lz4.frame
import snappy
import zstandard

from kafscale.protocol.errors import DecodeError

__all__ = ["Bytes", "Codec", "CorruptCompressedData", "compress", "decompress"]

Bytes = bytes | bytearray | memoryview


class Codec(enum.IntEnum):
    """Compression codec ids, the low three bits of a v2 batch's attributes."""

    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


class CorruptCompressedData(DecodeError):
    """A compressed records section that does not decompress under its codec."""


#: Java's Deflater.DEFAULT_COMPRESSION, what Kafka's gzip uses unless a level is configured.
GZIP_DEFAULT_LEVEL = 6

#: xerial's stream header: magic, then the format version and the oldest reader it needs (both 1).
XERIAL_HEADER = struct.Struct(">8sii")
XERIAL_MAGIC = b"\x82SNAPPY\x00"
XERIAL_VERSION = 1
#: SnappyOutputStream's default block size, which Kafka's Java client keeps.
XERIAL_BLOCK_BYTES = 32 * 1024
XERIAL_CHUNK_LENGTH = struct.Struct(">i")


def compress(codec: int, data: Bytes, level: int | None = None) -> bytes:
    """``data`` compressed with ``codec`` in Kafka's framing (``level`` None: codec default)."""
    if codec == Codec.NONE:
        return bytes(data)
    if codec == Codec.GZIP:
        # mtime=0: the same records always compress to the same bytes.
        return gzip.compress(data, GZIP_DEFAULT_LEVEL if level is None else level, mtime=0)
    if codec == Codec.SNAPPY:
        return _xerial_compress(data)
    if codec == Codec.LZ4:
        return bytes(
            lz4.frame.compress(
                data,
                compression_level=level or 0,
                block_size=lz4.frame.BLOCKSIZE_MAX64KB,
                block_linked=False,
                content_checksum=False,
                store_size=False,
            )
        )
    if codec == Codec.ZSTD:
        compressor = zstandard.ZstdCompressor(level=3 if level is None else level)
        return bytes(compressor.compress(data))
    raise ValueError(f"unknown compression codec {codec}")


def decompress(codec: int, data: Bytes) -> bytes:
    """The bytes ``data`` decompresses to under ``codec``; raise ``CorruptCompressedData`` if it
    is not valid ``codec`` output (including an unknown codec id from a batch's attributes)."""
    if codec == Codec.NONE:
        return bytes(data)
    if codec == Codec.GZIP:
        return _gzip_decompress(data)
    if codec == Codec.SNAPPY:
        return _snappy_decompress(data)
    if codec == Codec.LZ4:
        return _lz4_decompress(data)
    if codec == Codec.ZSTD:
        return _zstd_decompress(data)
    raise CorruptCompressedData(f"unknown compression codec {codec}")


def _gzip_decompress(data: Bytes) -> bytes:
    if not data:
        raise CorruptCompressedData("empty gzip data")
    try:
        return gzip.decompress(data)
    except (OSError, EOFError, zlib.error) as exc:
        raise CorruptCompressedData(f"gzip: {exc}") from exc


def _xerial_compress(data: Bytes) -> bytes:
    view = memoryview(data)
    out = bytearray(XERIAL_HEADER.pack(XERIAL_MAGIC, XERIAL_VERSION, XERIAL_VERSION))
    for start in range(0, len(view), XERIAL_BLOCK_BYTES):
        block = snappy.compress(view[start : start + XERIAL_BLOCK_BYTES])
        out += XERIAL_CHUNK_LENGTH.pack(len(block))
        out += block
    return bytes(out)


def _snappy_decompress(data: Bytes) -> bytes:
    view = memoryview(data)
    if bytes(view[: len(XERIAL_MAGIC)]) != XERIAL_MAGIC:
        return _snappy_block(view)
    out = bytearray()
    pos = 0
    while pos < len(view):
        # A xerial header may open every concatenated stream, not only the first.
        if bytes(view[pos : pos + len(XERIAL_MAGIC)]) == XERIAL_MAGIC:
            if len(view) - pos < XERIAL_HEADER.size:
                raise CorruptCompressedData("snappy: truncated xerial header")
            pos += XERIAL_HEADER.size
            continue
        if len(view) - pos < XERIAL_CHUNK_LENGTH.size:
            raise CorruptCompressedData("snappy: truncated xerial chunk length")
        (length,) = XERIAL_CHUNK_LENGTH.unpack_from(view, pos)
        pos += XERIAL_CHUNK_LENGTH.size
        if length < 0 or pos + length > len(view):
            raise CorruptCompressedData(f"snappy: xerial chunk of {length} bytes overruns the data")
        out += _snappy_block(view[pos : pos + length])
        pos += length
    return bytes(out)


def _snappy_block(block: memoryview) -> bytes:
    try:
        return bytes(snappy.uncompress(block))
    except snappy.UncompressError as exc:
        raise CorruptCompressedData(f"snappy: {exc.__cause__ or exc}") from exc


def _lz4_decompress(data: Bytes) -> bytes:
    rest = bytes(data)
    if not rest:
        raise CorruptCompressedData("lz4: empty data")
    out = bytearray()
    while rest:
        decompressor = lz4.frame.LZ4FrameDecompressor()
        try:
            out += decompressor.decompress(rest)
        except RuntimeError as exc:
            raise CorruptCompressedData(f"lz4: {exc}") from exc
        if not decompressor.eof:
            raise CorruptCompressedData("lz4: truncated frame")
        rest = decompressor.unused_data or b""
    return bytes(out)


def _zstd_decompress(data: Bytes) -> bytes:
    rest = bytes(data)
    if not rest:
        raise CorruptCompressedData("zstd: empty data")
    out = bytearray()
    while rest:
        decompressor = zstandard.ZstdDecompressor().decompressobj()
        try:
            out += decompressor.decompress(rest)
        except zstandard.ZstdError as exc:
            raise CorruptCompressedData(f"zstd: {exc}") from exc
        if not decompressor.eof:
            raise CorruptCompressedData("zstd: truncated frame")
        rest = decompressor.unused_data
    return bytes(out)
