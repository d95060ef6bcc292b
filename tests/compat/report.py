"""Generates the compatibility section of docs/compatibility.md (issue 7).

    python -m tests.compat.report [--junit PATH] [--check]

Reads the JUnit XML of a full test run (scripts/test.sh writes .tools/results/junit.xml) for the
client matrix (which test proves which cell: tests/compat/matrix.py) and tests/compat/results/
*.json for the other projects' suites (`python -m tests.compat.suites` writes them), and rewrites
the text between the two markers in docs/compatibility.md. With --check it writes nothing and
exits 1 when the committed matrix differs from this run's (scripts/test.sh runs that after a full
run, so the published matrix cannot go stale or claim a cell no test proves).
"""

from __future__ import annotations

import argparse
import difflib
import importlib.metadata
import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from tests.compat.matrix import CLIENTS, NOT_APPLICABLE, PROPERTY, SCENARIOS
from tests.compat.suites import RESULTS_DIR, SuiteResult
from tests.harness.paths import ROOT

DOC = ROOT / "docs" / "compatibility.md"
JUNIT = ROOT / ".tools" / "results" / "junit.xml"
BEGIN = "<!-- BEGIN GENERATED: python -m tests.compat.report -->"
END = "<!-- END GENERATED -->"
MATRIX_BEGIN = "<!-- matrix -->"
MATRIX_END = "<!-- /matrix -->"

# Suites the issue names that cannot run from this project's machines, and why.
SUITES_NOT_RUN = {
    "confluent-kafka-python tests/integration": (
        "not run: the suite is published in no package registry. Every confluent-kafka sdist "
        "on PyPI prunes tests/ (checked 0.11.6 to 2.16.1), the wheels hold only the library, "
        "and Debian's python-confluent-kafka source tarballs are not served by the mirror this "
        "project's machines reach (404). Plan: run it from a checkout of its GitHub repository "
        "on a machine with GitHub access (BROKERS=host:port selects its external-cluster "
        "fixture); until then the librdkafka it wraps is covered by the confluent-kafka and "
        "kcat columns above."
    ),
}


@dataclass
class Case:
    nodeid: str
    outcome: str  # passed, failed, skipped, xfailed
    message: str
    cells: list[tuple[str, str]]


def read_junit(path: Path) -> list[Case]:
    cases = []
    for testcase in ET.parse(path).getroot().iter("testcase"):
        cells = []
        for prop in testcase.iter("property"):
            if prop.get("name") == PROPERTY:
                client, scenario = prop.get("value", "").split("|")
                cells.append((client, scenario))
        if not cells:
            continue
        outcome, message = "passed", ""
        for child in testcase:
            if child.tag in ("failure", "error"):
                outcome, message = "failed", child.get("message", "")
            elif child.tag == "skipped":
                xfail = child.get("type") == "pytest.xfail"
                outcome, message = ("xfailed" if xfail else "skipped"), child.get("message", "")
        module = testcase.get("classname", "").replace(".", "/") + ".py"
        cases.append(Case(f"{module}::{testcase.get('name')}", outcome, message, cells))
    return cases


def cell_text(cases: list[Case], client: str, scenario: str, notes: dict[str, int]) -> str:
    if not cases:
        reason = NOT_APPLICABLE.get((client, scenario))
        if reason is None:
            return "not tested"
        number = notes.setdefault(reason, len(notes) + 1)
        return f"n/a [{number}]"
    outcomes = {c.outcome for c in cases}
    if "failed" in outcomes:
        return "**FAIL**"
    if "skipped" in outcomes:
        return "**skipped**"
    if "xfailed" in outcomes:
        return "known failure"
    return f"pass ({len(cases)})"


def render_matrix(cases: list[Case]) -> str:
    by_cell: dict[tuple[str, str], list[Case]] = defaultdict(list)
    for case in cases:
        for cell in case.cells:
            by_cell[cell].append(case)
    notes: dict[str, int] = {}
    lines = [
        "| Scenario | " + " | ".join(CLIENTS.values()) + " |",
        "|---" * (len(CLIENTS) + 1) + "|",
    ]
    for scenario, title in SCENARIOS.items():
        row = [cell_text(by_cell[(c, scenario)], c, scenario, notes) for c in CLIENTS]
        lines.append(f"| {title} | " + " | ".join(row) + " |")
    lines.append("")
    lines.append("pass (N): all N tests that prove the cell passed.")
    for reason, number in notes.items():
        lines.append(f"[{number}] {reason}.  ")
    problems = [c for c in cases if c.outcome != "passed"]
    if problems:
        lines += ["", "Cells that did not pass, and why:", ""]
        for case in sorted(problems, key=lambda c: c.nodeid):
            message = " ".join(case.message.split())[:300]
            lines.append(f"- `{case.nodeid}` ({case.outcome}): {message}")
    return "\n".join(lines)


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _search(path: Path, pattern: str) -> str:
    found = re.search(pattern, path.read_text()) if path.is_file() else None
    return found.group(1) if found else "unknown"


def versions() -> list[tuple[str, str, str]]:
    """(client, version, where it comes from) of everything the matrix ran."""
    try:
        kcat_v = subprocess.run(["kcat", "-V"], capture_output=True, text=True, check=False)
        found = re.search(r"Version (\S+) .*librdkafka (\S+)", kcat_v.stdout)
        kcat = f"{found.group(1)} (librdkafka {found.group(2)})" if found else "unknown"
    except FileNotFoundError:
        kcat = "not installed"
    try:
        import confluent_kafka

        confluent = f"{confluent_kafka.__version__} (librdkafka {confluent_kafka.libversion()[0]})"
    except ImportError:
        confluent = "not installed"
    java_pom = ROOT / "tests" / "java" / "pom.xml"
    go_mod = ROOT / "tests" / "compat" / "go" / "go.mod"
    node = ROOT / "tests" / "compat" / "node" / "package.json"
    kafkajs = json.loads(node.read_text())["dependencies"]["kafkajs"] if node.is_file() else "?"
    spark_pom = ROOT / "tests" / "compat" / "spark" / "pom.xml"
    spark_kafka = _search(spark_pom, r"<spark.version>([^<]+)</spark.version>")
    token_provider = _search(spark_pom, r"<spark-token-provider.version>([^<]+)<")
    return [
        ("kcat", kcat, "Debian package `kcat`"),
        ("confluent-kafka", confluent, "PyPI wheel"),
        ("aiokafka", _version("aiokafka"), "PyPI"),
        ("kafka-python", _version("kafka-python"), "PyPI"),
        (
            "Java kafka-clients 3.9",
            _search(java_pom, r"<kafka39.version>([^<]+)<"),
            "Maven Central `org.apache.kafka:kafka-clients`",
        ),
        (
            "Java kafka-clients 4",
            _search(java_pom, r"<kafka4.version>([^<]+)<"),
            "Maven Central `org.apache.kafka:kafka-clients`",
        ),
        (
            "franz-go (kgo, kadm)",
            _search(go_mod, r"github.com/twmb/franz-go (v\S+)")
            + ", kadm "
            + _search(go_mod, r"github.com/twmb/franz-go/pkg/kadm (v\S+)"),
            "Go module proxy",
        ),
        ("kafkajs", kafkajs, "npm (with kafkajs-snappy, kafkajs-lz4, @bokuweb/zstd-wasm)"),
        (
            "Spark Kafka source",
            f"pyspark {_version('pyspark')}, spark-sql-kafka-0-10_2.13 {spark_kafka} "
            f"(spark-token-provider-kafka-0-10 {token_provider}: the newest on the mirror)",
            "PyPI + Maven Central",
        ),
    ]


def render_suite(result: SuiteResult) -> list[str]:
    counts = result.counts()
    lines = [
        f"### {result.suite} {result.version}",
        "",
        f"From {result.source}; run {result.started} against {result.broker}, "
        f"{result.seconds:.0f} s.",
        "",
        "<details><summary>Command</summary>",
        "",
        f"`{result.command}`",
        "",
        "</details>",
        "",
        "| passed | failed | skipped by the suite | excluded by us |",
        "|---|---|---|---|",
        f"| {counts['passed']} | {counts['failed']} | {counts['skipped']} | {counts['excluded']} |",
        "",
    ]
    for note in result.notes:
        lines.append(f"- {note}")
    if result.notes:
        lines.append("")
    titles = {
        "failed": "Failed (cause and plan)",
        "excluded": "Excluded by our skip list (why each cannot run here)",
        "skipped": "Skipped by the suite itself",
    }
    for outcome, title in titles.items():
        tests = sorted((t for t in result.tests if t.outcome == outcome), key=lambda t: t.name)
        if not tests:
            continue
        lines += [f"{title}:", ""]
        for test in tests:
            reason = " ".join(test.reason.split())
            lines.append(f"- `{test.name}`: {reason}" if reason else f"- `{test.name}`")
        lines.append("")
    passed = sorted(t.name for t in result.tests if t.outcome == "passed")
    if passed:
        lines += [
            "<details><summary>Passed</summary>",
            "",
            ", ".join(f"`{name}`" for name in passed),
            "",
            "</details>",
            "",
        ]
    return lines


def render(cases: list[Case], suites: list[SuiteResult]) -> str:
    lines = [
        BEGIN,
        "",
        "## Clients and test suites (generated)",
        "",
        "Generated by `python -m tests.compat.report` from the last full run of the test suite "
        "(`scripts/test.sh`, which checks this matrix against its own run) and from "
        "`tests/compat/results/` (written by `scripts/compat-suites.sh`). Do not edit by hand.",
        "",
        "### Versions",
        "",
        "| Client | Version | From |",
        "|---|---|---|",
    ]
    lines += [f"| {name} | {version} | {source} |" for name, version, source in versions()]
    lines += [
        "",
        "### Client matrix",
        "",
        "Each cell is proven by real clients against a real broker in CI "
        "(`@pytest.mark.compat` on the tests; tests/compat/matrix.py).",
        "",
        MATRIX_BEGIN,
        render_matrix(cases),
        MATRIX_END,
        "",
        "## Other projects' integration suites (generated)",
        "",
        "Run by `scripts/compat-suites.sh` (not part of `.ci/run`: they take longer), each "
        "against a fresh `kafscale serve` on etcd + MinIO.",
        "",
    ]
    for suite in suites:
        lines += render_suite(suite)
    for name, why in SUITES_NOT_RUN.items():
        lines += [f"### {name}", "", why, ""]
    lines.append(END)
    return "\n".join(lines)


def matrix_of(text: str) -> str:
    start, end = text.find(MATRIX_BEGIN), text.find(MATRIX_END)
    return text[start:end] if start >= 0 and end > start else ""


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.compat.report", description=__doc__)
    parser.add_argument("--junit", type=Path, default=JUNIT)
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    args = parser.parse_args(argv)
    if not args.junit.is_file():
        print(f"report: {args.junit} is missing: run scripts/test.sh first", file=sys.stderr)
        return 2
    cases = read_junit(args.junit)
    suites = [SuiteResult.read(p) for p in sorted(RESULTS_DIR.glob("*.json"))]
    section = render(cases, suites)
    doc = DOC.read_text()
    start, end = doc.find(BEGIN), doc.find(END)
    if start < 0 or end < start:
        print(f"report: {DOC} lacks the markers {BEGIN!r} ... {END!r}", file=sys.stderr)
        return 2
    if args.check:
        committed, fresh = matrix_of(doc), matrix_of(section)
        if committed == fresh:
            print(f"report: the matrix in {DOC.relative_to(ROOT)} matches this run")
            return 0
        print(f"report: the matrix in {DOC.relative_to(ROOT)} differs from this run's:")
        diff = difflib.unified_diff(
            committed.splitlines(), fresh.splitlines(), "committed", "this run", lineterm=""
        )
        print("\n".join(diff))
        print("run `python -m tests.compat.report` after a full run and commit the result")
        return 1
    DOC.write_text(doc[:start] + section + doc[end + len(END) :])
    print(
        f"report: wrote {DOC.relative_to(ROOT)} ({len(cases)} matrix tests, {len(suites)} suites)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
