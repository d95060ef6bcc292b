"""Topic configurations KafScale understands, their defaults, and how values are checked.

Only settings the broker acts on are accepted. Any other name Kafka defines (``segment.ms``,
``min.insync.replicas``, ...) is refused with a message saying KafScale does not support it, and a
name Kafka does not define is refused as unknown -- as Kafka refuses unknown topic configs -- so a
setting never silently does nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

COMPRESSION_TYPES = ("producer", "uncompressed", "gzip", "snappy", "lz4", "zstd")


class InvalidTopicConfig(ValueError):
    """A topic config name or value the broker refuses; the message says which and why."""


def _long(low: int) -> Callable[[str], None]:
    def check(value: str) -> None:
        try:
            number = int(value)
        except ValueError:
            raise InvalidTopicConfig(f"{value!r} is not an integer") from None
        if number < low or number >= 2**63:
            raise InvalidTopicConfig(f"{number} is out of range (minimum {low})")

    return check


def _one_of(*choices: str) -> Callable[[str], None]:
    def check(value: str) -> None:
        if value not in choices:
            raise InvalidTopicConfig(f"{value!r} is not one of {', '.join(choices)}")

    return check


@dataclass(frozen=True)
class TopicConfig:
    name: str
    default: str
    check: Callable[[str], None]


SUPPORTED: dict[str, TopicConfig] = {
    config.name: config
    for config in (
        TopicConfig("cleanup.policy", "delete", _one_of("delete")),
        TopicConfig("compression.type", "producer", _one_of(*COMPRESSION_TYPES)),
        TopicConfig("max.message.bytes", "1048588", _long(0)),
        TopicConfig("message.timestamp.type", "CreateTime", _one_of("CreateTime", "LogAppendTime")),
        TopicConfig("retention.ms", "604800000", _long(-1)),
        TopicConfig("retention.bytes", "-1", _long(-1)),
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
        "message.timestamp.after.max.ms",
        "message.timestamp.before.max.ms",
        "message.timestamp.difference.max.ms",
        "min.cleanable.dirty.ratio",
        "min.compaction.lag.ms",
        "min.insync.replicas",
        "preallocate",
        "remote.storage.enable",
        "segment.bytes",
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


def validate(configs: Mapping[str, str | None]) -> dict[str, str]:
    """The explicitly set configs, checked; raises InvalidTopicConfig for the first bad one.
    A None value means "use the default" and is dropped."""
    checked: dict[str, str] = {}
    for name, value in configs.items():
        config = SUPPORTED.get(name)
        if config is None:
            if name in KAFKA_ONLY:
                raise InvalidTopicConfig(f"topic config {name} is not supported by KafScale")
            raise InvalidTopicConfig(f"unknown topic config name: {name}")
        if value is None:
            continue
        try:
            config.check(value)
        except InvalidTopicConfig as exc:
            raise InvalidTopicConfig(f"invalid value for {name}: {exc}") from None
        checked[name] = value
    return checked


def effective(configs: Mapping[str, str]) -> dict[str, str]:
    """Every supported config with its value for a topic: explicit ones, else the default."""
    return {name: configs.get(name, config.default) for name, config in SUPPORTED.items()}
