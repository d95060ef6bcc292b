"""Other projects' integration suites run against a KafScale broker (issue 7).

Each suite module (`kgo`, `kafka_python`) fetches the project's published source from its package
registry into a scratch directory, runs it against a broker and returns a `SuiteResult`: every
test the suite has, with its outcome. `python -m tests.compat.suites` starts the broker, runs the
suites, writes `tests/compat/results/<suite>.json` and regenerates docs/compatibility.md.

Outcomes:
- "passed" / "failed": as the suite reported them; a failure carries its cause (`reason`) and,
  when known, the plan to fix it;
- "skipped": the suite skipped the test itself (a feature gate the broker's ApiVersions turned
  off, a missing environment variable), with the suite's own message;
- "excluded": we did not run it, for the reason given in the suite module's named skip list
  (only features KafScale does not offer, e.g. transactions).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

from tests.harness.broker import BrokerFactory, BrokerProcess
from tests.harness.etcd import EtcdServer
from tests.harness.minio import MinioServer

Outcome = Literal["passed", "failed", "skipped", "excluded"]
OUTCOMES: tuple[Outcome, ...] = ("passed", "failed", "skipped", "excluded")
RESULTS_DIR = Path(__file__).resolve().parents[1] / "results"


@dataclass
class TestResult:
    name: str
    outcome: Outcome
    seconds: float = 0.0
    reason: str = ""  # why it failed, was skipped or excluded


@dataclass
class SuiteResult:
    suite: str  # e.g. "franz-go pkg/kgo"
    version: str  # the published version run, e.g. "v1.22.2"
    source: str  # where it came from, e.g. "Go module proxy: github.com/twmb/franz-go@v1.22.2"
    command: str  # the command that ran it, with its environment
    tests: list[TestResult] = field(default_factory=list)
    started: str = ""  # ISO date-time of the run
    seconds: float = 0.0
    broker: str = ""  # what it ran against, e.g. "kafscale serve, etcd + MinIO"
    notes: list[str] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        return {o: sum(1 for t in self.tests if t.outcome == o) for o in OUTCOMES}

    def write(self, directory: Path = RESULTS_DIR) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{slug(self.suite)}.json"
        path.write_text(json.dumps(asdict(self), indent=1, sort_keys=True) + "\n")
        return path

    @classmethod
    def read(cls, path: Path) -> SuiteResult:
        data = json.loads(path.read_text())
        tests = [TestResult(**t) for t in data.pop("tests")]
        return cls(tests=tests, **data)


def slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")


@contextmanager
def suite_broker(
    work: Path, env: dict[str, str] | None = None, *, port: int | None = None
) -> Iterator[BrokerProcess]:
    """A `kafscale serve` on real backends (its own etcd and MinIO) for one suite run; `port`
    fixes the Kafka port (some suites default to 9092). Stopped, with its servers, on exit."""
    etcd, minio = EtcdServer(work / "etcd"), MinioServer(work / "minio")
    etcd.start_first()
    try:
        minio.start_first()
        try:
            factory = BrokerFactory(work / "brokers", "suite", lambda: etcd, lambda: minio)
            overrides = dict(env or {})
            if port is not None:
                overrides["KAFSCALE_BROKER_PORT"] = str(port)
            try:
                yield factory(overrides, "real", ready=True)
            finally:
                problems = factory.close()
                if problems:
                    raise RuntimeError("\n\n".join(problems))
        finally:
            minio.close()
    finally:
        etcd.close()


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
