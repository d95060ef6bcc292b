"""Spark's own Kafka source (spark-sql-kafka-0-10, with Spark's kafka-clients) against KafScale
(issue 7, the compatibility matrix): batch reads of what confluent-kafka produced return exactly
those records -- key (null too), value, topic, partition, offset, timestamp, headers -- for
earliest to latest, each partition split into several offset ranges (minPartitions), a JSON
offset range per partition, a starting timestamp (the first offset at or after it; Spark's
default strategy fails where no record reaches it), `assign` and `subscribePattern`.

Spark resolves the offsets on the driver with the admin client (Metadata, ListOffsets) and reads
on the executors with a KafkaConsumer (assign, seek, Fetch). The records, expectations and
comparisons are those of the cross-client round trips (tests/integration/test_roundtrip.py); the
main topic is produced in five chunks, one per codec. Spark gives a record without headers a null
`headers` (not an empty array), read here as no headers.

Needs tests/compat/spark/install.sh (the source's jars at pyspark's version; the fixture fails,
never skips, without them). One SparkSession (local[2]) serves the module, in a JVM of its own:
`spark.jars` reaches the driver's classpath only when the JVM starts, so a JVM another module
launched is ended first, and this one at the end.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.compat.common import create_topic
from tests.harness.broker import BrokerProcess
from tests.harness.paths import ROOT
from tests.harness.roundtrip import CODECS, ConfluentKafka, Consumed, Record
from tests.integration.test_roundtrip import (
    PARTITIONS,
    assert_same,
    expected_records,
    first_at_or_after,
    make_records,
    stored_codecs,
)

pytestmark = pytest.mark.integration

JARS_DIR = ROOT / "tests" / "compat" / "spark" / "target" / "jars"
TOPIC = "spark-kafka"
MORE = "spark-kafka-more"  # matched by PATTERN with TOPIC
OTHER = "spark-other"
# Spark's offset reader keeps the topics where the pattern matches somewhere in the name (Scala's
# findFirstIn), not the whole name as Kafka's consumer does: "other-spark-kafka" would match.
PATTERN = "spark-kafka.*"
RECORDS = 150  # 50 per partition: 30 records (10 per partition) per codec

Produced = dict[str, list[Consumed]]  # topic -> what a consumer must read


def kafka_jars() -> list[Path]:
    """The jars tests/compat/spark/install.sh copied; spark-sql-kafka must be pyspark's version."""
    import pyspark

    jars = sorted(JARS_DIR.glob("*.jar"))
    source = f"spark-sql-kafka-0-10_2.13-{pyspark.__version__}.jar"
    if not any(jar.name == source for jar in jars):
        found = ", ".join(jar.name for jar in jars) or "nothing"
        pytest.fail(
            f"{source} (Spark's Kafka source for pyspark {pyspark.__version__}) is not in "
            f"{JARS_DIR} (found {found}): run tests/compat/spark/install.sh",
            pytrace=False,
        )
    return jars


def end_jvm() -> None:
    """Ends the JVM pyspark launched in this process, if any and no SparkContext is running, so
    the next session starts a JVM of its own (with its own `spark.jars`)."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    if gateway is None:
        return
    assert SparkContext._active_spark_context is None, "another module's SparkContext is running"
    process = getattr(gateway, "proc", None)
    gateway.shutdown()
    if process is not None:
        process.stdin.close()  # the JVM exits when its stdin closes (see pyspark.java_gateway)
        process.wait(60)
    SparkContext._gateway = None
    SparkContext._jvm = None


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    jars = kafka_jars()
    from pyspark.sql import SparkSession

    with pytest.MonkeyPatch.context() as env:
        # Python workers (none are needed to read Kafka) and the driver run this interpreter.
        env.setenv("PYSPARK_PYTHON", sys.executable)
        env.setenv("PYSPARK_DRIVER_PYTHON", sys.executable)
        end_jvm()
        session = (
            SparkSession.builder.master("local[2]")
            .appName("kafscale-compat-spark-kafka")
            .config("spark.jars", ",".join(str(jar) for jar in jars))
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.sql.session.timeZone", "UTC")
            .getOrCreate()
        )
        session.sparkContext.setLogLevel("ERROR")
        try:
            yield session
        finally:
            session.stop()
            end_jvm()


def produce(broker: BrokerProcess, topic: str, records: Sequence[Record], codecs: Sequence[str]
            ) -> list[Consumed]:  # fmt: skip
    """confluent-kafka sends `records` to a new 3-partition topic in len(codecs) chunks, one
    per codec; returns what a consumer must read, checking the offsets are contiguous from 0."""
    create_topic(broker, topic)
    size = -(-len(records) // len(codecs))
    expected: list[Consumed] = []
    for n, codec in enumerate(codecs):
        chunk = records[n * size : (n + 1) * size]
        acks = ConfluentKafka().produce(broker.bootstrap, topic, chunk, codec)
        expected += expected_records(topic, chunk, acks, {})
    for partition in PARTITIONS:
        offsets = [r.offset for r in expected if r.partition == partition]
        assert sorted(offsets) == list(range(len(offsets))), f"{topic}[{partition}]: {offsets}"
    return sorted(expected, key=lambda r: (r.partition, r.offset))


@pytest.fixture(scope="module")
def produced(kafscale: BrokerProcess) -> Produced:
    expected = {
        TOPIC: produce(kafscale, TOPIC, make_records(70, RECORDS, kcat=False), CODECS),
        MORE: produce(kafscale, MORE, make_records(71, 30, kcat=False, big=False), ["zstd"]),
        OTHER: produce(kafscale, OTHER, make_records(72, 9, kcat=False, big=False), ["gzip"]),
    }
    stored = stored_codecs(kafscale, TOPIC)
    assert set(CODECS) - {"none"} <= stored, f"{TOPIC} is stored with {stored} only"
    return expected


def load(spark: Any, broker: BrokerProcess, **options: str) -> Any:
    """A batch DataFrame of Spark's Kafka source."""
    reader = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", broker.bootstrap)
        .option("includeHeaders", "true")
        .option("kafkaConsumer.pollTimeoutMs", "30000")  # a stuck fetch fails in 30 s, not 120
    )
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def read(spark: Any, broker: BrokerProcess, **options: str) -> list[Consumed]:
    """The rows of a batch read, in the order Spark returned them."""
    rows = (
        load(spark, broker, **options)
        .selectExpr(
            "topic",
            "partition",
            "offset",
            "key",
            "value",
            "headers",
            "unix_millis(timestamp) AS timestamp",
            "timestampType",
        )
        .collect()
    )
    assert {row.timestampType for row in rows} <= {0}, "not every timestamp is CreateTime"
    return [consumed(row) for row in rows]


def consumed(row: Any) -> Consumed:
    def data(value: bytearray | None) -> bytes | None:
        return None if value is None else bytes(value)

    return Consumed(
        topic=row.topic,
        partition=row.partition,
        offset=row.offset,
        key=data(row.key),
        value=data(row.value),
        headers=tuple((header.key, data(header.value)) for header in row.headers or ()),
        timestamp=row.timestamp,
    )


@pytest.mark.compat("earliest", "spark")
def test_earliest_to_latest(spark: Any, kafscale: BrokerProcess, produced: Produced) -> None:
    expected = produced[TOPIC]
    assert any(r.key is None for r in expected) and any(len(r.headers) > 1 for r in expected)
    assert any(len(r.value or b"") == 1024 * 1024 for r in expected)  # a 1 MiB value
    got = read(spark, kafscale, subscribe=TOPIC, startingOffsets="earliest", endingOffsets="latest")
    assert_same(got, expected, "Spark reading from earliest to latest")


@pytest.mark.compat("earliest", "spark")
def test_json_offset_range(spark: Any, kafscale: BrokerProcess, produced: Produced) -> None:
    # -2 is earliest, -1 latest; the ending offsets are exclusive
    starting = {"0": 3, "1": -2, "2": 17}
    ending = {"0": 40, "1": 25, "2": -1}
    want = [
        r
        for r in produced[TOPIC]
        if starting[str(r.partition)] <= r.offset
        and (ending[str(r.partition)] == -1 or r.offset < ending[str(r.partition)])
    ]
    got = read(
        spark,
        kafscale,
        subscribe=TOPIC,
        startingOffsets=json.dumps({TOPIC: starting}),
        endingOffsets=json.dumps({TOPIC: ending}),
    )
    assert_same(got, want, f"Spark reading offsets {starting} to {ending}")


@pytest.mark.compat("earliest", "spark")
def test_partitions_split_into_offset_ranges(
    spark: Any, kafscale: BrokerProcess, produced: Produced
) -> None:
    """With minPartitions Spark splits each partition's range into several tasks, each
    fetching from an offset in the middle of a (compressed) batch."""
    options = {
        "subscribe": TOPIC,
        "startingOffsets": "earliest",
        "endingOffsets": "latest",
        "minPartitions": "12",
    }
    assert load(spark, kafscale, **options).rdd.getNumPartitions() >= 12
    got = read(spark, kafscale, **options)
    assert_same(got, produced[TOPIC], "Spark reading each partition as 4 offset ranges")


@pytest.mark.compat("timestamp", "spark")
def test_starting_timestamp(spark: Any, kafscale: BrokerProcess, produced: Produced) -> None:
    expected = produced[TOPIC]
    partition_0 = [r for r in expected if r.partition == 0]
    # Record 15 of partition 0 repeats the timestamp of record 14: the lookup must land on 14.
    # Partition 2's records are all older: with strategy "latest" it reads nothing.
    assert partition_0[15].timestamp == partition_0[14].timestamp
    timestamp = partition_0[15].timestamp
    want = first_at_or_after(expected, timestamp)
    assert want[0].offset == 14 and not [r for r in want if r.partition == 2]
    got = read(
        spark,
        kafscale,
        subscribe=TOPIC,
        startingTimestamp=str(timestamp),
        startingOffsetsByTimestampStrategy="latest",
    )
    assert_same(got, want, f"Spark reading from timestamp {timestamp}")


@pytest.mark.compat("timestamp", "spark")
def test_starting_timestamp_after_a_partitions_records_fails(
    spark: Any, kafscale: BrokerProcess, produced: Produced
) -> None:
    """Spark's default strategy ("error") fails when ListOffsets finds no record at or after the
    timestamp in some partition (offset -1): here partition 2, whose records are all older."""
    timestamp = next(r.timestamp for r in produced[TOPIC] if r.partition == 0)
    assert max(r.timestamp for r in produced[TOPIC] if r.partition == 2) < timestamp
    no_match = rf"No offset matched .* topic-partition {TOPIC}-2 and timestamp {timestamp}\."
    with pytest.raises(Exception, match=no_match):
        read(spark, kafscale, subscribe=TOPIC, startingTimestamp=str(timestamp))


@pytest.mark.compat("earliest", "spark")
def test_assign(spark: Any, kafscale: BrokerProcess, produced: Produced) -> None:
    want = [r for r in produced[TOPIC] if r.partition in (0, 2)]
    want += [r for r in produced[MORE] if r.partition == 1]
    got = read(
        spark,
        kafscale,
        assign=json.dumps({TOPIC: [0, 2], MORE: [1]}),
        startingOffsets="earliest",
        endingOffsets="latest",
    )
    assert_same(got, want, "Spark reading assigned partitions")


@pytest.mark.compat("earliest", "spark")
def test_subscribe_pattern(spark: Any, kafscale: BrokerProcess, produced: Produced) -> None:
    got = read(
        spark,
        kafscale,
        subscribePattern=PATTERN,
        startingOffsets="earliest",
        endingOffsets="latest",
    )
    assert {r.topic for r in got} == {TOPIC, MORE}
    assert_same(got, produced[TOPIC] + produced[MORE], f"Spark reading topics {PATTERN}")
