"""The log cleaner: rewrites the compacted partitions this broker owns, one at a time, on a
thread of the flusher process (docs/design/ecosystem.md, section 4.3).

Every ``KAFSCALE_CLEANER_BACKOFF_MS`` (Kafka's ``log.cleaner.backoff.ms``), and at once after a
round that cleaned something, a round:

1. reads the topic records; for each topic whose ``cleanup.policy`` includes ``compact``, the
   partitions this broker owns (``owned``), each one's log start and segment records (with their
   mod revisions);
2. asks the planner (``kafscale.cleaner.plan``, pure) which are due, and takes the dirtiest (one
   due by ``max.compaction.lag.ms`` first);
3. GETs its dirty segments and fills the offset map (``KAFSCALE_CLEANER_BUFFER_BYTES``; a dirty
   section with more keys is cleaned up to the segment that filled it), GETs the clean ones,
   rewrites every batch (``kafscale.cleaner.rewrite``) and groups the results into segments of
   up to ``segment.bytes`` (``plan.Grouping``). A dirty segment is read twice, for the map and
   to rewrite, so that one segment at most is held, as Kafka's cleaner reads it twice;
4. puts each new segment's ``.kfs`` and ``.index`` at its generation's keys (1 + that of the
   segment it starts at) with put-if-absent: a key taken (an earlier attempt, or another owner
   racing for the partition) moves the whole cleaning to the next generation, so an object is
   only ever referenced by the cleaning that wrote it;
5. asks the coordinator to ``CommitCleaning`` (one compare-and-set of every replaced record, the
   topic and the leader key); once committed, tells the owning shard (``SegmentsCleaned``). A
   refused commit deletes the objects it wrote; an unanswered one leaves them (they may be
   committed). The replaced objects are the coordinator's to delete, after a grace.

One cleaning replaces at most ``MAX_REPLACED`` segments (one metadata transaction): a log with
more clean segments than that has the newest of them rewritten with the dirty ones, the older
ones at a later round. Nothing here holds a lock across I/O or touches the flusher's cycles.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from kafscale import metrics
from kafscale.cleaner import plan
from kafscale.cleaner.plan import Sections, Settings
from kafscale.cleaner.rewrite import Cleaning, OffsetMap, clean_segment, fill
from kafscale.config import Config
from kafscale.ipc import routing
from kafscale.ipc.base import Message
from kafscale.ipc.cleaning import CommitCleaning, SegmentsCleaned
from kafscale.ipc.write_path import SegmentCommitted
from kafscale.metadata import records, topic_configs
from kafscale.metadata.records import Keys, SegmentRecord, TopicRecord
from kafscale.metadata.store import MetadataStore, MetadataStoreError
from kafscale.protocol import records as batches
from kafscale.storage import segment as segments
from kafscale.storage.objects import ObjectStore, ObjectStoreError
from kafscale.storage.segment import CorruptSegment

log = logging.getLogger(__name__)

MAX_REPLACED = 40  # segments per cleaning: 3 operations each in one transaction (etcd: 128)
MAX_GENERATION_TRIES = 8  # keys found taken before a cleaning gives up for this round
UNCLEANABLE_MS = 600_000  # a partition with an unreadable segment is left alone this long
UNDECODABLE = (msgspec.DecodeError, ValueError, KeyError, TypeError)


class CleaningRefused(Exception):
    """The coordinator did not commit the cleaning (its records changed, or not ours)."""


@dataclass(frozen=True, slots=True)
class Candidate:
    """A compacted partition due for cleaning, as one round read it."""

    topic: str
    topic_id: str
    partition: int
    settings: Settings
    sections: Sections
    revisions: dict[int, int]  # base offset -> the segment record's mod revision
    forced: bool


@dataclass(frozen=True, slots=True)
class Outcome:
    replaced: int
    written: int
    records_before: int
    records_after: int


def settings_of(configs: dict[str, str]) -> Settings:
    """A compacted topic's cleaning settings from its effective configs."""
    return Settings(
        min_cleanable_dirty_ratio=float(configs["min.cleanable.dirty.ratio"]),
        min_compaction_lag_ms=int(configs["min.compaction.lag.ms"]),
        max_compaction_lag_ms=int(configs["max.compaction.lag.ms"]),
        delete_retention_ms=int(configs["delete.retention.ms"]),
        segment_bytes=int(configs["segment.bytes"]),
    )


class Cleaner:
    def __init__(
        self,
        config: Config,
        objects: ObjectStore,
        store: MetadataStore,
        commit: Callable[[CommitCleaning], SegmentCommitted],
        notify: Callable[[int, Message], None],
        owned: Callable[[], set[tuple[str, int]]] | None = None,
        clock: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    ) -> None:
        """``commit`` asks the coordinator (raises when it cannot be asked); ``notify(shard,
        message)`` tells a shard; ``owned``: the partitions this broker owns now (None: all)."""
        self.objects = objects
        self.store = store
        self.namespace = config.s3_namespace
        self.keys = Keys(self.namespace)
        self.topic_defaults = topic_configs.defaults(config)
        self.buffer_bytes = config.cleaner_buffer_bytes
        self.backoff_s = config.cleaner_backoff_ms / 1000
        self.shards = config.shards
        self._commit = commit
        self._notify = notify
        self._owned = owned
        self.clock = clock
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None
        # Partitions a cleaning found an unreadable segment in, and until when they are left
        # alone (Kafka marks such a log uncleanable): the others are cleaned meanwhile.
        self._uncleanable: dict[tuple[str, int], int] = {}

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="cleaner", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._closing.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while not self._closing.is_set():
            cleaned = False
            try:
                cleaned = self.round()
            except (MetadataStoreError, ObjectStoreError) as exc:
                log.warning("cleaning round failed; retrying later", extra={"error": str(exc)})
            except Exception:
                log.exception("cleaning round failed; retrying later")
            if not cleaned:
                self._closing.wait(self.backoff_s)

    def round(self) -> bool:
        """Clean the partition that most needs it, if any is due; whether one was cleaned."""
        now = self.clock()
        found = self.candidates(now)
        if not found:
            return False
        best = max(found, key=lambda c: (c.forced, c.sections.ratio))
        try:
            outcome = self.clean(best, now)
        except CleaningRefused as exc:
            log.info(
                "cleaning not committed",
                extra={"topic": best.topic, "partition": best.partition, "error": str(exc)},
            )
            metrics.CLEANINGS.labels("refused").inc()
            return False
        except CorruptSegment as exc:
            log.error(
                "cannot clean: a segment is unreadable; the partition is left alone for a while",
                extra={"topic": best.topic, "partition": best.partition, "error": str(exc)},
            )
            metrics.CLEANINGS.labels("failed").inc()
            self._uncleanable[(best.topic, best.partition)] = now + UNCLEANABLE_MS
            return False
        metrics.CLEANINGS.labels("committed").inc()
        log.info(
            "partition cleaned",
            extra={
                "topic": best.topic,
                "partition": best.partition,
                "replaced": outcome.replaced,
                "segments": outcome.written,
                "records_before": outcome.records_before,
                "records_after": outcome.records_after,
            },
        )
        return True

    def candidates(self, now_ms: int) -> list[Candidate]:
        """The owned partitions of compacted topics that are due for cleaning."""
        owned = self._owned() if self._owned is not None else None
        self._uncleanable = {k: t for k, t in self._uncleanable.items() if t > now_ms}
        due: list[Candidate] = []
        for kv in self.store.get_prefix(self.keys.topics):
            try:
                topic = records.decode_topic(kv.value)
                configs = topic_configs.effective(topic.configs, self.topic_defaults)
            except UNDECODABLE:
                continue  # retention logs such a record; nothing to clean in it
            if "compact" not in configs["cleanup.policy"].split(","):
                continue
            settings = settings_of(configs)
            for partition in range(topic.partitions):
                if owned is not None and (topic.name, partition) not in owned:
                    continue
                if (topic.name, partition) in self._uncleanable:
                    continue
                candidate = self._candidate(topic, partition, settings, now_ms)
                if candidate is not None:
                    due.append(candidate)
        return due

    def _candidate(
        self, topic: TopicRecord, partition: int, settings: Settings, now_ms: int
    ) -> Candidate | None:
        record = self.store.get(self.keys.partition(topic.name, partition))
        if record is None:
            return None
        log_start = records.decode_partition(record.value).log_start_offset
        entries, revisions = [], {}
        for kv in self.store.get_prefix(self.keys.segments(topic.name, partition)):
            entry = records.decode_segment(kv.value)
            entries.append(entry)
            revisions[entry.base_offset] = kv.mod_revision
        found = plan.sections(entries, log_start, settings, now_ms)
        if not plan.due(found, settings, now_ms):
            return None
        forced = plan.forced(found, settings, now_ms)
        return Candidate(topic.name, topic.topic_id, partition, settings, found, revisions, forced)

    def clean(self, candidate: Candidate, now_ms: int) -> Outcome:
        """One cleaning of ``candidate``: read, rewrite, write, commit, tell the shard."""
        dirty = candidate.sections.dirty[: MAX_REPLACED // 2]
        clean = candidate.sections.clean[-(MAX_REPLACED - len(dirty)) :]
        offsets = OffsetMap(self.buffer_bytes)
        taken = fill(offsets, (self._batches(candidate, s) for s in dirty))
        cleaning = Cleaning(offsets, now_ms, candidate.settings.delete_retention_ms)
        sources = [*clean, *dirty[:taken]]
        generation = 1 + max(s.generation for s in sources)
        for _ in range(MAX_GENERATION_TRIES):
            written = self._rewrite(candidate, sources, cleaning, generation)
            if written is not None:
                break
            generation += 1
        else:
            raise CleaningRefused(f"segment keys taken up to generation {generation}")
        replaced = [(s.base_offset, candidate.revisions[s.base_offset]) for s in sources]
        request = CommitCleaning(
            candidate.topic, candidate.topic_id, candidate.partition, replaced, written
        )
        reply = self._commit(request)  # raising: unanswered, the objects may be committed
        if not reply.committed:
            self._delete(candidate, written)
            raise CleaningRefused(reply.error or "refused")
        shard = routing.shard_for(candidate.topic_id, candidate.partition, self.shards)
        try:
            self._notify(
                shard,
                SegmentsCleaned(candidate.topic, candidate.topic_id, candidate.partition, written),
            )
        except Exception:  # the shard finds the replaced objects gone later and reloads
            log.exception("could not tell shard %d of a cleaning", shard)
        return Outcome(
            len(sources),
            len(written),
            sum(s.records for s in sources),
            sum(s.records for s in written),
        )

    def _rewrite(
        self,
        candidate: Candidate,
        sources: list[SegmentRecord],
        cleaning: Cleaning,
        generation: int,
    ) -> list[SegmentRecord] | None:
        """Clean ``sources`` one by one, grouping the results into segments of up to
        ``segment.bytes`` (``plan.Grouping``), each put as soon as its group is complete:
        in memory, one source and one group's cleaned batches at most. None (and nothing left
        behind) when a key of ``generation`` is taken."""
        written: list[SegmentRecord] = []
        group: list[tuple[SegmentRecord, list[bytes]]] = []
        grouping = plan.Grouping(candidate.settings.segment_bytes)
        for source in [*sources, None]:
            kept = [] if source is None else self._cleaned(candidate, source, cleaning)
            complete = source is None or grouping.starts_group(sum(map(len, kept)))
            if group and complete:
                record = self._put(candidate, group, generation)
                if record is None:
                    self._delete(candidate, written)
                    return None
                written.append(record)
                group = []
            if source is not None:
                group.append((source, kept))
        return written

    def _cleaned(
        self, candidate: Candidate, source: SegmentRecord, cleaning: Cleaning
    ) -> list[bytes]:
        return clean_segment(self._batches(candidate, source), cleaning)

    def _batches(self, candidate: Candidate, segment: SegmentRecord) -> list[memoryview]:
        key = segments.segment_key(
            self.namespace,
            candidate.topic,
            candidate.partition,
            segment.base_offset,
            segment.generation,
        )
        data = self.objects.get(key)
        try:
            parsed = segments.parse_segment(data, verify=True)
        except CorruptSegment as exc:
            raise CorruptSegment(f"{key}: {exc}") from None
        metrics.CLEANER_BYTES.labels("read").inc(len(data))
        return [parsed.data[s.position : s.position + s.length] for s in parsed.batches]

    def _put(
        self,
        candidate: Candidate,
        group: list[tuple[SegmentRecord, list[bytes]]],
        generation: int,
    ) -> SegmentRecord | None:
        """One new segment of ``group`` (sources and their cleaned batches); None if one of its
        keys is taken."""
        first, last = group[0][0], group[-1][0]
        batch_list = [b for _, kept in group for b in kept]
        headers = [batches.read_header(b) for b in batch_list]
        codec = headers[0].codec if headers else 0
        created = min(source.created_ms for source, _ in group)
        kfs, index = segments.build_segment(
            batch_list,
            segments.FLAG_CLEANED | codec,
            created,
            covers=(first.base_offset, last.last_offset),
        )
        base = first.base_offset
        kfs_key, index_key = segments.object_keys(
            self.namespace, candidate.topic, candidate.partition, base, generation
        )
        if not self.objects.put_if_absent(kfs_key, kfs):
            return None
        if not self.objects.put_if_absent(index_key, index):
            self.objects.delete(kfs_key)  # ours: nobody else can refer to it
            return None
        metrics.CLEANER_BYTES.labels("written").inc(len(kfs) + len(index))
        return SegmentRecord(
            base_offset=base,
            last_offset=last.last_offset,
            size=len(kfs),
            index_size=len(index),
            records=sum(h.records_count for h in headers),
            max_timestamp=max((h.max_timestamp for h in headers), default=-1),
            created_ms=created,
            codec=codec,
            generation=generation,
        )

    def _delete(self, candidate: Candidate, written: list[SegmentRecord]) -> None:
        """Delete the objects of new segments no commit refers to (this cleaning's own)."""
        topic, partition = candidate.topic, candidate.partition
        keys = [
            key
            for s in written
            for key in segments.object_keys(
                self.namespace, topic, partition, s.base_offset, s.generation
            )
        ]
        if keys:
            try:
                self.objects.delete_many(keys)
            except ObjectStoreError as exc:
                log.warning("cannot delete a refused cleaning's objects", extra={"error": str(exc)})
