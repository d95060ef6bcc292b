import threading
from pathlib import Path

from kafscale.metadata import records
from kafscale.metadata.records import BrokerRecord, Keys, TopicRecord
from kafscale.metadata.sqlite import SqliteMetadataStore
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
