"""Cross-client round trips (issue 4): what each of six real clients produces, every client reads
back identical, in order per partition -- from earliest, from latest (only new records) and from a
timestamp (the first offset at or after it).

One broker serves the whole module (embedded backends, 100 ms flush interval so tail reads are
quick). Each producing client writes ~200 records to its own 3-partition topic with its own codec:
null, empty and binary keys, several headers (duplicate names, empty and binary values, non-ASCII
names), values from empty to 1 MiB (three of exactly 1 MiB), explicit timestamps with repeats.
kcat cannot set per-message headers or timestamps (see tests/harness/roundtrip_cli.py): its records
carry one header set per partition and producer-stamped timestamps, which the test takes from the
committed log (KafScale's own reader; each checked to lie within the produce window).
The Java consumers read all topics in one JVM per version (a JVM start costs seconds).
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from kafscale.storage import segment as segments
from tests.harness.broker import BrokerFactory, BrokerProcess
from tests.harness.clients import JavaProbe
from tests.harness.procs import HarnessError
from tests.harness.roundtrip import Ack, Client, Consumed, Record, Start
from tests.harness.roundtrip_cli import all_clients
from tests.harness.stored import committed_codecs, committed_records

pytestmark = pytest.mark.integration

CLIENTS = ("kcat", "confluent-kafka", "aiokafka", "kafka-python", "java-3.9", "java-4")
JAVA = ("java-3.9", "java-4")
# Every codec at least once, lz4 twice (librdkafka's lz4 needs FindCoordinator advertised).
CODEC = {
    "kcat": "gzip",
    "confluent-kafka": "lz4",
    "aiokafka": "snappy",
    "kafka-python": "zstd",
    "java-3.9": "none",
    "java-4": "zstd",
}
PARTITIONS = (0, 1, 2)
RECORDS_PER_TOPIC = 198
MIB = 1024 * 1024
# Above the default (1 MiB + 12): a batch holding a 1 MiB value plus key and headers is larger.
MAX_MESSAGE_BYTES = 2 * MIB
READ_TIMEOUT = 90.0


def client_params() -> list[Any]:
    return [pytest.param(n, id=n, marks=[pytest.mark.java] if n in JAVA else []) for n in CLIENTS]


def pair_params() -> list[Any]:
    """(consumer, producer) for every pair, with ids like "kcat-reads-java-4"."""
    return [
        pytest.param(
            consumer,
            producer,
            id=f"{consumer}-reads-{producer}",
            marks=[pytest.mark.java] if {consumer, producer} & set(JAVA) else [],
        )
        for consumer in CLIENTS
        for producer in CLIENTS
    ]


# --- records ----------------------------------------------------------------------------------


def make_records(seed: int, count: int, *, kcat: bool, big: bool = True) -> list[Record]:
    """`count` records over partitions 0-2 (round robin), deterministic for `seed`.

    Explicit timestamps rise by 1 s per record of a partition, every tenth repeats the one before;
    partition 2's lie an hour before the others (a timestamp lookup past its end). kcat records
    have no timestamp and one header set per partition.
    """
    rng = random.Random(seed)
    base = (int(time.time()) - 600) * 1000
    previous: dict[int, int] = {}
    records = []
    for i in range(count):
        partition = PARTITIONS[i % len(PARTITIONS)]
        j = i // len(PARTITIONS)
        value = _value(rng, i, big)
        key: bytes | None = (
            None
            if i % 5 == 0
            else b""
            if i % 11 == 0
            else rng.randbytes(5000 if i % 29 == 0 else rng.randint(1, 40))
        )
        if kcat:
            if key is None and not value:
                key = b"k"  # kcat cannot send a null key with an empty value
            records.append(Record(partition, key, value, _kcat_headers(partition)))
            continue
        start = base - 3_600_000 if partition == 2 else base + 500 * partition
        timestamp = previous[partition] if j % 10 == 5 else start + 1000 * j
        previous[partition] = timestamp
        records.append(Record(partition, key, value, _headers(rng, i), timestamp))
    return records


def _value(rng: random.Random, i: int, big: bool) -> bytes:
    if big and i in (7, 104):
        return rng.randbytes(MIB)  # incompressible
    if big and i == 150:
        return (b"compressible %d " % i * (MIB // 16))[:MIB]
    if i % 13 == 0:
        return b""
    if big and i % 31 == 0:
        return rng.randbytes(rng.randint(100_000, 300_000))
    size = rng.choice((rng.randint(1, 100), rng.randint(100, 4096), rng.randint(4096, 65536)))
    if i % 2:
        return rng.randbytes(size)
    return (b"value-%d-" % i * (size // 8 + 1))[:size]


def _headers(rng: random.Random, i: int) -> tuple[tuple[str, bytes], ...]:
    if i % 4 == 0:
        return ()
    choices = [
        ("trace-id", b"%032x" % rng.getrandbits(128)),
        ("ünïcode-名前", "värde".encode()),
        ("binary", rng.randbytes(rng.randint(1, 64))),
        ("empty", b""),
        ("dup", b"first"),
        ("dup", b"second"),
    ]
    return tuple(rng.sample(choices, rng.randint(1, len(choices))))


def _kcat_headers(partition: int) -> tuple[tuple[str, bytes], ...]:
    if partition == 0:
        return ()
    return (
        ("partition", b"%d" % partition),
        ("ünïcode-名前", b"\xff\xfe\x01 binary"),
        ("empty", b""),
        ("dup", b"first"),
        ("dup", b"second"),
    )


# --- what was produced -----------------------------------------------------------------------


def expected_records(
    topic: str, records: Sequence[Record], acks: Sequence[Ack], timestamps: dict[Any, int]
) -> list[Consumed]:
    """What a consumer must return, partition by partition in offset order."""
    expected = [
        Consumed(
            topic=topic,
            partition=ack.partition,
            offset=ack.offset,
            key=record.key,
            value=record.value,
            headers=record.headers,
            timestamp=timestamps[(ack.partition, ack.offset)]
            if record.timestamp is None
            else record.timestamp,
        )
        for record, ack in zip(records, acks, strict=True)
    ]
    return sorted(expected, key=lambda r: (r.partition, r.offset))


def stored_timestamps(broker: BrokerProcess, topic: str) -> dict[tuple[int, int], int]:
    """(partition, offset) -> timestamp of every record the topic's partitions have committed
    (segments and write-ahead chunks alike)."""
    return {
        (partition, record.offset): record.timestamp
        for partition in PARTITIONS
        for record in committed_records(broker.env, topic, partition)
    }


def stored_codecs(broker: BrokerProcess, topic: str) -> set[str]:
    """The codec names of every batch the topic's partitions have committed."""
    return {
        segments.CODEC_NAMES[codec]
        for partition in PARTITIONS
        for codec in committed_codecs(broker.env, topic, partition)
    }


@dataclass(frozen=True)
class Produced:
    topic: str
    records: list[Record]
    acks: list[Ack]
    expected: list[Consumed]


class Topics:
    """The module's topics, each produced on first use (per xdist worker)."""

    def __init__(self, broker: BrokerProcess, clients: dict[str, Client]) -> None:
        self.broker = broker
        self.clients = clients
        self._produced: dict[str, Produced | BaseException] = {}
        self._java_earliest: dict[str, dict[str, list[Consumed]]] = {}

    def create(self, topic: str) -> None:
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": self.broker.bootstrap})
        config = {"max.message.bytes": str(MAX_MESSAGE_BYTES)}
        admin.create_topics([NewTopic(topic, len(PARTITIONS), 1, config=config)])[topic].result(30)

    def produce(self, producer: str, topic: str, records: Sequence[Record]) -> Produced:
        """`producer` sends `records` to `topic`; checks the acknowledgements are contiguous."""
        before = int(time.time() * 1000)
        acks = self.clients[producer].produce(
            self.broker.bootstrap, topic, records, CODEC[producer]
        )
        after = int(time.time() * 1000)
        assert [a.partition for a in acks] == [r.partition for r in records]
        for partition in PARTITIONS:
            offsets = [a.offset for a in acks if a.partition == partition]
            assert offsets == list(range(offsets[0], offsets[0] + len(offsets))), (
                f"{producer}: partition {partition} acknowledged offsets {offsets}"
            )
        timestamps: dict[Any, int] = {}
        if any(r.timestamp is None for r in records):
            timestamps = stored_timestamps(self.broker, topic)
            for ack in acks:
                # acks=all: the record is committed; stamped by the producer while it ran
                assert before <= timestamps[(ack.partition, ack.offset)] <= after
        return Produced(
            topic, list(records), acks, expected_records(topic, records, acks, timestamps)
        )

    def get(self, producer: str) -> Produced:
        """The producer's main topic, produced once; a failure is re-raised on every use."""
        if producer not in self._produced:
            topic = f"rt-{producer}"
            try:
                self.create(topic)
                records = make_records(
                    CLIENTS.index(producer), RECORDS_PER_TOPIC, kcat=producer == "kcat"
                )
                self._produced[producer] = self.produce(producer, topic, records)
            except BaseException as exc:
                self._produced[producer] = exc
        produced = self._produced[producer]
        if isinstance(produced, BaseException):
            raise HarnessError(f"producing with {producer} failed: {produced!r}") from produced
        return produced

    def java_earliest(self, consumer: str) -> dict[str, list[Consumed]]:
        """Every produced topic read from earliest by one run of the Java consumer."""
        if consumer not in self._java_earliest:
            produced = []
            for producer in CLIENTS:
                try:
                    produced.append(self.get(producer))
                except HarnessError:
                    continue  # that producer's own tests report it
            got = self.clients[consumer].consume(
                self.broker.bootstrap,
                [p.topic for p in produced],
                PARTITIONS,
                "earliest",
                sum(len(p.expected) for p in produced),
                READ_TIMEOUT,
            )
            self._java_earliest[consumer] = {
                p.topic: [r for r in got if r.topic == p.topic] for p in produced
            }
        return self._java_earliest[consumer]


@pytest.fixture(scope="module")
def roundtrip_broker(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerProcess]:
    factory = BrokerFactory(
        tmp_path_factory.mktemp("roundtrip"),
        request.node.name,
        etcd=lambda: request.getfixturevalue("etcd_server"),
        s3=lambda: request.getfixturevalue("s3_server"),
    )
    try:
        yield factory({"KAFSCALE_FLUSH_INTERVAL_MS": "100"}, ready=True)
    finally:
        problems = factory.close()
        if problems:
            pytest.fail("\n\n".join(problems), pytrace=False)


@pytest.fixture(scope="module")
def topics(roundtrip_broker: BrokerProcess, kcat: str, java_probe: JavaProbe) -> Topics:
    return Topics(roundtrip_broker, all_clients(kcat, java_probe))


# --- comparing --------------------------------------------------------------------------------


def _show(record: Consumed | None) -> str:
    if record is None:
        return "nothing"

    def size(data: bytes | None) -> str:
        return "null" if data is None else f"{len(data)}B {data[:12]!r}"

    headers = [(name, size(value)) for name, value in record.headers]
    return (
        f"offset {record.offset} key {size(record.key)} value {size(record.value)} "
        f"headers {headers} timestamp {record.timestamp}"
    )


def assert_same(got: Sequence[Consumed], expected: Sequence[Consumed], who: str) -> None:
    """The records of each partition arrived in offset order and equal `expected` exactly."""
    __tracebackhide__ = True
    problems = []
    for topic in sorted({r.topic for r in [*got, *expected]}):
        for partition in sorted({r.partition for r in [*got, *expected] if r.topic == topic}):
            mine = [r for r in got if (r.topic, r.partition) == (topic, partition)]
            want = [r for r in expected if (r.topic, r.partition) == (topic, partition)]
            if mine == want:
                continue
            first = next(
                i for i in range(max(len(mine), len(want)))
                if i >= len(mine) or i >= len(want) or mine[i] != want[i]
            )  # fmt: skip
            problems.append(
                f"{topic}[{partition}]: got {len(mine)} records, want {len(want)}; "
                f"first difference at #{first}:\n"
                f"  got  {_show(mine[first] if first < len(mine) else None)}\n"
                f"  want {_show(want[first] if first < len(want) else None)}"
            )
    assert not problems, f"{who}:\n" + "\n".join(problems)


def first_at_or_after(expected: Sequence[Consumed], timestamp: int) -> list[Consumed]:
    """Per partition, the records from the first one whose timestamp is >= `timestamp`
    (Kafka's offsetsForTimes); none for a partition where there is no such record."""
    selected: list[Consumed] = []
    for partition in PARTITIONS:
        records = [r for r in expected if r.partition == partition]
        start = next((i for i, r in enumerate(records) if r.timestamp >= timestamp), len(records))
        selected.extend(records[start:])
    return selected


# --- tests ------------------------------------------------------------------------------------


@pytest.mark.compat("produce", param="producer")
@pytest.mark.parametrize("producer", client_params())
def test_producer_gets_contiguous_acknowledgements(topics: Topics, producer: str) -> None:
    produced = topics.get(producer)  # acknowledgements are checked there
    assert len(produced.acks) == RECORDS_PER_TOPIC
    assert {a.offset for a in produced.acks if a.partition == 0} == set(range(66))
    # Batches the producer compressed are stored as sent. Uncompressed ones ("none", and
    # librdkafka's when compressing would not shrink them, e.g. 1 MiB of random bytes) are
    # compressed by the broker with KAFSCALE_COMPRESSION_CODEC (snappy).
    stored = stored_codecs(topics.broker, produced.topic)
    if CODEC[producer] == "none":
        assert stored <= {"none", "snappy"}
    else:
        assert CODEC[producer] in stored and stored <= {CODEC[producer], "none", "snappy"}


@pytest.mark.compat("earliest", param="consumer")
@pytest.mark.compat("produce", param="producer")
@pytest.mark.parametrize(("consumer", "producer"), pair_params())
def test_consumer_reads_producer_from_earliest(
    topics: Topics, consumer: str, producer: str
) -> None:
    produced = topics.get(producer)
    if consumer in JAVA:
        got = topics.java_earliest(consumer)[produced.topic]
    else:
        got = topics.clients[consumer].consume(
            topics.broker.bootstrap,
            [produced.topic],
            PARTITIONS,
            "earliest",
            len(produced.expected),
            READ_TIMEOUT,
        )
    assert_same(got, produced.expected, f"{consumer} reading what {producer} wrote")


@pytest.mark.compat("latest", param="client")
@pytest.mark.parametrize("client", client_params())
def test_consumer_from_latest_sees_only_new_records(topics: Topics, client: str) -> None:
    topic = f"rt-latest-{client}"
    topics.create(topic)
    kcat = client == "kcat"
    old = topics.produce(client, topic, make_records(100, 15, kcat=kcat, big=False))
    new_records = make_records(101, 21, kcat=kcat)  # one 1 MiB value among them
    new: list[Produced] = []

    def produce_new() -> None:
        new.append(topics.produce(client, topic, new_records))

    got = topics.clients[client].consume(
        topics.broker.bootstrap,
        [topic],
        PARTITIONS,
        "latest",
        len(new_records),
        READ_TIMEOUT,
        on_ready=produce_new,
    )
    assert new, "the consumer never said its positions were fixed"
    [produced] = new
    assert {a.offset for a in produced.acks} == set(range(5, 12))  # after the 5 old ones each
    assert {a.offset for a in old.acks} == set(range(5))
    assert_same(got, produced.expected, f"{client} reading from latest")


@pytest.mark.compat("timestamp", param="client")
@pytest.mark.parametrize("client", client_params())
def test_consumer_from_timestamp_starts_at_first_record_at_or_after_it(
    topics: Topics, client: str
) -> None:
    produced = topics.get(client)
    partition_0 = [r for r in produced.expected if r.partition == 0]
    if client == "kcat":  # producer-stamped: take the median of what was stored
        timestamp = sorted(r.timestamp for r in produced.expected)[len(produced.expected) // 2]
    else:
        # Record 35 of partition 0 repeats the timestamp of record 34: the lookup must land on
        # 34, the first of the two. Partition 2's records are all older: it starts at its end.
        assert partition_0[35].timestamp == partition_0[34].timestamp
        timestamp = partition_0[35].timestamp
    want = first_at_or_after(produced.expected, timestamp)
    if client != "kcat":
        assert want[0].offset == 34 and not [r for r in want if r.partition == 2]
    start: Start = timestamp
    got = topics.clients[client].consume(
        topics.broker.bootstrap, [produced.topic], PARTITIONS, start, len(want), READ_TIMEOUT
    )
    assert_same(got, want, f"{client} reading from timestamp {timestamp}")
