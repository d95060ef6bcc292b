import contextlib
import struct
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kio.index import load_request_schema
from kio.schema.index import api_key_map, schema_name_map
from kio.serial import entity_reader
from kio.static.constants import EntityType

from kafscale.protocol import codec
from kafscale.protocol.errors import DecodeError, ErrorCode, MalformedRequest, UnknownApi
from kafscale.protocol.framing import LENGTH


def request_frame(request: Any, correlation_id: int = 7, client_id: str | None = "test") -> bytes:
    return codec.encode_request(request, correlation_id, client_id)


def metadata_request(version: int) -> Any:
    schema = load_request_schema(3, version)
    topic = codec.nested(schema, "MetadataRequestTopic")
    topics = (codec.build(topic, name="orders", topic_id=None),)
    return codec.build(
        schema,
        topics=topics,
        allow_auto_topic_creation=True,
        include_cluster_authorized_operations=False,
        include_topic_authorized_operations=False,
    )


@pytest.mark.parametrize("version", range(13))
def test_metadata_request_round_trip(version: int) -> None:
    request = metadata_request(version)
    frame = request_frame(request, correlation_id=99)
    assert codec.peek_header(frame) == (3, version, 99)
    schema = codec.request_schema(3, version)
    assert schema is not None
    header, decoded = codec.decode_request(frame, schema)
    assert header == codec.RequestHeader(3, version, 99, "test")
    assert decoded == request


def test_trailing_bytes_are_ignored_as_kafka_does() -> None:
    request = metadata_request(12)
    frame = request_frame(request) + b"\x01\x00\x00"
    assert codec.decode_request(frame, load_request_schema(3, 12))[1] == request


def test_truncated_body_is_malformed() -> None:
    frame = request_frame(metadata_request(4))
    for cut in range(8, len(frame)):
        with pytest.raises(MalformedRequest):
            codec.decode_request(frame[:cut], load_request_schema(3, 4))


def test_unknown_api_key() -> None:
    with pytest.raises(UnknownApi):
        codec.api_name(9999)
    with pytest.raises(UnknownApi):
        codec.request_schema(-1, 0)


def test_version_kafka_never_defined_has_no_schema() -> None:
    assert codec.request_schema(3, 999) is None


@given(st.integers(min_value=0, max_value=12), st.binary(max_size=64))
def test_garbage_body_parses_or_raises_the_decode_error(version: int, garbage: bytes) -> None:
    frame = struct.pack(">hhi", 3, version, 1) + garbage
    with contextlib.suppress(DecodeError):
        codec.decode_request(frame, load_request_schema(3, version))


def all_response_versions() -> list[tuple[int, int]]:
    pairs = []
    for key, name in api_key_map.items():
        for version, entities in schema_name_map[name].items():
            if EntityType.response in entities:
                pairs.append((key, version))
    return pairs


@pytest.mark.parametrize(("api_key", "version"), all_response_versions())
def test_error_response_encodes_for_every_api_and_version(api_key: int, version: int) -> None:
    schema = codec.response_schema(api_key, version)
    assert schema is not None
    response = codec.error_response(schema, ErrorCode.unsupported_version)
    frame = codec.encode_response(42, response)
    (length,) = LENGTH.unpack_from(frame)
    assert length == len(frame) - 4
    header_schema = schema.__header_schema__
    header, header_size = entity_reader(header_schema)(frame, 4)
    assert header.correlation_id == 42
    decoded, size = entity_reader(schema)(frame, 4 + header_size)
    assert 4 + header_size + size == len(frame)
    assert decoded == response
    if hasattr(decoded, "error_code"):
        assert decoded.error_code == ErrorCode.unsupported_version
