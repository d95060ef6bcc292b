"""The Java producers (kafka-clients 3.9 and 4.x) with every codec (issue 7, the compatibility
matrix): what each writes with none, gzip, snappy, lz4 and zstd is stored with that codec and
confluent-kafka reads it back identical. (The cross-client round trips give each Java version one
codec; kcat, confluent-kafka, kafka-python and aiokafka have their every-codec tests in
tests/integration/test_produce.py, franz-go and kafkajs theirs in this directory.)
"""

from __future__ import annotations

import pytest

from tests.compat.common import create_topic
from tests.harness.broker import BrokerProcess
from tests.harness.clients import JavaProbe
from tests.harness.roundtrip import CODECS, ConfluentKafka
from tests.harness.roundtrip_cli import JavaClients
from tests.integration.test_roundtrip import (
    PARTITIONS,
    READ_TIMEOUT,
    assert_same,
    expected_records,
    make_records,
    stored_codecs,
)

pytestmark = [pytest.mark.integration, pytest.mark.java]

RECORDS = 30  # 10 per partition, small values: one JVM per codec is the cost here


@pytest.mark.compat("produce", param="version", prefix="java-")
@pytest.mark.parametrize("version", ["3.9", "4"])
def test_java_producer_with_every_codec(
    kafscale: BrokerProcess, java_probe: JavaProbe, version: str
) -> None:
    java = JavaClients(java_probe, version)
    for seed, codec in enumerate(CODECS):
        topic = f"java-{version}-{codec}"
        create_topic(kafscale, topic)
        records = make_records(100 + seed, RECORDS, kcat=False, big=False)
        acks = java.produce(kafscale.bootstrap, topic, records, codec)
        expected = expected_records(topic, records, acks, {})
        stored = stored_codecs(kafscale, topic)
        if codec == "none":
            assert stored <= {"none", "snappy"}, stored  # the broker may compress it
        else:
            assert codec in stored and stored <= {codec, "none", "snappy"}, (codec, stored)
        got = ConfluentKafka().consume(
            kafscale.bootstrap, [topic], PARTITIONS, "earliest", len(expected), READ_TIMEOUT
        )
        assert_same(got, expected, f"confluent-kafka reading what {java.name} wrote with {codec}")
