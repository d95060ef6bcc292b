"""The structure check before kio decodes a request (kafscale.protocol.bounds).

Every decode below goes through ``codec.decode_request``, which also fails when kio and the
check disagree on where the header or body ends: each successful decode here is a proof that the
compiled layout matches kio's reader for that frame.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import struct
import subprocess
import sys
import tracemalloc
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from kio.static.primitive import Records

from kafscale.protocol import bounds, codec
from kafscale.protocol.errors import DecodeError, MalformedRequest, RequestTooLarge
from kafscale.protocol.limits import UNLIMITED, Limits
from tests.unit.protocol import frames

SERVED = frames.served_schemas()
SERVED_IDS = [f"{s.__name__}-v{s.__version__}" for s in SERVED]

# The 25-byte request of issue 14 (length prefix included): Metadata v12, header v2 with a null
# client id, then a compact topics array claiming 0xFFFFFFFF - 1 topics. kio's native reader
# asked for 34 GB on it and the frontend died of SIGABRT.
METADATA_V12_BOMB = bytes.fromhex("0003000c00000001ffff00ffffffff0f0000000000")

st.register_type_strategy(Records, st.binary(max_size=64).map(Records))


def decode(frame: bytes, schema: type[Any], limits: Limits = UNLIMITED) -> Any:
    return codec.decode_request(frame, schema, limits)[1]


def test_the_25_byte_metadata_v12_is_refused_before_kio_allocates() -> None:
    """In a child process whose address space is capped at 1 GiB: had kio been reached, it would
    die of SIGABRT instead of printing the error."""
    script = (
        "import resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n"
        "from kio.index import load_request_schema\n"
        "from kafscale.protocol import codec\n"
        "from kafscale.protocol.errors import MalformedRequest\n"
        "try:\n"
        f"    codec.decode_request(bytes.fromhex({METADATA_V12_BOMB.hex()!r}),"
        " load_request_schema(3, 12))\n"
        "except MalformedRequest as exc:\n"
        "    print('refused:', exc)\n"
    )
    assert len(METADATA_V12_BOMB) + 4 == 25
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "RUST_BACKTRACE": "0"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "refused: MetadataRequest.topics: 4294967294 elements" in done.stdout


@pytest.mark.parametrize("schema", SERVED, ids=SERVED_IDS)
@pytest.mark.parametrize("variant", ["small", "valued"])
def test_every_served_version_round_trips(schema: type[Any], variant: frames.Variant) -> None:
    request = frames.sample_request(schema, variant)
    frame = codec.encode_request(request, 5, "client")
    assert decode(frame, schema) == request
    assert decode(frame + b"\x01\x00\x00", schema) == request  # trailing bytes: ignored


@settings(max_examples=400, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(
    st.sampled_from(SERVED).flatmap(lambda schema: st.tuples(st.just(schema), st.from_type(schema)))
)
def test_any_request_of_a_served_version_round_trips(case: tuple[type[Any], Any]) -> None:
    """Random values, tagged fields set or not: the check accepts whatever kio writes."""
    schema, request = case
    frame = codec.encode_request(request, 5, None)
    try:
        decoded = decode(frame, schema)
    except MalformedRequest as exc:
        # kio writes any int64 duration but reads one into a datetime.timedelta, which ends at
        # 999,999,999 days: a larger one (OffsetCommit v2-v4 retention_time) is refused.
        assume("timedelta milliseconds overflow" not in str(exc))
        raise
    assert decoded == request


@pytest.mark.parametrize("schema", SERVED, ids=SERVED_IDS)
def test_every_truncation_is_malformed(schema: type[Any]) -> None:
    frame = codec.encode_request(frames.sample_request(schema, "valued"), 5, "client")
    for cut in range(len(frame)):
        with pytest.raises(MalformedRequest):
            decode(frame[:cut], schema)


def test_a_null_where_the_schema_has_none_is_malformed() -> None:
    schema = frames.load(0, 9)  # Produce v9: topic_data is not nullable
    request = frames.sample_request(schema, "valued")
    frame = codec.encode_request(dataclasses.replace(request, topic_data=()), 5, "client")
    assert frame.endswith(b"\x01\x00")  # topic_data: compact count 0 + 1, then tagged fields
    with pytest.raises(MalformedRequest, match=r"ProduceRequest\.topic_data: null count"):
        decode(frame[:-2] + b"\x00\x00", schema)
    metadata = frames.load(3, 12)  # Metadata v12: topics is nullable (all topics)
    assert decode(codec.encode_request(metadata_request(None), 5), metadata).topics is None


@pytest.mark.parametrize(
    ("version", "body", "fault"),
    [
        (4, b"\xff\xff\xff\xfe", "negative count"),  # legacy int32 count of -2
        (12, b"\x80\x80\x80\x80\x80\x01", "varint longer than 5 bytes"),
        (0, b"\xff\xff\xff\xff", "null count"),  # Metadata v0: topics not nullable yet
        (4, b"\x00\x00\x00\x01\xff\xfe", "negative length"),  # a topic name of -2 bytes
        (12, b"\x02" + bytes(16) + b"\x05ab", "length 4 exceeds the 2 left"),
    ],
)
def test_lengths_and_nulls_kio_would_misread_are_malformed(
    version: int, body: bytes, fault: str
) -> None:
    schema = frames.load(3, version)
    header = struct.pack(">hhih", 3, version, 1, -1) + (b"\x00" if version >= 9 else b"")
    with pytest.raises(MalformedRequest, match=fault):
        decode(header + body, schema)


def metadata_request(topics: Any) -> Any:
    return codec.build(
        frames.load(3, 12),
        topics=topics,
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=True,
    )


def tagged(tag: int, value: bytes) -> bytes:
    return bounds.write_uvarint(tag) + bounds.write_uvarint(len(value)) + value


def test_unknown_tagged_fields_are_skipped_as_kafka_does() -> None:
    """A newer client may send tags kio's schema does not have: cut out, the rest decodes."""
    schema = frames.load(3, 12)
    topic = codec.nested(schema, "MetadataRequestTopic")
    request = metadata_request((topic(topic_id=None, name="orders"),))
    frame = codec.encode_request(request, 5, "client")
    # header v2 ends with its tagged fields (1 byte, 0), the body too; the topic's come after
    # its 16-byte id and its name.
    header_end = 4 + 4 + 2 + len("client") + 1
    topic_tags = frame.index(b"orders") + len(b"orders")
    assert frame[header_end - 1] == frame[topic_tags] == frame[-1] == 0
    unknown = tagged(40, b"zz") + tagged(41, b"")
    rewritten = (
        frame[: header_end - 1]
        + b"\x01"
        + tagged(7, b"x")
        + frame[header_end:topic_tags]
        + b"\x02"
        + unknown
        + frame[topic_tags + 1 : -1]
        + b"\x02"
        + unknown
    )
    header, decoded = codec.decode_request(rewritten, schema)
    assert decoded == request
    assert header.client_id == "client"


def test_a_known_tagged_field_is_kept_and_must_span_its_declared_size() -> None:
    schema = frames.load(1, 12)  # Fetch v12: cluster_id is tag 0 of the request
    request = dataclasses.replace(frames.sample_request(schema, "small"), cluster_id="c1")
    frame = codec.encode_request(request, 5, "client")
    assert decode(frame + tagged(99, b"?"), schema) == request  # trailing: ignored
    at = frame.rindex(tagged(0, b"\x03c1"))
    assert decode(frame, schema).cluster_id == "c1"
    lying = frame[:at] + tagged(0, b"\x03c1")[:1] + b"\x04" + b"\x03c1!" + frame[at + 5 :]
    with pytest.raises(MalformedRequest, match="tagged field 0 is not 4 bytes long"):
        decode(lying, schema)


def test_the_element_limit_counts_every_array_together() -> None:
    schema = frames.load(1, 12)  # Fetch: topics, each with partitions
    frame = frames.spliced(schema, ("topics", "partitions"), 98, "valued")
    # 1 topic, 98 + 1 partitions, and the request's one tagged field (cluster_id)
    assert bounds.check_request(frame, schema, UNLIMITED).elements == 101
    assert decode(frame, schema, Limits(1 << 20, 1 << 20, 101)).topics
    with pytest.raises(RequestTooLarge, match="101 array elements exceed the maximum of 100"):
        decode(frames.spliced(schema, ("topics", "partitions"), 99, "valued"), schema, limits(100))


def limits(elements: int, decoded: int = 1 << 20) -> Limits:
    return Limits(100 << 20, decoded, elements)


def test_tagged_fields_count_as_elements_before_they_are_walked() -> None:
    """Each tagged field is a step of the walk and, unknown, a cut kept in memory: a Produce
    frame (up to KAFSCALE_MAX_REQUEST_BYTES) of millions of 2-byte tagged fields in its header
    must stop at the element limit, not after walking them all."""
    produce = frames.load(0, 9)
    frame = codec.encode_request(frames.sample_request(produce, "small"), 5, "c")
    header_end = 4 + 4 + 2 + len("c") + 1  # header v2 ends with its tagged fields: 0
    assert frame[header_end - 1] == 0

    def with_tags(count: int) -> bytes:
        fields = bounds.write_uvarint(count) + tagged(1000, b"") * count
        return frame[: header_end - 1] + fields + frame[header_end:]

    assert bounds.check_request(frame, produce, UNLIMITED).elements == 2  # a topic, a partition
    assert decode(with_tags(98), produce, limits(100)) == decode(frame, produce)
    with pytest.raises(RequestTooLarge, match="101 array elements exceed the maximum of 100"):
        bounds.check_request(with_tags(99), produce, limits(100))  # its partition is the 101st
    with pytest.raises(RequestTooLarge, match="101 tagged fields make 101 elements, over the"):
        bounds.check_request(with_tags(101), produce, limits(100))
    million = with_tags(1_000_000)
    tracemalloc.start()
    try:
        with pytest.raises(RequestTooLarge, match="KAFSCALE_MAX_REQUEST_ELEMENTS"):
            bounds.check_request(million, produce, limits(30_000, decoded=4 << 20))
        assert tracemalloc.get_traced_memory()[1] < 1 << 20  # no cut list of a million
    finally:
        tracemalloc.stop()


def test_opaque_payloads_are_outside_the_decoded_limit() -> None:
    produce = frames.load(0, 9)
    request = frames.sample_request(produce, "valued")
    topic = request.topic_data[0]
    partition = dataclasses.replace(topic.partition_data[0], records=Records(b"r" * 100_000))
    request = dataclasses.replace(
        request, topic_data=(dataclasses.replace(topic, partition_data=(partition,)),)
    )
    frame = codec.encode_request(request, 5, "client")
    assert decode(frame, produce, limits(1000, decoded=1024)) == request
    many = frames.spliced(produce, ("topic_data", "partition_data"), 200, "small")
    with pytest.raises(RequestTooLarge, match="KAFSCALE_MAX_DECODED_REQUEST_BYTES"):
        decode(many, produce, limits(1000, decoded=1024))


def test_decoding_memory_is_bounded_by_the_bytes_received() -> None:
    """The costliest frames we can build (every array of every served version filled with its
    cheapest element, in both variants) allocate at most 32 bytes per byte received while
    decoding (measured worst: ~25, an array of 2-byte topic names of Metadata v0-v12)."""
    built = [
        (schema, path, variant, frame)
        for schema in SERVED
        for variant in ("small", "valued")
        for path, _, frame in frames.worst_frames(schema, 8192, variant)
    ]
    worst = (0.0, "")
    tracemalloc.start()
    try:
        for schema, path, variant, frame in built:
            tracemalloc.reset_peak()
            before = tracemalloc.get_traced_memory()[0]
            decode(frame, schema)
            ratio = (tracemalloc.get_traced_memory()[1] - before) / len(frame)
            worst = max(worst, (ratio, f"{schema.__name__} v{schema.__version__} {path} {variant}"))
    finally:
        tracemalloc.stop()
    assert len(built) > 400
    assert worst[0] <= 32, worst
    assert worst[0] >= 16, worst  # the measurement measures: the worst case is found


@settings(max_examples=300, deadline=None, database=None)
@given(st.sampled_from(SERVED), st.binary(max_size=96))
def test_garbage_after_a_header_parses_or_raises_the_decode_error(
    schema: type[Any], garbage: bytes
) -> None:
    header = struct.pack(">hhih", schema.__api_key__, schema.__version__, 1, -1)
    if schema.__header_schema__.__flexible__:
        header += b"\x00"
    with contextlib.suppress(DecodeError):
        decode(header + garbage, schema, limits(1000))
