"""What the broker keeps in the metadata store, and under which keys.

All keys of one cluster live under ``/kafscale/{namespace}/`` (the namespace is
``KAFSCALE_S3_NAMESPACE``, so one etcd and one bucket can hold several clusters). Values are JSON
encodings of the structs below, so ``etcdctl get --prefix /kafscale/`` is readable by an operator.

    /kafscale/{ns}/cluster_id            the cluster id, created once (put-if-absent)
    /kafscale/{ns}/owner                 the store lock: which broker writes this namespace
                                         (kafscale.supervisor.ownership), on its lease
    /kafscale/{ns}/brokers/{node_id}     BrokerRecord, put-if-absent on the broker's lease
    /kafscale/{ns}/leaders/{topic}/{p}   LeaderRecord: the partition's owner, on its lease
                                         (docs/design/scale-out.md)
    /kafscale/{ns}/chores                LeaderRecord of the broker running cluster-wide chores
    /kafscale/{ns}/topics/{name}         TopicRecord
    /kafscale/{ns}/deleting/{name}       TopicRecord of a deleted topic whose objects are being
                                         removed; the name cannot be re-created until it is gone
    /kafscale/{ns}/partitions/{topic}/{p}            PartitionRecord: the committed log state
    /kafscale/{ns}/segments/{topic}/{p}/{base:020d}  SegmentRecord, one per committed log entry:
                                         a spec segment, or a chunk of a write-ahead object
    /kafscale/{ns}/wal/{broker}/{token}/{seq}        WalRecord: a committed write-ahead object
                                         (docs/design/write-path.md), deleted with the object
    /kafscale/{ns}/groups/{group}        GroupRecord: a consumer group as of its last rebalance
    /kafscale/{ns}/offsets/{group}/{topic}/{p}       OffsetRecord: a committed offset
    /kafscale/{ns}/users/{user}/{mechanism}          ScramRecord: a user's SCRAM credential
                                         (docs/design/security.md, section 5)
    /kafscale/{ns}/acls/{digest}         AclRecord: one ACL binding, keyed by the SHA-256 of its
                                         fields (creating it twice writes one key)

Group ids and user names may hold any character, so in keys they are percent-encoded (``/``
included).
"""

from __future__ import annotations

import base64
import hashlib
import urllib.parse
import uuid

import msgspec


class BrokerRecord(msgspec.Struct, frozen=True):
    node_id: int
    host: str
    port: int
    rack: str | None = None
    # The `kafscale serve` run that registered it: a respawned coordinator of that run may
    # replace it, a broker of any other run may not (two brokers never share a node id).
    run_id: str = ""
    # Handing its partitions over before it stops (SIGTERM): no partition is assigned to it.
    draining: bool = False
    # Every process of the broker serves. Until then no other broker hands a partition over to
    # it (it may claim partitions nobody owns: a cluster that starts, a lone broker's restart).
    ready: bool = True
    # Its Kafka listeners by name: where clients reach it on each (advertised host, port).
    # Empty in a registration from before listeners: ``host``:``port`` is its PLAINTEXT one.
    listeners: dict[str, tuple[str, int]] = msgspec.field(default_factory=dict)

    def endpoint(self, listener: str) -> tuple[str, int] | None:
        """Where clients of ``listener`` reach this broker; None if it has no such listener."""
        if not self.listeners:
            return (self.host, self.port) if listener == "PLAINTEXT" else None
        return self.listeners.get(listener)


WRITE_PATH_WAL = 2  # TopicRecord.write_path of a topic created with write-ahead objects


class TopicRecord(msgspec.Struct, frozen=True):
    name: str
    topic_id: str  # UUID, canonical text form
    partitions: int
    configs: dict[str, str] = msgspec.field(default_factory=dict)  # explicitly set ones
    replication_factor: int = 1  # as asked; durability comes from S3, not replicas
    # Wall-clock creation time: a segment sealed before it belongs to an earlier topic of the
    # same name (an upload that raced the deletion) and is never adopted into this one.
    created_ms: int = 0
    # The write path that created the topic: 1 (records written before this field existed),
    # whose per-partition flushes may have left uploaded but uncommitted segments that a shard
    # adopts on load (``kafscale.shards.recovery``), or ``WRITE_PATH_WAL``, which never leaves
    # any, so its partitions load without listing the object store.
    write_path: int = 1


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
    # The broker that owns the partition and its leader epoch: every commit checks both (and the
    # record's mod_revision), so only the owner at that epoch can move the high watermark.
    owner: int = -1
    leader_epoch: int = 0
    # The leader epoch history, (epoch, first offset written at it): ``kafscale.metadata.epochs``.
    epochs: list[tuple[int, int]] = msgspec.field(default_factory=list)
    # A commit of this version happened (write-ahead object or adopted segment): no segment a
    # previous version uploaded can be waiting uncommitted at the high watermark any more.
    wal_committed: bool = False


class LeaderRecord(msgspec.Struct, frozen=True):
    """Who owns a partition now (``leaders/{topic}/{p}``, put on the owner's broker lease, so it
    goes when the lease does) and at which leader epoch. Every metadata write on behalf of the
    partition compares this key's exact value: only its owner at that epoch, with that lease,
    can commit."""

    owner: int
    epoch: int
    lease: int
    run_id: str


class SegmentRecord(msgspec.Struct, frozen=True):
    """One entry of a partition's committed log: a spec segment (``object`` empty: the ``.kfs``
    and ``.index`` at the keys ``kafscale.storage.segment`` derives from the base offset), or a
    chunk of a write-ahead object (``object`` is its key: ``size`` bytes of record batches at
    ``position``, no index). Records written before write-ahead objects existed decode as
    segments."""

    base_offset: int
    last_offset: int
    size: int  # bytes of the .kfs object; of the chunk's batches for a chunk
    index_size: int  # 0 for a chunk
    records: int
    max_timestamp: int
    created_ms: int
    object: str = ""  # the write-ahead object holding this chunk; "" for a segment
    position: int = 0  # where the chunk's batches start in ``object``
    codec: int = 0  # the codec the broker applied (a chunk's; a segment's is in its header)
    # A segment rewritten by the log cleaner (compacted topics): 1 + the generation of the
    # segment it starts at; 0 for one never cleaned, at the spec keys. Cleaned segments are
    # the clean section of the log (docs/design/ecosystem.md, section 4).
    generation: int = 0

    @property
    def is_chunk(self) -> bool:
        return bool(self.object)


class WalRecord(msgspec.Struct, frozen=True):
    """A write-ahead object that was (at least partly) committed: its key, and the log entries
    (topic, partition, base offset) it was committed with. The garbage collector deletes the
    object once no ``SegmentRecord`` refers to it, then this record."""

    key: str
    size: int
    created_ms: int
    broker_id: int
    entries: list[tuple[str, int, int]] = msgspec.field(default_factory=list)
    merged: bool = False  # written by the compactor's merge level: its chunks are read by range


class GarbageRecord(msgspec.Struct, frozen=True):
    """Objects no record refers to any more (the segments a cleaning replaced), to delete once
    ``due_ms`` (wall clock) has passed: reads that found them before have until then to finish.
    The chores broker deletes them, then this record (``kafscale.coordinator.garbage``) -- only
    while the topic they belong to is still ``topic_id``: a topic deleted meanwhile took its
    objects with it, and one created again under its name may have written the same keys."""

    objects: list[str]
    due_ms: int
    topic: str
    topic_id: str


class MemberRecord(msgspec.Struct, frozen=True):
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocols: list[tuple[str, bytes]]
    assignment: bytes = b""


class GroupRecord(msgspec.Struct, frozen=True):
    """A group's membership and assignment as of its last completed rebalance (or its empty
    state): what lets members carry on after a coordinator restart without rejoining."""

    group_id: str
    protocol_type: str
    protocol: str | None
    generation: int
    leader: str | None
    members: list[MemberRecord] = msgspec.field(default_factory=list)


class OffsetRecord(msgspec.Struct, frozen=True):
    offset: int
    leader_epoch: int = -1
    metadata: str | None = ""
    commit_ms: int = 0


class ScramRecord(msgspec.Struct, frozen=True):
    """A SCRAM credential as Kafka keeps one (RFC 5802): never the password."""

    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int


class AclRecord(msgspec.Struct, frozen=True):
    """One ACL binding (CreateAcls'), with Kafka's codes for the enumerations."""

    resource_type: int
    resource_name: str
    pattern_type: int
    principal: str
    host: str
    operation: int
    permission_type: int

    @property
    def digest(self) -> str:
        """The key's last part: the same binding always has the same one."""
        return hashlib.sha256(encode(self)).hexdigest()


class Keys:
    """Key names of one cluster namespace."""

    def __init__(self, namespace: str) -> None:
        self.root = f"/kafscale/{namespace}/"
        self.cluster_id = self.root + "cluster_id"
        self.owner = self.root + "owner"
        self.brokers = self.root + "brokers/"
        self.topics = self.root + "topics/"
        self.deleting = self.root + "deleting/"
        self.leaders = self.root + "leaders/"
        self.chores = self.root + "chores"
        self.garbage = self.root + "garbage/"

    def broker(self, node_id: int) -> str:
        return f"{self.brokers}{node_id}"

    def topic(self, name: str) -> str:
        return self.topics + name

    def leader(self, topic: str, partition: int) -> str:
        return f"{self.leaders}{topic}/{partition}"

    def topic_leaders(self, topic: str) -> str:
        return f"{self.leaders}{topic}/"

    def parse_leader(self, key: str) -> tuple[str, int] | None:
        """(topic, partition) of a leader key, or None."""
        topic, _, partition = key[len(self.leaders) :].rpartition("/")
        if not key.startswith(self.leaders) or not topic or not partition.isdigit():
            return None
        return topic, int(partition)

    def deleting_topic(self, name: str) -> str:
        return self.deleting + name

    def partition(self, topic: str, partition: int) -> str:
        return f"{self.root}partitions/{topic}/{partition}"

    def segments(self, topic: str, partition: int) -> str:
        """The prefix of a partition's segment records (or of all a topic's, without the /p)."""
        return f"{self.root}segments/{topic}/{partition}/"

    def segment(self, topic: str, partition: int, base_offset: int) -> str:
        return f"{self.segments(topic, partition)}{base_offset:020d}"

    @property
    def wal_objects(self) -> str:
        return self.root + "wal/"

    def wal_object(self, name: str) -> str:
        """The WalRecord key of the object whose key ends with ``name`` (broker/token/seq)."""
        return self.wal_objects + name

    def garbage_of(self, topic: str, partition: int, base_offset: int, generation: int) -> str:
        """The ``GarbageRecord`` key of a replaced segment's objects."""
        return f"{self.garbage}{topic}/{partition}/{base_offset:020d}.g{generation}"

    def topic_partitions(self, topic: str) -> str:
        return f"{self.root}partitions/{topic}/"

    def topic_segments(self, topic: str) -> str:
        return f"{self.root}segments/{topic}/"

    @property
    def all_segments(self) -> str:
        """The prefix of every partition's segment records."""
        return f"{self.root}segments/"

    @property
    def all_partitions(self) -> str:
        """The prefix of every partition record."""
        return f"{self.root}partitions/"

    @property
    def groups(self) -> str:
        return self.root + "groups/"

    def group(self, group_id: str) -> str:
        return self.groups + _escape(group_id)

    @property
    def offsets(self) -> str:
        return self.root + "offsets/"

    def group_offsets(self, group_id: str) -> str:
        return f"{self.offsets}{_escape(group_id)}/"

    def offset(self, group_id: str, topic: str, partition: int) -> str:
        return f"{self.group_offsets(group_id)}{topic}/{partition}"

    def parse_offset(self, key: str) -> tuple[str, str, int] | None:
        """(group, topic, partition) of an offset key, or None."""
        parts = key[len(self.offsets) :].split("/")
        if not key.startswith(self.offsets) or len(parts) != 3 or not parts[2].isdigit():
            return None
        return urllib.parse.unquote(parts[0]), parts[1], int(parts[2])

    @property
    def acls(self) -> str:
        return self.root + "acls/"

    def acl(self, record: AclRecord) -> str:
        return self.acls + record.digest

    @property
    def users(self) -> str:
        return self.root + "users/"

    def user(self, name: str, mechanism: str) -> str:
        return f"{self.users}{_escape(name)}/{mechanism}"

    def user_credentials(self, name: str) -> str:
        return f"{self.users}{_escape(name)}/"

    def parse_user(self, key: str) -> tuple[str, str] | None:
        """(user, mechanism) of a credential key, or None."""
        parts = key[len(self.users) :].split("/")
        if not key.startswith(self.users) or len(parts) != 2 or not parts[0] or not parts[1]:
            return None
        return urllib.parse.unquote(parts[0]), parts[1]


def _escape(group_id: str) -> str:
    return urllib.parse.quote(group_id, safe="")


def new_cluster_id() -> str:
    """A Kafka-style cluster id: a random UUID as 22 characters of unpadded URL-safe base64."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()


encode = msgspec.json.encode


def decode_broker(data: bytes) -> BrokerRecord:
    return msgspec.json.decode(data, type=BrokerRecord)


def decode_acl(data: bytes) -> AclRecord:
    return msgspec.json.decode(data, type=AclRecord)


def decode_scram(data: bytes) -> ScramRecord:
    return msgspec.json.decode(data, type=ScramRecord)


def decode_leader(data: bytes) -> LeaderRecord:
    return msgspec.json.decode(data, type=LeaderRecord)


def decode_topic(data: bytes) -> TopicRecord:
    return msgspec.json.decode(data, type=TopicRecord)


def decode_partition(data: bytes) -> PartitionRecord:
    return msgspec.json.decode(data, type=PartitionRecord)


def decode_segment(data: bytes) -> SegmentRecord:
    return msgspec.json.decode(data, type=SegmentRecord)


def decode_wal(data: bytes) -> WalRecord:
    return msgspec.json.decode(data, type=WalRecord)


def decode_garbage(data: bytes) -> GarbageRecord:
    return msgspec.json.decode(data, type=GarbageRecord)


def decode_group(data: bytes) -> GroupRecord:
    return msgspec.json.decode(data, type=GroupRecord)


def decode_offset(data: bytes) -> OffsetRecord:
    return msgspec.json.decode(data, type=OffsetRecord)
