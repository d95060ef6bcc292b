"""Request frames for the decoding tests, the fuzzer and the worst-case measurement.

- ``served_schemas``: every (API, version) the frontend decodes (the dispatch table).
- ``sample_request``: a request of a schema with every field set, in one of two variants:
  ``"small"`` (zeros, empty strings, nulls where allowed: the fewest bytes) and ``"valued"``
  (ints past CPython's small-int cache, two-character strings, UUIDs: the most objects per byte).
- ``worst_frames``: for one schema, a frame of about ``size`` bytes per array in it (at any depth)
  filled with copies of its cheapest element: what an attacker would send to make decoding cost
  the most per byte received.
"""

from __future__ import annotations

import dataclasses
import datetime
import struct
import typing
import uuid
from collections.abc import Iterator
from typing import Any

from kio.index import load_request_schema
from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveTupleField,
    classify_field,
    get_field_tag,
    get_schema_field_type,
)
from kio.static.protocol import RequestPayload

from kafscale.frontend.dispatch import APIS
from kafscale.protocol import bounds, codec

Variant = typing.Literal["small", "valued"]

_VALUED_INTS = {
    "int8": 100,
    "uint8": 200,
    "int16": 30_000,
    "uint16": 60_000,
    "int32": 2**30 + 7,
    "uint32": 2**31 + 7,
    "int64": 2**60 + 7,
    "uint64": 2**63 + 7,
}


def served_schemas() -> list[type[RequestPayload]]:
    """kio's request class of every API version the frontend decodes with kio."""
    found = []
    for api in APIS.values():
        for version in range(api.min_version, api.max_version + 1):
            schema = codec.request_schema(api.key, version)
            if schema is not None and not (api.key == 0 and version < 3):  # v0-2: by hand
                found.append(schema)
    return found


def sample_request(schema: type[Any], variant: Variant = "small") -> Any:
    """An instance of ``schema`` with one element in each array of entities."""
    return _entity(schema, variant, arrays=1)


def _entity(cls: type[Any], variant: Variant, arrays: int) -> Any:
    values: dict[str, Any] = {}
    for field in dataclasses.fields(cls):
        values[field.name] = _value(field, variant, arrays)
    return cls(**values)


def _value(field: Any, variant: Variant, arrays: int) -> Any:
    kind = classify_field(field)
    nullable = _optional(field.type)
    if isinstance(kind, EntityTupleField):
        return tuple(_entity(kind.type_, variant, arrays) for _ in range(arrays))
    if isinstance(kind, PrimitiveTupleField):
        return ()
    if isinstance(kind, EntityField):
        if nullable and variant == "small":
            return None
        return _entity(kind.type_, variant, arrays)
    kafka_type = get_schema_field_type(field)
    tagged = get_field_tag(field) is not None
    if nullable and variant == "small" and not tagged:
        return None
    return _primitive(kafka_type, variant)


def _primitive(kafka_type: str, variant: Variant) -> Any:
    valued = variant == "valued"
    if kafka_type in _VALUED_INTS:
        return _VALUED_INTS[kafka_type] if valued else 0
    if kafka_type == "bool":
        return valued
    if kafka_type == "string":
        return "ab" if valued else ""
    if kafka_type in ("bytes", "records"):
        return b"ab" if valued else b""
    if kafka_type == "uuid":  # kio reads the all-zero UUID as None
        return uuid.UUID(int=2**100 + 7) if valued else None
    if kafka_type == "float64":
        return 1.5 if valued else 0.0
    if kafka_type in ("timedelta_i32", "timedelta_i64"):
        return datetime.timedelta(milliseconds=123_456 if valued else 0)
    if kafka_type == "datetime_i64":
        return datetime.datetime.fromtimestamp(1_700_000_000 if valued else 0, datetime.UTC)
    if kafka_type == "error_code":
        return 0
    raise TypeError(kafka_type)


def _optional(hint: Any) -> bool:
    return type(None) in typing.get_args(hint)


def array_paths(cls: type[Any], prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """The field paths of every array in ``cls``, at any depth (through one element each)."""
    for field in dataclasses.fields(cls):
        if get_field_tag(field) is not None:
            continue  # a tagged array is sent once, after everything else; not a multiplier
        kind = classify_field(field)
        path = (*prefix, field.name)
        if isinstance(kind, (EntityTupleField, PrimitiveTupleField)):
            yield path
        if isinstance(kind, (EntityField, EntityTupleField)):
            yield from array_paths(kind.type_, path)


def _with_elements(entity: Any, path: tuple[str, ...], count: int, variant: Variant) -> Any:
    """``entity`` with the array at ``path`` holding ``count`` copies of one element."""
    name, rest = path[0], path[1:]
    current = getattr(entity, name)
    field = next(f for f in dataclasses.fields(entity) if f.name == name)
    kind = classify_field(field)
    if rest:
        inner = current[0] if isinstance(kind, EntityTupleField) and current else current
        if not inner:
            inner = _entity(kind.type_, variant, 1)
        inner = _with_elements(inner, rest, count, variant)
        new = (inner,) if isinstance(kind, EntityTupleField) else inner
    elif isinstance(kind, EntityTupleField):
        new = (_entity(kind.type_, variant, 0),) * count
    else:
        new = (_primitive(get_schema_field_type(field), variant),) * count
    return dataclasses.replace(entity, **{name: new})


def frame_with_elements(
    schema: type[Any], path: tuple[str, ...], count: int, variant: Variant
) -> bytes:
    request = _with_elements(sample_request(schema, variant), path, count, variant)
    return codec.encode_request(request, 1, "w")


def worst_frames(
    schema: type[Any], size: int, variant: Variant
) -> Iterator[tuple[tuple[str, ...], int, bytes]]:
    """``(path, elements, frame)``: one frame of about ``size`` bytes per array of ``schema``."""
    for path in array_paths(schema):
        one = frame_with_elements(schema, path, 1, variant)
        two = frame_with_elements(schema, path, 2, variant)
        count = max(1, (size - len(one)) // (len(two) - len(one)) + 1)
        yield path, count, spliced(schema, path, count, variant)


def spliced(schema: type[Any], path: tuple[str, ...], count: int, variant: Variant) -> bytes:
    """``frame_with_elements(schema, path, count, variant)``, built by splicing (kio's Python
    writer would take seconds per MiB): the frames with one and with two elements differ only
    in the array's count and one more copy of the element."""
    one = frame_with_elements(schema, path, 1, variant)
    two = frame_with_elements(schema, path, 2, variant)
    element_size = len(two) - len(one)
    differs = next(i for i, (a, b) in enumerate(zip(one, two, strict=False)) if a != b)
    if schema.__flexible__:  # compact count: uvarint(n + 1), one byte for 1 and 2
        count_at, count_end = differs, differs + 1
        encoded_count = bounds.write_uvarint(count + 1)
    else:  # legacy count: int32, differing in its last byte
        count_at, count_end = differs - 3, differs + 1
        encoded_count = struct.pack(">i", count)
    element = one[count_end : count_end + element_size]
    return one[:count_at] + encoded_count + element * count + one[count_end + element_size :]


def load(api_key: int, version: int) -> type[RequestPayload]:
    return load_request_schema(api_key, version)
