"""``kafscale segments list <topic> <partition>``: one partition's committed log, as the metadata
store holds it.

``describe`` (pure) turns the partition record and its segment records into lines: the committed
state, then every entry in offset order, a spec segment with its ``.kfs`` key or a chunk as
"chunk of <write-ahead object> @ position, size", and any offsets the entries do not cover.
``main`` reads them from the configured metadata store; it exits 0 when the partition exists, 1
when it does not, 2 when the store could not be read.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

import msgspec

from kafscale.metadata.records import PartitionRecord, SegmentRecord
from kafscale.storage import segment as fmt
from kafscale.storage.inspect import format_ms


def _entry(namespace: str, topic: str, partition: int, entry: SegmentRecord) -> str:
    offsets = f"offsets {entry.base_offset}..{entry.last_offset}"
    if entry.is_chunk:
        where = (
            f"chunk of {entry.object} @ {entry.position}, {entry.size} bytes, "
            f"codec {fmt.CODEC_NAMES.get(entry.codec, 'unknown')}"
        )
    else:
        key = fmt.segment_key(namespace, topic, partition, entry.base_offset, entry.generation)
        where = f"segment {key}, {entry.size} bytes (index {entry.index_size} bytes)"
    return (
        f"{offsets}: {where}, {entry.records} records, "
        f"max timestamp {format_ms(entry.max_timestamp)}, created {format_ms(entry.created_ms)}"
    )


def describe(
    namespace: str,
    topic: str,
    partition: int,
    state: PartitionRecord,
    entries: Sequence[SegmentRecord],
) -> list[str]:
    """What ``segments list`` prints for a partition with this state and these entries."""
    chunks = sum(1 for entry in entries if entry.is_chunk)
    lines = [
        f"partition {topic}-{partition} (topic id {state.topic_id}): high watermark "
        f"{state.high_watermark}, log start offset {state.log_start_offset}, owner "
        f"{state.owner}, leader epoch {state.leader_epoch}",
        f"{len(entries)} entries: {len(entries) - chunks} segments, {chunks} chunks",
    ]
    expected: int | None = None
    for entry in sorted(entries, key=lambda entry: entry.base_offset):
        if expected is not None and entry.base_offset != expected:
            lines.append(f"GAP: offsets {expected}..{entry.base_offset - 1} are in no entry")
        lines.append(_entry(namespace, topic, partition, entry))
        expected = entry.last_offset + 1
    if expected is not None and expected != state.high_watermark:
        lines.append(
            f"MISMATCH: the last entry ends at {expected - 1}, the high watermark is "
            f"{state.high_watermark}"
        )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """``kafscale segments list``; ``argv`` holds the arguments after ``list``."""
    parser = argparse.ArgumentParser(
        prog="kafscale segments list",
        description="Print a partition's committed log: every segment and write-ahead chunk.",
    )
    parser.add_argument("topic")
    parser.add_argument("partition", type=int)
    args = parser.parse_args(argv)
    from kafscale import config as configuration
    from kafscale.metadata import MetadataStoreError, open_metadata_store
    from kafscale.metadata.records import Keys, decode_partition, decode_segment

    try:
        config = configuration.load(os.environ)
        store = open_metadata_store(config)
        try:
            keys = Keys(config.s3_namespace)
            state = store.get(keys.partition(args.topic, args.partition))
            values = store.get_prefix(keys.segments(args.topic, args.partition))
        finally:
            store.close()
        entries = [decode_segment(value.value) for value in values]
        partition = None if state is None else decode_partition(state.value)
    except (OSError, configuration.ConfigError, MetadataStoreError, msgspec.DecodeError) as exc:
        print(f"kafscale segments list: cannot read the metadata store: {exc}", file=sys.stderr)
        return 2
    if partition is None:
        print(
            f"kafscale segments list: no partition {args.topic}-{args.partition}", file=sys.stderr
        )
        return 1
    lines = describe(config.s3_namespace, args.topic, args.partition, partition, entries)
    print("\n".join(lines))
    return 0
