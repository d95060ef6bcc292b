"""Topic creation and deletion: validation as Kafka does it, then compare-and-set writes.

``check_creations``/``check_deletions`` are pure: given the request and the current records they
decide each topic's outcome (a Kafka error, or the record to write). The coordinator then writes
each accepted topic with a transaction that only succeeds if the key is still absent (or still at
the revision that was read), so two creators of one name cannot both win.

Deleting a topic moves its record to ``deleting/{name}`` in one transaction, removes the topic's
objects, then drops the marker. While the marker exists the name cannot be created again, so a
re-created topic can never see an old segment (segment keys restart at offset 0).

Internal topics get their partition count from the broker, whatever the request asked for:
``__consumer_offsets`` (created by the first FindCoordinator) ``KAFSCALE_OFFSETS_TOPIC_PARTITIONS``
(each partition's owner coordinates the groups hashing to it; its partitions hold no data), the
others none.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from kafscale.ipc.messages import TopicResult, TopicSpec
from kafscale.metadata import topic_configs
from kafscale.metadata.records import WRITE_PATH_WAL, TopicRecord
from kafscale.metadata.topic_names import INTERNAL_TOPICS, OFFSETS_TOPIC, name_error
from kafscale.protocol.errors import ErrorCode

# Every partition has an owner: a leader key, a claim and a hand-over (docs/design/scale-out.md).
# A topic of 65,000 partitions (a fuzzed CreateTopics made one) keeps a coordinator claiming for
# minutes and every process's view copying the leader keys; 10,000 keeps a claim wave to seconds.
MAX_PARTITIONS = 10_000


@dataclass(frozen=True)
class Creation:
    """An accepted topic to write, or an error for it."""

    result: TopicResult
    record: TopicRecord | None = None


def _error(name: str | None, code: ErrorCode, message: str) -> Creation:
    return Creation(TopicResult(name=name, error_code=int(code), error_message=message))


def check_creations(
    specs: Sequence[TopicSpec],
    existing: Mapping[str, TopicRecord],
    deleting: Iterable[str],
    default_partitions: int,
    offsets_partitions: int,
) -> list[Creation]:
    counts = Counter(spec.name for spec in specs)
    being_deleted = set(deleting)
    outcomes = []
    for spec in specs:
        if counts[spec.name] > 1:
            outcomes.append(
                _error(
                    spec.name,
                    ErrorCode.invalid_request,
                    f"topic {spec.name} appears more than once in the request",
                )
            )
        else:
            outcomes.append(
                _check_one(spec, existing, being_deleted, default_partitions, offsets_partitions)
            )
    return outcomes


def _check_one(
    spec: TopicSpec,
    existing: Mapping[str, TopicRecord],
    deleting: set[str],
    default_partitions: int,
    offsets_partitions: int,
) -> Creation:
    if (problem := name_error(spec.name)) is not None:
        return _error(spec.name, ErrorCode.invalid_topic_exception, problem)
    if spec.name in existing:
        return _error(
            spec.name, ErrorCode.topic_already_exists, f"topic {spec.name} already exists"
        )
    if spec.name in deleting:
        return _error(
            spec.name,
            ErrorCode.topic_already_exists,
            f"topic {spec.name} is marked for deletion; retry shortly",
        )
    partitions = default_partitions if spec.partitions == -1 else spec.partitions
    if spec.name == OFFSETS_TOPIC:
        # Committed offsets and groups are metadata records, not data in this topic: its
        # partitions only name the group coordinators (the owner of each), as on Kafka.
        partitions = offsets_partitions
    elif spec.name in INTERNAL_TOPICS:
        # Transactions and share groups do not exist here: the topic only shows it exists.
        partitions = 0
    elif not 1 <= partitions <= MAX_PARTITIONS:
        return _error(
            spec.name,
            ErrorCode.invalid_partitions,
            f"number of partitions must be between 1 and {MAX_PARTITIONS}, got {spec.partitions}",
        )
    if spec.replication_factor == 0 or spec.replication_factor < -1:
        return _error(
            spec.name,
            ErrorCode.invalid_replication_factor,
            f"replication factor must be positive, got {spec.replication_factor}",
        )
    try:
        configs = topic_configs.validate(spec.configs)
    except topic_configs.InvalidTopicConfig as exc:
        return _error(spec.name, ErrorCode.invalid_config, str(exc))
    replication_factor = 1 if spec.replication_factor == -1 else spec.replication_factor
    record = TopicRecord(
        name=spec.name,
        topic_id=str(uuid.uuid4()),
        partitions=partitions,
        configs=configs,
        replication_factor=replication_factor,
        created_ms=time.time_ns() // 1_000_000,
        write_path=WRITE_PATH_WAL,
    )
    return Creation(created(record), record)


def created(record: TopicRecord) -> TopicResult:
    return TopicResult(
        name=record.name,
        error_code=0,
        topic_id=record.topic_id,
        partitions=record.partitions,
        replication_factor=record.replication_factor,
        configs=dict(record.configs),
    )


def check_deletions(
    names: Sequence[str], topic_ids: Sequence[str], existing: Mapping[str, TopicRecord]
) -> list[tuple[TopicResult, TopicRecord | None]]:
    """Each named topic's record to delete, or its error (unknown name or id)."""
    by_id = {record.topic_id: record for record in existing.values()}
    # (name asked for, id asked for, the record found, the error if none was)
    wanted = [
        (
            name,
            None,
            existing.get(name),
            ErrorCode.unknown_topic_or_partition,
            f"unknown topic {name}",
        )
        for name in names
    ] + [
        (
            None,
            topic_id,
            by_id.get(topic_id),
            ErrorCode.unknown_topic_id,
            f"unknown topic id {topic_id}",
        )
        for topic_id in topic_ids
    ]
    outcomes: list[tuple[TopicResult, TopicRecord | None]] = []
    for name, topic_id, record, missing, message in wanted:
        if record is None:
            result = TopicResult(
                name=name, error_code=int(missing), error_message=message, topic_id=topic_id
            )
        else:
            result = TopicResult(name=record.name, error_code=0, topic_id=record.topic_id)
        outcomes.append((result, record))
    return outcomes
