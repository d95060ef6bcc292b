"""franz-go's `pkg/kgo` test suite (its integration tests and its unit tests) against KafScale.

The published module is fetched from the Go module proxy at a pinned version, copied into the
run's scratch directory (the module cache is read-only), and its test binary is built once into
`.tools/franz-go-kgo/<version>/` so a rerun does not rebuild. The binary runs under `go tool
test2json`, whose events give one `TestResult` per test and per subtest ("TestGroupETL/range").

The whole package runs, unit tests included (they need no broker and take seconds), except the
tests in `EXCLUDED`. The suite turns off by itself what the broker's ApiVersions does not offer
(KIP-848 and share groups) and what needs an environment we do not give (SCRAM); those come out
as "skipped" with the suite's own message.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from tests.compat.suites import SuiteResult, TestResult, now_iso

MODULE = "github.com/twmb/franz-go"
VERSION = "v1.22.2"
PACKAGE = f"{MODULE}/pkg/kgo"
ROOT = Path(__file__).resolve().parents[3]
BINARY = ROOT / ".tools" / "franz-go-kgo" / VERSION / "kgo.test"
GO = shutil.which("go") or "/usr/local/go/bin/go"  # where the Go tarball installs it

# Tests we do not run, by name, and why: only features KafScale does not offer.
EXCLUDED: dict[str, str] = {
    # Transactional producer + GroupTransactSession + read_committed fetches: needs
    # AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit and EndTxn, which KafScale does not
    # implement (it answers them UNSUPPORTED_VERSION). It would fail with t.Errorf, not skip.
    "TestTxnEtl": "needs transactions (AddPartitionsToTxn, TxnOffsetCommit, EndTxn), "
    "which KafScale does not offer",
}

# Failures we know the cause of and have not fixed yet: the text (cause and plan) is added to the
# test's own failure message. These tests still run and still count as failed.
KNOWN_FAILURES: dict[str, str] = {}

# The suite's knobs (pkg/kgo/helpers_test.go). Defaults are sized for a 3-broker Kafka: 500,000
# records through three chained group levels and up to 31 partitions per temporary topic; these
# keep the run within ~15 minutes on 2 cores against the Python broker.
KNOBS = {
    "KGO_TEST_RF": "1",  # one broker: replication factor 1 for every CreateTopics
    "KGO_TEST_RECORDS": "20000",  # records produced and re-consumed by TestGroupETL
    "KGO_TEST_MAX_TOPIC_PARTS": "4",  # caps the {7, 11, 31} partitions of temporary topics
    "KGO_LOG_LEVEL": "none",  # client logs go to the test output and would drown the reasons
}
# The broker's configuration for this suite (pass it to `suite_broker`). An acks=all produce is
# answered once its data is in S3, so a produce waits for the next flush; several tests produce
# tens of thousands of records with a few kilobytes in flight (TestClient_Produce: 20,000
# ProduceSync calls under MaxBufferedBytes(5000)), which at the default 500 ms flush interval
# takes over 20 minutes; at 50 ms it takes about 4 minutes on 2 cores.
BROKER_ENV = {"KAFSCALE_FLUSH_INTERVAL_MS": "50"}
PARALLEL = 4  # tests marked t.Parallel() run 4 at a time; most of them mostly sleep
TEST_TIMEOUT_MINUTES = 18  # the binary panics after this, naming the tests still running
REASON_CHARS = 300


def run(bootstrap: str, work: Path) -> SuiteResult:
    """Fetch, build (once per version) and run franz-go's pkg/kgo tests against `bootstrap`."""
    env = go_env()
    source_dir = fetch_module(work, env)
    binary = build_test_binary(source_dir, env)
    package_dir = source_dir / "pkg" / "kgo"
    listed = list_tests(binary, package_dir)
    skip = "^(" + "|".join(re.escape(name) for name in sorted(EXCLUDED)) + ")$"
    test_env = {"KGO_SEEDS": bootstrap, **KNOBS}
    argv = [
        GO,
        "tool",
        "test2json",
        "-t",
        "-p",
        PACKAGE,
        str(binary),
        "-test.v=test2json",
        "-test.count=1",
        f"-test.parallel={PARALLEL}",
        f"-test.timeout={TEST_TIMEOUT_MINUTES}m",
        f"-test.skip={skip}",
    ]
    events_path, stderr_path = work / "kgo-events.jsonl", work / "kgo-stderr.log"
    started, clock = now_iso(), time.monotonic()
    with events_path.open("wb") as events, stderr_path.open("wb") as stderr:
        run_bounded(argv, package_dir, {**env, **test_env}, events, stderr)
    seconds = time.monotonic() - clock
    tests = parse_events(events_path.read_text(errors="replace").splitlines())
    for test in tests:
        if test.outcome == "failed" and test.name in KNOWN_FAILURES:
            test.reason = f"{test.reason} -- {KNOWN_FAILURES[test.name]}"
    tests += [
        TestResult(name, "excluded", 0.0, EXCLUDED[name]) for name in listed if name in EXCLUDED
    ]
    shown_env = " ".join(f"{k}={v}" for k, v in test_env.items())
    return SuiteResult(
        suite="franz-go pkg/kgo",
        version=VERSION,
        source=f"Go module proxy: {MODULE}@{VERSION} (package {PACKAGE})",
        command=f"cd pkg/kgo && {shown_env} go tool test2json -t -p {PACKAGE} "
        f"kgo.test {' '.join(argv[7:])}",
        tests=sorted(tests, key=lambda t: t.name),
        started=started,
        seconds=round(seconds, 1),
        notes=[
            "test binary built with `go test -c ./pkg/kgo` from the module's own go.mod/go.sum "
            "(GOWORK=off, GOFLAGS='-mod=mod -buildvcs=false'); unit tests of pkg/kgo run too",
            f"knobs: {shown_env}, -parallel {PARALLEL}; the broker runs with "
            + " ".join(f"{k}={v}" for k, v in BROKER_ENV.items()),
        ],
    )


def run_bounded(
    argv: list[str], cwd: Path, env: dict[str, str], stdout: IO[bytes], stderr: IO[bytes]
) -> None:
    """Run test2json and the test binary in their own process group; kill the group if the
    binary's own -test.timeout did not end it in time."""
    process = subprocess.Popen(
        argv, cwd=cwd, env=env, stdout=stdout, stderr=stderr, start_new_session=True
    )
    try:
        process.wait(timeout=(TEST_TIMEOUT_MINUTES + 2) * 60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def go_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(GO).parent}{os.pathsep}{env.get('PATH', '')}"
    env["GOWORK"] = "off"
    env["GOFLAGS"] = "-mod=mod -buildvcs=false"
    env.setdefault("GOPATH", str(Path.home() / "go"))
    return env


def go(args: list[str], cwd: Path, env: dict[str, str]) -> str:
    done = subprocess.run(
        [GO, *args], cwd=cwd, env=env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"go {' '.join(args)} failed ({done.returncode}):\n{done.stderr[-3000:]}"
        )
    return done.stdout


def fetch_module(work: Path, env: dict[str, str]) -> Path:
    """A writable copy of the module's source in `work`, its dependencies downloaded."""
    work.mkdir(parents=True, exist_ok=True)
    info = json.loads(go(["mod", "download", "-json", f"{MODULE}@{VERSION}"], work, env))
    copy = work / f"franz-go@{VERSION}"
    if copy.exists():
        shutil.rmtree(copy)
    shutil.copytree(info["Dir"], copy)
    for path in [copy, *copy.rglob("*")]:
        path.chmod(path.stat().st_mode | 0o200)
    go(["mod", "download"], copy, env)
    return copy


def build_test_binary(source_dir: Path, env: dict[str, str]) -> Path:
    if BINARY.exists():
        return BINARY
    BINARY.parent.mkdir(parents=True, exist_ok=True)
    partial = BINARY.with_suffix(f".tmp{os.getpid()}")
    go(["test", "-c", "-o", str(partial), "./pkg/kgo"], source_dir, env)
    partial.replace(BINARY)
    return BINARY


def list_tests(binary: Path, package_dir: Path) -> list[str]:
    done = subprocess.run(
        [str(binary), "-test.list", "^(Test|Example)"],
        cwd=package_dir,
        capture_output=True,
        text=True,
        check=True,
    )
    return [line for line in done.stdout.split() if line.startswith(("Test", "Example"))]


@dataclass
class _Test:
    output: list[str] = field(default_factory=list)
    action: str = ""
    seconds: float = 0.0


# Lines of a test's output that say nothing about why it failed: test2json's framing and the
# suite's note that it keeps a failed test's topics.
_NOISE = re.compile(
    r"^\s*(=== (RUN|PAUSE|CONT|NAME)|--- (PASS|FAIL|SKIP):|\S+_test\.go:\d+: FAILED TESTING -- NOT)"
)


def parse_events(lines: list[str]) -> list[TestResult]:
    """One TestResult per test and subtest in test2json events; a test that started but never
    ended (the binary panicked or timed out) fails with the binary's last words."""
    tests: dict[str, _Test] = {}
    package_output: list[str] = []
    for line in lines:
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            package_output.append(line)
            continue
        name = event.get("Test")
        if not name:
            if event.get("Action") == "output":
                package_output.append(event.get("Output", ""))
            continue
        test = tests.setdefault(name, _Test())
        action = event.get("Action")
        if action == "output":
            test.output.append(event.get("Output", ""))
        elif action in ("pass", "fail", "skip"):
            test.action = action
            test.seconds = float(event.get("Elapsed") or 0.0)
    results = []
    for name, test in tests.items():
        if test.action == "pass":
            results.append(TestResult(name, "passed", test.seconds))
        elif test.action == "skip":
            # The t.Skip message; the lines after it are the test's deferred cleanup logs.
            results.append(TestResult(name, "skipped", test.seconds, said(test.output, 1)))
        elif test.action == "fail":
            reason = said(test.output) or failed_subtests(name, tests)
            results.append(TestResult(name, "failed", test.seconds, reason))
        else:
            last_words = said(package_output[-40:]) or "no output"
            reason = f"did not finish: the test binary stopped ({last_words})"
            results.append(TestResult(name, "failed", test.seconds, trim(reason)))
    return results


def said(output: list[str], most: int | None = None) -> str:
    """The first `most` meaningful lines a test wrote (its t.Error/t.Skip messages), trimmed."""
    lines = [line.strip() for line in output if not _NOISE.match(line)]
    return trim(" | ".join([line for line in lines if line][:most]))


def failed_subtests(name: str, tests: dict[str, _Test]) -> str:
    prefix = name + "/"
    failed = [n for n, t in tests.items() if n.startswith(prefix) and t.action in ("fail", "")]
    failed = [n for n in failed if "/" not in n[len(prefix) :]] or failed
    return trim("subtests failed: " + ", ".join(failed)) if failed else ""


def trim(text: str) -> str:
    return text if len(text) <= REASON_CHARS else text[: REASON_CHARS - 3] + "..."
