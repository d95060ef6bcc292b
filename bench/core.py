"""The benchmark's settings, its measurements and `Bench`: one target (bench/targets.py)
being measured while a client runs against it (bench/run.py and bench/write_path.py hold the
scenarios). While a client runs, the broker's processes are sampled (bench/procstats.py): CPU,
peak memory, and for KafScale the object-store requests it made.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from bench import python_driver as py
from bench.kafka_perf import (
    KafkaPerfTools,
    ProducerStats,
    parse_consumer_performance,
    parse_end_to_end_latency,
    parse_producer_performance,
    run_tool,
)
from bench.procstats import measure
from bench.targets import S3Latency, Target

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
# Durations (seconds) that --scale multiplies; the rates stay, so a smaller run is shorter.
SECONDS_SCALED = (
    "cost_seconds",
    "java_defaults_seconds",
    "moderate_seconds",
    "java_defaults_grace_seconds",
    "idle_seconds",
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
    # Issue 15's write path v2 scenarios (bench/write_path.py).
    cost_bytes_per_sec: float = 100e9 / 86_400  # the cost appendix's 100 GB/day
    cost_seconds: float = 120.0
    cost_ramp_fraction: float = 0.25  # left out of the steady window (topic, connections)
    java_defaults_rate: int = 5_000
    java_defaults_seconds: float = 60.0
    moderate_rate: int = 200  # acks=all records/s: far under the S3 bound of Java's defaults
    moderate_seconds: float = 30.0
    java_defaults_grace_seconds: float = 150.0  # delivery.timeout.ms (120 s) and some
    idle_rate: float = 2.0
    idle_seconds: float = 60.0

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
    # How the clients connected: "PLAINTEXT", or "SASL_SSL" (bench/security.py).
    security: str = "PLAINTEXT"

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
        security = self.target.client_config()
        py.create_topic(self.target.bootstrap, topic, partitions, security)
        py.wait_for_leaders(self.target.bootstrap, topic, partitions, security=security)
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
            security=self.target.security_label,
        )
        if run.seconds > 0:
            # What the broker spends per second of the client's run (runs of one scenario
            # may last differently long on different targets: EndToEndLatency's lasts its
            # records times the end-to-end latency).
            result.extra["broker_cpu_per_second"] = usage.cpu_seconds / run.seconds
        self.results.append(result)
        print(f"    {summary(result)}", flush=True)

    def warm_up(self) -> None:
        """Unmeasured traffic first, so a JVM's JIT and both brokers' caches and pools are in
        their steady state (a cold JVM takes several times the CPU per GiB it later does)."""
        records = self.settings.warm_up_records
        topic = self.topic(6)
        self.producer_performance(topic, records, "1")
        self.target.settle()
        self.consumer_performance(topic, records)

    # -- the Kafka tools, as runs ---------------------------------------------------------------

    def producer_performance(
        self, topic: str, records: int, acks: str, extra_props: Mapping[str, str] | None = None
    ) -> py.Run:
        """ProducerPerformance with the run's producer settings (and `extra_props` on top)."""
        argv = self.tools.producer_performance_argv(
            self.target.bootstrap,
            topic,
            num_records=records,
            record_size=self.settings.record_size,
            producer_props={**self.settings.producer_config(acks), **(extra_props or {})},
            command_config=self.target.java_config_file(),
        )
        report = parse_producer_performance(run_tool(argv, timeout=900)).total
        return producer_run(report, self.settings.record_size)

    def consumer_performance(self, topic: str, records: int) -> py.Run:
        argv = self.tools.consumer_performance_argv(
            self.target.bootstrap,
            topic,
            num_records=records,
            poll_timeout_ms=60_000,
            command_config=self.target.java_config_file(),
        )
        report = parse_consumer_performance(run_tool(argv, timeout=900))
        run = py.Run(report.records, int(report.mb * (1 << 20)), report.fetch_ms / 1000)
        run.extra["group_join_seconds"] = report.rebalance_ms / 1000
        return run

    def end_to_end_latency(self, topic: str, records: int | None = None) -> py.Run:
        """EndToEndLatency: `records` (default: the run's e2e_tool_records), one in flight."""
        records = records or self.settings.e2e_tool_records
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


def producer_run(report: ProducerStats, record_size: int) -> py.Run:
    """ProducerPerformance's summary line as a run: the tool's own rate (it excludes its JVM
    start) and its whole-millisecond percentiles."""
    size = report.records * record_size
    run = py.Run(report.records, size, size / (1 << 20) / report.mb_per_sec)
    run.reported_latency_ms = py.latency_summary(
        report.avg_latency_ms, report.p50_ms, report.p99_ms, report.p999_ms
    )
    return run


def summary(m: Measurement) -> str:
    latency = " ".join(f"{k}={v:.1f}ms" for k, v in m.latency_ms.items() if k != "avg")
    cpu = m.broker_cpu_seconds / m.gib if m.bytes else 0.0
    secure = f" [{m.security}]" if m.security != "PLAINTEXT" else ""
    return (
        f"{m.client + secure:<20} {m.mb_per_sec:8.1f} MB/s {m.records_per_sec:10.0f} rec/s "
        f"cpu {cpu:6.1f} s/GiB mem {m.peak_memory_mib:6.0f} MiB {latency}"
    )
