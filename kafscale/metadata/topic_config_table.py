"""The table of Kafka 4.3's 33 topic configs: Kafka's definition, and what KafScale does with each.

Per config, from Kafka's ``LogConfig`` (in its definition order, which is the order Kafka checks
values in): the type, the default as DescribeConfigs shows it, the validator, and the broker
config a topic that does not set it inherits (the first of ``ServerTopicConfigSynonyms``; none for
the five Kafka gives no broker default). Then KafScale's side: whether it is ``ENFORCED`` or
accepted ``WITHOUT_EFFECT``, and how, or why not. The checks themselves are in
``kafscale.metadata.topic_configs``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from kafscale.metadata import config_values as v
from kafscale.protocol.configs import ConfigType

INT, LONG, DOUBLE = ConfigType.INT, ConfigType.LONG, ConfigType.DOUBLE
BOOLEAN, STRING, LIST = ConfigType.BOOLEAN, ConfigType.STRING, ConfigType.LIST
INT_MAX = 2**31 - 1
LONG_MAX = 2**63 - 1


class Effect(enum.Enum):
    ENFORCED = "enforced"
    WITHOUT_EFFECT = "accepted without effect"


ENFORCED, WITHOUT_EFFECT = Effect.ENFORCED, Effect.WITHOUT_EFFECT


@dataclass(frozen=True)
class TopicConfig:
    name: str
    type: ConfigType
    default: str  # Kafka's default (the broker synonym's own default), in Kafka's text form
    validator: v.Validator | None  # Kafka's, applied to the parsed value
    broker_name: str | None  # the broker config a topic that does not set this one takes
    doc: str  # what the config means in Kafka
    effect: Effect
    kafscale: str  # what KafScale does with it; without effect: why it has none
    # The KafScale setting (a ``Config`` field) that gives the broker's value, if one does.
    broker_setting: str | None = None

    @property
    def documentation(self) -> str:
        """What DescribeConfigs says of it: Kafka's meaning, then KafScale's."""
        return f"{self.doc} KafScale: {self.effect.value}. {self.kafscale}"


_REPLICAS = (
    "KafScale keeps no replicas: a partition's data is in the object store, which makes it "
    "durable (acks=all is answered once a batch is there and committed), and one broker at a "
    "time serves the partition."
)
_LOCAL_LOG = (
    "KafScale keeps no log files on local disk: a partition's buffer becomes an object in the "
    "object store when it is sealed (at segment.bytes, or KAFSCALE_FLUSH_INTERVAL_MS after its "
    "first byte), and acks=all is answered once it is there."
)
_INDEXES = (
    "KafScale's segments are objects that carry their own offset index (an entry per record "
    "batch); there are no index files to size."
)
_TIERING = (
    "The object store is KafScale's only tier: every topic's data is already there, with no "
    "local tier in front of it; retention.ms and retention.bytes apply to all of it."
)
_LEVEL = (
    "KafScale compresses with fixed levels (gzip 6, lz4's fast mode, zstd 3) whatever the "
    "topic says (NOTES.md)."
)
_ROLL = (
    "A partition's buffer is sealed into an object at segment.bytes or KAFSCALE_FLUSH_INTERVAL_MS "
    "(a fraction of a second by default) after its first byte, so it never waits for a time-based "
    "roll, and a shorter segment.ms does not seal it sooner."
)

# Name, type, default, validator, broker synonym, Kafka's meaning, effect, KafScale's side.
# fmt: off
CONFIGS: dict[str, TopicConfig] = {
    config.name: config
    for config in (
        TopicConfig(
            "segment.bytes", INT, "1073741824", v.at_least(1024 * 1024), "log.segment.bytes",
            "The size of one segment of a partition's log (at least 1 MiB since Kafka 4).",
            ENFORCED,
            "A partition's buffer is sealed into a segment (an object) at this size, or "
            "KAFSCALE_FLUSH_INTERVAL_MS after its first byte, whichever comes first.",
            broker_setting="segment_bytes",
        ),
        TopicConfig(
            "segment.ms", LONG, "604800000", v.at_least(1), "log.roll.ms",
            "How long a segment may stay open before the log rolls to a new one, full or not.",
            WITHOUT_EFFECT, _ROLL,
        ),
        TopicConfig(
            "segment.jitter.ms", LONG, "0", v.at_least(0), "log.roll.jitter.ms",
            "The largest random time taken off segment.ms, so segments do not all roll at once.",
            WITHOUT_EFFECT, _ROLL,
        ),
        TopicConfig(
            "segment.index.bytes", INT, "10485760", v.at_least(4), "log.index.size.max.bytes",
            "The size of a segment's offset index file.",
            WITHOUT_EFFECT, _INDEXES,
        ),
        TopicConfig(
            "flush.messages", LONG, str(LONG_MAX), v.at_least(1), "log.flush.interval.messages",
            "How many records are written to the log between two fsyncs of it.",
            WITHOUT_EFFECT, _LOCAL_LOG,
        ),
        TopicConfig(
            "flush.ms", LONG, str(LONG_MAX), v.at_least(0), "log.flush.interval.ms",
            "How long the log may go without an fsync.",
            WITHOUT_EFFECT, _LOCAL_LOG,
        ),
        TopicConfig(
            "retention.bytes", LONG, "-1", None, "log.retention.bytes",
            "How large a partition may grow before its oldest segments are deleted, with the "
            "delete policy (negative: no size limit).",
            ENFORCED,
            "The oldest segments are deleted while the partition stays at or above this size "
            "without them, when cleanup.policy includes delete.",
        ),
        TopicConfig(
            "retention.ms", LONG, "604800000", v.at_least(-1), "log.retention.ms",
            "How long records are kept before their segment may be deleted, with the delete "
            "policy (-1: no time limit).",
            ENFORCED,
            "A segment whose newest record is older is deleted (checked every "
            "KAFSCALE_RETENTION_CHECK_INTERVAL_MS), when cleanup.policy includes delete.",
        ),
        TopicConfig(
            "max.message.bytes", INT, "1048588", v.at_least(0), "message.max.bytes",
            "The largest record batch allowed, after the producer's compression.",
            ENFORCED, "A larger batch is refused with MESSAGE_TOO_LARGE.",
        ),
        TopicConfig(
            "index.interval.bytes", INT, "4096", v.at_least(0), "log.index.interval.bytes",
            "How many bytes of log lie between two entries of the offset index.",
            WITHOUT_EFFECT, _INDEXES,
        ),
        TopicConfig(
            "delete.retention.ms", LONG, "86400000", v.at_least(0),
            "log.cleaner.delete.retention.ms",
            "How long delete tombstones are kept in a compacted topic.",
            ENFORCED,
            "A tombstone the log cleaner keeps is stamped with the time plus this (KIP-534's "
            "delete horizon) and removed by the first cleaning after it.",
        ),
        TopicConfig(
            "min.compaction.lag.ms", LONG, "0", v.at_least(0),
            "log.cleaner.min.compaction.lag.ms",
            "The least time a record stays uncompacted (at most max.compaction.lag.ms).",
            ENFORCED,
            "A segment is cleaned once its newest record is at least this old.",
        ),
        TopicConfig(
            "max.compaction.lag.ms", LONG, str(LONG_MAX), v.at_least(1),
            "log.cleaner.max.compaction.lag.ms",
            "The most time a record may stay ineligible for compaction.",
            ENFORCED,
            "A partition whose oldest uncleaned segment was written this long ago is cleaned "
            "whatever its dirty ratio, before the others. Records reach a segment when their "
            "write-ahead chunks are compacted (KAFSCALE_COMPACTION_MAX_AGE_MS at the latest).",
        ),
        TopicConfig(
            "file.delete.delay.ms", LONG, "60000", v.at_least(0), "log.segment.delete.delay.ms",
            "How long a deleted segment's files stay on disk before they are removed.",
            WITHOUT_EFFECT,
            "A segment that leaves the log is an object deleted from the object store; there is "
            "no local file whose removal to delay.",
        ),
        TopicConfig(
            "min.cleanable.dirty.ratio", DOUBLE, "0.5", v.between(0, 1),
            "log.cleaner.min.cleanable.ratio",
            "The share of the log that must be uncompacted before the log cleaner compacts it.",
            ENFORCED,
            "Dirty bytes (segments never cleaned) over all the segments' bytes, as Kafka counts "
            "them; write-ahead chunks not yet in segments are not counted.",
        ),
        TopicConfig(
            "cleanup.policy", LIST, "delete", v.valid_list("compact", "delete"),
            "log.cleanup.policy",
            "How old records are cleaned up: delete (by retention.ms and retention.bytes), "
            "compact (the latest record of each key is kept), both, or an empty list: kept "
            "forever.",
            ENFORCED,
            "delete: retention.ms and retention.bytes delete a partition's oldest segments; "
            "empty: nothing is deleted; compact: the log cleaner keeps the latest record of each "
            "key (docs/design/ecosystem.md, section 4), and a record without a key is refused "
            "(INVALID_RECORD).",
        ),
        TopicConfig(
            "unclean.leader.election.enable", BOOLEAN, "false", None,
            "unclean.leader.election.enable",
            "Whether a replica outside the ISR may become leader as a last resort, losing data.",
            WITHOUT_EFFECT,
            f"{_REPLICAS} A partition that moves to another broker resumes from what is "
            "committed; there is no out-of-sync replica to elect.",
        ),
        TopicConfig(
            "min.insync.replicas", INT, "1", v.at_least(1), "min.insync.replicas",
            "How many in-sync replicas an acks=all write needs.",
            WITHOUT_EFFECT, _REPLICAS,
        ),
        TopicConfig(
            "compression.type", STRING, "producer",
            v.valid_string("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer"),
            "compression.type",
            "The codec of the topic's stored batches: uncompressed, gzip, snappy, lz4, zstd, or "
            "producer (the producer's own).",
            ENFORCED,
            "Batches that arrive uncompressed are stored compressed with this codec (with "
            "producer: KAFSCALE_COMPRESSION_CODEC); a batch the producer compressed keeps its "
            "codec (Kafka would recompress it).",
        ),
        TopicConfig(
            "compression.gzip.level", INT, "-1", v.gzip_level, "compression.gzip.level",
            "The gzip level when compression.type is gzip (-1: zlib's default).",
            WITHOUT_EFFECT, _LEVEL,
        ),
        TopicConfig(
            "compression.lz4.level", INT, "9", v.between(1, 17), "compression.lz4.level",
            "The lz4 level when compression.type is lz4.",
            WITHOUT_EFFECT, _LEVEL,
        ),
        TopicConfig(
            "compression.zstd.level", INT, "3", v.between(-131072, 22), "compression.zstd.level",
            "The zstd level when compression.type is zstd.",
            WITHOUT_EFFECT, _LEVEL,
        ),
        TopicConfig(
            "preallocate", BOOLEAN, "false", None, "log.preallocate",
            "Whether a new segment's file is preallocated on disk.",
            WITHOUT_EFFECT, _LOCAL_LOG,
        ),
        TopicConfig(
            "message.timestamp.type", STRING, "CreateTime",
            v.valid_string("CreateTime", "LogAppendTime"), "log.message.timestamp.type",
            "Whether record timestamps are the producer's (CreateTime) or the broker's append "
            "time (LogAppendTime).",
            ENFORCED, "LogAppendTime stamps each batch with the broker's time.",
        ),
        TopicConfig(
            "message.timestamp.before.max.ms", LONG, str(LONG_MAX), v.at_least(0),
            "log.message.timestamp.before.max.ms",
            "How far before the broker's time a record's CreateTime may be (KIP-937).",
            ENFORCED,
            "A batch with an older record is refused with INVALID_TIMESTAMP; ignored with "
            "LogAppendTime.",
        ),
        TopicConfig(
            "message.timestamp.after.max.ms", LONG, "3600000", v.at_least(0),
            "log.message.timestamp.after.max.ms",
            "How far after the broker's time a record's CreateTime may be (KIP-937; an hour "
            "since Kafka 4).",
            ENFORCED,
            "A batch with a later record is refused with INVALID_TIMESTAMP; ignored with "
            "LogAppendTime.",
        ),
        TopicConfig(
            "leader.replication.throttled.replicas", LIST, "", v.throttled_replicas, None,
            "The replicas (partition:broker, or *) whose replication the leader throttles.",
            WITHOUT_EFFECT, f"{_REPLICAS} There is no replication traffic to throttle.",
        ),
        TopicConfig(
            "follower.replication.throttled.replicas", LIST, "", v.throttled_replicas, None,
            "The replicas (partition:broker, or *) whose replication the follower throttles.",
            WITHOUT_EFFECT, f"{_REPLICAS} There is no replication traffic to throttle.",
        ),
        TopicConfig(
            "remote.storage.enable", BOOLEAN, "false", None, None,
            "Whether the topic's older segments are tiered to remote storage.",
            WITHOUT_EFFECT, f"{_TIERING} Only false is accepted: true is refused as Kafka "
            "refuses it with tiered storage off in the broker.",
        ),
        TopicConfig(
            "local.retention.ms", LONG, "-2", v.at_least(-2), "log.local.retention.ms",
            "How long segments stay on local disk when tiering is on (-2: retention.ms).",
            WITHOUT_EFFECT, _TIERING,
        ),
        TopicConfig(
            "local.retention.bytes", LONG, "-2", v.at_least(-2), "log.local.retention.bytes",
            "How much of a partition stays on local disk when tiering is on (-2: "
            "retention.bytes).",
            WITHOUT_EFFECT, _TIERING,
        ),
        TopicConfig(
            "remote.log.copy.disable", BOOLEAN, "false", None, None,
            "Whether a tiered topic stops copying segments to remote storage.",
            WITHOUT_EFFECT, _TIERING,
        ),
        TopicConfig(
            "remote.log.delete.on.disable", BOOLEAN, "false", None, None,
            "Whether remote data is deleted when tiering is turned off for the topic.",
            WITHOUT_EFFECT, _TIERING,
        ),
    )
}
# fmt: on
