"""The ``kafscale`` command line, run as a user runs it."""

import subprocess
import sys
from pathlib import Path

import pytest

from kafscale import cli
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


def test_serve_refuses_a_credential_given_as_a_flag(tmp_path: Path) -> None:
    result = kafscale("serve", "--s3-secret-key", "wJalrXUtnFEMI-EXAMPLE", cwd=tmp_path)
    assert result.returncode == 2
    assert "--s3-secret-key is not accepted" in result.stderr
    assert "KAFSCALE_S3_SECRET_KEY_FILE" in result.stderr
    assert "wJalrXUtnFEMI-EXAMPLE" not in result.stderr + result.stdout


@pytest.mark.parametrize(
    ("argv", "variable"),
    [
        (["--s3-secret-key=x"], "KAFSCALE_S3_SECRET_KEY"),
        (["--s3-secret", "x"], "KAFSCALE_S3_SECRET_KEY"),  # an abbreviation is the same flag
        (["--s3-secret-key"], "KAFSCALE_S3_SECRET_KEY"),
        (["--s3-access-key", "AKIAEXAMPLE"], "KAFSCALE_S3_ACCESS_KEY"),
        (["--broker-port", "1", "--admin-token", "0123456789abcdef"], "KAFSCALE_ADMIN_TOKEN"),
    ],
)
def test_every_credential_flag_is_refused_naming_its_variable(
    argv: list[str], variable: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["serve", *argv])
    assert exited.value.code == 2
    assert f"Set {variable}, or {variable}_FILE" in capsys.readouterr().err


def test_serve_help_lists_no_credential_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["serve", "--help"])
    shown = capsys.readouterr().out
    assert "--s3-bucket" in shown
    for flag in ("--s3-access-key", "--s3-secret-key", "--admin-token"):
        assert flag not in shown
    assert "KAFSCALE_S3_SECRET_KEY" in shown  # the epilog says where credentials come from
