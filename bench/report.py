"""The results of a `python -m bench.run`: a markdown report and plots beside its JSON.

    .venv/bin/python -m bench.report bench/results/2026-11-22-1200.json   # (re)write the report

Every KafScale figure stands next to Kafka's from the same run with their ratio. Object-store
requests become dollars with the S3 prices of the spec's cost appendix (us-east-1: PUT, COPY,
POST, LIST $0.005 per 1,000; GET and everything else $0.0004 per 1,000) at the appendix's
workload of 100 GB written a day, each byte read once.

Results of clients that connected over SASL_SSL (`python -m bench.run --security ...`, issue 17)
get sections of their own, labelled so, with the same figures and ratios; when a run has both,
a table puts each target's SASL_SSL figures over its PLAINTEXT ones.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from bench import cost
from bench.goals import COST_SCENARIOS, cost_tables, write_path_goals

GIB = 1 << 30
MIB = 1 << 20
PRICE_PER_1000 = cost.PRICE_PER_1000
DAILY_GB = 100  # the cost appendix's ingestion, decimal gigabytes
DAILY_GIB = DAILY_GB * 1e9 / GIB
KAFKA = "kafka"
PLAINTEXT = "PLAINTEXT"
KAFSCALE_TARGETS = ("kafscale", "kafscale-s3")
SCALE_OUT = ("kafscale-s3x3", "kafscale-s3")  # three brokers, and one, on MinIO + etcd

# Scenarios that move too few bytes for per-byte figures to mean anything.
LATENCY_ONLY = {"e2e-latency", "e2e-idle-cpu"}
PER_BYTE = {
    "mb_per_sec",
    "records_per_sec",
    "cpu_per_gib",
    "backend_cpu_per_gib",
    "s3_per_gib",
    "s3_dollars",
}

# (label, how to read it off a result, whether more is better, format)
FIGURES: list[tuple[str, str, bool, str]] = [
    ("MB/s", "mb_per_sec", True, "{:.1f}"),
    ("records/s", "records_per_sec", True, "{:,.0f}"),
    ("latency p50 ms", "latency_ms.p50", False, "{:.1f}"),
    ("latency p99 ms", "latency_ms.p99", False, "{:.1f}"),
    ("latency p99.9 ms", "latency_ms.p99.9", False, "{:.1f}"),
    ("broker CPU-s per GiB", "cpu_per_gib", False, "{:.2f}"),
    ("broker CPU-s", "broker_cpu_seconds", False, "{:.1f}"),
    ("MinIO + etcd (+ latency proxy) CPU-s per GiB", "backend_cpu_per_gib", False, "{:.2f}"),
    ("peak broker memory MiB (PSS)", "peak_memory_mib", False, "{:.0f}"),
    ("S3 requests per GiB", "s3_per_gib", False, "{}"),
    ("S3 request $/month at 100 GB/day", "s3_dollars", False, "${:.2f}"),
]


def figure(result: dict[str, Any], key: str) -> Any:
    gib = result["bytes"] / GIB
    if key == "cpu_per_gib":
        return result["broker_cpu_seconds"] / gib if gib else None
    if key == "backend_cpu_per_gib":
        return (
            result["backend_cpu_seconds"] / gib
            if gib and result["target"].startswith("kafscale-s3")
            else None
        )
    if key == "s3_per_gib":
        if result["target"] == KAFKA or not gib:
            return None
        counts = {op: n / gib for op, n in sorted(result["s3_requests"].items()) if n}
        return ", ".join(f"{op} {n:.0f}" for op, n in counts.items()) or "0"
    if key == "s3_dollars":
        if result["target"] == KAFKA or not gib:
            return None
        return s3_dollars_per_month(result["s3_requests"], gib)
    value: Any = result
    for part in key.split(".", 1):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def s3_dollars_per_month(requests: dict[str, int], gib: float) -> float:
    """What the requests per GiB moved cost a month at 100 GB a day (30 days)."""
    per_gib = (
        sum(
            n * PRICE_PER_1000.get(op, cost.OTHER_PRICE_PER_1000) / 1000
            for op, n in requests.items()
        )
        / gib
    )
    return per_gib * DAILY_GIB * 30


def _fmt(value: Any, fmt: str) -> str:
    if value is None:
        return "-"
    return fmt.format(value) if not isinstance(value, str) else value


def ratio(ours: Any, kafka: Any) -> str:
    if not isinstance(ours, int | float) or not isinstance(kafka, int | float) or not kafka:
        return "-"
    return f"{ours / kafka:.2f}x"


def security(result: dict[str, Any]) -> str:
    """How the result's clients connected ("PLAINTEXT" for results from before the field)."""
    return str(result.get("security", PLAINTEXT))


Case = tuple[str, str, str]  # scenario, client, security


def _by(results: Iterable[dict[str, Any]]) -> dict[Case, dict[str, dict[str, Any]]]:
    """(scenario, client, security) -> target -> result."""
    table: dict[Case, dict[str, dict[str, Any]]] = {}
    for r in results:
        table.setdefault((r["scenario"], r["client"], security(r)), {})[r["target"]] = r
    return table


def _case_label(case: Case, sep: str = ", ") -> str:
    """scenario, client (and "over SASL_SSL" when not PLAINTEXT)."""
    scenario, client, secure = case
    return f"{scenario}{sep}{client}" + (f" over {secure}" if secure != PLAINTEXT else "")


def goals_summary(run: dict[str, Any]) -> list[str]:
    """This round's goals, each as measured (KafScale embedded and on S3 against Kafka)."""
    table = _by(run["results"])
    lines = ["| goal | measured with | " + " | ".join(KAFSCALE_TARGETS) + " |"]
    lines.append("|---|---|" + "---|" * len(KAFSCALE_TARGETS))
    checks = [
        ("acks=1 produce throughput >= 0.5x Kafka", "produce-acks1", "mb_per_sec", 0.5, True),
        ("broker CPU per GiB produced <= 2x Kafka", "produce-acks1", "cpu_per_gib", 2.0, False),
        ("consume-from-tail throughput >= 0.5x Kafka", "consume-tail", "mb_per_sec", 0.5, True),
    ]
    for label, prefix, key, bound, higher in checks:
        for (scenario, client, secure), by_target in sorted(table.items()):
            # The goals were set for PLAINTEXT; SASL_SSL is compared in a section of its own.
            if not scenario.startswith(prefix) or KAFKA not in by_target or secure != PLAINTEXT:
                continue
            cells = []
            for name in KAFSCALE_TARGETS:
                ours, theirs = by_target.get(name), by_target[KAFKA]
                if ours is None:
                    cells.append("-")
                    continue
                a, b = figure(ours, key), figure(theirs, key)
                if not a or not b:
                    cells.append("-")
                    continue
                r = a / b
                met = r >= bound if higher else r <= bound
                cells.append(f"{r:.2f}x {'met' if met else 'missed'}")
            lines.append(f"| {label} | {scenario}, {client} | " + " | ".join(cells) + " |")
    return lines


def ratio_columns(present: list[str]) -> list[tuple[str, str]]:
    """(numerator, denominator) targets of the ratio columns: each KafScale target over Kafka
    when Kafka ran, and three brokers over one when both ran."""
    pairs = [(t, KAFKA) for t in present if t != KAFKA] if KAFKA in present else []
    if all(t in present for t in SCALE_OUT):
        pairs.append(SCALE_OUT)
    return pairs


def scale_out_note(run: dict[str, Any]) -> list[str]:
    """What the three-brokers-over-one ratio measures on this machine, when it was run."""
    if not any(r["target"] == SCALE_OUT[0] for r in run["results"]):
        return []
    cores = run["machine"]["cores"]
    return [
        f"Note: this machine has {cores} cores. The three brokers of `{SCALE_OUT[0]}` share "
        "them (with the clients, MinIO and etcd), so its ratio to one broker "
        f"(`{SCALE_OUT[0]} / {SCALE_OUT[1]}`) measures what spreading the partitions over "
        "brokers costs (routing, three process families instead of one), not horizontal "
        "scaling: on machines of their own, three brokers would have three times the cores.\n"
    ]


def _run_line(run: dict[str, Any]) -> list[str]:
    """How the run was started, and the machine's load average around it."""
    command = run.get("command", "python -m bench.run")
    out = [
        f"Run {run['started']} to {run['finished']} (UTC) with `{command}` "
        f"(commit {run['machine']['commit']}).",
        "",
    ]
    if "load_before" in run:
        out += [
            f"Load average (1, 5, 15 min) before: {run['load_before']}; "
            f"after: {run['load_after']}.",
            "",
        ]
    return out


def markdown(run: dict[str, Any], stem: str) -> str:
    m = run["machine"]
    settings = run["settings"]
    present = sorted({r["target"] for r in run["results"]}, key=_target_order)
    pairs = ratio_columns(present)
    out = [
        f"# KafScale next to Apache Kafka: {run['started'][:10]}",
        "",
        *_run_line(run),
        *[f"Note: {note}\n" for note in run.get("notes", [])],
        *scale_out_note(run),
        "## Machine",
        "",
        f"- {m['cores']} cores ({m['cpu']}), {m['memory_gib']} GiB memory, Linux {m['kernel']}",
        f"- Python {m['python']}, {m['java']}",
        "- Brokers and clients share the machine: every figure includes the client's CPU "
        "competing with the broker's.",
        "",
        "## Targets",
        "",
        *[f"- `{name}`: {text}" for name, text in run["targets"].items()],
        "",
        "## Settings",
        "",
        "| setting | value |",
        "|---|---|",
        *[f"| {key} | {value} |" for key, value in settings.items()],
        "",
        "Producers (both clients) use `linger.ms` and `batch.size` above and Kafka's defaults "
        "otherwise (no compression, max.in.flight 5). Latency percentiles from Kafka's tools are "
        "whole milliseconds; the confluent-kafka figures are measured per record.",
        "",
        "## This round's goals",
        "",
        *goals_summary(run),
        "",
        *_write_path_section(run),
    ]
    out += security_sections(run, present, pairs)
    for (scenario, client, secure), by_target in _by(run["results"]).items():
        title = run["scenarios"].get(scenario, scenario)
        over = f" over {secure}" if secure != PLAINTEXT else ""
        out += [f"## {scenario}{over}: {title} ({client})", ""]
        header = "| figure | " + " | ".join([*present, *(f"{a} / {b}" for a, b in pairs)]) + " |"
        out += [header, "|---|" + "---|" * (len(present) + len(pairs))]
        for label, key, _higher, fmt in FIGURES:
            if scenario in LATENCY_ONLY and key in PER_BYTE:
                continue
            if scenario in COST_SCENARIOS and key in ("s3_per_gib", "s3_dollars"):
                continue  # requests there follow time, not bytes: see the cost tables
            values = {t: figure(by_target[t], key) if t in by_target else None for t in present}
            if all(v is None for v in values.values()):
                continue
            cells = [_fmt(values[t], fmt) for t in present]
            cells += [ratio(values[a], values[b]) for a, b in pairs]
            out.append(f"| {label} | " + " | ".join(cells) + " |")
        extras = sorted({k for r in by_target.values() for k in r["extra"]})
        for key in extras:
            cells = [_fmt(by_target[t]["extra"].get(key) if t in by_target else None, "{:.2f}")
                     for t in present]  # fmt: skip
            out.append(f"| {key} | " + " | ".join(cells) + " |" + " |" * len(pairs))
        out.append("")
    out += [
        "## How the figures are taken",
        "",
        "- MB is 2^20 bytes. Kafka's tools' rates exclude their JVM start; ConsumerPerformance's "
        "rate is its fetch rate (group join excluded, shown apart).",
        "- Broker CPU: utime + stime of every process of the broker (KafScale: supervisor, "
        "frontend, shards, flusher, coordinator; Kafka: its JVM) from /proc, over the client's "
        "run and, for produce, until KafScale has flushed what it acknowledged. MinIO and "
        "etcd are not counted as the broker (they stand in for S3 and etcd).",
        "- Memory: the peak over 0.25 s samples of the sum of the broker's processes' PSS "
        "(shared-memory buffers counted once).",
        "- S3 $/month: requests per GiB moved x 100 GB/day x 30 days at $0.005 per 1,000 "
        "PUT/LIST and $0.0004 per 1,000 GET/HEAD (the spec's cost appendix). For produce "
        "scenarios that is the write cost; for consume scenarios, the read cost.",
        "",
        f"Plots: `{stem}-throughput.png`, `{stem}-latency.png`.",
        "",
    ]
    return "\n".join(out)


# The figures of the SASL_SSL-over-PLAINTEXT table.
SECURITY_FIGURES = [
    ("MB/s", "mb_per_sec", "{:.1f}"),
    ("latency p99 ms", "latency_ms.p99", "{:.1f}"),
    ("broker CPU-s per GiB", "cpu_per_gib", "{:.2f}"),
    ("peak broker memory MiB", "peak_memory_mib", "{:.0f}"),
]


def security_sections(
    run: dict[str, Any], present: list[str], pairs: list[tuple[str, str]]
) -> list[str]:
    """What SASL_SSL is in the run: its settings, and, when the run has each case both ways,
    each target's SASL_SSL figure over its PLAINTEXT one and the target ratios both ways."""
    secured = run.get("security") or {}
    results = run["results"]
    ways = sorted({security(r) for r in results}, key=lambda w: (w != PLAINTEXT, w))
    if ways == [PLAINTEXT] and not secured:
        return []
    out = ["## Security", ""]
    out += [f"- {name}: {text}" for name, text in secured.items()]
    out.append("")
    table = _by(results)
    for way in (w for w in ways if w != PLAINTEXT):
        both = [
            (scenario, client)
            for scenario, client, secure in table
            if secure == way and (scenario, client, PLAINTEXT) in table
        ]
        if not both:
            continue
        header = ["scenario, client", "figure"]
        for t in present:
            header += [f"{t} {PLAINTEXT}", f"{t} {way}", f"{t} {way} / {PLAINTEXT}"]
        for a, b in pairs:
            header += [f"{a} / {b} {PLAINTEXT}", f"{a} / {b} {way}"]
        out += [
            f"### {way} next to {PLAINTEXT}",
            "",
            f"Each target over {way} and over {PLAINTEXT} in the same run (started fresh each "
            f"way, one after the other), the cost of {way} on each ({way} / {PLAINTEXT}), and "
            "the targets' ratio each way.",
            "",
            "| " + " | ".join(header) + " |",
            "|---|---|" + "---|" * (len(header) - 2),
        ]
        for scenario, client in both:
            plain, secure = table[(scenario, client, PLAINTEXT)], table[(scenario, client, way)]
            for label, key, fmt in SECURITY_FIGURES:
                if scenario in LATENCY_ONLY and key in PER_BYTE:
                    continue

                def value(by_target: dict[str, dict[str, Any]], t: str, key: str = key) -> Any:
                    return figure(by_target[t], key) if t in by_target else None

                cells = []
                for t in present:
                    p, q = value(plain, t), value(secure, t)
                    cells += [_fmt(p, fmt), _fmt(q, fmt), ratio(q, p)]
                for a, b in pairs:
                    cells += [
                        ratio(value(plain, a), value(plain, b)),
                        ratio(value(secure, a), value(secure, b)),
                    ]
                out.append(f"| {scenario}, {client} | {label} | " + " | ".join(cells) + " |")
        out.append("")
    return out


def _write_path_section(run: dict[str, Any]) -> list[str]:
    """Issue 15's goals and the cost scenarios' tables, when any of their scenarios ran."""
    goals = write_path_goals(run)
    tables = cost_tables(run)
    if not goals and not tables:
        return []
    out = ["## Issue 15's goals (write path v2)", "", *goals, ""]
    if tables:
        out += [
            "## S3 requests and dollars at the cost appendix's workload",
            "",
            "Per broker, over the steady part of each cost run (its first quarter left out). "
            "Requests at $0.005 per 1,000 PUT/LIST and $0.0004 per 1,000 GET/HEAD (DELETE "
            "free), 30-day months; storage at $0.023 per GB-month for 7 days of 100 GB/day "
            "times the bytes stored per byte produced. A run of minutes seals few or no "
            "segments, so compaction's steady-state requests are projected (bench/cost.py "
            "`projected_compaction`, following the planner: segments of segment.bytes, 9/10 of "
            "it when the buffer is short, a partition's bytes in the maximum age or 64 merges' "
            "worth, whichever is smallest; a merged object per half buffer of bytes; at seal, "
            "one ranged GET per merged object per batch of neighbouring partitions sealed "
            "together).",
            "",
            *tables,
        ]
    return out


def _target_order(name: str) -> int:
    order = [*KAFSCALE_TARGETS, SCALE_OUT[0], KAFKA]
    return order.index(name) if name in order else len(order)


def _throughput_plot(
    plt: Any,
    table: dict[Case, dict[str, dict[str, Any]]],
    keys: list[Case],
    targets: list[str],
    path: Path,
) -> None:
    width = 0.8 / len(targets)
    fig, ax = plt.subplots(figsize=(max(8, len(keys) * 1.1), 5))
    for i, target in enumerate(targets):
        values = [table[k].get(target, {}).get("mb_per_sec", 0) for k in keys]
        ax.bar([x + i * width for x in range(len(keys))], values, width, label=target)
    ax.set_xticks([x + width * (len(targets) - 1) / 2 for x in range(len(keys))])
    ax.set_xticklabels([_case_label(k, "\n") for k in keys], rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("MB/s")
    ax.set_title("Throughput (higher is better)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plots(run: dict[str, Any], out_dir: Path, stem: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table = _by(run["results"])
    targets = sorted({r["target"] for r in run["results"]}, key=_target_order)
    keys = [k for k in table if k[0] not in LATENCY_ONLY]
    width = 0.8 / len(targets)

    if keys:
        _throughput_plot(plt, table, keys, targets, out_dir / f"{stem}-throughput.png")
    latency_keys = [k for k in table if any(r["latency_ms"] for r in table[k].values())]
    fig, ax = plt.subplots(figsize=(max(8, len(latency_keys) * 1.1), 5))
    for i, target in enumerate(targets):
        p50 = [table[k].get(target, {}).get("latency_ms", {}).get("p50", 0) for k in latency_keys]
        p99 = [table[k].get(target, {}).get("latency_ms", {}).get("p99", 0) for k in latency_keys]
        xs = [x + i * width for x in range(len(latency_keys))]
        ax.bar(xs, p99, width, alpha=0.35, color=f"C{i}")
        ax.bar(xs, p50, width, label=f"{target} (p50; pale: p99)", color=f"C{i}")
    ax.set_xticks([x + width * (len(targets) - 1) / 2 for x in range(len(latency_keys))])
    ax.set_xticklabels(
        [_case_label(k, "\n") for k in latency_keys], rotation=60, ha="right", fontsize=7
    )
    ax.set_yscale("log")
    ax.set_ylabel("ms (log scale)")
    ax.set_title("Latency (lower is better)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_dir / f"{stem}-latency.png", dpi=110)
    plt.close(fig)


def write_report(run: dict[str, Any], out_dir: Path, stem: str) -> Path:
    path = out_dir / f"{stem}.md"
    path.write_text(markdown(run, stem))
    try:
        plots(run, out_dir, stem)
    except ImportError:  # matplotlib comes with the `bench` extra (scripts/bench.sh installs it)
        print("matplotlib is not installed: no plots", file=sys.stderr)
    return path


if __name__ == "__main__":
    source = Path(sys.argv[1])
    print(write_report(json.loads(source.read_text()), source.parent, source.stem))
