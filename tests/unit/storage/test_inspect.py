"""``kafscale segments dump``: what it prints, what it flags, and its exit codes."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from kafscale import cli
from kafscale.protocol.compression import Codec
from kafscale.protocol.records import patch_base_offset
from kafscale.storage import LocalObjectStore, wal
from kafscale.storage.inspect import dump, main
from kafscale.storage.segment import build_segment, index_key, segment_key
from tests.unit.protocol import poison
from tests.unit.storage.test_segment import CREATED_MS, make_batches
from tests.unit.storage.test_wal import chunk_of


def segment_and_index() -> tuple[list[bytes], bytes, bytes]:
    batches = make_batches(40, [2, 1, 3])
    data, index = build_segment(batches, flags=0, created_ms=CREATED_MS, index_interval=1)
    return batches, data, index


def dumped(data: bytes, with_records: bool = False) -> tuple[bool, str]:
    out = io.StringIO()
    ok = dump(data, out, with_records)
    return ok, out.getvalue()


def test_dump_prints_every_batch_and_verifies() -> None:
    batches, data, _ = segment_and_index()
    ok, text = dumped(data)
    assert ok
    assert "base offset 40, records 6" in text
    assert "created 1700000000000 ms (2023-11-14T22:13:20.000Z)" in text
    position = 32
    for number, (first, last, count) in enumerate([(40, 41, 2), (42, 42, 1), (43, 45, 3)]):
        assert f"batch {number} at position {position} ({len(batches[number])} bytes): " in text
        assert f"offsets {first}..{last}, {count} records, crc " in text
        position += len(batches[number])
    assert text.count(" ok") == 4  # three batches and the footer
    assert text.count("    codec none, timestamp type CreateTime") == 3
    assert "producer id -1 epoch -1 base sequence -1" in text
    assert "last offset 45" in text
    assert "BAD" not in text
    assert text.count("    records: ") == 3 and "records: 3 decoded" in text
    assert text.rstrip().endswith("result: every CRC verified, every record decoded")


def test_dump_names_the_bad_crc() -> None:
    batches, data, _ = segment_and_index()
    corrupt = bytearray(data)
    corrupt[32 + len(batches[0]) + len(batches[1]) - 1] ^= 0x01  # the last byte of batch 1
    ok, text = dumped(bytes(corrupt))
    assert not ok
    lines = text.splitlines()
    assert "BAD" in next(line for line in lines if line.startswith("batch 1 "))
    assert "BAD" not in next(line for line in lines if line.startswith("batch 0 "))
    assert "BAD" not in next(line for line in lines if line.startswith("batch 2 "))
    assert "BAD" in next(line for line in lines if line.startswith("footer: "))
    assert lines[-1] == "result: VERIFICATION FAILED"


def test_dump_reports_offsets_that_do_not_line_up() -> None:
    _, data, _ = segment_and_index()
    corrupt = bytearray(data)
    corrupt[16:20] = (7).to_bytes(4, "big")  # the header's record count, under no CRC
    ok, text = dumped(bytes(corrupt))
    assert not ok
    assert "BAD" not in text
    assert "verification: segment header at position 16: record count 7, batches hold 6" in text


def test_dump_survives_a_truncated_segment() -> None:
    _, data, _ = segment_and_index()
    for cut in (0, 10, 40, len(data) - 1):
        ok, text = dumped(data[:cut])
        assert not ok
        assert "VERIFICATION FAILED" in text


def test_dump_an_index() -> None:
    _, _, index = segment_and_index()
    ok, text = dumped(index)
    assert ok
    assert "3 entries, interval 1 records" in text
    assert "entry 0: offset 40 at position 32" in text
    ok, text = dumped(index[:-1])
    assert not ok


def test_main_on_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, data, _ = segment_and_index()
    good = tmp_path / "segment-00000000000000000040.kfs"
    good.write_bytes(data)
    assert main([str(good)]) == 0
    assert "every CRC verified" in capsys.readouterr().out
    bad = tmp_path / "bad.kfs"
    bad.write_bytes(data[:-20] + bytes(4) + data[-16:])
    assert main([str(bad)]) == 1
    assert "VERIFICATION FAILED" in capsys.readouterr().out


def test_main_on_keys_of_the_configured_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("KAFSCALE_S3_BUCKET", "KAFSCALE_S3_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KAFSCALE_DATA_DIR", str(tmp_path))
    monkeypatch.chdir(tmp_path)  # a key must not be mistaken for a local file
    _, data, index = segment_and_index()
    store = LocalObjectStore(str(tmp_path / "segments"))
    store.put_if_absent(segment_key("default", "orders", 0, 40), data)
    store.put_if_absent(index_key("default", "orders", 0, 40), index)
    assert main([segment_key("default", "orders", 0, 40)]) == 0
    assert main([index_key("default", "orders", 0, 40)]) == 0
    capsys.readouterr()
    assert main([segment_key("default", "orders", 0, 99)]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_dump_names_a_batch_whose_records_do_not_decode() -> None:
    """Stored without validation: attributes that say snappy over a plain body (a right CRC),
    and a zstd bomb, which is decoded only to the bound."""
    lie = poison.batch(poison.record(0) + poison.record(1), count=2, codec=Codec.SNAPPY)
    bomb = bytearray(poison.batch(poison.zstd_bomb(1 << 30), count=1, codec=Codec.ZSTD))
    patch_base_offset(bomb, 0, 2)
    data, _ = build_segment([lie, bytes(bomb)], flags=0, created_ms=CREATED_MS)
    ok, text = dumped(data)
    assert not ok
    lines = text.splitlines()
    verdicts = [line for line in lines if line.startswith("    records: ")]
    assert verdicts[0].startswith("    records: DO NOT DECODE: snappy")
    assert "decompresses to more than" in verdicts[1]
    assert "BAD" not in text  # every CRC is right
    assert lines[-1] == "result: VERIFICATION FAILED"


# --- write-ahead objects ------------------------------------------------------------------------


def wal_object() -> tuple[bytes, list[wal.DirectoryEntry]]:
    return wal.build_object(
        [chunk_of("orders", 0, 40, [2, 1]), chunk_of("payments", 3, 7, [1])], CREATED_MS
    )


def test_dump_a_wal_object() -> None:
    data, entries = wal_object()
    ok, text = dumped(data)
    assert ok
    lines = text.splitlines()
    assert lines[0] == f"write-ahead object: {len(data)} bytes"
    assert lines[1].startswith("header: magic b'KWAL', version 1, flags 0, created 1700000000000")
    assert "2 entries, directory of " in lines[1] and lines[1].endswith(" ok")
    first = entries[0]
    assert (
        f"entry 0: orders-0 (topic id {first.topic_id}), offsets 40..42, 3 records, chunk at "
        f"position {first.position} ({first.size} bytes), crc {first.crc:#010x} ok" in lines
    )
    assert any(line.startswith("entry 1: payments-3 ") for line in lines)
    assert "    codec none, max timestamp 1700000000001 ms" in text
    assert "footer: crc" in text and f"object size {len(data)}, magic b'END!'" in text
    assert "batch 0" not in text  # batches only with --records
    assert lines[-1] == "result: every CRC verified, every record decoded"


def test_dump_a_wal_object_with_records() -> None:
    data, entries = wal_object()
    ok, text = dumped(data, with_records=True)
    assert ok
    assert f"batch 0 at position {entries[0].position} (" in text
    assert "offsets 42..42, 1 records" in text
    assert text.count("    records: ") == 3 and "BAD" not in text


def test_dump_names_a_bad_chunk_and_directory() -> None:
    data, entries = wal_object()
    corrupt = bytearray(data)
    corrupt[entries[1].position + 30] ^= 0x01  # inside the payments chunk
    ok, text = dumped(bytes(corrupt), with_records=True)
    assert not ok
    lines = text.splitlines()
    assert "BAD" not in next(line for line in lines if line.startswith("entry 0: "))
    assert "BAD" in next(line for line in lines if line.startswith("entry 1: "))
    assert "BAD" in next(line for line in lines if line.startswith("footer: "))
    assert "verification: chunk 1 (payments-3)" in text
    assert lines[-1] == "result: VERIFICATION FAILED"
    corrupt = bytearray(data)
    corrupt[40] ^= 0x01  # inside the directory: shown anyway, its CRC flagged
    ok, text = dumped(bytes(corrupt))
    assert not ok and "BAD (computed" in text.splitlines()[1]


def test_dump_survives_a_truncated_wal_object() -> None:
    data, _ = wal_object()
    for cut in range(len(data)):
        ok, text = dumped(data[:cut], with_records=True)
        assert not ok
        assert text.rstrip().endswith("result: VERIFICATION FAILED")


def test_dump_survives_any_flipped_byte_of_a_wal_object() -> None:
    data, _ = wal_object()
    for position in range(len(data)):
        flipped = bytearray(data)
        flipped[position] ^= 0xFF
        ok, _ = dumped(bytes(flipped), with_records=True)
        assert ok == (8 <= position < 16)  # the header's created_ms is under no CRC


def test_main_on_a_wal_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("KAFSCALE_S3_BUCKET", "KAFSCALE_S3_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KAFSCALE_DATA_DIR", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    data, _ = wal_object()
    key = wal.object_key("default", 0, "0123456789abcdef", 0)
    LocalObjectStore(str(tmp_path / "segments")).put_if_absent(key, data)
    assert main([key]) == 0
    assert "batch 0" not in capsys.readouterr().out
    assert main([key, "--records"]) == 0
    assert "batch 0" in capsys.readouterr().out
    assert cli.main(["segments", "dump", key, "--records"]) == 0
    assert "batch 0" in capsys.readouterr().out
