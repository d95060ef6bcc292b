"""What DescribeLogDirs reports: the one "log dir" a broker's partitions live in, and their sizes.

A broker's log dir is the object store location of its data: ``s3://bucket/namespace``, or the
segments directory of the embedded backend (with that file system's total and usable bytes, as
Kafka reports a volume; S3 has no volume: -1). A partition's size is the bytes of its committed
entries (spec segments and write-ahead chunks) that end at or after its log start, read from the
metadata store's segment records: one range read per asked topic, or one for the namespace when
every topic is asked. The reads block: callers run them on a thread (docs/design/ecosystem.md,
section 3).
"""

from __future__ import annotations

import os
import shutil
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

import msgspec

from kafscale.config import Config
from kafscale.metadata import records
from kafscale.metadata.records import Keys
from kafscale.metadata.store import MetadataStore

UNKNOWN = -1  # Kafka's value for a volume size it cannot tell

Partition = tuple[str, int]


@dataclass(frozen=True, slots=True)
class LogDir:
    path: str
    total_bytes: int = UNKNOWN
    usable_bytes: int = UNKNOWN


class StoredLogDirs:
    def __init__(self, config: Config, store: MetadataStore) -> None:
        self.config = config
        self.store = store
        self.keys = Keys(config.s3_namespace)

    def log_dir(self) -> LogDir:
        config = self.config
        if config.uses_s3:
            namespace = config.s3_namespace.strip("/")
            return LogDir(
                f"s3://{config.s3_bucket}/{namespace}" if namespace else f"s3://{config.s3_bucket}"
            )
        path = os.path.abspath(os.path.join(config.data_dir, "segments"))
        try:
            usage = shutil.disk_usage(path)
        except OSError:
            return LogDir(path)
        return LogDir(path, usage.total, usage.free)

    def sizes(self, topics: Iterable[str] | None) -> dict[Partition, int]:
        """The size of every partition with committed entries in ``topics`` (None: all), by
        (topic, partition); a partition without entries is absent (size 0). Entries whose
        records do not decode are left out."""
        prefixes = (
            [self.keys.all_segments]
            if topics is None
            else [self.keys.topic_segments(topic) for topic in sorted(set(topics))]
        )
        starts = self._log_starts(topics)
        sizes: dict[Partition, int] = defaultdict(int)
        root = self.keys.all_segments
        for prefix in prefixes:
            for kv in self.store.get_prefix(prefix):
                where, _, _ = kv.key[len(root) :].rpartition("/")  # topic/partition, base offset
                name, _, partition = where.rpartition("/")
                if not partition.isdigit():
                    continue
                try:
                    entry = records.decode_segment(kv.value)
                except (msgspec.DecodeError, ValueError):
                    continue
                pid = (name, int(partition))
                if entry.last_offset >= starts.get(pid, 0):
                    sizes[pid] += entry.size
        return dict(sizes)

    def _log_starts(self, topics: Iterable[str] | None) -> dict[Partition, int]:
        prefixes = (
            [self.keys.all_partitions]
            if topics is None
            else [self.keys.topic_partitions(topic) for topic in sorted(set(topics))]
        )
        starts: dict[Partition, int] = {}
        for prefix in prefixes:
            for kv in self.store.get_prefix(prefix):
                name, _, partition = kv.key[len(self.keys.all_partitions) :].rpartition("/")
                if not partition.isdigit():
                    continue
                try:
                    starts[(name, int(partition))] = records.decode_partition(
                        kv.value
                    ).log_start_offset
                except (msgspec.DecodeError, ValueError):
                    continue
        return starts
