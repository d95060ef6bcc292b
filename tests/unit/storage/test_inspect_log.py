"""``kafscale segments list``: a partition's committed log, segments and write-ahead chunks."""

from __future__ import annotations

from pathlib import Path

import pytest

from kafscale import cli
from kafscale import config as configuration
from kafscale.metadata import open_metadata_store
from kafscale.metadata.records import Keys, PartitionRecord, SegmentRecord, encode
from kafscale.storage.inspect_log import describe, main

TOPIC_ID = "00112233-4455-6677-8899-aabbccddeeff"
WAL_KEY = "default/!wal/1/0123456789abcdef/0000000007.wal"
SEGMENT = SegmentRecord(0, 9, 1200, 24, 10, 1_700_000_000_009, 1_700_000_000_000)
CHUNK = SegmentRecord(
    10, 11, 140, 0, 2, 1_700_000_000_011, 1_700_000_000_010, object=WAL_KEY, position=184, codec=4
)
STATE = PartitionRecord(TOPIC_ID, high_watermark=12, owner=1, leader_epoch=3)


def test_describe_shows_segments_and_chunks_in_offset_order() -> None:
    lines = describe("default", "orders", 2, STATE, [CHUNK, SEGMENT])
    assert lines == [
        f"partition orders-2 (topic id {TOPIC_ID}): high watermark 12, log start offset 0, "
        "owner 1, leader epoch 3",
        "2 entries: 1 segments, 1 chunks",
        "offsets 0..9: segment default/orders/2/segment-00000000000000000000.kfs, 1200 bytes "
        "(index 24 bytes), 10 records, max timestamp 1700000000009 ms "
        "(2023-11-14T22:13:20.009Z), created 1700000000000 ms (2023-11-14T22:13:20.000Z)",
        f"offsets 10..11: chunk of {WAL_KEY} @ 184, 140 bytes, codec zstd, 2 records, "
        "max timestamp 1700000000011 ms (2023-11-14T22:13:20.011Z), "
        "created 1700000000010 ms (2023-11-14T22:13:20.010Z)",
    ]


def test_describe_flags_gaps_and_a_short_log() -> None:
    later = SegmentRecord(13, 14, 100, 0, 2, -1, 0, object=WAL_KEY, position=32)
    lines = describe("default", "orders", 2, STATE, [SEGMENT, later])
    assert "GAP: offsets 10..12 are in no entry" in lines
    assert lines[-2].startswith("offsets 13..14: chunk of ")
    assert lines[-1] == "MISMATCH: the last entry ends at 14, the high watermark is 12"
    lines = describe("default", "orders", 2, STATE, [SEGMENT])
    assert lines[-1] == "MISMATCH: the last entry ends at 9, the high watermark is 12"
    empty = describe("default", "orders", 2, PartitionRecord(TOPIC_ID), [])
    assert empty[1:] == ["0 entries: 0 segments, 0 chunks"]


def test_main_reads_the_configured_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("KAFSCALE_ETCD_ENDPOINTS", "KAFSCALE_S3_NAMESPACE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KAFSCALE_DATA_DIR", str(tmp_path))
    store = open_metadata_store(configuration.load({"KAFSCALE_DATA_DIR": str(tmp_path)}))
    keys = Keys("default")
    store.put(keys.partition("orders", 2), encode(STATE))
    store.put(keys.segment("orders", 2, 0), encode(SEGMENT))
    store.put(keys.segment("orders", 2, 10), encode(CHUNK))
    store.close()
    assert main(["orders", "2"]) == 0
    out = capsys.readouterr().out
    assert f"offsets 10..11: chunk of {WAL_KEY} @ 184, 140 bytes" in out
    assert "offsets 0..9: segment default/orders/2/segment-00000000000000000000.kfs" in out
    assert main(["orders", "3"]) == 1
    assert "no partition orders-3" in capsys.readouterr().err
    assert cli.main(["segments", "list", "orders", "2"]) == 0
    assert "1 segments, 1 chunks" in capsys.readouterr().out
