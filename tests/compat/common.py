"""Helpers shared by the compatibility tests."""

from __future__ import annotations

from tests.harness.broker import BrokerProcess
from tests.integration.test_roundtrip import MAX_MESSAGE_BYTES, PARTITIONS


def create_topic(broker: BrokerProcess, topic: str) -> None:
    """A topic with the round-trip tests' partitions and message size limit (1 MiB values)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    config = {"max.message.bytes": str(MAX_MESSAGE_BYTES)}
    admin.create_topics([NewTopic(topic, len(PARTITIONS), 1, config=config)])[topic].result(30)
