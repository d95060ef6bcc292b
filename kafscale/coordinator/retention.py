"""Retention: deleting a partition's oldest log entries once its topic's ``retention.ms`` or
``retention.bytes`` says they may go, as Kafka's log cleaner does with ``cleanup.policy=delete``.

Every ``KAFSCALE_RETENTION_CHECK_INTERVAL_MS`` the coordinator walks each partition's committed
entries -- spec segments and chunks of write-ahead objects alike (metadata records, no
object-store listing) -- oldest first, and deletes while:

- start: the entry ends below the partition's log start offset (DeleteRecords moved it:
  ``kafscale.coordinator.log_start``), or
- time: the entry's largest record timestamp is older than ``retention.ms`` (-1: never), or
- size: the partition stays at or above ``retention.bytes`` without the entry (negative: never).

Time and size apply only when the topic's ``cleanup.policy`` includes ``delete``; a compact-only
or empty policy keeps the log whole, as in Kafka.

Deleting is, in order: one compare-and-set transaction that moves the partition's log start
offset past the deleted entries and removes their records (one ``DeleteRange``: they are a prefix
of the partition's keys; from then on no reader can find them); a notice to the owning shard so it
stops serving them at once (fetches below the new start get OFFSET_OUT_OF_RANGE); then the
segments' ``.kfs``/``.index`` objects. A chunk's write-ahead object holds other partitions' data
too: the WAL garbage collector (``wal_gc.WalReferences``) sees its records go by its watch and
deletes the object once nothing references it. Objects that cannot be deleted then (S3 down) are
retried at the next round; a coordinator crash between the transaction and the deletes leaves
them in the bucket (NOTES.md). As in Kafka, retention can empty a partition completely; its next
offset is unchanged. A round deletes at most ``MAX_ENTRIES`` entries, ``MAX_SEGMENTS`` of them
segments, per partition (segment objects are deleted one by one on the coordinator's thread).

Containment: a topic, partition or segment record that does not decode (written by another
version, or damaged) costs that topic or partition this round, logged once (``FaultLog``) and
counted in ``kafscale_read_faults_total{path="retention"}``; every other partition is cleaned.
Retention never reads segment bytes: an entry's age is its record's max timestamp.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Mapping

import msgspec
import zmq

from kafscale import metrics
from kafscale.config import Config
from kafscale.metadata import records, topic_configs
from kafscale.metadata.records import Keys, SegmentRecord, TopicRecord
from kafscale.metadata.store import Compare, DeleteRange, MetadataStore, Put
from kafscale.storage import segment as segments
from kafscale.storage.faults import FaultLog
from kafscale.storage.objects import ObjectStore, ObjectStoreError

from .log_start import ShardNotices

log = logging.getLogger(__name__)

MAX_ENTRIES = 1000  # per partition and round (one DeleteRange whatever their number)
MAX_SEGMENTS = 100  # per partition and round: two object deletes each
NO_LIMIT = -1
# What a record that does not decode raises (msgspec's errors; a config value that is no number).
UNDECODABLE = (msgspec.DecodeError, ValueError, KeyError, TypeError)


def expired(
    found: list[SegmentRecord],
    retention_ms: int,
    retention_bytes: int,
    now_ms: int,
    log_start_offset: int = 0,
) -> list[SegmentRecord]:
    """The oldest entries that retention deletes (a prefix of ``found``, in offset order):
    those that end below the partition's log start (DeleteRecords moved it), then those that
    ``retention.ms`` or ``retention.bytes`` expire (NO_LIMIT: never)."""
    total = sum(s.size for s in found)
    doomed: list[SegmentRecord] = []
    for segment in found:
        below_start = segment.last_offset < log_start_offset
        too_old = retention_ms != NO_LIMIT and segment.max_timestamp < now_ms - retention_ms
        too_big = retention_bytes != NO_LIMIT and total - segment.size >= retention_bytes
        if not (below_start or too_old or too_big):
            break
        doomed.append(segment)
        total -= segment.size
    return doomed


def limits(configs: Mapping[str, str]) -> tuple[int, int]:
    """``(retention.ms, retention.bytes)`` of a topic's effective configs, NO_LIMIT for no
    limit: a negative ``retention.bytes`` (as in Kafka), and both when ``cleanup.policy`` does
    not include ``delete`` (compact only, or empty: Kafka keeps such a log whole)."""
    if "delete" not in configs["cleanup.policy"].split(","):
        return NO_LIMIT, NO_LIMIT
    retention_bytes = int(configs["retention.bytes"])
    return int(configs["retention.ms"]), NO_LIMIT if retention_bytes < 0 else retention_bytes


def first_batch(doomed: list[SegmentRecord]) -> list[SegmentRecord]:
    """The prefix of ``doomed`` one round deletes: at most ``MAX_ENTRIES`` entries holding at
    most ``MAX_SEGMENTS`` spec segments (chunks cost no object deletes)."""
    segments_seen = 0
    for count, entry in enumerate(doomed[:MAX_ENTRIES]):
        if not entry.is_chunk:
            if segments_seen == MAX_SEGMENTS:
                return doomed[:count]
            segments_seen += 1
    return doomed[:MAX_ENTRIES]


class RetentionCleaner:
    def __init__(
        self,
        config: Config,
        store: MetadataStore,
        objects: ObjectStore,
        context: zmq.Context[zmq.Socket[bytes]],
        runtime_dir: str,
    ) -> None:
        self.config = config
        self.store = store
        self.objects = objects
        self.keys = Keys(config.s3_namespace)
        self.interval_ms = config.retention_check_interval_ms
        self._next_ms = _now_ms() + self.interval_ms
        self._leftovers: list[str] = []  # object keys whose delete failed
        self._faults = FaultLog(log, "retention", metrics.READ_FAULTS.labels("retention").inc)
        self._notices = ShardNotices(context, runtime_dir, config.shards)

    def maybe_run(self) -> None:
        now = _now_ms()
        if now < self._next_ms:
            return
        self._next_ms = now + self.interval_ms
        try:
            self.run(now)
        except Exception:  # retention is periodic: log and try again next round
            log.exception("retention round failed")

    def run(self, now_ms: int) -> int:
        """One round over every partition; returns the entries deleted."""
        self._leftovers = self._delete_objects(self._leftovers)
        deleted = 0
        defaults = topic_configs.defaults(self.config)
        for kv in self.store.get_prefix(self.keys.topics):
            try:
                topic = records.decode_topic(kv.value)
                retention_ms, retention_bytes = limits(
                    topic_configs.effective(topic.configs, defaults)
                )
            except UNDECODABLE as exc:
                self._faults.report(kv.key, f"topic record does not decode: {exc}")
                continue
            for partition in range(topic.partitions):
                try:
                    deleted += self._clean(topic, partition, retention_ms, retention_bytes, now_ms)
                except UNDECODABLE as exc:
                    key = self.keys.partition(topic.name, partition)
                    self._faults.report(key, f"a record of the partition does not decode: {exc}")
        return deleted

    def _clean(
        self, topic: TopicRecord, partition: int, retention_ms: int, retention_bytes: int, now: int
    ) -> int:
        partition_key = self.keys.partition(topic.name, partition)
        partition_kv = self.store.get(partition_key)
        if partition_kv is None:
            return 0
        state = records.decode_partition(partition_kv.value)
        if state.topic_id != topic.topic_id:
            return 0
        if retention_ms == retention_bytes == NO_LIMIT and state.log_start_offset == 0:
            return 0  # nothing can expire, and nothing lies below the log start
        found = sorted(
            (
                records.decode_segment(kv.value)
                for kv in self.store.get_prefix(self.keys.segments(topic.name, partition))
            ),
            key=lambda s: s.base_offset,
        )
        doomed = first_batch(
            expired(found, retention_ms, retention_bytes, now, state.log_start_offset)
        )
        if not doomed:
            return 0
        log_start = doomed[-1].last_offset + 1
        updated = msgspec.structs.replace(
            state, log_start_offset=max(state.log_start_offset, log_start)
        )
        txn = self.store.transaction(
            [Compare(partition_key, mod_revision=partition_kv.mod_revision)],
            [
                Put(partition_key, records.encode(updated)),
                DeleteRange(
                    self.keys.segment(topic.name, partition, doomed[0].base_offset),
                    self.keys.segment(topic.name, partition, log_start),
                ),
            ],
        )
        if not txn.succeeded:
            return 0  # a commit moved the partition meanwhile: the next round sees it
        chunks = Counter(s.object for s in doomed if s.is_chunk)
        self._notices.log_start_moved(
            topic.name, topic.topic_id, partition, updated.log_start_offset
        )
        ns = self.config.s3_namespace
        self._leftovers += self._delete_objects(
            [
                key
                for s in doomed
                if not s.is_chunk
                for key in segments.object_keys(
                    ns, topic.name, partition, s.base_offset, s.generation
                )
            ]
        )
        metrics.RETENTION_DELETED.inc(len(doomed))
        log.info(
            "retention deleted segments",
            extra={
                "topic": topic.name,
                "partition": partition,
                "segments": len(doomed) - chunks.total(),
                "chunks": chunks.total(),
                "log_start_offset": updated.log_start_offset,
            },
        )
        return len(doomed)

    def _delete_objects(self, keys: list[str]) -> list[str]:
        """Delete ``keys``; the ones whose delete failed (retried next round)."""
        failed = []
        for key in keys:
            try:
                self.objects.delete(key)
            except ObjectStoreError as exc:
                log.warning(
                    "cannot delete a retired object yet", extra={"key": key, "error": str(exc)}
                )
                failed.append(key)
        return failed

    def close(self) -> None:
        self._notices.close()


def _now_ms() -> int:
    return time.time_ns() // 1_000_000
