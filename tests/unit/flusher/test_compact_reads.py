"""Reading the merged chunks of a plan's seals: ranges coalesced per object (pure, with a
property), and each chunk cut from its range checked as a single read would be."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafscale.flusher.compact_reads import ChunkUnreadable, Range, coalesce, read_range
from kafscale.metadata.records import SegmentRecord
from kafscale.protocol.records import build_batch
from kafscale.storage.local import LocalObjectStore
from kafscale.storage.objects import ObjectNotFound


def chunk(
    obj: str, position: int, size: int, base: int = 0, last: int | None = None
) -> SegmentRecord:
    last = base if last is None else last
    return SegmentRecord(base, last, size, 0, last - base + 1, 0, 0, obj, position)


def test_neighbouring_chunks_share_a_range_and_far_ones_do_not() -> None:
    chunks = [
        chunk("m1", 100, 50),
        chunk("m1", 150, 50),
        chunk("m1", 260, 40),
        chunk("m1", 900, 10),
    ]
    ranges = coalesce(chunks, max_gap=60, max_range=10_000)
    assert [(r.object, r.start, r.end, len(r.chunks)) for r in ranges] == [
        ("m1", 100, 300, 3),
        ("m1", 900, 910, 1),
    ]


def test_a_range_stays_within_max_range_unless_one_chunk_is_bigger() -> None:
    chunks = [chunk("m", 0, 40), chunk("m", 40, 40), chunk("m", 80, 40), chunk("m", 120, 500)]
    ranges = coalesce(chunks, max_gap=0, max_range=100)
    assert [(r.start, r.end) for r in ranges] == [(0, 80), (80, 120), (120, 620)]


def test_objects_are_read_apart_and_a_chunk_named_twice_is_read_once() -> None:
    chunks = [chunk("b", 0, 10), chunk("a", 0, 10), chunk("b", 10, 10), chunk("a", 0, 10)]
    ranges = coalesce(chunks)
    assert [(r.object, r.start, r.end, len(r.chunks)) for r in ranges] == [
        ("a", 0, 10, 1),
        ("b", 0, 20, 2),
    ]


@given(
    st.lists(
        st.tuples(st.sampled_from("abc"), st.integers(0, 2000), st.integers(1, 300)),
        max_size=30,
    ),
    st.integers(0, 500),
    st.integers(1, 1500),
)
def test_every_chunk_is_in_exactly_one_range_that_holds_it(
    specs: list[tuple[str, int, int]], max_gap: int, max_range: int
) -> None:
    # one object's chunks do not overlap: give each (object, position) one size
    unique = {(obj, position): size for obj, position, size in specs}
    chunks = []
    for obj in "abc":
        end = -1
        for position in sorted(p for o, p in unique if o == obj):
            if position >= end:
                chunks.append(chunk(obj, position, unique[(obj, position)]))
                end = position + unique[(obj, position)]
    ranges = coalesce(chunks, max_gap, max_range)
    seen = [(c.object, c.position) for r in ranges for c in r.chunks]
    assert sorted(seen) == sorted((c.object, c.position) for c in chunks)
    for r in ranges:
        assert all(r.object == c.object and r.start <= c.position for c in r.chunks)
        assert all(c.position + c.size <= r.end for c in r.chunks)
        assert r.end - r.start <= max_range or len(r.chunks) == 1
        for before, after in itertools.pairwise(r.chunks):
            assert after.position - (before.position + before.size) <= max_gap
    for one, other in itertools.pairwise(ranges):
        assert one.object < other.object or one.end <= other.start  # no byte read twice


def batch(base: int, value: bytes) -> bytes:
    return build_batch([(None, value, (), 0)], base_offset=base)


@pytest.fixture
def store(tmp_path: Path) -> LocalObjectStore:
    return LocalObjectStore(str(tmp_path))


def test_a_range_is_cut_into_its_verified_chunks(store: LocalObjectStore) -> None:
    first, second = batch(0, b"a") + batch(1, b"b"), batch(7, b"c")
    store.put_if_absent("m", b"x" * 10 + first + b"gap" + second)
    chunks = (chunk("m", 10, len(first), 0, 1), chunk("m", 13 + len(first), len(second), 7))
    got = read_range(store, Range("m", 10, 13 + len(first) + len(second), chunks))
    assert got == {("m", 10): first, ("m", 13 + len(first)): second}


@pytest.mark.parametrize(
    "damage",
    ["crc", "offset", "short", "last offset"],
)
def test_a_chunk_that_is_not_its_batches_is_unreadable(
    store: LocalObjectStore, damage: str
) -> None:
    data = bytearray(batch(5, b"value"))
    base = 5
    if damage == "crc":
        data[-1] ^= 0xFF
    elif damage == "offset":
        base = 6
    store.put_if_absent("m", bytes(data))
    size = len(data) + (1 if damage == "short" else 0)  # committed longer than the object
    record = chunk("m", 0, size, base, 6 if damage == "last offset" else base)
    with pytest.raises(ChunkUnreadable):
        read_range(store, Range("m", 0, size, (record,)))


def test_an_object_gone_is_object_not_found(store: LocalObjectStore) -> None:
    with pytest.raises(ObjectNotFound):
        read_range(store, Range("gone", 0, 10, (chunk("gone", 0, 10),)))
