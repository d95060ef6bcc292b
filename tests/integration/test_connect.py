"""Kafka Connect in distributed mode, unchanged, against real processes on etcd and MinIO. A
worker (connect-runtime, from Kafka's tools) creates its config, offset and status topics
compacted -- and refuses to start unless they are -- joins its group, and runs a source
connector (tests/java/connect-4: CounterSource writes 0, 1, 2, ... with each number as its
source offset). The log cleaner cleans the offsets topic; a worker started again finds the
connector in the config topic and its position in the offsets topic, and carries the sequence
on (docs/design/ecosystem.md, section 4)."""

from __future__ import annotations

import json
import os
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.harness.jvm import JavaProcess
from tests.harness.paths import JAVA_TARGET
from tests.harness.procs import free_port

from .test_retention import entries
from .test_streams import policy

pytestmark = pytest.mark.integration

ENV = {"KAFSCALE_COMPACTION_MAX_AGE_MS": "1000", "KAFSCALE_CLEANER_BACKOFF_MS": "300"}
INTERNAL = {"config": "connect-configs", "offset": "connect-offsets", "status": "connect-status"}


class Worker(JavaProcess):
    """A Connect worker in distributed mode as a process, its log in a file."""

    def __init__(self, bootstrap: str, work: Path, name: str) -> None:
        self.port = free_port()
        properties = work / f"{name}.properties"
        lines = [
            f"bootstrap.servers={bootstrap}",
            "group.id=kafscale-connect",
            f"listeners=http://127.0.0.1:{self.port}",
            "key.converter=org.apache.kafka.connect.storage.StringConverter",
            "value.converter=org.apache.kafka.connect.json.JsonConverter",
            "value.converter.schemas.enable=false",
            "offset.flush.interval.ms=200",
            "offset.storage.partitions=1",
            "status.storage.partitions=1",
            "plugin.discovery=only_scan",
        ]
        for kind, topic in INTERNAL.items():
            lines += [f"{kind}.storage.topic={topic}", f"{kind}.storage.replication.factor=1"]
        properties.write_text("\n".join(lines) + "\n")
        classpath = f"{JAVA_TARGET / 'connect-4' / 'classes'}{os.pathsep}"
        classpath += f"{JAVA_TARGET / 'tools-4'}/*"
        main = "org.apache.kafka.connect.cli.ConnectDistributed"
        flags = ["-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xmx512m"]
        super().__init__(classpath, main, [str(properties)], work / f"{name}.log", flags)

    def rest(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}",
            data=data,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            text = answer.read()
        return json.loads(text) if text else None

    def wait_for(self, what: str, check: Callable[[], bool], timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while True:
            assert self.process.poll() is None, f"{what}: {self.tail()}"
            try:
                if check():
                    return
            except OSError:
                pass  # the REST server not up yet, or the worker still joining
            assert time.monotonic() < deadline, f"{what}: {self.tail()}"
            time.sleep(0.5)

    def running(self, connector: str) -> bool:
        status = self.rest("GET", f"/connectors/{connector}/status")
        tasks = status["tasks"]
        return status["connector"]["state"] == "RUNNING" and [t["state"] for t in tasks] == [
            "RUNNING"
        ]


def counted(bootstrap: str) -> list[int]:
    """The numbers in topic "counted", in offset order."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "reader"})
    try:
        tp = TopicPartition("counted", 0, 0)
        _, high = consumer.get_watermark_offsets(tp, timeout=10)
        consumer.assign([tp])
        numbers: list[int] = []
        position = 0
        deadline = time.monotonic() + 30
        while position < high:
            assert time.monotonic() < deadline, f"read {position} of {high}"
            message = consumer.poll(1)
            if message is None or message.error() is not None:
                continue
            numbers.append(int(message.value()))
            position = message.offset() + 1
        return numbers
    finally:
        consumer.close()


def test_a_distributed_worker_keeps_its_connectors_and_offsets_in_compacted_topics(
    start_broker: Callable[..., Any], tmp_path: Path
) -> None:
    broker = start_broker(ENV, backends="real", ready=True)
    bootstrap = broker.bootstrap
    first = Worker(bootstrap, tmp_path, "worker-1")
    try:
        first.wait_for("the REST API", lambda: first.rest("GET", "/connectors") == [])
        config = {
            "connector.class": "io.kafscale.connect.CounterSource",
            "tasks.max": "1",
            "topic": "counted",
        }
        first.rest("PUT", "/connectors/counter/config", config)
        first.wait_for("the connector to run", lambda: first.running("counter"))
        first.wait_for("300 numbers", lambda: len(counted(bootstrap)) >= 300)
        first.stop()
    finally:
        first.kill()
    before = counted(bootstrap)
    assert before == list(range(len(before)))

    # Connect made its topics compacted; the offsets topic, one record per flush for one key,
    # is cleaned down to that key's latest.
    for topic in INTERNAL.values():
        assert policy(bootstrap, topic) == "compact", topic
    deadline = time.monotonic() + 90
    while True:
        log = entries(broker, INTERNAL["offset"])
        if log and all(e.generation > 0 for e in log) and sum(e.records for e in log) == 1:
            break
        assert time.monotonic() < deadline, f"offsets topic not cleaned: {log}"
        time.sleep(0.5)

    # A new worker reads the connector from the config topic and its position from the cleaned
    # offsets topic: the sequence goes on (at least once: numbers written after the last offset
    # flush come again), never from 0.
    second = Worker(bootstrap, tmp_path, "worker-2")
    try:
        second.wait_for("the connector to run again", lambda: second.running("counter"))
        second.wait_for("more numbers", lambda: len(counted(bootstrap)) >= len(before) + 100)
        second.stop()
    finally:
        second.kill()
    after = counted(bootstrap)
    resumed = after[len(before)]
    assert 0 < resumed <= before[-1] + 1, (resumed, before[-1])
    assert after[len(before) :] == list(range(resumed, resumed + len(after) - len(before)))
