"""The hand-written FetchResponse encoder against kio's generated one, byte for byte."""

import array
import datetime
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode as KioErrorCode

from kafscale.protocol import codec
from kafscale.protocol.fetch import (
    MAX_VERSION,
    MIN_VERSION,
    NO_LEADER,
    Buffer,
    FetchPartition,
    FetchTopic,
    NodeEndpoint,
    encode_fetch_response,
)

VERSIONS = range(MIN_VERSION, MAX_VERSION + 1)
FETCH = 1


def kio_frame(
    version: int,
    correlation_id: int,
    topics: Sequence[FetchTopic],
    throttle_time_ms: int = 0,
    error_code: int = 0,
    session_id: int = 0,
    node_endpoints: Sequence[NodeEndpoint] = (),
) -> bytes:
    schema = codec.response_schema(FETCH, version)
    assert schema is not None
    topic_cls = codec.nested(schema, "FetchableTopicResponse")
    partition_cls = codec.nested(schema, "PartitionData")
    aborted_cls = codec.nested(schema, "AbortedTransaction")
    flexible = version >= 12

    def partition(p: FetchPartition) -> Any:
        aborted = p.aborted_transactions
        leader: dict[str, Any] = {}
        if flexible:
            leader_cls = codec.nested(schema, "LeaderIdAndEpoch")
            leader_id, leader_epoch = p.current_leader
            leader["current_leader"] = leader_cls(leader_id=leader_id, leader_epoch=leader_epoch)
        return codec.build(
            partition_cls,
            partition_index=p.partition,
            error_code=KioErrorCode(p.error_code),
            high_watermark=p.high_watermark,
            last_stable_offset=p.last_stable_offset,
            log_start_offset=p.log_start_offset,
            aborted_transactions=None
            if aborted is None
            else tuple(aborted_cls(producer_id=i, first_offset=o) for i, o in aborted),
            preferred_read_replica=p.preferred_read_replica,
            records=None if p.records is None else b"".join(p.records),
            **leader,
        )

    endpoints: tuple[Any, ...] = ()
    if version >= 16:
        endpoint_cls = codec.nested(schema, "NodeEndpoint")
        endpoints = tuple(
            endpoint_cls(node_id=n.node_id, host=n.host, port=n.port, rack=n.rack)
            for n in node_endpoints
        )
    response = codec.build(
        schema,
        throttle_time=datetime.timedelta(milliseconds=throttle_time_ms),
        error_code=KioErrorCode(error_code),
        session_id=session_id,
        responses=tuple(
            codec.build(
                topic_cls,
                topic=t.name,
                topic_id=t.topic_id,
                partitions=tuple(partition(p) for p in t.partitions),
            )
            for t in topics
        ),
        node_endpoints=endpoints,
    )
    return codec.encode_response(correlation_id, response)


def record_chunks(topics: Sequence[FetchTopic]) -> list[Buffer]:
    return [c for t in topics for p in t.partitions for c in p.records or ()]


def assert_encodes_like_kio(
    version: int, correlation_id: int, topics: Sequence[FetchTopic], **top_level: Any
) -> list[Buffer]:
    buffers = encode_fetch_response(version, correlation_id, topics, **top_level)
    assert b"".join(buffers) == kio_frame(version, correlation_id, topics, **top_level)
    chunks = record_chunks(topics)
    passed = {id(c) for c in chunks}
    placed = [b for b in buffers if id(b) in passed]
    assert len(placed) == len(chunks)
    assert all(ours is theirs for ours, theirs in zip(placed, chunks, strict=True))
    assert all(len(b) for b in buffers if id(b) not in passed), "no empty segments"
    return buffers


def topic(name: str, *partitions: FetchPartition) -> FetchTopic:
    return FetchTopic(name, uuid.uuid5(uuid.NAMESPACE_DNS, name), list(partitions))


def chunked(data: bytes, size: int) -> list[Buffer]:
    view = memoryview(data)
    return [view[i : i + size] for i in range(0, len(data), size)]


BATCH = bytes(range(256)) * 3
LARGE = bytes(range(251)) * 300  # 75 KiB: its compact length takes three varint bytes
HUGE = b"\x5a" * (2**21 + 5)  # four varint bytes

SHAPES: dict[str, Callable[[], list[FetchTopic]]] = {
    "no topics": lambda: [],
    "topic without partitions": lambda: [topic("empty")],
    "null and empty records": lambda: [
        topic("t", FetchPartition(0), FetchPartition(1, records=[]), FetchPartition(2))
    ],
    "several topics and partitions": lambda: [
        topic(
            "orders",
            FetchPartition(
                0,
                high_watermark=10,
                last_stable_offset=10,
                log_start_offset=0,
                records=[BATCH[:100]],
            ),
            FetchPartition(3, high_watermark=7, records=[BATCH[100:], BATCH[:5]]),
        ),
        topic("payments", FetchPartition(1, records=[]), FetchPartition(2, records=[BATCH])),
        topic("ünïcode-名前", FetchPartition(0, records=[BATCH[:1]])),
    ],
    "memoryview chunks": lambda: [
        topic("t", FetchPartition(0, records=chunked(BATCH, 97)), FetchPartition(1)),
    ],
    "aborted transactions": lambda: [
        topic(
            "tx",
            FetchPartition(0, aborted_transactions=[], records=[]),
            FetchPartition(1, aborted_transactions=[(1000, 5), (2**62, 2**40)], records=[BATCH]),
            FetchPartition(2, aborted_transactions=None),
        )
    ],
    "errors": lambda: [
        topic(
            "bad",
            FetchPartition(0, error_code=1, high_watermark=5, log_start_offset=2),
            FetchPartition(1, error_code=6, preferred_read_replica=3, records=[]),
            FetchPartition(2, error_code=-1),
        )
    ],
    "current leaders (KIP-951)": lambda: [
        topic(
            "moved",
            FetchPartition(0, error_code=6, current_leader=(4, 7)),
            FetchPartition(1, error_code=74, current_leader=(-1, 3), records=[]),
            FetchPartition(2, records=[BATCH[:9]], current_leader=(200, 2**31 - 1)),
            FetchPartition(3, error_code=6, current_leader=NO_LEADER),
        )
    ],
    "large records": lambda: [
        topic("big", FetchPartition(0, records=chunked(LARGE, 16384)), FetchPartition(1)),
        topic("bigger", FetchPartition(5, records=[HUGE])),
    ],
}


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("version", VERSIONS)
def test_matches_kio(version: int, shape: str) -> None:
    assert_encodes_like_kio(version, 0x01020304, SHAPES[shape]())


@pytest.mark.parametrize("version", VERSIONS)
def test_top_level_fields(version: int) -> None:
    topics = SHAPES["several topics and partitions"]()
    top_level = {"throttle_time_ms": 250, "error_code": 71, "session_id": 123456789}
    assert_encodes_like_kio(version, -7, topics, **top_level)


ENDPOINTS = [
    NodeEndpoint(4, "10.0.0.4", 9092, rack="r1"),
    NodeEndpoint(200, "broker-200.kafscale.svc.cluster.local", 19092),
    NodeEndpoint(7, "ünïcode-名前", 1, rack=""),
]


@pytest.mark.parametrize("version", VERSIONS)
def test_node_endpoints_from_v16(version: int) -> None:
    topics = SHAPES["current leaders (KIP-951)"]()
    with_endpoints = assert_encodes_like_kio(version, 9, topics, node_endpoints=ENDPOINTS)
    without = encode_fetch_response(version, 9, topics)
    assert (b"".join(with_endpoints) != b"".join(without)) == (version >= 16)


def test_records_stay_where_they_were_passed() -> None:
    chunks = chunked(BATCH, 256)
    buffers = encode_fetch_response(12, 1, [topic("t", FetchPartition(0, records=chunks))])
    # header segment, the three chunks themselves, the tagged-field tail
    assert len(buffers) == 5
    assert all(ours is theirs for ours, theirs in zip(buffers[1:4], chunks, strict=True))
    assert bytes(buffers[4]) == b"\0\0\0"


def test_memoryview_length_counts_bytes_not_items() -> None:
    words = memoryview(array.array("I", range(40)))
    assert len(words) != words.nbytes
    topics = [topic("t", FetchPartition(0, records=[words]))]
    assert b"".join(encode_fetch_response(17, 1, topics)) == kio_frame(
        17, 1, [topic("t", FetchPartition(0, records=[words.tobytes()]))]
    )


@pytest.mark.parametrize("version", [0, 3, 18])
def test_unsupported_versions_are_refused(version: int) -> None:
    with pytest.raises(ValueError, match=f"v{version}"):
        encode_fetch_response(version, 1, [])


i32s = st.integers(-(2**31), 2**31 - 1)
i64s = st.integers(-(2**63), 2**63 - 1)
error_codes = st.sampled_from([int(code) for code in KioErrorCode])
records = st.none() | st.lists(
    st.binary(max_size=40).map(lambda b: memoryview(b) if len(b) % 2 else b), max_size=3
)
partitions = st.builds(
    FetchPartition,
    partition=i32s,
    error_code=error_codes,
    high_watermark=i64s,
    last_stable_offset=i64s,
    log_start_offset=i64s,
    aborted_transactions=st.none() | st.lists(st.tuples(i64s, i64s), max_size=3),
    preferred_read_replica=i32s,
    records=records,
    current_leader=st.just(NO_LEADER) | st.tuples(i32s, i32s),
)
endpoints = st.lists(
    st.builds(
        NodeEndpoint,
        node_id=i32s,
        host=st.text(max_size=12),
        port=i32s,
        rack=st.none() | st.text(max_size=5),
    ),
    max_size=3,
)
topics = st.lists(
    st.builds(
        FetchTopic,
        name=st.text(max_size=12),
        topic_id=st.uuids(),
        partitions=st.lists(partitions, max_size=3),
    ),
    max_size=3,
)


@settings(max_examples=50, deadline=None)
@given(
    topics=topics,
    correlation_id=i32s,
    throttle=i32s,
    error_code=error_codes,
    session=i32s,
    nodes=endpoints,
)
def test_matches_kio_for_any_response(
    topics: list[FetchTopic],
    correlation_id: int,
    throttle: int,
    error_code: int,
    session: int,
    nodes: list[NodeEndpoint],
) -> None:
    top_level = {
        "throttle_time_ms": throttle,
        "error_code": error_code,
        "session_id": session,
        "node_endpoints": nodes,
    }
    for version in VERSIONS:
        assert_encodes_like_kio(version, correlation_id, topics, **top_level)
