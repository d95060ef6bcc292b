"""Kafka's config value parsing and validators. The expected results and messages are what
Kafka 4.3.1's ``ConfigDef`` gives for the same strings (checked against its jar)."""

from __future__ import annotations

import math
import re

import pytest

from kafscale.metadata import config_values as v
from kafscale.metadata.config_values import InvalidConfig
from kafscale.protocol.configs import ConfigType

INT, LONG, DOUBLE = ConfigType.INT, ConfigType.LONG, ConfigType.DOUBLE
BOOLEAN, STRING, LIST = ConfigType.BOOLEAN, ConfigType.STRING, ConfigType.LIST


@pytest.mark.parametrize(
    ("raw", "kind", "parsed"),
    [
        (" 2 ", INT, 2),
        ("\t5\n", INT, 5),
        ("+2", INT, 2),
        ("-5", INT, -5),
        ("\uff12", INT, 2),  # a fullwidth digit: Java's Character.digit takes it too
        (str(2**31 - 1), INT, 2**31 - 1),
        (str(-(2**31)), INT, -(2**31)),
        (str(2**63 - 1), LONG, 2**63 - 1),
        ("TRUE", BOOLEAN, True),
        (" False ", BOOLEAN, False),
        ("tRuE", BOOLEAN, True),
        ("0.5", DOUBLE, 0.5),
        ("0.5d", DOUBLE, 0.5),
        ("+0.5", DOUBLE, 0.5),
        (".5", DOUBLE, 0.5),
        ("1e-1", DOUBLE, 0.1),
        ("1", DOUBLE, 1.0),
        ("0x1p-1", DOUBLE, 0.5),
        ("Infinity", DOUBLE, math.inf),
        (" CreateTime ", STRING, "CreateTime"),
        ("", LIST, ()),
        ("  ", LIST, ()),
        (" delete , compact ", LIST, ("delete", "compact")),
        ("delete,", LIST, ("delete", "")),
        (",", LIST, ("", "")),
    ],
)
def test_parse_as_kafka(raw: str, kind: ConfigType, parsed: v.Value) -> None:
    assert v.parse("c", raw, kind) == parsed


def test_nan_parses_and_passes_a_range_as_in_java() -> None:
    value = v.parse("c", "NaN", DOUBLE)
    assert isinstance(value, float) and math.isnan(value)
    v.between(0, 1)("c", value)


@pytest.mark.parametrize(
    ("raw", "kind", "why"),
    [
        ("abc", INT, "Not a number of type INT"),
        ("1_0", INT, "Not a number of type INT"),
        ("", INT, "Not a number of type INT"),
        ("\u00a05", INT, "Not a number of type INT"),  # no-break space: String.trim keeps it
        (str(2**31), INT, "Not a number of type INT"),
        (str(2**63), LONG, "Not a number of type LONG"),
        ("1.0", LONG, "Not a number of type LONG"),
        ("yes", BOOLEAN, "Expected value to be either true or false"),
        ("1", BOOLEAN, "Expected value to be either true or false"),
        ("", BOOLEAN, "Expected value to be either true or false"),
        ("x", DOUBLE, "Not a number of type DOUBLE"),
        ("inf", DOUBLE, "Not a number of type DOUBLE"),
        ("1_0.5", DOUBLE, "Not a number of type DOUBLE"),
    ],
)
def test_parse_refusals(raw: str, kind: ConfigType, why: str) -> None:
    with pytest.raises(InvalidConfig) as caught:
        v.parse("c", raw, kind)
    assert str(caught.value) == f"Invalid value {raw} for configuration c: {why}"


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (True, "true"),
        (5, "5"),
        (0.5, "0.5"),
        (2.0, "2.0"),
        (1e10, "1.0E10"),
        (-1e-5, "-1.0E-5"),
        (12345678.0, "1.2345678E7"),
        (1234567.0, "1234567.0"),
        (0.001, "0.001"),
        (1e-4, "1.0E-4"),
        (-0.0, "-0.0"),
        (math.inf, "Infinity"),
        (("delete", "compact"), "delete,compact"),
        ((), ""),
    ],
)
def test_text_is_javas(value: v.Value, text: str) -> None:
    assert v.text(value) == text


def check(validator: v.Validator, value: v.Value) -> str | None:
    """The message ``validator`` refuses ``value`` with, None if it takes it."""
    try:
        validator("c", value)
    except InvalidConfig as exc:
        return str(exc)
    return None


def test_ranges() -> None:
    assert check(v.at_least(1), 1) is None
    assert (
        check(v.at_least(1), 0) == "Invalid value 0 for configuration c: Value must be at least 1"
    )
    assert check(v.between(0, 1), 2.0) == (
        "Invalid value 2.0 for configuration c: Value must be no more than 1"
    )
    assert check(v.between(0, 1), -math.inf) == (
        "Invalid value -Infinity for configuration c: Value must be at least 0"
    )


def test_valid_string_and_list() -> None:
    assert check(v.valid_string("a", "b"), "A") == (
        "Invalid value A for configuration c: String must be one of: a, b"
    )
    policies = v.valid_list("compact", "delete")
    assert check(policies, ()) is None
    assert check(policies, ("delete", "delete")) is None
    assert check(policies, ("Delete",)) == (
        "Invalid value Delete for configuration c: String must be one of: compact, delete"
    )
    # Items in order: an empty one before a bad one is the empty one's error.
    assert check(policies, ("delete", "", "nope")) == "Configuration 'c' values must not be empty."
    assert check(policies, ("nope", "")) == (
        "Invalid value nope for configuration c: String must be one of: compact, delete"
    )


@pytest.mark.parametrize(
    ("raw", "ok"),
    [
        ("", True),
        ("*", True),
        ("0:1,1:2", True),
        ("0:1,", True),  # an empty item is allowed
        ("*,", True),  # the items joined are "*"
        ("0:1,*", False),
        ("*,*", False),
        ("abc", False),
        (" 0 : 1 ", False),
    ],
)
def test_throttled_replicas(raw: str, ok: bool) -> None:
    message = check(v.throttled_replicas, v.parse("c", raw, LIST))
    if ok:
        assert message is None
    else:
        assert message is not None
        assert re.fullmatch(
            r"Invalid value \[.*\] for configuration c: c must be the literal '\*' or a list of "
            r"replicas in the following format: \[partitionId\]:\[brokerId\],"
            r"\[partitionId\]:\[brokerId\],\.\.\.",
            message,
        )


@pytest.mark.parametrize(
    ("level", "ok"), [(-1, True), (1, True), (9, True), (0, False), (10, False), (-2, False)]
)
def test_gzip_level(level: int, ok: bool) -> None:
    message = check(v.gzip_level, level)
    if ok:
        assert message is None
    else:
        assert message == (
            f"Invalid value {level} for configuration c: Value must be between 1 and 9 or "
            "equal to -1"
        )
