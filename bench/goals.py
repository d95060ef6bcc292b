"""Issue 15's goals (write path v2) as measured in one run, and the cost tables of the cost
scenarios: markdown lines for bench/report.py, computed from the run's results alone (no I/O).

Every verdict compares figures from the same run. A goal whose figures are missing (a target
not run, a broker that exports no compaction metrics) says so instead of a verdict.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bench import cost

KAFKA = "kafka"
EMBEDDED, S3 = "kafscale", "kafscale-s3"
TARGETS = (EMBEDDED, S3)
COST_SCENARIOS = ("cost-p300", "cost-p3000")
Result = dict[str, Any]
# A verdict: the cell's text, or None when the goal does not apply to that target.
Check = Callable[[Result, Result | None], str | None]


def _verdict(text: str, met: bool) -> str:
    return f"{text} {'met' if met else '**missed**'}"


def _find(run: dict[str, Any], scenario: str, client: str, target: str) -> Result | None:
    for result in run["results"]:
        if (result["scenario"], result["client"], result["target"]) == (scenario, client, target):
            return dict(result)
    return None


def put_rate(ours: Result, _kafka: Result | None) -> str | None:
    """PUTs per second against 1000/flush interval + 2 per compacted segment."""
    extra = ours["extra"]
    if "s3_put_per_sec" not in extra or "flush_interval_ms" not in extra:
        return "not measured"
    segments = extra.get("compaction_segments_per_sec")
    bound = cost.put_goal_per_sec(extra["flush_interval_ms"], segments or 0.0)
    text = f"{extra['s3_put_per_sec']:.2f}/s vs <= {bound:.2f}/s"
    if segments is None:
        text += " (compaction metrics not available)"
    return _verdict(text, extra["s3_put_per_sec"] <= bound)


# A local directory bills no request: the dollar goals are S3's (MinIO with added latency).
NO_REQUEST_PRICE = "- (a local store's requests cost nothing)"


def request_dollars(ours: Result, _kafka: Result | None) -> str | None:
    """Requests a month per broker at the measured rates, against $60."""
    extra = ours["extra"]
    if ours["target"] != S3:
        return NO_REQUEST_PRICE
    if "s3_put_per_sec" not in extra:
        return "not measured"
    dollars = cost.request_dollars_per_month(cost.request_rates(extra))
    return _verdict(f"${dollars:.2f}", dollars <= cost.REQUEST_DOLLARS_GOAL)


def projected_dollars(ours: Result, _kafka: Result | None) -> str | None:
    """The same with compaction's projected steady-state PUTs in place of the measured ones."""
    extra = ours["extra"]
    if ours["target"] != S3:
        return NO_REQUEST_PRICE
    if "s3_put_per_sec" not in extra or "projected_compaction_puts_per_sec" not in extra:
        return "not measured"
    rates = projected_rates(extra)
    dollars = cost.request_dollars_per_month(rates)
    return _verdict(f"${dollars:.2f}", dollars <= cost.REQUEST_DOLLARS_GOAL)


def projected_rates(extra: dict[str, float]) -> dict[str, float]:
    """Request rates with the measured compaction PUTs replaced by the projected ones."""
    rates = cost.request_rates(extra)
    measured = cost.SEGMENT_PUTS * extra.get("compaction_segments_per_sec", 0.0)
    rates["put"] = (
        rates.get("put", 0.0) - measured + extra.get("projected_compaction_puts_per_sec", 0.0)
    )
    rates["get"] = rates.get("get", 0.0) + extra.get("projected_compaction_gets_per_sec", 0.0)
    return rates


def java_keeps_up(ours: Result, _kafka: Result | None) -> str | None:
    """Embedded store: the offered rate acknowledged (95%), nothing lost, p99 < 500 ms."""
    if ours["target"] != EMBEDDED:
        return None
    extra, p99 = ours["extra"], ours["latency_ms"].get("p99")
    lost = extra.get("failed_records", 0) + extra.get("unresolved_records", 0)
    offered = extra.get("offered_records_per_sec", 0.0)
    rate = ours["records_per_sec"]
    p99_text = f"p99 {p99:.0f} ms" if p99 is not None else "no p99 (stopped)"
    met = rate >= 0.95 * offered and lost == 0 and p99 is not None and p99 < 500
    return _verdict(f"{rate:,.0f}/s of {offered:,.0f}, {lost:.0f} not acked, {p99_text}", met)


def acks_all_p99(ours: Result, _kafka: Result | None) -> str | None:
    """acks=all at moderate load: produce p99 <= flush interval + PUT p99 + 50 ms."""
    extra, p99 = ours["extra"], ours["latency_ms"].get("p99")
    if "put_p99_ms" not in extra or "flush_interval_ms" not in extra or p99 is None:
        return "not measured"
    bound = extra["flush_interval_ms"] + extra["put_p99_ms"] + 50
    text = (
        f"{p99:.0f} ms vs <= {extra['flush_interval_ms']:.0f} + {extra['put_p99_ms']:.0f}"
        f" + 50 = {bound:.0f} ms"
    )
    return _verdict(text, p99 <= bound)


def java_near_bound(ours: Result, _kafka: Result | None) -> str | None:
    """With S3 latency: >= 70% of min(offered, 5 x 16 KiB per Produce round trip), none
    expired."""
    if ours["target"] != S3:
        return None
    extra = ours["extra"]
    if "bound_records_per_sec" not in extra:
        return "no Produce request time"
    bound = min(extra["bound_records_per_sec"], extra.get("offered_records_per_sec", 0.0))
    rate, expired = ours["records_per_sec"], extra.get("expired_records", 0)
    share = rate / bound if bound else 0.0
    text = f"{rate:,.0f}/s = {share:.0%} of {bound:,.0f}/s, {expired:.0f} expired"
    return _verdict(text, share >= 0.7 and expired == 0)


def ratio_check(key: str, bounds: dict[str, float], higher: bool) -> Check:
    """Our figure over Kafka's against a per-target bound."""

    def check(ours: Result, kafka: Result | None) -> str | None:
        if ours["target"] not in bounds:
            return None
        if kafka is None:
            return "no Kafka result"
        a = ours.get(key, ours.get("extra", {}).get(key))
        b = kafka.get(key, kafka.get("extra", {}).get(key))
        if not a or not b:
            return "-"
        r, bound = a / b, bounds[ours["target"]]
        return _verdict(f"{r:.2f}x", r >= bound if higher else r <= bound)

    return check


def p99_check(bounds: dict[str, float]) -> Check:
    def check(ours: Result, _kafka: Result | None) -> str | None:
        p99 = ours["latency_ms"].get("p99")
        if ours["target"] not in bounds or p99 is None:
            return None
        return _verdict(f"{p99:.0f} ms", p99 <= bounds[ours["target"]])

    return check


# (goal, scenario, client, check)
GOALS: list[tuple[str, str, str, Check]] = [
    *[
        (label, scenario, "kafka-tools", check)
        for scenario in COST_SCENARIOS
        for label, check in (
            ("S3 PUTs/s per broker <= 1000/flush-interval-ms + 2 per compacted segment", put_rate),
            ("S3 requests <= $60/month per broker (measured)", request_dollars),
            ("... with compaction's projected steady-state PUTs", projected_dollars),
        )
    ],
    (
        "Java producer on all defaults keeps up: 5,000 rec/s, all acked, p99 < 500 ms",
        "java-defaults-p1",
        "kafka-tools",
        java_keeps_up,
    ),
    (
        "Java producer on all defaults: >= 70% of its bound (5 x 16 KiB a round trip), none expire",
        "java-defaults-p1",
        "kafka-tools",
        java_near_bound,
    ),
    (
        "acks=all at moderate load (200 rec/s): produce p99 <= flush interval + PUT p99 + 50 ms",
        "acksall-moderate-p1",
        "kafka-tools",
        acks_all_p99,
    ),
    (
        "acks=all + idempotence throughput >= 0.8x Kafka (embedded), 0.5x (S3)",
        "produce-acksall-idem-p6",
        "kafka-tools",
        ratio_check("mb_per_sec", {EMBEDDED: 0.8, S3: 0.5}, higher=True),
    ),
    *[
        (
            "broker CPU with a fetch.max.wait.ms=0 consumer <= 3x Kafka",
            "e2e-idle-cpu",
            client,
            ratio_check("broker_cpu_seconds", {EMBEDDED: 3.0, S3: 3.0}, higher=False),
        )
        for client in ("kafka-tools", "java-poller", "confluent-kafka")
    ],
    (
        "... per second of the client's run (EndToEndLatency's lasts 120 x its latency)",
        "e2e-idle-cpu",
        "kafka-tools",
        ratio_check("broker_cpu_per_second", {EMBEDDED: 3.0, S3: 3.0}, higher=False),
    ),
    *[
        (
            "end-to-end p99 <= 150 ms (embedded), 400 ms (S3)",
            "e2e-latency",
            client,
            p99_check({EMBEDDED: 150.0, S3: 400.0}),
        )
        for client in ("kafka-tools", "confluent-kafka")
    ],
]


def write_path_goals(run: dict[str, Any]) -> list[str]:
    """Issue 15's goals as a markdown table: one row per goal and client run, one column per
    KafScale target; only the goals whose scenario ran."""
    ran = {r["scenario"] for r in run["results"]}
    lines = ["| goal | measured with | " + " | ".join(TARGETS) + " |", "|---|---|---|---|"]
    for label, scenario, client, check in GOALS:
        if scenario not in ran:
            continue
        kafka = _find(run, scenario, client, KAFKA)
        cells = []
        for target in TARGETS:
            ours = _find(run, scenario, client, target)
            cell = check(ours, kafka) if ours is not None else None
            cells.append(cell or "-")
        if all(c == "-" for c in cells):
            continue
        lines.append(f"| {label} | {scenario}, {client} | " + " | ".join(cells) + " |")
    return lines if len(lines) > 2 else []


# (label, how to read it off a cost result's extra, format)
COST_ROWS: list[tuple[str, Callable[[dict[str, float]], float | None], str]] = [
    ("partitions", lambda e: e.get("partitions"), "{:,.0f}"),
    ("steady window s", lambda e: e.get("steady_seconds"), "{:.0f}"),
    ("produced MB/s in the window", lambda e: e.get("steady_mb_per_sec"), "{:.2f}"),
    *[
        (f"S3 {op.upper()}/s", lambda e, op=op: e.get(f"s3_{op}_per_sec"), "{:.2f}")
        for op in cost.OPERATIONS
    ],
    ("flush interval ms", lambda e: e.get("flush_interval_ms"), "{:.0f}"),
    ("compaction segments/s", lambda e: e.get("compaction_segments_per_sec"), "{:.3f}"),
    (
        "PUT goal /s (1000/interval + 2 x segments/s)",
        lambda e: (
            cost.put_goal_per_sec(e["flush_interval_ms"], e.get("compaction_segments_per_sec", 0.0))
            if "flush_interval_ms" in e
            else None
        ),
        "{:.2f}",
    ),
    (
        "requests $/month (measured)",
        lambda e: (
            cost.request_dollars_per_month(cost.request_rates(e)) if "s3_put_per_sec" in e else None
        ),
        "${:.2f}",
    ),
    (
        "compaction PUTs/s, projected",
        lambda e: e.get("projected_compaction_puts_per_sec"),
        "{:.2f}",
    ),
    (
        "compaction ranged GETs/s, projected",
        lambda e: e.get("projected_compaction_gets_per_sec"),
        "{:.2f}",
    ),
    (
        "segment MiB, projected",
        lambda e: (
            e["projected_segment_bytes"] / (1 << 20) if "projected_segment_bytes" in e else None
        ),
        "{:.2f}",
    ),
    (
        "requests $/month (projected compaction)",
        lambda e: (
            cost.request_dollars_per_month(projected_rates(e))
            if "projected_compaction_puts_per_sec" in e
            else None
        ),
        "${:.2f}",
    ),
    ("bytes stored per byte produced", lambda e: e.get("stored_ratio"), "{:.2f}"),
    ("committed chunks MB/s (compaction's input)", lambda e: e.get("chunk_mb_per_sec"), "{:.2f}"),
    (
        "storage $/month (7 days kept)",
        lambda e: (
            cost.storage_dollars_per_month(e["stored_ratio"]) if "stored_ratio" in e else None
        ),
        "${:.2f}",
    ),
]


def cost_tables(run: dict[str, Any]) -> list[str]:
    """A table per cost scenario that ran: the S3 figures of each KafScale target."""
    out: list[str] = []
    for scenario in COST_SCENARIOS:
        found = {t: _find(run, scenario, "kafka-tools", t) for t in TARGETS}
        present = {t: r for t, r in found.items() if r is not None}
        if not present:
            continue
        out += [f"### {scenario}", "", "| figure | " + " | ".join(present) + " |"]
        out.append("|---|" + "---|" * len(present))
        for label, read, fmt in COST_ROWS:
            values = [read(r["extra"]) for r in present.values()]
            if all(v is None for v in values):
                continue
            cells = ["-" if v is None else fmt.format(v) for v in values]
            out.append(f"| {label} | " + " | ".join(cells) + " |")
        out.append("")
    return out
