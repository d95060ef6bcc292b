"""The Spark reader over a log whose tail is still in chunks of write-ahead objects: one slice
per chunk, read with one ranged GET, the same rows as from segments."""

from __future__ import annotations

from pathlib import Path

import pytest

from kafscale.metadata.records import Keys, PartitionRecord, SegmentRecord, encode
from kafscale.metadata.sqlite import SqliteMetadataStore
from kafscale.protocol import records
from kafscale.spark import options as opts
from kafscale.spark.catalog import ListingCatalog
from kafscale.spark.plan import plan
from kafscale.storage import LocalObjectStore
from kafscale.storage import segment as segments
from kafscale.storage.segment import CorruptSegment
from tests.unit.spark.test_plan_and_read import (
    NS,
    T0,
    TOPIC,
    TOTAL,
    CountingStore,
    open_read,
    read_options,
    record,
    rows,
    write_topic,
)

WAL = f"{NS}/!wal/0/00000000000000ab/0000000000.wal"
OTHER_WAL = f"{NS}/!wal/0/00000000000000ab/0000000001.wal"
CHUNKS, PER_CHUNK = 3, 20  # offsets TOTAL .. TOTAL + 59, two batches of 10 each
END = TOTAL + CHUNKS * PER_CHUNK
AT = 200  # where the first chunk starts in the object (after its header and directory)


def add_chunks(data_dir: Path) -> list[SegmentRecord]:
    """Commit the log's tail as chunks of one write-ahead object, as the broker does."""
    objects = LocalObjectStore(str(data_dir / "segments"))
    store = SqliteMetadataStore(str(data_dir / "metadata.sqlite"))
    keys = Keys(NS)
    body, chunks = b"", []
    for c in range(CHUNKS):
        base = TOTAL + c * PER_CHUNK
        data = b"".join(
            records.build_batch([record(b + i) for i in range(10)], base_offset=b)
            for b in (base, base + 10)
        )
        last = base + PER_CHUNK - 1
        chunk = SegmentRecord(
            base, last, len(data), 0, PER_CHUNK, T0 + last * 1000, T0, WAL, AT + len(body)
        )
        store.put(keys.segment(TOPIC, 0, base), encode(chunk))
        chunks.append(chunk)
        body += data
    objects.put_if_absent(WAL, b"W" * AT + body + b"E" * 16)
    objects.put_if_absent(OTHER_WAL, b"not a segment")
    store.put(
        keys.partition(TOPIC, 0),
        encode(PartitionRecord("00000000-0000-4000-8000-000000000001", END, 0)),
    )
    store.close()
    return chunks


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    write_topic(tmp_path)
    add_chunks(tmp_path)
    return tmp_path


def test_a_log_of_segments_and_chunks_reads_back_record_for_record(data_dir: Path) -> None:
    objects, catalog = open_read(data_dir)
    slices = plan(read_options(data_dir), catalog, objects)
    assert [s.chunk for s in slices] == [False] * 5 + [True] * CHUNKS
    got = list(rows(objects, slices))
    assert [r["offset"] for r in got] == list(range(END))
    for row in got[TOTAL:]:
        key, value, headers, timestamp = record(row["offset"])
        assert (row["key"], row["value"]) == (key, value)
        assert [(h["key"], h["value"]) for h in row["headers"]] == headers
        assert int(row["timestamp"].timestamp() * 1000) == timestamp
    chunk_gets = [(s, n) for k, s, n in objects.gets if k == WAL]
    assert chunk_gets == [(s.start, s.end - s.start) for s in slices if s.chunk]
    assert chunk_gets[0][0] == AT


def test_bounds_inside_chunks_keep_only_their_records(data_dir: Path) -> None:
    objects, catalog = open_read(data_dir)
    bounds = {
        "startingOffsets": f'{{"{TOPIC}": {{"0": {TOTAL + 25}}}}}',
        "endingTimestamp": str(T0 + (TOTAL + 47) * 1000 - 1),  # first record at or after: 47
    }
    slices = plan(read_options(data_dir, **bounds), catalog, objects)
    assert [(s.base_offset, s.chunk) for s in slices] == [(TOTAL + 20, True), (TOTAL + 40, True)]
    assert [r["offset"] for r in rows(objects, slices)] == list(range(TOTAL + 25, TOTAL + 47))


def test_a_corrupt_chunk_fails_the_task_naming_object_and_position(data_dir: Path) -> None:
    objects, catalog = open_read(data_dir)
    slices = [s for s in plan(read_options(data_dir), catalog, objects) if s.chunk]
    data = bytearray(objects.inner.get(WAL))
    data[slices[1].start + 70] ^= 0xFF
    objects.inner.delete(WAL)
    objects.inner.put_if_absent(WAL, bytes(data))
    assert [r["offset"] for r in rows(objects, slices[:1])] == list(range(TOTAL, TOTAL + 20))
    with pytest.raises(CorruptSegment, match=rf"{WAL}: batch at position {slices[1].start}"):
        list(rows(objects, slices[1:2]))


def test_a_chunk_whose_object_is_gone_fails_the_task_clearly(data_dir: Path) -> None:
    objects, catalog = open_read(data_dir)
    slices = [s for s in plan(read_options(data_dir), catalog, objects) if s.chunk]
    objects.inner.delete(WAL)
    with pytest.raises(CorruptSegment, match=f"{WAL} is gone"):
        list(rows(objects, slices))


def test_the_listing_takes_no_write_ahead_object_for_a_topic(tmp_path: Path) -> None:
    write_topic(tmp_path, with_metadata=False)
    objects = CountingStore(LocalObjectStore(str(tmp_path / "segments")))
    objects.put_if_absent(WAL, b"W" * 100)
    catalog = ListingCatalog(objects, NS)
    selection = opts.parse({"dataDir": str(tmp_path), "subscribePattern": ".*"}).selection
    assert catalog.topics(selection) == {TOPIC: 1}
    assert catalog.partition(TOPIC, 0).high_watermark == TOTAL


def test_a_segment_record_of_the_previous_version_is_read_as_a_segment(tmp_path: Path) -> None:
    write_topic(tmp_path)
    store = SqliteMetadataStore(str(tmp_path / "metadata.sqlite"))
    old = (  # no object, position or codec: written before write-ahead objects existed
        b'{"base_offset":0,"last_offset":99,"size":%d,"index_size":1,"records":100,'
        b'"max_timestamp":%d,"created_ms":%d}'
    )
    kfs = segments.segment_key(NS, TOPIC, 0, 0)
    size = LocalObjectStore(str(tmp_path / "segments")).size(kfs)
    store.put(Keys(NS).segment(TOPIC, 0, 0), old % (size, T0 + 99_000, T0))
    store.close()
    objects, catalog = open_read(tmp_path)
    first = catalog.partition(TOPIC, 0).segments[0]
    assert (first.key, first.is_chunk, first.start) == (kfs, False, segments.HEADER_SIZE)
    slices = plan(read_options(tmp_path), catalog, objects)
    assert [r["offset"] for r in rows(objects, slices[:1])] == list(range(100))


def test_the_listing_takes_the_newest_cleaned_generation_over_what_it_replaced(
    tmp_path: Path,
) -> None:
    objects = LocalObjectStore(str(tmp_path / "segments"))

    def put(
        base: int, offsets: list[int], generation: int = 0, covers: tuple[int, int] | None = None
    ) -> None:
        batches = [records.build_batch([(b"k%d" % o, b"v", (), 1)], base_offset=o) for o in offsets]
        flags = segments.FLAG_CLEANED if covers else 0
        kfs, index = segments.build_segment(batches, flags, 1, covers=covers)
        objects.put_if_absent(segments.segment_key(NS, TOPIC, 0, base, generation), kfs)
        objects.put_if_absent(segments.index_key(NS, TOPIC, 0, base, generation), index)

    put(0, [0, 1, 2, 3, 4])
    put(5, [5, 6, 7, 8, 9])
    put(10, [10, 11])
    put(0, [3, 7], generation=1, covers=(0, 9))  # cleaned 0-9; 0 and 5 not yet deleted
    log = ListingCatalog(objects, NS).partition(TOPIC, 0)
    assert [(s.base_offset, s.last_offset) for s in log.segments] == [(0, 9), (10, 11)]
    assert log.segments[0].key == segments.segment_key(NS, TOPIC, 0, 0, 1)
    assert log.high_watermark == 12
