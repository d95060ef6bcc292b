"""Options, settings and the merged report of the pytest-xdist load test (test_load.py).

The options are read once per process into a frozen `LoadSettings`. The run id names every topic
and consumer group; when it is not given, the xdist controller draws one and hands it to its
workers through `workerinput`, so all cases of one session share it.

Each case appends one JSON line to `<report>.<worker id>.jsonl` (one file per process, so no two
writers share a file). The controller (or the lone process without xdist) removes stale pieces at
session start and, at session finish, merges the pieces into `<report>` and deletes them.
"""

from __future__ import annotations

import glob
import json
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

# Room for the case's own deadline, topic creation and closing the clients: pytest-timeout (the
# repository's pyproject.toml sets 300 s) must not end a case that is still within its deadline.
TIMEOUT_MARGIN_SECONDS = 120.0

# The header test_load.py puts at the start of every value; a record must hold it.
MIN_RECORD_SIZE = 20

_run_id_key = pytest.StashKey[str]()
_session_start_key = pytest.StashKey[float]()


@dataclass(frozen=True)
class LoadSettings:
    bootstrap: str | None
    records: int
    record_size: int
    run_id: str
    partitions: int
    timeout: float
    # This process's `<report>.<worker id>.jsonl`; None without --load-report.
    report_piece: Path | None
    worker_id: str

    def append_report(self, line: dict[str, Any]) -> None:
        """Appends one case's measurements to this process's report piece (if there is a report)."""
        if self.report_piece is not None:
            with self.report_piece.open("a", encoding="utf-8") as piece:
                piece.write(json.dumps(line) + "\n")


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(f"{text} is not a positive integer")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise ValueError(f"{text} is not a positive number")
    return value


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("load", "load test against a running broker (bench/load)")
    group.addoption(
        "--load-bootstrap", help="bootstrap servers of the broker under test (required)"
    )
    group.addoption("--load-records", type=_positive_int, default=20000, help="records per case")
    group.addoption("--load-record-size", type=_positive_int, default=1024, help="value bytes")
    group.addoption("--load-run-id", help="names topics and groups (default: random hex)")
    group.addoption("--load-report", help="write the merged JSON report to this path")
    group.addoption("--load-partitions", type=_positive_int, default=3, help="per topic")
    group.addoption("--load-cases", type=_positive_int, default=8, help="parametrized cases")
    group.addoption(
        "--load-timeout", type=_positive_float, default=300.0, help="seconds each case may take"
    )


def _is_controller(config: pytest.Config) -> bool:
    """The xdist controller, or the only process when xdist is off."""
    return not hasattr(config, "workerinput")


def _worker_id(config: pytest.Config) -> str:
    workerinput: dict[str, Any] | None = getattr(config, "workerinput", None)
    return "main" if workerinput is None else str(workerinput["workerid"])


def _report_pieces(report: str) -> list[str]:
    return sorted(glob.glob(glob.escape(report) + ".*.jsonl"))


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("load_record_size") < MIN_RECORD_SIZE:
        raise pytest.UsageError(f"--load-record-size must be at least {MIN_RECORD_SIZE} bytes")
    workerinput: dict[str, Any] | None = getattr(config, "workerinput", None)
    if workerinput is not None and "load_run_id" in workerinput:
        config.stash[_run_id_key] = str(workerinput["load_run_id"])
    else:
        config.stash[_run_id_key] = config.getoption("load_run_id") or secrets.token_hex(4)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist controller: every worker gets the controller's run id."""
    node.workerinput["load_run_id"] = node.config.stash[_run_id_key]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "case" in metafunc.fixturenames:
        metafunc.parametrize("case", range(metafunc.config.getoption("load_cases")))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.pluginmanager.hasplugin("timeout"):
        seconds = config.getoption("load_timeout") + TIMEOUT_MARGIN_SECONDS
        for item in items:
            item.add_marker(pytest.mark.timeout(seconds))


def pytest_sessionstart(session: pytest.Session) -> None:
    config = session.config
    if not _is_controller(config):
        return
    config.stash[_session_start_key] = time.monotonic()
    report = config.getoption("load_report")
    if report:
        for piece in _report_pieces(report):
            os.remove(piece)


def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    report = config.getoption("load_report")
    if not report or not _is_controller(config):
        return
    wall_seconds = time.monotonic() - config.stash[_session_start_key]
    cases: list[dict[str, Any]] = []
    pieces = _report_pieces(report)
    for piece in pieces:
        with open(piece, encoding="utf-8") as lines:
            cases.extend(json.loads(line) for line in lines if line.strip())
    cases.sort(key=lambda c: int(c["case"]))
    records = sum(int(c["records"]) for c in cases)
    total_bytes = sum(int(c["bytes"]) for c in cases)
    merged = {
        "run_id": config.stash[_run_id_key],
        "bootstrap": config.getoption("load_bootstrap"),
        "cases": cases,
        "records": records,
        "bytes": total_bytes,
        "wall_seconds": wall_seconds,
        "aggregate_mb_per_sec": total_bytes / 2**20 / wall_seconds,
        "aggregate_records_per_sec": records / wall_seconds,
        "failed": session.testsfailed,
        "workers": getattr(config.option, "numprocesses", None) or 1,
    }
    Path(report).write_text(json.dumps(merged, indent=2) + "\n", encoding="utf-8")
    for piece in pieces:
        os.remove(piece)


@pytest.fixture(scope="session")
def load_settings(pytestconfig: pytest.Config) -> LoadSettings:
    report = pytestconfig.getoption("load_report")
    worker_id = _worker_id(pytestconfig)
    return LoadSettings(
        bootstrap=pytestconfig.getoption("load_bootstrap"),
        records=pytestconfig.getoption("load_records"),
        record_size=pytestconfig.getoption("load_record_size"),
        run_id=pytestconfig.stash[_run_id_key],
        partitions=pytestconfig.getoption("load_partitions"),
        timeout=pytestconfig.getoption("load_timeout"),
        report_piece=Path(f"{report}.{worker_id}.jsonl") if report else None,
        worker_id=worker_id,
    )
