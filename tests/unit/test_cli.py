"""The ``kafscale`` command line, run as a user runs it."""

import subprocess
import sys
from pathlib import Path

from kafscale.storage.segment import build_segment
from tests.unit.storage.test_segment import make_batches


def kafscale(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kafscale", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
    )


def test_segments_dump_verifies_and_reports_corruption(tmp_path: Path) -> None:
    data, _ = build_segment(make_batches(0, [2, 3]), flags=0, created_ms=1_700_000_000_000)
    good = tmp_path / "segment-00000000000000000000.kfs"
    good.write_bytes(data)
    result = kafscale("segments", "dump", str(good), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "base offset" in result.stdout.lower()
    corrupt = bytearray(data)
    corrupt[40] ^= 0xFF  # inside the first batch
    bad = tmp_path / "bad.kfs"
    bad.write_bytes(corrupt)
    assert kafscale("segments", "dump", str(bad), cwd=tmp_path).returncode == 1
    missing = kafscale("segments", "dump", "no/such/key.kfs", cwd=tmp_path)
    assert missing.returncode == 2 and "cannot read" in missing.stderr


def test_serve_rejects_invalid_configuration_naming_the_variable(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "kafscale", "serve"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={"KAFSCALE_BROKER_PORT": "99999", "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 2
    assert "KAFSCALE_BROKER_PORT" in result.stderr
