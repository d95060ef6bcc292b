"""The consumer's embedded protocol, against bytes another implementation writes (aiokafka's
v0 structs) and the layouts of Kafka's later versions built by hand."""

from __future__ import annotations

import contextlib
import struct

import pytest
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)
from hypothesis import given
from hypothesis import strategies as st

from kafscale.protocol.consumer_protocol import (
    Assignment,
    Subscription,
    UndecodableProtocol,
    decode_assignment,
    decode_subscription,
    encode_assignment,
)


def string(value: str) -> bytes:
    raw = value.encode()
    return struct.pack(">h", len(raw)) + raw


def partitions(owned: dict[str, list[int]]) -> bytes:
    out = struct.pack(">i", len(owned))
    for topic, numbers in owned.items():
        out += string(topic) + struct.pack(">i", len(numbers))
        out += b"".join(struct.pack(">i", n) for n in numbers)
    return out


def test_a_v0_subscription_as_aiokafka_writes_it() -> None:
    data = ConsumerProtocolMemberMetadata(0, ["orders", "clicks"], b"sticky").encode()
    assert decode_subscription(data) == Subscription(("orders", "clicks"), b"sticky")


def test_owned_partitions_generation_and_rack_of_later_versions() -> None:
    topics = struct.pack(">i", 1) + string("orders")
    no_user_data = struct.pack(">i", -1)
    owned = partitions({"orders": [0, 2]})
    v1 = struct.pack(">h", 1) + topics + no_user_data + owned
    v3 = struct.pack(">h", 3) + topics + no_user_data + owned + struct.pack(">i", 7) + string("r1")
    assert decode_subscription(v1) == Subscription(("orders",), None, {"orders": (0, 2)})
    assert decode_subscription(v3) == Subscription(("orders",), None, {"orders": (0, 2)}, 7, "r1")
    # a version from the future is read as the latest known, its extra fields ignored
    v9 = struct.pack(">h", 9) + v3[2:] + b"\x01\x02\x03"
    assert decode_subscription(v9) == decode_subscription(v3)


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_an_assignment_written_here_is_read_by_aiokafka(version: int) -> None:
    data = encode_assignment({"orders": (2, 0), "clicks": (1,)}, version)
    read = ConsumerProtocolMemberAssignment.decode(data)
    assert read.version == version
    assert sorted(read.partitions()) == sorted(
        [("clicks", 1), ("orders", 0), ("orders", 2)]  # type: ignore[list-item]
    )
    assert decode_assignment(data) == Assignment({"clicks": (1,), "orders": (0, 2)})


def test_an_assignment_as_aiokafka_writes_it_and_the_empty_one() -> None:
    data = ConsumerProtocolMemberAssignment(0, [("orders", [3, 1])], b"").encode()
    assert decode_assignment(data) == Assignment({"orders": (3, 1)}, b"")
    assert decode_assignment(b"") == Assignment({})  # the leader gave this member nothing


@pytest.mark.parametrize("data", [b"", b"\x00", b"\xff\xff", b"\x00\x00\x00\x00\x00\x05ab"])
def test_garbage_is_undecodable(data: bytes) -> None:
    with pytest.raises(UndecodableProtocol):
        decode_subscription(data)


@given(st.binary(max_size=64))
def test_any_bytes_decode_or_raise_undecodable(data: bytes) -> None:
    for decode in (decode_subscription, decode_assignment):
        with contextlib.suppress(UndecodableProtocol):
            decode(data)
