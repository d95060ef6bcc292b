"""What a broker has committed, read back the way an offline reader would: the partition's entries
from the metadata store, each entry's batches from the object store (a spec segment's ``.kfs``,
or a chunk's byte range in a write-ahead object), every CRC checked.

Tests use it to look behind the broker: the records stored, their timestamps and codecs, which
entries are segments and which are chunks. Nothing here goes through the Kafka protocol.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from kafscale import config as configuration
from kafscale.metadata import open_metadata_store
from kafscale.metadata import records as metadata
from kafscale.metadata.records import Keys, SegmentRecord
from kafscale.protocol import records as batches
from kafscale.storage import chunks, open_object_store
from kafscale.storage import segment as segments
from kafscale.storage.objects import ObjectStore


@dataclass(frozen=True)
class StoredEntry:
    """One committed entry and its batches (CRC-checked), in offset order."""

    record: SegmentRecord
    key: str  # the .kfs, or the write-ahead object holding the chunk
    batches: tuple[bytes, ...]

    @property
    def is_chunk(self) -> bool:
        return self.record.is_chunk


class StoredReader:
    """The metadata and object stores of ``env``, opened once for many reads (opening them costs
    ~0.1 s: a boto3 client and an etcd channel). Use as a context manager."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.config = configuration.load(env)
        self.store = open_metadata_store(self.config)
        self.objects = open_object_store(self.config)

    def __enter__(self) -> StoredReader:
        return self

    def __exit__(self, *_: object) -> None:
        self.objects.close()
        self.store.close()

    def entries(self, topic: str, partition: int) -> list[StoredEntry]:
        """The partition's committed log, entry by entry, as the metadata store lists it now."""
        namespace = self.config.s3_namespace
        prefix = Keys(namespace).segments(topic, partition)
        found = [metadata.decode_segment(kv.value) for kv in self.store.get_prefix(prefix)]
        return [_read(self.objects, namespace, topic, partition, r) for r in found]

    def records(self, topic: str, partition: int) -> list[batches.Record]:
        """Every committed record of the partition, in offset order."""
        return [
            record
            for entry in self.entries(topic, partition)
            for batch in entry.batches
            for record in batches.iter_records(batch)
        ]


def committed_entries(env: Mapping[str, str], topic: str, partition: int) -> list[StoredEntry]:
    """The partition's committed log, entry by entry, as the metadata store lists it now."""
    with StoredReader(env) as reader:
        return reader.entries(topic, partition)


def _read(
    objects: ObjectStore, namespace: str, topic: str, partition: int, record: SegmentRecord
) -> StoredEntry:
    if record.is_chunk:
        data: bytes | memoryview = objects.get(record.object, record.position, record.size)
        spans = chunks.verify_chunk(
            data, record.object, record.position, record.base_offset, record.last_offset
        )
        key = record.object
    else:
        key = segments.segment_key(namespace, topic, partition, record.base_offset)
        parsed = segments.parse_segment(objects.get(key))  # verifies every CRC
        data, spans = parsed.data, list(parsed.batches)
    view = memoryview(data)
    out = tuple(bytes(view[s.position : s.position + s.length]) for s in spans)
    return StoredEntry(record, key, out)


def committed_batches(env: Mapping[str, str], topic: str, partition: int) -> Iterator[bytes]:
    for entry in committed_entries(env, topic, partition):
        yield from entry.batches


def committed_records(env: Mapping[str, str], topic: str, partition: int) -> list[batches.Record]:
    """Every committed record of the partition, in offset order."""
    with StoredReader(env) as reader:
        return reader.records(topic, partition)


def committed_codecs(env: Mapping[str, str], topic: str, partition: int) -> set[int]:
    """The codec of every committed batch of the partition (``segments.CODEC_NAMES`` names them)."""
    return {
        segments.read_batch_header(batch).codec
        for batch in committed_batches(env, topic, partition)
    }
