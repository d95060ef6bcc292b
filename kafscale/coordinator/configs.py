"""The coordinator's side of AlterConfigs, IncrementalAlterConfigs and CreatePartitions.

``alter_topic`` and ``increase_partitions`` are pure: a topic's current record and one request
in, the record to write (or None) and the topic's result out. ``ConfigAdmin`` reads each record,
applies them and writes the outcome with a compare-and-set on the record's revision, so a topic
deleted or changed in between is re-read, never overwritten. Replies carry the store revision
that holds the writes, for the frontend to wait on (``caught_up``) before it answers the client.

A partition added here is empty and usable at once: the shards load partitions on first use, and
Metadata, Produce and Fetch read the partition count from the topic record. ``__consumer_offsets``
keeps its count: it decides which broker coordinates each group, and a new count would move groups
to partitions other coordinators own while their current ones still serve them.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

import msgspec

from kafscale.coordinator.topics import MAX_PARTITIONS
from kafscale.ipc.consumer_groups import (
    AlterGroupConfigs,
    GroupConfigChanges,
    GroupConfigResult,
    GroupConfigResults,
)
from kafscale.ipc.messages import (
    AlterTopicConfigs,
    CreatePartitions,
    PartitionIncrease,
    TopicConfigChanges,
    TopicResult,
    TopicResults,
)
from kafscale.ipc.rpc import Handler, Incoming
from kafscale.metadata import group_configs, records, topic_configs
from kafscale.metadata.records import Keys, TopicRecord
from kafscale.metadata.store import Compare, Delete, MetadataStore, Put
from kafscale.metadata.topic_names import OFFSETS_TOPIC, name_error
from kafscale.protocol.errors import ErrorCode

log = logging.getLogger(__name__)

ATTEMPTS = 5  # compare-and-set retries per topic before giving up with a retriable error

# A topic's current record (None: no such topic) -> the record to write (None: none), result.
_Change = Callable[[TopicRecord | None], tuple[TopicRecord | None, TopicResult]]


def _error(name: str, code: ErrorCode, message: str) -> TopicResult:
    return TopicResult(name=name, error_code=int(code), error_message=message)


def _unknown(name: str) -> TopicResult:
    if (problem := name_error(name)) is not None:
        return _error(name, ErrorCode.invalid_topic_exception, problem)
    return _error(name, ErrorCode.unknown_topic_or_partition, f"The topic '{name}' does not exist.")


def alter_topic(
    record: TopicRecord | None, request: TopicConfigChanges, replace: bool
) -> tuple[TopicRecord | None, TopicResult]:
    """The record with its configs altered (None if there is nothing to write), and the result."""
    name = request.topic
    if record is None:
        return None, _unknown(name)
    try:
        if replace:
            configs = topic_configs.replaced([(c.name, c.value) for c in request.changes])
        else:
            changes = [(c.name, c.operation, c.value) for c in request.changes]
            configs = topic_configs.altered(record.configs, changes)
    except topic_configs.InvalidTopicConfig as exc:
        return None, _error(name, ErrorCode.invalid_config, str(exc))
    except topic_configs.InvalidAlteration as exc:
        return None, _error(name, ErrorCode.invalid_request, str(exc))
    result = TopicResult(name=name, error_code=0, topic_id=record.topic_id, configs=configs)
    if configs == record.configs:
        return None, result
    return msgspec.structs.replace(record, configs=configs), result


def increase_partitions(
    record: TopicRecord | None, request: PartitionIncrease, broker_id: int
) -> tuple[TopicRecord | None, TopicResult]:
    """The record with ``request.count`` partitions, and the result; errors as Kafka's
    controller words them. One broker holds every partition, so the only consistent replica
    assignment of a new partition is ``[broker_id]``."""
    name, count = request.topic, request.count
    if record is None:
        return None, _unknown(name)
    current = record.partitions
    if name == OFFSETS_TOPIC:
        return None, _error(
            name,
            ErrorCode.invalid_partitions,
            f"The partition count of {OFFSETS_TOPIC} decides each group's coordinator; it "
            "cannot change.",
        )
    if count == current:
        return None, _error(
            name, ErrorCode.invalid_partitions, f"Topic already has {current} partition(s)."
        )
    if count < current:
        return None, _error(
            name,
            ErrorCode.invalid_partitions,
            f"The topic {name} currently has {current} partition(s); {count} would not be an "
            "increase.",
        )
    if count > MAX_PARTITIONS:
        return None, _error(
            name,
            ErrorCode.invalid_partitions,
            f"The number of partitions cannot exceed {MAX_PARTITIONS}, got {count}.",
        )
    if request.assignments is not None:
        problem = _assignment_problem(request.assignments, current, count, broker_id)
        if problem is not None:
            return None, _error(name, ErrorCode.invalid_replica_assignment, problem)
    result = TopicResult(
        name=name,
        error_code=0,
        topic_id=record.topic_id,
        partitions=count,
        replication_factor=record.replication_factor,
    )
    return msgspec.structs.replace(record, partitions=count), result


def _assignment_problem(
    assignments: list[list[int]], current: int, count: int, broker_id: int
) -> str | None:
    added = count - current
    if len(assignments) != added:
        return (
            f"Attempted to add {added} additional partition(s), but only {len(assignments)} "
            "assignment(s) were specified."
        )
    for index, replicas in enumerate(assignments, start=current):
        if replicas != [broker_id]:
            return (
                f"Partition {index} is assigned to brokers {replicas}, but KafScale has one "
                f"broker (id {broker_id}) holding every partition: assign [{broker_id}]."
            )
    return None


class ConfigAdmin:
    def __init__(self, store: MetadataStore, namespace: str, broker_id: int) -> None:
        self.store = store
        self.keys = Keys(namespace)
        self.group_keys = group_configs.GroupConfigKeys(self.keys.root)
        self.broker_id = broker_id

    def handlers(self) -> dict[type, Handler]:
        return {
            AlterGroupConfigs: self.handle_alter_groups,
            AlterTopicConfigs: self.handle_alter,
            CreatePartitions: self.handle_create_partitions,
        }

    def handle_alter(self, incoming: Incoming) -> TopicResults:
        assert isinstance(incoming.message, AlterTopicConfigs)
        return self.alter(incoming.message)

    def handle_create_partitions(self, incoming: Incoming) -> TopicResults:
        assert isinstance(incoming.message, CreatePartitions)
        return self.create_partitions(incoming.message)

    def alter(self, request: AlterTopicConfigs) -> TopicResults:
        results, revision = [], 0
        for changes in request.topics:
            result, written = self._update(
                changes.topic,
                functools.partial(alter_topic, request=changes, replace=request.replace),
                request.validate_only,
            )
            if written:
                log.info(
                    "topic configs altered",
                    extra={"topic": changes.topic, "configs": result.configs},
                )
            results.append(result)
            revision = max(revision, written)
        return TopicResults(results=results, revision=revision)

    def handle_alter_groups(self, incoming: Incoming) -> GroupConfigResults:
        assert isinstance(incoming.message, AlterGroupConfigs)
        return self.alter_groups(incoming.message)

    def alter_groups(self, request: AlterGroupConfigs) -> GroupConfigResults:
        """Each group's configs, compare-and-set on its record (the group need not exist)."""
        results, revision = [], 0
        for changes in request.groups:
            result, written = self._update_group(changes, request)
            results.append(result)
            revision = max(revision, written)
        return GroupConfigResults(results, revision)

    def _update_group(
        self, changes: GroupConfigChanges, request: AlterGroupConfigs
    ) -> tuple[GroupConfigResult, int]:
        group_id = changes.group_id
        if not group_id:
            return GroupConfigResult(group_id, int(ErrorCode.invalid_group_id), None), 0
        key = self.group_keys.group(group_id)
        for _ in range(ATTEMPTS):
            kv = self.store.get(key)
            current = group_configs.decode(kv.value).configs if kv is not None else {}
            configs, problem = group_configs.apply(current, changes.changes, request.incremental)
            if problem is not None:
                return GroupConfigResult(group_id, int(ErrorCode.invalid_config), problem), 0
            if request.validate_only or configs == current:
                return GroupConfigResult(group_id, int(ErrorCode.none)), 0
            record = group_configs.GroupConfigRecord(group_id, configs)
            if configs:
                operation: Put | Delete = Put(key, group_configs.encode(record))
            else:
                operation = Delete(key)
            compare = Compare(key, mod_revision=kv.mod_revision if kv is not None else 0)
            txn = self.store.transaction([compare], [operation])
            if txn.succeeded:
                log.info("group configs altered", extra={"group": group_id, "configs": configs})
                return GroupConfigResult(group_id, int(ErrorCode.none)), txn.revision
        message = f"group {group_id} configs kept changing during the update; retry"
        return GroupConfigResult(group_id, int(ErrorCode.request_timed_out), message), 0

    def create_partitions(self, request: CreatePartitions) -> TopicResults:
        results, revision = [], 0
        for increase in request.topics:
            result, written = self._update(
                increase.topic,
                functools.partial(increase_partitions, request=increase, broker_id=self.broker_id),
                request.validate_only,
            )
            if written:
                log.info(
                    "partitions added",
                    extra={"topic": increase.topic, "partitions": increase.count},
                )
            results.append(result)
            revision = max(revision, written)
        return TopicResults(results=results, revision=revision)

    def _update(self, name: str, change: _Change, validate_only: bool) -> tuple[TopicResult, int]:
        """The topic's result and the revision of the write (0 if nothing was written)."""
        key = self.keys.topic(name)
        for _ in range(ATTEMPTS):
            kv = self.store.get(key) if name_error(name) is None else None
            record = records.decode_topic(kv.value) if kv is not None else None
            updated, result = change(record)
            if updated is None or validate_only or kv is None:
                return result, 0
            txn = self.store.transaction(
                [Compare(key, mod_revision=kv.mod_revision)], [Put(key, records.encode(updated))]
            )
            if txn.succeeded:
                return result, txn.revision
        message = f"topic {name} kept changing during the update; retry"
        return _error(name, ErrorCode.request_timed_out, message), 0
