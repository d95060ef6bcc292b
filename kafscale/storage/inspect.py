"""``kafscale segments dump <file-or-key>``: the operator's view of one segment or index object.

``dump`` prints every header, batch and footer field of a ``.kfs`` object (or the entries of an
``.index``), checks every CRC and decodes every batch's records (decompression bounded by
``compression.read_limit``), reporting each failure by name instead of stopping at the first: a
batch a broker stored without validating it (e.g. attributes that name another codec than its
body's) is found here. It never raises on bad bytes: whatever cannot be parsed is printed as the
problem. ``main`` reads
a local file, or else the argument as a key of the configured object store; it exits 0 when
everything verified, 1 when something did not, 2 when the object could not be read.
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

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


def _when(ms: int) -> str:
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
        f"base offset {base_offset}, records {count}, created {_when(created_ms)}, "
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
        f"first timestamp {_when(batch.base_timestamp)}, "
        f"max timestamp {_when(batch.max_timestamp)}\n"
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


def dump(data: bytes, out: TextIO) -> bool:
    """Print ``data`` (a segment, or an index) field by field; False if anything failed."""
    if data[: len(fmt.INDEX_MAGIC)] == fmt.INDEX_MAGIC:
        return _dump_index(data, out)
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
        description="Print a segment (.kfs) or index object field by field and verify its CRCs.",
    )
    parser.add_argument("target", help="a local file, or else a key in the configured store")
    args = parser.parse_args(argv)
    from kafscale.config import ConfigError
    from kafscale.storage.objects import ObjectStoreError

    try:
        data = _read(args.target)
    except (OSError, ConfigError, ObjectStoreError, ValueError) as exc:
        print(f"kafscale segments dump: cannot read {args.target!r}: {exc}", file=sys.stderr)
        return 2
    return 0 if dump(data, sys.stdout) else 1
