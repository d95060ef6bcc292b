"""franz-go's (pkg/kadm) and kafkajs's admin clients against KafScale (issue 7, the compatibility
matrix): create a topic with configs (and again: TOPIC_ALREADY_EXISTS), describe the cluster, the
topic and its configs; then a group member of the same client reads the topic and commits, and
the admin client describes the group it left (Empty, no members) and its committed offsets (the
end of every partition). Both drivers print the same JSON object (tests/compat/go/admin.go).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.harness.broker import BrokerProcess
from tests.harness.franz_go import FranzGo
from tests.harness.groups import GroupConsumers, all_records
from tests.harness.kafkajs import KafkaJs
from tests.harness.procs import HarnessError
from tests.harness.roundtrip import ConfluentKafka, Record

pytestmark = pytest.mark.integration

PARTITIONS = 3
RECORDS = 30
# kafkajs names source 1 as in Kafka 1.x (TOPIC_CONFIG), kadm as in 2.x (DYNAMIC_TOPIC_CONFIG)
DYNAMIC = {"DYNAMIC_TOPIC_CONFIG", "TOPIC_CONFIG"}


@pytest.fixture(params=["franz-go", "kafkajs"])
def driver(request: pytest.FixtureRequest) -> FranzGo | KafkaJs:
    try:
        return FranzGo() if request.param == "franz-go" else KafkaJs()
    except HarnessError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.mark.compat("create", param="driver")
@pytest.mark.compat("admin", param="driver")
@pytest.mark.compat("group", param="driver")
def test_admin_creates_and_describes_topics_and_groups(
    kafscale: BrokerProcess, driver: FranzGo | KafkaJs, group_consumers: GroupConsumers
) -> None:
    topic, group = f"admin-{driver.name}", f"admin-group-{driver.name}"
    configs = {"retention.ms": "60000", "max.message.bytes": "2097152"}
    described = driver.admin(kafscale.bootstrap, topic, PARTITIONS, configs)
    assert (described["created"], described["created_again"]) == (None, "TOPIC_ALREADY_EXISTS")
    cluster = described["cluster"]
    assert cluster["controller"] == 0
    assert cluster["brokers"] == [{"id": 0, "host": "127.0.0.1", "port": kafscale.port}]
    want = [{"partition": p, "leader": 0, "replicas": [0]} for p in range(PARTITIONS)]
    assert described["topic"]["partitions"] == want
    for name, value in configs.items():
        entry = described["configs"][name]
        assert entry["value"] == value and entry["source"] in DYNAMIC, (name, entry)
    default = described["configs"]["cleanup.policy"]
    assert default == {"value": "delete", "source": "DEFAULT_CONFIG"}

    records = [Record(i % PARTITIONS, b"k%d" % i, b"v%d" % i) for i in range(RECORDS)]
    ConfluentKafka().produce(kafscale.bootstrap, topic, records, "none")
    member = group_consumers.start(
        driver.name, kafscale.bootstrap, [topic], group, timeout=120, count=RECORDS
    )
    member.wait_for(lambda m: m.done, 90, "every record read")
    assert member.wait() == 0, member.report()
    values = sorted(r.value or "" for r in all_records([member]))
    assert values == sorted(f"v{i}" for i in range(RECORDS)), member.report()

    after: dict[str, Any] = driver.admin(kafscale.bootstrap, topic, PARTITIONS, group=group)
    assert after["created"] == "TOPIC_ALREADY_EXISTS"
    assert after["group"] == {"state": "Empty", "protocol_type": "consumer", "members": 0}
    ends = [RECORDS // PARTITIONS] * PARTITIONS
    offsets = [(o["topic"], o["partition"], o["offset"]) for o in after["offsets"]]
    assert offsets == [(topic, p, ends[p]) for p in range(PARTITIONS)]
