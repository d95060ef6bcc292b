"""kcat's balanced consumer (`kcat -G`) as a consumer-group member of the group tests: runs kcat
and turns what it prints into the JSON-line events of tests/harness/group_consumer.py, so the
group scenarios run for kcat as for every other client:

    python -m tests.harness.kcat_group --bootstrap B --topics T --group G [options]

Options are group_consumer's. kcat commits with librdkafka's auto-commit: an offset is stored
once kcat has written its record out (so --commit after-processing and auto mean the same) and
committed every auto.commit.interval.ms and when kcat leaves; --commit none turns it off. kcat
does not say when it commits, so no `committed` event is printed: a test reads the group's
offsets with an admin client. Records come from `-J` on stdout, rebalances from kcat's
"% Group G rebalanced ..." lines on stderr (eager: assigned / revoked; cooperative: incremental
assignment / revoke). SIGTERM is passed on to kcat, which commits, leaves the group and exits;
--timeout-ms, --count (kcat's -c) and --exit-after-assigned-ms end the run the same way.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import re
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from tests.harness.clients import find_kcat
from tests.harness.group_consumer import emit

PR_SET_PDEATHSIG = 1
REBALANCED = re.compile(
    r"^% Group \S+ rebalanced"
    r"(?: \(memberid (?P<eager_id>\S+)\): (?P<eager>assigned|revoked): "
    r"|: incremental (?P<coop>assignment|revoke) of \d+ partition\(s\) "
    r"\(memberid (?P<coop_id>[^,]+), [^)]*\): ?)"
    r"(?P<partitions>.*)$"
)
PARTITION = re.compile(r"(\S+) \[(\d+)\]")
KINDS = {
    "assigned": "assigned",
    "assignment": "assigned",
    "revoked": "revoked",
    "revoke": "revoked",
}


def kcat_argv(args: argparse.Namespace) -> list[str]:
    argv = [find_kcat(), "-b", args.bootstrap, "-G", args.group, "-J", "-u"]
    argv += ["-X", f"auto.offset.reset={args.auto_offset_reset}"]
    if args.commit == "none":
        argv += ["-X", "enable.auto.commit=false"]
    if args.count >= 0:
        argv += ["-c", str(args.count)]
    if args.assignor is not None:
        argv += ["-X", f"partition.assignment.strategy={args.assignor}"]
    if args.instance_id is not None:
        argv += ["-X", f"group.instance.id={args.instance_id}"]
    for pair in args.config:
        argv += ["-X", pair]
    return argv + args.topics.split(",")


def die_with_parent() -> None:
    """In kcat, before exec: SIGKILL when this wrapper dies, so a killed member leaves nothing."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class Run:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.lock = threading.Lock()
        self.consumed = 0
        self.ever_assigned = False
        self.stop_at = float("inf")
        self.reason: str | None = None
        self.kcat = subprocess.Popen(
            kcat_argv(args),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            preexec_fn=die_with_parent,
        )

    def emit(self, event: str, **fields: Any) -> None:
        with self.lock:
            emit(event, **fields)

    def read_records(self) -> None:
        assert self.kcat.stdout is not None
        for line in self.kcat.stdout:
            try:
                record = json.loads(line)
            except ValueError:
                self.emit("warning", message=f"kcat printed {line.strip()!r}")
                continue
            fields = {k: record.get(k) for k in ("topic", "partition", "offset", "key")}
            self.emit("record", **fields, value=record.get("payload"))
            self.consumed += 1

    def read_log(self) -> None:
        assert self.kcat.stderr is not None
        for line in self.kcat.stderr:
            line = line.rstrip("\n")
            sys.stderr.write(line + "\n")
            found = REBALANCED.match(line)
            if found is None:
                if line.startswith("% ERROR") or line.startswith("%3|"):
                    self.emit("warning", message=line)
                continue
            kind = KINDS[found["eager"] or found["coop"]]
            tps = sorted((t, int(p)) for t, p in PARTITION.findall(found["partitions"]))
            if kind == "assigned" and tps and not self.ever_assigned:
                self.ever_assigned = True
                if self.args.exit_after_assigned_ms >= 0:
                    self.stop_at = time.monotonic() + self.args.exit_after_assigned_ms / 1000
            if kind == "revoked" and not tps:
                continue
            self.emit(
                kind,
                partitions=[{"topic": t, "partition": p} for t, p in tps],
                memberId=found["eager_id"] or found["coop_id"],
                generationId=None,  # kcat does not say
            )

    def stop(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
        if self.kcat.poll() is None:
            self.kcat.send_signal(signal.SIGTERM)

    def run(self) -> int:
        readers = [
            threading.Thread(target=self.read_records),
            threading.Thread(target=self.read_log),
        ]
        for reader in readers:
            reader.start()
        signal.signal(signal.SIGTERM, lambda *_: self.stop("signal"))
        signal.signal(signal.SIGINT, lambda *_: self.stop("signal"))
        self.emit("started", group=self.args.group, topics=self.args.topics.split(","))
        deadline = time.monotonic() + self.args.timeout_ms / 1000
        while self.kcat.poll() is None:
            if time.monotonic() >= self.stop_at:
                self.stop("assigned-time")
            elif time.monotonic() >= deadline:
                self.stop("timeout")
            time.sleep(0.05)
        for reader in readers:
            reader.join()
        code = self.kcat.returncode
        if self.reason is None:
            self.reason = "count" if 0 <= self.args.count <= self.consumed else f"exit {code}"
        if code not in (0, -signal.SIGTERM):
            self.emit("error", message=f"kcat exited with {code}")
            return 1
        self.emit(
            "done", consumed=self.consumed, reason=self.reason, everAssigned=self.ever_assigned
        )
        return 0


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="kcat_group", description=__doc__)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topics", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--count", type=int, default=-1)
    parser.add_argument("--timeout-ms", type=int, default=60_000)
    parser.add_argument("--assignor", choices=("range", "roundrobin", "cooperative-sticky"))
    parser.add_argument("--instance-id")
    parser.add_argument("--commit", choices=("after-processing", "auto", "none"))
    parser.add_argument("--auto-offset-reset", choices=("earliest", "latest"), default="earliest")
    parser.add_argument("--exit-after-assigned-ms", type=int, default=-1)
    parser.add_argument("--poll-ms", type=int, default=200)  # kcat polls by itself
    parser.add_argument("--config", action="append", default=[])
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(Run(parse_args(sys.argv[1:])).run())
