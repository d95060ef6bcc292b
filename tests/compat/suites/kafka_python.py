"""kafka-python's own integration tests (`test/integration` of its PyPI sdist) against KafScale.

The sdist ships `test/integration` but not `test/__init__.py` (without it `test` resolves to
CPython's stdlib package) nor `test/service.py` (the process wrappers its fixtures import). We
write those two stubs into a scratch copy of `test/`, set `KAFKA_URI` so that its
`kafka_broker_factory` returns an external broker (ours), and run it with pytest in a
subprocess. Only the scratch copy under `work` holds the project's files; the venv's installed
kafka-python (the same pinned version) is what gets tested, not the sdist's `kafka/`.

Outcomes come from pytest's junit XML; the node ids from a `--collect-only` pass first, so a
test that never reported (the run was cut short) still comes out, as failed.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from tests.compat.suites import SuiteResult, TestResult, now_iso

SUITE = "kafka-python test/integration"
PACKAGE = "kafka-python"
VERSION = "3.0.12"  # must equal the venv's kafka-python: the suite tests the installed client
SDIST = f"kafka_python-{VERSION}.tar.gz"
SDIST_SHA256 = "4ccda3616b9aa5c353d74a97f2770d6cd1b950890d77ab0e8890e09a48eeed65"

# KAFKA_VERSION gates tests (skipif < version) and is the clients' api_version. 4.0 is what
# kafka-python infers from KafScale's ApiVersions (it looks for ListOffsets v10), so
# `test_kafka_version_infer` checks the value KafScale really yields.
KAFKA_VERSION = "4.0"
TEST_TIMEOUT_S = 120  # per test; the suite's own default is 300
SUITE_TIMEOUT_S = 45 * 60  # the whole run; a hang beyond this is killed and reported per test

# The settings of the suite's own broker (kafka-python's servers/resources/*/kafka.properties,
# not in the sdist) that KafScale also has, by Kafka's name: (KAFSCALE_* variable, value).
# `test_group` asks for a 3 s session timeout, below Kafka's default minimum of 6 s.
SUITE_BROKER_CONFIG = {
    "group.min.session.timeout.ms": ("KAFSCALE_GROUP_MIN_SESSION_TIMEOUT_MS", "1000"),
    "group.initial.rebalance.delay.ms": ("KAFSCALE_GROUP_INITIAL_REBALANCE_DELAY_MS", "0"),
    "num.partitions": ("KAFSCALE_AUTO_CREATE_PARTITIONS", "4"),  # KafkaFixture's partitions=4
    # an authorizer that allows what no ACL mentions: `test_create_describe_delete_acls`
    "authorizer.class.name": ("KAFSCALE_AUTHORIZER", "acl"),
    "allow.everyone.if.no.acl.found": ("KAFSCALE_ALLOW_EVERYONE_IF_NO_ACL_FOUND", "true"),
}
# Start the broker with these: `suite_broker(work, env=BROKER_ENV)`.
BROKER_ENV = dict(SUITE_BROKER_CONFIG.values())

_I = "test/integration/"
_ADMIN = _I + "test_admin_integration.py::"
_PRODUCER = _I + "test_producer_integration.py::"

# Tests we do not run: test id (a node id, or a prefix ending before "::" or "[") -> why.
# Only APIs KafScale does not serve, or fixtures that cannot use an external broker.
# test_sasl_integration.py is not listed: it marks itself skipif KAFKA_URI (its sasl_kafka
# fixture starts its own SASL Kafka per mechanism), so the suite reports it skipped.
SKIP: dict[str, str] = {
    # Transactions: KafScale has no transaction coordinator (no AddPartitionsToTxn, EndTxn,
    # AddOffsetsToTxn, TxnOffsetCommit), so init_transactions() cannot succeed.
    _PRODUCER + "test_transactional_producer_messages": "transactions: not supported by KafScale",
    _PRODUCER + "test_transactional_producer_offsets": "transactions: not supported by KafScale",
    # Admin APIs KafScale does not serve (absent from its ApiVersions; docs/compatibility.md).
    _ADMIN + "test_elect_leaders": "ElectLeaders: KafScale has no replicas or leader elections",
    _ADMIN + "test_alter_replica_log_dirs": "AlterReplicaLogDirs: not served by KafScale (one "
    "log dir per broker, no replicas to move)",
    _ADMIN + "test_alter_partition_reassignments": "AlterPartitionReassignments: KafScale has "
    "no replicas to reassign",
    _ADMIN + "test_list_partition_reassignments": "ListPartitionReassignments: KafScale has "
    "no replicas to reassign",
    _ADMIN + "test_describe_metadata_quorum": "DescribeQuorum: KafScale has no KRaft quorum "
    "(metadata lives in etcd)",
    _ADMIN + "test_describe_topic_partitions": "DescribeTopicPartitions: not supported by KafScale",
    _ADMIN + "test_describe_topic_partitions_pagination": "DescribeTopicPartitions: not "
    "supported by KafScale",
    _ADMIN + "test_list_config_resources": "ListConfigResources: not supported by KafScale",
    # TLS: the `ssl_kafka` fixture always spawns its own SSL broker (keytool-generated
    # keystores, JVM from KAFKA_ROOT) and ignores KAFKA_URI.
    _I + "test_ssl_integration.py": "SSL: the ssl_kafka fixture always spawns its own SSL Kafka "
    "from KAFKA_ROOT (ignores KAFKA_URI), so cannot target KafScale's TLS listener; kafka-python "
    "over TLS is tested in tests/integration/test_security_clients.py",
}

# Failures we triaged, by test id: cause and plan, appended to the failure's reason. A test
# listed here still runs and counts as failed when it fails; an entry does nothing on a pass.
TRIAGED: dict[str, str] = {}

# The stubs for the files the sdist lacks (upstream has them in git, not in the sdist).
_STUB_HEADER = (
    '"""Written by KafScale tests/compat/suites/kafka_python.py: kafka-python\'s sdist lacks '
    'this file."""\n'
)
_SERVICE_STUB = (
    _STUB_HEADER
    + '''

class ExternalService:
    """A broker someone else runs (KAFKA_URI): nothing to start or stop."""

    def __init__(self, host, port):
        self.host, self.port = host, port

    def open(self):
        pass

    def close(self):
        pass

    def stop(self):
        pass

    def dump_logs(self):
        pass


class SpawnedService:
    """Starting Kafka/ZooKeeper processes is not supported here: set KAFKA_URI."""

    def __init__(self, *args, **kwargs):
        raise RuntimeError("this run uses an external broker (KAFKA_URI); cannot spawn Kafka")
'''
)


def run(bootstrap: str, work: Path) -> SuiteResult:
    """Run the suite against the broker at `bootstrap` ("host:port"), scratch files in `work`."""
    installed = importlib.metadata.version(PACKAGE)
    if installed != VERSION:
        raise RuntimeError(
            f"the venv has {PACKAGE} {installed} but the suite is pinned to {VERSION}: update "
            "VERSION and SDIST_SHA256 in this module and re-check SKIP against the new tests"
        )
    started, t0 = now_iso(), time.monotonic()
    work.mkdir(parents=True, exist_ok=True)
    run_dir = prepare(work)
    env = {
        "KAFKA_URI": f"PLAINTEXT://{bootstrap}",
        "KAFKA_VERSION": KAFKA_VERSION,
        # fixtures.py checks this is a directory even for an external broker; never used.
        "KAFKA_ROOT": str(_mkdir(work / "kafka-root-unused")),
    }
    process_env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("KAFKA_", "ZOOKEEPER_"))},
        **env,
    }
    collected = collect(run_dir, process_env)
    excluded = {name: reason for name in collected if (reason := skip_reason(name)) is not None}
    _check_deselect(collected, excluded)
    junit, log_path = work / "junit.xml", work / "pytest.log"
    junit.unlink(missing_ok=True)
    argv = [
        sys.executable, "-m", "pytest", "test/integration", "-p", "no:cacheprovider",
        f"--timeout={TEST_TIMEOUT_S}",
        "--timeout-method=signal",  # fails the test; "thread" (its default) exits pytest
        f"--junitxml={junit}", "-rA",
        *(f"--deselect={name}" for name in excluded),
    ]  # fmt: skip
    command = f"cd {shlex.quote(str(run_dir))} && " + shlex.join(
        [f"{k}={v}" for k, v in env.items()] + argv
    )
    finished = _run_logged(argv, run_dir, process_env, log_path, SUITE_TIMEOUT_S)
    reported = parse_junit(junit, collected) if junit.exists() else {}
    lost = f"no result: the pytest run {'ended' if finished else 'timed out'} before it " + (
        f"reported this test (see {log_path})"
    )
    tests = [
        _outcome(name, excluded, reported, lost)
        for name in [*collected, *(n for n in reported if n not in collected)]
    ]
    notes = [
        "a scratch copy of the sdist's test/, with stub test/__init__.py and test/service.py "
        "written by this module",
        f"KAFKA_VERSION={KAFKA_VERSION}: what kafka-python infers from KafScale's ApiVersions",
        "the broker is expected to run with "
        + ", ".join(f"{k}={v}" for k, v in BROKER_ENV.items())
        + " (the suite's own server.properties)",
    ]
    if not finished:
        notes.append(f"the run was killed after {SUITE_TIMEOUT_S} s")
    return SuiteResult(
        suite=SUITE,
        version=VERSION,
        source=f"PyPI sdist {PACKAGE}=={VERSION}",
        command=command,
        tests=tests,
        started=started,
        seconds=round(time.monotonic() - t0, 1),
        notes=notes,
    )


def prepare(work: Path) -> Path:
    """Fetch and unpack the sdist (once), and lay out a fresh scratch copy of its `test/`."""
    sdist = work / "dist" / SDIST
    if not sdist.exists():
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
             f"{PACKAGE}=={VERSION}", "-d", str(sdist.parent)],
            check=True, stdout=subprocess.DEVNULL,
        )  # fmt: skip
    digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
    if digest != SDIST_SHA256:
        raise RuntimeError(f"{sdist}: sha256 {digest}, expected {SDIST_SHA256}")
    source = work / SDIST.removesuffix(".tar.gz")
    if not (source / "test" / "integration" / "conftest.py").exists():
        with tarfile.open(sdist) as archive:
            archive.extractall(work, filter="data")
    run_dir = work / "run"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir()
    # Without the sdist's kafka/, so the installed client is imported; pyproject.toml carries
    # the suite's pytest options (log format, DEBUG capture, durations).
    shutil.copytree(source / "test", run_dir / "test")
    shutil.copy2(source / "pyproject.toml", run_dir / "pyproject.toml")
    (run_dir / "test" / "__init__.py").write_text(_STUB_HEADER)
    (run_dir / "test" / "service.py").write_text(_SERVICE_STUB)
    return run_dir


def collect(run_dir: Path, env: dict[str, str]) -> list[str]:
    """Node ids of every integration test, in the suite's order."""
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "test/integration", "-p", "no:cacheprovider",
         "--collect-only", "-q"],
        cwd=run_dir, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    ids = [line for line in out.stdout.splitlines() if line.startswith(_I) and "::" in line]
    if not ids:
        raise RuntimeError(f"collected no tests:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return ids


def skip_reason(name: str) -> str | None:
    for key, reason in SKIP.items():
        if name == key or name.startswith((key + "::", key + "[")):
            return reason
    return None


def _check_deselect(collected: list[str], excluded: dict[str, str]) -> None:
    # pytest's --deselect matches node id prefixes; make sure it takes no test we mean to run.
    for name in collected:
        if name not in excluded and name.startswith(tuple(excluded)):
            raise RuntimeError(f"--deselect of an excluded test would also drop {name}")


def _run_logged(
    argv: list[str], cwd: Path, env: dict[str, str], log_path: Path, timeout: float
) -> bool:
    """Run `argv` in its own session with output to `log_path`; False if it was killed."""
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        try:
            proc.wait(timeout)
            return True
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return False


def parse_junit(path: Path, collected: list[str]) -> dict[str, TestResult]:
    """Results by node id from pytest's junit XML (classname + name, mapped back to node ids)."""
    by_address = {_junit_address(name): name for name in collected}
    results: dict[str, TestResult] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        address = (case.get("classname", ""), case.get("name", ""))
        name = by_address.get(address) or "::".join(filter(None, address))
        seconds = round(float(case.get("time", "0")), 3)
        problem = case.find("failure")
        if problem is None:
            problem = case.find("error")
        skipped = case.find("skipped")
        if problem is not None:
            reason = failure_reason(problem.get("message", ""), problem.text or "")
            results[name] = TestResult(name, "failed", seconds, reason)
        elif skipped is not None:
            results[name] = TestResult(name, "skipped", seconds, skipped.get("message", ""))
        else:
            results[name] = TestResult(name, "passed", seconds)
    return results


def _junit_address(node_id: str) -> tuple[str, str]:
    # pytest's junitxml: path without ".py", "/" and "::" -> "."; the last part is the name.
    path, *rest = node_id.split("::")
    parts = [*path.removesuffix(".py").split("/"), *rest]
    return ".".join(parts[:-1]), parts[-1]


def failure_reason(message: str, text: str, limit: int = 300) -> str:
    """The first error lines of a pytest failure ("E   ..."), else its one-line message, and
    where in the suite it failed."""
    lines = [line[1:].strip() for line in text.splitlines() if line.startswith("E ")]
    # Drop pytest's "+  where x = f()" explanations of an assert's operands.
    lines = [line for line in lines if line and not line.startswith("+  where")]
    reason = " | ".join(lines) or message.strip()
    where = next((line for line in reversed(text.splitlines()) if line.startswith(_I)), "")
    suffix = f" ({where.split(': ')[0]})" if where else ""
    room = limit - len(suffix)
    return (reason if len(reason) <= room else reason[: room - 1] + "…") + suffix


def _outcome(
    name: str, excluded: dict[str, str], reported: dict[str, TestResult], lost: str
) -> TestResult:
    if name in excluded:
        return TestResult(name, "excluded", 0.0, excluded[name])
    if name not in reported:
        return TestResult(name, "failed", 0.0, lost)
    result = reported[name]
    note = TRIAGED.get(name)
    if result.outcome == "failed" and note:
        result.reason = f"{result.reason} — {note}"
    return result


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path
