"""Group configs (Kafka 4's ``GroupConfig``): set with IncrementalAlterConfigs on GROUP
resources, described with DescribeConfigs, stored one record per group::

    /kafscale/{ns}/group_configs/{group}    GroupConfigRecord: the configs set on the group

Every config Kafka 4.3 defines is accepted, stored and described. Two act on consumer (KIP-848)
groups here: ``consumer.session.timeout.ms`` and ``consumer.heartbeat.interval.ms`` replace the
broker's defaults for that group (from its members' next heartbeat). The others belong to share
and streams groups, which KafScale does not have: accepted without effect, as topic configs that
mean nothing here are (docs/design/ecosystem.md, section 5.6).

Validation as Kafka's ``GroupConfig.validate``: an unknown name, a value that is not an integer
(or one of a string config's values) or out of its range is INVALID_CONFIG with Kafka's message;
a session timeout must stay above the heartbeat interval. The group need not exist.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import msgspec

from kafscale.protocol.configs import AlterConfigOp

MAX_INT = 2**31 - 1


class Change(Protocol):
    """One config of an alteration (IncrementalAlterConfigs' operation: 0 SET, 1 DELETE)."""

    @property
    def name(self) -> str: ...

    @property
    def operation(self) -> int: ...

    @property
    def value(self) -> str | None: ...


class GroupConfigRecord(msgspec.Struct, frozen=True):
    group_id: str
    configs: dict[str, str]


@dataclass(frozen=True)
class GroupConfig:
    name: str
    default: str
    documentation: str
    low: int | None = None  # integer configs: inclusive bounds
    high: int | None = None
    choices: tuple[str, ...] = ()  # string configs: the values allowed
    effective: bool = False  # acts on KafScale's groups


def _int(
    name: str, default: int, low: int, high: int, doc: str, effective: bool = False
) -> GroupConfig:
    return GroupConfig(name, str(default), doc, low, high, effective=effective)


CONFIGS: dict[str, GroupConfig] = {
    c.name: c
    for c in (
        _int(
            "consumer.session.timeout.ms",
            45_000,
            1,
            3_600_000,
            "The timeout to detect client failures when using the consumer group protocol.",
            effective=True,
        ),
        _int(
            "consumer.heartbeat.interval.ms",
            5_000,
            1,
            3_600_000,
            "The heartbeat interval given to the members of a consumer group.",
            effective=True,
        ),
        _int(
            "consumer.assignment.interval.ms",
            1_000,
            0,
            MAX_INT,
            "The minimum interval between two target assignments of a consumer group "
            "(KafScale computes a target as soon as the group changes).",
        ),
        _int("share.session.timeout.ms", 45_000, 1, MAX_INT, "Share groups: session timeout."),
        _int("share.heartbeat.interval.ms", 5_000, 1, MAX_INT, "Share groups: heartbeat."),
        _int("share.record.lock.duration.ms", 30_000, 1_000, 3_600_000, "Share groups: locks."),
        _int("share.delivery.count.limit", 5, 2, 10, "Share groups: delivery attempts."),
        _int("share.partition.max.record.locks", 2_000, 100, 10_000, "Share groups: locks."),
        GroupConfig(
            "share.auto.offset.reset",
            "latest",
            "Share groups: where a partition starts.",
            choices=("latest", "earliest", "by_duration"),
        ),
        GroupConfig(
            "share.isolation.level",
            "read_uncommitted",
            "Share groups: which records are read.",
            choices=("read_committed", "read_uncommitted"),
        ),
        GroupConfig(
            "share.renew.acknowledge.enable",
            "true",
            "Share groups: renew acknowledgements.",
            choices=("true", "false"),
        ),
        _int("share.assignment.interval.ms", 1_000, 0, MAX_INT, "Share groups: assignments."),
        _int("streams.session.timeout.ms", 45_000, 1, MAX_INT, "Streams groups: session."),
        _int("streams.heartbeat.interval.ms", 5_000, 1, MAX_INT, "Streams groups: heartbeat."),
        _int("streams.num.standby.replicas", 0, 0, MAX_INT, "Streams groups: standbys."),
        _int("streams.initial.rebalance.delay.ms", 3_000, 0, MAX_INT, "Streams groups: delay."),
        _int("streams.assignment.interval.ms", 1_000, 0, MAX_INT, "Streams groups: assignments."),
    )
}


def apply(
    current: dict[str, str], changes: Sequence[Change], incremental: bool
) -> tuple[dict[str, str], str | None]:
    """The group's configs after ``changes`` (SET, DELETE; a non-incremental request replaces
    them all), and the INVALID_CONFIG message if they are refused."""
    configs = dict(current) if incremental else {}
    for change in changes:
        config = CONFIGS.get(change.name)
        if config is None:
            return current, f"Unknown group config name: {change.name}"
        if change.operation == AlterConfigOp.DELETE:
            configs.pop(change.name, None)
        elif change.operation == AlterConfigOp.SET:
            if change.value is None:
                return current, f"Null value not supported for {change.name}"
            problem = _invalid(config, change.value.strip())
            if problem is not None:
                return current, problem
            configs[change.name] = change.value.strip()
        else:
            return current, (
                f"{change.name} is not a list config: it cannot be appended to or subtracted from"
            )
    session = int(value(configs, "consumer.session.timeout.ms"))
    heartbeat = int(value(configs, "consumer.heartbeat.interval.ms"))
    if session <= heartbeat:
        return current, (
            "consumer.session.timeout.ms must be greater than consumer.heartbeat.interval.ms"
        )
    return configs, None


def value(configs: dict[str, str], name: str) -> str:
    return configs.get(name, CONFIGS[name].default)


def _invalid(config: GroupConfig, text: str) -> str | None:
    if config.choices:
        if text.lower() not in config.choices:
            return (
                f"Invalid value {text} for configuration {config.name}: String must be one of: "
                + ", ".join(config.choices)
            )
        return None
    try:
        number = int(text)
    except ValueError:
        return f"Invalid value {text} for configuration {config.name}: Not a number of type INT"
    low, high = config.low, config.high
    if low is not None and high is not None and not low <= number <= high:
        return f"{config.name} must be in the range {config.low} to {config.high} inclusive."
    return None


class GroupConfigKeys:
    def __init__(self, root: str) -> None:
        self.prefix = root + "group_configs/"

    def group(self, group_id: str) -> str:
        return self.prefix + urllib.parse.quote(group_id, safe="")

    def parse(self, key: str) -> str | None:
        if not key.startswith(self.prefix) or "/" in key[len(self.prefix) :]:
            return None
        return urllib.parse.unquote(key[len(self.prefix) :])


encode = msgspec.json.encode


def decode(data: bytes) -> GroupConfigRecord:
    return msgspec.json.decode(data, type=GroupConfigRecord)
