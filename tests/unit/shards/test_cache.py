"""The L1 cache's unit (``Chunk``) going on into the chunks after it (``Chunk.gather``), and
``EntryCache.continuing`` finding where a run of batches goes on."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kafscale.protocol import records
from kafscale.shards.cache import Chunk, EntryCache, chunk_of


def batch(base: int, count: int, size: int = 50) -> bytes:
    rows: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]], int]] = [
        (None, b"x" * size, [], 0) for _ in range(count)
    ]
    return records.build_batch(rows, base_offset=base)


def run(base: int, counts: list[int], size: int = 50, complete: bool = True) -> Chunk:
    """A chunk of batches of ``counts`` records each, from offset ``base``."""
    data, at = b"", base
    for count in counts:
        data += batch(at, count, size)
        at += count
    return chunk_of(data, complete=complete)


def offsets(data: bytes | memoryview) -> list[tuple[int, int]]:
    """(base, last) of every batch in ``data``."""
    out, position = [], 0
    while position < len(data):
        header = records.read_header(data, position)
        out.append((header.base_offset, header.last_offset))
        position += header.size
    return out


def lookup(*chunks: Chunk) -> dict[int, Chunk]:
    return {chunk.first_offset: chunk for chunk in chunks}


def test_a_run_of_small_chunks_is_gathered_into_one() -> None:
    chunks = [run(5 * i, [5]) for i in range(20)]
    after = lookup(*chunks[1:])
    got = chunks[0].gather(0, 1 << 20, after.get)
    assert offsets(got.data) == [(5 * i, 5 * i + 4) for i in range(20)]
    assert (got.first_offset, got.last_offset, got.complete) == (0, 99, False)
    assert bytes(got.batches_from(0, 1 << 20)) == b"".join(bytes(c.data) for c in chunks)
    assert bytes(got.batches_from(52, 1 << 20)) == b"".join(bytes(c.data) for c in chunks[10:])


def test_gathering_starts_at_the_batch_holding_the_offset() -> None:
    first = run(0, [3, 3, 3])
    second = run(9, [4])
    got = first.gather(4, 1 << 20, lookup(second).get)
    assert offsets(got.data) == [(3, 5), (6, 8), (9, 12)]
    assert got.first_offset == 3 and got.holds(4) and not got.holds(2)


def test_nothing_is_copied_when_nothing_follows_or_there_is_no_room() -> None:
    first = run(0, [5, 5])
    second = run(10, [5])
    assert first.gather(0, 1 << 20, lambda _: None) is first
    # the first chunk already fills max_bytes (or stops before its end): it is answered alone
    assert first.gather(0, len(first), lookup(second).get) is first
    assert first.gather(0, len(first.batch_bytes(0)), lookup(second).get) is first
    assert first.gather(0, 1, lookup(second).get) is first  # a batch over the limit, alone
    # the next batch would not fit whole
    assert first.gather(0, len(first) + len(second) - 1, lookup(second).get) is first


def test_gathering_stops_at_max_bytes_with_whole_batches_only() -> None:
    chunks = [run(4 * i, [2, 2]) for i in range(10)]
    one = len(chunks[0].batch_bytes(0))
    got = chunks[0].gather(0, 7 * one + one // 2, lookup(*chunks[1:]).get)
    assert offsets(got.data) == [(2 * i, 2 * i + 1) for i in range(7)]
    assert len(got) == 7 * one


def test_a_follower_is_taken_only_from_a_batch_beginning_where_the_run_ended() -> None:
    first = run(0, [5])
    # a cached part holding offset 5 inside a batch (4..7): not where a batch begins
    misaligned = run(4, [4])
    assert first.gather(0, 1 << 20, {5: misaligned}.get) is first
    # a part beginning before offset 5 whose second batch begins there
    overlapping = run(3, [2, 3, 2])
    got = first.gather(0, 1 << 20, {5: overlapping}.get)
    assert offsets(got.data) == [(0, 4), (5, 7), (8, 9)]


def test_a_follower_that_ends_early_ends_the_run_unless_another_goes_on() -> None:
    first = run(0, [5])
    part = run(5, [5, 5], complete=False)
    tail = run(15, [5])
    assert offsets(first.gather(0, 1 << 20, {5: part}.get).data) == [(0, 4), (5, 9), (10, 14)]
    got = first.gather(0, 1 << 20, {5: part, 15: tail}.get)
    assert offsets(got.data) == [(0, 4), (5, 9), (10, 14), (15, 19)]


@given(
    st.lists(st.lists(st.integers(1, 4), min_size=1, max_size=4), min_size=1, max_size=8),
    st.integers(0, 4000),
    st.data(),
)
def test_gathered_batches_are_the_log_from_the_offset_as_far_as_they_fit(
    layout: list[list[int]], max_bytes: int, data: st.DataObject
) -> None:
    chunks, base = [], 0
    for counts in layout:
        chunks.append(run(base, counts, size=20))
        base += sum(counts)
    offset = data.draw(st.integers(0, chunks[0].last_offset))
    got = chunks[0].gather(offset, max_bytes, lookup(*chunks[1:]).get)
    log = b"".join(bytes(c.data) for c in chunks)
    whole = chunk_of(log)
    expected = whole.batches_from(offset, max_bytes)
    first_only = chunks[0].batches_from(offset, max_bytes)
    # as many whole batches as the one log would give, or just the first chunk's when they
    # stop inside it
    assert bytes(got.batches_from(offset, max_bytes)) == bytes(expected)
    if len(expected) == len(first_only):
        assert got is chunks[0]


def test_continuing_finds_a_cached_run_where_a_batch_begins() -> None:
    cache = EntryCache(1 << 20, 1 << 20, "test")
    key = ("topic-id", 0, 0, "")
    early = run(0, [5, 5], complete=False)
    late = run(20, [5, 5], complete=False)
    cache.store(key, early)
    cache.store(key, late)
    assert cache.continuing(key, 5) is early
    assert cache.continuing(key, 25) is late
    assert cache.continuing(key, 7) is None  # inside a batch
    assert cache.continuing(key, 10) is None  # not cached
    assert cache.continuing(("topic-id", 0, 30, ""), 30) is None


def test_an_entry_is_held_all_when_its_parts_join_up() -> None:
    cache = EntryCache(1 << 20, 1 << 20, "test")
    key = ("topic-id", 0, 0, "")
    assert not cache.holds_all(key, 29)
    cache.store(key, run(0, [5, 5], complete=False))
    cache.store(key, run(20, [5, 5], complete=False))
    assert not cache.holds_all(key, 29)  # 10..19 missing
    cache.store(key, run(8, [2, 10], complete=False))  # overlaps the first part
    assert cache.holds_all(key, 29)
    assert not cache.holds_all(key, 30)  # the entry goes on past the parts
    assert not cache.holds_whole(key)


def test_chunks_moved_into_the_segment_that_replaced_them_hold_it_all() -> None:
    cache = EntryCache(1 << 20, 1 << 20, "test")
    chunks = [("topic-id", 0, base, "wal") for base in (0, 10, 20)]
    for key in chunks:
        cache.store(key, run(key[2], [4, 6]))
    segment = ("topic-id", 0, 0, "")
    cache.move(chunks, segment)
    assert cache.holds_all(segment, 29) and not cache.holds_whole(segment)
    cache.move([("topic-id", 0, 30, "wal")], ("topic-id", 0, 30, ""))  # nothing was cached
    assert not cache.holds_all(("topic-id", 0, 30, ""), 39)


@given(st.lists(st.tuples(st.integers(0, 40), st.integers(1, 10)), max_size=8))
def test_holds_all_is_every_offset_of_the_entry_covered(parts: list[tuple[int, int]]) -> None:
    cache = EntryCache(1 << 20, 1 << 20, "test")
    key = ("topic-id", 0, 0, "")
    covered: set[int] = set()
    for base, count in parts:
        cache.store(key, run(base, [count], complete=False))
        covered.update(range(base, base + count))
    for last in (9, 29, 49):
        assert cache.holds_all(key, last) == covered.issuperset(range(last + 1))
