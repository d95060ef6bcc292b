"""KafScale next to Apache Kafka on this machine: one command per scenario, or all of them.

    .venv/bin/python -m bench.run all                      # every scenario, every target
    .venv/bin/python -m bench.run produce-acks1-p1 consume-tail --targets kafscale,kafka
    .venv/bin/python -m bench.run --list
    .venv/bin/python -m bench.run produce-acks1-p6 --targets kafscale-s3,kafscale-s3x3
                                                           # three brokers against one
    .venv/bin/python -m bench.run produce-acks1-p1 consume-tail --targets kafscale,kafka \
        --security plaintext,sasl_ssl                      # also over SASL_SSL (issue 17)

(scripts/bench.sh installs what this needs and runs `all`.) The scenarios are here, issue 15's
(write path v2) in bench/write_path.py, `Bench` in bench/core.py. Each scenario starts each
target fresh (see bench/targets.py), drives it with Kafka's own tools (ProducerPerformance,
ConsumerPerformance, EndToEndLatency from kafka-tools) and with a Python client
(confluent-kafka, bench/python_driver.py), and stops it. While a client runs, the broker's
processes are sampled (bench/procstats.py): CPU-seconds per GiB moved and peak memory, and for
KafScale the object-store requests it made. The results go to bench/results/ as JSON, a
markdown report and plots (bench/report.py), every KafScale figure next to Kafka's with the
ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import python_driver as py
from bench import security, write_path
from bench.core import SCALED, SECONDS_SCALED, Bench, Measurement, Settings
from bench.kafka_perf import KafkaPerfTools
from bench.report import write_report
from bench.targets import SCALE_OUT_TARGETS, TARGETS, S3Latency, make_target

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"

# -- scenarios -------------------------------------------------------------------------------------


def produce(partitions: int, acks: str) -> Callable[[Bench], None]:
    def scenario(bench: Bench) -> None:
        s = bench.settings
        records = s.produce_records if acks == "1" else s.acks_all_records
        topic = bench.topic(partitions)
        bench.measured(
            "kafka-tools", lambda: bench.producer_performance(topic, records, acks), settle=True
        )
        topic = bench.topic(partitions)
        bench.measured(
            "confluent-kafka",
            lambda: py.produce(
                bench.target.bootstrap,
                topic,
                records=records,
                record_size=s.record_size,
                config={**bench.target.client_config(), **s.producer_config(acks)},
            ),
            settle=True,
        )

    return scenario


def _fill(bench: Bench, partitions: int, records: int) -> str:
    """A topic holding `records` records (produced with ProducerPerformance, not measured)."""
    topic = bench.topic(partitions)
    bench.producer_performance(topic, records, "1")
    bench.target.settle()
    return topic


def _py_consume(bench: Bench, topic: str, records: int) -> py.Run:
    target = bench.target
    return py.consume(target.bootstrap, topic, records=records, security=target.client_config())


def consume_tail(bench: Bench) -> None:
    records = bench.settings.consume_records
    topic = _fill(bench, 6, records)
    bench.measured("kafka-tools", lambda: bench.consumer_performance(topic, records))
    bench.measured("confluent-kafka", lambda: _py_consume(bench, topic, records))


def consume_cold(bench: Bench) -> None:
    records = bench.settings.consume_records
    topic = _fill(bench, 6, records)
    bench.target.restart()
    bench.measured("kafka-tools", lambda: bench.consumer_performance(topic, records))
    bench.target.restart()
    bench.measured("confluent-kafka", lambda: _py_consume(bench, topic, records))


def e2e_latency(bench: Bench) -> None:
    s = bench.settings
    topic = bench.topic(1)
    bench.measured("kafka-tools", lambda: bench.end_to_end_latency(topic))
    topic = bench.topic(1)
    bench.measured(
        "confluent-kafka",
        lambda: py.end_to_end(
            bench.target.bootstrap,
            topic,
            rate=s.e2e_rate,
            seconds=s.e2e_seconds,
            record_size=s.record_size,
        ),
    )


def consumer_group(bench: Bench) -> None:
    s = bench.settings
    topic = _fill(bench, 6, s.group_records)
    bench.measured(
        f"confluent-kafka x{s.group_members}",
        lambda: py.group_consume(
            bench.target.bootstrap, topic, members=s.group_members, records=s.group_records
        ),
    )


def load(bench: Bench) -> None:
    s = bench.settings
    with tempfile.TemporaryDirectory(prefix="kafscale-load-") as tmp:
        report_path = Path(tmp) / "load.json"

        def run() -> py.Run:
            argv = [
                sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                "-n", str(s.load_workers), "bench/load", "--rootdir", "bench/load",
                "--load-bootstrap", bench.target.bootstrap,
                "--load-records", str(s.load_records),
                "--load-record-size", str(s.record_size),
                "--load-cases", str(s.load_cases),
                "--load-report", str(report_path),
            ]  # fmt: skip
            result = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=1800)
            if result.returncode != 0:
                raise RuntimeError(f"load test failed:\n{result.stdout[-6000:]}")
            report = json.loads(report_path.read_text())
            return py.Run(report["records"], report["bytes"], report["wall_seconds"])

        bench.measured(f"pytest-xdist x{s.load_workers}", run, settle=True)


SCENARIOS: dict[str, tuple[str, Callable[[Bench], None]]] = {
    "produce-acks1-p1": ("produce, acks=1, 1 partition", produce(1, "1")),
    "produce-acks1-p6": ("produce, acks=1, 6 partitions", produce(6, "1")),
    "produce-acksall-p1": ("produce, acks=all, 1 partition", produce(1, "all")),
    "produce-acksall-p6": ("produce, acks=all, 6 partitions", produce(6, "all")),
    "consume-tail": ("consume from the tail (just written), 6 partitions", consume_tail),
    "consume-cold": ("consume after a broker restart (from storage), 6 partitions", consume_cold),
    "e2e-latency": ("end-to-end latency, 1 partition", e2e_latency),
    "group": ("a consumer group reading 6 partitions", consumer_group),
    "load": ("pytest-xdist load test: producer/consumer pairs in parallel", load),
    **write_path.SCENARIOS,
}
# The scenarios whose every client (and topic creation) takes the target's client settings, so
# they can run over SASL_SSL (--security); the others connect PLAINTEXT only.
SECURE_SCENARIOS = (
    "produce-acks1-p1",
    "produce-acks1-p6",
    "produce-acksall-p1",
    "produce-acksall-p6",
    "consume-tail",
    "consume-cold",
)


def machine() -> dict[str, Any]:
    cpu = "unknown"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    mem_kib = int(Path("/proc/meminfo").read_text().split()[1])
    java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(mem_kib / (1 << 20), 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "java": java.splitlines()[0] if java else "unknown",
        "commit": git_commit(),
    }


def git_commit() -> str:
    """The checkout's short commit, ``-dirty`` with uncommitted changes to tracked files."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError:
        return "unknown"
    return commit + ("-dirty" if dirty else "")


def load_average() -> str:
    """The 1, 5 and 15-minute load averages (as uptime prints them)."""
    return ", ".join(f"{load:.2f}" for load in os.getloadavg())


def command_line(argv: list[str] | None, module: str = "bench.run") -> str:
    """The command that started this run, as it would be typed again."""
    args = sys.argv[1:] if argv is None else argv
    return " ".join(["python", "-m", module, *args])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scenarios", nargs="*", help="scenario names, or 'all'")
    parser.add_argument("--list", action="store_true", help="list the scenarios and exit")
    parser.add_argument(
        "--targets",
        default=",".join(TARGETS),
        help=f"comma-separated targets (also: {', '.join(SCALE_OUT_TARGETS)})",
    )
    parser.add_argument(
        "--s3-latency-ms",
        default="50-100",
        help="latency added to the kafscale-s3 target's PUTs, 'MIN-MAX' ms ('0' for none)",
    )
    parser.add_argument("--s3-get-latency-ms", type=float, default=10.0)
    parser.add_argument("--scale", type=float, default=1.0, help="multiply record counts")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--label", default="", help="a word for the results' file names")
    parser.add_argument(
        "--note", action="append", default=[], help="a line for the report (repeatable)"
    )
    parser.add_argument(
        "--broker-env",
        action="append",
        default=[],
        metavar="KAFSCALE_X=VALUE",
        help="a setting of the KafScale targets (repeatable), e.g. KAFSCALE_FLUSH_INTERVAL_MS=500",
    )
    parser.add_argument(
        "--security",
        default=security.PLAINTEXT,
        help=(
            "how the clients connect, comma-separated: plaintext, sasl_ssl (a SASL_SSL listener "
            "with SCRAM-SHA-512 on every target: bench/security.py); both: each scenario runs "
            f"both ways on each target, and the report adds SASL_SSL / PLAINTEXT. sasl_ssl runs "
            f"{', '.join(SECURE_SCENARIOS)}"
        ),
    )
    args = parser.parse_args(argv)
    securities = args.security.split(",")
    if not securities or any(name not in security.CHOICES for name in securities):
        parser.error(f"--security takes {', '.join(security.CHOICES)} (comma-separated)")
    broker_env = dict(item.split("=", 1) for item in args.broker_env)
    if any(not key.startswith("KAFSCALE_") for key in broker_env):
        parser.error("--broker-env takes KAFSCALE_NAME=VALUE")

    if args.list or not args.scenarios:
        for name, (title, _) in SCENARIOS.items():
            print(f"{name:<20} {title}")
        return 0 if args.list else 2
    names = list(SCENARIOS) if args.scenarios == ["all"] else args.scenarios
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario(s): {', '.join(unknown)}")
    if security.SASL_SSL in securities and (
        plain_only := [n for n in names if n not in SECURE_SCENARIOS]
    ):
        parser.error(
            f"--security sasl_ssl: {', '.join(plain_only)} connect PLAINTEXT only "
            f"(over SASL_SSL: {', '.join(SECURE_SCENARIOS)})"
        )
    latency = S3Latency.parse(args.s3_latency_ms, args.s3_get_latency_ms)
    base = Settings()
    scaled: dict[str, Any] = {key: max(1, int(getattr(base, key) * args.scale)) for key in SCALED}
    scaled.update({key: getattr(base, key) * args.scale for key in SECONDS_SCALED})
    settings = replace(base, s3_latency=latency, **scaled)
    tools = KafkaPerfTools()
    targets = args.targets.split(",")
    started = datetime.now(UTC)
    load_before = load_average()
    results: list[Measurement] = []
    descriptions: dict[str, str] = {}
    secured: dict[str, str] = {}  # SASL_SSL: its settings, and what TLS each target negotiated
    for name in names:
        title, scenario = SCENARIOS[name]
        print(f"== {name}: {title}", flush=True)
        # PLAINTEXT and SASL_SSL one after the other on each target, so that both see the
        # machine in the same state.
        for target_name in targets:
            for way in securities:
                work = Path(tempfile.mkdtemp(prefix=f"kafscale-bench-{target_name}-"))
                sasl_ssl = (
                    security.make_sasl_ssl(work / "pki") if way == security.SASL_SSL else None
                )
                target = make_target(target_name, work, latency, broker_env, sasl_ssl)
                descriptions[target_name] = target.describe()
                print(f"  -- {target_name} ({target.security_label})", flush=True)
                bench = Bench(target, settings, tools)
                bench.scenario = name
                target.start()
                try:
                    if sasl_ssl is not None:
                        secured[target.security_label] = sasl_ssl.describe()
                        secured[target_name] = (
                            f"{target.describe_security()}; an OpenSSL client negotiates "
                            f"{target.tls_session()}"
                        )
                    if name not in write_path.NO_WARM_UP:
                        bench.warm_up()
                    scenario(bench)
                finally:
                    target.stop()
                    shutil.rmtree(work, ignore_errors=True)
                results.extend(bench.results)
    run = {
        "started": started.isoformat(timespec="seconds"),
        "finished": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": command_line(argv),
        "load_before": load_before,
        "load_after": load_average(),
        "machine": machine(),
        "targets": descriptions,
        "security": secured,
        "settings": {
            **asdict(settings),
            "broker_env": broker_env,
            "s3_latency": latency.describe() if latency else "none",
            "security": [security.LABELS[way] for way in securities],
        },
        "scenarios": {name: SCENARIOS[name][0] for name in names},
        "notes": args.note,
        "results": [asdict(m) for m in results],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = started.strftime("%Y-%m-%d-%H%M") + (f"-{args.label}" if args.label else "")
    (args.out / f"{stem}.json").write_text(json.dumps(run, indent=2) + "\n")
    report = write_report(run, args.out, stem)
    print(f"results: {args.out / (stem + '.json')}, {report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
