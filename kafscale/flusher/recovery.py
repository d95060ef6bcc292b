"""Recovery of write-ahead objects that were uploaded but never committed (write-path.md, 8).

A flusher that dies between an object's upload and its commit leaves the object in S3 without a
``WalRecord``. Its data may exist nowhere else (acks=1 data of a pod that crashed as a whole), so
the next flusher of the broker, before it reports ready, looks at each of its broker's objects
that has no ``WalRecord``:

- a corrupt object is reported (``kafscale_read_faults_total{path="recovery"}``) and left alone:
  never deleted, never committed;
- an entry whose base offset is exactly its partition's committed high watermark (or follows
  the entry adopted just before it, in this or an earlier orphan), in a topic of the same topic
  id, is **adopted**: committed through the coordinator with one ``CommitObject`` per object,
  with the partition's producer state rebuilt from its batches' headers (producer id, epoch,
  sequences; as Kafka rebuilds it from the log), so an idempotent producer that retries a batch
  adopted here is answered as a duplicate, not written twice;
- an object of which nothing was written (no ``WalRecord`` after its adoption, or nothing
  adoptable) is deleted: its entries are committed already (the shards re-offered them) or
  belong to a deleted topic, and no record references it.

Orphans are planned oldest first (by the cycle's cut time, then key), so an object's data can
follow an older orphan's. The plan is pure (``plan_adoption``). Nothing but this broker's flusher
commits its partitions and it is not serving yet, so an entry not at the high watermark now never
will be: deleting the object loses nothing. A commit that fails (the coordinator or the store
down) stops recovery without deleting anything: later orphans may build on the failed one, and
the next flusher boot tries again.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import msgspec

from kafscale import metrics
from kafscale.config import Config
from kafscale.flusher.objects import chunk_record
from kafscale.ipc import messages, write_path
from kafscale.ipc.rpc import Bulk, Reply, RpcError
from kafscale.metadata import records
from kafscale.metadata.records import Keys, WalRecord
from kafscale.metadata.store import MetadataStore, MetadataStoreError
from kafscale.protocol.records import BatchHeader
from kafscale.shards.producers import ProducerStates
from kafscale.storage import wal
from kafscale.storage.faults import FaultLog
from kafscale.storage.objects import ObjectNotFound, ObjectStore, ObjectStoreError
from kafscale.storage.segment import read_batch_header
from kafscale.storage.wal import CorruptObject, DirectoryEntry

log = logging.getLogger(__name__)

COMMIT_TIMEOUT_MS = 30_000  # an object may touch thousands of partitions: several transactions
UNDECODABLE = (msgspec.DecodeError, ValueError, KeyError, TypeError)

PartitionId = tuple[str, int]


class Coordinator(Protocol):
    """What recovery needs of the coordinator's client (``kafscale.ipc.rpc.RpcClient``)."""

    def call(self, message: messages.Message, bulk: Bulk = (), timeout_ms: int = 1000) -> Reply: ...


@dataclass(frozen=True, slots=True)
class Orphan:
    """An uploaded object without a WalRecord, as read and verified: its directory entries and,
    for each (same order), the headers of its chunk's batches."""

    key: str
    size: int
    created_ms: int
    entries: tuple[DirectoryEntry, ...]
    batches: tuple[tuple[BatchHeader, ...], ...]


@dataclass(frozen=True, slots=True)
class Committed:
    """A partition's committed state, as recovery needs it (its topic exists with this id)."""

    topic_id: str
    high_watermark: int
    producers: write_path.Producers


@dataclass(frozen=True, slots=True)
class Adoption:
    """An entry to adopt and its partition's producer state once it is committed."""

    entry: DirectoryEntry
    producers: write_path.Producers


def plan_adoption(
    orphans: Iterable[Orphan], partitions: Mapping[PartitionId, Committed]
) -> list[tuple[Orphan, list[Adoption]]]:
    """Each orphan, oldest first, with the entries it adopts: those starting exactly where the
    partition's log ends, counting what earlier orphans adopt. Each adoption carries the
    partition's committed producer state with the batches of every entry adopted so far."""
    ends = {partition: state.high_watermark for partition, state in partitions.items()}
    producers: dict[PartitionId, ProducerStates] = {}
    plan = []
    for orphan in sorted(orphans, key=lambda o: (o.created_ms, o.key)):
        adopted = []
        for entry, headers in zip(orphan.entries, orphan.batches, strict=True):
            partition = (entry.topic, entry.partition)
            state = partitions.get(partition)
            if state is None or state.topic_id != entry.topic_id:
                continue
            if ends[partition] == entry.base_offset:
                states = producers.setdefault(partition, ProducerStates.restore(state.producers))
                for header in headers:
                    states.record_batch(header)
                adopted.append(Adoption(entry, states.snapshot()))
                ends[partition] = entry.last_offset + 1
        plan.append((orphan, adopted))
    return plan


def commit_request(
    orphan: Orphan, adopted: Sequence[Adoption], broker_id: int
) -> write_path.CommitObject:
    """The ``CommitObject`` that adopts ``adopted`` of ``orphan``."""
    chunks = [_chunk(orphan.key, adoption) for adoption in adopted]
    record = WalRecord(
        key=orphan.key,
        size=orphan.size,
        created_ms=orphan.created_ms,
        broker_id=broker_id,
        entries=[(c.topic, c.partition, c.chunk.base_offset) for c in chunks],
    )
    return write_path.CommitObject(wal=record, chunks=chunks)


def _chunk(key: str, adoption: Adoption) -> write_path.ObjectChunk:
    entry = adoption.entry
    return write_path.ObjectChunk(
        topic=entry.topic,
        topic_id=entry.topic_id,
        partition=entry.partition,
        chunk=chunk_record(key, entry),
        producers=adoption.producers,
        leader_epoch=write_path.ANY_EPOCH,  # at whatever epoch this broker owns it now
    )


def adopt_orphans(
    config: Config, objects: ObjectStore, store: MetadataStore, coordinator: Coordinator
) -> None:
    """Adopt or remove this broker's uncommitted write-ahead objects (see the module docstring).
    Never raises for a backend that fails: what is left is tried again at the next boot."""
    recovery = _Recovery(config, objects, store, coordinator)
    try:
        recovery.run()
    except (ObjectStoreError, MetadataStoreError, RpcError, CommitFailed) as exc:
        log.error(
            "recovery of uncommitted WAL objects stopped; the next flusher start tries again",
            extra={"error": str(exc)},
        )


class CommitFailed(Exception):
    """The coordinator could not commit an adoption."""


class _Recovery:
    def __init__(
        self, config: Config, objects: ObjectStore, store: MetadataStore, coordinator: Coordinator
    ) -> None:
        self.namespace = config.s3_namespace
        self.broker_id = config.broker_id
        self.objects = objects
        self.store = store
        self.coordinator = coordinator
        self.keys = Keys(self.namespace)
        self.faults = FaultLog(log, "recovery", metrics.READ_FAULTS.labels("recovery").inc)

    def run(self) -> None:
        orphans = [
            orphan
            for info in self.objects.list(wal.broker_prefix(self.namespace, self.broker_id))
            if (orphan := self._orphan(info.key)) is not None
        ]
        if not orphans:
            return
        partitions = self._partitions({(e.topic, e.partition) for o in orphans for e in o.entries})
        plan = plan_adoption(orphans, partitions)
        for orphan, adopted in plan:
            if adopted:
                self._commit(orphan, adopted)
        for orphan, _ in plan:
            self._delete_unless_recorded(orphan)

    def _orphan(self, key: str) -> Orphan | None:
        """The object at ``key`` if it has no WalRecord and reads whole and intact."""
        try:
            record_key = self.keys.wal_object(wal.object_name(key))
        except ValueError:
            log.warning("not a write-ahead object key: left alone", extra={"key": key})
            return None
        if self.store.get(record_key) is not None:
            return None  # committed: the coordinator's garbage collector owns it
        try:
            data = self.objects.get(key)
        except ObjectNotFound:
            return None
        try:
            parsed = wal.parse_object(data)
        except CorruptObject as exc:
            self.faults.report(key, f"uncommitted WAL object is corrupt, left alone: {exc}")
            return None
        batches = tuple(_batch_headers(chunk) for chunk in parsed.chunks)
        return Orphan(key, parsed.size, parsed.header.created_ms, parsed.entries, batches)

    def _partitions(self, wanted: set[PartitionId]) -> dict[PartitionId, Committed]:
        """The committed state of each partition in ``wanted`` whose topic exists with the
        partition record's topic id."""
        topic_ids: dict[str, str | None] = {}
        found = {}
        for topic, partition in sorted(wanted):
            if topic not in topic_ids:
                topic_ids[topic] = self._topic_id(topic)
            kv = self.store.get(self.keys.partition(topic, partition))
            if kv is None or topic_ids[topic] is None:
                continue
            try:
                state = records.decode_partition(kv.value)
            except UNDECODABLE as exc:
                self.faults.report(kv.key, f"partition record does not decode: {exc}")
                continue
            if state.topic_id == topic_ids[topic]:
                found[(topic, partition)] = Committed(
                    state.topic_id, state.high_watermark, state.producers
                )
        return found

    def _topic_id(self, topic: str) -> str | None:
        kv = self.store.get(self.keys.topic(topic))
        if kv is None:
            return None
        try:
            return records.decode_topic(kv.value).topic_id
        except UNDECODABLE as exc:
            self.faults.report(kv.key, f"topic record does not decode: {exc}")
            return None

    def _commit(self, orphan: Orphan, adopted: list[Adoption]) -> None:
        """Commit the adoption (the coordinator records the object if any entry was written).
        Raises CommitFailed."""
        request = commit_request(orphan, adopted, self.broker_id)
        reply = self.coordinator.call(request, timeout_ms=COMMIT_TIMEOUT_MS).message
        if not isinstance(reply, write_path.ObjectCommitResult):
            error = reply.message if isinstance(reply, messages.ErrorReply) else repr(reply)
            raise CommitFailed(f"adopting {orphan.key}: {error}")
        committed = [
            f"{r.topic}-{r.partition}@{r.base_offset}" for r in reply.results if r.committed
        ]
        refused = [
            f"{r.topic}-{r.partition}@{r.base_offset}: {r.error}"
            for r in reply.results
            if not r.committed
        ]
        fields = {"key": orphan.key, "adopted": committed, "refused": refused}
        if committed:
            log.warning(
                "adopted an uncommitted WAL object: its data is committed, with the producer "
                "state its batches carry",
                extra=fields,
            )
        else:
            log.info("the coordinator adopted nothing of an uncommitted WAL object", extra=fields)

    def _delete_unless_recorded(self, orphan: Orphan) -> None:
        """Delete the orphan unless the coordinator recorded it: adopted (or committed by the
        previous flusher after all), it is the garbage collector's. Unrecorded, no record
        references it (a commit writes the WalRecord with its first chunk)."""
        if self.store.get(self.keys.wal_object(wal.object_name(orphan.key))) is not None:
            return
        self.objects.delete(orphan.key)
        log.info(
            "deleted an uncommitted WAL object: nothing in it was adoptable",
            extra={"key": orphan.key, "entries": len(orphan.entries)},
        )


def _batch_headers(chunk: memoryview) -> tuple[BatchHeader, ...]:
    """The headers of a chunk's batches (``wal.parse_object`` checked that they frame it)."""
    headers = []
    at = 0
    while at < len(chunk):
        header = read_batch_header(chunk, at)
        headers.append(header)
        at += header.size
    return tuple(headers)
