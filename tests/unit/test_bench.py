"""The benchmark harness's own logic (bench/): parsing Kafka's tool reports, the figures and
ratios of the report, process accounting from /proc. The benchmarks themselves run outside the
test suite (tests never assert on speed)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time

import pytest

from bench import cost, goals, procstats, python_driver, report, write_path
from bench.kafka_perf import (
    PerfToolError,
    ToolOutput,
    parse_consumer_performance,
    parse_end_to_end_latency,
    parse_producer_errors,
    parse_producer_performance,
    parse_producer_progress,
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


def _run(results: list[dict[str, object]]) -> dict[str, object]:
    return {
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
        "targets": {},
        "settings": {"record_size": 1024},
        "scenarios": {"produce-acks1-p6": "produce, acks=1, 6 partitions"},
        "results": results,
    }


def test_three_brokers_are_reported_over_one_and_not_over_a_missing_kafka() -> None:
    one = _result("kafscale-s3", scenario="produce-acks1-p6", mb_per_sec=40.0)
    three = _result("kafscale-s3x3", scenario="produce-acks1-p6", mb_per_sec=30.0)
    run = _run([three, one])
    run.update(command="python -m bench.run x", load_before="1.00", load_after="2.00")
    text = report.markdown(run, "stem")
    assert "| figure | kafscale-s3 | kafscale-s3x3 | kafscale-s3x3 / kafscale-s3 |" in text
    assert "| MB/s | 40.0 | 30.0 | 0.75x |" in text
    assert "this machine has 2 cores" in text
    assert "`python -m bench.run x`" in text and "before: 1.00; after: 2.00" in text
    # With Kafka too, each KafScale target is also shown over Kafka.
    assert report.ratio_columns(["kafscale-s3", "kafscale-s3x3", "kafka"]) == [
        ("kafscale-s3", "kafka"),
        ("kafscale-s3x3", "kafka"),
        ("kafscale-s3x3", "kafscale-s3"),
    ]
    assert "this machine has" not in report.markdown(_run([one]), "stem")


def test_s3_cost_uses_the_appendix_prices() -> None:
    # 256 PUTs per GiB at 100 GB/day for 30 days: 256 * 93.13 * 30 * $0.005/1000 = $3.58.
    assert report.s3_dollars_per_month({"put": 256}, 1.0) == pytest.approx(3.576, abs=0.01)
    # GETs are priced at $0.0004 per 1000; deletes are free.
    assert report.s3_dollars_per_month({"get": 256, "delete": 1000}, 1.0) == pytest.approx(
        0.286, abs=0.01
    )


def test_report_puts_each_kafscale_figure_next_to_kafkas_with_the_ratio() -> None:
    ours = _result("kafscale", mb_per_sec=60.0, broker_cpu_seconds=10.0, s3_requests={"put": 512})
    run = _run([ours, _result("kafka")])
    run.update(
        targets={"kafscale": "KafScale", "kafka": "Kafka"},
        scenarios={"produce-acks1-p1": "produce, acks=1, 1 partition"},
    )
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


# -- issue 15's scenarios: cost arithmetic, parsers, goals ----------------------------------------

METRICS_BEFORE = """\
# HELP kafscale_compactions_total Segments compacted
# TYPE kafscale_compactions_total counter
kafscale_compactions_total 2.0
kafscale_compactions_created 1.7e9
kafscale_compaction_failures_total 1.0
kafscale_compaction_bytes_total 8388608.0
kafscale_request_duration_seconds_count{api="produce"} 10.0
kafscale_request_duration_seconds_sum{api="produce"} 2.0
kafscale_request_duration_seconds_bucket{api="produce",le="0.5"} 10.0
"""
METRICS_AFTER = """\
kafscale_compactions_total 6.0
kafscale_compaction_failures_total 3.0
kafscale_request_duration_seconds_count{api="produce"} 30.0
kafscale_request_duration_seconds_sum{api="produce"} 8.0
"""


def test_request_and_storage_dollars_at_the_appendix_prices() -> None:
    # 4 PUTs/s for 30 days at $0.005 per 1,000 (the design's ~$52 at a 250 ms interval).
    assert cost.request_dollars_per_month({"put": 4.0}) == pytest.approx(51.84)
    assert cost.request_dollars_per_month({"get": 10.0, "delete": 5.0}) == pytest.approx(10.368)
    # 7 days of 100 GB at $0.023/GB-month, and half that when stored at half the size.
    assert cost.storage_dollars_per_month() == pytest.approx(16.1)
    assert cost.storage_dollars_per_month(0.5) == pytest.approx(8.05)
    assert cost.put_goal_per_sec(250, 0.25) == pytest.approx(4.5)


def test_compaction_segments_come_from_the_compaction_counters() -> None:
    before = cost.compaction_samples(METRICS_BEFORE)
    assert "kafscale_compactions_created" not in before
    assert cost.segments_written(before) == 2.0  # failures are not segments written
    assert cost.segments_written(cost.compaction_samples("kafscale_flushes_total 3.0\n")) is None
    labelled = (
        'kafscale_compactions_total{result="ok"} 4.0\n'
        'kafscale_compactions_total{result="failed"} 9.0\n'
    )
    assert cost.segments_written(cost.compaction_samples(labelled)) == 4.0


def test_histogram_mean_between_two_pages() -> None:
    mean = cost.histogram_mean(
        METRICS_BEFORE, METRICS_AFTER, "kafscale_request_duration_seconds", 'api="produce"'
    )
    assert mean == pytest.approx(0.3)  # 6 s over 20 requests
    assert cost.histogram_mean(METRICS_AFTER, METRICS_AFTER, "x", 'api="produce"') is None


def test_window_rates_over_the_steady_part() -> None:
    first = cost.Sample(10.0, 1000, {"put": 100, "get": 3}, {"kafscale_compactions_total": 1.0}, 0)
    last = cost.Sample(
        30.0,
        21480,
        {"put": 180, "get": 3, "list": 2},
        {"kafscale_compactions_total": 3.0},
        10240000,
    )
    figures = cost.window(first, last, record_size=1024)
    assert figures["steady_seconds"] == 20.0
    assert figures["s3_put_per_sec"] == 4.0
    assert figures["s3_get_per_sec"] == 0.0
    assert figures["s3_list_per_sec"] == 0.1
    assert figures["s3_delete_per_sec"] == 0.0  # every operation is reported, even at 0
    assert figures["compaction_segments_per_sec"] == 0.1
    assert figures["stored_ratio"] == pytest.approx(10240000 / (20480 * 1024))
    assert figures["steady_mb_per_sec"] == pytest.approx(1.0)
    assert cost.request_rates(figures) == {"put": 4.0, "get": 0.0, "list": 0.1, "delete": 0.0}
    no_store = cost.Sample(30.0, 21480, {}, {}, None)
    no_store_later = cost.Sample(40.0, 31480, {}, {}, None)
    assert "stored_ratio" not in cost.window(first, no_store, record_size=1024)
    assert "compaction_segments_per_sec" not in cost.window(
        no_store, no_store_later, record_size=1024
    )
    with pytest.raises(ValueError):
        cost.window(last, first, record_size=1024)
    assert "chunk_mb_per_sec" not in figures  # the broker did not count its chunks' bytes
    counted = cost.window(
        dataclasses.replace(first, chunk_bytes=1e6),
        dataclasses.replace(last, chunk_bytes=1e6 + 15 * (1 << 20)),
        record_size=1024,
    )
    assert counted["chunk_mb_per_sec"] == pytest.approx(0.75)


def test_projected_compaction_follows_the_planner() -> None:
    rate = 100e9 / 86_400  # the appendix's bytes a second, stored 1:1
    mib = 1 << 20
    common = {"segment_bytes": 4 * mib, "max_age_ms": 3 * 3_600_000, "buffer_bytes": 512 * mib}
    merge_seconds = 256 * mib / rate  # a merged object each time half the buffer came in
    # 300 partitions: merges free the buffer; partitions are sealed at SEAL_SOON (9/10 of 4 MiB)
    # when memory is short; a plan seals 128 MiB / 3.6 MiB = 35 neighbours, which read each
    # merged object once: 9 batches over 300 partitions.
    p300 = cost.projected_compaction(stored_bytes_per_sec=rate, partitions=300, **common)
    assert p300.segment_bytes == pytest.approx(0.9 * 4 * mib)
    assert p300.put == pytest.approx(2 * rate / (0.9 * 4 * mib) + 1 / merge_seconds)
    assert p300.get == pytest.approx(9 / merge_seconds)
    # 3,000 partitions: the maximum age (3 h) seals ~4.2 MB (47 merged chunks, under 64);
    # batches of 128 MiB / 4.2 MB = 32 partitions: 94 GETs per merged object.
    p3000 = cost.projected_compaction(stored_bytes_per_sec=rate, partitions=3000, **common)
    assert p3000.segment_bytes == pytest.approx(rate / 3000 * 3 * 3600)
    assert p3000.put == pytest.approx(2 * rate / p3000.segment_bytes + 1 / merge_seconds)
    assert p3000.get == pytest.approx(94 / merge_seconds)
    # Three partitions, a buffer that holds an hour: full 4 MiB segments, no merges.
    p3 = cost.projected_compaction(
        stored_bytes_per_sec=rate,
        partitions=3,
        segment_bytes=4 * mib,
        max_age_ms=3_600_000,
        buffer_bytes=1 << 40,
    )
    assert (p3.segment_bytes, p3.get) == (4 * mib, 0.0)
    assert p3.put == pytest.approx(2 * rate / (4 * mib))
    # Few partitions, a small buffer: 64 merged chunks (8.9 MB) come before the segment fills;
    # a plan reads 64 MiB of merged chunks (7.5 partitions'): 4 batches over 30 partitions.
    small = cost.projected_compaction(
        stored_bytes_per_sec=rate, partitions=30, segment_bytes=1 << 30,
        max_age_ms=3_600_000, buffer_bytes=8 * mib,
    )  # fmt: skip
    assert small.segment_bytes == pytest.approx(rate / 30 * (4 * mib / rate) * 64)
    assert small.get == pytest.approx(4 / (4 * mib / rate))
    assert cost.projected_compaction(stored_bytes_per_sec=0.0, partitions=3, **common).put == 0.0


def test_producer_bound_is_five_full_batches_per_round_trip() -> None:
    assert cost.records_per_batch(16384, 1024) == 15
    bound = cost.producer_bound_records_per_sec(
        in_flight=5, batch_size=16384, record_size=1024, request_seconds=0.3
    )
    assert bound == pytest.approx(250.0)


PROGRESS = """\
24990 records sent, 4998.0 records/sec (4.88 MB/sec), 3.5 ms avg latency, 40.0 ms max latency.
710 records sent, 142.0 records/sec (0.14 MB/sec), 1500.0 ms avg latency, 9000.0 ms max latency.
"""
ERRORS = """\
[2026-11-24 15:00:00,000] WARN [Producer clientId=perf-producer-client] Got error produce response
org.apache.kafka.common.errors.TimeoutException: Expiring 15 record(s) for t-0:120004 ms has \
passed since batch creation
org.apache.kafka.common.errors.TimeoutException: Expiring 15 record(s) for t-0:120005 ms has \
passed since batch creation
org.apache.kafka.common.errors.NotLeaderOrFollowerException: This server is not the leader
\tat org.apache.kafka.clients.producer.internals.Sender.completeBatch(Sender.java:1)
Caused by: java.io.IOException: broken pipe
"""


def test_producer_progress_lines_are_summed() -> None:
    progress = parse_producer_progress(PROGRESS + PRODUCER_OUTPUT)
    # The summary line of PRODUCER_OUTPUT has percentiles: not a progress line; its first is.
    assert progress.records == 24990 + 710 + 122161
    assert progress.seconds == pytest.approx(5.0 + 5.0 + 122161 / 24417.5)
    assert progress.max_latency_ms == 9000.0
    assert progress.avg_latency_ms == pytest.approx(
        (24990 * 3.5 + 710 * 1500.0 + 122161 * 576.0) / progress.records
    )
    assert parse_producer_progress("").records_per_sec == 0.0


def test_producer_failures_are_counted_by_kind() -> None:
    errors = parse_producer_errors(ERRORS)
    assert errors == {"expired": 2, "NotLeaderOrFollowerException": 1}


def test_java_defaults_result_from_the_summary_or_the_progress() -> None:
    finished = ToolOutput(PRODUCER_OUTPUT, "", 0, stopped=False)
    run = write_path.java_defaults_run(finished, offered=200000, record_size=1024, wall=9.0)
    assert run.records == 200000
    assert run.records_per_sec == pytest.approx(29967.03626)
    assert run.reported_latency_ms["p99"] == 893
    assert run.extra["unresolved_records"] == 0.0

    stopped = ToolOutput(PROGRESS, ERRORS, -15, stopped=True)
    run = write_path.java_defaults_run(stopped, offered=30000, record_size=1024, wall=170.0)
    assert run.records == 25700
    assert run.seconds == pytest.approx(10.0)
    assert "p99" not in run.reported_latency_ms
    assert run.extra["expired_records"] == 2.0
    assert run.extra["failed_records"] == 3.0
    assert run.extra["unresolved_records"] == 30000 - 25700 - 3
    assert run.extra["stopped"] == 1.0

    with pytest.raises(PerfToolError):
        write_path.java_defaults_run(
            ToolOutput("", "no such class", 1, stopped=False),
            offered=1,
            record_size=1024,
            wall=1.0,
        )


def _run_of(*results: dict[str, object]) -> dict[str, object]:
    return {"results": list(results)}


def test_cost_goals_and_table() -> None:
    extra = {
        "partitions": 300.0,
        "steady_seconds": 90.0,
        "steady_mb_per_sec": 1.1,
        "s3_put_per_sec": 4.2,
        "s3_get_per_sec": 0.0,
        "s3_list_per_sec": 0.0,
        "s3_delete_per_sec": 0.1,
        "flush_interval_ms": 250.0,
        "compaction_segments_per_sec": 0.1,
        "projected_compaction_puts_per_sec": 1.3,
        "stored_ratio": 0.5,
    }
    s3 = _result("kafscale-s3", scenario="cost-p300", client="kafka-tools", extra=extra)
    no_metrics = {k: v for k, v in extra.items() if k != "compaction_segments_per_sec"}
    embedded = _result("kafscale", scenario="cost-p300", client="kafka-tools", extra=no_metrics)
    lines = goals.write_path_goals(_run_of(embedded, s3))
    puts = next(line for line in lines if "S3 PUTs/s" in line)
    # 4.2 <= 1000/250 + 2 x 0.1 = 4.2: met; without compaction metrics 4.2 > 4.0: missed.
    assert "4.20/s vs <= 4.00/s (compaction metrics not available) **missed**" in puts
    assert "4.20/s vs <= 4.20/s met" in puts
    dollars = next(line for line in lines if "(measured)" in line)
    assert "$54.43 met" in dollars  # 4.2 x 2,592,000 x $0.005/1000
    # the local store bills no request: no dollar verdict for the embedded target
    assert f"| cost-p300, kafka-tools | {goals.NO_REQUEST_PRICE} | $54.43 met |" in dollars
    projected = next(line for line in lines if "projected" in line)
    # 4.2 - 0.2 measured + 1.3 projected = 5.3 PUTs/s: $68.69.
    assert "$68.69 **missed**" in projected
    table = "\n".join(goals.cost_tables(_run_of(embedded, s3)))
    assert "| S3 PUT/s | 4.20 | 4.20 |" in table
    assert "| compaction segments/s | - | 0.100 |" in table
    assert "| storage $/month (7 days kept) | $8.05 | $8.05 |" in table


def test_java_defaults_and_ratio_goals() -> None:
    java = {"scenario": "java-defaults-p1", "client": "kafka-tools"}
    embedded = _result(
        "kafscale",
        **java,
        records_per_sec=4990.0,
        latency_ms={"p99": 120.0},
        extra={"offered_records_per_sec": 5000.0, "failed_records": 0.0, "unresolved_records": 0.0},
    )
    s3 = _result(
        "kafscale-s3",
        **java,
        records_per_sec=150.0,
        extra={
            "offered_records_per_sec": 5000.0,
            "bound_records_per_sec": 250.0,
            "expired_records": 7.0,
        },
    )
    idem = {"scenario": "produce-acksall-idem-p6", "client": "kafka-tools"}
    idle = {"scenario": "e2e-idle-cpu", "client": "kafka-tools"}
    poll = {"scenario": "e2e-idle-cpu", "client": "java-poller"}

    def per_second(cpu: float) -> dict[str, float]:
        return {"broker_cpu_per_second": cpu}

    text = "\n".join(
        goals.write_path_goals(
            _run_of(
                embedded,
                s3,
                _result("kafka", **java, records_per_sec=4986.0),
                _result("kafscale", **idem, mb_per_sec=85.0),
                _result("kafscale-s3", **idem, mb_per_sec=40.0),
                _result("kafka", **idem, mb_per_sec=100.0),
                _result("kafscale", **idle, broker_cpu_seconds=3.0, extra=per_second(0.5)),
                _result("kafka", **idle, broker_cpu_seconds=1.3, extra=per_second(0.1)),
                _result("kafscale", **poll, broker_cpu_seconds=2.0),
                _result("kafka", **poll, broker_cpu_seconds=1.0),
            )
        )
    )
    assert "4,990/s of 5,000, 0 not acked, p99 120 ms met" in text
    assert "150/s = 60% of 250/s, 7 expired **missed**" in text
    assert "| produce-acksall-idem-p6, kafka-tools | 0.85x met | 0.40x **missed** |" in text
    assert "| e2e-idle-cpu, kafka-tools | 2.31x met | - |" in text
    assert "| e2e-idle-cpu, java-poller | 2.00x met | - |" in text
    per_second_row = "120 x its latency) | e2e-idle-cpu, kafka-tools | 5.00x **missed** |"
    assert per_second_row in text
    assert "e2e-latency" not in text  # only the goals whose scenario ran


def _histogram(name: str, counts: dict[str, int]) -> str:
    """A /metrics page with one histogram: cumulative bucket counts by upper bound."""
    lines = [f'{name}_bucket{{le="{le}"}} {count}' for le, count in counts.items()]
    total = max(counts.values())
    return "\n".join([*lines, f"{name}_count {total}", f"{name}_sum 1.0"])


def test_histogram_quantile_interpolates_in_its_bucket_over_the_run() -> None:
    name = "kafscale_s3_put_duration_seconds"
    before = _histogram(name, {"0.05": 10, "0.1": 10, "0.25": 10, "+Inf": 10})
    # 100 new PUTs: 50 under 50 ms, 40 in (50, 100], 10 in (100, 250]
    after = _histogram(name, {"0.05": 60, "0.1": 100, "0.25": 110, "+Inf": 110})
    assert cost.histogram_quantile(before, after, name, 0.5) == pytest.approx(0.05)
    assert cost.histogram_quantile(before, after, name, 0.7) == pytest.approx(0.05 + 0.05 * 0.5)
    assert cost.histogram_quantile(before, after, name, 0.99) == pytest.approx(0.1 + 0.15 * 0.9)
    assert cost.histogram_quantile(before, before, name, 0.99) is None  # nothing in between
    over = _histogram(name, {"0.05": 0, "0.1": 0, "0.25": 0, "+Inf": 5})
    assert cost.histogram_quantile("", over, name, 0.99) == pytest.approx(0.25)  # top bound
    assert cost.histogram_quantile("", "", name, 0.99) is None


def test_acks_all_p99_goal_is_the_flush_interval_plus_the_put_p99_plus_50_ms() -> None:
    moderate = {"scenario": "acksall-moderate-p1", "client": "kafka-tools"}
    s3 = _result(
        "kafscale-s3",
        **moderate,
        latency_ms={"p99": 180.0},
        extra={"flush_interval_ms": 250.0, "put_p99_ms": 120.0},
    )
    embedded = _result(
        "kafscale",
        **moderate,
        latency_ms={"p99": 180.0},
        extra={"flush_interval_ms": 50.0, "put_p99_ms": 40.0},
    )
    [line] = [line for line in goals.write_path_goals(_run_of(embedded, s3)) if "moderate" in line]
    assert "180 ms vs <= 50 + 40 + 50 = 140 ms **missed**" in line
    assert "180 ms vs <= 250 + 120 + 50 = 420 ms met" in line
