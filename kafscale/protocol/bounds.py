"""The structure check a request frame passes before kio decodes it.

kio's native reader trusts the lengths it reads. An array count becomes ``Vec::with_capacity``
before the first element is read, so a 25-byte Metadata v12 whose compact topics array claims
0xFFFFFFFF entries asks for 34 GB and the process aborts (Rust aborts on a failed allocation; no
Python handler runs). It also decodes a null where the schema has a non-nullable array (a handler
then fails on None) and raises KeyError on a tagged field it does not know.

``check_request`` walks the frame against a layout compiled once per API version from the same
kio schema, with kio's own field classification (``kio.serial._introspect``, which its native
compiler calls too), reading lengths and building no value. When it returns:

- every array count, string and bytes length fits in the bytes that remain: an array of n
  elements needs n times its element's smallest encoding, so kio allocates no more than a small
  constant times the bytes received;
- a null appears only where the schema allows one (Kafka: "non-nullable field was serialized as
  null");
- every tagged field is one the schema knows and spans exactly the size it declares, or it has
  been cut out of the frame returned (Kafka's generated parsers skip unknown tags: a newer client
  may send tags a version did not have when kio was generated);
- the request holds at most ``max_request_elements`` array elements and tagged fields (each
  is a step of the walk, an unknown one a cut kept until the end), and its bytes besides
  opaque payloads (``limits.OPAQUE_TYPES``: record batches, group metadata) are at most
  ``max_decoded_request_bytes`` (why: ``kafscale.protocol.limits``).

The walk takes one Python step per field that is not fixed-size, per array element and per
tagged field; a run of fixed-size fields is one step, an array of fixed-size entities one step
in all. It stops at the first fault, and its element count stops it after at most
``max_request_elements`` elements and tagged fields.
"""

from __future__ import annotations

import struct
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveTupleField,
    classify_field,
    get_field_tag,
    get_schema_field_type,
    is_optional,
)

from kafscale.protocol.errors import MalformedRequest, RequestTooLarge
from kafscale.protocol.limits import OPAQUE_TYPES, RequestLimits

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")

#: Wire sizes of kio's fixed-size primitive types.
_FIXED_SIZES = {
    "bool": 1,
    "int8": 1,
    "uint8": 1,
    "int16": 2,
    "uint16": 2,
    "error_code": 2,
    "int32": 4,
    "uint32": 4,
    "timedelta_i32": 4,
    "int64": 8,
    "uint64": 8,
    "float64": 8,
    "timedelta_i64": 8,
    "datetime_i64": 8,
    "uuid": 16,
}


_Cut = tuple[int, int, bytes]  # (start, end, replacement): a span of the frame to replace


class _Walk:
    """Where a walk over one frame stands: its bounds, what it skipped as opaque, the elements
    it counted, its cuts."""

    __slots__ = ("cuts", "data", "decoded_limit", "element_limit", "elements", "end", "opaque")

    def __init__(self, data: bytes, limits: RequestLimits) -> None:
        self.data = data
        self.end = len(data)
        self.decoded_limit = limits.max_decoded_request_bytes
        self.element_limit = limits.max_request_elements
        self.opaque = 0  # bytes of opaque payloads skipped so far (outside the decoded limit)
        self.elements = 0
        self.cuts: list[_Cut] = []


Skip = Callable[[_Walk, int], int]


@dataclass(frozen=True, slots=True)
class Layout:
    """How to step over one field or entity: ``skip(walk, pos) -> end``. ``min_size`` is its
    smallest encoding; ``fixed`` says every encoding has exactly that size."""

    skip: Skip
    min_size: int
    fixed: bool


@dataclass(frozen=True, slots=True)
class Checked:
    """A frame that passed the check (unknown tagged fields cut out), where its header and body
    end, and how many array elements it holds."""

    frame: bytes
    header_end: int
    body_end: int
    elements: int


def check_request(frame: bytes, schema: type[Any], limits: RequestLimits) -> Checked:
    """Walk header and body of ``frame`` (of the API version ``schema`` models); raise
    MalformedRequest on the first fault, RequestTooLarge past a limit."""
    walk = _Walk(frame, limits)
    try:
        header_end = entity_layout(schema.__header_schema__).skip(walk, 0)
        body_end = entity_layout(schema).skip(walk, header_end)
    except (IndexError, struct.error):
        raise MalformedRequest(f"{_name(schema)}: request ends early") from None
    if body_end > walk.end:
        raise MalformedRequest(f"{_name(schema)}: request ends early")
    if body_end - walk.opaque > walk.decoded_limit:
        raise RequestTooLarge(
            f"{_name(schema)}: {body_end - walk.opaque} bytes besides opaque payloads exceed "
            f"the maximum of {walk.decoded_limit} (KAFSCALE_MAX_DECODED_REQUEST_BYTES)"
        )
    if not walk.cuts:
        return Checked(frame, header_end, body_end, walk.elements)
    return _cut(frame, walk.cuts, header_end, body_end, walk.elements)


def entity_layout(cls: type[Any], nullable: bool = False) -> Layout:
    """The layout of kio entity class ``cls`` (cached: one compile per class)."""
    layout = _LAYOUTS.get((cls, nullable))
    if layout is None:
        layout = _LAYOUTS[cls, nullable] = _compile_entity(cls, nullable)
    return layout


_LAYOUTS: dict[tuple[type[Any], bool], Layout] = {}


def _compile_entity(cls: type[Any], nullable: bool) -> Layout:
    flexible: bool = cls.__flexible__
    steps: list[Skip] = []
    run = 0  # bytes of fixed-size fields not yet turned into a step
    min_size = 0
    tagged: dict[int, Skip] = {}
    for field in fields(cls):
        tag = get_field_tag(field)
        layout = _field_layout(cls, field, flexible, tagged=tag is not None)
        if tag is not None:
            tagged[int(tag)] = layout.skip
            continue
        min_size += layout.min_size
        if layout.fixed:
            run += layout.min_size
            continue
        if run:
            steps.append(_advance(run))
            run = 0
        steps.append(layout.skip)
    if flexible:  # the tagged fields come after every other field
        if run:
            steps.append(_advance(run))
            run = 0
        steps.append(_tagged_fields(cls.__name__, tagged))
        min_size += 1
    if nullable:
        return Layout(_nullable_entity(tuple(steps), run), 1, fixed=False)
    if not steps:
        return Layout(_advance(run), min_size, fixed=True)
    return Layout(_entity(tuple(steps), run), min_size, fixed=False)


def _field_layout(cls: type[Any], field: Any, flexible: bool, tagged: bool) -> Layout:
    """The layout of one field, classified as kio's native compiler classifies it."""
    name = f"{cls.__name__}.{field.name}"
    kind = classify_field(field)
    if cls.__name__ == "RequestHeader" and field.name == "client_id":
        return _string(name, "string", compact=False, nullable=True)  # never compact
    if isinstance(kind, EntityField):
        return entity_layout(kind.type_, nullable=is_optional(field))
    if isinstance(kind, EntityTupleField):
        element = entity_layout(kind.type_)
    else:
        # kio reads a tagged primitive as non-nullable whatever its type says.
        optional = is_optional(field) and not tagged and not isinstance(kind, PrimitiveTupleField)
        element = _primitive(name, get_schema_field_type(field), flexible, optional)
    if isinstance(kind, (EntityTupleField, PrimitiveTupleField)):
        return _array(name, element, compact=flexible, nullable=_may_be_null(field))
    return element


def _primitive(name: str, kafka_type: str, flexible: bool, nullable: bool) -> Layout:
    size = _FIXED_SIZES.get(kafka_type)
    if size is not None:
        return Layout(_advance(size), size, fixed=True)
    if kafka_type in ("string", "bytes", "records"):
        return _string(name, kafka_type, compact=flexible, nullable=nullable)
    raise TypeError(f"{name}: no layout for kafka_type {kafka_type!r}")  # pragma: no cover


def _may_be_null(field: Any) -> bool:
    """Whether the field itself (not its elements) is nullable: ``tuple[...] | None``."""
    hint = field.type
    origin = typing.get_origin(hint)
    return origin in (typing.Union, types.UnionType) and type(None) in typing.get_args(hint)


def _advance(size: int) -> Skip:
    # Positions only grow; one past the end is caught by the next length read or at the end.
    def skip(walk: _Walk, pos: int) -> int:
        return pos + size

    return skip


def _string(name: str, kafka_type: str, compact: bool, nullable: bool) -> Layout:
    """A string, bytes or records field: compact (uvarint length + 1, 0 = null) or legacy
    (int16 for a string, int32 for bytes; -1 = null). Bytes and records are outside the
    budget (opaque: one bytes object each)."""
    legacy_length = _INT16 if kafka_type == "string" else _INT32
    opaque = kafka_type in OPAQUE_TYPES

    def skip(walk: _Walk, pos: int) -> int:
        if compact:
            length = walk.data[pos] - 1  # the one-byte varint inline: the common case
            if length < 0x7F:
                pos += 1
            else:
                length, pos = read_uvarint(walk.data, pos)
                length -= 1
        else:
            (length,) = legacy_length.unpack_from(walk.data, pos)
            pos += legacy_length.size
        if length < 0:
            if length == -1 and nullable:
                return pos
            raise MalformedRequest(f"{name}: {'null' if length == -1 else 'negative'} length")
        if length > walk.end - pos:
            raise MalformedRequest(f"{name}: length {length} exceeds the {walk.end - pos} left")
        if opaque:
            walk.opaque += length
        return pos + length

    return Layout(skip, 1 if compact else legacy_length.size, fixed=False)


def _array(name: str, element: Layout, compact: bool, nullable: bool) -> Layout:
    """An array: compact (uvarint count + 1, 0 = null) or legacy (int32, -1 = null)."""
    element_skip, element_fixed = element.skip, element.fixed
    element_size = max(element.min_size, 1)  # no request array has empty elements; be sure

    def skip(walk: _Walk, pos: int) -> int:
        if compact:
            count = walk.data[pos] - 1
            if count < 0x7F:
                pos += 1
            else:
                count, pos = read_uvarint(walk.data, pos)
                count -= 1
        else:
            (count,) = _INT32.unpack_from(walk.data, pos)
            pos += 4
        if count <= 0:
            if count == 0 or (count == -1 and nullable):
                return pos
            raise MalformedRequest(f"{name}: {'null' if count == -1 else 'negative'} count")
        if count * element_size > walk.end - pos:
            raise MalformedRequest(
                f"{name}: {count} elements of at least {element_size} bytes do not fit in the "
                f"{walk.end - pos} bytes left"
            )
        walk.elements += count
        if walk.elements > walk.element_limit:
            raise RequestTooLarge(
                f"{name}: {walk.elements} array elements exceed the maximum of "
                f"{walk.element_limit} (KAFSCALE_MAX_REQUEST_ELEMENTS)"
            )
        if count * element_size > walk.decoded_limit - pos + walk.opaque:
            raise RequestTooLarge(
                f"{name}: {count} elements of at least {element_size} bytes exceed the maximum "
                f"of {walk.decoded_limit} bytes besides opaque payloads "
                "(KAFSCALE_MAX_DECODED_REQUEST_BYTES)"
            )
        if element_fixed:
            return pos + count * element_size
        for _ in range(count):
            pos = element_skip(walk, pos)
        return pos

    return Layout(skip, 1 if compact else 4, fixed=False)


def _entity(steps: tuple[Skip, ...], tail: int) -> Skip:
    def skip(walk: _Walk, pos: int) -> int:
        for step in steps:
            pos = step(walk, pos)
        return pos + tail

    return skip


def _nullable_entity(steps: tuple[Skip, ...], tail: int) -> Skip:
    inner = _entity(steps, tail)

    def skip(walk: _Walk, pos: int) -> int:
        # kio reads the int8 marker: -1 is null, anything else a present struct.
        if walk.data[pos] == 0xFF:
            return pos + 1
        return inner(walk, pos + 1)

    return skip


def _tagged_fields(entity: str, known: dict[int, Skip]) -> Skip:
    """A flexible entity's tagged fields (KIP-482): count, then (tag, size, value) each."""

    def skip(walk: _Walk, pos: int) -> int:
        if walk.data[pos] == 0:  # no tagged fields: the common case
            return pos + 1
        start = pos
        count, pos = read_uvarint(walk.data, pos)
        count_end = pos
        if count * 2 > walk.end - pos:
            raise MalformedRequest(f"{entity}: {count} tagged fields do not fit")
        # Each is a step of this walk and, unknown, a cut held until the end: counted as array
        # elements are, before the first is read (a Produce frame may be 100 MiB of them).
        walk.elements += count
        if walk.elements > walk.element_limit:
            raise RequestTooLarge(
                f"{entity}: {count} tagged fields make {walk.elements} elements, over the "
                f"maximum of {walk.element_limit} (KAFSCALE_MAX_REQUEST_ELEMENTS)"
            )
        if count * 2 > walk.decoded_limit - pos + walk.opaque:
            raise RequestTooLarge(
                f"{entity}: {count} tagged fields exceed the maximum of {walk.decoded_limit} "
                "bytes besides opaque payloads (KAFSCALE_MAX_DECODED_REQUEST_BYTES)"
            )
        unknown: list[_Cut] = []
        for _ in range(count):
            field_start = pos
            tag, pos = read_uvarint(walk.data, pos)
            size, pos = read_uvarint(walk.data, pos)
            if size > walk.end - pos:
                raise MalformedRequest(f"{entity}: tagged field {tag} overruns the request")
            field_skip = known.get(tag)
            if field_skip is None:
                unknown.append((field_start, pos + size, b""))
            elif field_skip(walk, pos) != pos + size:
                raise MalformedRequest(f"{entity}: tagged field {tag} is not {size} bytes long")
            pos += size
        if unknown:
            walk.cuts.append((start, count_end, write_uvarint(count - len(unknown))))
            walk.cuts.extend(unknown)
        return pos

    return skip


def _cut(frame: bytes, cuts: list[_Cut], header_end: int, body_end: int, elements: int) -> Checked:
    """``frame`` with each (start, end) span replaced; the ends moved by what was cut before
    them."""
    out = bytearray()
    last = 0
    header_shift = body_shift = 0
    for start, end, replacement in sorted(cuts):
        out += frame[last:start]
        out += replacement
        removed = end - start - len(replacement)
        body_shift += removed
        if end <= header_end:
            header_shift += removed
        last = end
    out += frame[last:]
    return Checked(bytes(out), header_end - header_shift, body_end - body_shift, elements)


def read_uvarint(data: bytes, pos: int) -> tuple[int, int]:
    """An unsigned varint of at most 5 bytes (as kio and Kafka read them), and its end."""
    byte = data[pos]
    if byte < 0x80:
        return byte, pos + 1
    value, shift = byte & 0x7F, 7
    while True:
        pos += 1
        byte = data[pos]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos + 1
        shift += 7
        if shift >= 35:
            raise MalformedRequest("varint longer than 5 bytes")


def write_uvarint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _name(schema: type[Any]) -> str:
    return f"{schema.__name__} v{schema.__version__}"
