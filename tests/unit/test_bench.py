"""The benchmark harness's own logic (bench/): parsing Kafka's tool reports, the figures and
ratios of the report, process accounting from /proc. The benchmarks themselves run outside the
test suite (tests never assert on speed)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from bench import procstats, python_driver, report
from bench.kafka_perf import (
    PerfToolError,
    parse_consumer_performance,
    parse_end_to_end_latency,
    parse_producer_performance,
)

PRODUCER_OUTPUT = """\
122161 records sent, 24417.5 records/sec (23.85 MB/sec), 576.0 ms avg latency, 912.0 ms max latency.
200000 records sent, 29967.036260 records/sec (29.26 MB/sec), 644.97 ms avg latency, \
912.00 ms max latency, 740 ms 50th, 880 ms 95th, 893 ms 99th, 902 ms 99.9th.
"""

CONSUMER_OUTPUT = """\
start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec, \
rebalance.time.ms, fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec
2026-11-22 01:47:43:556, 2026-11-22 01:47:47:119, 4.8828, 1.3704, 5000, 1403.3118, 2939, 624, \
7.8250, 8012.8205
"""


def test_producer_performance_summary_skips_progress_lines() -> None:
    result = parse_producer_performance(PRODUCER_OUTPUT)
    assert result.steady_state is None
    assert result.total.records == 200000
    assert result.total.mb_per_sec == pytest.approx(29.26)
    assert (result.total.p50_ms, result.total.p99_ms, result.total.p999_ms) == (740, 893, 902)


def test_producer_performance_without_summary_is_an_error() -> None:
    with pytest.raises(PerfToolError):
        parse_producer_performance(PRODUCER_OUTPUT.splitlines()[0])


def test_consumer_performance_row_by_header() -> None:
    result = parse_consumer_performance(CONSUMER_OUTPUT)
    assert result.records == 5000
    assert result.rebalance_ms == 2939
    assert result.fetch_ms == 624
    assert result.fetch_mb_per_sec == pytest.approx(7.825)


def test_consumer_performance_that_fell_short_is_an_error() -> None:
    short = "WARNING: Exiting before consuming the expected number of records: 10\n"
    with pytest.raises(PerfToolError):
        parse_consumer_performance(short + CONSUMER_OUTPUT)


def test_end_to_end_latency_report() -> None:
    out = (
        "0\t12.5\n1\t3.1\nAvg latency: 8.4527 ms\nPercentiles: 50th = 5, 99th = 41, 99.9th = 101\n"
    )
    result = parse_end_to_end_latency(out)
    assert (result.avg_ms, result.p50_ms, result.p99_ms, result.p999_ms) == (8.4527, 5, 41, 101)
    with pytest.raises(PerfToolError):
        parse_end_to_end_latency("Avg latency: 1.0 ms\n")


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert python_driver.percentile(values, 50) == 50
    assert python_driver.percentile(values, 99) == 99
    assert python_driver.percentile(values, 99.9) == 100
    assert python_driver.percentile([7.0], 99.9) == 7.0
    with pytest.raises(ValueError):
        python_driver.percentile([], 50)


def _result(target: str, **fields: object) -> dict[str, object]:
    base: dict[str, object] = {
        "scenario": "produce-acks1-p1",
        "target": target,
        "client": "kafka-tools",
        "records": 1 << 20,
        "bytes": 1 << 30,
        "seconds": 10.0,
        "mb_per_sec": 100.0,
        "records_per_sec": 1e5,
        "latency_ms": {},
        "broker_cpu_seconds": 4.0,
        "backend_cpu_seconds": 0.0,
        "peak_memory_mib": 500.0,
        "s3_requests": {},
        "extra": {},
    }
    base.update(fields)
    return base


def test_s3_cost_uses_the_appendix_prices() -> None:
    # 256 PUTs per GiB at 100 GB/day for 30 days: 256 * 93.13 * 30 * $0.005/1000 = $3.58.
    assert report.s3_dollars_per_month({"put": 256}, 1.0) == pytest.approx(3.576, abs=0.01)
    # GETs are priced at $0.0004 per 1000; deletes are free.
    assert report.s3_dollars_per_month({"get": 256, "delete": 1000}, 1.0) == pytest.approx(
        0.286, abs=0.01
    )


def test_report_puts_each_kafscale_figure_next_to_kafkas_with_the_ratio() -> None:
    ours = _result("kafscale", mb_per_sec=60.0, broker_cpu_seconds=10.0, s3_requests={"put": 512})
    run = {
        "started": "2026-11-22T12:00:00+00:00",
        "finished": "2026-11-22T12:30:00+00:00",
        "machine": {
            "cpu": "test cpu",
            "cores": 2,
            "memory_gib": 24,
            "kernel": "6",
            "python": "3.11",
            "java": "17",
            "commit": "abc",
        },
        "targets": {"kafscale": "KafScale", "kafka": "Kafka"},
        "settings": {"record_size": 1024},
        "scenarios": {"produce-acks1-p1": "produce, acks=1, 1 partition"},
        "results": [ours, _result("kafka")],
    }
    text = report.markdown(run, "stem")
    assert "| MB/s | 60.0 | 100.0 | 0.60x |" in text
    assert "| broker CPU-s per GiB | 10.00 | 4.00 | 2.50x |" in text
    assert "| S3 requests per GiB | put 512 | - | - |" in text
    # The round's goals: 0.6x >= 0.5x is met, CPU 2.5x > 2x is missed.
    assert (
        "| acks=1 produce throughput >= 0.5x Kafka | produce-acks1-p1, kafka-tools | 0.60x met"
        in (text)
    )
    assert (
        "| broker CPU per GiB produced <= 2x Kafka | produce-acks1-p1, kafka-tools | 2.50x missed"
        in (text)
    )


def test_process_tree_cpu_and_memory_include_children() -> None:
    """A child that burns CPU is charged to its parent's tree, and a tree's PSS is counted."""
    burner = "import time\nend = time.process_time() + 0.5\nwhile time.process_time() < end: pass\n"
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import subprocess, sys; subprocess.run([sys.executable, '-c', {burner!r}])",
        ]
    )
    try:
        deadline = time.monotonic() + 10
        while len(procstats.tree_pids(parent.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(procstats.tree_pids(parent.pid)) >= 2, "the child never appeared"
        sampler = procstats.measure([parent.pid])
        # Wait for the parent's exit without reaping it: as a zombie it still shows its
        # cutime, where the child's CPU went when the parent reaped the child.
        os.waitid(os.P_PID, parent.pid, os.WEXITED | os.WNOWAIT)
        usage = sampler.stop()
    finally:
        parent.kill()
        parent.wait()
    assert usage.cpu_seconds >= 0.3
    assert usage.peak_pss_bytes > 0
    assert usage.samples >= 2
    assert procstats.pss_bytes(os.getpid()) > 0
