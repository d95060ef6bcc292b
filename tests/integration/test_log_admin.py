"""DeleteRecords and DescribeLogDirs driven by Kafka's own tools (`kafka-delete-records`,
`kafka-log-dirs`; confluent-kafka for DeleteRecords' edge cases) against real processes: the log
start moves, readers see exactly what is left, retention removes what lies below the start, and
each broker reports its one log dir with the sizes of the partitions it leads
(docs/design/ecosystem.md, sections 2 and 3)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kafscale import config as configuration
from kafscale.metadata import open_metadata_store, records
from kafscale.metadata.records import Keys
from kafscale.protocol.errors import ErrorCode

from .test_fetch import fetch, produce_sequentially, records_of
from .test_retention import create, entries, watermarks
from .wire import Wire

pytestmark = [pytest.mark.integration, pytest.mark.java]

ENV = {"KAFSCALE_SEGMENT_BYTES": "1KiB", "KAFSCALE_RETENTION_CHECK_INTERVAL_MS": "300"}


def delete_records(
    kafka_tools: Any, tmp_path: Path, bootstrap: str, topic: str, offsets: dict[int, int]
) -> Any:
    """Run kafka-delete-records for ``{partition: offset}``; the finished process."""
    plan = tmp_path / f"delete-{time.monotonic_ns()}.json"
    plan.write_text(
        json.dumps(
            {
                "version": 1,
                "partitions": [
                    {"topic": topic, "partition": p, "offset": o} for p, o in offsets.items()
                ],
            }
        )
    )
    return kafka_tools.run(
        "delete-records", "--bootstrap-server", bootstrap, "--offset-json-file", str(plan)
    )


def log_start(broker: Any, topic: str, partition: int) -> int:
    config = configuration.load(broker.env)
    store = open_metadata_store(config)
    try:
        kv = store.get(Keys(config.s3_namespace).partition(topic, partition))
        assert kv is not None
        return records.decode_partition(kv.value).log_start_offset
    finally:
        store.close()


def until(holds: Callable[[], bool], timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if holds():
            return True
        time.sleep(0.2)
    return holds()


def admin_delete_records(bootstrap: str, topic: str, offset: int) -> int:
    """confluent-kafka's DeleteRecords of partition 0 up to ``offset``: the low watermark."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    [future] = admin.delete_records([TopicPartition(topic, 0, offset)]).values()
    return int(future.result(30).low_watermark)


def test_kafka_delete_records_moves_the_log_start_and_retention_follows(
    start_broker: Callable[..., Any], kafka_tools: Any, tmp_path: Path
) -> None:
    broker = start_broker(backends="real", env=ENV)
    broker.wait_ready()
    topic = "purged"
    create(broker.bootstrap, topic, {"retention.ms": "-1"})  # nothing expires by time or size
    values = [f"v{n:03d}".encode() * 40 for n in range(60)]  # 1 KiB segments: several entries
    produce_sequentially(broker.bootstrap, topic, values, acks=-1)
    assert watermarks(broker.bootstrap, topic) == (0, 60)
    before = entries(broker, topic)
    assert len(before) > 3, before

    done = delete_records(kafka_tools, tmp_path, broker.bootstrap, topic, {0: 25})
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"partition: {topic}-0\tlow_watermark: 25" in done.stdout, done.stdout
    assert watermarks(broker.bootstrap, topic) == (25, 60)
    assert log_start(broker, topic, 0) == 25

    with Wire(("127.0.0.1", broker.port)) as wire:
        below = fetch(wire, topic, 0, 10)
        assert below.error_code == ErrorCode.offset_out_of_range
        at_start = fetch(wire, topic, 0, 25, correlation_id=2)
        assert at_start.error_code == 0
        assert at_start.log_start_offset == 25
        # The batches from the one holding offset 25: a client skips what lies before its offset.
        found = [r for r in records_of(at_start.records) if r.offset >= 25]
        assert found and found[0].offset == 25 and found[0].value == values[25]

    # Retention removes the entries that end below the start (and only those), though the
    # topic's retention keeps everything.
    assert until(lambda: all(e.last_offset >= 25 for e in entries(broker, topic)))
    left = entries(broker, topic)
    assert left and min(e.base_offset for e in left) <= 25
    assert sum(e.records for e in left) >= 35

    # The edge cases through another client (confluent-kafka: no JVM to start for each).
    # Past the high watermark: OFFSET_OUT_OF_RANGE, and nothing moves.
    with pytest.raises(Exception, match="OFFSET_OUT_OF_RANGE"):
        admin_delete_records(broker.bootstrap, topic, 61)
    assert watermarks(broker.bootstrap, topic) == (25, 60)
    # Backwards: nothing moves; the answer is the current start.
    assert admin_delete_records(broker.bootstrap, topic, 5) == 25
    # -1: up to the high watermark; the partition is empty, its next offset unchanged.
    assert admin_delete_records(broker.bootstrap, topic, -1) == 60
    assert until(lambda: entries(broker, topic) == [])
    produce_sequentially(broker.bootstrap, topic, [b"after"], acks=-1)
    assert watermarks(broker.bootstrap, topic) == (60, 61)

    # The start survives a restart: the partition record holds it.
    assert broker.terminate() == 0
    again = start_broker(env=broker.env, ready=True)
    assert watermarks(again.bootstrap, topic) == (60, 61)


def test_deleting_records_of_a_topic_without_the_delete_policy_is_refused(
    start_broker: Callable[..., Any], kafka_tools: Any, tmp_path: Path
) -> None:
    broker = start_broker(env=ENV)
    broker.wait_ready()
    create(broker.bootstrap, "kept", {"cleanup.policy": ""})  # Kafka 4.3: infinite retention
    produce_sequentially(broker.bootstrap, "kept", [b"a", b"b"], acks=-1)
    refused = delete_records(kafka_tools, tmp_path, broker.bootstrap, "kept", {0: 1})
    assert "PolicyViolationException" in refused.stdout + refused.stderr, refused.stdout
    assert watermarks(broker.bootstrap, "kept") == (0, 2)


def test_kafka_log_dirs_reports_the_object_store_and_partition_sizes(
    start_broker: Callable[..., Any], kafka_tools: Any, tmp_path: Path
) -> None:
    broker = start_broker(backends="real", env=ENV)
    broker.wait_ready()
    create(broker.bootstrap, "sized", {})
    produce_sequentially(broker.bootstrap, "sized", [os.urandom(500) for _ in range(8)], acks=-1)
    out = kafka_tools.check(
        "log-dirs", "--bootstrap-server", broker.bootstrap, "--describe", "--topic-list", "sized"
    )
    report = json.loads(next(line for line in out.splitlines() if line.startswith("{")))
    [described] = report["brokers"]
    assert described["broker"] == int(broker.env.get("KAFSCALE_BROKER_ID", "0"))
    [log_dir] = described["logDirs"]
    config = configuration.load(broker.env)
    assert log_dir["logDir"] == f"s3://{config.s3_bucket}/{config.s3_namespace}"
    assert log_dir["error"] is None
    [partition] = log_dir["partitions"]
    assert partition["partition"] == "sized-0"
    stored = sum(e.size for e in entries(broker, "sized"))
    assert partition["size"] == stored > 8 * 500
    assert partition["offsetLag"] == 0 and partition["isFuture"] is False

    # Records deleted below the start no longer count once retention removed them.
    delete_records(kafka_tools, tmp_path, broker.bootstrap, "sized", {0: -1})
    assert until(lambda: entries(broker, "sized") == [])
    out = kafka_tools.check(
        "log-dirs", "--bootstrap-server", broker.bootstrap, "--describe", "--topic-list", "sized"
    )
    report = json.loads(next(line for line in out.splitlines() if line.startswith("{")))
    assert report["brokers"][0]["logDirs"][0]["partitions"][0]["size"] == 0


def test_the_embedded_backend_reports_its_directory_and_volume(
    start_broker: Callable[..., Any], kafka_tools: Any
) -> None:
    broker = start_broker(env=ENV)
    broker.wait_ready()
    out = kafka_tools.check("log-dirs", "--bootstrap-server", broker.bootstrap, "--describe")
    report = json.loads(next(line for line in out.splitlines() if line.startswith("{")))
    [log_dir] = report["brokers"][0]["logDirs"]
    assert Path(log_dir["logDir"]) == Path(broker.env["KAFSCALE_DATA_DIR"]).resolve() / "segments"
