"""The shard's read path meeting batches no broker validated (written by an older version or
another implementation): ListOffsets by timestamp answers CORRUPT_MESSAGE for that partition,
Fetch serves what is stored or a storage error, the fault is logged once, nothing raises."""

from __future__ import annotations

import logging
import struct
from collections.abc import Iterator
from typing import Any

import crc32c
import pytest

from kafscale.ipc import messages
from kafscale.ipc.rpc import Incoming
from kafscale.metadata.records import SegmentRecord
from kafscale.protocol import records
from kafscale.protocol.compression import Codec
from kafscale.protocol.errors import ErrorCode
from kafscale.shards.segments import CommittedSegments
from kafscale.storage import segment as segments
from tests.unit.protocol import poison
from tests.unit.protocol.poison import batch, record
from tests.unit.shards.test_reader import T0, TOPIC, Rig

# A v2 batch whose attributes say snappy over a plain body: its CRC is right.
SNAPPY_LIE = batch(
    record(0) + record(1, timestamp_delta=5), count=2, codec=Codec.SNAPPY, max_timestamp=T0 + 5
)
# 32 KiB that a zstd decoder would turn into 1 GiB.
BOMB = batch(poison.zstd_bomb(1 << 30), count=1, codec=Codec.ZSTD, base_timestamp=T0 + 100)


@pytest.fixture
def rig(tmp_path: Any) -> Iterator[Rig]:
    made = Rig(tmp_path)
    yield made
    made.close()


def _at(blob: bytes, base_offset: int) -> bytes:
    """``blob`` with its base offset assigned (outside the CRC)."""
    placed = bytearray(blob)
    records.patch_base_offset(placed, 0, base_offset)
    return bytes(placed)


def _commit_segment(rig: Rig, batches: list[bytes], base: int) -> SegmentRecord:
    """Write a segment straight into the store, as an older broker would have, uncached."""
    kfs, index = segments.build_segment(batches, 0, T0)
    ns = rig.config.s3_namespace
    rig.store.put_if_absent(segments.segment_key(ns, TOPIC, 0, base), kfs)
    rig.store.put_if_absent(segments.index_key(ns, TOPIC, 0, base), index)
    headers = [records.read_header(b) for b in batches]
    return SegmentRecord(
        base, headers[-1].last_offset, len(kfs), len(index),
        sum(h.records_count for h in headers), max(h.max_timestamp for h in headers), T0,
    )  # fmt: skip


def _restart_on(rig: Rig, committed: list[SegmentRecord]) -> None:
    rig.reader.close()
    rig.partition.close()
    rig.partition = rig.new_partition(
        CommittedSegments(committed), hw=committed[-1].last_offset + 1
    )
    rig.reader = rig.new_reader()


def _fault_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.parametrize("poisoned", [SNAPPY_LIE, BOMB], ids=["snappy-lie", "zstd-bomb"])
def test_list_offsets_by_timestamp_on_a_poison_segment_is_that_partitions_error(
    rig: Rig, poisoned: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    good = records.build_batch([(None, b"ok", (), T0)])
    committed = [
        _commit_segment(rig, [good], 0),
        _commit_segment(rig, [_at(poisoned, 1)], 1),
    ]
    _restart_on(rig, committed)
    caplog.set_level(logging.DEBUG)
    for _ in range(3):  # a client retrying
        [special, first, lookup] = rig.list_offsets(-1, T0, T0 + 1)
        assert (special.error_code, special.offset) == (0, 1 + poison_count(poisoned))
        assert (first.error_code, first.offset) == (0, 0)  # the good segment answers
        assert lookup.error_code == ErrorCode.corrupt_message
        assert "offsets 1.." in (lookup.message or "")
        assert ".kfs" not in (lookup.message or "")  # the object key stays in the log
    assert len(_fault_lines(caplog)) == 1  # logged once, not per request
    rig.fetch(0)  # the partition still serves what it can
    rig.wait_for(lambda: bool(rig.replies.sent))
    [(result, got)] = rig.answers()
    assert (result.error_code, got) == (0, [(0, b"ok")])


def poison_count(blob: bytes) -> int:
    return records.read_header(blob).records_count


def test_a_poison_batch_in_the_cache_or_a_buffer_is_contained(tmp_path: Any) -> None:
    for unflushed in ("false", "true"):
        rig = Rig(tmp_path / unflushed, KAFSCALE_FETCH_UNFLUSHED=unflushed)
        try:
            outcome = rig.partition.append(
                memoryview(SNAPPY_LIE), records.read_header(SNAPPY_LIE), rig.clock(), False
            )
            assert outcome.error == ErrorCode.none  # the shard validates before this, not here
            if unflushed == "false":
                rig.flush()  # committed, and its chunk is in the cache
            [answer] = rig.list_offsets(T0)
            assert answer.error_code == ErrorCode.corrupt_message, unflushed
            [latest] = rig.list_offsets(-1)
            assert (latest.error_code, latest.offset) == (0, 2)
        finally:
            rig.close()


def test_a_batch_with_a_negative_length_is_a_storage_error_for_fetch(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    """Framing no reader can follow (a length that points backwards, a CRC that matches
    nothing): the fetch gets KAFKA_STORAGE_ERROR instead of a reader looping forever."""
    good = records.build_batch([(None, b"ok", (), T0)])
    bad = bytearray(_at(good, 1))
    struct.pack_into(">i", bad, 8, -100)  # batch_length
    struct.pack_into(">I", bad, 17, crc32c.crc32c(b""))
    body = good + bytes(bad)
    header = segments.HEADER.pack(b"KAFS", 1, 0, 0, 2, T0, 0)
    footer = struct.pack(">Iq4s", crc32c.crc32c(body), 1, b"END!")
    ns = rig.config.s3_namespace
    rig.store.put_if_absent(segments.segment_key(ns, TOPIC, 0, 0), header + body + footer)
    committed = SegmentRecord(0, 1, len(header + body + footer), 0, 2, T0, T0)
    _restart_on(rig, [committed])
    rig.fetch(1)
    rig.wait_for(lambda: bool(rig.replies.sent))
    [(result, _)] = rig.answers()
    assert result.error_code == ErrorCode.kafka_storage_error
    rig.fetch(0)  # the batch before the bad one is still served
    rig.wait_for(lambda: bool(rig.replies.sent))
    [(result, got)] = rig.answers()
    assert (result.error_code, got) == (0, [(0, b"ok")])
    [lookup] = rig.list_offsets(T0)
    assert lookup.error_code == ErrorCode.kafka_storage_error  # the segment does not verify
    assert len(_fault_lines(caplog)) == 1


def test_list_offsets_runs_off_the_shards_loop(rig: Rig) -> None:
    """Decoding happens on a reader thread: on_list_offsets returns before any record is read."""
    rig.append(b"a", timestamp=T0)
    rig.flush()
    request = messages.ListOffsets([messages.OffsetQuery(TOPIC, rig.partition.topic_id, 0, T0)])
    rig.reader.on_list_offsets(Incoming(b"frontend", b"r", request), request)
    assert rig.replies.sent == []  # nothing answered inline
    rig.wait_for(lambda: bool(rig.replies.sent))
    message, _ = rig.replies.sent.pop()
    assert isinstance(message, messages.OffsetsListed)
    assert (message.results[0].error_code, message.results[0].offset) == (0, 0)
