"""Request decoding and response encoding over kio's generated message types.

Sans-io: bytes in, values out. A request frame is a request header (v1, or v2 for flexible
versions: kio's request classes name theirs) followed by the body of the API and version the
header declares. ``peek_header`` reads only the fixed 8-byte prefix, which is all that is needed
to answer a request whose body cannot be parsed (KIP-511: an unsupported ApiVersions version).
Bytes left after the body are ignored, as Apache Kafka's generated parsers do: librdkafka 2.x
sends Metadata v12 with three trailing bytes (tests/unit/protocol/test_golden.py), and a broker
that refused them would lock out every librdkafka client.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import io
import struct
import sys
import types
import typing
import uuid
from dataclasses import dataclass
from typing import Any

from kio.index import UnknownAPIKey, UnknownEntity, load_request_schema, load_response_schema
from kio.schema.index import api_key_map
from kio.serial import entity_reader, entity_writer
from kio.serial.errors import SerialError
from kio.static.primitive import i32
from kio.static.protocol import RequestPayload, ResponsePayload

from kafscale.protocol import bounds
from kafscale.protocol.errors import ErrorCode, MalformedRequest, UnknownApi
from kafscale.protocol.framing import LENGTH
from kafscale.protocol.limits import UNLIMITED, RequestLimits

# api_key: int16, api_version: int16, correlation_id: int32 -- common to every header version.
HEADER_PREFIX = struct.Struct(">hhi")

#: What kio's reader raises on values it refuses (its own errors; ValueError for a bad boolean
#: or varint; UnicodeDecodeError; OverflowError from a datetime out of range).
_KIO_REFUSALS = (SerialError, ValueError, LookupError, OverflowError)


@dataclass(frozen=True, slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None


def peek_header(frame: bytes) -> tuple[int, int, int]:
    """``(api_key, api_version, correlation_id)`` of a request frame (at least 8 bytes)."""
    if len(frame) < HEADER_PREFIX.size:
        raise MalformedRequest(f"request of {len(frame)} bytes is shorter than a header")
    api_key, api_version, correlation_id = HEADER_PREFIX.unpack_from(frame)
    return api_key, api_version, correlation_id


def api_name(api_key: int) -> str:
    """Kafka's name of an API key (``metadata``), or raise UnknownApi."""
    try:
        return api_key_map[api_key]
    except KeyError:
        raise UnknownApi(f"unknown API key {api_key}") from None


@functools.cache
def request_schema(api_key: int, api_version: int) -> type[RequestPayload] | None:
    """kio's request class, or None when Kafka defines no such version of the API."""
    api_name(api_key)
    try:
        return load_request_schema(api_key, api_version)
    except (UnknownAPIKey, UnknownEntity):
        return None


@functools.cache
def response_schema(api_key: int, api_version: int) -> type[ResponsePayload] | None:
    try:
        return load_response_schema(api_key, api_version)
    except (UnknownAPIKey, UnknownEntity):
        return None


def decode_request(
    frame: bytes, schema: type[RequestPayload], limits: RequestLimits = UNLIMITED
) -> tuple[RequestHeader, RequestPayload]:
    """Decode header and body of ``frame`` whose API and version ``schema`` models.

    ``bounds.check_request`` runs first (every length against what remains, nulls only where
    the schema allows them, unknown tagged fields cut out, ``limits`` held), so kio allocates no
    more than a small constant times the frame. Whatever kio still refuses (a boolean that is not
    0 or 1, invalid UTF-8, a negative timestamp) is a MalformedRequest too."""
    name = f"{schema.__name__} v{schema.__version__}"
    checked = bounds.check_request(frame, schema, limits)
    frame = checked.frame
    try:
        header, header_size = entity_reader(schema.__header_schema__)(frame, 0)
        body, body_size = entity_reader(schema)(frame, header_size)  # trailing bytes: see above
    except _KIO_REFUSALS as exc:
        raise MalformedRequest(f"{name} does not parse: {exc!r}") from None
    if (header_size, header_size + body_size) != (checked.header_end, checked.body_end):
        # Cannot happen while bounds mirrors kio's layout; refuse rather than guess.
        raise MalformedRequest(f"{name}: kio and the bounds check disagree on its layout")
    return RequestHeader(
        int(header.request_api_key),
        int(header.request_api_version),
        int(header.correlation_id),
        header.client_id,
    ), body


def encode_request(
    request: RequestPayload, correlation_id: int, client_id: str | None = "kafscale"
) -> bytes:
    """A request frame without its length prefix (what a client sends; tests and benches)."""
    buffer = io.BytesIO()
    header_schema = request.__header_schema__
    entity_writer(header_schema)(
        buffer,
        header_schema(
            request_api_key=request.__api_key__,
            request_api_version=request.__version__,
            correlation_id=i32(correlation_id),
            client_id=client_id,
        ),
    )
    entity_writer(type(request))(buffer, request)
    return buffer.getvalue()


def encode_response(correlation_id: int, response: ResponsePayload) -> bytes:
    """The complete response frame: length prefix, response header, body."""
    buffer = io.BytesIO()
    buffer.write(b"\0\0\0\0")
    header_schema = type(response).__header_schema__
    entity_writer(header_schema)(buffer, header_schema(correlation_id=i32(correlation_id)))
    entity_writer(type(response))(buffer, response)
    frame = buffer.getbuffer()
    LENGTH.pack_into(frame, 0, len(frame) - LENGTH.size)
    del frame
    return buffer.getvalue()


def nested(schema: type[Any], name: str) -> type[Any]:
    """A nested message class (``MetadataResponseTopic``) of the same API version as ``schema``."""
    cls: type[Any] = getattr(sys.modules[schema.__module__], name)
    return cls


def element(cls: type[Any], field_name: str) -> type[Any]:
    """The class of the entities in ``cls``'s array field ``field_name``, or of its nested
    entity field (the nested classes' names differ between versions of one API; their place
    does not)."""
    hint = typing.get_type_hints(cls)[field_name]
    if _is_optional(hint):
        hint = next(arg for arg in typing.get_args(hint) if arg is not type(None))
    if dataclasses.is_dataclass(hint):
        return typing.cast(type[Any], hint)
    found: type[Any] = typing.get_args(hint)[0]
    return found


def build(cls: type[Any], **values: Any) -> Any:
    """Instantiate a kio message class from ``values``, dropping fields this version lacks.

    Lets one handler serve every version of an API: it passes everything it knows, each
    version's class keeps what it models."""
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{name: value for name, value in values.items() if name in names})


def error_response(schema: type[ResponsePayload], error: ErrorCode) -> ResponsePayload:
    """A response of ``schema`` carrying ``error`` in every top-level error field, with empty
    collections and neutral values elsewhere: the answer to a request we do not serve."""
    return typing.cast(ResponsePayload, _neutral_entity(schema, error))


def _neutral_entity(cls: type[Any], error: ErrorCode) -> Any:
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for field in dataclasses.fields(cls):
        if not field.init:
            continue
        kafka_type = field.metadata.get("kafka_type")
        if kafka_type == "error_code":
            values[field.name] = error
        elif (
            field.default is not dataclasses.MISSING
            or field.default_factory is not dataclasses.MISSING
        ):
            continue
        else:
            values[field.name] = _neutral_value(kafka_type, hints[field.name], error)
    return cls(**values)


def _neutral_value(kafka_type: str | None, hint: Any, error: ErrorCode) -> Any:
    if _is_optional(hint):
        return None
    if dataclasses.is_dataclass(hint):
        return _neutral_entity(hint, error)  # type: ignore[arg-type]
    if typing.get_origin(hint) is tuple:
        return ()
    if kafka_type in ("string",):
        return ""
    if kafka_type in ("bytes", "records"):
        return b""
    if kafka_type == "bool":
        return False
    if kafka_type == "uuid":
        return uuid.UUID(int=0)
    if kafka_type in ("timedelta_i32", "timedelta_i64"):
        return datetime.timedelta(0)
    if kafka_type == "datetime_i64":
        return datetime.datetime.fromtimestamp(0, datetime.UTC)
    return 0


def _is_optional(hint: Any) -> bool:
    origin = typing.get_origin(hint)
    return origin in (typing.Union, types.UnionType) and type(None) in typing.get_args(hint)
