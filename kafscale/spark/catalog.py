"""What a read can see: topics, their partitions, and each partition's committed log entries.

An entry is a spec segment (a ``.kfs`` with its ``.index``) or a chunk of a write-ahead object
(``size`` bytes of record batches at ``position`` of an object under ``{ns}/!wal/``, no index:
docs/design/write-path.md); ``SegmentInfo`` gives either as an object key and the byte range of
its batches. Two sources, chosen by the options (never one falling back to the other):

- ``MetadataCatalog``: the broker's metadata store (etcd, or the embedded ``metadata.sqlite``).
  Exact: the high watermark, the log start and one ``SegmentRecord`` per committed entry of
  either kind, with its last offset, size and max timestamp, so bounds prune without touching
  the bucket.
- ``ListingCatalog``: the bucket alone (no metadata store configured). Every ``.kfs`` object is a
  complete segment (objects are written whole, never overwritten); a segment's last offset is the
  next one's base offset minus one, and the newest segment's comes from its 16-byte footer. It
  cannot tell an uploaded-but-never-committed segment (a broker crash between the upload and
  the commit, before any producer was acknowledged) from a committed one, and it knows no max
  timestamps, so timestamp bounds read segments in order until they find the answer. It sees
  spec segments only: records still in write-ahead objects (not yet compacted, which the
  broker does within ``KAFSCALE_COMPACTION_MAX_AGE_MS``) need the metadata store to be read.
  Of a compacted topic's segments it takes, for each base offset, the newest generation the
  log cleaner wrote, whose footer gives its last offset, and leaves out the older segments
  inside that range (the cleaner deletes them after a grace period).
  Write-ahead objects (``{ns}/!wal/...``; ``!`` is never in a topic name) are not segments and
  never taken for a topic.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from kafscale.metadata import MetadataStore
from kafscale.metadata.records import (
    Keys,
    SegmentRecord,
    decode_partition,
    decode_segment,
    decode_topic,
)
from kafscale.spark.options import Selection, Storage
from kafscale.storage import ObjectStore
from kafscale.storage import segment as segments
from kafscale.storage.local import LocalObjectStore
from kafscale.storage.objects import ObjectInfo
from kafscale.storage.s3 import S3ObjectStore

log = logging.getLogger(__name__)

WAL_DIRECTORY = "!wal/"  # under the namespace: write-ahead objects (kafscale.storage.wal)


class CatalogError(Exception):
    """A topic or partition the read asks for is not there, or the log is inconsistent."""


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    """A committed entry: a spec segment (``key`` its ``.kfs``, ``index_key`` its ``.index``)
    or a chunk (``key`` its write-ahead object, no index). Its batches lie at ``[start, end)``
    of the object."""

    base_offset: int
    last_offset: int
    size: int  # bytes of the .kfs object; of the batches for a chunk
    key: str
    index_key: str | None  # None for a chunk
    max_timestamp: int | None  # None: unknown without reading the segment
    start: int
    end: int

    @classmethod
    def segment(
        cls,
        namespace: str,
        topic: str,
        partition: int,
        base: int,
        last: int,
        size: int,
        max_timestamp: int | None,
        generation: int = 0,
    ) -> SegmentInfo:
        return cls(
            base,
            last,
            size,
            segments.segment_key(namespace, topic, partition, base, generation),
            segments.index_key(namespace, topic, partition, base, generation),
            max_timestamp,
            segments.HEADER_SIZE,
            size - segments.FOOTER_SIZE,
        )

    @classmethod
    def of(cls, namespace: str, topic: str, partition: int, record: SegmentRecord) -> SegmentInfo:
        """The entry a committed ``SegmentRecord`` names."""
        base, last = record.base_offset, record.last_offset
        if not record.is_chunk:
            return cls.segment(
                namespace,
                topic,
                partition,
                base,
                last,
                record.size,
                record.max_timestamp,
                record.generation,
            )
        end = record.position + record.size
        return cls(
            base, last, record.size, record.object, None, record.max_timestamp, record.position, end
        )

    @property
    def is_chunk(self) -> bool:
        return self.index_key is None

    @property
    def end_offset(self) -> int:
        return self.last_offset + 1


@dataclass(frozen=True, slots=True)
class PartitionLog:
    topic: str
    partition: int
    log_start: int
    high_watermark: int  # offset after the last committed record
    segments: tuple[SegmentInfo, ...]  # in offset order, all below the high watermark


class Catalog(Protocol):
    @property
    def description(self) -> str: ...

    def topics(self, selection: Selection) -> dict[str, int]:
        """The selected topics and their partition counts; raises CatalogError for a topic
        named explicitly that does not exist."""
        ...

    def partition(self, topic: str, partition: int) -> PartitionLog: ...

    def close(self) -> None: ...


def open_objects(storage: Storage) -> ObjectStore:
    if storage.bucket:
        return S3ObjectStore(
            bucket=storage.bucket,
            region=storage.region,
            endpoint_url=storage.endpoint or None,
            path_style=storage.path_style,
            access_key=storage.access_key or None,
            secret_key=storage.secret_key or None,
        )
    segments_dir = os.path.join(storage.data_dir, "segments")
    if not os.path.isdir(segments_dir):
        raise CatalogError(
            f"{storage.data_dir} holds no segments directory: is it a KafScale data directory?"
        )
    return LocalObjectStore(segments_dir)


def open_catalog(storage: Storage, objects: ObjectStore) -> Catalog:
    """The metadata store when one is configured (etcd, or metadata.sqlite in ``dataDir``),
    else a listing of the bucket."""
    store: MetadataStore | None = None
    if storage.etcd_endpoints:
        from kafscale.metadata.etcd import EtcdMetadataStore

        store = EtcdMetadataStore(list(storage.etcd_endpoints))
    elif storage.data_dir:
        path = os.path.join(storage.data_dir, "metadata.sqlite")
        if os.path.exists(path):
            from kafscale.metadata.sqlite import SqliteMetadataStore

            store = SqliteMetadataStore(path)
    if store is not None:
        return MetadataCatalog(store, storage.namespace)
    return ListingCatalog(objects, storage.namespace)


def _select(selection: Selection, existing: Iterable[str], where: str) -> list[str]:
    existing = set(existing)
    if selection.pattern:
        pattern = re.compile(selection.pattern)
        return sorted(t for t in existing if pattern.fullmatch(t))
    missing = [t for t in selection.topics if t not in existing]
    if missing:
        raise CatalogError(f"no topic {', '.join(map(repr, missing))} in {where}")
    return list(selection.topics)


class MetadataCatalog:
    def __init__(self, store: MetadataStore, namespace: str) -> None:
        self.store = store
        self.namespace = namespace
        self.keys = Keys(namespace)

    @property
    def description(self) -> str:
        return f"the metadata store {self.store.description} (namespace {self.namespace})"

    def topics(self, selection: Selection) -> dict[str, int]:
        records = {}
        for kv in self.store.get_prefix(self.keys.topics):
            record = decode_topic(kv.value)
            records[record.name] = record.partitions
        return {t: records[t] for t in _select(selection, records, self.description)}

    def partition(self, topic: str, partition: int) -> PartitionLog:
        kv = self.store.get(self.keys.partition(topic, partition))
        if kv is None:
            raise CatalogError(f"no partition {topic}-{partition} in {self.description}")
        state = decode_partition(kv.value)
        found = []
        for item in self.store.get_prefix(self.keys.segments(topic, partition)):
            record = decode_segment(item.value)
            if record.last_offset < state.log_start_offset:
                continue  # retired by retention; its objects may be gone already
            if record.base_offset >= state.high_watermark:
                continue  # committed after the partition record was read
            found.append(SegmentInfo.of(self.namespace, topic, partition, record))
        found.sort(key=lambda s: s.base_offset)
        return PartitionLog(
            topic, partition, state.log_start_offset, state.high_watermark, tuple(found)
        )

    def close(self) -> None:
        self.store.close()


class ListingCatalog:
    def __init__(self, objects: ObjectStore, namespace: str) -> None:
        self.objects = objects
        self.namespace = namespace

    @property
    def description(self) -> str:
        return f"{self.objects.description} (namespace {self.namespace}, no metadata store)"

    def topics(self, selection: Selection) -> dict[str, int]:
        if selection.pattern:
            wal = f"{self.namespace}/{WAL_DIRECTORY}"
            keys = [info.key for info in self.objects.list(f"{self.namespace}/")]
            if any(key.startswith(wal) for key in keys):
                log.warning(
                    "the bucket holds write-ahead objects: records not yet compacted into "
                    "segments are read only with the metadata store",
                    extra={"namespace": self.namespace},
                )
            listed = (self._topic_of(key) for key in keys if not key.startswith(wal))
            chosen = _select(selection, {n for n in listed if n is not None}, self.description)
        else:
            chosen = _select(
                selection,
                [t for t in selection.topics if self._partitions(t)],
                self.description,
            )
        return {t: max(self._partitions(t)) + 1 for t in chosen}

    def _topic_of(self, key: str) -> str | None:
        parsed = segments.parse_segment_key(key)
        return parsed.topic if parsed is not None and parsed.namespace == self.namespace else None

    def _partitions(self, topic: str) -> set[int]:
        found = set()
        for info in self.objects.list(f"{self.namespace}/{topic}/"):
            parsed = segments.parse_segment_key(info.key)
            if parsed is not None and parsed.topic == topic and parsed.kind == "kfs":
                found.add(parsed.partition)
        return found

    def partition(self, topic: str, partition: int) -> PartitionLog:
        prefix = segments.segment_prefix(self.namespace, topic, partition)
        newest: dict[int, tuple[int, ObjectInfo]] = {}  # base -> (generation, object)
        for info in self.objects.list(prefix):
            parsed = segments.parse_segment_key(info.key)
            if parsed is None or parsed.kind != "kfs" or parsed.partition != partition:
                continue
            if parsed.generation >= newest.get(parsed.base_offset, (-1, info))[0]:
                newest[parsed.base_offset] = (parsed.generation, info)
        listed = sorted(newest.items())
        found: list[SegmentInfo] = []
        for i, (base, (generation, info)) in enumerate(listed):
            if found and base <= found[-1].last_offset:
                continue  # replaced by a cleaned segment whose deletion is still due
            if generation or i + 1 == len(listed):
                last = self._footer_last_offset(info.key, info.size)
            else:
                last = listed[i + 1][0] - 1
            if last < base:
                raise CatalogError(f"{info.key}: ends at offset {last}, before its base {base}")
            found.append(
                SegmentInfo.segment(
                    self.namespace, topic, partition, base, last, info.size, None, generation
                )
            )
        log_start = found[0].base_offset if found else 0
        high_watermark = found[-1].end_offset if found else 0
        return PartitionLog(topic, partition, log_start, high_watermark, tuple(found))

    def _footer_last_offset(self, key: str, size: int) -> int:
        if size < segments.HEADER_SIZE + segments.FOOTER_SIZE:
            raise segments.CorruptSegment(f"{key}: {size} bytes cannot hold a segment")
        footer = self.objects.get(key, size - segments.FOOTER_SIZE, segments.FOOTER_SIZE)
        return segments.parse_footer(footer, key)

    def close(self) -> None:
        pass
