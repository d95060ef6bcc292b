"""CPU time and memory of whole process trees, read from /proc while a benchmark runs.

A KafScale broker is several processes (supervisor, frontend, shards, flusher, coordinator, and
multiprocessing's resource tracker); Kafka is one JVM. Both are measured the same way: every
process descended from the root pid, found afresh at each sample so a respawned child counts.

- CPU: utime + stime of every live process of the tree, plus the cutime + cstime its members
  have reaped; the figure is the difference between two samples (`Usage.cpu_seconds`). A child
  that exits between samples takes its CPU time with it unless its parent has reaped it, which
  a broker under benchmark does not do (no process of it exits then).
- Memory: the sum of each process's PSS (proportional set size, /proc/PID/smaps_rollup), so the
  shared-memory partition buffers the shards and the flusher both map are counted once, not
  once per process as an RSS sum would. The peak is that sum's maximum over the samples.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PROC = Path("/proc")


@dataclass(frozen=True)
class Usage:
    """What a tree used between `ProcessTreeSampler.start()` and `stop()`."""

    cpu_seconds: float
    peak_pss_bytes: int
    samples: int


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat split after the command name (which may hold spaces and parentheses)."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def tree_pids(root: int) -> list[int]:
    """The root and every live descendant (by parent pid, from one pass over /proc)."""
    parents: dict[int, list[int]] = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields is not None:
            parents.setdefault(int(fields[1]), []).append(int(entry.name))
    found, frontier = [root], [root]
    while frontier:
        frontier = [child for pid in frontier for child in parents.get(pid, [])]
        found += frontier
    return found


def cpu_ticks(pids: list[int]) -> int:
    """utime + stime + cutime + cstime summed over the processes still alive."""
    total = 0
    for pid in pids:
        fields = _stat_fields(pid)
        if fields is not None:
            # After "pid (comm) ": state ppid ... utime is field 14 of stat, index 11 here.
            total += sum(int(value) for value in fields[11:15])
    return total


def pss_bytes(pid: int) -> int:
    """A process's proportional set size; 0 if it is gone."""
    try:
        with open(PROC / str(pid) / "smaps_rollup") as rollup:
            for line in rollup:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class ProcessTreeSampler:
    """Samples the trees under `roots` every `interval` seconds on a background thread."""

    def __init__(self, roots: list[int], interval: float = 0.25) -> None:
        self.roots = roots
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._peak = 0
        self._samples = 0
        self._start_ticks = 0

    def _pids(self) -> list[int]:
        return [pid for root in self.roots for pid in tree_pids(root)]

    def _sample(self) -> None:
        total = sum(pss_bytes(pid) for pid in self._pids())
        self._peak = max(self._peak, total)
        self._samples += 1

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def start(self) -> None:
        self._start_ticks = cpu_ticks(self._pids())
        self._sample()
        self._thread = threading.Thread(target=self._run, name="procstats", daemon=True)
        self._thread.start()

    def stop(self) -> Usage:
        end_ticks = cpu_ticks(self._pids())
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample()
        return Usage(
            cpu_seconds=(end_ticks - self._start_ticks) / CLOCK_TICKS,
            peak_pss_bytes=self._peak,
            samples=self._samples,
        )


def measure(roots: list[int]) -> ProcessTreeSampler:
    """A started sampler: `usage = sampler.stop()` when the measured work is done."""
    sampler = ProcessTreeSampler(roots)
    sampler.start()
    return sampler
