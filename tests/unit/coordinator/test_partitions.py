"""Segment commits on the embedded metadata store."""

from collections.abc import Iterator
from pathlib import Path

import pytest

from kafscale.coordinator.admin import TopicAdmin
from kafscale.coordinator.partitions import PartitionCommitter
from kafscale.ipc.messages import CreateTopics, DeleteTopics, TopicSpec
from kafscale.ipc.write_path import CommitSegment
from kafscale.metadata import records
from kafscale.metadata.records import Keys, SegmentRecord
from kafscale.metadata.sqlite import SqliteMetadataStore
from kafscale.storage.local import LocalObjectStore
from tests.unit.leaders import ClaimedLeaders


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[TopicAdmin, PartitionCommitter, str]]:
    store = SqliteMetadataStore(str(tmp_path / "metadata.sqlite"))
    admin = TopicAdmin(store, LocalObjectStore(str(tmp_path / "segments")), "ns", 1)
    created = admin.create(CreateTopics(topics=[TopicSpec(name="t", partitions=2)]))
    topic_id = created.results[0].topic_id
    assert topic_id is not None
    leaders = ClaimedLeaders(store, "ns")
    leaders.claim("t", [0, 1])
    yield admin, PartitionCommitter(store, "ns", leaders), topic_id
    store.close()


def segment(base: int, last: int) -> SegmentRecord:
    return SegmentRecord(
        base_offset=base,
        last_offset=last,
        size=100,
        index_size=28,
        records=last - base + 1,
        max_timestamp=1,
        created_ms=2,
    )


def commit(
    committer: PartitionCommitter, topic_id: str, base: int, last: int, partition: int = 0
) -> tuple[bool, int]:
    reply = committer.commit(
        CommitSegment(
            topic="t",
            topic_id=topic_id,
            partition=partition,
            segment=segment(base, last),
            producers={7: (0, 5, [(0, 9, base, last)])},
        )
    )
    return reply.committed, reply.high_watermark


def test_only_the_owner_commits_a_segment(
    setup: tuple[TopicAdmin, PartitionCommitter, str],
) -> None:
    _, committer, topic_id = setup
    assert isinstance(committer.leaders, ClaimedLeaders)
    committer.leaders.lose("t", 0)  # the key is gone: the fence fails the transaction
    assert commit(committer, topic_id, 0, 9) == (False, 0)
    committer.leaders.held.pop(("t", 0))
    reply = committer.commit(CommitSegment("t", topic_id, 0, segment(0, 9), producers={}))
    assert not reply.committed and (reply.error or "").startswith("fenced")


def test_commits_are_contiguous(setup: tuple[TopicAdmin, PartitionCommitter, str]) -> None:
    admin, committer, topic_id = setup
    assert commit(committer, topic_id, 0, 9) == (True, 10)
    assert commit(committer, topic_id, 10, 14) == (True, 15)
    assert commit(committer, topic_id, 10, 14) == (False, 15)  # a retry after success
    assert commit(committer, topic_id, 20, 25) == (False, 15)  # a gap
    assert commit(committer, topic_id, 0, 3, partition=1) == (True, 4)  # independent partition
    keys = Keys("ns")
    stored = admin.store.get(keys.partition("t", 0))
    assert stored is not None
    state = records.decode_partition(stored.value)
    assert (state.high_watermark, state.producers) == (15, {7: (0, 5, [(0, 9, 10, 14)])})
    assert [
        records.decode_segment(kv.value).base_offset
        for kv in admin.store.get_prefix(keys.segments("t", 0))
    ] == [0, 10]


def test_commit_to_a_deleted_or_recreated_topic_is_refused(
    setup: tuple[TopicAdmin, PartitionCommitter, str],
) -> None:
    admin, committer, topic_id = setup
    assert commit(committer, topic_id, 0, 4) == (True, 5)
    admin.delete(DeleteTopics(names=["t"]))
    keys = Keys("ns")
    assert admin.store.get_prefix(keys.topic_partitions("t")) == []
    assert admin.store.get_prefix(keys.topic_segments("t")) == []
    assert admin.store.get_prefix(keys.topic_leaders("t")) == []  # the name is free to claim
    committed, _ = commit(committer, topic_id, 5, 9)
    assert not committed
    new_id = admin.create(CreateTopics(topics=[TopicSpec(name="t", partitions=1)])).results[0]
    assert new_id.topic_id is not None
    assert isinstance(committer.leaders, ClaimedLeaders)
    committer.leaders.claim("t", [0])
    assert not commit(committer, topic_id, 0, 4)[0]  # the old incarnation's flush
    assert commit(committer, new_id.topic_id, 0, 4) == (True, 5)
