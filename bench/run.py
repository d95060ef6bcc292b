"""KafScale next to Apache Kafka on this machine: one command per scenario, or all of them.

    .venv/bin/python -m bench.run all                      # every scenario, every target
    .venv/bin/python -m bench.run produce-acks1-p1 consume-tail --targets kafscale,kafka
    .venv/bin/python -m bench.run --list

(scripts/bench.sh installs what this needs and runs `all`.) Each scenario starts each target
fresh (see bench/targets.py), drives it with Kafka's own tools (ProducerPerformance,
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
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import python_driver as py
from bench.kafka_perf import (
    KafkaPerfTools,
    parse_consumer_performance,
    parse_end_to_end_latency,
    parse_producer_performance,
    run_tool,
)
from bench.procstats import measure
from bench.report import write_report
from bench.targets import TARGETS, S3Latency, Target, make_target

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
GIB = 1 << 30
# Record counts that --scale multiplies.
SCALED = (
    "produce_records",
    "acks_all_records",
    "consume_records",
    "warm_up_records",
    "group_records",
    "load_records",
)


@dataclass(frozen=True)
class Settings:
    """Everything a run's figures depend on; written into the results."""

    record_size: int = 1024
    produce_records: int = 300_000
    acks_all_records: int = 60_000
    consume_records: int = 300_000
    warm_up_records: int = 200_000
    linger_ms: int = 5
    batch_size: int = 262_144
    e2e_tool_records: int = 100
    e2e_rate: int = 200
    e2e_seconds: float = 15.0
    group_members: int = 3
    group_records: int = 300_000
    load_workers: int = 4
    load_cases: int = 8
    load_records: int = 20_000
    s3_latency: S3Latency | None = None

    def producer_config(self, acks: str) -> dict[str, str]:
        """The producer settings both clients use (Kafka's defaults otherwise)."""
        return {
            "acks": acks,
            "linger.ms": str(self.linger_ms),
            "batch.size": str(self.batch_size),
        }


@dataclass
class Measurement:
    """One client run against one target: its figures and the broker's cost."""

    scenario: str
    target: str
    client: str
    records: int
    bytes: int
    seconds: float
    mb_per_sec: float
    records_per_sec: float
    latency_ms: dict[str, float] = field(default_factory=dict)
    broker_cpu_seconds: float = 0.0
    backend_cpu_seconds: float = 0.0
    peak_memory_mib: float = 0.0
    s3_requests: dict[str, int] = field(default_factory=dict)
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def gib(self) -> float:
        return self.bytes / GIB


class Bench:
    def __init__(self, target: Target, settings: Settings, tools: KafkaPerfTools) -> None:
        self.target = target
        self.settings = settings
        self.tools = tools
        self.results: list[Measurement] = []
        self.scenario = ""

    def topic(self, partitions: int, name: str | None = None) -> str:
        topic = name or f"bench-{uuid.uuid4().hex[:10]}"
        py.create_topic(self.target.bootstrap, topic, partitions)
        return topic

    def measured(self, client: str, work: Callable[[], py.Run], settle: bool = False) -> None:
        """Run `work` while sampling the broker; record its figures."""
        broker = measure(self.target.broker_pids())
        backends = measure(self.target.backend_pids())
        before = self.target.s3_requests()
        run = work()
        if settle:
            self.target.settle()
        usage, backend_usage = broker.stop(), backends.stop()
        requests = self.target.s3_requests() - before
        latency = run.reported_latency_ms
        if run.latencies_ms:
            latency = py.latency_summary(
                sum(run.latencies_ms) / len(run.latencies_ms),
                *(py.percentile(run.latencies_ms, q) for q in (50, 99, 99.9)),
            )
        result = Measurement(
            scenario=self.scenario,
            target=self.target.name,
            client=client,
            records=run.records,
            bytes=run.bytes,
            seconds=run.seconds,
            mb_per_sec=run.mb_per_sec,
            records_per_sec=run.records_per_sec,
            latency_ms=latency,
            broker_cpu_seconds=usage.cpu_seconds,
            backend_cpu_seconds=backend_usage.cpu_seconds,
            peak_memory_mib=usage.peak_pss_bytes / (1 << 20),
            s3_requests=dict(requests),
            extra=run.extra,
        )
        self.results.append(result)
        print(f"    {_summary(result)}", flush=True)

    def warm_up(self) -> None:
        """Unmeasured traffic first, so a JVM's JIT and both brokers' caches and pools are in
        their steady state (a cold JVM takes several times the CPU per GiB it later does)."""
        records = self.settings.warm_up_records
        topic = self.topic(6)
        self.producer_performance(topic, records, "1")
        self.target.settle()
        self.consumer_performance(topic, records)

    # -- the Kafka tools, as runs ---------------------------------------------------------------

    def producer_performance(self, topic: str, records: int, acks: str) -> py.Run:
        argv = self.tools.producer_performance_argv(
            self.target.bootstrap,
            topic,
            num_records=records,
            record_size=self.settings.record_size,
            producer_props=self.settings.producer_config(acks),
        )
        report = parse_producer_performance(run_tool(argv, timeout=900)).total
        # The tool's own rate excludes its JVM start; keep it, and its whole-ms percentiles.
        size = report.records * self.settings.record_size
        run = py.Run(report.records, size, size / (1 << 20) / report.mb_per_sec)
        run.reported_latency_ms = py.latency_summary(
            report.avg_latency_ms, report.p50_ms, report.p99_ms, report.p999_ms
        )
        return run

    def consumer_performance(self, topic: str, records: int) -> py.Run:
        argv = self.tools.consumer_performance_argv(
            self.target.bootstrap, topic, num_records=records, poll_timeout_ms=60_000
        )
        report = parse_consumer_performance(run_tool(argv, timeout=900))
        run = py.Run(report.records, int(report.mb * (1 << 20)), report.fetch_ms / 1000)
        run.extra["group_join_seconds"] = report.rebalance_ms / 1000
        return run

    def end_to_end_latency(self, topic: str) -> py.Run:
        records = self.settings.e2e_tool_records
        argv = self.tools.end_to_end_latency_argv(
            self.target.bootstrap, topic, num_records=records, record_size=self.settings.record_size
        )
        started = time.perf_counter()
        report = parse_end_to_end_latency(run_tool(argv, timeout=900))
        run = py.Run(records, records * self.settings.record_size, time.perf_counter() - started)
        run.reported_latency_ms = py.latency_summary(
            report.avg_ms, report.p50_ms, report.p99_ms, report.p999_ms
        )
        return run


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
                config=s.producer_config(acks),
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


def consume_tail(bench: Bench) -> None:
    records = bench.settings.consume_records
    topic = _fill(bench, 6, records)
    bench.measured("kafka-tools", lambda: bench.consumer_performance(topic, records))
    bench.measured(
        "confluent-kafka", lambda: py.consume(bench.target.bootstrap, topic, records=records)
    )


def consume_cold(bench: Bench) -> None:
    records = bench.settings.consume_records
    topic = _fill(bench, 6, records)
    bench.target.restart()
    bench.measured("kafka-tools", lambda: bench.consumer_performance(topic, records))
    bench.target.restart()
    bench.measured(
        "confluent-kafka", lambda: py.consume(bench.target.bootstrap, topic, records=records)
    )


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
}


def _summary(m: Measurement) -> str:
    latency = " ".join(f"{k}={v:.1f}ms" for k, v in m.latency_ms.items() if k != "avg")
    cpu = m.broker_cpu_seconds / m.gib if m.bytes else 0.0
    return (
        f"{m.client:<20} {m.mb_per_sec:8.1f} MB/s {m.records_per_sec:10.0f} rec/s "
        f"cpu {cpu:6.1f} s/GiB mem {m.peak_memory_mib:6.0f} MiB {latency}"
    )


def machine() -> dict[str, Any]:
    cpu = "unknown"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    mem_kib = int(Path("/proc/meminfo").read_text().split()[1])
    java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    ).stdout.strip()
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(mem_kib / (1 << 20), 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "java": java.splitlines()[0] if java else "unknown",
        "commit": commit + ("-dirty" if dirty else ""),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scenarios", nargs="*", help="scenario names, or 'all'")
    parser.add_argument("--list", action="store_true", help="list the scenarios and exit")
    parser.add_argument("--targets", default=",".join(TARGETS), help="comma-separated targets")
    parser.add_argument(
        "--s3-latency-ms",
        default="50-100",
        help="latency added to the kafscale-s3 target's PUTs, 'MIN-MAX' ms ('0' for none)",
    )
    parser.add_argument("--s3-get-latency-ms", type=float, default=10.0)
    parser.add_argument("--scale", type=float, default=1.0, help="multiply record counts")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--label", default="", help="a word for the results' file names")
    args = parser.parse_args(argv)

    if args.list or not args.scenarios:
        for name, (title, _) in SCENARIOS.items():
            print(f"{name:<20} {title}")
        return 0 if args.list else 2
    names = list(SCENARIOS) if args.scenarios == ["all"] else args.scenarios
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario(s): {', '.join(unknown)}")
    latency = None
    if args.s3_latency_ms not in ("0", ""):
        low, _, high = args.s3_latency_ms.partition("-")
        latency = S3Latency(
            float(low) / 1000, float(high or low) / 1000, args.s3_get_latency_ms / 1000
        )
    base = Settings()
    scaled = {key: max(1, int(getattr(base, key) * args.scale)) for key in SCALED}
    settings = replace(base, s3_latency=latency, **scaled)
    tools = KafkaPerfTools()
    targets = args.targets.split(",")
    started = datetime.now(UTC)
    results: list[Measurement] = []
    descriptions: dict[str, str] = {}
    for name in names:
        title, scenario = SCENARIOS[name]
        print(f"== {name}: {title}", flush=True)
        for target_name in targets:
            work = Path(tempfile.mkdtemp(prefix=f"kafscale-bench-{target_name}-"))
            target = make_target(target_name, work, latency)
            descriptions[target_name] = target.describe()
            print(f"  -- {target_name}", flush=True)
            bench = Bench(target, settings, tools)
            bench.scenario = name
            target.start()
            try:
                bench.warm_up()
                scenario(bench)
            finally:
                target.stop()
                shutil.rmtree(work, ignore_errors=True)
            results.extend(bench.results)
    run = {
        "started": started.isoformat(timespec="seconds"),
        "finished": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "targets": descriptions,
        "settings": {
            **asdict(settings),
            "s3_latency": latency.describe() if latency else "none",
        },
        "scenarios": {name: SCENARIOS[name][0] for name in names},
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
