"""``kafscale segments dump <file-or-key>``: the operator's view of one stored object.

``dump`` prints every header, batch and footer field of a ``.kfs`` object (or the entries of an
``.index``), checks every CRC and decodes every batch's records (decompression bounded by
``compression.read_limit``), reporting each failure by name instead of stopping at the first: a
batch a broker stored without validating it (e.g. attributes that name another codec than its
body's) is found here. Given a write-ahead object (``.wal``) it prints the header, each directory
entry with its chunk's CRC check and the footer, and with ``--records`` each chunk's batches and
records as for a segment. It never raises on bad bytes: whatever cannot be parsed is printed as
the problem. ``main`` reads a local file, or else the argument as a key of the configured object
store; it exits 0 when everything verified, 1 when something did not, 2 when the object could not
be read. ``kafscale segments list`` (``inspect_log``) shows a partition's committed log.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
from collections.abc import Sequence
from typing import TextIO

import crc32c

from kafscale.protocol import records
from kafscale.protocol.errors import DecodeError
from kafscale.storage import segment as fmt
from kafscale.storage import wal

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


def format_ms(ms: int) -> str:
    """Unix milliseconds, exactly, with their UTC time (-1: none)."""
    if ms == -1:
        return "-1 (none)"
    try:  # exact milliseconds: no float rounding
        moment = _EPOCH + datetime.timedelta(milliseconds=ms)
    except OverflowError:
        return f"{ms} ms"
    return f"{ms} ms ({moment.isoformat(timespec='milliseconds').replace('+00:00', 'Z')})"


def _verdict(stored: int, computed: int) -> str:
    if stored == computed:
        return f"crc {stored:#010x} ok"
    return f"crc {stored:#010x} BAD (computed {computed:#010x})"


def _print_header(data: bytes, out: TextIO) -> None:
    magic, version, flags, base_offset, count, created_ms, reserved = fmt.HEADER.unpack_from(data)
    codec = fmt.CODEC_NAMES.get(flags, "unknown")
    print(
        f"header: magic {magic!r}, version {version}, flags {flags} (codec {codec}), "
        f"base offset {base_offset}, records {count}, created {format_ms(created_ms)}, "
        f"reserved {reserved}",
        file=out,
    )


def _print_batch(number: int, span: fmt.BatchSpan, data: memoryview, out: TextIO) -> bool:
    batch = fmt.read_batch_header(data, span.position)
    computed = fmt.batch_crc(data[span.position : span.position + span.length])
    attributes = batch.attributes
    print(
        f"batch {number} at position {span.position} ({span.length} bytes): "
        f"offsets {span.base_offset}..{span.last_offset}, {batch.records_count} records, "
        f"{_verdict(batch.crc, computed)}\n"
        f"    codec {fmt.CODEC_NAMES.get(batch.codec, 'unknown')}, "
        f"timestamp type {'LogAppendTime' if attributes & 0x08 else 'CreateTime'}, "
        f"first timestamp {format_ms(batch.base_timestamp)}, "
        f"max timestamp {format_ms(batch.max_timestamp)}\n"
        f"    producer id {batch.producer_id} epoch {batch.producer_epoch} "
        f"base sequence {batch.base_sequence}, "
        f"transactional {'yes' if attributes & 0x10 else 'no'}, "
        f"control {'yes' if attributes & 0x20 else 'no'}, "
        f"leader epoch {batch.partition_leader_epoch}",
        file=out,
    )
    decoded, verdict = _decode(data[span.position : span.position + span.length])
    print(f"    records: {verdict}", file=out)
    return batch.crc == computed and decoded


def _decode(batch: memoryview) -> tuple[bool, str]:
    """Whether the batch's records decode, and what to print about it."""
    try:
        count = sum(1 for _ in records.iter_records(batch))
    except DecodeError as exc:
        return False, f"DO NOT DECODE: {exc}"
    return True, f"{count} decoded"


def _dump_segment(data: bytes, out: TextIO) -> bool:
    print(f"segment: {len(data)} bytes", file=out)
    if len(data) >= fmt.HEADER_SIZE:
        _print_header(data, out)
    try:
        segment = fmt.parse_segment(data, verify=False)
    except fmt.CorruptSegment as exc:
        print(f"cannot read the batches: {exc}", file=out)
        return False
    ok = True
    for number, span in enumerate(segment.batches):
        ok = _print_batch(number, span, segment.data, out) and ok
    footer_crc = crc32c.crc32c(segment.body)
    print(
        f"footer: {_verdict(segment.crc, footer_crc)} over {len(segment.body)} batch bytes, "
        f"last offset {segment.last_offset}, magic {fmt.FOOTER_MAGIC!r}",
        file=out,
    )
    ok = ok and footer_crc == segment.crc
    try:
        fmt.parse_segment(data, verify=True)
    except fmt.CorruptSegment as exc:
        # the first problem in reading order; offsets and counts are only checked here
        print(f"verification: {exc}", file=out)
        ok = False
    return ok


def _dump_index(data: bytes, out: TextIO) -> bool:
    print(f"index: {len(data)} bytes", file=out)
    try:
        index = fmt.parse_index(data)
    except fmt.CorruptSegment as exc:
        print(f"cannot read the index: {exc}\nresult: VERIFICATION FAILED", file=out)
        return False
    print(
        f"header: version {index.version}, {len(index.entries)} entries, "
        f"interval {index.interval} records",
        file=out,
    )
    for number, entry in enumerate(index.entries):
        print(f"entry {number}: offset {entry.offset} at position {entry.position}", file=out)
    print(
        "result: well-formed (an index has no CRC: rebuild it from its segment to check it)",
        file=out,
    )
    return True


def _chunk_spans(view: memoryview, entry: wal.DirectoryEntry) -> tuple[list[fmt.BatchSpan], str]:
    """The batches framing a chunk (positions from byte 0 of the object), and what stopped the
    walk before the chunk's end ("" if nothing did)."""
    spans: list[fmt.BatchSpan] = []
    position, end = entry.position, entry.position + entry.size
    while position < end:
        try:
            batch = fmt.read_batch_header(view[:end], position)
        except fmt.CorruptSegment as exc:
            return spans, str(exc)
        if batch.magic != 2 or not fmt.BATCH_HEADER_SIZE <= batch.size <= end - position:
            return spans, (
                f"batch at position {position}: magic {batch.magic}, {batch.size} bytes claimed, "
                f"{end - position} left in the chunk"
            )
        spans.append(fmt.BatchSpan(batch.base_offset, batch.last_offset, position, batch.size))
        position += batch.size
    return spans, ""


def _print_entry(number: int, entry: wal.DirectoryEntry, view: memoryview, out: TextIO) -> bool:
    end = entry.position + entry.size
    if end <= len(view):
        verdict = _verdict(entry.crc, crc32c.crc32c(view[entry.position : end]))
    else:
        verdict = f"crc {entry.crc:#010x} BAD (the chunk ends past the object's {len(view)} bytes)"
    print(
        f"entry {number}: {entry.topic}-{entry.partition} (topic id {entry.topic_id}), "
        f"offsets {entry.base_offset}..{entry.last_offset}, {entry.records} records, "
        f"chunk at position {entry.position} ({entry.size} bytes), {verdict}\n"
        f"    codec {fmt.CODEC_NAMES.get(entry.codec, 'unknown')}, "
        f"max timestamp {format_ms(entry.max_timestamp)}, created {format_ms(entry.created_ms)}",
        file=out,
    )
    return verdict.endswith(" ok")


def _print_chunk_batches(entry: wal.DirectoryEntry, view: memoryview, out: TextIO) -> bool:
    spans, problem = _chunk_spans(view, entry)
    ok = True
    for number, span in enumerate(spans):
        ok = _print_batch(number, span, view, out) and ok
    if problem:
        print(f"cannot read the chunk's batches: {problem}", file=out)
    return ok and not problem


def _dump_wal(data: bytes, out: TextIO, with_records: bool) -> bool:
    print(f"write-ahead object: {len(data)} bytes", file=out)
    view = memoryview(data)
    try:
        header = wal.parse_header(view)
        entries = wal.parse_directory(view, verify=False)
    except wal.CorruptObject as exc:
        print(f"cannot read the header and directory: {exc}", file=out)
        return False
    end = wal.directory_length(header)
    directory_crc = crc32c.crc32c(view[wal.HEADER_SIZE : end])
    print(
        f"header: magic {wal.OBJECT_MAGIC!r}, version {header.version}, flags {header.flags}, "
        f"created {format_ms(header.created_ms)}, {header.entry_count} entries, directory of "
        f"{header.directory_size} bytes, {_verdict(header.directory_crc, directory_crc)}",
        file=out,
    )
    ok = directory_crc == header.directory_crc
    for number, entry in enumerate(entries):
        ok = _print_entry(number, entry, view, out) and ok
        if with_records:
            ok = _print_chunk_batches(entry, view, out) and ok
    if len(data) >= end + wal.FOOTER_SIZE:
        chunks_crc, size, magic = wal.FOOTER.unpack_from(view, len(data) - wal.FOOTER_SIZE)
        body = view[end : len(data) - wal.FOOTER_SIZE]
        computed = crc32c.crc32c(body)
        print(
            f"footer: {_verdict(chunks_crc, computed)} over {len(body)} chunk bytes, "
            f"object size {size}, magic {magic!r}",
            file=out,
        )
        ok = ok and computed == chunks_crc
    try:
        wal.parse_object(data, verify=True)
    except wal.CorruptObject as exc:
        print(f"verification: {exc}", file=out)
        ok = False
    return ok


def dump(data: bytes, out: TextIO, with_records: bool = False) -> bool:
    """Print ``data`` (a segment, an index or a write-ahead object) field by field; False if
    anything failed. ``with_records``: also each batch of a write-ahead object's chunks (a
    segment's batches are always printed)."""
    if data[: len(fmt.INDEX_MAGIC)] == fmt.INDEX_MAGIC:
        return _dump_index(data, out)
    if data[: len(wal.OBJECT_MAGIC)] == wal.OBJECT_MAGIC:
        ok = _dump_wal(data, out, with_records)
    else:
        ok = _dump_segment(data, out)
    verdict = "every CRC verified, every record decoded" if ok else "VERIFICATION FAILED"
    print(f"result: {verdict}", file=out)
    return ok


def _read(target: str) -> bytes:
    if os.path.isfile(target):
        with open(target, "rb") as file:
            return file.read()
    from kafscale import config as configuration
    from kafscale.storage import open_object_store

    store = open_object_store(configuration.load(os.environ))
    try:
        return store.get(target)
    finally:
        store.close()


def main(argv: Sequence[str] | None = None) -> int:
    """``kafscale segments dump``; ``argv`` holds the arguments after ``dump``."""
    parser = argparse.ArgumentParser(
        prog="kafscale segments dump",
        description="Print a segment (.kfs), index or write-ahead (.wal) object field by field "
        "and verify its CRCs.",
    )
    parser.add_argument("target", help="a local file, or else a key in the configured store")
    parser.add_argument(
        "--records",
        action="store_true",
        help="also print the batches and records of each chunk of a write-ahead object",
    )
    args = parser.parse_args(argv)
    from kafscale.config import ConfigError
    from kafscale.storage.objects import ObjectStoreError

    try:
        data = _read(args.target)
    except (OSError, ConfigError, ObjectStoreError, ValueError) as exc:
        print(f"kafscale segments dump: cannot read {args.target!r}: {exc}", file=sys.stderr)
        return 2
    return 0 if dump(data, sys.stdout, with_records=args.records) else 1
