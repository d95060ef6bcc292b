"""Write-ahead objects (``.wal``): key names, building, parsing, verifying.

Sans-io: bytes in, values out. One flush cycle of one broker uploads one object holding a
**chunk** (a run of record batches) of every partition it had pending
(docs/design/write-path.md, section 2). All integers are big-endian, like the ``.kfs`` format::

    header (32)   "KWAL" | version u16 = 1 | flags u16 = 0 | created ms i64 | entry count N u32
                  | directory size D u32 | CRC32C of the directory u32 | reserved u32 = 0
    directory (D) N entries: topic id (16 UUID bytes) | topic name length L u16 | topic name
                  (L bytes of UTF-8) | partition i32 | base offset i64 | last offset i64
                  | chunk position i64 | chunk size u32 | record count i32 | max timestamp i64
                  | codec u8 | created ms i64 | CRC32C of the chunk u32
    chunks        the chunks' batches, in directory order, back to back: chunk 0 starts at 32 + D
    footer (16)   CRC32C of every chunk byte u32 | object size u64 | "END!"

Invariants, every violation reported as ``CorruptObject`` naming the field and its position:
both magics, version 1, flags and reserved 0, a directory of exactly N entries filling exactly D
bytes under its CRC32C, chunks tiling the bytes between the directory and the footer with no gap
or overlap, and a footer object size equal to the object's length. ``verify`` adds every chunk's
CRC32C, the footer CRC32C, and that each chunk's batches frame it exactly with offsets contiguous
from its base to its last offset and the entry's record count. The one field no check covers is
the header's ``created_ms`` (informational: each entry carries its own).
"""

from __future__ import annotations

import dataclasses
import re
import secrets
import struct
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

import crc32c

from kafscale.storage.segment import BATCH_HEADER_SIZE, CODEC_NAMES, read_batch_header

WAL_PREFIX = "!wal"  # '!' is not a topic name character: no topic prefix ever lists a WAL object
OBJECT_MAGIC = b"KWAL"
FOOTER_MAGIC = b"END!"
FORMAT_VERSION = 1

_HEADER = struct.Struct(">4sHHqIIII")  # magic, version, flags, created, N, D, dir crc, reserved
_ENTRY_HEAD = struct.Struct(">16sH")  # topic id, topic name length
# partition, base, last, position, size, records, max timestamp, codec, created, chunk crc
_ENTRY_TAIL = struct.Struct(">iqqqIiqBqI")
FOOTER = struct.Struct(">IQ4s")  # CRC32C of the chunks, object size, magic
HEADER_SIZE = _HEADER.size  # 32
FOOTER_SIZE = FOOTER.size  # 16
_ENTRY_FIXED = _ENTRY_HEAD.size + _ENTRY_TAIL.size  # 75 bytes besides the topic name

_INT32_MAX = 2**31 - 1
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_UINT32_MAX = 2**32 - 1
_SEQ_MAX = 10**10 - 1  # ten digits in the key
_TOKEN = re.compile(r"[0-9a-f]{16}")
_KEY = re.compile(
    r"(?P<namespace>[^/]+)/!wal/(?P<broker>0|[1-9][0-9]*)/(?P<token>[0-9a-f]{16})"
    r"/(?P<seq>[0-9]{10})\.wal"
)


class CorruptObject(Exception):
    """A write-ahead object that fails to parse or verify; the message says what and where."""


@dataclass(frozen=True, slots=True)
class WalKey:
    namespace: str
    broker_id: int
    token: str
    seq: int


@dataclass(frozen=True, slots=True)
class ChunkInput:
    """One chunk to build: a partition's batches (offsets ``base_offset..last_offset``, in
    order) and the fields its directory entry carries."""

    topic: str
    topic_id: str  # UUID, canonical text form
    partition: int
    base_offset: int
    last_offset: int
    records: int
    max_timestamp: int
    codec: int
    created_ms: int
    batches: Sequence[bytes | memoryview] = field(repr=False)


@dataclass(frozen=True, slots=True)
class DirectoryEntry:
    """One parsed directory entry: where a chunk lies (``position`` from byte 0 of the object,
    ``size`` bytes) and what it holds."""

    topic: str
    topic_id: str
    partition: int
    base_offset: int
    last_offset: int
    position: int
    size: int
    records: int
    max_timestamp: int
    codec: int
    created_ms: int
    crc: int


@dataclass(frozen=True, slots=True)
class Header:
    version: int
    flags: int
    created_ms: int
    entry_count: int
    directory_size: int
    directory_crc: int


@dataclass(frozen=True, slots=True)
class ParsedObject:
    """A parsed object: header, directory, one view per chunk (in directory order), and the
    footer's CRC of all chunk bytes. Views share the parsed bytes (no copy)."""

    header: Header
    entries: tuple[DirectoryEntry, ...]
    chunks: tuple[memoryview, ...] = field(repr=False, compare=False)
    chunks_crc: int
    size: int


# --- keys -------------------------------------------------------------------------------------


def wal_prefix(namespace: str) -> str:
    """The key prefix under which every broker's write-ahead objects list."""
    if not namespace or "/" in namespace:
        raise ValueError(f"invalid namespace {namespace!r}: must be non-empty without '/'")
    return f"{namespace}/{WAL_PREFIX}/"


def broker_prefix(namespace: str, broker_id: int) -> str:
    """The key prefix of one broker's write-ahead objects (every flusher incarnation)."""
    if not 0 <= broker_id <= _INT32_MAX:
        raise ValueError(f"invalid broker id {broker_id}")
    return f"{wal_prefix(namespace)}{broker_id}/"


def new_token() -> str:
    """16 random hex digits: one flusher incarnation's part of its object keys."""
    return secrets.token_hex(8)


def object_key(namespace: str, broker_id: int, token: str, seq: int) -> str:
    """``{namespace}/!wal/{broker_id}/{token}/{seq:010d}.wal``: key order is ``seq`` order."""
    if not _TOKEN.fullmatch(token):
        raise ValueError(f"invalid token {token!r}: must be 16 lowercase hex digits")
    if not 0 <= seq <= _SEQ_MAX:
        raise ValueError(f"invalid sequence number {seq}")
    return f"{broker_prefix(namespace, broker_id)}{token}/{seq:010d}.wal"


def parse_object_key(key: str) -> WalKey | None:
    """The parts of a write-ahead object key, or None if ``key`` is not one we would write."""
    match = _KEY.fullmatch(key)
    if match is None or int(match["broker"]) > _INT32_MAX:
        return None
    return WalKey(match["namespace"], int(match["broker"]), match["token"], int(match["seq"]))


def object_name(key: str) -> str:
    """``{broker}/{token}/{seq:010d}`` of an object key: the name its ``WalRecord`` is kept
    under (``Keys.wal_object``). ValueError if ``key`` is not a write-ahead object key."""
    parts = parse_object_key(key)
    if parts is None:
        raise ValueError(f"{key!r} is not a write-ahead object key")
    return f"{parts.broker_id}/{parts.token}/{parts.seq:010d}"


# --- building ---------------------------------------------------------------------------------


def _check_chunk(number: int, chunk: ChunkInput) -> bytes:
    """The chunk's encoded topic name, after checking its fields fit the format; ValueError
    naming the chunk otherwise."""
    where = f"chunk {number} ({chunk.topic}-{chunk.partition})"
    name = chunk.topic.encode()
    if not 0 < len(name) <= 0xFFFF:
        raise ValueError(f"{where}: topic name of {len(name)} bytes")
    if not 0 <= chunk.partition <= _INT32_MAX:
        raise ValueError(f"{where}: invalid partition")
    if not 0 <= chunk.base_offset <= chunk.last_offset <= _INT64_MAX:
        raise ValueError(f"{where}: invalid offsets {chunk.base_offset}..{chunk.last_offset}")
    if not 0 <= chunk.records <= _INT32_MAX or chunk.codec not in CODEC_NAMES:
        raise ValueError(f"{where}: invalid record count {chunk.records} or codec {chunk.codec}")
    for name_, value in (("max timestamp", chunk.max_timestamp), ("created", chunk.created_ms)):
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise ValueError(f"{where}: {name_} {value} does not fit in an int64")
    if not chunk.batches or sum(map(len, chunk.batches)) > _UINT32_MAX:
        raise ValueError(f"{where}: a chunk needs one or more batches, at most 4 GiB")
    return name


def build_object(
    chunks: Sequence[ChunkInput], created_ms: int
) -> tuple[bytes, list[DirectoryEntry]]:
    """The object holding ``chunks`` in the order given, and the directory entries saying
    where each landed. Batch bytes are copied once, into the object. ValueError if a chunk's
    fields do not fit the format or disagree with its batches (framing, offsets, record count):
    what it returns passes ``parse_object(verify=True)``."""
    if not _INT64_MIN <= created_ms <= _INT64_MAX:
        raise ValueError(f"created ms {created_ms} does not fit in an int64")
    names = [_check_chunk(number, chunk) for number, chunk in enumerate(chunks)]
    directory_size = sum(_ENTRY_FIXED + len(name) for name in names)
    position = HEADER_SIZE + directory_size
    entries: list[DirectoryEntry] = []
    rows: list[bytes] = []
    total_crc = 0
    for chunk, name in zip(chunks, names, strict=True):
        crc, size = 0, 0
        for batch in chunk.batches:
            crc = crc32c.crc32c(batch, crc)
            total_crc = crc32c.crc32c(batch, total_crc)
            size += len(batch)
        entry = DirectoryEntry(
            chunk.topic, str(uuid.UUID(chunk.topic_id)), chunk.partition, chunk.base_offset,
            chunk.last_offset, position, size, chunk.records, chunk.max_timestamp, chunk.codec,
            chunk.created_ms, crc,
        )  # fmt: skip
        entries.append(entry)
        rows.append(_ENTRY_HEAD.pack(uuid.UUID(chunk.topic_id).bytes, len(name)) + name)
        rows.append(_ENTRY_TAIL.pack(*dataclasses.astuple(entry)[2:]))
        position += size
    directory = b"".join(rows)
    size = position + FOOTER_SIZE
    header = _HEADER.pack(
        OBJECT_MAGIC, FORMAT_VERSION, 0, created_ms, len(entries), directory_size,
        crc32c.crc32c(directory), 0,
    )  # fmt: skip
    footer = FOOTER.pack(total_crc, size, FOOTER_MAGIC)
    batches = [batch for chunk in chunks for batch in chunk.batches]
    data = b"".join([header, directory, *batches, footer])
    for number, entry in enumerate(entries):
        chunk_view = memoryview(data)[entry.position : entry.position + entry.size]
        if problem := _batches_problem(chunk_view, entry):
            raise ValueError(f"chunk {number} ({entry.topic}-{entry.partition}): {problem}")
    return data, entries


# --- parsing ----------------------------------------------------------------------------------


def parse_header(data: bytes | memoryview) -> Header:
    """The header in the first 32 bytes of ``data`` (more may follow)."""
    if len(data) < HEADER_SIZE:
        raise CorruptObject(f"object is {len(data)} bytes, less than its 32-byte header")
    magic, version, flags, created_ms, count, size, crc, reserved = _HEADER.unpack_from(data)
    if magic != OBJECT_MAGIC:
        raise CorruptObject(f"header at position 0: magic {magic!r}, expected b'KWAL'")
    if version != FORMAT_VERSION:
        raise CorruptObject(f"header at position 4: unsupported version {version}")
    if flags != 0 or reserved != 0:
        raise CorruptObject(f"header: flags {flags} (position 6), reserved {reserved} (28): not 0")
    if count * _ENTRY_FIXED > size:
        raise CorruptObject(
            f"header at position 16: {count} entries cannot fit a directory of {size} bytes"
        )
    return Header(version, flags, created_ms, count, size, crc)


def directory_length(header: Header) -> int:
    """Bytes from the start of the object to the end of its directory (one ranged GET)."""
    return HEADER_SIZE + header.directory_size


def parse_directory(data: bytes | memoryview, verify: bool = True) -> list[DirectoryEntry]:
    """The directory entries; ``data`` holds at least the header and directory. Checks the
    directory's framing and that chunks follow each other from the directory's end (not where
    the last one ends: that needs the footer, see ``parse_object``); ``verify`` (leave it on
    unless printing a damaged object) adds the directory's CRC32C."""
    return list(_parse_directory(memoryview(data).cast("B"), parse_header(data), verify))


def _parse_directory(
    view: memoryview, header: Header, verify: bool = True
) -> tuple[DirectoryEntry, ...]:
    end = directory_length(header)
    if len(view) < end:
        raise CorruptObject(
            f"{len(view)} bytes do not hold the header and {end - 32}-byte directory"
        )
    computed = crc32c.crc32c(view[HEADER_SIZE:end])
    if verify and computed != header.directory_crc:
        raise CorruptObject(
            f"header at position 24: directory CRC32C stored {header.directory_crc:#010x}, "
            f"computed {computed:#010x}"
        )
    entries: list[DirectoryEntry] = []
    at, chunk_at = HEADER_SIZE, end
    for number in range(header.entry_count):
        entry, at = _parse_entry(view, at, end, number)
        if entry.position != chunk_at:
            raise CorruptObject(
                f"directory entry {number}: chunk at position {entry.position}, expected {chunk_at}"
                " (chunks follow each other from the directory's end)"
            )
        entries.append(entry)
        chunk_at = entry.position + entry.size
    if at != end:
        raise CorruptObject(f"directory: {end - at} bytes left after its {len(entries)} entries")
    return tuple(entries)


def _parse_entry(view: memoryview, at: int, end: int, number: int) -> tuple[DirectoryEntry, int]:
    where = f"directory entry {number} at position {at}"
    if end - at < _ENTRY_FIXED:
        raise CorruptObject(
            f"{where}: {end - at} bytes left, an entry needs {_ENTRY_FIXED} or more"
        )
    topic_id, length = _ENTRY_HEAD.unpack_from(view, at)
    name_at = at + _ENTRY_HEAD.size
    if end - name_at < length + _ENTRY_TAIL.size:
        raise CorruptObject(f"{where}: a {length}-byte topic name overruns the directory")
    try:
        topic = str(view[name_at : name_at + length], "utf-8")
    except UnicodeDecodeError as exc:
        raise CorruptObject(f"{where}: topic name is not UTF-8 ({exc.reason})") from None
    tail = _ENTRY_TAIL.unpack_from(view, name_at + length)
    entry = DirectoryEntry(topic, str(uuid.UUID(bytes=topic_id)), *tail)
    if (
        not topic
        or entry.partition < 0
        or not 0 <= entry.base_offset <= entry.last_offset
        or entry.size == 0
        or entry.records < 0
        or entry.codec not in CODEC_NAMES
    ):
        raise CorruptObject(f"{where}: invalid fields {entry}")
    return entry, name_at + length + _ENTRY_TAIL.size


def parse_object(data: bytes | memoryview, verify: bool = True) -> ParsedObject:
    """Parse a whole object without copying it. Framing is always checked; ``verify`` adds the
    chunk and footer CRCs and each chunk's batch framing (see the module docstring)."""
    view = memoryview(data).cast("B")
    header = parse_header(view)
    size = len(view)
    if size < directory_length(header) + FOOTER_SIZE:
        raise CorruptObject(f"object is {size} bytes, less than its header, directory and footer")
    chunks_crc, stated_size, magic = FOOTER.unpack_from(view, size - FOOTER_SIZE)
    if magic != FOOTER_MAGIC:
        raise CorruptObject(f"footer at position {size - 4}: magic {magic!r}, expected b'END!'")
    if stated_size != size:
        raise CorruptObject(
            f"footer at position {size - 12}: object size {stated_size}, the object has {size} "
            "bytes (truncated or trailing bytes?)"
        )
    entries = _parse_directory(view, header)
    chunks_end = entries[-1].position + entries[-1].size if entries else directory_length(header)
    if chunks_end != size - FOOTER_SIZE:
        raise CorruptObject(
            f"chunks end at position {chunks_end}, the footer starts at {size - FOOTER_SIZE}"
        )
    chunks = tuple(view[entry.position : entry.position + entry.size] for entry in entries)
    if verify:
        for number, (entry, chunk) in enumerate(zip(entries, chunks, strict=True)):
            _verify_chunk(number, entry, chunk)
        computed = crc32c.crc32c(view[directory_length(header) : size - FOOTER_SIZE])
        if computed != chunks_crc:
            raise CorruptObject(
                f"footer at position {size - FOOTER_SIZE}: CRC32C of the chunks stored "
                f"{chunks_crc:#010x}, computed {computed:#010x}"
            )
    return ParsedObject(header, entries, chunks, chunks_crc, size)


def _verify_chunk(number: int, entry: DirectoryEntry, chunk: memoryview) -> None:
    where = f"chunk {number} ({entry.topic}-{entry.partition}) at position {entry.position}"
    computed = crc32c.crc32c(chunk)
    if computed != entry.crc:
        raise CorruptObject(f"{where}: CRC32C stored {entry.crc:#010x}, computed {computed:#010x}")
    if problem := _batches_problem(chunk, entry):
        raise CorruptObject(f"{where}: {problem}")


def _batches_problem(chunk: memoryview, entry: DirectoryEntry) -> str:
    """What is wrong with the batches of a chunk ("" if nothing): they must frame it exactly,
    offsets contiguous from the entry's base to its last offset, with the entry's record count."""
    at, expected, records = 0, entry.base_offset, 0
    while at < len(chunk):
        if len(chunk) - at < BATCH_HEADER_SIZE:
            return f"{len(chunk) - at} bytes at chunk byte {at} are no batch header"
        batch = read_batch_header(chunk, at)
        if (
            batch.magic != 2
            or batch.base_offset != expected
            or batch.last_offset_delta < 0
            or not BATCH_HEADER_SIZE <= batch.size <= len(chunk) - at
        ):
            return (
                f"batch at chunk byte {at}: magic {batch.magic}, offsets {batch.base_offset}.."
                f"{batch.last_offset}, {batch.size} bytes of {len(chunk) - at} left; expected "
                f"magic 2 from offset {expected}"
            )
        at, expected = at + batch.size, batch.last_offset + 1
        records += batch.records_count
    if expected != entry.last_offset + 1 or records != entry.records:
        return (
            f"batches end at offset {expected - 1} with {records} records, "
            f"the directory says {entry.last_offset} and {entry.records}"
        )
    return ""
