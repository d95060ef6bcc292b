"""franz-go (github.com/twmb/franz-go/pkg/kgo) against KafScale, toward the compatibility matrix
(issue 7): what franz-go produces with each codec, confluent-kafka (librdkafka) reads back
identical; what confluent-kafka produces, franz-go reads back identical from earliest, from
latest (only records produced once its positions were fixed) and from a timestamp (the first
offset at or after it). franz-go's KIP-848 consumer group (kgo.ServerSideBalancer, the driver's
`--config group.protocol=consumer`): members split a topic, a killed member's partitions move
after the group's session timeout, a member that leaves hands its partitions to the last one.

The records and comparisons are the cross-client round trip's (tests/integration/
test_roundtrip.py): null, empty and binary keys, several headers (duplicate names, empty and
binary values, non-ASCII names), values up to 1 MiB, explicit timestamps with repeats. The driver
is tests/compat/go (run tests/compat/go/install.sh first); the tests fail, not skip, without it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from tests.compat.common import create_topic
from tests.harness.broker import BrokerProcess
from tests.harness.franz_go import FranzGo
from tests.harness.groups import GroupConsumers, all_records, wait_for_assignment
from tests.harness.procs import HarnessError
from tests.harness.roundtrip import CODECS, Ack, Client, ConfluentKafka, Consumed, Record
from tests.integration import test_groups as groups
from tests.integration.test_consumer_groups import (
    FAILOVER_S,
    FAST_CONSUMER_GROUPS,
    consumer_protocol,
    describe,
)
from tests.integration.test_group_clients import committed_offsets, end_offsets, values
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

RECORDS = 99  # 33 per partition, one value of 1 MiB


@pytest.fixture
def franz_go() -> FranzGo:
    try:
        return FranzGo()
    except HarnessError as exc:
        pytest.fail(str(exc), pytrace=False)


def produce(
    broker: BrokerProcess, client: Client, topic: str, records: Sequence[Record], codec: str
) -> list[Consumed]:
    """`client` sends `records`; checks every partition's acknowledgements are contiguous and
    returns what a consumer must read back (by partition, in offset order)."""
    acks: list[Ack] = client.produce(broker.bootstrap, topic, records, codec)
    assert [a.partition for a in acks] == [r.partition for r in records]
    for partition in PARTITIONS:
        offsets = [a.offset for a in acks if a.partition == partition]
        assert offsets == list(range(offsets[0], offsets[0] + len(offsets))), (
            f"{client.name}: partition {partition} acknowledged offsets {offsets}"
        )
    return expected_records(topic, records, acks, {})


@pytest.mark.compat("produce", "franz-go")
@pytest.mark.parametrize("codec", CODECS)
def test_confluent_reads_what_franz_go_produced(
    kafscale: BrokerProcess, franz_go: FranzGo, codec: str
) -> None:
    topic = f"franz-go-{codec}"
    create_topic(kafscale, topic)
    records = make_records(CODECS.index(codec), RECORDS, kcat=False)
    expected = produce(kafscale, franz_go, topic, records, codec)
    assert {e.offset for e in expected if e.partition == 0} == set(range(RECORDS // 3))
    # What franz-go compressed is stored as sent; uncompressed batches may be compressed by the
    # broker (KAFSCALE_COMPRESSION_CODEC, snappy by default).
    stored = stored_codecs(kafscale, topic)
    if codec == "none":
        assert stored <= {"none", "snappy"}
    else:
        assert codec in stored and stored <= {codec, "none", "snappy"}
    got = ConfluentKafka().consume(
        kafscale.bootstrap, [topic], PARTITIONS, "earliest", len(expected), READ_TIMEOUT
    )
    assert_same(got, expected, f"confluent-kafka reading what franz-go wrote with {codec}")


@pytest.mark.compat("earliest", "franz-go")
def test_franz_go_reads_confluent_from_earliest(kafscale: BrokerProcess, franz_go: FranzGo) -> None:
    topic = "confluent-earliest"
    create_topic(kafscale, topic)
    expected = produce(
        kafscale, ConfluentKafka(), topic, make_records(10, RECORDS, kcat=False), "lz4"
    )
    got = franz_go.consume(
        kafscale.bootstrap, [topic], PARTITIONS, "earliest", len(expected), READ_TIMEOUT
    )
    assert_same(got, expected, "franz-go reading what confluent-kafka wrote, from earliest")


@pytest.mark.compat("latest", "franz-go")
def test_franz_go_from_latest_sees_only_new_records(
    kafscale: BrokerProcess, franz_go: FranzGo
) -> None:
    topic = "confluent-latest"
    create_topic(kafscale, topic)
    confluent = ConfluentKafka()
    old = produce(kafscale, confluent, topic, make_records(11, 15, kcat=False, big=False), "zstd")
    new_records = make_records(12, 21, kcat=False)  # one 1 MiB value among them
    new: list[list[Consumed]] = []

    def produce_new() -> None:
        new.append(produce(kafscale, confluent, topic, new_records, "zstd"))

    got = franz_go.consume(
        kafscale.bootstrap,
        [topic],
        PARTITIONS,
        "latest",
        len(new_records),
        READ_TIMEOUT,
        on_ready=produce_new,
    )
    assert new, "franz-go never said its positions were fixed"
    [expected] = new
    assert {r.offset for r in old} == set(range(5))
    assert {r.offset for r in expected} == set(range(5, 12))  # after the 5 old ones each
    assert_same(got, expected, "franz-go reading from latest")


@pytest.mark.compat("timestamp", "franz-go")
def test_franz_go_from_timestamp_starts_at_first_record_at_or_after_it(
    kafscale: BrokerProcess, franz_go: FranzGo
) -> None:
    topic = "confluent-timestamp"
    create_topic(kafscale, topic)
    records = make_records(13, RECORDS, kcat=False)
    expected = produce(kafscale, ConfluentKafka(), topic, records, "gzip")
    # Record 15 of partition 0 repeats the timestamp of record 14: the lookup must land on 14,
    # the first of the two. Partition 2's records are all older: it starts at its end.
    partition_0 = [r for r in expected if r.partition == 0]
    assert partition_0[15].timestamp == partition_0[14].timestamp
    timestamp = partition_0[15].timestamp
    want = first_at_or_after(expected, timestamp)
    assert want[0].offset == 14 and not [r for r in want if r.partition == 2]
    got = franz_go.consume(
        kafscale.bootstrap, [topic], PARTITIONS, timestamp, len(want), READ_TIMEOUT
    )
    assert_same(got, want, f"franz-go reading from timestamp {timestamp}")


@pytest.mark.compat("kip848", "franz-go")
@pytest.mark.parametrize("assignor", ["uniform", "range"])
def test_franz_go_consumer_group_members_split_and_take_over_partitions(
    start_broker: Callable[..., Any],
    franz_go: FranzGo,
    group_consumers: GroupConsumers,
    assignor: str,
) -> None:
    broker = start_broker(env=FAST_CONSUMER_GROUPS)
    broker.wait_ready()
    topic, group, partitions = "franz848", f"franz848-{assignor}", 6
    produced = values("before", 300)
    asyncio.run(groups.create_topic(broker.bootstrap, topic, partitions))
    asyncio.run(groups.produce(broker.bootstrap, topic, produced, partitions))
    members = [
        group_consumers.start(
            "franz-go",
            broker.bootstrap,
            [topic],
            group,
            timeout=180,
            configs=consumer_protocol(assignor),
        )
        for _ in range(3)
    ]
    everything = {(topic, p) for p in range(partitions)}
    shares = wait_for_assignment(members, everything, timeout=FAILOVER_S)
    assert all(len(share) == 2 for share in shares), shares
    # kgo falls back to the classic protocol by itself: the group's type says which one it is
    described = describe(broker.bootstrap, group)
    assert str(described.type).endswith("CONSUMER"), described
    assert described.partition_assignor == assignor
    assert len(described.members) == 3

    def seen() -> set[bytes]:
        return {(r.value or "").encode() for r in all_records(members)}

    members[0].wait_for(lambda _: set(produced) <= seen() or None, 60, "every record read")
    members[2].kill()  # no leave: its partitions wait out the group's session timeout
    survivors = members[:2]
    wait_for_assignment(survivors, everything, timeout=FAILOVER_S)
    after = values("after", 300)
    asyncio.run(groups.produce(broker.bootstrap, topic, after, partitions))
    produced += after
    survivors[0].wait_for(lambda _: set(produced) <= seen() or None, 60, "every record read")
    assert survivors[0].terminate() == 0, survivors[0].report()  # leaves with epoch -1
    wait_for_assignment(survivors[1:], everything, timeout=FAILOVER_S)
    assert survivors[1].terminate() == 0, survivors[1].report()
    assert set(produced) <= seen()  # at least once: nothing lost
    assert not [e for m in members for e in m.of_kind("commit-failed")], [
        m.report() for m in members
    ]
    assert committed_offsets(broker.bootstrap, group, topic, partitions) == end_offsets(
        broker.bootstrap, topic, partitions
    )
    assert str(describe(broker.bootstrap, group).state).endswith("EMPTY")
