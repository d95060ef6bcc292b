"""Hand-built record batches that lie, for the validator's and the read paths' tests.

Everything here writes bytes field by field (no kafscale code), so a test built on it checks our
reader against the format, not against our own writer.
"""

from __future__ import annotations

import struct

import crc32c

# attributes, last offset delta, first and max timestamp, producer id, epoch, sequence, count
_COVERED = struct.Struct(">hiqqqhii")
ZSTD_MAGIC = 0xFD2FB528
ZSTD_RLE_BLOCK_BYTES = 128 * 1024


def varint(n: int) -> bytes:
    """Kafka's zigzag varint (up to 64 bits)."""
    zigzag, out = (n << 1) ^ (n >> 63), bytearray()
    while zigzag > 0x7F:
        out.append(zigzag & 0x7F | 0x80)
        zigzag >>= 7
    return bytes(out + bytes([zigzag]))


def record(
    offset_delta: int,
    value: bytes | None = b"v",
    *,
    timestamp_delta: int = 0,
    key: bytes | None = None,
    headers: list[tuple[bytes | None, bytes | None]] | None = None,
    length: int | None = None,
    attributes: int = 0,
) -> bytes:
    """One record; ``length`` overrides its declared length (to make it lie)."""
    body = bytes([attributes]) + varint(timestamp_delta) + varint(offset_delta)
    for field in (key, value):
        body += varint(-1) if field is None else varint(len(field)) + field
    body += varint(len(headers or []))
    for name, header_value in headers or []:
        body += varint(-1) if name is None else varint(len(name)) + name
        body += varint(-1) if header_value is None else varint(len(header_value)) + header_value
    return varint(len(body) if length is None else length) + body


def batch(
    records_section: bytes,
    *,
    count: int,
    last_offset_delta: int | None = None,
    codec: int = 0,
    base_timestamp: int = 1_700_000_000_000,
    max_timestamp: int | None = None,
    attributes: int | None = None,
    producer_id: int = -1,
    base_sequence: int = -1,
    base_offset: int = 0,
) -> bytes:
    """A v2 batch around ``records_section`` (already compressed if ``codec`` says so), with
    its batch length and CRC right whatever else lies."""
    covered = (
        _COVERED.pack(
            codec if attributes is None else attributes,
            count - 1 if last_offset_delta is None else last_offset_delta,
            base_timestamp,
            base_timestamp if max_timestamp is None else max_timestamp,
            producer_id,
            -1,
            base_sequence,
            count,
        )
        + records_section
    )
    prefix = struct.pack(">qiib", base_offset, len(covered) + 9, -1, 2)
    return prefix + struct.pack(">I", crc32c.crc32c(covered)) + covered


def zstd_bomb(output_bytes: int) -> bytes:
    """A zstd frame of RLE blocks of zeros that decompresses to ``output_bytes`` (a multiple of
    128 KiB): 4 bytes of input per 128 KiB of output, so 1 GiB takes 32 KiB."""
    blocks = output_bytes // ZSTD_RLE_BLOCK_BYTES
    # frame header: no content size, not single segment, window 128 KiB (exponent 7)
    out = bytearray(struct.pack("<I", ZSTD_MAGIC) + bytes([0x00, 7 << 3]))
    rle = ZSTD_RLE_BLOCK_BYTES << 3 | 1 << 1
    for i in range(blocks):
        out += struct.pack("<I", rle | (i == blocks - 1))[:3] + b"\x00"
    return bytes(out)
