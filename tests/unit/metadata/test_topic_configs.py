"""Topic config checks and how alterations merge (pure: configs in, configs out)."""

from __future__ import annotations

import re

import pytest

from kafscale import config as configuration
from kafscale.metadata import topic_configs
from kafscale.metadata.topic_configs import InvalidAlteration, InvalidTopicConfig
from kafscale.protocol.configs import AlterConfigOp

SET, DELETE, APPEND, SUBTRACT = AlterConfigOp


def test_defaults_take_segment_bytes_from_the_broker() -> None:
    broker = configuration.load({"KAFSCALE_SEGMENT_BYTES": "8MiB"})
    defaults = topic_configs.defaults(broker)
    assert defaults["segment.bytes"] == str(8 * 1024 * 1024)
    assert defaults["max.message.bytes"] == "1048588"
    assert topic_configs.effective({"retention.ms": "5"}, defaults) == {
        "cleanup.policy": "delete",
        "compression.type": "producer",
        "max.message.bytes": "1048588",
        "message.timestamp.after.max.ms": "3600000",
        "message.timestamp.before.max.ms": str(2**63 - 1),
        "message.timestamp.type": "CreateTime",
        "retention.bytes": "-1",
        "retention.ms": "5",
        "segment.bytes": "8388608",
    }


@pytest.mark.parametrize(
    ("name", "value", "ok"),
    [
        ("segment.bytes", "1048576", True),  # Kafka 4's minimum (KIP-1030)
        ("segment.bytes", "1048575", False),
        ("segment.bytes", str(2**31 - 1), True),
        ("segment.bytes", str(2**31), False),
        ("max.message.bytes", "0", True),
        ("max.message.bytes", "-1", False),
        ("retention.ms", "-1", True),
        ("retention.ms", "-2", False),
        ("retention.bytes", "x", False),
        ("compression.type", "zstd", True),
        ("compression.type", "brotli", False),
        ("message.timestamp.type", "LogAppendTime", True),
        ("message.timestamp.after.max.ms", "0", True),
        ("message.timestamp.after.max.ms", "-1", False),
        ("message.timestamp.before.max.ms", str(2**63 - 1), True),
        ("message.timestamp.before.max.ms", str(2**63), False),
        ("cleanup.policy", "compact", False),
    ],
)
def test_value_checks(name: str, value: str, ok: bool) -> None:
    if ok:
        assert topic_configs.validate({name: value}) == {name: value}
    else:
        with pytest.raises(InvalidTopicConfig, match=re.escape(name)):
            topic_configs.validate({name: value})


def test_unknown_and_unsupported_names_are_named() -> None:
    with pytest.raises(InvalidTopicConfig, match="unknown topic config name: nope"):
        topic_configs.validate({"nope": "1"})
    with pytest.raises(
        InvalidTopicConfig, match=re.escape("segment.ms is not supported by KafScale")
    ):
        topic_configs.validate({"segment.ms": "1"})


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


def test_append_and_subtract_work_on_lists_from_the_default() -> None:
    # cleanup.policy is the one list-typed config; its default is "delete".
    assert topic_configs.altered({}, [("cleanup.policy", APPEND, "delete")]) == {
        "cleanup.policy": "delete"
    }
    with pytest.raises(InvalidTopicConfig, match="'delete,compact' is not one of delete"):
        topic_configs.altered({}, [("cleanup.policy", APPEND, "compact")])
    with pytest.raises(InvalidTopicConfig, match=re.escape("cleanup.policy")):
        topic_configs.altered({}, [("cleanup.policy", SUBTRACT, "delete")])
    assert topic_configs.altered({}, [("cleanup.policy", SUBTRACT, "compact")]) == {
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
