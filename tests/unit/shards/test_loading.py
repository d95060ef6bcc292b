"""When a shard's first load of a partition looks for a previous version's uncommitted segments
(``PartitionLoader.load``): only in a topic that version created (``TopicRecord.write_path``
absent) whose partition record no commit of this version has touched (``owner`` -1), since the
look is an object store LIST. The embedded metadata store, a real local object store counting
its LISTs, and the real partition committer behind the coordinator's RPC."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kafscale import config as configuration
from kafscale.coordinator.admin import TopicAdmin
from kafscale.coordinator.partitions import PartitionCommitter
from kafscale.ipc import messages, write_path
from kafscale.metadata import records as metadata
from kafscale.metadata.records import WRITE_PATH_WAL, Keys, PartitionRecord
from kafscale.metadata.sqlite import SqliteMetadataStore
from kafscale.protocol import records
from kafscale.shards.loading import PartitionLoader
from kafscale.storage import segment as segments
from kafscale.storage.local import LocalObjectStore
from kafscale.storage.objects import ObjectInfo
from tests.unit.leaders import ClaimedLeaders

T0 = 1_700_000_000_000
LEGACY, LEGACY_ID = "legacy", str(uuid.UUID(int=15))


class CountingObjectStore(LocalObjectStore):
    """A local object store that remembers the prefix of every LIST."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.listed: list[str] = []

    def list(self, prefix: str) -> list[ObjectInfo]:
        self.listed.append(prefix)
        return super().list(prefix)


@dataclass
class Reply:
    message: messages.Message


@dataclass
class Coordinator:
    """The coordinator's RPC, answered by the real committer on the same metadata store."""

    committer: PartitionCommitter

    def call(self, request: write_path.CommitSegment, timeout_ms: int = 0) -> Reply:
        return Reply(self.committer.commit(request))


class Rig:
    def __init__(self, tmp_path: Path) -> None:
        env = {"KAFSCALE_DATA_DIR": str(tmp_path), "KAFSCALE_SHARDS": "1"}
        self.config = configuration.load(env)
        self.namespace = self.config.s3_namespace
        self.keys = Keys(self.namespace)
        self.store = SqliteMetadataStore(str(tmp_path / "metadata.sqlite"))
        self.objects = CountingObjectStore(str(tmp_path / "objects"))
        self.admin = TopicAdmin(self.store, self.objects, self.namespace, 1)
        self.leaders = ClaimedLeaders(self.store, self.namespace, broker=0)
        coordinator = Coordinator(PartitionCommitter(self.store, self.namespace, self.leaders))
        self.loader = PartitionLoader(
            self.config, self.store, self.objects, coordinator, uuid.uuid4().hex[:12], 0
        )

    def create(self, name: str, partitions: int) -> metadata.TopicRecord:
        """A topic created as the coordinator creates one now."""
        spec = messages.TopicSpec(name=name, partitions=partitions)
        self.admin.create(messages.CreateTopics(topics=[spec]))
        found = self.store.get(self.keys.topic(name))
        assert found is not None
        return metadata.decode_topic(found.value)

    def previous_version(self, high_watermark: int, owner: int | None = None) -> None:
        """Topic ``legacy`` as the previous version wrote it (no write_path), its partition 0
        committed up to ``high_watermark`` (with ``owner`` if given: a commit of this version),
        and a segment at the high watermark that was uploaded but never committed."""
        topic = {"name": LEGACY, "topic_id": LEGACY_ID, "partitions": 1, "configs": {},
                 "replication_factor": 1, "created_ms": T0 - 1000}  # fmt: skip
        self.store.put(self.keys.topic(LEGACY), json.dumps(topic).encode())
        partition: dict[str, object] = {
            "topic_id": LEGACY_ID, "high_watermark": high_watermark, "log_start_offset": 0,
            "producers": {},
        }  # fmt: skip
        if owner is not None:
            partition |= {"owner": owner, "leader_epoch": 0}
        self.store.put(self.keys.partition(LEGACY, 0), json.dumps(partition).encode())
        self.leaders.claim(LEGACY, [0])  # as this version's broker does before it loads
        batch = records.build_batch(
            [(None, b"uncommitted-%d" % i, (), T0) for i in range(3)], base_offset=high_watermark
        )
        kfs, index = segments.build_segment([batch], flags=0, created_ms=T0)
        assert self.objects.put_if_absent(
            segments.segment_key(self.namespace, LEGACY, 0, high_watermark), kfs
        )
        assert self.objects.put_if_absent(
            segments.index_key(self.namespace, LEGACY, 0, high_watermark), index
        )

    def partition_record(self, topic: str, index: int) -> PartitionRecord:
        found = self.store.get(self.keys.partition(topic, index))
        assert found is not None
        return metadata.decode_partition(found.value)


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    rig = Rig(tmp_path)
    yield rig
    rig.store.close()


def test_a_topic_created_now_loads_its_partitions_without_listing(rig: Rig) -> None:
    topic = rig.create("events", partitions=8)
    assert topic.write_path == WRITE_PATH_WAL
    for index in range(8):
        log = rig.loader.load("events", topic.topic_id, index, topic.created_ms)
        assert log.high_watermark == 0
        log.close()
    assert rig.objects.listed == []


def test_a_previous_versions_uncommitted_segment_is_adopted_on_load(rig: Rig) -> None:
    rig.previous_version(high_watermark=5)
    found = rig.store.get(rig.keys.topic(LEGACY))
    assert found is not None and metadata.decode_topic(found.value).write_path == 1
    log = rig.loader.load(LEGACY, LEGACY_ID, 0, T0 - 1000)
    try:
        assert log.high_watermark == 8
    finally:
        log.close()
    assert rig.objects.listed == [segments.segment_prefix(rig.namespace, LEGACY, 0)]
    assert rig.partition_record(LEGACY, 0).high_watermark == 8
    [adopted] = rig.store.get_prefix(rig.keys.segments(LEGACY, 0))
    assert metadata.decode_segment(adopted.value).base_offset == 5


def test_a_previous_versions_partition_this_version_committed_to_is_not_listed(
    rig: Rig,
) -> None:
    rig.previous_version(high_watermark=5, owner=0)
    log = rig.loader.load(LEGACY, LEGACY_ID, 0, T0 - 1000)
    try:
        assert log.high_watermark == 5
    finally:
        log.close()
    assert rig.objects.listed == []


def test_a_partition_of_a_topic_that_is_gone_is_not_listed(rig: Rig) -> None:
    rig.previous_version(high_watermark=5)
    recreated = str(uuid.UUID(int=16))  # a request from a view that knew an earlier topic
    log = rig.loader.load(LEGACY, recreated, 0, T0 - 1000)
    log.close()
    rig.store.delete(rig.keys.topic(LEGACY))
    log = rig.loader.load(LEGACY, LEGACY_ID, 0, T0 - 1000)
    log.close()
    assert rig.objects.listed == []
