"""The scenarios issue 15's goals (write path v2) are measured with; bench/run.py lists them
with the others and bench/goals.py turns their figures into the goals' verdicts.

- `cost-p300`, `cost-p3000`: the spec cost appendix's workload, 100 GB/day of 1 KiB records
  (~1.16 MB/s) spread evenly over 300 or 3,000 partitions: ProducerPerformance at a steady
  `--throughput` with the round-robin partitioner, acks=1 (confluent-kafka was tried: librdkafka
  sends a Produce request per partition, and with 300 partitions at this rate even Kafka's
  acks took seconds). Over the steady part of the run (after the first quarter) the broker's S3
  requests per second by operation, the compaction segments it wrote and the bytes it stored per
  byte produced; with the broker's flush interval and compaction settings, which bench/cost.py
  turns into the PUT bound and dollars a month.
- `java-defaults-p1`: ProducerPerformance with every Kafka 4 producer default (acks=all,
  idempotence, 16 KiB batches, linger.ms 5, 5 requests in flight) offered 5,000 records/s of
  1 KiB on one partition for 60 s. A broker that falls behind makes the producer's records expire
  (delivery.timeout.ms, 120 s), so the tool is stopped after the offered time plus 150 s and its
  progress lines and failures are the result. With the broker's mean Produce request time (from
  its metrics) the physical bound: 5 requests of one 16 KiB batch per round trip.
- `acksall-moderate-p1`: the same defaults offered 200 records/s (far under that bound) for 30
  s: the produce p99 against the flush interval + the broker's PUT p99 (its histogram, as
  Prometheus's histogram_quantile estimates it) + 50 ms.
- `produce-acksall-idem-p6`: ProducerPerformance acks=all with idempotence, 256 KiB batches, 6
  partitions: MB/s against Kafka's.
- `e2e-idle-cpu`: a consumer polling with fetch.max.wait.ms=0 on an otherwise idle topic, the
  broker's CPU-seconds against Kafka's: EndToEndLatency (which sets fetch.max.wait.ms=0 itself;
  one record in flight, so it runs at 1/latency records a second) for 2 x 60 records, and the
  confluent-kafka end-to-end driver at 2 records/s for 60 s with fetch.wait.max.ms=0.
"""

from __future__ import annotations

import subprocess
import tempfile
import time
from collections.abc import Callable

from bench import cost
from bench import python_driver as py
from bench.core import Bench, producer_run
from bench.kafka_perf import (
    PerfToolError,
    ToolOutput,
    parse_producer_errors,
    parse_producer_performance,
    parse_producer_progress,
    run_tool_bounded,
)
from bench.targets import Target

# Kafka 4's producer defaults, spelled out so another client version cannot change them.
JAVA_DEFAULTS = {
    "acks": "all",
    "enable.idempotence": "true",
    "batch.size": "16384",
    "linger.ms": "5",
    "max.in.flight.requests.per.connection": "5",
}
PRODUCE_REQUEST_SECONDS = "kafscale_request_duration_seconds"
PRODUCED_RECORDS = "kafscale_produced_records_total"
CHUNK_BYTES = "kafscale_flush_bytes_total"  # committed write-ahead chunks: compaction's input
# One record per partition in turn: an even load over every partition, as the cost appendix's
# workload assumes (the default partitioner sticks to one partition per batch).
ROUND_ROBIN = "org.apache.kafka.clients.producer.RoundRobinPartitioner"
# Scenarios that skip the shared warm-up: its 200,000 records would be compacted (PUTs) and
# garbage-collected (DELETEs) during the window whose requests are counted.
NO_WARM_UP = {"cost-p300", "cost-p3000"}


def _sample(target: Target) -> cost.Sample:
    metrics = target.metrics_text()
    produced = cost.metric_samples(metrics, PRODUCED_RECORDS)
    return cost.Sample(
        seconds=time.perf_counter(),
        records=int(produced.get(PRODUCED_RECORDS, 0.0)),
        s3_requests=dict(target.s3_requests()),
        compaction=cost.compaction_samples(metrics),
        stored_bytes=target.stored_bytes(),
        chunk_bytes=cost.metric_samples(metrics, CHUNK_BYTES).get(CHUNK_BYTES),
    )


def broker_figures(target: Target, figures: dict[str, float], partitions: int) -> dict[str, float]:
    """The KafScale settings the cost bounds depend on, and compaction's projected PUTs/s at
    the bytes of committed chunks per second this run measured (what segments are built of,
    compressed as they will hold it; else the produced bytes times those stored per byte
    produced, which counts write-ahead objects the GC has not deleted yet). Nothing for Kafka."""
    config = target.config()
    if config is None:
        return {}
    if "chunk_mb_per_sec" in figures:
        stored_rate = figures["chunk_mb_per_sec"] * (1 << 20)
    else:
        stored_rate = figures["steady_mb_per_sec"] * (1 << 20) * figures.get("stored_ratio", 1.0)
    projected = cost.projected_compaction(
        stored_bytes_per_sec=stored_rate,
        partitions=partitions,
        segment_bytes=config.segment_bytes,
        max_age_ms=config.compaction_max_age_ms,
        buffer_bytes=config.compaction_buffer_bytes,
    )
    return {
        "flush_interval_ms": float(config.flush_interval),
        "segment_bytes": float(config.segment_bytes),
        "projected_compaction_puts_per_sec": projected.put,
        "projected_compaction_gets_per_sec": projected.get,
        "projected_segment_bytes": projected.segment_bytes,
    }


def cost_summary(extra: dict[str, float]) -> str:
    """One line of a cost run's figures for the console."""
    if "s3_put_per_sec" not in extra:
        return "no object store"
    rates = cost.request_rates(extra)
    ops = " ".join(f"{op.upper()} {rate:.2f}/s" for op, rate in sorted(rates.items()))
    goal = ""
    if "flush_interval_ms" in extra:
        bound = cost.put_goal_per_sec(
            extra["flush_interval_ms"], extra.get("compaction_segments_per_sec", 0.0)
        )
        goal = f" (PUT goal <= {bound:.2f}/s)"
    dollars = cost.request_dollars_per_month(rates)
    storage = cost.storage_dollars_per_month(extra.get("stored_ratio", 1.0))
    return f"{ops}{goal}; requests ${dollars:.2f}/month, storage ${storage:.2f}/month"


def cost_workload(partitions: int) -> Callable[[Bench], None]:
    def scenario(bench: Bench) -> None:
        s = bench.settings
        topic = bench.topic(partitions)
        rate = round(s.cost_bytes_per_sec / s.record_size)
        argv = bench.tools.producer_performance_argv(
            bench.target.bootstrap,
            topic,
            num_records=max(1, int(rate * s.cost_seconds)),
            record_size=s.record_size,
            throughput=rate,
            producer_props={**s.producer_config("1"), "partitioner.class": ROUND_ROBIN},
        )
        measure_window = bench.target.config() is not None

        def run() -> py.Run:
            # Files, not pipes: a broker refusing records makes the tool print a stack trace
            # each, and a full pipe would stall it while nothing reads.
            with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
                started = time.perf_counter()
                tool = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err)
                _sleep_until(started + s.cost_seconds * s.cost_ramp_fraction)
                first = _sample(bench.target) if measure_window else None
                _sleep_until(started + s.cost_seconds)
                last = _sample(bench.target) if measure_window else None
                code = tool.wait(timeout=s.cost_seconds + 180)
                out.seek(0)
                err.seek(0)
                stdout, stderr = out.read().decode(), err.read().decode()
            if code != 0:
                raise PerfToolError(f"ProducerPerformance exited {code}: {stderr[-4000:]}")
            result = producer_run(parse_producer_performance(stdout).total, s.record_size)
            result.extra["partitions"] = float(partitions)
            if first is not None and last is not None:
                result.extra.update(cost.window(first, last, record_size=s.record_size))
                result.extra.update(broker_figures(bench.target, result.extra, partitions))
            return result

        bench.measured("kafka-tools", run, settle=True)
        print(f"      {cost_summary(bench.results[-1].extra)}", flush=True)

    return scenario


def _sleep_until(moment: float) -> None:
    time.sleep(max(0.0, moment - time.perf_counter()))


def java_defaults_run(output: ToolOutput, *, offered: int, record_size: int, wall: float) -> py.Run:
    """ProducerPerformance's result when it may have been stopped: its summary when it finished
    (records acknowledged, its rate and percentiles), else its progress lines (acknowledged
    records, their rate, average and largest latency); with the records that failed (expired in
    the producer, or another exception) and those neither acknowledged nor failed."""
    failures = parse_producer_errors(output.stderr)
    failed = sum(failures.values())
    summary = None
    if not output.stopped:
        try:
            summary = parse_producer_performance(output.stdout).total
        except PerfToolError:
            summary = None
    if summary is not None:
        acked, rate = summary.records, summary.records_per_sec
        seconds = acked / rate if rate else wall
        latency = py.latency_summary(
            summary.avg_latency_ms, summary.p50_ms, summary.p99_ms, summary.p999_ms
        )
        latency["max"] = summary.max_latency_ms
    else:
        progress = parse_producer_progress(output.stdout)
        if not progress.records and not failed:
            raise PerfToolError(
                f"ProducerPerformance acknowledged and failed nothing (exit {output.returncode})"
                f"\nstdout: {output.stdout[-2000:]}\nstderr: {output.stderr[-4000:]}"
            )
        acked, seconds = progress.records, progress.seconds or wall
        latency = {"avg": progress.avg_latency_ms, "max": progress.max_latency_ms}
    run = py.Run(acked, acked * record_size, seconds)
    run.reported_latency_ms = latency
    run.extra.update(
        offered_records=float(offered),
        expired_records=float(failures.get("expired", 0)),
        failed_records=float(failed),
        unresolved_records=float(max(0, offered - acked - failed)),
        stopped=1.0 if output.stopped else 0.0,
    )
    return run


def _java_defaults_argv(bench: Bench, rate: int, seconds: float) -> tuple[int, list[str]]:
    """ProducerPerformance with every Kafka 4 producer default, offered ``rate`` records/s
    for ``seconds`` on a new topic of one partition: the records offered, and its command."""
    s = bench.settings
    offered = max(1, int(rate * seconds))
    argv = bench.tools.producer_performance_argv(
        bench.target.bootstrap,
        bench.topic(1),
        num_records=offered,
        record_size=s.record_size,
        throughput=rate,
        producer_props=JAVA_DEFAULTS,
    )
    return offered, argv


def java_defaults(bench: Bench) -> None:
    s = bench.settings
    offered, argv = _java_defaults_argv(bench, s.java_defaults_rate, s.java_defaults_seconds)

    def run() -> py.Run:
        before = bench.target.metrics_text()
        started = time.perf_counter()
        output = run_tool_bounded(argv, s.java_defaults_seconds + s.java_defaults_grace_seconds)
        result = java_defaults_run(
            output, offered=offered, record_size=s.record_size, wall=time.perf_counter() - started
        )
        result.extra["offered_records_per_sec"] = float(s.java_defaults_rate)
        after = bench.target.metrics_text()
        request = cost.histogram_mean(before, after, PRODUCE_REQUEST_SECONDS, 'api="produce"')
        if request is not None:
            result.extra["produce_request_ms"] = request * 1000
            result.extra["bound_records_per_sec"] = cost.producer_bound_records_per_sec(
                in_flight=int(JAVA_DEFAULTS["max.in.flight.requests.per.connection"]),
                batch_size=int(JAVA_DEFAULTS["batch.size"]),
                record_size=s.record_size,
                request_seconds=request,
            )
        return result

    bench.measured("kafka-tools", run, settle=True)
    extra = bench.results[-1].extra
    bound = extra.get("bound_records_per_sec")
    print(
        f"      expired {extra['expired_records']:.0f}, failed {extra['failed_records']:.0f}, "
        f"unresolved {extra['unresolved_records']:.0f} of {extra['offered_records']:.0f}"
        + (f"; bound {bound:.0f}/s" if bound is not None else ""),
        flush=True,
    )


PUT_SECONDS = "kafscale_s3_put_duration_seconds"


def acks_all_moderate(bench: Bench) -> None:
    """Java's defaults (acks=all, idempotence) offered ``moderate_rate`` records/s on one
    partition, far under what their 5 requests in flight carry even at S3's latency: the
    produce p99 (ProducerPerformance's send-to-ack) against the flush interval + the PUT p99
    (the broker's PUT histogram over the run) + 50 ms."""
    s = bench.settings
    _, argv = _java_defaults_argv(bench, s.moderate_rate, s.moderate_seconds)

    def run() -> py.Run:
        before = bench.target.metrics_text()
        output = run_tool_bounded(argv, s.moderate_seconds + s.java_defaults_grace_seconds)
        if output.stopped:
            raise PerfToolError(f"ProducerPerformance did not finish:\n{output.stderr[-4000:]}")
        result = producer_run(parse_producer_performance(output.stdout).total, s.record_size)
        config = bench.target.config()
        put_p99 = cost.histogram_quantile(before, bench.target.metrics_text(), PUT_SECONDS, 0.99)
        if config is not None and put_p99 is not None:
            result.extra["flush_interval_ms"] = float(config.flush_interval)
            result.extra["put_p99_ms"] = put_p99 * 1000
        return result

    bench.measured("kafka-tools", run, settle=True)


def produce_idempotent(bench: Bench) -> None:
    s = bench.settings
    topic = bench.topic(6)
    bench.measured(
        "kafka-tools",
        lambda: bench.producer_performance(
            topic, s.acks_all_records, "all", {"enable.idempotence": "true"}
        ),
        settle=True,
    )


def e2e_idle(bench: Bench) -> None:
    s = bench.settings
    records = max(1, int(s.idle_rate * s.idle_seconds))
    topic = bench.topic(1)
    bench.measured("kafka-tools", lambda: bench.end_to_end_latency(topic, records))
    topic = bench.topic(1)
    bench.measured("java-poller", lambda: idle_poll(bench, topic, s.idle_seconds))
    topic = bench.topic(1)
    bench.measured(
        "confluent-kafka",
        lambda: py.end_to_end(
            bench.target.bootstrap,
            topic,
            rate=s.idle_rate,
            seconds=s.idle_seconds,
            record_size=s.record_size,
            consumer_config={"fetch.wait.max.ms": "0"},
        ),
    )


def idle_poll(bench: Bench, topic: str, seconds: float) -> py.Run:
    """The Java consumer (ConsumerPerformance) polling an empty topic with
    fetch.max.wait.ms=0 for ``seconds``: the cost of its requests alone, over a fixed time on
    every target (EndToEndLatency's run lasts its records times the end-to-end latency, so its
    CPU-seconds grow with the latency, not only with what each request costs)."""
    argv = bench.tools.consumer_performance_argv(
        bench.target.bootstrap,
        topic,
        num_records=1,
        poll_timeout_ms=int(seconds * 1000) * 2,
        consumer_props={"fetch.max.wait.ms": "0"},
    )
    started = time.perf_counter()
    output = run_tool_bounded(argv, seconds)
    if not output.stopped:
        raise PerfToolError(f"ConsumerPerformance ended before {seconds:.0f} s:\n{output.stderr}")
    return py.Run(0, 0, time.perf_counter() - started)


SCENARIOS: dict[str, tuple[str, Callable[[Bench], None]]] = {
    "cost-p300": (
        "100 GB/day of 1 KiB records over 300 partitions, acks=1: S3 requests and $/month",
        cost_workload(300),
    ),
    "cost-p3000": (
        "100 GB/day of 1 KiB records over 3,000 partitions, acks=1: S3 requests and $/month",
        cost_workload(3000),
    ),
    "java-defaults-p1": (
        "the Java producer on every Kafka 4 default offered 5,000 records/s, 1 partition",
        java_defaults,
    ),
    "acksall-moderate-p1": (
        "the Java producer on every Kafka 4 default offered 200 records/s, 1 partition",
        acks_all_moderate,
    ),
    "produce-acksall-idem-p6": (
        "produce, acks=all, idempotent, 256 KiB batches, 6 partitions",
        produce_idempotent,
    ),
    "e2e-idle-cpu": (
        "broker CPU under a consumer polling with fetch.max.wait.ms=0 at 2 records/s",
        e2e_idle,
    ),
}
