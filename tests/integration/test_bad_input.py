"""Bad input gets the right answer, loses nothing, and leaves every other client unaffected."""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import pytest
from kio.index import load_request_schema, load_response_schema

from kafscale.protocol import codec
from kafscale.protocol.errors import ErrorCode

from .wire import Wire

pytestmark = pytest.mark.integration

METADATA_V12 = load_response_schema(3, 12)


def metadata_request() -> Any:
    return codec.build(
        load_request_schema(3, 12),
        topics=None,
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )


def assert_serves(address: tuple[str, int], bystander: Wire) -> None:
    """A connection opened before the bad input, and a new one, are both answered."""
    for wire in (bystander, Wire(address)):
        wire.send(metadata_request(), correlation_id=123)
        correlation_id, response = wire.read_response(METADATA_V12)
        assert correlation_id == 123
        assert [b.port for b in response.brokers] == [address[1]]
    bystander.send(metadata_request(), correlation_id=124)
    assert bystander.read_response(METADATA_V12)[0] == 124


def test_bad_input_is_answered_or_closed_and_others_keep_working(
    start_broker: Callable[..., Any],
) -> None:
    broker = start_broker(env={"KAFSCALE_MAX_REQUEST_BYTES": "1MiB"})
    broker.wait_ready()
    address = ("127.0.0.1", broker.port)
    bystander = Wire(address)

    closing_inputs = {
        "negative frame size": struct.pack(">i", -5),
        "frame over the limit": struct.pack(">i", 1024 * 1024 + 1) + b"x" * 100,
        "garbage bytes": b"GET / HTTP/1.1\r\nHost: kafka\r\n\r\n",
        "unknown API key": _frame(struct.pack(">hhi", 4242, 0, 9) + b"\x00\x00"),
        "version Kafka never defined": _frame(struct.pack(">hhi", 3, 400, 9) + b"\x00\x00"),
        "body that does not parse": _frame(struct.pack(">hhi", 3, 12, 9) + b"\xff" * 3),
    }
    for reason, data in closing_inputs.items():
        with Wire(address) as wire:
            wire.send_raw(data)
            assert wire.is_closed_by_peer(), reason
        assert_serves(address, bystander)
    log = broker.log_text()
    for expected in ("exceeds the maximum", "below the", "unknown API key 4242", "has no version"):
        assert expected in log

    # An unsupported version of an API we serve: an error response, the connection stays.
    with Wire(address) as wire:
        request = codec.build(
            load_request_schema(3, 13),
            topics=None,
            allow_auto_topic_creation=False,
            include_topic_authorized_operations=False,
        )
        wire.send(request, correlation_id=31)
        correlation_id, response = wire.read_response(load_response_schema(3, 13))
        assert (correlation_id, response.error_code) == (31, ErrorCode.unsupported_version)
        # An API not implemented at all (DescribeDelegationToken v1): error response, the
        # connection stays.
        wire.send(codec.build(load_request_schema(41, 1), owners=None), correlation_id=32)
        correlation_id, response = wire.read_response(load_response_schema(41, 1))
        assert (correlation_id, response.error_code) == (32, ErrorCode.unsupported_version)
        # ApiVersions newer than ours: the v0 answer (KIP-511), connection stays.
        wire.send_raw(_frame(struct.pack(">hhi", 18, 99, 33) + b"\x00"))
        correlation_id, response = wire.read_response(load_response_schema(18, 0))
        assert (correlation_id, response.error_code) == (33, ErrorCode.unsupported_version)
        wire.send(metadata_request(), correlation_id=34)
        assert wire.read_response(METADATA_V12)[0] == 34
    assert_serves(address, bystander)


def test_pipelined_requests_are_answered_in_order(start_broker: Callable[..., Any]) -> None:
    broker = start_broker()
    broker.wait_ready()
    api_versions = codec.build(
        load_request_schema(18, 3), client_software_name="t", client_software_version="1"
    )
    with Wire(("127.0.0.1", broker.port)) as wire:
        frames = b""
        for correlation_id in range(200):
            request = metadata_request() if correlation_id % 2 else api_versions
            frame = _request_bytes(request, correlation_id)
            frames += frame
        wire.send_raw(frames)  # all 200 in one write: the broker sees them pipelined
        for correlation_id in range(200):
            schema = METADATA_V12 if correlation_id % 2 else load_response_schema(18, 3)
            assert wire.read_response(schema)[0] == correlation_id


def test_a_frame_split_across_many_writes_is_reassembled(start_broker: Callable[..., Any]) -> None:
    broker = start_broker()
    broker.wait_ready()
    with Wire(("127.0.0.1", broker.port)) as wire:
        data = _request_bytes(metadata_request(), 77)
        for i in range(len(data)):
            wire.send_raw(data[i : i + 1])
        assert wire.read_response(METADATA_V12)[0] == 77


def _frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def _request_bytes(request: Any, correlation_id: int) -> bytes:
    from tests.unit.protocol.test_codec import request_frame

    return _frame(request_frame(request, correlation_id))
