"""The chaos run's faults and its result, without I/O: the schedule a seed draws, what each fault
did, and the dated Markdown result (tests/chaos/results/YYYY-MM-DD-HHMM.md).

A schedule is a pure function of (seed, count): the same seed runs the same faults on the same
targets for the same times, so a failure can be run again. What a fault *did* (how long until the
load was acknowledged again, which broker exited) depends on the machine and is recorded in
`Outcome`.
"""

from __future__ import annotations

import random
import statistics
from collections import Counter
from dataclasses import dataclass, field

BROKERS = 3
ETCD_MEMBERS = 3

# kind -> what it does (the result file's legend)
KINDS = {
    "broker-kill": "SIGKILL a broker's whole process family, start it again at once (same env)",
    "broker-pause": "SIGSTOP a broker's process group past its lease TTL, then SIGCONT",
    "broker-term": "SIGTERM a broker (graceful hand-over), start it again once it exited",
    "etcd-kill": "SIGKILL one etcd member (of 3), start it again after the hold",
    "minio-stop": "stop MinIO (SIGTERM), start it again after the hold",
}


@dataclass(frozen=True)
class Fault:
    index: int
    kind: str
    target: int  # broker id or etcd member index; 0 for MinIO
    hold_s: float  # how long the fault lasts before it is repaired (0: repaired at once)


def schedule(seed: int, count: int, lease_ttl_s: float) -> list[Fault]:
    """``count`` faults drawn from ``seed``: each kind equally likely, no kind three times in a
    row (so a run of 100 sees every kind often)."""
    rng = random.Random(seed)
    kinds = list(KINDS)
    faults: list[Fault] = []
    for index in range(count):
        choices = kinds
        if len(faults) >= 2 and faults[-1].kind == faults[-2].kind:
            choices = [k for k in kinds if k != faults[-1].kind]
        kind = rng.choice(choices)
        if kind == "broker-pause":
            target, hold = rng.randrange(BROKERS), lease_ttl_s + rng.uniform(1.0, 5.0)
        elif kind == "etcd-kill":
            target, hold = rng.randrange(ETCD_MEMBERS), rng.uniform(3.0, 15.0)
        elif kind == "minio-stop":
            target, hold = 0, rng.uniform(5.0, 20.0)
        else:
            target, hold = rng.randrange(BROKERS), 0.0
        faults.append(Fault(index, kind, target, round(hold, 1)))
    return faults


@dataclass
class Outcome:
    """What one fault did. Times in seconds from the fault's injection unless said otherwise."""

    fault: Fault
    started_s: float = 0.0  # since the run began
    note: str = ""  # e.g. "member-1 (leader)"
    # Every partition acknowledged a record sent after the injection.
    recovered_s: float | None = None
    # ... and a record sent after the repair, counted from the repair.
    after_repair_s: float | None = None
    # The cluster settled again: every broker ready, leaders spread over all three.
    settled_s: float | None = None
    # From the repair until the group read a record sent after it on every partition.
    group_s: float | None = None
    # The longest time one partition went without an acknowledgement, from the injection until
    # the cluster settled (a broker joining again after the repair can cost more than the fault).
    longest_gap_s: float | None = None
    failures: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Exit:
    """A broker process the runner found exited without having stopped it."""

    fault_index: int  # the fault during (or after) which it was found
    broker: int
    code: int | None
    reason: str  # its last log line saying why
    expected: bool  # a paused broker whose lease ran out (the current design: exit 1)


@dataclass
class RunResult:
    seed: int
    started: str  # UTC, "YYYY-MM-DD HH:MM"
    command: str
    commit: str
    settings: dict[str, str]
    outcomes: list[Outcome] = field(default_factory=list)
    exits: list[Exit] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)  # of the run, not of one fault
    sent: int = 0
    acked: int = 0
    read: int = 0
    group_read: int = 0
    group_errors: dict[str, int] = field(default_factory=dict)
    delivery_errors: dict[str, int] = field(default_factory=dict)
    client_errors: dict[str, int] = field(default_factory=dict)
    check: str = ""  # the history checker's summary or its failure message
    check_passed: bool = False
    duration_s: float = 0.0
    work_dir: str = ""

    @property
    def passed(self) -> bool:
        return (
            self.check_passed
            and not self.failures
            and not any(o.failures for o in self.outcomes)
            and all(e.expected for e in self.exits)
        )


def _spread(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{min(values):.1f} / {statistics.median(values):.1f} / {max(values):.1f}"


def render(result: RunResult) -> str:
    """The dated result file's Markdown."""
    verdict = "PASS" if result.passed else "FAIL"
    planned = result.settings.get("faults planned", "?")
    cut = result.settings.get("time limit")
    lines = [
        f"# Chaos run {result.started} UTC: {verdict}",
        "",
        f"`{result.command}` (scripts/chaos.sh, tests/chaos/run.py) at commit `{result.commit}`:",
        f"{len(result.outcomes)} faults of {planned} planned in {result.duration_s / 60:.1f} "
        f"minutes, seed {result.seed}."
        + (f" The run had {cut}: it injects no fault after that." if cut else ""),
        "",
        "## Setup",
        "",
    ]
    lines += [f"- {name}: {setting}" for name, setting in result.settings.items()]
    lines += ["", "## Outcome", "", f"**{verdict}**. History check: {result.check}", ""]
    failed = [(o.fault.index, f) for o in result.outcomes for f in o.failures]
    unexpected = [e for e in result.exits if not e.expected]
    if result.failures or failed or unexpected:
        lines += ["Failures:", ""]
        lines += [f"- {f}" for f in result.failures]
        lines += [f"- fault {i}: {f}" for i, f in failed]
        lines += [f"- broker {e.broker} exited (fault {e.fault_index})" for e in unexpected]
        lines.append("")
    lines += [
        "## Faults by kind",
        "",
        "Times in seconds, min / median / max. *Recovered*: from the injection until every "
        "partition acknowledged a record sent after it. *After repair*: from the repair (restart, "
        "SIGCONT, start) until every partition acknowledged a record sent after that. *Settled*: "
        "from the injection until all three brokers were ready again and led two partitions "
        "each, every broker agreeing. *Group*: from the repair until the consumer group read a "
        "record sent after it on every partition. *Longest gap*: the longest time one partition "
        "went without an acknowledgement between the injection and settling.",
        "",
        "| kind | what | faults | recovered | after repair | settled | group | longest gap "
        "| failed |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for kind, what in KINDS.items():
        mine = [o for o in result.outcomes if o.fault.kind == kind]
        lines.append(
            f"| {kind} | {what} | {len(mine)} "
            f"| {_spread([o.recovered_s for o in mine if o.recovered_s is not None])} "
            f"| {_spread([o.after_repair_s for o in mine if o.after_repair_s is not None])} "
            f"| {_spread([o.settled_s for o in mine if o.settled_s is not None])} "
            f"| {_spread([o.group_s for o in mine if o.group_s is not None])} "
            f"| {_spread([o.longest_gap_s for o in mine if o.longest_gap_s is not None])} "
            f"| {sum(1 for o in mine if o.failures)} |"
        )
    lines += [
        "",
        "## Records",
        "",
        f"- sent {result.sent:,}, acknowledged {result.acked:,}, read back {result.read:,}",
        f"- read by the consumer group along the way: {result.group_read:,} (re-reads after a "
        f"rebalance included; the history check holds them against the final read); its "
        f"errors: {result.group_errors or 'none'}",
        f"- delivery errors (records the producer gave up on): {result.delivery_errors or 'none'}",
        f"- librdkafka error callbacks (transient, e.g. a broker down): "
        f"{result.client_errors or 'none'}",
        "",
        "## Broker exits seen",
        "",
    ]
    if result.exits:
        counts = Counter((e.code, e.expected) for e in result.exits)
        summary = ", ".join(
            f"{n} x exit {code} ({'expected' if ok else 'UNEXPECTED'})"
            for (code, ok), n in sorted(counts.items(), key=str)
        )
        lines += [
            f"Exits the runner did not cause: {len(result.exits)} ({summary}); each broker was "
            "started again with the same environment.",
            "",
            "| fault | broker | exit code | expected | last words |",
            "|---|---|---|---|---|",
        ]
        lines += [
            f"| {e.fault_index} | {e.broker} | {e.code} | {'yes' if e.expected else 'NO'} "
            f"| {e.reason.replace('|', '/')[:160]} |"
            for e in result.exits
        ]
    else:
        lines.append("None: no broker exited without being stopped by the runner.")
    lines += [
        "",
        "## Every fault",
        "",
        "| # | at (s) | kind | target | hold (s) | recovered | after repair | settled | group "
        "| longest gap | note |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for o in result.outcomes:
        f = o.fault
        note = "; ".join([o.note, *o.failures]) if o.failures else o.note
        lines.append(
            f"| {f.index} | {o.started_s:.0f} | {f.kind} | {f.target} | {f.hold_s} "
            f"| {_opt(o.recovered_s)} | {_opt(o.after_repair_s)} | {_opt(o.settled_s)} "
            f"| {_opt(o.group_s)} | {_opt(o.longest_gap_s)} | {note.replace('|', '/')} |"
        )
    lines += ["", f"Logs (brokers, etcd, MinIO) were in `{result.work_dir}` on the machine.", ""]
    return "\n".join(lines)


def _opt(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.1f}"
