"""What the broker tells clients about configs (DescribeConfigs, CreateTopics v5+), as Kafka does.

Pure: a broker ``Config`` and a topic's explicit configs in, described entries out.

Broker configs. KafScale's broker configuration is static (``KAFSCALE_*`` variables and ``serve``
flags, read at start), so every broker config is read-only. A setting with a Kafka equivalent is
described under Kafka's name (``KAFKA_NAMES``: ``KAFSCALE_SEGMENT_BYTES`` is ``log.segment.bytes``);
the others under ``kafscale.`` and the variable's name in dotted lower case
(``KAFSCALE_FLUSH_INTERVAL_MS`` is ``kafscale.flush.interval.ms``). Their source is
STATIC_BROKER_CONFIG when the setting differs from its default, DEFAULT_CONFIG otherwise (Kafka's
distinction between a value in server.properties and a built-in one). Kafka broker configs that
KafScale fixes (``message.max.bytes``, ``compression.type``, ``log.retention.ms``, ...: the
defaults of the topic configs) are DEFAULT_CONFIG.

What a Kafka client is told (the rule; docs/operations.md, "Secrets"). A client sees the configs
that govern its traffic with the broker: Kafka's own broker configs and KafScale's tuning of
produce, fetch and groups, as Kafka shows its broker configs to any client. It is not told where
the broker's state lives or how its backends and operators are reached (``Setting.internal``: the
bucket, S3 endpoint, region, path style and namespace, the data directory, the etcd endpoints,
the metrics port): with S3 or etcd credentials those are the whole cluster, around the Kafka
protocol, and Kafka has no such configs to show (its log.dirs are disks no client can reach).
Credentials (``Setting.secret``) are described as Kafka describes a password config such as
``ssl.keystore.password``: type PASSWORD, ``isSensitive`` true, value null (in every synonym too),
so a tool sees that one is set and never what it is.

Topic configs. Every topic config Kafka defines (``kafscale.metadata.topic_configs``), including
those accepted without effect (their documentation says why): the topic's own value
(DYNAMIC_TOPIC_CONFIG) or else its broker synonym's value and source, with Kafka's synonym chain
(topic, then broker) when asked for. The five Kafka gives no broker synonym (the throttled-replica
lists, ``remote.storage.enable``, ``remote.log.*``) are DEFAULT_CONFIG with Kafka's default when
the topic does not set them, and list only the topic's own value as a synonym, as Kafka does.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kafscale.config import SETTINGS, SETTINGS_BY_FIELD, Config, Setting
from kafscale.metadata import group_configs, topic_configs
from kafscale.protocol.configs import ConfigSource, ConfigType


@dataclass(frozen=True, slots=True)
class Synonym:
    name: str
    value: str | None
    source: ConfigSource


@dataclass(frozen=True, slots=True)
class Described:
    name: str
    value: str | None  # None for a sensitive config
    source: ConfigSource
    read_only: bool
    sensitive: bool
    type: ConfigType
    documentation: str
    synonyms: tuple[Synonym, ...]  # the first one is where ``value`` comes from (if any)


STATIC = ConfigSource.STATIC_BROKER_CONFIG
DEFAULT = ConfigSource.DEFAULT_CONFIG

# KAFSCALE_* settings that are Kafka broker configs, by Kafka's name.
KAFKA_NAMES: dict[str, tuple[str, ConfigType]] = {
    "broker_id": ("broker.id", ConfigType.INT),
    "segment_bytes": ("log.segment.bytes", ConfigType.INT),
    "auto_create_topics": ("auto.create.topics.enable", ConfigType.BOOLEAN),
    "auto_create_partitions": ("num.partitions", ConfigType.INT),
    "max_request_bytes": ("socket.request.max.bytes", ConfigType.INT),
    "group_initial_rebalance_delay_ms": ("group.initial.rebalance.delay.ms", ConfigType.INT),
    "offsets_topic_partitions": ("offsets.topic.num.partitions", ConfigType.INT),
    "group_min_session_timeout_ms": ("group.min.session.timeout.ms", ConfigType.INT),
    "group_max_session_timeout_ms": ("group.max.session.timeout.ms", ConfigType.INT),
    "group_consumer_session_timeout_ms": ("group.consumer.session.timeout.ms", ConfigType.INT),
    "group_consumer_heartbeat_interval_ms": (
        "group.consumer.heartbeat.interval.ms",
        ConfigType.INT,
    ),
    "group_consumer_max_size": ("group.consumer.max.size", ConfigType.INT),
    "group_consumer_migration_policy": ("group.consumer.migration.policy", ConfigType.STRING),
    "ssl_client_auth": ("ssl.client.auth", ConfigType.STRING),
    "ssl_key_password": ("ssl.key.password", ConfigType.PASSWORD),
    "sasl_enabled_mechanisms": ("sasl.enabled.mechanisms", ConfigType.LIST),
    "connections_max_reauth_ms": ("connections.max.reauth.ms", ConfigType.LONG),
    "super_users": ("super.users", ConfigType.STRING),
    "allow_everyone_if_no_acl_found": ("allow.everyone.if.no.acl.found", ConfigType.BOOLEAN),
}

# Kafka broker configs whose value KafScale fixes (beyond the topic configs' broker synonyms).
FIXED: tuple[tuple[str, str, ConfigType, str], ...] = (
    (
        "default.replication.factor",
        "1",
        ConfigType.INT,
        "Replication factor of auto-created topics. KafScale keeps no replicas: durability "
        "comes from S3.",
    ),
)


def setting_name(setting: Setting) -> str:
    """The name a KAFSCALE_* setting is described under."""
    kafka = KAFKA_NAMES.get(setting.field)
    return kafka[0] if kafka else "kafscale." + setting.field.replace("_", ".")


def broker_configs(config: Config) -> list[Described]:
    """Every broker config, sorted by name."""
    return sorted(_broker_table(config).values(), key=lambda entry: entry.name)


def topic_configs_of(explicit: Mapping[str, str], config: Config) -> list[Described]:
    """Every topic config of a topic that sets ``explicit``, sorted by name."""
    brokers = _broker_table(config)
    described = []
    for name, topic_config in sorted(topic_configs.CONFIGS.items()):
        synonyms: tuple[Synonym, ...] = ()
        if topic_config.broker_name is not None:
            synonyms = brokers[topic_config.broker_name].synonyms
        if name in explicit:
            synonyms = (Synonym(name, explicit[name], ConfigSource.DYNAMIC_TOPIC_CONFIG), *synonyms)
        value: str | None = topic_config.default  # no synonym: Kafka's own default
        source = DEFAULT
        if synonyms:
            value, source = synonyms[0].value, synonyms[0].source
        described.append(
            Described(
                name=name,
                value=value,
                source=source,
                read_only=False,
                sensitive=False,
                type=topic_config.type,
                documentation=topic_config.documentation,
                synonyms=synonyms,
            )
        )
    return described


def group_configs_of(explicit: Mapping[str, str], config: Config) -> list[Described]:
    """Every group config of a group that sets ``explicit``, sorted by name: its own value, else
    the broker's ``group.<name>`` when it has one, else Kafka's default."""
    brokers = _broker_table(config)
    described = []
    for name, group_config in sorted(group_configs.CONFIGS.items()):
        broker = brokers.get("group." + name)
        synonyms: tuple[Synonym, ...] = broker.synonyms if broker is not None else ()
        if name in explicit:
            synonyms = (Synonym(name, explicit[name], ConfigSource.GROUP_CONFIG), *synonyms)
        value, source = group_config.default, DEFAULT
        if synonyms:
            value, source = synonyms[0].value or value, synonyms[0].source
        described.append(
            Described(
                name=name,
                value=value,
                source=source,
                read_only=False,
                sensitive=False,
                type=ConfigType.STRING if group_config.choices else ConfigType.INT,
                documentation=group_config.documentation,
                synonyms=synonyms,
            )
        )
    return described


@functools.cache
def _broker_table(config: Config) -> dict[str, Described]:
    table: dict[str, Described] = {}
    for setting in SETTINGS:
        if setting.internal:
            continue
        entry = _from_setting(config, setting)
        table[entry.name] = entry
    table["node.id"] = _renamed(table["broker.id"], "node.id")  # KRaft's name of broker.id
    listeners = config.kafka_listeners
    for name, value, fields, doc in (
        (
            "listeners",
            ",".join(f"{x.name}://{_host(x.host)}:{x.port}" for x in listeners),
            ("listeners", "broker_host", "broker_port"),
            "The Kafka listeners (KAFSCALE_LISTENERS, else KAFSCALE_BROKER_HOST and "
            "KAFSCALE_BROKER_PORT).",
        ),
        (
            "advertised.listeners",
            ",".join(
                f"{x.name}://{_host(x.advertised_host)}:{x.advertised_port}" for x in listeners
            ),
            ("advertised_listeners", "listeners", "broker_host", "broker_port", "advertised_host"),
            "Where clients are told to reach each listener (KAFSCALE_ADVERTISED_LISTENERS).",
        ),
        (
            "listener.security.protocol.map",
            ",".join(f"{x.name}:{x.protocol.value}" for x in listeners),
            ("listener_security_protocol_map", "listeners"),
            "The security protocol of each listener (KAFSCALE_LISTENER_SECURITY_PROTOCOL_MAP).",
        ),
    ):
        static = any(_source(config, field) is STATIC for field in fields)
        table[name] = _fixed(name, value, ConfigType.LIST, doc, STATIC if static else DEFAULT)
    for topic_config in topic_configs.CONFIGS.values():
        broker_name = topic_config.broker_name
        if topic_config.broker_setting is None and broker_name is not None:
            doc = f"The default of topic config {topic_config.name}. {topic_config.documentation}"
            table[broker_name] = _fixed(broker_name, topic_config.default, topic_config.type, doc)
    for name, value, kind, doc in FIXED:
        table[name] = _fixed(name, value, kind, doc)
    return table


def _host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


# Settings whose value "auto" the broker resolves: described as resolved (what is in effect).
_RESOLVED: dict[str, Callable[[Config], Any]] = {"flush_interval_ms": lambda c: c.flush_interval}


def _from_setting(config: Config, setting: Setting) -> Described:
    name = setting_name(setting)
    resolve = _RESOLVED.get(setting.field)
    value = _text(resolve(config) if resolve else getattr(config, setting.field))
    default = _text(_default(setting))
    source = _source(config, setting.field)
    synonyms: tuple[Synonym, ...] = (Synonym(name, value, source),)
    if source is STATIC:
        synonyms += (Synonym(name, default, DEFAULT),)
    if setting.secret:
        synonyms = tuple(Synonym(s.name, None, s.source) for s in synonyms)
    return Described(
        name=name,
        value=None if setting.secret else value,
        source=source,
        read_only=True,
        sensitive=setting.secret,
        type=_type(setting, getattr(config, setting.field)),
        documentation=f"{setting.help} ({setting.env}).",
        synonyms=synonyms,
    )


def _fixed(
    name: str,
    value: str,
    kind: ConfigType,
    doc: str,
    source: ConfigSource = DEFAULT,
) -> Described:
    return Described(name, value, source, True, False, kind, doc, (Synonym(name, value, source),))


def _renamed(entry: Described, name: str) -> Described:
    synonyms = tuple(Synonym(name, s.value, s.source) for s in entry.synonyms)
    return Described(
        name,
        entry.value,
        entry.source,
        entry.read_only,
        entry.sensitive,
        entry.type,
        entry.documentation,
        synonyms,
    )


def _source(config: Config, field: str) -> ConfigSource:
    """STATIC_BROKER_CONFIG when the setting differs from its default (Kafka: a value set in
    server.properties), else DEFAULT_CONFIG."""
    if getattr(config, field) == _default(SETTINGS_BY_FIELD[field]):
        return DEFAULT
    return STATIC


@functools.cache
def _default(setting: Setting) -> Any:
    return setting.parse(setting.default)


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(str(item) for item in value)
    return str(value)


def _type(setting: Setting, value: Any) -> ConfigType:
    kafka = KAFKA_NAMES.get(setting.field)
    if kafka:
        return kafka[1]
    if setting.secret:
        return ConfigType.PASSWORD
    if isinstance(value, bool):
        return ConfigType.BOOLEAN
    if isinstance(value, int):
        return ConfigType.LONG
    if isinstance(value, tuple):
        return ConfigType.LIST
    return ConfigType.STRING
