"""Consumer-group members as background processes, the same for every client, for group tests.

A member is the Java probe's `group-consume` (kafka-clients 3.9 or 4.x), its Python twin
`python -m tests.harness.group_consumer` (aiokafka, confluent-kafka, kafka-python), the franz-go
and kafkajs drivers' `group-consume` (tests/compat/go, tests/compat/node) or kcat -G through
`python -m tests.harness.kcat_group`: all take the same options and print the same JSON lines
(see GroupCommands.java), which a thread per process
reads into a list of `Event`s while it runs. So a scenario is written once and run per client:

    consumers = [group_consumers.start(client, bootstrap, ["t"], "g", assignor="range")
                 for _ in range(3)]
    wait_for_assignment(consumers, {("t", p) for p in range(6)}, timeout=60)
    consumers[0].kill()                          # SIGKILL: a crash, no LeaveGroup
    consumers[1].wait_for(lambda c: len(c.records) >= 100, timeout=60, what="100 records")
    consumers[1].terminate()                     # SIGTERM: commits, leaves the group, exits 0
    records = all_records(consumers)

Every member stops by itself at its `timeout` (the whole run), so a test that dies leaves no
consumer running for long; the `group_consumers` fixture kills what is left at teardown.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from tests.harness.clients import JavaProbe
from tests.harness.franz_go import FranzGo
from tests.harness.group_consumer import ASSIGNORS as PYTHON_ASSIGNORS
from tests.harness.kafkajs import KafkaJs
from tests.harness.paths import ROOT
from tests.harness.procs import HarnessError, wait_until

T = TypeVar("T")
TP = tuple[str, int]

JAVA_CLIENTS = {"java-3.9": "3.9", "java-4": "4"}
# Members that are other programs: the drivers of tests/compat and the kcat wrapper.
DRIVER_CLIENTS = ("franz-go", "kafkajs", "kcat")
CLIENTS = (*JAVA_CLIENTS, "aiokafka", "confluent-kafka", "kafka-python", *DRIVER_CLIENTS)
EVERY_ASSIGNOR = frozenset({"range", "roundrobin", "sticky", "cooperative-sticky"})
ASSIGNORS: dict[str, frozenset[str]] = {
    **{name: EVERY_ASSIGNOR for name in JAVA_CLIENTS},
    **{name: frozenset(names) for name, names in PYTHON_ASSIGNORS.items()},
    "franz-go": EVERY_ASSIGNOR,
    "kafkajs": frozenset({"roundrobin"}),
    "kcat": frozenset({"range", "roundrobin", "cooperative-sticky"}),
}
STOP_TIMEOUT = 30.0


@dataclass(frozen=True, eq=False)
class Event:
    """One line a member printed: `kind` is its "event" (started, assigned, revoked, lost,
    record, committed, commit-failed, warning, error, close-failed, done; "unparsed" for a line
    that is not JSON), `data` the whole object, `at` when it was read (time.monotonic())."""

    kind: str
    data: Mapping[str, Any]
    at: float

    @property
    def partitions(self) -> frozenset[TP]:
        """assigned / revoked / lost: the partitions (with cooperative-sticky, only the change)."""
        return frozenset((p["topic"], p["partition"]) for p in self.data.get("partitions", ()))

    @property
    def tp(self) -> TP:
        return (self.data["topic"], self.data["partition"])

    @property
    def offset(self) -> int:
        return int(self.data["offset"])

    @property
    def key(self) -> str | None:
        return self.data.get("key")

    @property
    def value(self) -> str | None:
        return self.data.get("value")

    @property
    def offsets(self) -> dict[TP, int]:
        """committed / commit-failed: the next offset to consume, per partition."""
        return {(o["topic"], o["partition"]): o["offset"] for o in self.data.get("offsets", ())}


def parse_event(line: str) -> Event:
    try:
        data = json.loads(line)
        return Event(str(data["event"]), data, time.monotonic())
    except (ValueError, KeyError, TypeError):
        return Event("unparsed", {"line": line}, time.monotonic())


class GroupConsumer:
    """One member process; its stdout becomes `events` as it runs, its stderr a tail for errors."""

    def __init__(self, name: str, argv: Sequence[str], *, cwd: os.PathLike[str] | str = ROOT):
        self.name = name
        self.argv = list(argv)
        self._events: list[Event] = []
        self._stderr: collections.deque[str] = collections.deque(maxlen=200)
        self._changed = threading.Condition()
        self._stdout_closed = False
        self._proc = subprocess.Popen(
            self.argv,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            start_new_session=True,  # a Ctrl-C to pytest is not also a SIGINT to the member
        )
        self._readers = [
            threading.Thread(target=self._read_stdout, daemon=True, name=f"{name}-stdout"),
            threading.Thread(target=self._read_stderr, daemon=True, name=f"{name}-stderr"),
        ]
        for reader in self._readers:
            reader.start()

    def __repr__(self) -> str:
        return f"<GroupConsumer {self.name} pid={self.pid}>"

    def _read_stdout(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            event = parse_event(line.rstrip("\n"))
            with self._changed:
                self._events.append(event)
                self._changed.notify_all()
        with self._changed:
            self._stdout_closed = True
            self._changed.notify_all()

    def _read_stderr(self) -> None:
        assert self._proc.stderr is not None
        for line in self._proc.stderr:
            self._stderr.append(line.rstrip("\n"))

    # --- what it printed ---------------------------------------------------------------------

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def events(self) -> list[Event]:
        with self._changed:
            return list(self._events)

    def of_kind(self, *kinds: str) -> list[Event]:
        return [e for e in self.events if e.kind in kinds]

    @property
    def records(self) -> list[Event]:
        return self.of_kind("record")

    @property
    def assignment(self) -> frozenset[TP]:
        """The partitions it owns now: assigned minus revoked and lost, in the order printed."""
        owned: set[TP] = set()
        for event in self.of_kind("assigned", "revoked", "lost"):
            if event.kind == "assigned":
                owned |= event.partitions
            else:
                owned -= event.partitions
        return frozenset(owned)

    @property
    def ever_assigned(self) -> bool:
        return any(e.kind == "assigned" for e in self.events)

    @property
    def committed(self) -> dict[TP, int]:
        """The last offset it committed per partition (the next one to consume)."""
        found: dict[TP, int] = {}
        for event in self.of_kind("committed"):
            found.update(event.offsets)
        return found

    @property
    def member_id(self) -> str | None:
        ids = [e.data.get("memberId") for e in self.of_kind("assigned", "revoked", "lost")]
        return next((i for i in reversed(ids) if i), None)

    @property
    def done(self) -> Event | None:
        return next(iter(self.of_kind("done")), None)

    @property
    def error(self) -> Event | None:
        return next(iter(self.of_kind("error")), None)

    @property
    def stderr_tail(self) -> str:
        return "\n".join(self._stderr)

    def report(self, events: int = 15, stderr: int = 40) -> str:
        """What it did, for an error message: state, the last events and the end of stderr."""
        lines = [f"{self.name} (pid {self.pid}): {self._state()}"]
        lines += [f"  {json.dumps(dict(e.data))}" for e in self.events[-events:]]
        lines.append(f"--- last lines of {self.name}'s stderr ---")
        lines += list(self._stderr)[-stderr:]
        return "\n".join(lines)

    def _state(self) -> str:
        code = self._proc.poll()
        return "running" if code is None else f"exited {code}"

    # --- waiting -----------------------------------------------------------------------------

    def wait_for(
        self, predicate: Callable[[GroupConsumer], T | None], timeout: float, what: str = ""
    ) -> T:
        """Call `predicate(self)` whenever a line arrives (and at least every 0.5 s) until it
        returns something other than None or False, and return that. Fails at `timeout`, or at
        once when the process ended without it (e.g. it printed an error and exited)."""
        __tracebackhide__ = True
        what = what or getattr(predicate, "__name__", "condition")
        deadline = time.monotonic() + timeout
        while True:
            with self._changed:
                seen, closed = len(self._events), self._stdout_closed
            result = predicate(self)
            if result is not None and result is not False:
                return result
            if closed:
                self._reap(5.0)
                raise HarnessError(f"{self.name} ended before {what}\n{self.report()}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise HarnessError(
                    f"{self.name}: {what}: not after {timeout:.0f}s\n{self.report()}"
                )
            self._wait_for_line(seen, min(remaining, 0.5))

    def _wait_for_line(self, seen: int, timeout: float) -> None:
        """Block until more than `seen` events were read, stdout closed, or `timeout` passed."""
        with self._changed:
            self._changed.wait_for(
                lambda: len(self._events) != seen or self._stdout_closed, timeout=timeout
            )

    def wait_event(self, kind: str, timeout: float, after: int = 0) -> Event:
        """The first `kind` event at index `after` or later in `events`."""

        def found(consumer: GroupConsumer) -> Event | None:
            return next((e for e in consumer.events[after:] if e.kind == kind), None)

        return self.wait_for(found, timeout, what=f"a {kind!r} event")

    # --- ending ------------------------------------------------------------------------------

    @property
    def returncode(self) -> int | None:
        return self._proc.poll()

    def wait(self, timeout: float = STOP_TIMEOUT) -> int:
        """Wait until it ends by itself (count, timeout, exit-after-assigned) and all its output
        is read; fails (and kills it) if it is still running after `timeout`."""
        __tracebackhide__ = True
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise HarnessError(
                f"{self.name} still ran after {timeout:.0f}s\n{self.report()}"
            ) from None
        return self._reap(timeout)

    def terminate(self, timeout: float = STOP_TIMEOUT) -> int:
        """SIGTERM (a clean stop: it commits what it processed, closes and so leaves the group
        unless it is a static member) and wait for it; fails if it is still running after
        `timeout`. Returns the exit code (0 for a clean stop)."""
        __tracebackhide__ = True
        self._signal(signal.SIGTERM)
        return self.wait(timeout)

    def kill(self) -> int:
        """SIGKILL (a crash: no commit, no LeaveGroup) and wait for it."""
        self._signal(signal.SIGKILL)
        return self._reap(STOP_TIMEOUT)

    def close(self) -> None:
        """Kill it if it still runs; for teardown."""
        if self._proc.poll() is None:
            self.kill()
        else:
            self._reap(5.0)

    def _signal(self, signum: int) -> None:
        if self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
                if signum == signal.SIGKILL:  # the member's own children too (kcat's wrapper)
                    os.killpg(self._proc.pid, signum)
                else:
                    self._proc.send_signal(signum)

    def _reap(self, timeout: float) -> int:
        code = self._proc.wait(timeout)
        for reader in self._readers:
            reader.join(timeout)
        return code


# --- starting members ------------------------------------------------------------------------


def group_consumer_options(
    bootstrap: str,
    topics: Sequence[str],
    group: str,
    *,
    count: int | None = None,
    timeout: float = 60.0,
    assignor: str | None = None,
    instance_id: str | None = None,
    commit: str = "after-processing",
    auto_offset_reset: str = "earliest",
    exit_after_assigned: float | None = None,
    poll_ms: int = 200,
    configs: Mapping[str, object] | None = None,
) -> list[str]:
    """The command-line options `group-consume` and tests.harness.group_consumer share.
    `configs` are client properties by their Java names (session.timeout.ms, ...)."""
    options = [
        "--bootstrap", bootstrap,
        "--topics", ",".join(topics),
        "--group", group,
        "--timeout-ms", str(int(timeout * 1000)),
        "--commit", commit,
        "--auto-offset-reset", auto_offset_reset,
        "--poll-ms", str(poll_ms),
    ]  # fmt: skip
    if count is not None:
        options += ["--count", str(count)]
    if assignor is not None:
        options += ["--assignor", assignor]
    if instance_id is not None:
        options += ["--instance-id", instance_id]
    if exit_after_assigned is not None:
        options += ["--exit-after-assigned-ms", str(int(exit_after_assigned * 1000))]
    for key, value in (configs or {}).items():
        text = str(value).lower() if isinstance(value, bool) else str(value)
        options += ["--config", f"{key}={text}"]
    return options


class GroupConsumers:
    """Starts members by client name and remembers them, so `close()` can kill what is left."""

    def __init__(self, java_probe: Callable[[], JavaProbe]) -> None:
        self._java_probe = java_probe
        self.started: list[GroupConsumer] = []

    def argv(self, client: str, options: Sequence[str]) -> list[str]:
        if client in JAVA_CLIENTS:
            return self._java_probe().argv(JAVA_CLIENTS[client], "group-consume", *options)
        if client in PYTHON_ASSIGNORS:
            return [
                sys.executable,
                "-m",
                "tests.harness.group_consumer",
                "--client",
                client,
                *options,
            ]
        if client == "kcat":
            return [sys.executable, "-m", "tests.harness.kcat_group", *options]
        if client == "franz-go":
            return FranzGo().group_argv(options)
        if client == "kafkajs":
            return KafkaJs().group_argv(options)
        raise ValueError(f"client must be one of {CLIENTS}, not {client!r}")

    def start(
        self, client: str, bootstrap: str, topics: Sequence[str], group: str, **options: Any
    ) -> GroupConsumer:
        """A running member; `options` are those of `group_consumer_options`. An assignor the
        client does not have is refused with ValueError."""
        assignor = options.get("assignor")
        if client in ASSIGNORS and assignor is not None and assignor not in ASSIGNORS[client]:
            raise ValueError(f"{client} has no {assignor!r} assignor: {sorted(ASSIGNORS[client])}")
        argv = self.argv(client, group_consumer_options(bootstrap, topics, group, **options))
        consumer = GroupConsumer(f"{client}#{len(self.started) + 1}", argv)
        self.started.append(consumer)
        return consumer

    def close(self) -> None:
        for consumer in self.started:
            consumer.close()


def wait_for_assignment(
    consumers: Sequence[GroupConsumer],
    partitions: Iterable[TP],
    timeout: float,
    *,
    balanced: bool = True,
) -> list[frozenset[TP]]:
    """Wait until `consumers` own exactly `partitions` between them, each partition once, every
    one of them has had an assignment, and (if `balanced`) their shares differ by at most one
    partition (which rules out a member still holding everything before the others joined).
    Returns each consumer's assignment, in order."""
    __tracebackhide__ = True
    expected = frozenset(partitions)

    def settled() -> list[frozenset[TP]] | None:
        owned = [c.assignment for c in consumers]
        sizes = [len(o) for o in owned]
        if (
            all(c.ever_assigned for c in consumers)
            and sum(sizes) == len(expected)
            and frozenset().union(*owned) == expected
            and (not balanced or max(sizes) - min(sizes) <= 1)
        ):
            return owned
        return None

    def ended() -> str | None:
        gone = [c.name for c in consumers if c.returncode is not None]
        return f"{', '.join(gone)} ended\n{state()}" if gone else None

    def state() -> str:
        owned = "\n".join(f"{c.name}: {sorted(c.assignment)}" for c in consumers)
        return owned + "\n\n" + "\n\n".join(c.report() for c in consumers)

    try:
        return wait_until(
            settled, timeout=timeout, what=f"assignment of {sorted(expected)}", abort=ended
        )
    except HarnessError as exc:
        if any(c.returncode is not None for c in consumers):
            raise  # ended() already said it all
        raise HarnessError(f"{exc}\n{state()}") from None


def all_records(consumers: Iterable[GroupConsumer]) -> list[Event]:
    """Every record event of every consumer, each consumer's in the order it printed them."""
    return [record for consumer in consumers for record in consumer.records]
