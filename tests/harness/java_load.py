"""The Java producer as a load for the fault tests: the probe's `produce-load` (LoadCommands.java),
an idempotent acks=all kafka-clients producer, run as a process while a test kills and pauses
brokers. Each acknowledgement it prints goes into the test's `History` as it arrives, next to
what librdkafka's load acknowledged, so one history check covers both.

    load = java_load(bootstrap, "t", 6, history, "java")  # the fixture: running
    load.more(500)        # wait for 500 more acknowledgements of this producer
    ...                   # faults
    load.stop()           # closes its stdin: it sends no more, waits for every record in
                          # flight, prints "done" and exits 0

The process also stops when its stdin closes because the test process died, and the fixture
kills a load a failed test did not stop.
"""

from __future__ import annotations

import collections
import contextlib
import json
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from tests.harness.clients import JavaProbe
from tests.harness.cluster import longest_gap
from tests.harness.history import History
from tests.harness.procs import HarnessError

STOP_TIMEOUT = 180.0  # it waits for records in flight: up to delivery.timeout.ms (120 s)


class JavaLoads:
    """Starts `JavaLoad`s and remembers them, so `close()` can kill what is left (the
    `java_load` fixture)."""

    def __init__(self, probe: Callable[[], JavaProbe]) -> None:
        self._probe = probe
        self.started: list[JavaLoad] = []

    def __call__(
        self,
        bootstrap: str,
        topic: str,
        partitions: int,
        history: History,
        name: str,
        **options: Any,
    ) -> JavaLoad:
        """A running load (`start()` returned); `options` are JavaLoad's (version, rate)."""
        load = JavaLoad(self._probe(), bootstrap, topic, partitions, history, name, **options)
        self.started.append(load)
        load.start()
        return load

    def close(self) -> None:
        for load in self.started:
            load.close()


class JavaLoad:
    """One `produce-load` process; `acked_at`, `errors` and `outage` as LoadProducer's."""

    def __init__(
        self,
        probe: JavaProbe,
        bootstrap: str,
        topic: str,
        partitions: int,
        history: History,
        name: str,
        *,
        version: str = "4",
        rate: int = 250,
    ) -> None:
        self.topic, self.history, self.name = topic, history, name
        self.argv = probe.argv(
            version, "produce-load", "--bootstrap", bootstrap, "--topic", topic,
            "--partitions", str(partitions), "--name", name, "--rate", str(rate),
            "--client-id", f"load-{name}",
        )  # fmt: skip
        self.acked_at: dict[int, list[float]] = {p: [] for p in range(partitions)}
        self.acked = 0
        self.errors: Counter[str] = Counter()
        self.done: dict[str, Any] | None = None
        self._started = threading.Event()
        self._stderr: collections.deque[str] = collections.deque(maxlen=100)
        self._proc: subprocess.Popen[str] | None = None
        self._readers: list[threading.Thread] = []

    def start(self, timeout: float = 60) -> None:
        self._proc = subprocess.Popen(
            self.argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            start_new_session=True,  # a Ctrl-C to pytest is not also a SIGINT to the producer
        )
        self._readers = [
            threading.Thread(target=self._read_stdout, daemon=True, name=f"{self.name}-stdout"),
            threading.Thread(target=self._read_stderr, daemon=True, name=f"{self.name}-stderr"),
        ]
        for reader in self._readers:
            reader.start()
        deadline = time.monotonic() + timeout
        while not self._started.wait(0.2):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise HarnessError(f"produce-load {self.name} did not start\n{self.report()}")

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """Close its stdin and wait until every record in flight was answered and it exited 0."""
        __tracebackhide__ = True
        assert self._proc is not None and self._proc.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            self._proc.stdin.close()
        try:
            code = self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.close()
            raise HarnessError(f"produce-load {self.name} still ran after {timeout:.0f}s") from None
        for reader in self._readers:
            reader.join(10)
        if code != 0 or self.done is None:
            raise HarnessError(f"produce-load {self.name} exited {code}\n{self.report()}")

    def more(self, count: int, timeout: float = 120) -> None:
        """Wait until this producer has ``count`` more acknowledgements than now."""
        __tracebackhide__ = True
        wanted, deadline = self.acked + count, time.monotonic() + timeout
        while self.acked < wanted:
            if time.monotonic() > deadline or (self._proc and self._proc.poll() is not None):
                raise HarnessError(f"{self.acked} of {wanted} acked\n{self.report()}")
            time.sleep(0.1)

    def close(self) -> None:
        """Kill it if it still runs (teardown of a failed test)."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()

    def outage(self, moment: float, partitions: list[int]) -> float:
        return longest_gap(self.acked_at, moment, partitions)

    def report(self) -> str:
        code = None if self._proc is None else self._proc.poll()
        return (
            f"produce-load {self.name}: {self.acked} acked, errors {dict(self.errors)}, "
            f"exit {code}, done {self.done}\n--- stderr ---\n" + "\n".join(self._stderr)
        )

    def _read_stdout(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            try:
                event = json.loads(line)
                kind = event["event"]
            except (ValueError, KeyError, TypeError):
                self._stderr.append(f"(stdout) {line.rstrip()}")
                continue
            if kind == "ack":
                partition, offset = int(event["partition"]), int(event["offset"])
                self.history.ack(self.topic, partition, offset, event["value"].encode())
                self.acked_at[partition].append(time.monotonic())
                self.acked += 1
            elif kind == "send-failed":
                self.errors[event["error"].rpartition(".")[2]] += 1
            elif kind == "started":
                self._started.set()
            elif kind == "done":
                self.done = event

    def _read_stderr(self) -> None:
        assert self._proc is not None and self._proc.stderr is not None
        for line in self._proc.stderr:
            self._stderr.append(line.rstrip("\n"))
