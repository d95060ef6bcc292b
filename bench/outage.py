"""How long a partition was out when a broker left, from a producer's acknowledgements (pure;
bench/failover.py takes the measurements and writes the report this module builds).

    .venv/bin/python -m bench.outage bench/results/<date>-<time>-failover.json  # (re)write the .md

A partition that moves gets a new leader epoch, whose first offset is in the partition's epoch
history (`PartitionRecord.epochs`, docs/design/scale-out.md section 2): every record the new owner
appends has an offset at or above it, every record an earlier owner committed one below it. So
the first acknowledgement the client received carrying such an offset is the first produce the
new owner acknowledged, and a late callback of an acknowledgement the old owner sent before the
fault cannot pass for it. One exception makes a figure later, never earlier: a batch the old owner
committed but did not acknowledge before it died is answered by the new owner as a duplicate,
with its original offset (scale-out.md section 10), and counts as the old owner's.

Per moved partition: `first_ack_s`, the fault (SIGKILL or SIGTERM sent) to that first
acknowledgement, what the issue calls failover time; `gap_s`, the longest time without any
acknowledgement arriving, from the last one before the fault to that first one: what the
partition's producers waited (for a SIGKILL it starts before the fault, with the flush cycle
the dead broker never finished; the new owner's duplicate answers, which may come a cycle before
its first new offset, end it);
`leader_seen_s`, the fault to a survivor's Metadata naming the new leader (None when the poll
never saw the move: it may be missed between two polls); and, for scale, `gap_before_s`, the
partition's longest interval without an acknowledgement in the seconds before the fault (about
a flush cycle: acks=all answers a cycle's records together).
"""

from __future__ import annotations

import itertools
import json
import statistics
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Ack = tuple[float, int]  # (the client's clock when the acknowledgement arrived, its offset)
STEADY_WINDOW_S = 4.0  # seconds before a fault that show the partition's normal gaps


@dataclass(frozen=True)
class PartitionOutage:
    partition: int
    old_owner: int
    new_owner: int
    epoch: int  # the leader epoch the partition moved to
    start_offset: int  # that epoch's first offset
    first_ack_s: float
    gap_s: float
    leader_seen_s: float | None
    gap_before_s: float | None


def new_epoch(epochs: Sequence[tuple[int, int]], before: int) -> tuple[int, int] | None:
    """The first (epoch, start offset) of the history after epoch `before`, if any."""
    later = [entry for entry in epochs if entry[0] > before]
    return min(later) if later else None


def first_ack_from(acks: Iterable[Ack], start_offset: int) -> float | None:
    """When the first acknowledgement of an offset >= `start_offset` arrived."""
    times = [t for t, offset in acks if offset >= start_offset]
    return min(times) if times else None


def longest_silence(acks: Iterable[Ack], fault_at: float, until: float) -> float:
    """The longest interval in which no acknowledgement arrived, from the last arrival before
    the fault (or the fault, if none came before it) to `until`."""
    acks = list(acks)
    start = max((t for t, _ in acks if t <= fault_at), default=fault_at)
    times = [start, *sorted(t for t, _ in acks if fault_at < t <= until), until]
    return max(later - earlier for earlier, later in itertools.pairwise(times))


def longest_gap(
    acks: Sequence[Ack], fault_at: float, window: float = STEADY_WINDOW_S
) -> float | None:
    """The longest interval between the arrivals of acknowledgements in the `window` seconds
    before the fault (None with fewer than two)."""
    times = sorted(t for t, _ in acks if fault_at - window <= t < fault_at)
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    return max(gaps) if gaps else None


def partition_outage(
    *,
    partition: int,
    acks: Sequence[Ack],
    fault_at: float,
    old_owner: int,
    new_owner: int,
    epoch: tuple[int, int],
    leader_seen_at: float | None,
) -> PartitionOutage | None:
    """One moved partition's figures (times on the client's clock, `fault_at` the moment the
    signal was sent); None until the new owner has acknowledged something."""
    first = first_ack_from(acks, epoch[1])
    if first is None:
        return None
    return PartitionOutage(
        partition=partition,
        old_owner=old_owner,
        new_owner=new_owner,
        epoch=epoch[0],
        start_offset=epoch[1],
        first_ack_s=first - fault_at,
        gap_s=longest_silence(acks, fault_at, first),
        leader_seen_s=None if leader_seen_at is None else leader_seen_at - fault_at,
        gap_before_s=longest_gap(acks, fault_at),
    )


def bursts(acks: Iterable[Ack], fault_at: float, until: float) -> list[list[float]]:
    """The acknowledgements from STEADY_WINDOW_S before the fault to `until`, as the report's
    evidence: those arriving within a millisecond of each other (a flush cycle's, answered
    together) merged into [ms after the fault, first offset, last offset, count]."""
    out: list[list[float]] = []
    for t, offset in sorted(acks):
        if not fault_at - STEADY_WINDOW_S <= t <= until:
            continue
        ms = round((t - fault_at) * 1000, 1)
        if out and ms - out[-1][0] <= 1.0:
            last = out[-1]
            last[1], last[2], last[3] = min(last[1], offset), max(last[2], offset), last[3] + 1
        else:
            out.append([ms, offset, offset, 1])
    return out


def spread(values: Iterable[float | None]) -> dict[str, float] | None:
    """min, median and max of the values given (None ones left out); None if there are none."""
    present = sorted(v for v in values if v is not None)
    if not present:
        return None
    return {"min": present[0], "median": statistics.median(present), "max": present[-1]}


# -- the report ----------------------------------------------------------------------------------

FAULTS = {
    "kill": "SIGKILL of a broker's whole process family",
    "term": "SIGTERM: the broker hands its partitions over, then exits",
}


def _seconds(summary: dict[str, float] | None) -> str:
    if summary is None:
        return "-"
    return f"{summary['min']:.2f} / {summary['median']:.2f} / {summary['max']:.2f}"


def _from_victim(fault: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in fault["partitions"] if p["old_owner"] == fault["victim"]]


def summary_rows(faults: list[dict[str, Any]]) -> list[str]:
    """A row per (fault kind, lease TTL): min / median / max over the faults of the slowest
    moved partition, and over every moved partition of every fault of that kind."""
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for fault in faults:
        groups.setdefault((fault["kind"], fault["ttl_ms"]), []).append(fault)
    rows = [
        "| fault | lease TTL | faults | moved partitions | fault -> first ack, slowest "
        "partition of each fault | fault -> first ack, every partition | longest gap without "
        "an ack, every partition | fault -> Metadata names the new leader | longest gap in the "
        f"{STEADY_WINDOW_S:g} s before |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for (kind, ttl_ms), group in groups.items():
        moved = [p for fault in group for p in _from_victim(fault)]
        slowest = [max((p["first_ack_s"] for p in _from_victim(f)), default=None) for f in group]
        rows.append(
            f"| {kind} | {ttl_ms / 1000:g} s | {len(group)} | {len(moved)} "
            f"| {_seconds(spread(slowest))} "
            f"| {_seconds(spread(p['first_ack_s'] for p in moved))} "
            f"| {_seconds(spread(p['gap_s'] for p in moved))} "
            f"| {_seconds(spread(p['leader_seen_s'] for p in moved))} "
            f"| {_seconds(spread(p['gap_before_s'] for p in moved))} |"
        )
    return rows


def fault_rows(faults: list[dict[str, Any]]) -> list[str]:
    """Every fault and every partition it moved (also those moved between survivors)."""
    rows = [
        "| fault | TTL | victim | partition | owner | epoch (start offset) | first ack s | gap s "
        "| leader seen s | broker exited after s | delivery errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for fault in faults:
        exited = fault.get("exited_s")
        errors = ", ".join(f"{k} {v}" for k, v in fault["delivery_errors"].items()) or "0"
        for p in fault["partitions"]:
            seen = p["leader_seen_s"]
            rows.append(
                f"| {fault['kind']} #{fault['repeat']} | {fault['ttl_ms'] / 1000:g} s "
                f"| {fault['victim']} | {p['partition']} | {p['old_owner']} -> {p['new_owner']} "
                f"| {p['epoch']} ({p['start_offset']}) | {p['first_ack_s']:.2f} "
                f"| {p['gap_s']:.2f} "
                f"| {'-' if seen is None else f'{seen:.2f}'} "
                f"| {'-' if exited is None else f'{exited:.2f}'} | {errors} |"
            )
    return rows


def markdown(run: dict[str, Any]) -> str:
    s = run["settings"]
    m = run["machine"]
    return "\n".join(
        [
            f"# Failover and hand-over times: {run['started'][:10]}",
            "",
            f"Run {run['started']} to {run['finished']} (UTC) with `{run['command']}` "
            f"(commit {m['commit']}). Load average (1, 5, 15 min) before: {run['load_before']}; "
            f"after: {run['load_after']}.",
            "",
            *[f"Note: {note}\n" for note in run.get("notes", [])],
            f"- Machine: {m['cores']} cores ({m['cpu']}), {m['memory_gib']} GiB; Python "
            f"{m['python']}. The three brokers, MinIO, etcd, the latency proxy and the producer "
            "share it.",
            f"- Target: {run['target']}.",
            f"- Load: one confluent-kafka producer (librdkafka defaults, plus "
            f"{', '.join(f'{k}={v}' for k, v in s['producer'].items())}), "
            f"{s['rate']} records/s of {s['record_size']} bytes, round-robin over "
            f"{s['partitions']} partitions, from a thread of the bench's process.",
            "- Faults: " + "; ".join(f"`{k}`: {v}" for k, v in FAULTS.items()) + ". The victim "
            "rotates over the brokers; after each fault it is started again (same id and ports), "
            "the partitions rebalance back, and the next fault waits until every broker agrees "
            "on a balanced assignment and every partition was acknowledged in the last 2 s.",
            "",
            "Times in seconds, min / median / max. `fault -> first ack`: from the signal to the "
            "first acknowledgement of an offset in the partition's new leader epoch (the new "
            "owner's first acknowledged produce; bench/outage.py says why that excludes late "
            "callbacks of the old owner's). `gap`: the longest time without any acknowledgement "
            "arriving on the partition, from the last one before the fault to that first one "
            "(what its producer waited). The moved partitions are those the victim owned. A "
            "SIGKILLed broker's lease ends a TTL after its last refresh (the supervisor refreshes"
            " it every third of the TTL), so 2/3 of a TTL to a TTL after the kill; then a "
            "survivor claims the partition, loads it, the client finds the new leader, and the "
            "new owner acknowledges at the end of its next flush cycle.",
            "",
            *summary_rows(run["faults"]),
            "",
            "## Every fault",
            "",
            *fault_rows(run["faults"]),
            "",
        ]
    )


if __name__ == "__main__":
    source = Path(sys.argv[1])
    target = source.with_suffix(".md")
    target.write_text(markdown(json.loads(source.read_text())))
    print(target)
