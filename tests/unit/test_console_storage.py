import logging
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import cast

import pytest

from kafscale.console.storage import (
    EMPTY,
    KINDS,
    BrokerStorage,
    PartitionStorage,
    StorageView,
    open_view,
    summarize,
)
from kafscale.metadata.records import (
    BrokerRecord,
    Keys,
    LeaderRecord,
    PartitionRecord,
    SegmentRecord,
    TopicRecord,
    encode,
)
from kafscale.metadata.sqlite import SqliteMetadataStore
from kafscale.metadata.store import KeyValue, MetadataStore, MetadataStoreUnavailable

NS = "ns"
KEYS = Keys(NS)
ORDERS_ID = "6d0f7b47-6e3e-4c0e-9a53-1f1b0d6e1d10"


def segment(base: int, last: int, max_timestamp: int, created_ms: int) -> SegmentRecord:
    return SegmentRecord(
        base_offset=base,
        last_offset=last,
        size=1000,
        index_size=24,
        records=last - base + 1,
        max_timestamp=max_timestamp,
        created_ms=created_ms,
    )


def chunk(base: int, last: int, max_timestamp: int, created_ms: int) -> SegmentRecord:
    return SegmentRecord(
        base_offset=base,
        last_offset=last,
        size=300,
        index_size=0,
        records=last - base + 1,
        max_timestamp=max_timestamp,
        created_ms=created_ms,
        object="ns/wal/0/token/00000000000000000001.wal",
        position=64,
    )


def fill(store: SqliteMetadataStore) -> None:
    """A cluster of two brokers and a topic "orders" of three partitions: p0 has two segments
    and a chunk, p1 one chunk without timestamp, p2 nothing at all; "gone" is being deleted."""
    put = store.put
    put(KEYS.cluster_id, b"cluster-1")
    put(
        KEYS.broker(1),
        encode(
            BrokerRecord(
                node_id=1,
                host="b1",
                port=9092,
                rack="a",
                draining=True,
                listeners={"PLAINTEXT": ("b1", 9092), "INTERNAL": ("b1.svc", 9093)},
            )
        ),
    )
    put(KEYS.broker(0), encode(BrokerRecord(node_id=0, host="b0", port=9092, ready=False)))
    topic = TopicRecord(
        name="orders",
        topic_id=ORDERS_ID,
        partitions=3,
        configs={"retention.ms": "3600000"},
        created_ms=500,
    )
    put(KEYS.topic("orders"), encode(topic))
    put(KEYS.partition("orders", 0), encode(PartitionRecord(ORDERS_ID, 30, 5, leader_epoch=3)))
    put(KEYS.partition("orders", 1), encode(PartitionRecord(ORDERS_ID, 4, leader_epoch=2)))
    put(KEYS.leader("orders", 0), encode(LeaderRecord(owner=1, epoch=4, lease=7, run_id="r")))
    put(KEYS.leader("orders", 2), encode(LeaderRecord(owner=1, epoch=1, lease=7, run_id="r")))
    put(KEYS.segment("orders", 0, 0), encode(segment(0, 9, 2000, 2100)))
    put(KEYS.segment("orders", 0, 10), encode(segment(10, 19, 1500, 2200)))
    put(KEYS.segment("orders", 0, 20), encode(chunk(20, 29, 3000, 3100)))
    put(KEYS.segment("orders", 1, 0), encode(chunk(0, 3, -1, 1000)))
    gone = TopicRecord(name="gone", topic_id="0f9e", partitions=1)
    put(KEYS.deleting_topic("gone"), encode(gone))
    put(KEYS.partition("gone", 0), encode(PartitionRecord("0f9e", 99)))
    put(KEYS.segment("gone", 0, 0), encode(segment(0, 98, 9000, 9000)))
    put(KEYS.leader("gone", 0), encode(LeaderRecord(owner=0, epoch=1, lease=8, run_id="r")))
    put("/kafscale/other/topics/orders", encode(topic))  # another namespace


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteMetadataStore]:
    store = SqliteMetadataStore(str(tmp_path / "metadata.sqlite"))
    fill(store)
    yield store
    store.close()


def read(store: SqliteMetadataStore) -> dict[str, list[KeyValue]]:
    return {kind: store.get_prefix(f"{KEYS.root}{kind}/") for kind in KINDS}


def test_summarize_sums_each_partition(store: SqliteMetadataStore) -> None:
    snapshot = summarize(KEYS, read(store), now_ms=123)
    assert snapshot.taken_ms == 123
    assert snapshot.error is None
    assert snapshot.undecodable == 0
    assert snapshot.partitions["orders"] == (
        PartitionStorage(
            topic="orders",
            partition=0,
            high_watermark=30,
            log_start_offset=5,
            owner=1,
            leader_epoch=4,  # the leader record's, newer than the committed one
            segments=2,
            chunks=1,
            bytes=1024 + 1024 + 300,
            records=25,
            oldest_ms=1500,
            newest_ms=3000,
            created_oldest_ms=2100,
            created_newest_ms=3100,
        ),
        PartitionStorage(
            topic="orders",
            partition=1,
            high_watermark=4,
            log_start_offset=0,
            owner=None,
            leader_epoch=2,
            segments=0,
            chunks=1,
            bytes=300,
            records=4,
            oldest_ms=-1,  # its only entry has no timestamp
            newest_ms=-1,
            created_oldest_ms=1000,
            created_newest_ms=1000,
        ),
        PartitionStorage(
            topic="orders",
            partition=2,
            high_watermark=0,
            log_start_offset=0,
            owner=1,
            leader_epoch=1,
            segments=0,
            chunks=0,
            bytes=0,
            records=0,
            oldest_ms=-1,
            newest_ms=-1,
            created_oldest_ms=-1,
            created_newest_ms=-1,
        ),
    )
    orders = snapshot.topics["orders"]
    assert (orders.name, orders.topic_id, orders.partitions) == ("orders", ORDERS_ID, 3)
    assert (orders.bytes, orders.records, orders.segments, orders.chunks) == (2648, 29, 2, 2)
    assert (orders.oldest_ms, orders.newest_ms, orders.newest_created_ms) == (1500, 3000, 3100)
    assert orders.created_ms == 500
    assert orders.configs == {"retention.ms": "3600000"}
    assert snapshot.total_bytes == 2648


def test_summarize_leaves_out_deleted_topics(store: SqliteMetadataStore) -> None:
    snapshot = summarize(KEYS, read(store), now_ms=0)
    assert list(snapshot.topics) == ["orders"]
    assert list(snapshot.partitions) == ["orders"]
    assert snapshot.deleting == ("gone",)
    assert snapshot.total_bytes == 2648


def test_summarize_brokers_by_id_with_partitions_owned(store: SqliteMetadataStore) -> None:
    snapshot = summarize(KEYS, read(store), now_ms=0)
    assert snapshot.brokers == (
        BrokerStorage(
            node_id=0,
            host="b0",
            port=9092,
            rack=None,
            ready=False,
            draining=False,
            listeners=(),
            partitions_owned=1,  # the deleted topic's partition, until its lease key goes
        ),
        BrokerStorage(
            node_id=1,
            host="b1",
            port=9092,
            rack="a",
            ready=True,
            draining=True,
            listeners=(("INTERNAL", "b1.svc", 9093), ("PLAINTEXT", "b1", 9092)),
            partitions_owned=2,
        ),
    )


def test_records_are_never_negative() -> None:
    topic = TopicRecord(name="t", topic_id="1", partitions=1)
    found = {
        "topics": [KeyValue(KEYS.topic("t"), encode(topic), 1, 1)],
        "partitions": [KeyValue(KEYS.partition("t", 0), encode(PartitionRecord("1", 5, 7)), 2, 2)],
    }
    snapshot = summarize(KEYS, found, now_ms=0)
    assert snapshot.partitions["t"][0].records == 0
    assert snapshot.topics["t"].records == 0


def test_undecodable_records_are_skipped_and_counted(store: SqliteMetadataStore) -> None:
    store.put(KEYS.segment("orders", 0, 30), b'{"base_offset": "thirty"}')
    store.put(KEYS.segment("orders", 1, 4), encode(chunk(4, 4, 1, 1)) + b",{}")  # trailing data
    store.put(KEYS.partition("orders", 2), b"{")
    store.put(KEYS.topic("broken"), b"[]")
    store.put(KEYS.broker(2), encode({"node_id": 2}))  # no host, no port
    snapshot = summarize(KEYS, read(store), now_ms=0)
    assert snapshot.undecodable == 5
    assert list(snapshot.topics) == ["orders"]
    assert [b.node_id for b in snapshot.brokers] == [0, 1]
    p0, p1, p2 = snapshot.partitions["orders"]
    assert (p0.segments, p0.chunks, p0.bytes) == (2, 1, 2348)  # the good entries still count
    assert (p1.segments, p1.chunks, p1.bytes) == (0, 1, 300)
    assert p2.high_watermark == 0


class FlakyStore:
    """A real store whose reads fail while ``failure`` is set; counts its reads (``read`` is set
    once there were ``wanted``) and its closing."""

    def __init__(self, store: SqliteMetadataStore, wanted: int = 1) -> None:
        self.store = store
        self.failure: str | None = None
        self.reads, self.wanted = 0, wanted
        self.read = threading.Event()
        self.closed = False

    def get_prefix(self, prefix: str) -> list[KeyValue]:
        self.reads += 1
        if self.reads >= self.wanted:
            self.read.set()
        if self.failure is not None:
            raise MetadataStoreUnavailable(self.failure)
        return self.store.get_prefix(prefix)

    def close(self) -> None:
        self.closed = True

    def opener(self) -> Callable[[], MetadataStore]:
        return lambda: cast(MetadataStore, self)


def test_view_reads_with_one_range_read_per_kind(store: SqliteMetadataStore) -> None:
    flaky = FlakyStore(store)
    view = StorageView(flaky.opener(), NS, interval=60, clock=lambda: 12.5)
    assert view.snapshot() is EMPTY
    snapshot = view.refresh()
    assert view.snapshot() is snapshot
    assert snapshot.taken_ms == 12500
    assert snapshot.topics["orders"].bytes == 2648
    assert flaky.reads == len(KINDS)


def test_a_failed_read_keeps_the_data_and_logs_once(
    store: SqliteMetadataStore, caplog: pytest.LogCaptureFixture
) -> None:
    flaky = FlakyStore(store)
    view = StorageView(flaky.opener(), NS, interval=60)
    before = view.refresh()
    flaky.failure = "etcd://e:2379 does not answer"
    with caplog.at_level(logging.INFO, logger="kafscale.console"):
        caplog.clear()
        view.refresh()
        failed = view.refresh()
        assert failed.error == "cannot read the metadata store: etcd://e:2379 does not answer"
        assert failed.topics == before.topics
        assert failed.taken_ms == before.taken_ms
        assert [r.error for r in caplog.records] == ["etcd://e:2379 does not answer"]  # type: ignore[attr-defined]
        flaky.failure = "etcd://e:2379 refused the login"
        view.refresh()
        view.refresh()
        assert len(caplog.records) == 2  # a new reason is logged, once
        flaky.failure = None
        store.delete(KEYS.topic("orders"))
        after = view.refresh()
    assert after.error is None
    assert after.topics == {}
    assert caplog.records[-1].message == "storage summary refreshed"
    assert caplog.records[-1].levelno == logging.INFO  # the first refresh after failures


def test_a_store_that_cannot_be_opened_is_tried_again() -> None:
    opened: list[str] = []

    def open_store() -> SqliteMetadataStore:
        opened.append("try")
        raise MetadataStoreUnavailable("etcd://e:2379 does not answer")

    view = StorageView(open_store, NS, interval=60)
    assert view.refresh().error == "cannot read the metadata store: etcd://e:2379 does not answer"
    assert view.snapshot().topics == {}
    view.refresh()
    assert opened == ["try", "try"]


def test_the_thread_refreshes_until_stopped(store: SqliteMetadataStore) -> None:
    flaky = FlakyStore(store)
    view = StorageView(flaky.opener(), NS, interval=3600)
    view.start()
    try:
        assert flaky.read.wait(10), "the thread did not read the store"
    finally:
        view.stop()
    assert flaky.closed
    assert view.snapshot().topics["orders"].partitions == 3  # the read before stop finished
    assert not any(t.name == "console-storage" for t in threading.enumerate())


def test_the_thread_refreshes_every_interval(store: SqliteMetadataStore) -> None:
    flaky = FlakyStore(store, wanted=3 * len(KINDS))
    view = StorageView(flaky.opener(), NS, interval=0.01)
    view.start()
    try:
        assert flaky.read.wait(10), "the thread did not refresh three times"
    finally:
        view.stop()


def test_open_view_reads_the_brokers_data_dir(tmp_path: Path) -> None:
    store = SqliteMetadataStore(str(tmp_path / "metadata.sqlite"))
    fill(store)
    store.close()
    environ = {"KAFSCALE_DATA_DIR": str(tmp_path), "KAFSCALE_S3_NAMESPACE": NS}
    assert open_view(environ, 5, enabled=False) is None
    view = open_view(environ, 5)
    assert view is not None
    try:
        assert list(view.refresh().topics) == ["orders"]
    finally:
        view.stop()
