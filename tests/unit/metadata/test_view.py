import threading
from pathlib import Path

from kafscale.metadata import records
from kafscale.metadata.records import BrokerRecord, Keys, LeaderRecord, TopicRecord
from kafscale.metadata.sqlite import SqliteMetadataStore
from kafscale.metadata.store import Put
from kafscale.metadata.view import MetadataView, Snapshot


def wait_for_snapshot(view: MetadataView, changed: threading.Event) -> Snapshot:
    assert changed.wait(10), "the view saw no change"
    changed.clear()
    return view.snapshot


def test_view_loads_then_follows_the_store(tmp_path: Path) -> None:
    path = str(tmp_path / "metadata.sqlite")
    writer, reader = SqliteMetadataStore(path), SqliteMetadataStore(path)
    keys = Keys("ns")
    writer.put(keys.cluster_id, b"cluster-1")
    writer.put(keys.broker(0), records.encode(BrokerRecord(node_id=0, host="h", port=1)))
    writer.put("/kafscale/other/cluster_id", b"not ours")
    view = MetadataView(reader, "ns")
    changed = threading.Event()
    view.on_change(lambda _: changed.set())
    view.start()
    try:
        assert view.snapshot.cluster_id == "cluster-1"
        assert view.snapshot.brokers == {0: BrokerRecord(node_id=0, host="h", port=1)}
        changed.clear()
        topic = TopicRecord(
            name="orders", topic_id="6d0f7b47-6e3e-4c0e-9a53-1f1b0d6e1d10", partitions=4
        )
        writer.put(keys.topic("orders"), records.encode(topic))
        while "orders" not in wait_for_snapshot(view, changed).topics:
            pass
        assert view.snapshot.topics["orders"] == topic
        writer.delete(keys.broker(0))
        while wait_for_snapshot(view, changed).brokers:
            pass
        writer.put(keys.topic("broken"), b"{not json")
        writer.put(
            keys.topic("later"),
            records.encode(
                TopicRecord(
                    name="later", topic_id="6d0f7b47-6e3e-4c0e-9a53-1f1b0d6e1d11", partitions=1
                )
            ),
        )
        while "later" not in wait_for_snapshot(view, changed).topics:
            pass
        assert "broken" not in view.snapshot.topics  # skipped, not fatal
        assert view.snapshot.revision == writer.revision()
    finally:
        view.stop()
        writer.close()
        reader.close()


def test_view_follows_partition_leaders(tmp_path: Path) -> None:
    path = str(tmp_path / "metadata.sqlite")
    writer, reader = SqliteMetadataStore(path), SqliteMetadataStore(path)
    keys = Keys("ns")
    first = LeaderRecord(owner=1, epoch=0, lease=7, run_id="r1")
    writer.put(keys.leader("orders", 0), records.encode(first))
    view = MetadataView(reader, "ns")
    changed = threading.Event()
    view.on_change(lambda _: changed.set())
    view.start()
    try:
        assert view.snapshot.leaders == {("orders", 0): first}
        changed.clear()
        second = LeaderRecord(owner=2, epoch=1, lease=8, run_id="r2")
        writer.delete(keys.leader("orders", 0))
        writer.put(keys.leader("orders", 0), records.encode(second))
        writer.put(keys.leaders + "orders/notanumber", b"{}")  # skipped, not fatal
        writer.put(keys.leader("orders", 1), records.encode(first))
        while ("orders", 1) not in wait_for_snapshot(view, changed).leaders:
            pass
        assert view.snapshot.leaders == {("orders", 0): second, ("orders", 1): first}
    finally:
        view.stop()
        writer.close()
        reader.close()


def test_view_applies_every_key_of_one_transaction(tmp_path: Path) -> None:
    path = str(tmp_path / "metadata.sqlite")
    writer, reader = SqliteMetadataStore(path), SqliteMetadataStore(path)
    keys = Keys("ns")
    view = MetadataView(reader, "ns")
    changed = threading.Event()
    view.on_change(lambda _: changed.set())
    view.start()
    try:
        claims = [
            Put(keys.leader("orders", p), records.encode(LeaderRecord(1, 0, 7, "r")))
            for p in range(3)
        ]
        writer.transaction([], claims)  # three keys, one revision
        while len(wait_for_snapshot(view, changed).leaders) < 3:
            pass
        assert sorted(view.snapshot.leaders) == [("orders", 0), ("orders", 1), ("orders", 2)]
    finally:
        view.stop()
        writer.close()
        reader.close()
