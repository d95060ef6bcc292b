"""Kafka Streams, unchanged, against real processes on etcd and MinIO: Kafka's word count
(tests/java/streams-4) keeps its counts in a state store whose changelog is a compacted topic
Streams creates, and regroups words through a repartition topic it purges with DeleteRecords. The
log cleaner cleans the changelog; the application, stopped and started again without its local
state, restores the counts from the cleaned changelog and carries on counting from them
(docs/design/ecosystem.md, section 4)."""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.harness.clients import JVM_FLAGS
from tests.harness.jvm import JavaProcess
from tests.harness.paths import JAVA_TARGET

from .test_admin import confluent_configs
from .test_retention import create, entries

pytestmark = pytest.mark.integration

APP = "wordcount"
CHANGELOG = f"{APP}-counts-changelog"
ENV = {"KAFSCALE_COMPACTION_MAX_AGE_MS": "1000", "KAFSCALE_CLEANER_BACKOFF_MS": "300"}
WORDS = ["apple", "banana", "cherry", "damson", "elder"]


class WordCount(JavaProcess):
    """The Streams application; its stdout (state changes) in a log file."""

    def __init__(self, bootstrap: str, state_dir: Path, log: Path) -> None:
        classpath = f"{JAVA_TARGET / 'streams-4' / 'classes'}{os.pathsep}"
        classpath += f"{JAVA_TARGET / 'lib-streams-4'}/*"
        args = [bootstrap, APP, "lines", "counts", str(state_dir)]
        super().__init__(classpath, "io.kafscale.streams.WordCount", args, log, JVM_FLAGS)

    def wait_running(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while "STATE RUNNING" not in self.log.read_text():
            assert self.process.poll() is None, self.tail()
            assert time.monotonic() < deadline, self.tail()
            time.sleep(0.2)

    def stop(self) -> None:
        super().stop()
        assert "STATE ERROR" not in self.log.read_text(), self.tail()


def produce_lines(bootstrap: str, lines: list[str]) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for line in lines:
        producer.produce("lines", value=line.encode())
    assert producer.flush(30) == 0


def latest_counts(bootstrap: str, group: str) -> dict[str, int]:
    """The last count the application wrote for each word (a consumer of "counts" reading
    from the start to its end)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        metadata = consumer.list_topics("counts", timeout=10)
        partitions = [TopicPartition("counts", p, 0) for p in metadata.topics["counts"].partitions]
        ends = {}
        for tp in partitions:
            ends[tp.partition] = consumer.get_watermark_offsets(tp, timeout=10)[1]
        consumer.assign(partitions)
        counts: dict[str, int] = {}
        positions = dict.fromkeys(ends, 0)
        deadline = time.monotonic() + 30
        while any(positions[p] < ends[p] for p in ends):
            assert time.monotonic() < deadline, f"read {positions} of {ends}"
            message = consumer.poll(1)
            if message is None or message.error() is not None:
                continue
            counts[message.key().decode()] = int.from_bytes(message.value(), "big", signed=True)
            positions[message.partition()] = message.offset() + 1
        return counts
    finally:
        consumer.close()


def wait_for_counts(bootstrap: str, expected: Counter[str], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    reads = 0
    while (seen := latest_counts(bootstrap, f"check-{reads}")) != dict(expected):
        assert time.monotonic() < deadline, f"counts {seen}, expected {dict(expected)}"
        reads += 1
        time.sleep(1)


def lines_of(rounds: range) -> tuple[list[str], Counter[str]]:
    lines = [" ".join(WORDS[: 1 + (r + i) % len(WORDS)]) for r in rounds for i in range(10)]
    return lines, Counter(word for line in lines for word in line.split())


def test_word_count_restores_its_state_from_a_cleaned_changelog(
    start_broker: Callable[..., Any], tmp_path: Path
) -> None:
    broker = start_broker(ENV, backends="real", ready=True)
    bootstrap = broker.bootstrap
    create(bootstrap, "lines", {})
    create(bootstrap, "counts", {})
    first = WordCount(bootstrap, tmp_path / "state-1", tmp_path / "app-1.log")
    try:
        first.wait_running()
        expected: Counter[str] = Counter()
        for batch in range(3):  # several segments of the changelog, each with every word
            lines, counted = lines_of(range(batch * 5, batch * 5 + 5))
            produce_lines(bootstrap, lines)
            expected += counted
            wait_for_counts(bootstrap, expected)
            time.sleep(1.5)  # the changelog's chunks become a segment after a second
        first.stop()
    finally:
        first.kill()

    # Streams created the changelog compacted; the cleaner leaves one record per word in it.
    assert policy(bootstrap, CHANGELOG) == "compact"
    deadline = time.monotonic() + 90
    while True:
        log = entries(broker, CHANGELOG)
        cleaned = sum(e.records for e in log if e.generation > 0)
        if log and all(e.generation > 0 for e in log) and cleaned == len(WORDS):
            break
        assert time.monotonic() < deadline, f"changelog not cleaned: {log}"
        time.sleep(0.5)

    # Without its local state, the application restores the counts from the changelog.
    second = WordCount(bootstrap, tmp_path / "state-2", tmp_path / "app-2.log")
    try:
        second.wait_running()
        lines, counted = lines_of(range(15, 20))
        produce_lines(bootstrap, lines)
        expected += counted
        wait_for_counts(bootstrap, expected)
        second.stop()
    finally:
        second.kill()


def policy(bootstrap: str, topic: str) -> str | None:
    """The topic's cleanup.policy, as DescribeConfigs gives it."""
    from confluent_kafka.admin import AdminClient, ResourceType

    admin = AdminClient({"bootstrap.servers": bootstrap})
    return confluent_configs(admin, ResourceType.TOPIC, topic)["cleanup.policy"][0]
