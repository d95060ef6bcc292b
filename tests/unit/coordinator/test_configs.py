"""The coordinator's config alterations and partition increases on a real SQLite store."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kafscale.coordinator.admin import TopicAdmin
from kafscale.coordinator.configs import ConfigAdmin
from kafscale.ipc.messages import (
    AlterTopicConfigs,
    ConfigChange,
    CreatePartitions,
    CreateTopics,
    PartitionIncrease,
    TopicConfigChanges,
    TopicSpec,
)
from kafscale.metadata import records
from kafscale.metadata.records import Keys, TopicRecord
from kafscale.metadata.sqlite import SqliteMetadataStore
from kafscale.protocol.configs import AlterConfigOp
from kafscale.protocol.errors import ErrorCode
from kafscale.storage.local import LocalObjectStore

KEYS = Keys("ns")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteMetadataStore]:
    store = SqliteMetadataStore(str(tmp_path / "metadata.sqlite"))
    topics = TopicAdmin(store, LocalObjectStore(str(tmp_path / "objects")), "ns", 1)
    created = topics.create(
        CreateTopics(topics=[TopicSpec(name="orders", partitions=2, configs={"retention.ms": "5"})])
    )
    assert created.results[0].error_code == 0
    yield store
    store.close()


def record(store: SqliteMetadataStore, name: str = "orders") -> TopicRecord:
    kv = store.get(KEYS.topic(name))
    assert kv is not None
    return records.decode_topic(kv.value)


def alter(*changes: tuple[str, int, str | None], topic: str = "orders", **options: Any) -> Any:
    return AlterTopicConfigs(
        topics=[TopicConfigChanges(topic, [ConfigChange(n, op, v) for n, op, v in changes])],
        replace=options.pop("replace", False),
        **options,
    )


def test_alter_writes_the_record_and_reports_the_revision(store: SqliteMetadataStore) -> None:
    admin = ConfigAdmin(store, "ns", broker_id=0)
    before = record(store)
    reply = admin.alter(alter(("max.message.bytes", AlterConfigOp.SET, "100")))
    [result] = reply.results
    assert result.error_code == 0 and result.topic_id == before.topic_id
    after = record(store)
    assert after.configs == {"retention.ms": "5", "max.message.bytes": "100"}
    assert (after.topic_id, after.partitions) == (before.topic_id, 2)
    kv = store.get(KEYS.topic("orders"))
    assert kv is not None and reply.revision == kv.mod_revision


def test_replace_drops_the_configs_not_named(store: SqliteMetadataStore) -> None:
    admin = ConfigAdmin(store, "ns", broker_id=0)
    reply = admin.alter(alter(("segment.bytes", AlterConfigOp.SET, "1048576"), replace=True))
    assert reply.results[0].error_code == 0
    assert record(store).configs == {"segment.bytes": "1048576"}


def test_validate_only_errors_and_no_ops_write_nothing(store: SqliteMetadataStore) -> None:
    admin = ConfigAdmin(store, "ns", broker_id=0)
    revision = store.revision()
    dry = admin.alter(alter(("retention.ms", AlterConfigOp.DELETE, None), validate_only=True))
    assert dry.results[0].error_code == 0 and dry.revision == 0
    same = admin.alter(alter(("retention.ms", AlterConfigOp.SET, "5")))
    assert same.results[0].error_code == 0 and same.revision == 0
    bad = admin.alter(alter(("segment.ms", AlterConfigOp.SET, "0")))
    assert bad.results[0].error_code == ErrorCode.invalid_config
    ghost = admin.alter(alter(("retention.ms", AlterConfigOp.DELETE, None), topic="ghost"))
    assert ghost.results[0].error_code == ErrorCode.unknown_topic_or_partition
    illegal = admin.alter(alter(("retention.ms", AlterConfigOp.DELETE, None), topic="a/b"))
    assert illegal.results[0].error_code == ErrorCode.invalid_topic_exception
    assert store.revision() == revision
    assert record(store).configs == {"retention.ms": "5"}


def test_a_concurrent_change_is_re_read_not_overwritten(
    store: SqliteMetadataStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    admin = ConfigAdmin(store, "ns", broker_id=0)
    real_transaction = store.transaction
    interfered = []

    def transaction(*args: Any, **kwargs: Any) -> Any:
        if not interfered:  # another write lands between the read and the first attempt
            interfered.append(True)
            changed = record(store)
            grown = TopicRecord(changed.name, changed.topic_id, 7, changed.configs)
            store.put(KEYS.topic("orders"), records.encode(grown))
        return real_transaction(*args, **kwargs)

    monkeypatch.setattr(store, "transaction", transaction)
    reply = admin.alter(alter(("retention.bytes", AlterConfigOp.SET, "10")))
    assert reply.results[0].error_code == 0
    after = record(store)
    assert after.partitions == 7  # the concurrent change survived
    assert after.configs == {"retention.ms": "5", "retention.bytes": "10"}


def test_create_partitions(store: SqliteMetadataStore) -> None:
    admin = ConfigAdmin(store, "ns", broker_id=3)
    reply = admin.create_partitions(
        CreatePartitions(
            topics=[
                PartitionIncrease("orders", 4, [[3], [3]]),
                PartitionIncrease("ghost", 4),
            ]
        )
    )
    assert [(r.name, r.error_code) for r in reply.results] == [
        ("orders", 0),
        ("ghost", ErrorCode.unknown_topic_or_partition),
    ]
    assert reply.results[0].partitions == 4 and reply.revision == store.revision()
    assert record(store).partitions == 4 and record(store).configs == {"retention.ms": "5"}
    again = admin.create_partitions(CreatePartitions(topics=[PartitionIncrease("orders", 4)]))
    assert again.results[0].error_code == ErrorCode.invalid_partitions
    dry = admin.create_partitions(
        CreatePartitions(topics=[PartitionIncrease("orders", 9)], validate_only=True)
    )
    assert dry.results[0].error_code == 0 and dry.revision == 0
    assert record(store).partitions == 4


def test_a_topic_deleted_meanwhile_is_unknown(store: SqliteMetadataStore) -> None:
    admin = ConfigAdmin(store, "ns", broker_id=0)
    store.delete(KEYS.topic("orders"))
    reply = admin.create_partitions(CreatePartitions(topics=[PartitionIncrease("orders", 3)]))
    assert reply.results[0].error_code == ErrorCode.unknown_topic_or_partition
    assert store.get(KEYS.topic("orders")) is None


def test_the_consumer_offsets_partition_count_never_changes(store: SqliteMetadataStore) -> None:
    # it decides every group's coordinator: a new count would move groups between brokers
    TopicAdmin(store, LocalObjectStore("/nonexistent"), "ns", 1, offsets_partitions=3).create(
        CreateTopics(topics=[TopicSpec(name="__consumer_offsets", partitions=-1)])
    )
    admin = ConfigAdmin(store, "ns", broker_id=0)
    reply = admin.create_partitions(
        CreatePartitions(topics=[PartitionIncrease("__consumer_offsets", 60)])
    )
    assert reply.results[0].error_code == ErrorCode.invalid_partitions
    assert record(store, "__consumer_offsets").partitions == 3
