"""A group's __consumer_offsets partition, pinned against values computed by Java itself
(``String.hashCode`` and Kafka's ``Utils.abs(h) % n``, run with OpenJDK 17)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafscale.metadata.group_partition import (
    INT_MIN,
    group_partition,
    java_string_hashcode,
    kafka_abs,
)

# (group id, String.hashCode, partition of 50, partition of 7): printed by a Java program.
JAVA = [
    ("", 0, 0, 0),
    ("a", 97, 47, 6),
    ("hello", 99162322, 22, 0),
    ("group-1", 293427299, 49, 4),
    ("polygenelubricants", -2147483648, 0, 0),  # Integer.MIN_VALUE: Utils.abs makes it 0
    ("consumer-group-été", -2557895, 45, 4),
    ("\U0001f600", 1772899, 49, 2),  # one code point, two UTF-16 code units
    ("Gruppe üö", 1408329823, 23, 5),
    ("my-app.orders.v2", -417223625, 25, 0),
]


@pytest.mark.parametrize(("group_id", "hashcode", "of_50", "of_7"), JAVA)
def test_partitions_match_kafka(group_id: str, hashcode: int, of_50: int, of_7: int) -> None:
    assert java_string_hashcode(group_id) == hashcode
    assert group_partition(group_id, 50) == of_50
    assert group_partition(group_id, 7) == of_7


def test_kafka_abs_maps_the_smallest_int_to_zero() -> None:
    assert kafka_abs(INT_MIN) == 0
    assert kafka_abs(INT_MIN + 1) == 2**31 - 1
    assert kafka_abs(-5) == 5


def test_a_topic_without_partitions_has_no_group_partition() -> None:
    with pytest.raises(ValueError, match="no partitions"):
        group_partition("g", 0)


@given(st.text(), st.integers(min_value=1, max_value=1000))
def test_every_group_lands_on_a_partition(group_id: str, partitions: int) -> None:
    assert 0 <= group_partition(group_id, partitions) < partitions
    assert INT_MIN <= java_string_hashcode(group_id) < 2**31
