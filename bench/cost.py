"""What a broker's object-store traffic costs, and issue 15's bounds on it: pure arithmetic over
counter samples taken during a benchmark (no I/O here).

The prices are the spec's cost appendix's (S3 us-east-1): PUT, COPY, POST, LIST $0.005 per
1,000 requests; GET, HEAD and everything else $0.0004 per 1,000; DELETE free; storage $0.023 per
GB-month. The workload is the appendix's: 100 GB (decimal) written a day, kept for the default
retention of 7 days. A month is 30 days.

Issue 15's cost goal, per broker: S3 PUTs per second <= 1000 / flush-interval-ms (one write-ahead
object per flush cycle) + 2 per segment compaction wrote (a `.kfs` and its `.index`), whatever
the partition count; and <= $60 a month of requests at the defaults.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

PRICE_PER_1000 = {"put": 0.005, "list": 0.005, "get": 0.0004, "head": 0.0004, "delete": 0.0}
OTHER_PRICE_PER_1000 = 0.0004
STORAGE_PER_GB_MONTH = 0.023
DAILY_GB = 100
RETENTION_DAYS = 7
MONTH_SECONDS = 30 * 86_400
REQUEST_DOLLARS_GOAL = 60.0  # a month, per broker
OPERATIONS = ("put", "get", "list", "delete")
SEGMENT_PUTS = 2  # a compacted segment is a .kfs and its .index

# Prometheus exposition lines: name, optional {labels}, value (timestamps are not used here).
_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][\w:]*)(?:\{(?P<labels>[^}]*)\})? (?P<value>\S+)$")
# Counters a compactor may name its segments-written count by (with or without _total).
_SEGMENT_COUNTERS = {
    "kafscale_compactions",
    "kafscale_compaction_segments",
    "kafscale_compacted_segments",
}


@dataclass(frozen=True)
class Sample:
    """What a benchmark reads off the broker at one moment of a steady-rate run."""

    seconds: float  # a monotonic clock
    records: int  # records the producer had sent so far
    s3_requests: Mapping[str, int]  # kafscale_s3_requests_total by operation
    compaction: Mapping[str, float]  # kafscale_compact* samples (see `compaction_samples`)
    stored_bytes: int | None  # bytes in the object store (None: not an object store)
    # Bytes of committed write-ahead chunks (kafscale_flush_bytes_total): what compaction turns
    # into segments, compressed as the segments will hold it (None: not exported)
    chunk_bytes: float | None = None


def metric_samples(text: str, prefix: str) -> dict[str, float]:
    """The samples of a /metrics page whose name starts with `prefix`, keyed by `name{labels}`
    as written; prometheus-client's `_created` timestamps are left out."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None or not match["name"].startswith(prefix):
            continue
        if match["name"].endswith("_created"):
            continue
        key = match["name"] + (f"{{{match['labels']}}}" if match["labels"] else "")
        out[key] = float(match["value"])
    return out


def compaction_samples(text: str) -> dict[str, float]:
    """Every `kafscale_compact*` counter of a /metrics page (histogram buckets left out)."""
    samples = metric_samples(text, "kafscale_compact")
    return {k: v for k, v in samples.items() if "_bucket{" not in k}


def segments_written(samples: Mapping[str, float]) -> float | None:
    """Segments compaction wrote, from a counter named kafscale_compactions,
    kafscale_compaction_segments or kafscale_compacted_segments (labels summed, except those
    that name a failure or an error); None when the broker exports no such counter."""
    total: float | None = None
    for key, value in samples.items():
        name, _, labels = key.partition("{")
        if name.removesuffix("_total") not in _SEGMENT_COUNTERS:
            continue
        if "fail" in labels or "error" in labels:
            continue
        total = (total or 0.0) + value
    return total


def histogram_mean(text_before: str, text_after: str, name: str, labels: str) -> float | None:
    """The mean of a histogram's observations between two /metrics pages (`labels` as written,
    e.g. 'api="produce"'); None without observations in between."""
    key = f"{{{labels}}}"
    before, after = metric_samples(text_before, name), metric_samples(text_after, name)
    count = after.get(f"{name}_count{key}", 0.0) - before.get(f"{name}_count{key}", 0.0)
    total = after.get(f"{name}_sum{key}", 0.0) - before.get(f"{name}_sum{key}", 0.0)
    return total / count if count > 0 else None


def histogram_quantile(
    text_before: str, text_after: str, name: str, q: float, labels: str = ""
) -> float | None:
    """The ``q`` quantile of a histogram's observations between two /metrics pages, as
    Prometheus's ``histogram_quantile`` estimates it: linear within the bucket it falls in (the
    top finite bound when it falls in +Inf); None without observations in between."""
    key = f"{{{labels}," if labels else "{"
    before, after = metric_samples(text_before, name), metric_samples(text_after, name)
    bounds: list[tuple[float, float]] = []  # (upper bound, observations at or under it)
    for sample, value in after.items():
        if not sample.startswith(f"{name}_bucket{key}"):
            continue
        found = re.search(r'le="([^"]+)"', sample)
        if found is None:
            continue
        count = value - before.get(sample, 0.0)
        bounds.append((float(found.group(1)), count))
    bounds.sort()
    if not bounds or bounds[-1][1] <= 0:
        return None
    rank = q * bounds[-1][1]
    lower, below = 0.0, 0.0
    for upper, count in bounds:
        if count >= rank:
            if upper == float("inf"):
                return lower
            share = (rank - below) / (count - below) if count > below else 1.0
            return lower + (upper - lower) * share
        lower, below = upper, count
    return lower


def window(first: Sample, last: Sample, *, record_size: int) -> dict[str, float]:
    """Rates over the steady part of a run, between two samples: S3 requests per second by
    operation (`s3_<op>_per_sec`, every one of OPERATIONS even at 0, and any other operation
    seen), the produced MB/s, compaction segments per second (only when the broker counts
    them), the bytes stored per byte produced (only for an object store) and the MB/s of
    committed write-ahead chunks (`chunk_mb_per_sec`, only when the broker counts them)."""
    seconds = last.seconds - first.seconds
    if seconds <= 0:
        raise ValueError("the second sample must be later than the first")
    produced = (last.records - first.records) * record_size
    out = {"steady_seconds": seconds, "steady_mb_per_sec": produced / (1 << 20) / seconds}
    ops = sorted(set(OPERATIONS) | set(first.s3_requests) | set(last.s3_requests))
    for op in ops:
        delta = last.s3_requests.get(op, 0) - first.s3_requests.get(op, 0)
        out[f"s3_{op}_per_sec"] = delta / seconds
    segments = segments_written(last.compaction)
    if segments is not None:
        segments -= segments_written(first.compaction) or 0.0
        out["compaction_segments_per_sec"] = segments / seconds
    if first.stored_bytes is not None and last.stored_bytes is not None and produced:
        out["stored_ratio"] = (last.stored_bytes - first.stored_bytes) / produced
    if first.chunk_bytes is not None and last.chunk_bytes is not None:
        out["chunk_mb_per_sec"] = (last.chunk_bytes - first.chunk_bytes) / (1 << 20) / seconds
    return out


def request_rates(figures: Mapping[str, float]) -> dict[str, float]:
    """The `s3_<op>_per_sec` figures of `window` as {op: requests per second}."""
    return {
        key[len("s3_") : -len("_per_sec")]: value
        for key, value in figures.items()
        if key.startswith("s3_") and key.endswith("_per_sec")
    }


def request_dollars_per_month(rates: Mapping[str, float]) -> float:
    """What requests at these rates (per second, by operation) cost in a 30-day month."""
    return sum(
        rate * MONTH_SECONDS * PRICE_PER_1000.get(op, OTHER_PRICE_PER_1000) / 1000
        for op, rate in rates.items()
    )


def storage_dollars_per_month(stored_ratio: float = 1.0) -> float:
    """Storage a month for the workload's retained bytes: 7 days of 100 GB/day, times the bytes
    stored per byte produced (compression, framing)."""
    return DAILY_GB * RETENTION_DAYS * stored_ratio * STORAGE_PER_GB_MONTH


def put_goal_per_sec(flush_interval_ms: float, segments_per_sec: float = 0.0) -> float:
    """Issue 15's bound on PUTs per broker per second: one object per flush cycle plus two per
    segment compaction wrote."""
    return 1000 / flush_interval_ms + SEGMENT_PUTS * segments_per_sec


@dataclass(frozen=True)
class Compaction:
    """Compaction's projected steady-state requests a second: segment PUTs (`.kfs` + `.index`)
    and merged objects (`put`), ranged GETs of merged chunks at seal (`get`), and the segment
    size it comes to (`segment_bytes`)."""

    put: float
    get: float
    segment_bytes: float


def projected_compaction(
    *,
    stored_bytes_per_sec: float,
    partitions: int,
    segment_bytes: int,
    max_age_ms: int,
    buffer_bytes: int,
) -> Compaction:
    """Compaction's requests once the run has gone on for hours, for a load spread evenly over
    `partitions` (a run of minutes seals nothing: 4 MiB takes hours to fill), following the
    planner (`kafscale.flusher.compact_plan`, docs/design/write-path.md sections 6, 10, 11):

    - a partition is sealed at `segment.bytes`, or at what it receives in the maximum age;
    - when the bytes of that age pass MERGE_AT of the buffer, merges run, one merged object
      each time MERGE_BYTES of the buffer has come in; a partition seals at MAX_MERGED merged
      chunks at the latest, and partitions past SEAL_SOON of `segment.bytes` are sealed when
      memory is short (counted at SEAL_SOON: the worst case);
    - the seals of one plan read their merged chunks together (section 11.2): partitions of an
      even load age together and are sealed in batches of neighbours, at most SEAL_BATCH and
      `seal_read_bytes` of merged chunks a batch, each batch reading each merged object once
      (one ranged GET). Every merged object is so read once per batch of the partitions it
      holds."""
    from kafscale.flusher import compact_plan  # the planner's constants

    if stored_bytes_per_sec <= 0 or partitions <= 0:
        return Compaction(0.0, 0.0, 0.0)
    rate = stored_bytes_per_sec
    per_partition = rate / partitions
    age = per_partition * max_age_ms / 1000
    segment = min(float(segment_bytes), age)
    merges = 0.0  # merged objects a second
    if rate * max_age_ms / 1000 > buffer_bytes * compact_plan.MERGE_AT and buffer_bytes > 0:
        merge_seconds = buffer_bytes * compact_plan.MERGE_BYTES / rate
        merges = 1 / merge_seconds
        if segment >= segment_bytes:
            segment = segment_bytes * compact_plan.SEAL_SOON
        segment = min(segment, per_partition * merge_seconds * compact_plan.MAX_MERGED)
    if segment <= 0:
        return Compaction(float("inf"), 0.0, 0.0)
    seals = rate / segment
    merged_share = segment if merges else 0.0  # a sealed partition's bytes in merged chunks
    batch = max(
        1.0,
        min(
            float(partitions),
            float(compact_plan.SEAL_BATCH),
            compact_plan.seal_read_bytes(buffer_bytes) / merged_share if merged_share else 1.0,
        ),
    )
    gets = merges * math.ceil(partitions / batch)
    return Compaction(SEGMENT_PUTS * seals + merges, gets, segment)


def records_per_batch(batch_size: int, record_size: int) -> int:
    """1 KiB records a v2 record batch of `batch_size` bytes holds: a 61-byte batch header, and
    per record its value and about 10 bytes of length, attributes, deltas and header count."""
    return max(1, (batch_size - 61) // (record_size + 10))


def producer_bound_records_per_sec(
    *, in_flight: int, batch_size: int, record_size: int, request_seconds: float
) -> float:
    """The most a producer on one partition can be acknowledged: `in_flight` requests of one full
    batch each per request round trip."""
    return in_flight * records_per_batch(batch_size, record_size) / request_seconds
