"""The console's Kafka I/O: everything it shows of topics, groups, users and ACLs, and every
change it makes, goes through the Kafka protocol (docs/design/console.md, section 1), so the
brokers' validation and ACLs apply as to any admin client.

`KafkaAccess` holds one admin `Session` (`kafscale.kafka_admin`) for one Kafka identity (the
console's own, or a logged-in user's with auth sasl) and makes short-lived consumers and a
producer with the same connection settings for the message browser. Its methods block (the
client's futures do): the web layer calls them through ``asyncio.to_thread``. Results are plain
dataclasses for the templates; failures are `AdminError`s whose text the page shows.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, Producer, TopicPartition
from confluent_kafka.admin import (
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    NewTopic,
    OffsetSpec,
    ResourceType,
)

from kafscale.console.model import (
    Broker,
    Browse,
    Cluster,
    Config,
    Group,
    GroupListing,
    GroupOffset,
    Member,
    Message,
    TopicPartitions,
)
from kafscale.kafka_admin import AdminError, Connection, Session, broker_answered

MAX_MESSAGES = 500  # per browse: what a page can show
MAX_SCAN = 20_000  # records a filtered browse reads at most looking for matches


def _message(record: Any) -> Message:
    kind, stamp = record.timestamp()
    return Message(
        record.partition(),
        record.offset(),
        int(stamp) if kind else -1,
        {1: "CreateTime", 2: "LogAppendTime"}.get(kind, "none"),
        record.key(),
        record.value(),
        tuple((str(k), v) for k, v in record.headers() or []),
    )


def _source(value: Any) -> str:
    """A config entry's source by name (confluent-kafka gives its number)."""
    if isinstance(value, int):
        try:
            return str(ConfigSource(value).name)
        except ValueError:
            return str(value)
    return str(getattr(value, "name", value))


def _state(value: Any) -> str:
    return str(getattr(value, "name", value) or "UNKNOWN")


class KafkaAccess:
    """One Kafka identity's clients. Thread-safe: librdkafka's clients are; consumers are made
    per browse."""

    def __init__(self, conn: Connection, client_id: str = "kafscale-console") -> None:
        self.conn = conn
        self.client_id = client_id
        self.session = Session(conn, client_id=client_id)
        self._producer: Producer | None = None
        self._lock = threading.Lock()
        self._ca_path: str | None = None
        self._cluster: tuple[float, Cluster] | None = None  # (when read, what) of cluster()

    @property
    def timeout(self) -> float:
        return self.conn.timeout

    def close(self) -> None:
        self.session.close()
        with self._lock:
            if self._producer is not None:
                self._producer.flush(1.0)
                self._producer = None
            if self._ca_path is not None:
                os.unlink(self._ca_path)
                self._ca_path = None

    def _client_config(self) -> dict[str, Any]:
        conn = self.conn
        config: dict[str, Any] = {
            "bootstrap.servers": conn.bootstrap,
            "security.protocol": conn.security_protocol.lower(),
            "client.id": self.client_id,
            "socket.timeout.ms": max(1000, int(conn.timeout * 1000)),
        }
        if conn.sasl_mechanism:
            config["sasl.mechanisms"] = conn.sasl_mechanism
            config["sasl.username"] = conn.username or ""
            config["sasl.password"] = conn.password or ""
        if conn.ca_pem:
            with self._lock:
                if self._ca_path is None:
                    handle, self._ca_path = tempfile.mkstemp(prefix="kafscale-console-ca-")
                    with os.fdopen(handle, "wb") as out:
                        out.write(conn.ca_pem)
            config["ssl.ca.location"] = self._ca_path
        return config

    def check(self) -> None:
        """One request that needs the login: a refused one raises at once."""
        future = self.session.client.describe_cluster(request_timeout=self.timeout)
        self.session.wait(future, "logging in")

    # --- cluster and topics ----------------------------------------------------------------

    def cluster(self, topic: str | None = None, max_age: float = 0.0) -> Cluster:
        """The cluster's metadata (of every topic, or of ``topic`` only). With ``max_age``, a
        whole-cluster answer read at most that many seconds ago is served again: one Metadata
        request of 10,000 partitions costs a few hundred ms, and pages read it often. Changes
        made through this access drop it."""
        if topic is None and max_age > 0:
            with self._lock:
                cached = self._cluster
            if cached is not None and time.monotonic() - cached[0] <= max_age:
                return cached[1]
        read_at = time.monotonic()
        try:
            found = self.session.client.list_topics(topic=topic, timeout=self.timeout)
        except Exception as exc:  # KafkaException: no broker answered in time
            raise AdminError(f"reading the cluster's metadata: {exc}") from None
        topics = {}
        for name, meta in found.topics.items():
            if meta.error is not None and topic is None:
                continue
            if meta.error is not None:
                raise AdminError(f"topic {name}: {meta.error.str()}", False, meta.error.name())
            partitions = tuple(sorted((p.id, p.leader) for p in meta.partitions.values()))
            topics[name] = TopicPartitions(name, partitions, name.startswith("__"))
        brokers = tuple(
            sorted(
                (Broker(b.id, b.host, b.port) for b in found.brokers.values()),
                key=lambda b: b.node_id,
            )
        )
        answer = Cluster(str(found.cluster_id), int(found.controller_id), brokers, topics)
        if topic is None:
            with self._lock:
                self._cluster = (read_at, answer)
        return answer

    def forget_cluster(self) -> None:
        with self._lock:
            self._cluster = None

    def topic(self, name: str) -> TopicPartitions:
        return self.cluster(name).topics[name]

    def configs(self, names: Sequence[str]) -> dict[str, dict[str, Config]]:
        """Every config of each topic, with its source."""
        if not names:
            return {}
        resources = [ConfigResource(ResourceType.TOPIC, n) for n in names]
        futures = self.session.client.describe_configs(resources, request_timeout=self.timeout)
        out: dict[str, dict[str, Config]] = {}
        for resource, future in futures.items():
            entries = self.session.wait(future, f"describing topic {resource.name}'s configs")
            out[resource.name] = {
                key: Config(
                    key,
                    None if entry.value is None else str(entry.value),
                    _source(entry.source),
                    bool(entry.is_default),
                    bool(entry.is_read_only),
                    bool(entry.is_sensitive),
                )
                for key, entry in sorted(entries.items())
            }
        return out

    def create_topic(self, name: str, partitions: int, configs: dict[str, str]) -> None:
        new = NewTopic(name, partitions, config=configs)
        (future,) = self.session.client.create_topics([new], request_timeout=self.timeout).values()
        try:
            self.session.wait(future, f"creating topic {name}")
        finally:
            self.forget_cluster()

    def delete_topic(self, name: str) -> None:
        futures = self.session.client.delete_topics([name], request_timeout=self.timeout)
        try:
            self.session.wait_all(futures.values(), f"deleting topic {name}")
        finally:
            self.forget_cluster()

    def add_partitions(self, name: str, total: int) -> None:
        grow = NewPartitions(name, total)
        futures = self.session.client.create_partitions([grow], request_timeout=self.timeout)
        try:
            self.session.wait_all(futures.values(), f"adding partitions to topic {name}")
        finally:
            self.forget_cluster()

    def alter_configs(self, name: str, set_: dict[str, str], delete: Iterable[str]) -> None:
        entries = [
            ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in set_.items()
        ] + [ConfigEntry(k, None, incremental_operation=AlterConfigOpType.DELETE) for k in delete]
        resource = ConfigResource(ResourceType.TOPIC, name, incremental_configs=entries)
        futures = self.session.client.incremental_alter_configs(
            [resource], request_timeout=self.timeout
        )
        self.session.wait_all(futures.values(), f"altering topic {name}'s configs")

    def offsets(
        self, partitions: Iterable[tuple[str, int]], spec: Any = None
    ) -> dict[tuple[str, int], int]:
        """(topic, partition) -> the offset ``spec`` names (default: the high watermark); -1
        where the partition's leader answered with an error."""
        request = {TopicPartition(t, p): spec or OffsetSpec.latest() for t, p in partitions}
        if not request:
            return {}
        futures = self.session.client.list_offsets(request, request_timeout=self.timeout)
        found: dict[tuple[str, int], int] = {}
        for tp, future in futures.items():
            try:
                found[(tp.topic, tp.partition)] = int(
                    self.session.wait(future, f"offsets of {tp.topic}").offset
                )
            except AdminError as exc:
                if not broker_answered(exc):
                    raise
                found[(tp.topic, tp.partition)] = -1
        return found

    def watermarks(
        self, partitions: Sequence[tuple[str, int]]
    ) -> dict[tuple[str, int], tuple[int, int]]:
        """(topic, partition) -> (log start offset, high watermark)."""
        start = self.offsets(partitions, OffsetSpec.earliest())
        end = self.offsets(partitions, OffsetSpec.latest())
        return {tp: (start.get(tp, -1), end.get(tp, -1)) for tp in partitions}

    # --- groups ------------------------------------------------------------------------------

    def groups(self) -> list[GroupListing]:
        future = self.session.client.list_consumer_groups(request_timeout=self.timeout)
        result = self.session.wait(future, "listing consumer groups")
        return sorted(
            (
                GroupListing(g.group_id, _state(g.state), bool(g.is_simple_consumer_group))
                for g in result.valid
            ),
            key=lambda g: g.group_id,
        )

    def committed(self, group_id: str) -> dict[tuple[str, int], int]:
        request = [ConsumerGroupTopicPartitions(group_id)]
        futures = self.session.client.list_consumer_group_offsets(
            request, request_timeout=self.timeout
        )
        (result,) = self.session.wait_all(futures.values(), f"offsets of group {group_id}")
        return {(tp.topic, tp.partition): int(tp.offset) for tp in result.topic_partitions or []}

    def group(self, group_id: str) -> Group:
        futures = self.session.client.describe_consumer_groups(
            [group_id], request_timeout=self.timeout
        )
        (found,) = self.session.wait_all(futures.values(), f"describing group {group_id}")
        members = tuple(
            Member(
                m.member_id,
                m.client_id,
                m.host,
                m.group_instance_id,
                tuple(
                    sorted((tp.topic, tp.partition) for tp in m.assignment.topic_partitions or [])
                ),
            )
            for m in found.members
        )
        committed = self.committed(group_id)
        assigned = {tp for m in members for tp in m.assignment}
        partitions = sorted(set(committed) | assigned)
        marks = self.watermarks(partitions)
        offsets = tuple(
            GroupOffset(t, p, committed.get((t, p), -1), marks[(t, p)][1], marks[(t, p)][0])
            for t, p in partitions
        )
        coordinator = found.coordinator.id if found.coordinator is not None else -1
        return Group(
            group_id,
            _state(found.state),
            str(found.partition_assignor or ""),
            bool(found.is_simple_consumer_group),
            coordinator,
            members,
            offsets,
        )

    def reset_offsets(self, group_id: str, offsets: dict[tuple[str, int], int]) -> None:
        """Commit these offsets for the group (Kafka refuses unless the group is empty)."""
        request = [
            ConsumerGroupTopicPartitions(
                group_id, [TopicPartition(t, p, o) for (t, p), o in sorted(offsets.items())]
            )
        ]
        futures = self.session.client.alter_consumer_group_offsets(
            request, request_timeout=self.timeout
        )
        self.session.wait_all(futures.values(), f"resetting the offsets of group {group_id}")

    def delete_group(self, group_id: str) -> None:
        futures = self.session.client.delete_consumer_groups(
            [group_id], request_timeout=self.timeout
        )
        self.session.wait_all(futures.values(), f"deleting group {group_id}")

    # --- messages ----------------------------------------------------------------------------

    def produce(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[tuple[str, bytes]],
        partition: int | None = None,
    ) -> tuple[int, int]:
        """Produce one record and wait for its acknowledgement: (partition, offset)."""
        with self._lock:
            if self._producer is None:
                config = self._client_config()
                config.update({"acks": "all", "enable.idempotence": True, "linger.ms": 0})
                self._producer = Producer(config)
            producer = self._producer
        outcome: list[Any] = []

        def delivered(error: Any, message: Any) -> None:
            outcome.append((error, message))

        kwargs: dict[str, Any] = {"key": key, "value": value, "headers": list(headers)}
        if partition is not None:
            kwargs["partition"] = partition
        producer.produce(topic, on_delivery=delivered, **kwargs)
        deadline = time.monotonic() + self.timeout
        while not outcome and time.monotonic() < deadline:
            producer.poll(0.05)
        if not outcome:
            raise AdminError(f"producing to {topic}: no acknowledgement in {self.timeout:g} s")
        error, message = outcome[0]
        if error is not None:
            raise AdminError(f"producing to {topic}: {error.name()}: {error.str()}")
        return int(message.partition()), int(message.offset())

    def browse(
        self,
        topic: str,
        ranges: dict[int, tuple[int, int]],
        limit: int,
        match: Any = None,
    ) -> Browse:
        """Read each partition's [from, to) range, keeping records ``match`` accepts (all
        without one), at most ``limit`` in all and at most MAX_SCAN read."""
        todo = {p: r for p, r in ranges.items() if r[0] < r[1]}
        if not todo:
            return Browse((), 0, ranges)
        config = self._client_config()
        config.update(
            {
                "group.id": f"{self.client_id}-browser",  # never joined, never committed
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "enable.partition.eof": False,
                "fetch.wait.max.ms": 100,
            }
        )
        consumer = Consumer(config)
        found: list[Message] = []
        scanned = 0
        deadline = time.monotonic() + self.timeout
        try:
            consumer.assign([TopicPartition(topic, p, r[0]) for p, r in sorted(todo.items())])
            while todo and len(found) < limit and scanned < MAX_SCAN:
                if time.monotonic() >= deadline:
                    break
                for record in consumer.consume(num_messages=500, timeout=0.2):
                    if record.error() is not None or record.partition() not in todo:
                        continue
                    partition, offset = record.partition(), record.offset()
                    if offset >= todo[partition][1]:
                        continue
                    scanned += 1
                    message = _message(record)
                    if match is None or match(message):
                        found.append(message)
                # Done with a partition once the consumer's position passed its range's end
                # (the last offsets may hold no record: a transaction marker, compaction).
                positions = consumer.position([TopicPartition(topic, p) for p in todo])
                for position in positions:
                    if position.offset >= todo[position.partition][1]:
                        del todo[position.partition]
        finally:
            consumer.close()
        found.sort(key=lambda m: (m.timestamp, m.partition, m.offset))
        return Browse(
            tuple(found[:limit]), scanned, ranges, truncated=bool(todo) and len(found) < limit
        )
