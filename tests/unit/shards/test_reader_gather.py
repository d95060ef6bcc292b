"""A fetch going on past its entry: a partition's small committed entries (a chunk per flush
cycle) answered together, up to max_bytes, as far as the L1 cache holds them whole."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kafscale.ipc import messages
from kafscale.ipc.rpc import Incoming
from kafscale.metadata.records import SegmentRecord
from kafscale.protocol import records
from kafscale.shards.cache import chunk_of, entry_key
from kafscale.shards.segments import CommittedSegments
from kafscale.storage import segment as segments
from tests.unit.shards.test_reader import T0, TOPIC, TOPIC_ID, Rig

WAL = "default/!wal/0/00000000000000ab/0000000002.wal"
PER_BATCH = 5


def batch(base: int) -> bytes:
    rows: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]], int]] = [
        (None, b"v%03d" % (base + i) + b"." * 96, [], T0 + base + i) for i in range(PER_BATCH)
    ]
    return records.build_batch(rows, base_offset=base)


BATCH_BYTES = len(batch(0))


def values(first: int, stop: int) -> list[tuple[int, bytes]]:
    return [(o, b"v%03d" % o + b"." * 96) for o in range(first, stop)]


class Log:
    """A partition's committed log: optionally a spec segment of ``segment_batches`` batches,
    then ``chunks`` chunks of one batch each in one write-ahead object; every entry is in the
    store, none cached until ``cache`` says so."""

    def __init__(self, rig: Rig, chunks: int, segment_batches: int = 0) -> None:
        self.rig = rig
        self.entries: list[SegmentRecord] = []
        self.data: list[bytes] = []
        namespace = rig.config.s3_namespace
        if segment_batches:
            spans = [batch(PER_BATCH * i) for i in range(segment_batches)]
            kfs, index = segments.build_segment(spans, 0, T0, index_interval=2)
            rig.store.put_if_absent(segments.segment_key(namespace, TOPIC, 0, 0), kfs)
            rig.store.put_if_absent(segments.index_key(namespace, TOPIC, 0, 0), index)
            last = PER_BATCH * segment_batches - 1
            self.entries.append(
                SegmentRecord(0, last, len(kfs), len(index), last + 1, T0 + last, T0)
            )
            self.data.append(b"".join(spans))
        base, position, body = PER_BATCH * segment_batches, 64, b""
        for _ in range(chunks):
            data = batch(base)
            last = base + PER_BATCH - 1
            self.entries.append(
                SegmentRecord(
                    base, last, len(data), 0, PER_BATCH, T0 + last, T0, WAL, position + len(body)
                )
            )
            self.data.append(data)
            body += data
            base += PER_BATCH
        rig.store.put_if_absent(WAL, b"h" * position + body + b"f" * 16)
        rig.partition = rig.new_partition(CommittedSegments(self.entries), hw=base)

    def cache(self, *which: int) -> None:
        for i in which:
            key = entry_key(self.rig.partition, self.entries[i])
            self.rig.reader.cache.store(key, chunk_of(self.data[i], complete=True))

    def cached_whole(self, i: int) -> bool:
        return self.rig.reader.cache.holds_whole(entry_key(self.rig.partition, self.entries[i]))


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    made = Rig(tmp_path, KAFSCALE_READAHEAD_SEGMENTS="0")  # every GET is the test's
    yield made
    made.close()


def fetched(rig: Rig, offset: int, max_bytes: int = 1 << 20) -> list[tuple[int, bytes]]:
    rig.fetch(offset, max_bytes=max_bytes)
    rig.wait_for(lambda: bool(rig.replies.sent))
    [(result, got)] = rig.answers()
    assert result.error_code == 0
    return got


def test_a_fetch_over_small_cached_chunks_takes_them_all(rig: Rig) -> None:
    log = Log(rig, chunks=20)
    log.cache(*range(20))
    assert fetched(rig, 0) == values(0, 100)
    assert fetched(rig, 52) == values(50, 100)  # from the batch holding the offset
    assert rig.store.gets == 0


def test_a_fetch_stops_at_a_gap_in_the_cache_and_never_waits_for_it(rig: Rig) -> None:
    log = Log(rig, chunks=20)
    log.cache(*range(7), *range(8, 20))
    assert fetched(rig, 0) == values(0, 35)
    assert rig.store.gets == 0
    # the next fetch reads the missing chunk, and goes on into the cached ones after it
    assert fetched(rig, 35) == values(35, 100)
    assert rig.store.gets == 1


def test_a_fetch_stops_at_max_bytes_with_whole_batches(rig: Rig) -> None:
    log = Log(rig, chunks=20)
    log.cache(*range(20))
    assert fetched(rig, 0, max_bytes=7 * BATCH_BYTES + BATCH_BYTES // 2) == values(0, 35)
    assert fetched(rig, 0, max_bytes=7 * BATCH_BYTES) == values(0, 35)
    # the request's max_bytes bounds it too
    rig.fetch(10, total_bytes=3 * BATCH_BYTES + 1)
    [(_, got)] = rig.answers()
    assert got == values(10, 25)


def test_only_the_first_partition_of_a_response_may_pass_its_max_bytes(rig: Rig) -> None:
    log = Log(rig, chunks=20)
    log.cache(*range(20))
    entries = [
        messages.FetchEntry(TOPIC, TOPIC_ID, 0, 0, 5 * BATCH_BYTES),
        messages.FetchEntry(TOPIC, TOPIC_ID, 0, 50, 1 << 20),
        messages.FetchEntry(TOPIC, TOPIC_ID, 0, 80, 1 << 20),
    ]
    request = messages.Fetch(1, entries, 8 * BATCH_BYTES + BATCH_BYTES // 2, 1, 0)
    rig.reader.on_fetch(Incoming(b"frontend", b"r", request), request)
    [first, second, third] = rig.answers()
    assert first[1] == values(0, 25)
    assert second[1] == values(50, 65)  # what is left of the request's max_bytes
    assert (third[0].size, third[1]) == (0, [])
    # a batch bigger than the request's max_bytes: the first partition still gets it, alone
    rig.fetch(0, total_bytes=1)
    [(_, got)] = rig.answers()
    assert got == values(0, 5)


def test_a_segment_followed_by_chunks(rig: Rig) -> None:
    log = Log(rig, chunks=5, segment_batches=4)
    log.cache(0, 1, 2, 3, 4, 5)
    assert fetched(rig, 7) == values(5, 45)
    assert rig.store.gets == 0
    # read cold, the segment is read (its index, a range) and the cached chunks follow it
    rig.reader.cache.segments.discard(entry_key(rig.partition, log.entries[0]))
    assert fetched(rig, 0) == values(0, 45)
    assert rig.store.gets == 2


def test_nothing_changes_when_the_first_entry_fills_max_bytes(rig: Rig) -> None:
    log = Log(rig, chunks=3, segment_batches=4)
    log.cache(0, 1, 2, 3)
    assert fetched(rig, 0, max_bytes=4 * BATCH_BYTES) == values(0, 20)
    assert fetched(rig, 5, max_bytes=2 * BATCH_BYTES + 10) == values(5, 15)
    assert fetched(rig, 0, max_bytes=1) == values(0, 5)
    key = entry_key(rig.partition, log.entries[0])
    cached = rig.reader.cache.cached(key, 0)
    assert cached is not None
    assert cached.gather(0, 4 * BATCH_BYTES, lambda _: pytest.fail("looked further")) is cached


def test_read_ahead_starts_after_the_last_entry_answered(tmp_path: Path) -> None:
    rig = Rig(tmp_path, KAFSCALE_READAHEAD_SEGMENTS="2")
    try:
        log = Log(rig, chunks=20)
        log.cache(*range(10))
        assert fetched(rig, 0) == values(0, 50)
        rig.wait_for(lambda: log.cached_whole(10) and log.cached_whole(11))
        assert not log.cached_whole(12)
        rig.fetch(50)
        [(_, got)] = rig.answers()  # answered at once, from the cache
        assert got == values(50, 60)
    finally:
        rig.close()
