"""What the broker keeps in the metadata store, and under which keys.

All keys of one cluster live under ``/kafscale/{namespace}/`` (the namespace is
``KAFSCALE_S3_NAMESPACE``, so one etcd and one bucket can hold several clusters). Values are JSON
encodings of the structs below, so ``etcdctl get --prefix /kafscale/`` is readable by an operator.

    /kafscale/{ns}/cluster_id            the cluster id, created once (put-if-absent)
    /kafscale/{ns}/brokers/{node_id}     BrokerRecord, attached to the broker's lease
    /kafscale/{ns}/topics/{name}         TopicRecord
    /kafscale/{ns}/deleting/{name}       TopicRecord of a deleted topic whose objects are being
                                         removed; the name cannot be re-created until it is gone
    /kafscale/{ns}/partitions/{topic}/{p}            PartitionRecord: the committed log state
    /kafscale/{ns}/segments/{topic}/{p}/{base:020d}  SegmentRecord, one per committed segment
"""

from __future__ import annotations

import base64
import uuid

import msgspec


class BrokerRecord(msgspec.Struct, frozen=True):
    node_id: int
    host: str
    port: int
    rack: str | None = None


class TopicRecord(msgspec.Struct, frozen=True):
    name: str
    topic_id: str  # UUID, canonical text form
    partitions: int
    configs: dict[str, str] = msgspec.field(default_factory=dict)  # explicitly set ones
    replication_factor: int = 1  # as asked; durability comes from S3, not replicas
    # Wall-clock creation time: a segment sealed before it belongs to an earlier topic of the
    # same name (an upload that raced the deletion) and is never adopted into this one.
    created_ms: int = 0


class PartitionRecord(msgspec.Struct, frozen=True):
    """A partition's committed state. ``high_watermark`` is the offset after the last committed
    record: everything below it is in S3 and listed under ``segments/``. ``producers`` is the
    idempotence state as of the high watermark (``ProducerStates.snapshot``)."""

    topic_id: str
    high_watermark: int = 0
    log_start_offset: int = 0
    producers: dict[int, tuple[int, int, list[tuple[int, int, int, int]]]] = msgspec.field(
        default_factory=dict
    )


class SegmentRecord(msgspec.Struct, frozen=True):
    base_offset: int
    last_offset: int
    size: int  # bytes of the .kfs object
    index_size: int
    records: int
    max_timestamp: int
    created_ms: int


class Keys:
    """Key names of one cluster namespace."""

    def __init__(self, namespace: str) -> None:
        self.root = f"/kafscale/{namespace}/"
        self.cluster_id = self.root + "cluster_id"
        self.brokers = self.root + "brokers/"
        self.topics = self.root + "topics/"
        self.deleting = self.root + "deleting/"

    def broker(self, node_id: int) -> str:
        return f"{self.brokers}{node_id}"

    def topic(self, name: str) -> str:
        return self.topics + name

    def deleting_topic(self, name: str) -> str:
        return self.deleting + name

    def partition(self, topic: str, partition: int) -> str:
        return f"{self.root}partitions/{topic}/{partition}"

    def segments(self, topic: str, partition: int) -> str:
        """The prefix of a partition's segment records (or of all a topic's, without the /p)."""
        return f"{self.root}segments/{topic}/{partition}/"

    def segment(self, topic: str, partition: int, base_offset: int) -> str:
        return f"{self.segments(topic, partition)}{base_offset:020d}"

    def topic_partitions(self, topic: str) -> str:
        return f"{self.root}partitions/{topic}/"

    def topic_segments(self, topic: str) -> str:
        return f"{self.root}segments/{topic}/"


def new_cluster_id() -> str:
    """A Kafka-style cluster id: a random UUID as 22 characters of unpadded URL-safe base64."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()


encode = msgspec.json.encode


def decode_broker(data: bytes) -> BrokerRecord:
    return msgspec.json.decode(data, type=BrokerRecord)


def decode_topic(data: bytes) -> TopicRecord:
    return msgspec.json.decode(data, type=TopicRecord)


def decode_partition(data: bytes) -> PartitionRecord:
    return msgspec.json.decode(data, type=PartitionRecord)


def decode_segment(data: bytes) -> SegmentRecord:
    return msgspec.json.decode(data, type=SegmentRecord)
