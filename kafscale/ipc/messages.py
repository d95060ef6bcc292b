"""Every message the broker's processes exchange, as typed msgspec structs.

Wire layout (ZeroMQ multipart messages; see ``kafscale.ipc.rpc``)::

    request  (DEALER -> ROUTER):  [request_id: 8 bytes BE] [header: msgpack Message] [bulk]...
    reply    (ROUTER -> DEALER):  [request_id: 8 bytes BE] [header: msgpack Message] [bulk]...
    notice   (PUSH  -> PULL):     [header: msgpack Message]

The header is one of the structs below, tagged by class name so a receiver decodes it without
knowing in advance which it is. Bulk bytes (record batches) never go inside a header: they travel
as further frames, sent zero-copy, or stay in shared memory and are named by a ``BufferRef``.

The write path's messages (shard -> flusher -> coordinator: cuts, write-ahead object commits,
compaction, ``CommitSegment``) are in ``kafscale.ipc.write_path``, the base class ``Message`` in
``kafscale.ipc.base``; ``AnyMessage`` below is the union of both modules' messages.
"""

from __future__ import annotations

import msgspec

# ``Message`` is re-exported: callers name the base class ``messages.Message``.
from kafscale.ipc.base import Message as Message
from kafscale.ipc.cleaning import CommitCleaning, SegmentsCleaned
from kafscale.ipc.consumer_groups import (
    AlterGroupConfigs,
    ConsumerGroupDescribe,
    ConsumerGroupHeartbeat,
    ConsumerGroupHeartbeatResult,
    ConsumerGroupsDescribed,
    GroupConfigResults,
)
from kafscale.ipc.log_admin import LogStartMoves, MoveLogStart
from kafscale.ipc.write_path import (
    CommitCompaction,
    CommitMerge,
    CommitObject,
    CommitSegment,
    Cut,
    CutEntries,
    MergeCommitted,
    ObjectCommitResult,
    ObjectCommitted,
    PartitionSealed,
    SealPartition,
    SegmentCommitted,
    SegmentsCompacted,
    ShardPending,
)

# -- supervision ------------------------------------------------------------------------------


class Ready(Message, frozen=True):
    """A child finished booting (backends reached, sockets bound) and serves requests."""

    role: str
    index: int
    pid: int


class BootFailed(Message, frozen=True):
    """A child cannot boot; the supervisor stops the broker and prints ``reason``."""

    role: str
    index: int
    pid: int
    reason: str


class Ping(Message, frozen=True):
    """Liveness probe; every child answers with ``Pong``."""


class Pong(Message, frozen=True):
    role: str
    index: int
    pid: int
    started_at: float


class Drain(Message, frozen=True):
    """Supervisor -> coordinator, before a graceful stop: hand every partition over (the first
    call starts it); answered ``Draining`` with how many are not handed over yet. Sent again
    until that is 0."""


class Draining(Message, frozen=True):
    remaining: int


# -- generic replies --------------------------------------------------------------------------


class ErrorReply(Message, frozen=True):
    """The request could not be served; ``message`` says why."""

    message: str


# -- topics (frontend -> coordinator) --------------------------------------------------------


class TopicSpec(msgspec.Struct, frozen=True):
    name: str
    partitions: int  # -1: the broker default (KAFSCALE_AUTO_CREATE_PARTITIONS)
    replication_factor: int = -1
    configs: dict[str, str | None] = msgspec.field(default_factory=dict)


class TopicResult(msgspec.Struct, frozen=True):
    """The outcome for one topic; ``error_code`` is a Kafka error code (0 = created/deleted).
    ``configs`` are the configs set on the topic (not the defaults it uses for the rest)."""

    name: str | None
    error_code: int
    error_message: str | None = None
    topic_id: str | None = None
    partitions: int = -1
    replication_factor: int = -1
    configs: dict[str, str] = msgspec.field(default_factory=dict)


class CreateTopics(Message, frozen=True):
    topics: list[TopicSpec]
    validate_only: bool = False


class DeleteTopics(Message, frozen=True):
    names: list[str] = msgspec.field(default_factory=list)
    topic_ids: list[str] = msgspec.field(default_factory=list)


class TopicResults(Message, frozen=True):
    """Reply to CreateTopics/DeleteTopics; ``revision`` is the metadata revision that holds the
    changes, so the asker can wait for its view to reach it before answering a client."""

    results: list[TopicResult]
    revision: int


# -- produce (frontend -> shard) and flush (shard -> flusher) ----------------------------------


class AppendEntry(msgspec.Struct, frozen=True):
    """One partition's records; the bytes are the bulk frame at the same index."""

    topic: str
    topic_id: str
    partition: int
    max_message_bytes: int
    log_append_time: bool
    codec: int  # applied by the flusher to batches that arrive uncompressed (0: none)
    allow_zstd: bool = True
    topic_created_ms: int = 0
    segment_bytes: int = 0  # the topic's segment.bytes; 0: KAFSCALE_SEGMENT_BYTES
    # message.timestamp.before.max.ms / after.max.ms (Kafka 4's defaults: no limit, one hour)
    timestamp_before_max_ms: int = 2**63 - 1
    timestamp_after_max_ms: int = 3_600_000
    compacted: bool = False  # cleanup.policy includes compact: every record needs a key


class Append(Message, frozen=True):
    acks: int
    timeout_ms: int
    entries: list[AppendEntry]


class AppendResult(msgspec.Struct, frozen=True):
    error_code: int = 0
    base_offset: int = -1
    log_append_time: int = -1
    log_start_offset: int = -1
    message: str | None = None


class Appended(Message, frozen=True):
    results: list[AppendResult]


class FlushAll(Message, frozen=True):
    """Seal every open buffer now; answered with ``FlushedAll`` once all is committed (an
    operator's explicit flush, ``POST /flush``)."""


class FlushedAll(Message, frozen=True):
    partitions: int  # partitions whose data is now committed
    error: str | None = None


# -- fetch and list offsets (frontend -> shard) -----------------------------------------------


class FetchEntry(msgspec.Struct, frozen=True):
    """One partition of a Fetch: read from ``offset``, at most ``max_bytes`` (but always at least
    one whole batch when there is one)."""

    topic: str
    topic_id: str
    partition: int
    offset: int
    max_bytes: int
    topic_created_ms: int = 0


class Fetch(Message, frozen=True):
    """Answered with ``Fetched`` as soon as ``min_bytes`` are available, a partition has an
    error, the asker sends ``ReleaseFetch`` with the same ``fetch_id``, or ``max_wait_ms`` ran
    out. ``max_bytes`` bounds the whole answer as Kafka's Fetch does."""

    fetch_id: int
    entries: list[FetchEntry]
    max_bytes: int
    min_bytes: int
    max_wait_ms: int


class FetchResult(msgspec.Struct, frozen=True):
    """One partition's answer; its records, when ``size`` > 0, are the next bulk frame."""

    error_code: int = 0
    high_watermark: int = -1
    log_start_offset: int = -1
    size: int = 0
    message: str | None = None


class Fetched(Message, frozen=True):
    results: list[FetchResult]


class ReleaseFetch(Message, frozen=True):
    """Answer the waiting Fetch ``fetch_id`` now with what it has (another shard already has
    enough for the client). A notice: no reply of its own."""

    fetch_id: int


class OffsetQuery(msgspec.Struct, frozen=True):
    """ListOffsets for one partition: a timestamp or one of Kafka's special values (-1 latest,
    -2 earliest, -3 max timestamp, -4 earliest local, -5 latest tiered). With ``leader_epoch``
    set, OffsetForLeaderEpoch instead (the timestamp is ignored): the answer is the largest epoch
    at or below it and where that epoch ends (``kafscale.metadata.epochs.end_offset_for``)."""

    topic: str
    topic_id: str
    partition: int
    timestamp: int
    topic_created_ms: int = 0
    leader_epoch: int | None = None


class ListOffsets(Message, frozen=True):
    queries: list[OffsetQuery]


class OffsetAnswer(msgspec.Struct, frozen=True):
    error_code: int = 0
    offset: int = -1
    timestamp: int = -1
    leader_epoch: int = -1
    message: str | None = None


class OffsetsListed(Message, frozen=True):
    results: list[OffsetAnswer]


# -- topic configs and partition counts (frontend -> coordinator) -----------------------------


class ConfigChange(msgspec.Struct, frozen=True):
    """One config of an alteration: ``operation`` is IncrementalAlterConfigs' (0 SET, 1 DELETE,
    2 APPEND, 3 SUBTRACT); AlterConfigs sends SET only, a null value meaning the default."""

    name: str
    operation: int
    value: str | None


class TopicConfigChanges(msgspec.Struct, frozen=True):
    topic: str
    changes: list[ConfigChange]


class AlterTopicConfigs(Message, frozen=True):
    """AlterConfigs (``replace``: the topic's configs become exactly the SET ones) or
    IncrementalAlterConfigs (each change applied to the current configs). Answered with
    ``TopicResults``, one per topic in order."""

    topics: list[TopicConfigChanges]
    replace: bool
    validate_only: bool = False


class PartitionIncrease(msgspec.Struct, frozen=True):
    """Grow ``topic`` to ``count`` partitions; ``assignments`` (one replica list per new
    partition) as the client gave them, or None."""

    topic: str
    count: int
    assignments: list[list[int]] | None = None


class CreatePartitions(Message, frozen=True):
    """Answered with ``TopicResults``, one per topic in order."""

    topics: list[PartitionIncrease]
    validate_only: bool = False


# -- SCRAM credentials (frontend -> coordinator; docs/design/security.md, section 5) ---------------


class ScramValue(msgspec.Struct, frozen=True):
    """A SCRAM credential: salt, StoredKey, ServerKey, iterations (never a password)."""

    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int


class ScramChange(msgspec.Struct, frozen=True):
    """Set (``credential``) or delete (None) ``user``'s credential for ``mechanism``."""

    user: str
    mechanism: str
    credential: ScramValue | None


class AlterScramCredentials(Message, frozen=True):
    """AlterUserScramCredentials, checked by the frontend (no user twice with one mechanism).
    Answered with ``ScramCredentialsAltered``, one result per user in order of first mention;
    a user's changes apply all or none."""

    changes: list[ScramChange]


class UserResult(msgspec.Struct, frozen=True):
    user: str
    error_code: int = 0
    error_message: str | None = None


class ScramCredentialsAltered(Message, frozen=True):
    results: list[UserResult]
    revision: int


# -- ACLs (frontend -> coordinator; docs/design/security.md, section 6) ------------------------


class AclValue(msgspec.Struct, frozen=True):
    """One ACL binding, Kafka's codes for the enumerations."""

    resource_type: int
    resource_name: str
    pattern_type: int
    principal: str
    host: str
    operation: int
    permission_type: int


class AclFilterValue(msgspec.Struct, frozen=True):
    """A DeleteAcls filter: None strings match anything; codes as Kafka's (ANY = 1)."""

    resource_type: int
    resource_name: str | None
    pattern_type: int
    principal: str | None
    host: str | None
    operation: int
    permission_type: int


class CreateAcls(Message, frozen=True):
    """Bindings the frontend checked; answered with ``AclsChanged`` (no ``deleted``)."""

    bindings: list[AclValue]


class DeleteAcls(Message, frozen=True):
    """Answered with ``AclsChanged``: ``deleted[i]``, the bindings filter i removed."""

    filters: list[AclFilterValue]


class AclsChanged(Message, frozen=True):
    deleted: list[list[AclValue]]
    revision: int


# -- retention (coordinator -> shard) ----------------------------------------------------------


class LogStartMoved(Message, frozen=True):
    """A partition's log now starts at ``log_start_offset``: retention deleted its oldest
    entries, or DeleteRecords moved its start. A notice: no reply."""

    topic: str
    topic_id: str
    partition: int
    log_start_offset: int


# -- producer ids (frontend -> coordinator) ---------------------------------------------------


class AllocateProducerId(Message, frozen=True):
    pass


class ProducerIdAllocated(Message, frozen=True):
    producer_id: int


# -- consumer groups and committed offsets (frontend -> coordinator) ----------------------------


class JoinGroup(Message, frozen=True):
    group_id: str
    member_id: str  # "" for a member joining for the first time
    group_instance_id: str | None  # static membership (KIP-345)
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]  # (name, metadata), in the member's preference order
    require_known_member_id: bool  # JoinGroup v4+: a new member first gets MEMBER_ID_REQUIRED
    reason: str | None = None


class GroupMember(msgspec.Struct, frozen=True):
    member_id: str
    group_instance_id: str | None
    metadata: bytes


class JoinGroupResult(Message, frozen=True):
    error_code: int
    generation_id: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    skip_assignment: bool = False
    member_id: str = ""
    members: list[GroupMember] = msgspec.field(default_factory=list)  # for the leader only


class SyncGroup(Message, frozen=True):
    group_id: str
    generation_id: int
    member_id: str
    group_instance_id: str | None
    protocol_type: str | None
    protocol_name: str | None
    assignments: list[tuple[str, bytes]]  # from the leader: (member id, assignment)


class SyncGroupResult(Message, frozen=True):
    error_code: int
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignment: bytes = b""


class Heartbeat(Message, frozen=True):
    group_id: str
    generation_id: int
    member_id: str
    group_instance_id: str | None = None


class LeavingMember(msgspec.Struct, frozen=True):
    member_id: str
    group_instance_id: str | None = None
    reason: str | None = None


class LeaveGroup(Message, frozen=True):
    group_id: str
    members: list[LeavingMember]


class LeaveGroupResult(Message, frozen=True):
    error_code: int
    members: list[tuple[str, str | None, int]] = msgspec.field(default_factory=list)


class GroupError(Message, frozen=True):
    """A bare error code: the answer to Heartbeat, and to any group request that failed whole."""

    error_code: int


class PartitionOffset(msgspec.Struct, frozen=True):
    topic: str
    partition: int
    offset: int = -1
    leader_epoch: int = -1
    metadata: str | None = ""
    error_code: int = 0


class OffsetCommit(Message, frozen=True):
    group_id: str
    generation_id: int  # -1 with member id "": a simple consumer (assign()) or an admin
    member_id: str
    group_instance_id: str | None
    offsets: list[PartitionOffset]
    version: int = 0  # members of consumer (KIP-848) groups need v9+


class OffsetCommitResult(Message, frozen=True):
    error_codes: list[int]  # per offset, in request order


class GroupOffsetsQuery(msgspec.Struct, frozen=True):
    group_id: str
    partitions: list[tuple[str, int]] | None  # None: every partition with a committed offset
    # v9+: a member of a consumer (KIP-848) group names itself and its epoch (-1: nobody)
    member_id: str | None = None
    member_epoch: int = -1


class OffsetFetch(Message, frozen=True):
    groups: list[GroupOffsetsQuery]
    require_stable: bool = False


class GroupOffsets(msgspec.Struct, frozen=True):
    group_id: str
    error_code: int
    offsets: list[PartitionOffset]


class OffsetFetchResult(Message, frozen=True):
    groups: list[GroupOffsets]


class DescribeGroups(Message, frozen=True):
    group_ids: list[str]


class MemberDescription(msgspec.Struct, frozen=True):
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes


class GroupDescription(msgspec.Struct, frozen=True):
    group_id: str
    error_code: int
    state: str
    protocol_type: str
    protocol: str
    members: list[MemberDescription]
    error_message: str | None = None


class GroupsDescribed(Message, frozen=True):
    groups: list[GroupDescription]


class ListGroups(Message, frozen=True):
    states: list[str] = msgspec.field(default_factory=list)  # empty: every state
    types: list[str] = msgspec.field(default_factory=list)  # empty: every type


class GroupListing(msgspec.Struct, frozen=True):
    group_id: str
    protocol_type: str
    state: str
    group_type: str = "classic"  # or "consumer" (KIP-848)


class GroupsListed(Message, frozen=True):
    groups: list[GroupListing]


class DeleteGroups(Message, frozen=True):
    group_ids: list[str]


class GroupsDeleted(Message, frozen=True):
    results: list[tuple[str, int]]  # (group id, error code)


class OffsetDelete(Message, frozen=True):
    group_id: str
    partitions: list[tuple[str, int]]


class OffsetsDeleted(Message, frozen=True):
    error_code: int
    results: list[tuple[str, int, int]] = msgspec.field(default_factory=list)


AnyMessage = (
    Ready
    | BootFailed
    | Ping
    | Pong
    | Drain
    | Draining
    | ErrorReply
    | CreateTopics
    | DeleteTopics
    | TopicResults
    | CommitSegment
    | SegmentCommitted
    | Append
    | Appended
    | AllocateProducerId
    | ProducerIdAllocated
    | FlushAll
    | FlushedAll
    | LogStartMoved
    | MoveLogStart
    | LogStartMoves
    | JoinGroup
    | JoinGroupResult
    | SyncGroup
    | SyncGroupResult
    | Heartbeat
    | LeaveGroup
    | LeaveGroupResult
    | GroupError
    | OffsetCommit
    | OffsetCommitResult
    | OffsetFetch
    | OffsetFetchResult
    | DescribeGroups
    | GroupsDescribed
    | ListGroups
    | GroupsListed
    | DeleteGroups
    | GroupsDeleted
    | OffsetDelete
    | OffsetsDeleted
    | Fetch
    | Fetched
    | ReleaseFetch
    | ListOffsets
    | OffsetsListed
    | AlterTopicConfigs
    | CreatePartitions
    | AlterScramCredentials
    | ScramCredentialsAltered
    | CreateAcls
    | DeleteAcls
    | AclsChanged
    | ShardPending
    | Cut
    | CutEntries
    | ObjectCommitted
    | CommitObject
    | ObjectCommitResult
    | CommitCompaction
    | CommitMerge
    | MergeCommitted
    | SegmentsCompacted
    | SealPartition
    | PartitionSealed
    | CommitCleaning
    | SegmentsCleaned
    | ConsumerGroupHeartbeat
    | ConsumerGroupHeartbeatResult
    | ConsumerGroupDescribe
    | ConsumerGroupsDescribed
    | AlterGroupConfigs
    | GroupConfigResults
)

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(AnyMessage)


def encode(message: Message) -> bytes:
    return _encoder.encode(message)


def decode(data: bytes | memoryview) -> Message:
    """Decode a header frame; raises ``msgspec.DecodeError`` on anything else."""
    message: Message = _decoder.decode(data)
    return message
