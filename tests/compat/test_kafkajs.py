"""kafkajs (npm) against KafScale (issue 7, the compatibility matrix): what kafkajs produces with
each codec, confluent-kafka reads back identical; what confluent-kafka produces, kafkajs reads
back identical from earliest, from latest (only the records produced once it was ready) and from
a timestamp (the first offset at or after it).

kafkajs decompresses what confluent-kafka compressed: lz4 (earliest), zstd (latest), snappy
(timestamp). Records, expectations and comparisons are those of the cross-client round trips
(tests/integration/test_roundtrip.py). kafkajs takes headers as an object, so the records it
produces keep each repeated header name's values together (see tests/harness/kafkajs.py).
Needs `tests/compat/node/install.sh` (the fixture fails, never skips, without it).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import pytest

from tests.compat.common import create_topic
from tests.harness.broker import BrokerProcess
from tests.harness.kafkajs import KafkaJs
from tests.harness.procs import HarnessError
from tests.harness.roundtrip import CODECS, Ack, ConfluentKafka, Consumed, Record
from tests.integration.test_roundtrip import (
    PARTITIONS,
    READ_TIMEOUT,
    assert_same,
    expected_records,
    first_at_or_after,
    make_records,
    stored_codecs,
)

pytestmark = pytest.mark.integration

RECORDS = 99  # 33 per partition


@pytest.fixture
def kafkajs() -> KafkaJs:
    try:
        return KafkaJs()
    except HarnessError as exc:
        pytest.fail(str(exc), pytrace=False)


def grouped_headers(records: Sequence[Record]) -> list[Record]:
    """The records with each header name's values moved next to its first occurrence (their
    order kept): what a kafkajs headers object can carry."""
    regrouped = []
    for record in records:
        names = list(dict.fromkeys(name for name, _ in record.headers))
        headers = tuple(h for name in names for h in record.headers if h[0] == name)
        regrouped.append(
            Record(record.partition, record.key, record.value, headers, record.timestamp)
        )
    return regrouped


def check_acks(who: str, records: Sequence[Record], acks: Sequence[Ack], first: int = 0) -> None:
    assert [a.partition for a in acks] == [r.partition for r in records], who
    for partition in PARTITIONS:
        offsets = [a.offset for a in acks if a.partition == partition]
        want = list(range(first, first + len(offsets)))
        assert offsets == want, f"{who}: partition {partition} acknowledged offsets {offsets}"


def produce(client: KafkaJs | ConfluentKafka, broker: BrokerProcess, topic: str,
            records: Sequence[Record], codec: str, first: int = 0) -> list[Consumed]:  # fmt: skip
    acks = client.produce(broker.bootstrap, topic, records, codec)
    check_acks(f"{client.name} producing {codec}", records, acks, first)
    return expected_records(topic, records, acks, {})


def mixed_headers(records: Sequence[Record]) -> bool:
    """Some record repeats a header name with another name in between (kafkajs's object would
    lose that order: the consumer must still deliver it)."""
    for record in records:
        names = [name for name, _ in record.headers]
        if any(name in names[: i - 1] and names[i - 1] != name for i, name in enumerate(names)):
            return True
    return False


@pytest.mark.compat("produce", "kafkajs")
@pytest.mark.parametrize("codec", CODECS)
def test_confluent_reads_what_kafkajs_produced(
    kafscale: BrokerProcess, kafkajs: KafkaJs, codec: str
) -> None:
    topic = f"kafkajs-{codec}"
    create_topic(kafscale, topic)
    records = grouped_headers(make_records(CODECS.index(codec), RECORDS, kcat=False))
    assert any(len(r.value) == 1024 * 1024 for r in records)  # a 1 MiB value among them
    expected = produce(kafkajs, kafscale, topic, records, codec)
    stored = stored_codecs(kafscale, topic)
    if codec == "none":
        assert stored <= {"none", "snappy"}  # the broker may compress what came uncompressed
    else:
        assert codec in stored and stored <= {codec, "none", "snappy"}, stored
    got = ConfluentKafka().consume(
        kafscale.bootstrap, [topic], PARTITIONS, "earliest", len(expected), READ_TIMEOUT
    )
    assert_same(got, expected, f"confluent-kafka reading what kafkajs wrote with {codec}")


@pytest.mark.compat("earliest", "kafkajs")
def test_kafkajs_reads_confluent_from_earliest(kafscale: BrokerProcess, kafkajs: KafkaJs) -> None:
    topic = "kafkajs-earliest"
    create_topic(kafscale, topic)
    records = make_records(40, RECORDS, kcat=False)
    assert mixed_headers(records)
    expected = produce(ConfluentKafka(), kafscale, topic, records, "lz4")
    got = kafkajs.consume(
        kafscale.bootstrap, [topic], PARTITIONS, "earliest", len(expected), READ_TIMEOUT
    )
    assert_same(got, expected, "kafkajs reading what confluent-kafka wrote, from earliest")


@pytest.mark.compat("latest", "kafkajs")
def test_kafkajs_from_latest_sees_only_new_records(
    kafscale: BrokerProcess, kafkajs: KafkaJs
) -> None:
    topic = "kafkajs-latest"
    create_topic(kafscale, topic)
    confluent = ConfluentKafka()
    produce(confluent, kafscale, topic, make_records(41, 15, kcat=False, big=False), "zstd")
    new_records = make_records(42, 21, kcat=False)  # one 1 MiB value among them
    new: list[list[Consumed]] = []

    def produce_new() -> None:
        time.sleep(0.5)  # were the positions not fixed, the consumer would have read the old ones
        new.append(produce(confluent, kafscale, topic, new_records, "zstd", first=5))

    got = kafkajs.consume(
        kafscale.bootstrap,
        [topic],
        PARTITIONS,
        "latest",
        len(new_records),
        READ_TIMEOUT,
        on_ready=produce_new,
    )
    assert new, "kafkajs never said its positions were fixed"
    assert_same(got, new[0], "kafkajs reading from latest")


@pytest.mark.compat("timestamp", "kafkajs")
def test_kafkajs_from_timestamp_starts_at_first_record_at_or_after_it(
    kafscale: BrokerProcess, kafkajs: KafkaJs
) -> None:
    topic = "kafkajs-timestamp"
    create_topic(kafscale, topic)
    expected = produce(
        ConfluentKafka(), kafscale, topic, make_records(43, RECORDS, kcat=False), "snappy"
    )
    partition_0 = [r for r in expected if r.partition == 0]
    # Record 15 of partition 0 repeats the timestamp of record 14: the lookup must land on 14.
    # Partition 2's records are all older: it starts at its end (nothing).
    assert partition_0[15].timestamp == partition_0[14].timestamp
    timestamp = partition_0[15].timestamp
    want = first_at_or_after(expected, timestamp)
    assert want[0].offset == 14 and not [r for r in want if r.partition == 2]
    got = kafkajs.consume(
        kafscale.bootstrap, [topic], PARTITIONS, timestamp, len(want), READ_TIMEOUT
    )
    assert_same(got, want, f"kafkajs reading from timestamp {timestamp}")


def test_kafkajs_refuses_headers_it_cannot_express(kafkajs: KafkaJs) -> None:
    mixed = Record(0, b"k", b"v", (("dup", b"1"), ("other", b"2"), ("dup", b"3")))
    with pytest.raises(ValueError, match="repeated header name"):
        kafkajs.produce("127.0.0.1:1", "unused", [mixed], "none")
    numeric = Record(0, b"k", b"v", (("7", b"1"),))
    with pytest.raises(ValueError, match="integer-like"):
        kafkajs.produce("127.0.0.1:1", "unused", [numeric], "none")
