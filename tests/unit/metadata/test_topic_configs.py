"""Topic config checks and how alterations merge (pure: configs in, configs out).

Refusal messages are Kafka 4.3.1's (``LogConfig.validate`` on the same values gives them)."""

from __future__ import annotations

import re

import pytest

from kafscale import config as configuration
from kafscale.metadata import topic_configs
from kafscale.metadata.topic_config_table import Effect
from kafscale.metadata.topic_configs import CONFIGS, InvalidAlteration, InvalidTopicConfig
from kafscale.protocol.configs import AlterConfigOp, ConfigType

SET, DELETE, APPEND, SUBTRACT = AlterConfigOp
LONG_MAX = str(2**63 - 1)

# Kafka 4.3's topic configs in LogConfig's definition order, each with a valid value other than
# its default.
VALID = {
    "segment.bytes": "1048576",
    "segment.ms": "1",
    "segment.jitter.ms": "10",
    "segment.index.bytes": "4",
    "flush.messages": "1",
    "flush.ms": "0",
    "retention.bytes": "-5",  # no validator: any long, negative = no limit
    "retention.ms": "-1",
    "max.message.bytes": "0",
    "index.interval.bytes": "0",
    "delete.retention.ms": "0",
    "min.compaction.lag.ms": "100",
    "max.compaction.lag.ms": "100",
    "file.delete.delay.ms": "1000",
    "min.cleanable.dirty.ratio": "0.1",
    "cleanup.policy": "",
    "unclean.leader.election.enable": "TRUE",
    "min.insync.replicas": "2",
    "compression.type": "zstd",
    "compression.gzip.level": "9",
    "compression.lz4.level": "17",
    "compression.zstd.level": "-131072",
    "preallocate": "true",
    "message.timestamp.type": "LogAppendTime",
    "message.timestamp.before.max.ms": "0",
    "message.timestamp.after.max.ms": LONG_MAX,
    "leader.replication.throttled.replicas": "0:1,1:2",
    "follower.replication.throttled.replicas": "*",
    "remote.storage.enable": "false",
    "local.retention.ms": "-2",
    "local.retention.bytes": "1024",
    "remote.log.copy.disable": "false",
    "remote.log.delete.on.disable": "true",
}

DEFAULTS = {
    "segment.bytes": "1073741824",
    "segment.ms": "604800000",
    "segment.jitter.ms": "0",
    "segment.index.bytes": "10485760",
    "flush.messages": LONG_MAX,
    "flush.ms": LONG_MAX,
    "retention.bytes": "-1",
    "retention.ms": "604800000",
    "max.message.bytes": "1048588",
    "index.interval.bytes": "4096",
    "delete.retention.ms": "86400000",
    "min.compaction.lag.ms": "0",
    "max.compaction.lag.ms": LONG_MAX,
    "file.delete.delay.ms": "60000",
    "min.cleanable.dirty.ratio": "0.5",
    "cleanup.policy": "delete",
    "unclean.leader.election.enable": "false",
    "min.insync.replicas": "1",
    "compression.type": "producer",
    "compression.gzip.level": "-1",
    "compression.lz4.level": "9",
    "compression.zstd.level": "3",
    "preallocate": "false",
    "message.timestamp.type": "CreateTime",
    "message.timestamp.before.max.ms": LONG_MAX,
    "message.timestamp.after.max.ms": "3600000",
    "leader.replication.throttled.replicas": "",
    "follower.replication.throttled.replicas": "",
    "remote.storage.enable": "false",
    "local.retention.ms": "-2",
    "local.retention.bytes": "-2",
    "remote.log.copy.disable": "false",
    "remote.log.delete.on.disable": "false",
}

ENFORCED = {
    "cleanup.policy",
    "compression.type",
    "delete.retention.ms",
    "max.compaction.lag.ms",
    "min.cleanable.dirty.ratio",
    "min.compaction.lag.ms",
    "max.message.bytes",
    "message.timestamp.after.max.ms",
    "message.timestamp.before.max.ms",
    "message.timestamp.type",
    "retention.bytes",
    "retention.ms",
    "segment.bytes",
}


def test_the_table_is_kafka_4_3s_topic_configs_in_its_order() -> None:
    assert list(CONFIGS) == list(VALID)
    assert {name: c.default for name, c in CONFIGS.items()} == DEFAULTS
    assert {name for name, c in CONFIGS.items() if c.effect is Effect.ENFORCED} == ENFORCED
    assert all(c.kafscale for c in CONFIGS.values())  # each says what KafScale does, or why not
    assert CONFIGS["min.insync.replicas"].broker_name == "min.insync.replicas"
    assert CONFIGS["segment.ms"].broker_name == "log.roll.ms"
    assert CONFIGS["file.delete.delay.ms"].broker_name == "log.segment.delete.delay.ms"
    assert CONFIGS["min.cleanable.dirty.ratio"].type is ConfigType.DOUBLE
    assert CONFIGS["preallocate"].type is ConfigType.BOOLEAN
    no_broker_default = {name for name, c in CONFIGS.items() if c.broker_name is None}
    assert no_broker_default == {
        "leader.replication.throttled.replicas",
        "follower.replication.throttled.replicas",
        "remote.storage.enable",
        "remote.log.copy.disable",
        "remote.log.delete.on.disable",
    }


@pytest.mark.parametrize("name", list(VALID))
def test_every_config_accepts_its_default_and_a_valid_value(name: str) -> None:
    assert topic_configs.validate({name: DEFAULTS[name]}) == {name: DEFAULTS[name]}
    assert topic_configs.validate({name: VALID[name]}) == {name: VALID[name]}


def test_all_at_once_and_as_given() -> None:
    assert topic_configs.validate(VALID) == VALID
    # Stored as given; Kafka trims and parses before checking.
    assert topic_configs.validate({"min.insync.replicas": " +2 "}) == {
        "min.insync.replicas": " +2 "
    }


WRONG_TYPE = {
    ConfigType.INT: ("x", "Not a number of type INT"),
    ConfigType.LONG: ("1.5", "Not a number of type LONG"),
    ConfigType.DOUBLE: ("half", "Not a number of type DOUBLE"),
    ConfigType.BOOLEAN: ("yes", "Expected value to be either true or false"),
}


@pytest.mark.parametrize("name", [n for n, c in CONFIGS.items() if c.type in WRONG_TYPE])
def test_a_value_of_the_wrong_type_is_refused_with_kafkas_message(name: str) -> None:
    value, why = WRONG_TYPE[CONFIGS[name].type]
    with pytest.raises(InvalidTopicConfig) as caught:
        topic_configs.validate({name: value})
    assert str(caught.value) == f"Invalid value {value} for configuration {name}: {why}"


AT_LEAST = "Value must be at least"
NO_MORE = "Value must be no more than"


@pytest.mark.parametrize(
    ("name", "value", "why"),
    [
        ("segment.bytes", "1048575", f"{AT_LEAST} 1048576"),
        ("segment.bytes", str(2**31), "Not a number of type INT"),
        ("segment.ms", "0", f"{AT_LEAST} 1"),
        ("segment.jitter.ms", "-1", f"{AT_LEAST} 0"),
        ("segment.index.bytes", "3", f"{AT_LEAST} 4"),
        ("flush.messages", "0", f"{AT_LEAST} 1"),
        ("flush.ms", "-1", f"{AT_LEAST} 0"),
        ("retention.bytes", str(2**63), "Not a number of type LONG"),
        ("retention.ms", "-2", f"{AT_LEAST} -1"),
        ("max.message.bytes", "-1", f"{AT_LEAST} 0"),
        ("index.interval.bytes", "-1", f"{AT_LEAST} 0"),
        ("delete.retention.ms", "-1", f"{AT_LEAST} 0"),
        ("min.compaction.lag.ms", "-1", f"{AT_LEAST} 0"),
        ("max.compaction.lag.ms", "0", f"{AT_LEAST} 1"),
        ("file.delete.delay.ms", "-1", f"{AT_LEAST} 0"),
        ("min.cleanable.dirty.ratio", "1.5", f"{NO_MORE} 1"),
        ("min.cleanable.dirty.ratio", "-0.1", f"{AT_LEAST} 0"),
        ("cleanup.policy", "Delete", "String must be one of: compact, delete"),
        ("min.insync.replicas", "0", f"{AT_LEAST} 1"),
        (
            "compression.type",
            "GZIP",
            "String must be one of: uncompressed, zstd, lz4, snappy, gzip, producer",
        ),
        ("compression.gzip.level", "0", "Value must be between 1 and 9 or equal to -1"),
        ("compression.gzip.level", "10", "Value must be between 1 and 9 or equal to -1"),
        ("compression.lz4.level", "0", f"{AT_LEAST} 1"),
        ("compression.lz4.level", "18", f"{NO_MORE} 17"),
        ("compression.zstd.level", "23", f"{NO_MORE} 22"),
        ("compression.zstd.level", "-131073", f"{AT_LEAST} -131072"),
        (
            "message.timestamp.type",
            "createtime",
            "String must be one of: CreateTime, LogAppendTime",
        ),
        ("message.timestamp.before.max.ms", "-1", f"{AT_LEAST} 0"),
        ("message.timestamp.after.max.ms", "-1", f"{AT_LEAST} 0"),
        ("local.retention.ms", "-3", f"{AT_LEAST} -2"),
        ("local.retention.bytes", "-3", f"{AT_LEAST} -2"),
    ],
)
def test_an_invalid_value_is_refused_with_kafkas_message(name: str, value: str, why: str) -> None:
    with pytest.raises(InvalidTopicConfig) as caught:
        topic_configs.validate({name: value})
    assert str(caught.value) == f"Invalid value {value} for configuration {name}: {why}"


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        # Kafka shows the parsed value: a double as Java writes it, a list as Java's List does.
        (
            "min.cleanable.dirty.ratio",
            "2",
            f"Invalid value 2.0 for configuration min.cleanable.dirty.ratio: {NO_MORE} 1",
        ),
        (
            "segment.bytes",
            " +1048575 ",
            f"Invalid value 1048575 for configuration segment.bytes: {AT_LEAST} 1048576",
        ),
        ("cleanup.policy", "delete,", "Configuration 'cleanup.policy' values must not be empty."),
        (
            "leader.replication.throttled.replicas",
            "0:1,*",
            "Invalid value [0:1, *] for configuration leader.replication.throttled.replicas: "
            "leader.replication.throttled.replicas must be the literal '*' or a list of replicas "
            "in the following format: [partitionId]:[brokerId],[partitionId]:[brokerId],...",
        ),
        (
            "follower.replication.throttled.replicas",
            "abc",
            "Invalid value [abc] for configuration follower.replication.throttled.replicas: "
            "follower.replication.throttled.replicas must be the literal '*' or a list of "
            "replicas in the following format: "
            "[partitionId]:[brokerId],[partitionId]:[brokerId],...",
        ),
    ],
)
def test_refusals_show_the_value_as_kafka_parsed_it(name: str, value: str, message: str) -> None:
    with pytest.raises(InvalidTopicConfig) as caught:
        topic_configs.validate({name: value})
    assert str(caught.value) == message


def test_values_are_checked_in_kafkas_order() -> None:
    # min.insync.replicas comes before preallocate in LogConfig, whatever the request's order.
    with pytest.raises(InvalidTopicConfig, match=r"configuration preallocate:"):
        topic_configs.validate({"preallocate": "x", "min.insync.replicas": "1"})
    with pytest.raises(InvalidTopicConfig, match=r"configuration min\.insync\.replicas:"):
        topic_configs.validate({"preallocate": "x", "min.insync.replicas": "0"})


@pytest.mark.parametrize(
    "name",
    [
        "nope",
        # Removed in Kafka 4, which refuses them as unknown.
        "message.format.version",
        "message.downconversion.enable",
        "message.timestamp.difference.max.ms",
    ],
)
def test_names_kafka_does_not_define_are_unknown(name: str) -> None:
    with pytest.raises(InvalidTopicConfig) as caught:
        topic_configs.validate({"retention.ms": "-2", name: "1"})  # names before values
    assert str(caught.value) == f"Unknown topic config name: {name}"


def test_an_empty_cleanup_policy_is_valid_and_effective() -> None:
    defaults = topic_configs.defaults(configuration.load({}))
    assert topic_configs.validate({"cleanup.policy": ""}) == {"cleanup.policy": ""}
    assert topic_configs.validate({"cleanup.policy": "  "}) == {"cleanup.policy": "  "}
    assert topic_configs.effective({"cleanup.policy": ""}, defaults)["cleanup.policy"] == ""
    assert topic_configs.effective({"cleanup.policy": " "}, defaults)["cleanup.policy"] == ""
    assert topic_configs.effective({}, defaults)["cleanup.policy"] == "delete"


@pytest.mark.parametrize("policy", ["compact", "delete,compact", "compact,delete", " compact "])
def test_compaction_is_a_policy_like_delete(policy: str) -> None:
    assert topic_configs.validate({"cleanup.policy": policy}) == {"cleanup.policy": policy}
    with pytest.raises(InvalidTopicConfig, match=r"cleanup\.policy"):
        topic_configs.validate({"cleanup.policy": policy + ",shred"})


def test_the_minimum_compaction_lag_may_not_exceed_the_maximum() -> None:
    lags = {"min.compaction.lag.ms": "10", "max.compaction.lag.ms": "5"}
    with pytest.raises(InvalidTopicConfig) as caught:
        topic_configs.validate(lags)
    assert str(caught.value) == (
        "conflict topic config setting min.compaction.lag.ms (10) > max.compaction.lag.ms (5)"
    )
    assert topic_configs.validate({"min.compaction.lag.ms": LONG_MAX})  # the default maximum
    with pytest.raises(InvalidTopicConfig, match="conflict"):
        topic_configs.altered(
            {"min.compaction.lag.ms": "10"}, [("max.compaction.lag.ms", SET, "9")]
        )


def test_defaults_take_segment_bytes_from_the_broker() -> None:
    broker = configuration.load({"KAFSCALE_SEGMENT_BYTES": "8MiB"})
    defaults = topic_configs.defaults(broker)
    assert defaults == DEFAULTS | {"segment.bytes": str(8 * 1024 * 1024)}
    assert topic_configs.effective({"retention.ms": "5"}, defaults) == {
        **defaults,
        "retention.ms": "5",
    }


def test_effective_values_are_kafkas_parsed_form() -> None:
    defaults = topic_configs.defaults(configuration.load({}))
    effective = topic_configs.effective(
        {
            "max.message.bytes": " +100 ",
            "compression.type": " gzip ",
            "preallocate": "TRUE",
            "cleanup.policy": " delete ",
            "min.cleanable.dirty.ratio": "0.25d",
        },
        defaults,
    )
    assert effective["max.message.bytes"] == "100"
    assert effective["compression.type"] == "gzip"
    assert effective["preallocate"] == "true"
    assert effective["cleanup.policy"] == "delete"
    assert effective["min.cleanable.dirty.ratio"] == "0.25"


def test_replaced_is_exactly_the_named_configs() -> None:
    assert topic_configs.replaced([("retention.ms", "5"), ("segment.bytes", None)]) == {
        "retention.ms": "5"
    }
    assert topic_configs.replaced([]) == {}
    with pytest.raises(InvalidAlteration, match=re.escape("duplicate config keys: retention.ms")):
        topic_configs.replaced([("retention.ms", "5"), ("retention.ms", "6")])


def test_altered_applies_set_and_delete_to_the_current_configs() -> None:
    current = {"retention.ms": "5", "max.message.bytes": "100"}
    changes = [("retention.ms", DELETE, None), ("segment.bytes", SET, "1048576")]
    assert topic_configs.altered(current, changes) == {
        "max.message.bytes": "100",
        "segment.bytes": "1048576",
    }
    assert current == {"retention.ms": "5", "max.message.bytes": "100"}  # not mutated
    assert topic_configs.altered(current, [("retention.bytes", DELETE, None)]) == current
    assert topic_configs.altered({}, [("min.insync.replicas", SET, "2")]) == {
        "min.insync.replicas": "2"
    }


def test_append_and_subtract_work_on_lists_from_the_default() -> None:
    # cleanup.policy's default is "delete".
    assert topic_configs.altered({}, [("cleanup.policy", APPEND, "delete")]) == {
        "cleanup.policy": "delete"
    }
    assert topic_configs.altered({}, [("cleanup.policy", APPEND, "compact")]) == {
        "cleanup.policy": "delete,compact"
    }
    assert topic_configs.altered({}, [("cleanup.policy", SUBTRACT, "compact")]) == {
        "cleanup.policy": "delete"
    }
    throttled = "leader.replication.throttled.replicas"
    assert topic_configs.altered({throttled: "0:1"}, [(throttled, APPEND, "1:1,0:1")]) == {
        throttled: "0:1,1:1"
    }


def test_subtracting_the_last_policy_leaves_it_empty_and_valid() -> None:
    assert topic_configs.altered({}, [("cleanup.policy", SUBTRACT, "delete")]) == {
        "cleanup.policy": ""
    }
    emptied = {"cleanup.policy": ""}
    assert topic_configs.altered(emptied, [("cleanup.policy", SUBTRACT, "delete")]) == emptied
    assert topic_configs.altered(emptied, [("cleanup.policy", APPEND, "delete")]) == {
        "cleanup.policy": "delete"
    }


def test_append_to_a_non_list_config_is_an_invalid_config() -> None:
    with pytest.raises(InvalidTopicConfig, match=re.escape("Can't APPEND to key retention.ms")):
        topic_configs.altered({}, [("retention.ms", APPEND, "5")])
    with pytest.raises(
        InvalidTopicConfig, match=re.escape("Can't SUBTRACT to key compression.type")
    ):
        topic_configs.altered({}, [("compression.type", SUBTRACT, "gzip")])


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ([("retention.ms", SET, None)], "Null value not supported for : retention.ms"),
        ([("cleanup.policy", APPEND, None)], "Null value"),
        ([("retention.ms", 7, "1")], "unknown operation 7"),
        ([("retention.ms", SET, "1"), ("retention.ms", SET, "2")], "duplicate config keys"),
    ],
)
def test_malformed_alterations(changes: list[tuple[str, int, str | None]], match: str) -> None:
    with pytest.raises(InvalidAlteration, match=re.escape(match)):
        topic_configs.altered({}, changes)


def test_remote_storage_is_refused_as_kafka_refuses_it_with_tiering_off() -> None:
    with pytest.raises(topic_configs.InvalidTopicConfig, match="Tiered Storage functionality"):
        topic_configs.validate({"remote.storage.enable": "true"})
    assert topic_configs.validate({"remote.storage.enable": "FALSE"}) == {
        "remote.storage.enable": "FALSE"
    }
