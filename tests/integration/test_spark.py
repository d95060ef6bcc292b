"""Spark (local mode) reads topics straight from the bucket: records produced by a real
client through a real broker, compacted into spec segments (in one test partly still in chunks
of write-ahead objects), read back by
``spark.read.format("kafscale")`` from the embedded data directory, and from MinIO with etcd."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from kafscale.storage import segment as segments
from tests.harness.paths import ROOT
from tests.harness.s3_proxy import RecordingS3Proxy
from tests.harness.stored import committed_codecs, committed_entries

pytestmark = pytest.mark.integration

TOPIC = "clicks"
PARTITIONS = 3
RECORDS = 3000
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
STEP_MS = 10_000  # record i has timestamp T0 + i * STEP_MS: about 8 hours in all
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
# small segments: each partition's ~110 KiB (as stored: most batches arrive compressed) becomes
# a dozen segments or more
BROKER_ENV = {
    "KAFSCALE_SEGMENT_BYTES": "8KiB",
    "KAFSCALE_COMPRESSION_CODEC": "none",  # batches sent uncompressed stay so
    "KAFSCALE_FLUSH_INTERVAL_MS": "100",
    "KAFSCALE_COMPACTION_MAX_AGE_MS": "1000",  # no chunk stays uncompacted for long
}
CHUNK = 300  # records produced (and flushed, acks=all) at a time


@dataclass(frozen=True)
class Produced:
    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes | None]]
    timestamp: int


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    # Spark's Python workers must run this interpreter (kafscale and pyarrow are installed here)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from kafscale.spark import register

    session = (
        SparkSession.builder.master("local[2]")
        .appName("kafscale-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", "4")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    yield session
    session.stop()


def record(i: int) -> Produced:
    key = None if i % 11 == 0 else f"user-{i % 37}".encode()
    value = (f"click-{i}:" + "x" * (100 + i % 300)).encode()
    headers: list[tuple[str, bytes | None]] = [
        ("i", str(i).encode()),
        ("codec", CODECS[i % 5].encode()),
    ]
    if i % 4 == 0:
        headers.append(("empty", None))
    return Produced(key, value, headers, T0 + i * STEP_MS)


def produce(broker: Any) -> dict[tuple[int, int], Produced]:
    """RECORDS records over 3 partitions by 5 producers, one per codec: (partition, offset) ->
    record, from the delivery reports (acks=all). Returns once every record is in a spec
    segment (``wait_compacted``)."""
    bootstrap = broker.bootstrap
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)]).values():
        future.result(timeout=30)
    placed: dict[tuple[int, int], Produced] = {}
    failures: list[str] = []
    producers = [
        Producer(
            {
                "bootstrap.servers": bootstrap,
                "compression.type": codec,
                "linger.ms": 20,
                "batch.size": 8192,  # several batches, and so several segments, per chunk
                "acks": "all",
                "enable.idempotence": True,
            }
        )
        for codec in CODECS
    ]
    # in order of i, a batch at a time: every partition's timestamps rise with its offsets
    for chunk in range(0, RECORDS, CHUNK):
        for i in range(chunk, min(chunk + CHUNK, RECORDS)):
            item = record(i)

            def delivered(error: Any, message: Any, item: Produced = item) -> None:
                if error is not None:
                    failures.append(str(error))
                else:
                    placed[(message.partition(), message.offset())] = item

            producers[i % 5].produce(
                TOPIC,
                value=item.value,
                key=item.key,
                partition=i % PARTITIONS,
                timestamp=item.timestamp,
                headers=item.headers,
                on_delivery=delivered,
            )
        for producer in producers:
            if producer.flush(60) != 0:
                raise KafkaException(f"{producer} did not deliver everything in 60 s")
    assert not failures, failures[:5]
    assert len(placed) == RECORDS
    wait_compacted(
        broker, {p: 1 + max(o for (q, o) in placed if q == p) for p in range(PARTITIONS)}
    )
    return placed


def wait_compacted(broker: Any, ends: dict[int, int], timeout: float = 60) -> None:
    """Wait until each partition's log, up to offset ``ends[p]``, is spec segments only (chunks
    are compacted once a second old: KAFSCALE_COMPACTION_MAX_AGE_MS)."""
    deadline = time.monotonic() + timeout
    for partition, end in ends.items():
        while True:
            entries = committed_entries(broker.env, TOPIC, partition)
            chunks = [entry for entry in entries if entry.is_chunk]
            if entries and entries[-1].record.last_offset == end - 1 and not chunks:
                break
            assert time.monotonic() < deadline, f"partition {partition} still has chunks"
            time.sleep(0.5)


def read_options(broker: Any, **extra: str) -> dict[str, str]:
    env = broker.env
    if "KAFSCALE_S3_BUCKET" not in env:
        return {"dataDir": env["KAFSCALE_DATA_DIR"], "subscribe": TOPIC, **extra}
    return {
        "bucket": env["KAFSCALE_S3_BUCKET"],
        "endpoint": env["KAFSCALE_S3_ENDPOINT"],
        "region": env["KAFSCALE_S3_REGION"],
        "accessKey": env["KAFSCALE_S3_ACCESS_KEY"],
        "secretKey": env["KAFSCALE_S3_SECRET_KEY"],
        "pathStyle": "true",
        "namespace": env["KAFSCALE_S3_NAMESPACE"],
        "etcdEndpoints": env["KAFSCALE_ETCD_ENDPOINTS"],
        "subscribe": TOPIC,
        **extra,
    }


def collect(spark: Any, options: dict[str, str]) -> list[Any]:
    return spark.read.format("kafscale").options(**options).load().collect()


def segment_bases(broker: Any, s3_server: Any, partition: int) -> list[int]:
    """The base offsets of a partition's segment objects, in order."""
    env = broker.env
    namespace = env.get("KAFSCALE_S3_NAMESPACE", "default")
    prefix = segments.segment_prefix(namespace, TOPIC, partition)
    if "KAFSCALE_S3_BUCKET" in env:
        listing = s3_server.client().list_objects_v2(
            Bucket=env["KAFSCALE_S3_BUCKET"], Prefix=prefix
        )
        keys = [item["Key"] for item in listing.get("Contents", [])]
    else:
        root = Path(env["KAFSCALE_DATA_DIR"]) / "segments"
        keys = [str(p.relative_to(root)) for p in (root / prefix).iterdir()]
    parsed = [segments.parse_segment_key(k) for k in keys]
    return sorted(p.base_offset for p in parsed if p is not None and p.kind == "kfs")


@pytest.fixture(params=["embedded", "s3-etcd"])
def loaded(
    request: pytest.FixtureRequest, start_broker: Any
) -> tuple[Any, dict[tuple[int, int], Produced]]:
    """A broker (embedded backends, or MinIO and etcd) holding the topic, every record committed."""
    backends = "embedded" if request.param == "embedded" else "real"
    broker = start_broker(env=BROKER_ENV, backends=backends)
    broker.wait_ready()
    return broker, produce(broker)


def test_spark_reads_back_every_record_per_offset(spark: Any, loaded: Any, request: Any) -> None:
    broker, produced = loaded
    df = spark.read.format("kafscale").options(**read_options(broker)).load()
    assert df.columns == [
        "key",
        "value",
        "topic",
        "partition",
        "offset",
        "timestamp",
        "timestampType",
        "headers",
    ]
    s3 = request.getfixturevalue("s3_server") if "KAFSCALE_S3_BUCKET" in broker.env else None
    segment_count = sum(len(segment_bases(broker, s3, p)) for p in range(PARTITIONS))
    assert segment_count >= 30, "the topic should span many segments"
    # one input partition per segment (none is larger than splitBytes)
    assert df.rdd.getNumPartitions() == segment_count
    codecs = set().union(*(committed_codecs(broker.env, TOPIC, p) for p in range(PARTITIONS)))
    assert codecs == {0, 1, 2, 3, 4}  # none, gzip, snappy, lz4, zstd, as the producers sent them
    rows = df.collect()
    assert len(rows) == RECORDS
    by_partition: dict[int, list[int]] = {}
    for row in rows:
        expected = produced[(row.partition, row.offset)]
        assert row.topic == TOPIC
        assert (row.key, row.value) == (expected.key, expected.value)
        assert [(h.key, h.value) for h in row.headers] == expected.headers
        assert int(row.timestamp.timestamp() * 1000) == expected.timestamp
        assert row.timestampType == 0
        by_partition.setdefault(row.partition, []).append(row.offset)
    for partition, offsets in by_partition.items():
        assert sorted(offsets) == list(range(len(offsets))), f"partition {partition} has gaps"
    if s3 is not None:
        # the bucket alone (no metadata store): the same records, found by listing
        alone = {k: v for k, v in read_options(broker).items() if k != "etcdEndpoints"}
        listed = collect(spark, alone)
        assert sorted((r.partition, r.offset, r.value) for r in listed) == sorted(
            (r.partition, r.offset, r.value) for r in rows
        )


def expected_between(
    produced: dict[tuple[int, int], Produced], bounds: dict[int, tuple[int, int]]
) -> set[tuple[int, int]]:
    return {(p, o) for (p, o) in produced if bounds[p][0] <= o < bounds[p][1]}


def test_offset_and_timestamp_bounds_read_exactly_those_records(spark: Any, loaded: Any) -> None:
    broker, produced = loaded
    ends = {p: 1 + max(o for (q, o) in produced if q == p) for p in range(PARTITIONS)}
    bounds = {p: (ends[p] // 3 + 7, 2 * ends[p] // 3 - 5) for p in range(PARTITIONS)}
    options = read_options(
        broker,
        startingOffsets=_json({p: lo for p, (lo, _) in bounds.items()}),
        endingOffsets=_json({p: hi for p, (_, hi) in bounds.items()}),
    )
    got = {(r.partition, r.offset) for r in collect(spark, options)}
    assert got == expected_between(produced, bounds)

    start, end = T0 + 900 * STEP_MS + 1, T0 + 2100 * STEP_MS
    options = read_options(broker, startingTimestamp=str(start), endingTimestamp=str(end))
    got = {(r.partition, r.offset) for r in collect(spark, options)}
    # per partition, timestamps rise with offsets: the range is the records in [start, end)
    assert got == {key for key, item in produced.items() if start <= item.timestamp < end}

    # a starting timestamp past every record: an error by default, else nothing to read
    late = str(T0 + RECORDS * STEP_MS)
    with pytest.raises(Exception, match="no record has a timestamp at or after"):
        collect(spark, read_options(broker, startingTimestamp=late))
    nothing = read_options(
        broker, startingTimestamp=late, startingOffsetsByTimestampStrategy="latest"
    )
    assert collect(spark, nothing) == []


def _json(offsets: dict[int, int]) -> str:
    inner = ", ".join(f'"{p}": {o}' for p, o in offsets.items())
    return f'{{"{TOPIC}": {{{inner}}}}}'


def test_segments_outside_the_bounds_are_never_downloaded(
    spark: Any, start_broker: Any, s3_server: Any
) -> None:
    broker = start_broker(env=BROKER_ENV, backends="real")
    broker.wait_ready()
    produced = produce(broker)
    proxy = RecordingS3Proxy(s3_server.endpoint_url)
    try:
        bases = {p: segment_bases(broker, s3_server, p) for p in range(PARTITIONS)}
        ends = {p: 1 + max(o for (q, o) in produced if q == p) for p in range(PARTITIONS)}
        # from inside each partition's 4th segment to inside its 7th
        bounds = {p: (bases[p][3] + 2, bases[p][6] + 1) for p in range(PARTITIONS)}
        options = read_options(
            broker,
            endpoint=proxy.endpoint_url,
            startingOffsets=_json({p: lo for p, (lo, _) in bounds.items()}),
            endingOffsets=_json({p: hi for p, (_, hi) in bounds.items()}),
        )
        got = {(r.partition, r.offset) for r in collect(spark, options)}
        assert got == expected_between(produced, bounds)
        read = _segments_read(proxy.take())
        for p in range(PARTITIONS):
            assert read[p] == set(bases[p][3:7]), (p, read[p], bases[p])

        # timestamps: records 1500..1799 (about 100 per partition)
        start, end = T0 + 1500 * STEP_MS, T0 + 1800 * STEP_MS
        options = read_options(
            broker,
            endpoint=proxy.endpoint_url,
            startingTimestamp=str(start),
            endingTimestamp=str(end),
        )
        got = {(r.partition, r.offset) for r in collect(spark, options)}
        wanted = {key for key, item in produced.items() if start <= item.timestamp < end}
        assert got == wanted
        read = _segments_read(proxy.take())
        for p in range(PARTITIONS):
            offsets = [o for (q, o) in wanted if q == p]
            holding = {
                base
                for i, base in enumerate(bases[p])
                if base <= max(offsets)
                and (i + 1 == len(bases[p]) or bases[p][i + 1] > min(offsets))
            }
            # the segments holding the range, and for the ending timestamp the one holding the
            # first record at or after it (read to resolve the bound), nothing else
            after = max(b for b in bases[p] if b <= max(offsets) + 1)
            assert read[p] <= holding | {after}, (p, read[p], holding)
            assert holding <= read[p]
            assert len(bases[p]) >= len(read[p]) + 5, "most segments should lie outside"
        assert ends  # every partition had records
    finally:
        proxy.close()


def _segments_read(requests: list[Any]) -> dict[int, set[int]]:
    """Per partition, the base offsets of the .kfs objects that had bytes GET (a footer-only
    read does not count: with a metadata store there are none anyway)."""
    read: dict[int, set[int]] = {p: set() for p in range(PARTITIONS)}
    for request in requests:
        parsed = segments.parse_segment_key(request.key)
        if request.method == "GET" and parsed is not None and parsed.kind == "kfs":
            read[parsed.partition].add(parsed.base_offset)
    return read


def test_a_corrupt_segment_fails_the_job_naming_the_object(spark: Any, start_broker: Any) -> None:
    broker = start_broker(env=BROKER_ENV)
    broker.wait_ready()
    produce(broker)
    root = Path(broker.env["KAFSCALE_DATA_DIR"]) / "segments"
    victim = sorted((root / "default" / TOPIC / "1").glob("*.kfs"))[2]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x55
    victim.write_bytes(bytes(data))
    with pytest.raises(Exception) as failure:
        collect(spark, read_options(broker))
    message = str(failure.value)
    assert str(victim.relative_to(root)) in message
    assert "CorruptSegment" in message


def test_the_example_pipeline_writes_hourly_parquet(start_broker: Any, tmp_path: Path) -> None:
    broker = start_broker(env=BROKER_ENV)
    broker.wait_ready()
    produced = produce(broker)
    out = tmp_path / "hourly"
    script = ROOT / "examples" / "hourly_parquet.py"
    result = subprocess.run(
        [sys.executable, str(script), "--topic", TOPIC, "--out", str(out), "--master", "local[1]"],
        cwd=Path(broker.env["KAFSCALE_DATA_DIR"]).parent,
        env={**os.environ, "KAFSCALE_DATA_DIR": broker.env["KAFSCALE_DATA_DIR"]},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    table = pq.read_table(out).to_pylist()
    got = Counter()
    for row in table:
        got[(row["partition"], int(row["hour"].timestamp() * 1000))] += row["records"]
    hour = 3_600_000
    expected = Counter((p, item.timestamp // hour * hour) for (p, _), item in produced.items())
    assert got == expected
    assert f"{RECORDS} records" in result.stdout


def test_spark_reads_chunks_and_segments_alike(spark: Any, start_broker: Any) -> None:
    """A topic whose older half is compacted into spec segments and whose newer half is still in
    chunks of write-ahead objects: Spark reads every committed record of both, one row each."""
    broker = start_broker(env=BROKER_ENV, ready=True)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])[TOPIC].result(timeout=30)
    half = RECORDS // 2

    def send(bootstrap: str, numbers: range) -> None:
        producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 20})
        for i in numbers:
            if i % 30 == 0:
                # ~2.5 KiB a partition per flush: chunks well under segment.bytes (8 KiB), so
                # a partition's last run stays open (a chunk bigger than segment.bytes is a
                # full run of its own: on a busy machine one cycle could take a whole half)
                assert producer.flush(60) == 0
            item = record(i)
            producer.produce(
                TOPIC,
                value=item.value,
                key=item.key,
                partition=i % PARTITIONS,
                timestamp=item.timestamp,
                headers=item.headers,
            )
        assert producer.flush(60) == 0

    send(broker.bootstrap, range(half))
    wait_compacted(broker, {p: len(range(p, half, PARTITIONS)) for p in range(PARTITIONS)})
    assert broker.terminate() == 0
    # the same broker, now keeping chunks for an hour: the newer half stays in chunks
    broker = start_broker(env={**broker.env, "KAFSCALE_COMPACTION_MAX_AGE_MS": "3600000"})
    broker.wait_ready()
    send(broker.bootstrap, range(half, RECORDS))
    kinds = {
        entry.is_chunk
        for p in range(PARTITIONS)
        for entry in committed_entries(broker.env, TOPIC, p)
    }
    assert kinds == {False, True}, "the log should hold segments and chunks"
    rows = collect(spark, read_options(broker))
    assert len(rows) == RECORDS
    expected = {(i % PARTITIONS, i // PARTITIONS): record(i) for i in range(RECORDS)}
    for row in rows:
        item = expected[(row.partition, row.offset)]
        assert (row.key, row.value) == (item.key, item.value)
        assert [(h.key, h.value) for h in row.headers] == item.headers
        assert int(row.timestamp.timestamp() * 1000) == item.timestamp
