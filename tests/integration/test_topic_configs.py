"""Kafka's topic configs through real admin clients: every one Kafka 4.3 defines is accepted,
stored and described, those without effect in KafScale (replication, local disk, tiering, ...)
like the rest; what Kafka refuses is refused with INVALID_CONFIG (docs/compatibility.md, Topic
configs)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.integration.test_admin import TOPIC_CONFIGS, confluent_configs

pytestmark = pytest.mark.integration


def refusal(future: Any) -> tuple[str, str] | None:
    """None if the admin future succeeded, else the Kafka error's name and message."""
    try:
        future.result(30)
    except Exception as exc:
        error = exc.args[0]
        return str(error.name()), str(error.str())
    return None


def test_confluent_kafka_creates_alters_and_describes_kafkas_topic_configs(
    start_broker: Callable[..., Any],
) -> None:
    from confluent_kafka.admin import (
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        NewTopic,
        ResourceType,
    )

    broker = start_broker()
    broker.wait_ready()
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    tuned = {
        "min.insync.replicas": "2",
        "file.delete.delay.ms": "1000",
        "segment.ms": "3600000",
        "cleanup.policy": "",  # Kafka 4.3: keep every record
        "unclean.leader.election.enable": "true",
        "min.cleanable.dirty.ratio": "0.25",
        "leader.replication.throttled.replicas": "*",
    }
    admin.create_topics([NewTopic("tuned", 1, 1, config=tuned)])["tuned"].result(30)
    described = confluent_configs(admin, ResourceType.TOPIC, "tuned")
    assert set(described) == TOPIC_CONFIGS
    assert {name: described[name] for name in tuned} == {
        name: (value, "DYNAMIC_TOPIC_CONFIG") for name, value in tuned.items()
    }
    assert described["flush.ms"] == (str(2**63 - 1), "DEFAULT_CONFIG")
    assert described["compression.zstd.level"] == ("3", "DEFAULT_CONFIG")

    # What Kafka 4.3 refuses, refused the same way.
    refused = admin.create_topics(
        [
            NewTopic("insync", 1, 1, config={"min.insync.replicas": "0"}),
            NewTopic("removed", 1, 1, config={"message.format.version": "3.0"}),
            NewTopic(
                "lags", 1, 1, config={"min.compaction.lag.ms": "9", "max.compaction.lag.ms": "5"}
            ),
            NewTopic("compacted", 1, 1, config={"cleanup.policy": "delete,shred"}),
        ]
    )
    outcomes = {name: refusal(future) for name, future in refused.items()}
    assert {name: outcome and outcome[0] for name, outcome in outcomes.items()} == {
        "insync": "INVALID_CONFIG",
        "removed": "INVALID_CONFIG",
        "lags": "INVALID_CONFIG",
        "compacted": "INVALID_CONFIG",
    }
    messages = {name: outcome[1] for name, outcome in outcomes.items() if outcome}
    assert "Value must be at least 1" in messages["insync"]
    assert "Unknown topic config name: message.format.version" in messages["removed"]
    assert "min.compaction.lag.ms (9) > max.compaction.lag.ms (5)" in messages["lags"]
    assert "shred" in messages["compacted"]

    # IncrementalAlterConfigs: subtracting the only policy leaves an empty, valid list.
    admin.create_topics([NewTopic("orders", 1, 1)])["orders"].result(30)
    subtract = ConfigResource(
        ResourceType.TOPIC,
        "orders",
        incremental_configs=[
            ConfigEntry(
                "cleanup.policy", "delete", incremental_operation=AlterConfigOpType.SUBTRACT
            ),
            ConfigEntry("segment.jitter.ms", "100", incremental_operation=AlterConfigOpType.SET),
        ],
    )
    assert refusal(admin.incremental_alter_configs([subtract])[subtract]) is None
    described = confluent_configs(admin, ResourceType.TOPIC, "orders")
    assert described["cleanup.policy"] == ("", "DYNAMIC_TOPIC_CONFIG")
    assert described["segment.jitter.ms"] == ("100", "DYNAMIC_TOPIC_CONFIG")


@pytest.mark.java
def test_kafka_configs_tool_sets_and_describes_configs_without_effect(
    start_broker: Callable[..., Any], kafka_tools: Any
) -> None:
    broker = start_broker()
    broker.wait_ready()
    server = ["--bootstrap-server", broker.bootstrap]
    topic = ["--entity-type", "topics", "--entity-name", "tuned"]
    kafka_tools.check(
        "topics",
        *server,
        "--create",
        "--topic",
        "tuned",
        "--partitions",
        "1",
        "--config",
        "min.insync.replicas=2",
        "--config",
        "segment.ms=3600000",
    )
    kafka_tools.check(
        "configs", *server, "--alter", *topic, "--add-config", "file.delete.delay.ms=1000"
    )
    described = kafka_tools.check("configs", *server, "--describe", *topic)
    for setting in ("min.insync.replicas=2", "segment.ms=3600000", "file.delete.delay.ms=1000"):
        assert setting in described, described
    everything = kafka_tools.check("configs", *server, "--describe", "--all", *topic)
    for setting in ("min.cleanable.dirty.ratio=0.5", "remote.storage.enable=false"):
        assert setting in everything, everything

    refused = kafka_tools.run(
        "configs", *server, "--alter", *topic, "--add-config", "min.insync.replicas=0"
    )
    assert refused.returncode != 0
    assert "Value must be at least 1" in refused.stdout + refused.stderr
