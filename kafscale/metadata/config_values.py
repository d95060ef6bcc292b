"""Kafka's config values: how a string becomes a typed value and which values a validator takes.

Pure, and exact to Kafka 4.3's ``ConfigDef``, so that a value Kafka accepts is accepted here and a
refused one gets Kafka's message (``Invalid value X for configuration Y: why``):

- ``parse`` is ``ConfigDef.parseType``: the string is trimmed as Java's ``String.trim`` trims
  (every character up to U+0020); INT and LONG are ``Integer.parseInt``/``Long.parseLong`` (a sign,
  decimal digits, within range: else "Not a number of type INT"); BOOLEAN is ``true``/``false`` in
  any case; DOUBLE is ``Double.parseDouble`` (``0.5d``, ``1e-1``, ``NaN`` and hex floats included);
  LIST splits on commas with the whitespace around them, and an empty string is an empty list.
- The validators are Kafka's: ``Range.atLeast``/``between``, ``ValidString.in``, ``ValidList.in``
  (4.3: an empty list is valid, an empty item is not), the throttled-replicas list and the gzip
  level's ``[1,...,9] or -1``.
- ``text`` is ``ConfigDef.convertToString``: the value as Kafka shows a parsed one.
"""

from __future__ import annotations

import decimal
import math
import re
from collections.abc import Callable

from kafscale.protocol.configs import ConfigType

Value = bool | int | float | str | tuple[str, ...]
Validator = Callable[[str, Value], None]  # (config name, parsed value); raises InvalidConfig

_BOUNDS = {
    ConfigType.SHORT: (-(2**15), 2**15 - 1),
    ConfigType.INT: (-(2**31), 2**31 - 1),
    ConfigType.LONG: (-(2**63), 2**63 - 1),
}
_JAVA_WHITESPACE = "".join(map(chr, range(0x21)))  # what String.trim removes
_INTEGER = re.compile(r"[+-]?\d+")  # Character.digit takes any Unicode decimal digit, as \d does
_DIGITS = r"[0-9]+"
_HEX = r"[0-9a-fA-F]+"
# Double.valueOf's grammar (FloatingDecimal.readJavaFormatString): ASCII digits only.
_DOUBLE = re.compile(
    rf"[+-]?(?:NaN|Infinity|"
    rf"(?:(?:{_DIGITS}\.?(?:{_DIGITS})?|\.{_DIGITS})(?:[eE][+-]?{_DIGITS})?"
    rf"|0[xX](?:{_HEX}\.?|(?:{_HEX})?\.{_HEX})[pP][+-]?{_DIGITS})[fFdD]?)"
)
_LIST_SEPARATOR = re.compile(r"[ \t\n\x0b\f\r]*,[ \t\n\x0b\f\r]*")  # Java's \s*,\s*
_REPLICA = re.compile(r"(?:[0-9]+:[0-9]+)?")


class InvalidConfig(ValueError):
    """A config value Kafka refuses; the message is Kafka's."""


def invalid(name: str, value: object, why: str) -> InvalidConfig:
    """Kafka's ``ConfigException(name, value, message)``."""
    return InvalidConfig(f"Invalid value {value} for configuration {name}: {why}")


def parse(name: str, raw: str, kind: ConfigType) -> Value:
    """``raw`` as a value of ``kind``; raises InvalidConfig as ``ConfigDef.parseType`` does."""
    trimmed = raw.strip(_JAVA_WHITESPACE)
    if kind is ConfigType.BOOLEAN:
        if trimmed.lower() in ("true", "false"):
            return trimmed.lower() == "true"
        raise invalid(name, raw, "Expected value to be either true or false")
    if kind in _BOUNDS:
        low, high = _BOUNDS[kind]
        if _INTEGER.fullmatch(trimmed) and low <= (number := int(trimmed)) <= high:
            return number
        raise invalid(name, raw, f"Not a number of type {kind.name}")
    if kind is ConfigType.DOUBLE:
        if _DOUBLE.fullmatch(trimmed):
            return _java_double(trimmed)
        raise invalid(name, raw, f"Not a number of type {kind.name}")
    if kind is ConfigType.LIST:
        return tuple(_LIST_SEPARATOR.split(trimmed)) if trimmed else ()
    return trimmed


def text(value: Value) -> str:
    """A parsed value as Kafka writes it (``ConfigDef.convertToString``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return java_double_text(value)
    if isinstance(value, tuple):
        return ",".join(value)
    return str(value)


def at_least(low: int) -> Validator:
    """``Range.atLeast``."""
    return between(low, None)


def between(low: int, high: int | None) -> Validator:
    """``Range.between`` (``high`` None: no upper bound). NaN passes, as in Java."""

    def check(name: str, value: Value) -> None:
        assert isinstance(value, int | float)
        if value < low:
            raise invalid(name, text(value), f"Value must be at least {low}")
        if high is not None and value > high:
            raise invalid(name, text(value), f"Value must be no more than {high}")

    return check


def valid_string(*choices: str) -> Validator:
    """``ValidString.in``: case-sensitive."""

    def check(name: str, value: Value) -> None:
        if value not in choices:
            raise invalid(name, value, f"String must be one of: {', '.join(choices)}")

    return check


def valid_list(*choices: str) -> Validator:
    """``ValidList.in`` of Kafka 4.3 (KIP-1161): the empty list is valid; each item, in order,
    must be non-empty and one of ``choices``."""
    one_of = valid_string(*choices)

    def check(name: str, value: Value) -> None:
        assert isinstance(value, tuple)
        for item in value:
            if not item:
                raise InvalidConfig(f"Configuration '{name}' values must not be empty.")
            one_of(name, item)

    return check


def throttled_replicas(name: str, value: Value) -> None:
    """``ThrottledReplicaListValidator``: ``*``, or ``partition:broker`` items (empty ones
    allowed)."""
    assert isinstance(value, tuple)
    items = [item.strip(_JAVA_WHITESPACE) for item in value]
    if all(_REPLICA.fullmatch(item) for item in items) or "".join(items) == "*":
        return
    raise invalid(
        name,
        f"[{', '.join(value)}]",  # Java's List.toString
        f"{name} must be the literal '*' or a list of replicas in the following format: "
        "[partitionId]:[brokerId],[partitionId]:[brokerId],...",
    )


def gzip_level(name: str, value: Value) -> None:
    """``CompressionType.GZIP.levelValidator``: 1 to 9, or -1 (zlib's default)."""
    assert isinstance(value, int)
    if value > 9 or (value < 1 and value != -1):
        raise invalid(name, value, "Value must be between 1 and 9 or equal to -1")


def _java_double(literal: str) -> float:
    body = literal.rstrip("fFdD")  # a Java float suffix; NaN and Infinity end otherwise
    if "x" in body or "X" in body:
        return float.fromhex(body)
    return float(body)  # Python reads NaN, Infinity and the decimal forms alike


def java_double_text(number: float) -> str:
    """``Double.toString``: the shortest digits that read back (as ``repr``), written plain
    between 10^-3 and 10^7 and as ``d.dddE±n`` outside."""
    if math.isnan(number):
        return "NaN"
    if math.isinf(number):
        return "Infinity" if number > 0 else "-Infinity"
    sign = "-" if math.copysign(1.0, number) < 0 else ""
    if number == 0:
        return sign + "0.0"
    _, digit_tuple, exponent = decimal.Decimal(repr(abs(number))).as_tuple()
    assert isinstance(exponent, int)
    digits = "".join(map(str, digit_tuple)).rstrip("0")
    point = len(digit_tuple) + exponent  # number = 0.<digits> x 10^point
    if 1e-3 <= abs(number) < 1e7:
        if point <= 0:
            return f"{sign}0.{'0' * -point}{digits}"
        whole = digits[:point].ljust(point, "0")
        return f"{sign}{whole}.{digits[point:] or '0'}"
    return f"{sign}{digits[0]}.{digits[1:] or '0'}E{point - 1}"
