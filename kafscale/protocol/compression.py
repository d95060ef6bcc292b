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

At most ``MAX_FRAMES`` concatenated gzip members, lz4 frames or zstd frames are read (each costs
a decoder and a copy of what follows it). Decompression is bounded: ``decompress`` stops once the
output would pass ``limit`` bytes and raises ``DecompressedTooLarge`` (a zstd frame of 32 KB can
hold 1 GiB of zeros). Every codec runs in C, fed so that a bomb costs little more than the bound
and usually far less: gzip and lz4 yield their output in pieces of at most ``PIECE_BYTES``, a
snappy block declares its length up front, and a zstd frame is walked block by block (RFC 8878
section 3.1.1: each block says how much it yields, at most 128 KiB): a frame whose blocks may pass
the bound is first decoded holding one block at a time and counted, and decoded for real only if
it fits. No declared content size is trusted (``lz4.frame.decompress`` would allocate a forged
one).

``read_limit`` is the bound for readers that do not know the topic's ``max.message.bytes``
(Fetch-side tools, ListOffsets, the Spark reader): ``DEFAULT_FACTOR`` times the larger of Kafka's
default max.message.bytes and the batch itself. Produce uses the topic's own value
(``kafscale.protocol.validate``).
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

__all__ = [
    "DEFAULT_FACTOR",
    "Bytes",
    "Codec",
    "CorruptCompressedData",
    "DecompressedTooLarge",
    "compress",
    "decompress",
    "read_limit",
]

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


class DecompressedTooLarge(CorruptCompressedData):
    """A records section that decompresses to more than the bound it was given."""

    def __init__(self, codec: str, limit: int) -> None:
        super().__init__(f"{codec}: decompresses to more than {limit} bytes")
        self.limit = limit


#: How many times max.message.bytes a batch may decompress to (KAFSCALE_MAX_DECOMPRESSION_FACTOR).
DEFAULT_FACTOR = 64
#: Kafka's default max.message.bytes (1 MiB + the 12-byte log overhead).
KAFKA_MAX_MESSAGE_BYTES = 1024 * 1024 + 12


def read_limit(batch_size: int, factor: int = DEFAULT_FACTOR) -> int:
    """The decompression bound for a stored batch of ``batch_size`` bytes whose topic's
    max.message.bytes is unknown: at least what Produce allows under Kafka's default."""
    return factor * max(KAFKA_MAX_MESSAGE_BYTES, batch_size)


#: Java's Deflater.DEFAULT_COMPRESSION, what Kafka's gzip uses unless a level is configured.
GZIP_DEFAULT_LEVEL = 6

#: xerial's stream header: magic, then the format version and the oldest reader it needs (both 1).
XERIAL_HEADER = struct.Struct(">8sii")
XERIAL_MAGIC = b"\x82SNAPPY\x00"
XERIAL_VERSION = 1
#: SnappyOutputStream's default block size, which Kafka's Java client keeps.
XERIAL_BLOCK_BYTES = 32 * 1024
XERIAL_CHUNK_LENGTH = struct.Struct(">i")

#: zlib's window bits for a gzip member (16 + the largest window).
GZIP_WBITS = 16 + zlib.MAX_WBITS

#: zstd framing (RFC 8878): frame magics and the block types, little-endian.
_U32LE = struct.Struct("<I")
ZSTD_MAGIC = 0xFD2FB528
ZSTD_SKIPPABLE_MAGIC, ZSTD_SKIPPABLE_MASK = 0x184D2A50, 0xFFFFFFF0
ZSTD_BLOCK_RLE, ZSTD_BLOCK_COMPRESSED, ZSTD_BLOCK_RESERVED = 1, 2, 3
ZSTD_BLOCK_MAX = 128 * 1024  # Block_Maximum_Size: no block yields more
#: gzip and lz4 output is taken in pieces of at most this: a bomb stops one piece past the bound.
PIECE_BYTES = 1024 * 1024
#: Concatenated gzip members, lz4 frames or zstd frames (skippable ones included) one records
#: section may hold. Every maintained client writes one; each further one costs a decoder and a
#: copy of the input left, so thousands of tiny ones would cost seconds (quadratic in the size).
MAX_FRAMES = 64


def _count_frame(codec: str, frames: int) -> int:
    """``frames`` + 1, or raise once a records section holds more than ``MAX_FRAMES``."""
    if frames >= MAX_FRAMES:
        raise CorruptCompressedData(f"{codec}: more than {MAX_FRAMES} concatenated frames")
    return frames + 1


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


def decompress(codec: int, data: Bytes, limit: int) -> bytes:
    """The bytes ``data`` decompresses to under ``codec``; raise ``CorruptCompressedData`` if it
    is not valid ``codec`` output (including an unknown codec id from a batch's attributes), and
    ``DecompressedTooLarge`` as soon as the output passes ``limit`` bytes."""
    if codec == Codec.NONE:
        if len(data) > limit:
            raise DecompressedTooLarge("none", limit)
        return bytes(data)
    if codec == Codec.GZIP:
        return _gzip_decompress(memoryview(data), limit)
    if codec == Codec.SNAPPY:
        return _snappy_decompress(memoryview(data), limit)
    if codec == Codec.LZ4:
        return _lz4_decompress(data, limit)
    if codec == Codec.ZSTD:
        return _zstd_decompress(memoryview(data), limit)
    raise CorruptCompressedData(f"unknown compression codec {codec}")


def _gzip_decompress(view: memoryview, limit: int) -> bytes:
    if not view:
        raise CorruptCompressedData("empty gzip data")
    pieces: list[bytes] = []
    produced = members = 0
    rest: Bytes = view
    while rest:
        members = _count_frame("gzip", members)
        member = zlib.decompressobj(GZIP_WBITS)
        data: Bytes = rest
        while not member.eof:
            want = min(PIECE_BYTES, limit - produced + 1)
            try:
                piece = member.decompress(data, want)
            except zlib.error as exc:
                raise CorruptCompressedData(f"gzip: {exc}") from exc
            pieces.append(piece)
            produced += len(piece)
            if produced > limit:
                raise DecompressedTooLarge("gzip", limit)
            data = member.unconsumed_tail
            if not data and len(piece) < want and not member.eof:
                raise CorruptCompressedData("gzip: truncated member")
        rest = member.unused_data
        if not rest.strip(b"\0"):
            break  # zero padding after the last member is allowed, as Java and Python allow it
    return b"".join(pieces)


def _xerial_compress(data: Bytes) -> bytes:
    view = memoryview(data)
    out = bytearray(XERIAL_HEADER.pack(XERIAL_MAGIC, XERIAL_VERSION, XERIAL_VERSION))
    for start in range(0, len(view), XERIAL_BLOCK_BYTES):
        block = snappy.compress(view[start : start + XERIAL_BLOCK_BYTES])
        out += XERIAL_CHUNK_LENGTH.pack(len(block))
        out += block
    return bytes(out)


def _snappy_decompress(view: memoryview, limit: int) -> bytes:
    if bytes(view[: len(XERIAL_MAGIC)]) != XERIAL_MAGIC:
        return _snappy_block(view, limit, 0)
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
        out += _snappy_block(view[pos : pos + length], limit, len(out))
        pos += length
    return bytes(out)


def _snappy_block(block: memoryview, limit: int, produced: int) -> bytes:
    """One raw snappy block, after ``produced`` bytes of output. Its preamble (a little-endian
    base-128 varint) is the exact size it decompresses to, which snappy allocates and then
    checks: judged before anything runs."""
    length = shift = 0
    for i in range(min(len(block), 5)):
        length |= (block[i] & 0x7F) << shift
        if block[i] < 0x80:
            break
        shift += 7
    else:
        raise CorruptCompressedData("snappy: no block length")
    if produced + length > limit:
        raise DecompressedTooLarge("snappy", limit)
    try:
        return bytes(snappy.uncompress(block))
    except snappy.UncompressError as exc:
        raise CorruptCompressedData(f"snappy: {exc.__cause__ or exc}") from exc


def _lz4_decompress(data: Bytes, limit: int) -> bytes:
    rest = bytes(data)
    if not rest:
        raise CorruptCompressedData("lz4: empty data")
    pieces: list[bytes] = []
    produced = frames = 0
    while rest:
        frames = _count_frame("lz4", frames)
        frame = lz4.frame.LZ4FrameDecompressor()
        given = rest
        while not frame.eof:
            want = min(PIECE_BYTES, limit - produced + 1)
            try:
                piece = frame.decompress(given, max_length=want)
            except RuntimeError as exc:
                raise CorruptCompressedData(f"lz4: {exc}") from exc
            pieces.append(piece)
            produced += len(piece)
            if produced > limit:
                raise DecompressedTooLarge("lz4", limit)
            given = b""  # the decompressor keeps what it has not used yet
            if frame.needs_input and not frame.eof:
                raise CorruptCompressedData("lz4: truncated frame")
        rest = frame.unused_data or b""
    return b"".join(pieces)


def _zstd_decompress(view: memoryview, limit: int) -> bytes:
    if not view:
        raise CorruptCompressedData("zstd: empty data")
    pieces: list[bytes] = []
    produced = frames = 0
    pos = 0
    while pos < len(view):
        frames = _count_frame("zstd", frames)
        end, blocks = _zstd_frame(view, pos)
        if blocks:  # not a skippable frame
            if produced + sum(most for _, most in blocks) > limit:
                # It may not fit: count what it yields first, holding one block at a time.
                _zstd_count(view[pos:end], blocks, pos, limit - produced, limit)
            decoder = zstandard.ZstdDecompressor().decompressobj()
            try:
                piece = decoder.decompress(view[pos:end])
            except zstandard.ZstdError as exc:
                raise CorruptCompressedData(f"zstd: {exc}") from exc
            if not decoder.eof or decoder.unused_data:
                raise CorruptCompressedData(f"zstd: frame at {pos} does not end at {end}")
            pieces.append(piece)
            produced += len(piece)
            if produced > limit:
                raise DecompressedTooLarge("zstd", limit)
        pos = end
    return b"".join(pieces) if len(pieces) != 1 else pieces[0]


def _zstd_count(
    frame: memoryview, blocks: list[tuple[int, int]], pos: int, budget: int, limit: int
) -> None:
    """Decode ``frame`` block by block, keeping nothing: raise ``DecompressedTooLarge`` as soon
    as it yields more than ``budget`` bytes (so a bomb costs one block of memory, not the
    bound), ``CorruptCompressedData`` if it does not decode."""
    decoder = zstandard.ZstdDecompressor().decompressobj()
    start = 0
    yielded = 0
    try:
        for block_end, _ in blocks:
            yielded += len(decoder.decompress(frame[start : block_end - pos]))
            if yielded > budget:
                raise DecompressedTooLarge("zstd", limit)
            start = block_end - pos
    except zstandard.ZstdError as exc:
        raise CorruptCompressedData(f"zstd: {exc}") from exc


def _zstd_frame(view: memoryview, pos: int) -> tuple[int, list[tuple[int, int]]]:
    """Where the zstd frame at ``pos`` ends, and each block's end and the most it yields (none
    for a skippable frame). Only the framing is read: RFC 8878 sections 3.1.1 and 3.1.2."""
    if len(view) - pos < 8:
        raise CorruptCompressedData(f"zstd: {len(view) - pos} bytes at {pos} cannot hold a frame")
    (magic,) = _U32LE.unpack_from(view, pos)
    if magic & ZSTD_SKIPPABLE_MASK == ZSTD_SKIPPABLE_MAGIC:
        (size,) = _U32LE.unpack_from(view, pos + 4)
        if pos + 8 + size > len(view):
            raise CorruptCompressedData(f"zstd: skippable frame at {pos} overruns the data")
        return pos + 8 + size, []
    if magic != ZSTD_MAGIC:
        raise CorruptCompressedData(f"zstd: no frame magic at {pos}")
    descriptor = view[pos + 4]
    content_size_bytes = (0, 2, 4, 8)[descriptor >> 6]
    single_segment = descriptor & 0x20
    if not content_size_bytes and single_segment:
        content_size_bytes = 1
    at = pos + 5 + (0 if single_segment else 1) + (0, 1, 2, 4)[descriptor & 0x03]
    at += content_size_bytes
    blocks = []
    last = False
    while not last:
        if at + 3 > len(view):
            raise CorruptCompressedData(f"zstd: frame at {pos} ends inside a block header")
        header = view[at] | view[at + 1] << 8 | view[at + 2] << 16
        last, kind, size = bool(header & 1), header >> 1 & 0x03, header >> 3
        if kind == ZSTD_BLOCK_RESERVED or size > ZSTD_BLOCK_MAX:
            raise CorruptCompressedData(f"zstd: invalid block header at {at}")
        at += 3 + (1 if kind == ZSTD_BLOCK_RLE else size)
        # raw and RLE blocks yield exactly their size; a compressed block at most 128 KiB
        blocks.append((at, ZSTD_BLOCK_MAX if kind == ZSTD_BLOCK_COMPRESSED else size))
    end = at + (4 if descriptor & 0x04 else 0)  # the content checksum
    if end > len(view):
        raise CorruptCompressedData(f"zstd: frame at {pos} overruns the data")
    return end, blocks
