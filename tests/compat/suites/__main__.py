"""Runs other projects' integration suites against KafScale and publishes the results:

    python -m tests.compat.suites [kgo] [kafka-python]      (default: every suite)

Each suite gets a fresh `kafscale serve` on its own etcd and MinIO (with the suite module's
BROKER_ENV), its result goes to tests/compat/results/<suite>.json, and docs/compatibility.md is
regenerated (tests/compat/report.py). Exits 1 when a suite has a failure, 2 when a suite could
not run at all. scripts/compat-suites.sh installs what is needed first.
"""

from __future__ import annotations

import argparse
import importlib
import shutil
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

from tests.compat import report
from tests.compat.suites import SuiteResult, suite_broker

SUITES = {"kgo": "tests.compat.suites.kgo", "kafka-python": "tests.compat.suites.kafka_python"}


def run_suite(name: str, module: ModuleType, scratch: Path) -> SuiteResult:
    work = scratch / name
    work.mkdir(parents=True)
    env = dict(getattr(module, "BROKER_ENV", {}))
    print(f"suites: {name}: starting kafscale serve (etcd + MinIO) with {env}", flush=True)
    started = time.monotonic()
    with suite_broker(work / "servers", env) as broker:
        print(f"suites: {name}: running against {broker.bootstrap}", flush=True)
        result: SuiteResult = module.run(broker.bootstrap, work)
    settings = " ".join(f"{k}={v}" for k, v in env.items())
    result.broker = f"`kafscale serve` on etcd + MinIO {settings}".strip()
    counts = ", ".join(f"{n} {o}" for o, n in result.counts().items())
    print(f"suites: {name}: {counts} in {time.monotonic() - started:.0f} s", flush=True)
    print(f"suites: {name}: wrote {result.write()}", flush=True)
    return result


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.compat.suites", description=__doc__)
    parser.add_argument("suites", nargs="*", metavar="SUITE", help=f"of {list(SUITES)}")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    args = parser.parse_args(argv)
    names = args.suites or list(SUITES)
    unknown = set(names) - set(SUITES)
    if unknown:
        parser.error(f"unknown suites {sorted(unknown)}: choose from {list(SUITES)}")
    status = 0
    scratch = Path(tempfile.mkdtemp(prefix="kafscale-suites-"))
    for name in names:
        try:
            result = run_suite(name, importlib.import_module(SUITES[name]), scratch)
        except Exception as exc:  # a suite that cannot run is reported, the others still run
            print(f"suites: {name}: could not run: {type(exc).__name__}: {exc}", file=sys.stderr)
            status = 2
            continue
        if result.counts()["failed"]:
            status = max(status, 1)
    if report.JUNIT.is_file():
        report.main([])
    else:
        print(f"suites: {report.JUNIT} is missing: run scripts/test.sh, then tests.compat.report")
    if args.keep:
        print(f"suites: scratch kept in {scratch}")
    else:
        shutil.rmtree(scratch, ignore_errors=True)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
