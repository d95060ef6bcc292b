"""Topic configurations: Kafka's 33, what KafScale does with each, and how alterations apply.

Every topic config Kafka 4.3 defines is accepted, stored and described, with Kafka's type, default
and validator (``kafscale.metadata.config_values``: a value Kafka refuses is refused with Kafka's
message). ``CONFIGS`` says of each what KafScale does with it: ``ENFORCED``, or accepted
``WITHOUT_EFFECT`` because what it tunes does not exist here (replicas, local log files and their
flushing and indexes, a local tier in front of remote storage) -- the reason is in the table, the
docs (docs/compatibility.md, Topic configs) and every DescribeConfigs answer. A name Kafka does not
define is refused as Kafka 4 refuses it ("Unknown topic config name"), which includes the ones
Kafka 4 removed (``message.format.version``, ``message.downconversion.enable``,
``message.timestamp.difference.max.ms``).

A topic record holds only the configs set on it, as they were given. A config it does not set
takes its broker's value, as in Kafka (``segment.bytes`` <- ``log.segment.bytes``, which is
KAFSCALE_SEGMENT_BYTES); ``defaults`` gives those values, ``effective`` every config's value in
Kafka's parsed form (trimmed, ``+5`` as ``5``; an explicitly empty ``cleanup.policy`` is ``""``).
``replaced`` (AlterConfigs) and ``altered`` (IncrementalAlterConfigs) are pure: current configs and
a request in, the new set out.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from kafscale.config import Config
from kafscale.metadata import config_values
from kafscale.metadata.config_values import InvalidConfig
from kafscale.metadata.topic_config_table import CONFIGS, TopicConfig
from kafscale.protocol.configs import AlterConfigOp, ConfigType

__all__ = [
    "CONFIGS",
    "InvalidAlteration",
    "InvalidTopicConfig",
    "TopicConfig",
    "altered",
    "defaults",
    "effective",
    "known",
    "replaced",
    "validate",
]


class InvalidTopicConfig(InvalidConfig):
    """A topic config name or value the broker refuses (INVALID_CONFIG); the message says which
    and why, in Kafka's words where Kafka refuses it too."""


class InvalidAlteration(ValueError):
    """An alteration request that is malformed whatever the configs (INVALID_REQUEST): a config
    named twice, a null value to set, an unknown operation."""


def known(name: str) -> TopicConfig:
    """The topic config ``name``; raises InvalidTopicConfig as Kafka does for a name it does not
    define."""
    config = CONFIGS.get(name)
    if config is None:
        raise InvalidTopicConfig(f"Unknown topic config name: {name}")
    return config


def validate(configs: Mapping[str, str | None]) -> dict[str, str]:
    """The explicitly set configs, checked as Kafka's ``LogConfig.validate`` checks them: names
    first, then each value in Kafka's definition order, then the one cross-config rule; raises
    InvalidTopicConfig for the first problem. A None value means "use the default" and is
    dropped."""
    for name in configs:
        known(name)
    checked = {name: value for name, value in configs.items() if value is not None}
    parsed = {}
    try:
        for name, config in CONFIGS.items():
            if name in checked:
                parsed[name] = _parsed(config, checked[name])
    except InvalidConfig as exc:
        raise InvalidTopicConfig(str(exc)) from None
    _check_compaction_lags(parsed)
    if parsed.get("remote.storage.enable") is True:
        # Kafka's LogConfig.validateRemoteStorageOnlyIfSystemEnabled, with tiering off in the
        # broker: KafScale has no second tier (the object store is the only one).
        raise InvalidTopicConfig(
            "Tiered Storage functionality is disabled in the broker. Topic cannot be "
            "configured with remote log storage."
        )
    return checked


def _parsed(config: TopicConfig, value: str) -> config_values.Value:
    parsed = config_values.parse(config.name, value, config.type)
    if config.validator is not None:
        config.validator(config.name, parsed)
    return parsed


def _check_compaction_lags(parsed: Mapping[str, config_values.Value]) -> None:
    """Kafka's ``LogConfig.validateValues``: the minimum compaction lag may not exceed the
    maximum (each the topic's value, else the default)."""
    low = parsed.get("min.compaction.lag.ms", int(CONFIGS["min.compaction.lag.ms"].default))
    high = parsed.get("max.compaction.lag.ms", int(CONFIGS["max.compaction.lag.ms"].default))
    assert isinstance(low, int) and isinstance(high, int)
    if low > high:
        raise InvalidTopicConfig(
            f"conflict topic config setting min.compaction.lag.ms ({low}) > "
            f"max.compaction.lag.ms ({high})"
        )


@functools.cache
def defaults(broker: Config) -> Mapping[str, str]:
    """The value of each config for a topic that does not set it."""
    return {
        name: str(getattr(broker, config.broker_setting))
        if config.broker_setting
        else config.default
        for name, config in CONFIGS.items()
    }


def effective(configs: Mapping[str, str], topic_defaults: Mapping[str, str]) -> dict[str, str]:
    """Every config with its value for a topic (explicit ones, else the default), each in
    Kafka's parsed form: what the broker acts on. ``configs`` holds only checked values."""
    return {
        name: _normalized(name, configs[name]) if name in configs else topic_defaults[name]
        for name in CONFIGS
    }


@functools.lru_cache(maxsize=4096)
def _normalized(name: str, value: str) -> str:
    """A checked value in Kafka's parsed form (cached: produce asks for every request)."""
    return config_values.text(config_values.parse(name, value, CONFIGS[name].type))


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
    configs that are not lists. Subtracting a list's last item leaves it explicitly empty (for
    ``cleanup.policy``: nothing is ever deleted)."""
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
