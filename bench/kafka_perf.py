"""Kafka's own load generators from kafka-tools (bin/kafka-producer-perf-test.sh,
kafka-consumer-perf-test.sh, kafka-e2e-latency.sh), run against any bootstrap (KafScale or Apache
Kafka) from the jars bench/install.sh copies, with their reports parsed into values.

The report formats are those of Kafka 4.3 (org.apache.kafka.tools):

    ProducerPerformance, last line (and a second one, "N steady state records sent, ...", with
    --warmup-records); its latencies are whole milliseconds (System.currentTimeMillis):
      5000 records sent, 1487.209994 records/sec (1.45 MB/sec), 1226.21 ms avg latency,
      1993.00 ms max latency, 1223 ms 50th, 1937 ms 95th, 1956 ms 99th, 1993 ms 99.9th.
    ConsumerPerformance, a CSV header and one row (MB is 2^20 bytes; MB.sec and nMsg.sec include
    the group join, the fetch.* rates do not):
      start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec,
      rebalance.time.ms, fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec
      2026-11-22 01:47:43:556, 2026-11-22 01:47:47:119, 4.8828, 1.3704, 5000, 1403.3118, 2939,
      624, 7.8250, 8012.8205
    EndToEndLatency (one record in flight: send, wait for the ack, poll until it comes back); the
    percentiles are whole milliseconds, truncated, only the average has sub-millisecond precision:
      Avg latency: 8.4527 ms
      Percentiles: 50th = 5, 99th = 41, 99.9th = 101

ProducerPerformance counts only acknowledged records (its callback records a success, and prints
a failure's stack trace to stderr), and every 5 s prints a progress line for the window since the
last one (written on a success, so a window without one is folded into the next):
      122161 records sent, 24417.5 records/sec (23.85 MB/sec), 576.0 ms avg latency, 912.0 ms max \
latency.
A record that expired in the producer's buffer is one such trace on stderr:
      org.apache.kafka.common.errors.TimeoutException: Expiring 15 record(s) for t-0:120005 ms \
has passed since batch creation
"""

from __future__ import annotations

import itertools
import re
import subprocess
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from bench.kafka_server import KAFKA_LIB, TOOLS_LOG4J2, java_argv, require_jars

PRODUCER_PERFORMANCE_MAIN = "org.apache.kafka.tools.ProducerPerformance"
CONSUMER_PERFORMANCE_MAIN = "org.apache.kafka.tools.ConsumerPerformance"
END_TO_END_LATENCY_MAIN = "org.apache.kafka.tools.EndToEndLatency"

# The perf-test scripts' KAFKA_HEAP_OPTS; an English locale so %f prints a decimal point.
TOOLS_HEAP = ["-Xmx512M"]
TOOLS_JVM_OPTIONS = ["-Duser.language=en", "-Duser.country=US"]


class PerfToolError(RuntimeError):
    """A tool failed, timed out, fell short of its record count or printed no report."""


@dataclass(frozen=True)
class ProducerStats:
    """One summary line of ProducerPerformance (MB is 2^20 bytes; latencies in ms, send to ack)."""

    records: int
    records_per_sec: float
    mb_per_sec: float
    avg_latency_ms: float
    max_latency_ms: float
    p50_ms: int
    p95_ms: int
    p99_ms: int
    p999_ms: int


@dataclass(frozen=True)
class ProducerResult:
    """The whole run, and the run after the warm-up records when --warmup-records was given."""

    total: ProducerStats
    steady_state: ProducerStats | None


@dataclass(frozen=True)
class ConsumerResult:
    """ConsumerPerformance's row: totals and rates over the whole run (group join included) and
    over the fetching alone."""

    mb: float
    mb_per_sec: float
    records: int
    records_per_sec: float
    rebalance_ms: int
    fetch_ms: int
    fetch_mb_per_sec: float
    fetch_records_per_sec: float


@dataclass(frozen=True)
class LatencyResult:
    """EndToEndLatency's produce-to-consume latency: the average, and percentiles in whole ms."""

    avg_ms: float
    p50_ms: int
    p99_ms: int
    p999_ms: int


_PRODUCER_SUMMARY = re.compile(
    r"^(?P<records>\d+)(?P<steady> steady state)? records sent, "
    r"(?P<rps>\S+) records/sec \((?P<mbps>\S+) MB/sec\), "
    r"(?P<avg>\S+) ms avg latency, (?P<max>\S+) ms max latency, "
    r"(?P<p50>\d+) ms 50th, (?P<p95>\d+) ms 95th, (?P<p99>\d+) ms 99th, "
    r"(?P<p999>\d+) ms 99\.9th\.$",
    re.MULTILINE,
)
_PRODUCER_PROGRESS = re.compile(
    r"^(?P<records>\d+) records sent, (?P<rps>\S+) records/sec \((?P<mbps>\S+) MB/sec\), "
    r"(?P<avg>\S+) ms avg latency, (?P<max>\S+) ms max latency\.$",
    re.MULTILINE,
)
# The first line of a printed stack trace: a qualified exception class, then its message.
_EXCEPTION = re.compile(
    r"^(?:[a-zA-Z_$][\w$]*\.)+(?P<cls>[\w$]*(?:Exception|Error))(?::\s?(?P<message>.*))?$",
    re.MULTILINE,
)
_EXPIRED = ("Expiring ", "has passed since batch creation")
_CONSUMER_HEADER = "start.time, end.time, data.consumed.in.MB"
_CONSUMER_SHORT = "WARNING: Exiting before consuming the expected number of records"
_E2E_AVG = re.compile(r"^Avg latency: (?P<avg>\S+) ms$", re.MULTILINE)
_E2E_PERCENTILES = re.compile(
    r"^Percentiles: 50th = (?P<p50>\d+), 99th = (?P<p99>\d+), 99\.9th = (?P<p999>\d+)$",
    re.MULTILINE,
)


def parse_producer_performance(stdout: str) -> ProducerResult:
    """The summary line(s) of ProducerPerformance; progress lines (no percentiles) are skipped."""
    total: ProducerStats | None = None
    steady_state: ProducerStats | None = None
    for match in _PRODUCER_SUMMARY.finditer(stdout):
        stats = ProducerStats(
            records=int(match["records"]),
            records_per_sec=float(match["rps"]),
            mb_per_sec=float(match["mbps"]),
            avg_latency_ms=float(match["avg"]),
            max_latency_ms=float(match["max"]),
            p50_ms=int(match["p50"]),
            p95_ms=int(match["p95"]),
            p99_ms=int(match["p99"]),
            p999_ms=int(match["p999"]),
        )
        if match["steady"]:
            steady_state = stats
        else:
            total = stats
    if total is None:
        raise PerfToolError(f"no ProducerPerformance summary in:\n{stdout}")
    return ProducerResult(total=total, steady_state=steady_state)


@dataclass(frozen=True)
class ProducerProgress:
    """ProducerPerformance's progress windows summed: records acknowledged, the seconds the
    windows span, their record-weighted average latency and the largest latency."""

    records: int
    seconds: float
    avg_latency_ms: float
    max_latency_ms: float

    @property
    def records_per_sec(self) -> float:
        return self.records / self.seconds if self.seconds else 0.0


def parse_producer_progress(stdout: str) -> ProducerProgress:
    """The progress lines of ProducerPerformance (not its summary), summed; all zero without
    any (nothing was acknowledged in the first 5 s, or ever)."""
    records, seconds, weighted, largest = 0, 0.0, 0.0, 0.0
    for match in _PRODUCER_PROGRESS.finditer(stdout):
        count, rate = int(match["records"]), float(match["rps"])
        records += count
        seconds += count / rate if rate else 0.0
        weighted += count * float(match["avg"])
        largest = max(largest, float(match["max"]))
    return ProducerProgress(records, seconds, weighted / records if records else 0.0, largest)


def parse_producer_errors(stderr: str) -> Counter[str]:
    """Records that failed, one stack trace each on stderr, by kind: "expired" (the batch
    outlived delivery.timeout.ms in the producer) or the exception's class name. The traces'
    "Caused by:" lines and log lines are not counted."""
    kinds: Counter[str] = Counter()
    for match in _EXCEPTION.finditer(stderr):
        message = match["message"] or ""
        kinds["expired" if any(m in message for m in _EXPIRED) else match["cls"]] += 1
    return kinds


def parse_consumer_performance(stdout: str) -> ConsumerResult:
    """ConsumerPerformance's CSV row, read by the header's column names (so --hide-header is not
    supported). A run that timed out before its record count is an error, not a result."""
    if _CONSUMER_SHORT in stdout:
        raise PerfToolError(f"ConsumerPerformance consumed fewer records than asked:\n{stdout}")
    lines = [line.strip() for line in stdout.splitlines() if line.strip()]
    for header, row in itertools.pairwise(lines):
        if header.startswith(_CONSUMER_HEADER):
            values = dict(zip(header.split(", "), row.split(", "), strict=True))
            return ConsumerResult(
                mb=float(values["data.consumed.in.MB"]),
                mb_per_sec=float(values["MB.sec"]),
                records=int(values["data.consumed.in.nMsg"]),
                records_per_sec=float(values["nMsg.sec"]),
                rebalance_ms=int(values["rebalance.time.ms"]),
                fetch_ms=int(values["fetch.time.ms"]),
                fetch_mb_per_sec=float(values["fetch.MB.sec"]),
                fetch_records_per_sec=float(values["fetch.nMsg.sec"]),
            )
    raise PerfToolError(f"no ConsumerPerformance report in:\n{stdout}")


def parse_end_to_end_latency(stdout: str) -> LatencyResult:
    """EndToEndLatency's last two lines; the "i<TAB>latency" progress lines are skipped."""
    avg = _E2E_AVG.search(stdout)
    percentiles = _E2E_PERCENTILES.search(stdout)
    if avg is None or percentiles is None:
        raise PerfToolError(f"no EndToEndLatency report in:\n{stdout}")
    return LatencyResult(
        avg_ms=float(avg["avg"]),
        p50_ms=int(percentiles["p50"]),
        p99_ms=int(percentiles["p99"]),
        p999_ms=int(percentiles["p999"]),
    )


def _properties(props: Mapping[str, str]) -> list[str]:
    return [f"{key}={value}" for key, value in props.items()]


class KafkaPerfTools:
    """Runs the three tools to completion (`timeout` seconds at most) and returns their parsed
    reports. Each `*_argv` method is the command line alone, for a caller that runs the tool
    itself (e.g. to sample its CPU time from /proc)."""

    def __init__(self, lib: Path = KAFKA_LIB) -> None:
        require_jars(lib)
        self.lib = lib

    def argv(self, main: str, *args: str) -> list[str]:
        """The java command line of one tool."""
        return java_argv(
            main,
            *args,
            heap=TOOLS_HEAP,
            log4j2=TOOLS_LOG4J2,
            lib=self.lib,
            jvm_options=TOOLS_JVM_OPTIONS,
        )

    def producer_performance_argv(
        self,
        bootstrap: str,
        topic: str,
        *,
        num_records: int,
        record_size: int,
        throughput: int = -1,
        warmup_records: int = 0,
        producer_props: Mapping[str, str] | None = None,
        command_config: Path | None = None,
    ) -> list[str]:
        """ProducerPerformance; throughput -1 sends as fast as the producer can.
        `command_config`: a properties file under `producer_props` (e.g. SASL_SSL's settings)."""
        args = [
            "--bootstrap-server", bootstrap,
            "--topic", topic,
            "--num-records", str(num_records),
            "--record-size", str(record_size),
            "--throughput", str(throughput),
            "--warmup-records", str(warmup_records),
        ]  # fmt: skip
        if command_config is not None:
            args += ["--command-config", str(command_config)]
        if producer_props:
            args += ["--command-property", *_properties(producer_props)]
        return self.argv(PRODUCER_PERFORMANCE_MAIN, *args)

    def consumer_performance_argv(
        self,
        bootstrap: str,
        topic: str,
        *,
        num_records: int,
        group: str | None = None,
        poll_timeout_ms: int = 10_000,
        consumer_props: Mapping[str, str] | None = None,
        command_config: Path | None = None,
    ) -> list[str]:
        """ConsumerPerformance from the earliest offset, in a consumer group (a fresh random one
        unless `group` is given); it gives up after `poll_timeout_ms` without a record."""
        args = [
            "--bootstrap-server", bootstrap,
            "--topic", topic,
            "--num-records", str(num_records),
            "--timeout", str(poll_timeout_ms),
        ]  # fmt: skip
        if group is not None:
            args += ["--group", group]
        if command_config is not None:
            args += ["--command-config", str(command_config)]
        for prop in _properties(consumer_props or {}):
            args += ["--command-property", prop]
        return self.argv(CONSUMER_PERFORMANCE_MAIN, *args)

    def end_to_end_latency_argv(
        self, bootstrap: str, topic: str, *, num_records: int, record_size: int, acks: str = "1"
    ) -> list[str]:
        """EndToEndLatency (it creates the topic when missing)."""
        args = [
            "--bootstrap-server", bootstrap,
            "--topic", topic,
            "--num-records", str(num_records),
            "--producer-acks", acks,
            "--record-size", str(record_size),
        ]  # fmt: skip
        return self.argv(END_TO_END_LATENCY_MAIN, *args)


@dataclass(frozen=True)
class ToolOutput:
    """What a tool printed, and whether it ended by itself or was stopped at its time limit."""

    stdout: str
    stderr: str
    returncode: int
    stopped: bool


def run_tool_bounded(argv: list[str], limit: float) -> ToolOutput:
    """Run a tool for at most `limit` seconds, then stop it (SIGTERM, then SIGKILL), and return
    whatever it printed: for a run whose progress lines are the result when it cannot finish
    (a producer whose broker falls behind). A failure is returned, not raised."""
    with subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=limit)
            stopped = False
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                stdout, stderr = proc.communicate(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                stdout, stderr = proc.communicate()
            stopped = True
    return ToolOutput(stdout, stderr, proc.returncode, stopped)


def run_tool(argv: list[str], timeout: float = 300.0) -> str:
    """Run a tool to its end and return its stdout; a failure or timeout raises with its output.
    With the argv builders and parsers: `parse_producer_performance(run_tool(tools.
    producer_performance_argv(...)))`; a caller that samples the tool's /proc runs argv itself."""
    try:
        result = subprocess.run(
            argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as exc:
        raise PerfToolError(f"{' '.join(argv)} timed out after {timeout:.0f}s") from exc
    if result.returncode != 0:
        raise PerfToolError(
            f"{' '.join(argv)} exited {result.returncode}\n"
            f"stdout: {result.stdout}\nstderr: {result.stderr[-4000:]}"
        )
    return result.stdout
