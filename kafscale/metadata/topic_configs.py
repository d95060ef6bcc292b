"""Topic configurations KafScale understands: defaults, types, checks, and how alterations apply.

Only settings the broker acts on are accepted. Any other name Kafka defines (``segment.ms``,
``min.insync.replicas``, ...) is refused with a message saying KafScale does not support it, and a
name Kafka does not define is refused as unknown -- as Kafka refuses unknown topic configs -- so a
setting never silently does nothing. ``retention.ms`` and ``retention.bytes`` are enforced by the
coordinator (``kafscale.coordinator.retention``).

A topic record holds only the configs set on it. A config it does not set takes its broker's
value, as in Kafka (``segment.bytes`` <- ``log.segment.bytes``, which is KAFSCALE_SEGMENT_BYTES);
``defaults`` gives those values. ``replaced`` (AlterConfigs) and ``altered``
(IncrementalAlterConfigs) are pure: current configs and a request in, the new set out.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from kafscale.config import Config
from kafscale.protocol.configs import AlterConfigOp, ConfigType

COMPRESSION_TYPES = ("producer", "uncompressed", "gzip", "snappy", "lz4", "zstd")
INT_MAX = 2**31 - 1
LONG_MAX = 2**63 - 1


class InvalidTopicConfig(ValueError):
    """A topic config name or value the broker refuses (INVALID_CONFIG); the message says which
    and why."""


class InvalidAlteration(ValueError):
    """An alteration request that is malformed whatever the configs (INVALID_REQUEST): a config
    named twice, a null value to set, an unknown operation."""


def _number(low: int, high: int) -> Callable[[str], None]:
    def check(value: str) -> None:
        try:
            number = int(value)
        except ValueError:
            raise InvalidTopicConfig(f"{value!r} is not an integer") from None
        if not low <= number <= high:
            raise InvalidTopicConfig(f"{number} is out of range [{low}, {high}]")

    return check


def _one_of(*choices: str) -> Callable[[str], None]:
    def check(value: str) -> None:
        if value not in choices:
            raise InvalidTopicConfig(f"{value!r} is not one of {', '.join(choices)}")

    return check


@dataclass(frozen=True)
class TopicConfig:
    name: str
    default: str  # Kafka's default (the broker synonym's own default)
    check: Callable[[str], None]
    type: ConfigType
    broker_name: str  # the broker config a topic that does not set this one takes (Kafka's)
    doc: str
    # The KafScale setting (a ``Config`` field) that gives the broker's value, if one does.
    broker_setting: str | None = None


SUPPORTED: dict[str, TopicConfig] = {
    config.name: config
    for config in (
        TopicConfig(
            "cleanup.policy",
            "delete",
            _one_of("delete"),
            ConfigType.LIST,
            "log.cleanup.policy",
            "The retention policy of old log segments. KafScale supports delete only "
            "(no compaction).",
        ),
        TopicConfig(
            "compression.type",
            "producer",
            _one_of(*COMPRESSION_TYPES),
            ConfigType.STRING,
            "compression.type",
            "The compression of the topic's stored batches: uncompressed, gzip, snappy, lz4, "
            "zstd, or producer (keep the producer's codec; batches that arrive uncompressed get "
            "KAFSCALE_COMPRESSION_CODEC).",
        ),
        TopicConfig(
            "max.message.bytes",
            "1048588",
            _number(0, INT_MAX),
            ConfigType.INT,
            "message.max.bytes",
            "The largest record batch size allowed (after compression by the producer); a "
            "larger one is refused with MESSAGE_TOO_LARGE.",
        ),
        TopicConfig(
            "message.timestamp.type",
            "CreateTime",
            _one_of("CreateTime", "LogAppendTime"),
            ConfigType.STRING,
            "log.message.timestamp.type",
            "Whether record timestamps are the producer's (CreateTime) or the broker's append "
            "time (LogAppendTime).",
        ),
        TopicConfig(
            "message.timestamp.before.max.ms",
            str(LONG_MAX),
            _number(0, LONG_MAX),
            ConfigType.LONG,
            "log.message.timestamp.before.max.ms",
            "How far before the broker's time a record's CreateTime may be; a batch with an "
            "older record is refused with INVALID_TIMESTAMP (KIP-937). Ignored with "
            "LogAppendTime.",
        ),
        TopicConfig(
            "message.timestamp.after.max.ms",
            "3600000",  # Kafka 4's default (KIP-1030); Long.MAX_VALUE before 4.0
            _number(0, LONG_MAX),
            ConfigType.LONG,
            "log.message.timestamp.after.max.ms",
            "How far after the broker's time a record's CreateTime may be; a batch with a later "
            "record is refused with INVALID_TIMESTAMP (KIP-937). Ignored with LogAppendTime.",
        ),
        TopicConfig(
            "retention.ms",
            "604800000",
            _number(-1, LONG_MAX),
            ConfigType.LONG,
            "log.retention.ms",
            "How long a segment is kept before it may be deleted (-1: no time limit).",
        ),
        TopicConfig(
            "retention.bytes",
            "-1",
            _number(-1, LONG_MAX),
            ConfigType.LONG,
            "log.retention.bytes",
            "How large a partition may grow before old segments may be deleted (-1: no size "
            "limit).",
        ),
        TopicConfig(
            "segment.bytes",
            "1073741824",
            _number(1024 * 1024, INT_MAX),  # Kafka 4's minimum is 1 MiB (KIP-1030)
            ConfigType.INT,
            "log.segment.bytes",
            "A partition's buffer is sealed into a segment (an S3 object) at this size, or "
            "KAFSCALE_FLUSH_INTERVAL_MS after its first byte, whichever comes first.",
            broker_setting="segment_bytes",
        ),
    )
}

# Topic configs Apache Kafka defines that KafScale has no use for (no local log, no replicas).
KAFKA_ONLY = frozenset(
    {
        "delete.retention.ms",
        "file.delete.delay.ms",
        "flush.messages",
        "flush.ms",
        "follower.replication.throttled.replicas",
        "index.interval.bytes",
        "leader.replication.throttled.replicas",
        "local.retention.bytes",
        "local.retention.ms",
        "max.compaction.lag.ms",
        "message.downconversion.enable",
        "message.format.version",
        "message.timestamp.difference.max.ms",
        "min.cleanable.dirty.ratio",
        "min.compaction.lag.ms",
        "min.insync.replicas",
        "preallocate",
        "remote.storage.enable",
        "segment.index.bytes",
        "segment.jitter.ms",
        "segment.ms",
        "unclean.leader.election.enable",
        "compression.gzip.level",
        "compression.lz4.level",
        "compression.zstd.level",
        "remote.log.copy.disable",
        "remote.log.delete.on.disable",
    }
)


def known(name: str) -> TopicConfig:
    """The supported config ``name``; raises InvalidTopicConfig naming it otherwise."""
    config = SUPPORTED.get(name)
    if config is None:
        if name in KAFKA_ONLY:
            raise InvalidTopicConfig(f"topic config {name} is not supported by KafScale")
        raise InvalidTopicConfig(f"unknown topic config name: {name}")
    return config


def validate(configs: Mapping[str, str | None]) -> dict[str, str]:
    """The explicitly set configs, checked; raises InvalidTopicConfig for the first bad one.
    A None value means "use the default" and is dropped."""
    checked: dict[str, str] = {}
    for name, value in configs.items():
        config = known(name)
        if value is None:
            continue
        try:
            config.check(value)
        except InvalidTopicConfig as exc:
            raise InvalidTopicConfig(f"invalid value for {name}: {exc}") from None
        checked[name] = value
    return checked


@functools.cache
def defaults(broker: Config) -> Mapping[str, str]:
    """The value of each supported config for a topic that does not set it."""
    return {
        name: str(getattr(broker, config.broker_setting))
        if config.broker_setting
        else config.default
        for name, config in SUPPORTED.items()
    }


def effective(configs: Mapping[str, str], topic_defaults: Mapping[str, str]) -> dict[str, str]:
    """Every supported config with its value for a topic: explicit ones, else the default."""
    return {name: configs.get(name, topic_defaults[name]) for name in SUPPORTED}


def replaced(configs: Sequence[tuple[str, str | None]]) -> dict[str, str]:
    """AlterConfigs: the topic's configs become exactly these (a null value: the default)."""
    _refuse_duplicates(name for name, _ in configs)
    return validate(dict(configs))


def altered(
    current: Mapping[str, str], changes: Sequence[tuple[str, int, str | None]]
) -> dict[str, str]:
    """IncrementalAlterConfigs: ``current`` with each (name, operation, value) applied.

    APPEND and SUBTRACT treat the value as a comma-separated list, starting from the default
    when the topic does not set the config, as Kafka's controller does; they are refused for
    configs that are not lists."""
    _refuse_duplicates(name for name, _, _ in changes)
    updated = dict(current)
    for name, operation, value in changes:
        config = known(name)
        try:
            op = AlterConfigOp(operation)
        except ValueError:
            raise InvalidAlteration(f"unknown operation {operation} for config {name}") from None
        if op is AlterConfigOp.DELETE:
            updated.pop(name, None)
            continue
        if value is None:
            raise InvalidAlteration(f"Null value not supported for : {name}")
        if op is AlterConfigOp.SET:
            updated[name] = value
            continue
        if config.type is not ConfigType.LIST:
            raise InvalidTopicConfig(f"Can't {op.name} to key {name} because its type is not LIST.")
        items = _items(updated.get(name, config.default))
        for item in _items(value):
            if op is AlterConfigOp.APPEND and item not in items:
                items.append(item)
            elif op is AlterConfigOp.SUBTRACT and item in items:
                items.remove(item)
        updated[name] = ",".join(items)
    return validate(updated)


def _items(value: str) -> list[str]:
    return [item for item in value.split(",") if item]


def _refuse_duplicates(names: Iterable[str]) -> None:
    twice = sorted(name for name, count in Counter(names).items() if count > 1)
    if twice:
        raise InvalidAlteration(f"Error due to duplicate config keys: {', '.join(twice)}")
