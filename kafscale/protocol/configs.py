"""Kafka's config-related protocol constants, as the Java client's enums number them.

Used by DescribeConfigs (sources, types), AlterConfigs and IncrementalAlterConfigs (resource
types, operations) and CreateTopics v5+ (sources). The numbers are wire values: see
``org.apache.kafka.common.config.ConfigResource.Type``, ``DescribeConfigsResponse.ConfigSource``,
``DescribeConfigsResponse.ConfigType`` and ``AlterConfigOp.OpType``.
"""

from __future__ import annotations

from enum import IntEnum


class ResourceType(IntEnum):
    """ConfigResource.Type: what a config belongs to."""

    UNKNOWN = 0
    TOPIC = 2
    BROKER = 4
    BROKER_LOGGER = 8
    CLIENT_METRICS = 16
    GROUP = 32


class ConfigSource(IntEnum):
    """Where a described config's value comes from (DescribeConfigs v1+)."""

    UNKNOWN = 0
    DYNAMIC_TOPIC_CONFIG = 1  # set on the topic
    DYNAMIC_BROKER_CONFIG = 2
    DYNAMIC_DEFAULT_BROKER_CONFIG = 3
    STATIC_BROKER_CONFIG = 4  # the broker's start-up configuration (KAFSCALE_* here)
    DEFAULT_CONFIG = 5  # the built-in default
    DYNAMIC_BROKER_LOGGER_CONFIG = 6
    CLIENT_METRICS_CONFIG = 7
    GROUP_CONFIG = 8


class ConfigType(IntEnum):
    """A described config's data type (DescribeConfigs v3+)."""

    UNKNOWN = 0
    BOOLEAN = 1
    STRING = 2
    INT = 3
    SHORT = 4
    LONG = 5
    DOUBLE = 6
    LIST = 7
    CLASS = 8
    PASSWORD = 9


class AlterConfigOp(IntEnum):
    """IncrementalAlterConfigs' operation on one config (KIP-339)."""

    SET = 0
    DELETE = 1
    APPEND = 2  # list-typed configs only
    SUBTRACT = 3  # list-typed configs only
