"""The coordinator's topic administration: applies creations and deletions to the stores.

Every write is a compare-and-set (``kafscale.coordinator.topics`` explains the deletion marker).
A deletion interrupted by a crash is finished when the coordinator starts again
(``resume_deletions``), so no topic's objects outlive it. A topic can hold thousands of segments
and the coordinator serves groups and keeps the broker's lease on the same thread, so a deletion
removes objects and metadata keys in batches (S3 DeleteObjects, transactions of many deletes).

A namespace whose ``__consumer_offsets`` was created before groups had coordinators (with no
partitions) gets ``offsets_partitions`` of them at start (``grow_offsets_topic``): with none, no
broker could coordinate a group. A count it was created with is never changed.

A topic's chunk records reference write-ahead objects that hold other topics' data too: those
objects are the WAL garbage collector's (``wal_gc.WalReferences``), which follows the deletions
of the records by its watch and deletes an object once nothing references it.
"""

from __future__ import annotations

import logging

import msgspec

from kafscale.coordinator import topics
from kafscale.ipc.messages import CreateTopics, DeleteTopics, TopicResult, TopicResults
from kafscale.ipc.rpc import Incoming
from kafscale.metadata import records
from kafscale.metadata.records import Keys, TopicRecord
from kafscale.metadata.store import Compare, Delete, MetadataStore, Put
from kafscale.metadata.topic_names import OFFSETS_TOPIC
from kafscale.protocol.errors import ErrorCode
from kafscale.storage.objects import ObjectStore, ObjectStoreError

log = logging.getLogger(__name__)

MAX_OPERATIONS = 100  # per transaction (etcd allows 128)
OFFSETS_PARTITIONS = 50  # KAFSCALE_OFFSETS_TOPIC_PARTITIONS' default (Kafka's too)


class TopicAdmin:
    def __init__(
        self,
        store: MetadataStore,
        objects: ObjectStore,
        namespace: str,
        default_partitions: int,
        offsets_partitions: int = OFFSETS_PARTITIONS,
    ) -> None:
        self.store = store
        self.objects = objects
        self.namespace = namespace
        self.keys = Keys(namespace)
        self.default_partitions = default_partitions
        self.offsets_partitions = offsets_partitions

    def handle_create(self, incoming: Incoming) -> TopicResults:
        assert isinstance(incoming.message, CreateTopics)
        return self.create(incoming.message)

    def handle_delete(self, incoming: Incoming) -> TopicResults:
        assert isinstance(incoming.message, DeleteTopics)
        return self.delete(incoming.message)

    def create(self, request: CreateTopics) -> TopicResults:
        existing = self._topics()
        deleting = [
            kv.key[len(self.keys.deleting) :] for kv in self.store.get_prefix(self.keys.deleting)
        ]
        outcomes = topics.check_creations(
            request.topics, existing, deleting, self.default_partitions, self.offsets_partitions
        )
        results = []
        revision = 0
        for outcome in outcomes:
            record = outcome.record
            if record is None or request.validate_only:
                results.append(outcome.result)
                continue
            key = self.keys.topic(record.name)
            txn = self.store.transaction(
                [Compare.absent(key), Compare.absent(self.keys.deleting_topic(record.name))],
                [Put(key, records.encode(record))],
            )
            if txn.succeeded:
                revision = max(revision, txn.revision)
                log.info(
                    "topic created",
                    extra={
                        "topic": record.name,
                        "topic_id": record.topic_id,
                        "partitions": record.partitions,
                    },
                )
                results.append(outcome.result)
            else:
                results.append(
                    TopicResult(
                        name=record.name,
                        error_code=int(ErrorCode.topic_already_exists),
                        error_message=f"topic {record.name} already exists",
                    )
                )
        return TopicResults(results=results, revision=revision)

    def delete(self, request: DeleteTopics) -> TopicResults:
        existing = self._topics()
        results = []
        for result, record in topics.check_deletions(request.names, request.topic_ids, existing):
            if record is not None and not self._mark_deleted(record):
                result = TopicResult(
                    name=record.name,
                    error_code=int(ErrorCode.unknown_topic_or_partition),
                    error_message=f"topic {record.name} changed concurrently",
                )
            results.append(result)
        revision = self.store.revision()
        self.resume_deletions()
        return TopicResults(results=results, revision=revision)

    def grow_offsets_topic(self) -> None:
        """Give a partitionless ``__consumer_offsets`` (an earlier version's) its partitions."""
        kv = self.store.get(self.keys.topic(OFFSETS_TOPIC))
        if kv is None or records.decode_topic(kv.value).partitions > 0:
            return
        record = msgspec.structs.replace(
            records.decode_topic(kv.value), partitions=self.offsets_partitions
        )
        txn = self.store.transaction(
            [Compare(kv.key, mod_revision=kv.mod_revision)], [Put(kv.key, records.encode(record))]
        )
        if txn.succeeded:  # else another broker did it meanwhile
            log.info(
                "consumer offsets topic given partitions",
                extra={"topic": OFFSETS_TOPIC, "partitions": record.partitions},
            )

    def resume_deletions(self) -> None:
        """Remove the objects of every topic marked deleted, then its marker."""
        for kv in self.store.get_prefix(self.keys.deleting):
            record = records.decode_topic(kv.value)
            try:
                removed = self._delete_objects(record.name)
            except ObjectStoreError as exc:
                log.error(
                    "cannot remove a deleted topic's objects yet",
                    extra={"topic": record.name, "error": str(exc)},
                )
                continue
            self._delete_keys(self.keys.topic_partitions(record.name))
            self._delete_keys(self.keys.topic_segments(record.name))
            self._delete_keys(self.keys.topic_leaders(record.name))  # before the name is free
            self.store.transaction(
                [Compare(kv.key, mod_revision=kv.mod_revision)], [Delete(kv.key)]
            )
            log.info(
                "topic deleted",
                extra={
                    "topic": record.name,
                    "topic_id": record.topic_id,
                    "objects_removed": removed,
                },
            )

    def _mark_deleted(self, record: TopicRecord) -> bool:
        key = self.keys.topic(record.name)
        current = self.store.get(key)
        if current is None or records.decode_topic(current.value).topic_id != record.topic_id:
            return False
        txn = self.store.transaction(
            [Compare(key, mod_revision=current.mod_revision)],
            [Delete(key), Put(self.keys.deleting_topic(record.name), current.value)],
        )
        return txn.succeeded

    def _delete_objects(self, topic: str) -> int:
        objects = self.objects.list(f"{self.namespace}/{topic}/")
        self.objects.delete_many([info.key for info in objects])
        return len(objects)

    def _delete_keys(self, prefix: str) -> None:
        """Delete every key under ``prefix``."""
        found = self.store.get_prefix(prefix)
        for start in range(0, len(found), MAX_OPERATIONS):
            batch = found[start : start + MAX_OPERATIONS]
            self.store.transaction([], [Delete(kv.key) for kv in batch])

    def _topics(self) -> dict[str, TopicRecord]:
        found = {}
        for kv in self.store.get_prefix(self.keys.topics):
            try:
                record = records.decode_topic(kv.value)
            except msgspec.DecodeError:
                log.error("undecodable topic record", extra={"key": kv.key})
                continue
            found[record.name] = record
        return found
