"""Processes, ports and polling for the test harness (Linux: reads /proc, no psutil).

Owns three small things every server fixture needs:
- free loopback ports that do not collide between pytest-xdist workers or with the kernel's
  outgoing (ephemeral) ports: they are drawn from below the ephemeral range and checked by binding;
- process-tree snapshots that survive pid reuse: a process is identified by (pid, start time);
- `wait_until`, the one polling loop (a deadline, never a bare sleep-and-hope).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

LOOPBACK = "127.0.0.1"


class HarnessError(AssertionError):
    """A server or process under test did not behave; the message carries its log tail."""


# --- ports -------------------------------------------------------------------------------------

_handed_out: set[int] = set()


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(port: int) -> bool:
    # No SO_REUSEADDR: a port still in TIME_WAIT counts as taken, which is the safe answer.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A loopback TCP port nobody listens on, not handed out before by this process.

    Ports come from [15000, ephemeral low) at random: outgoing connections never take them, and
    two xdist workers (or two pytest sessions) rarely draw the same one; the fixtures retry a
    start that still lost the race.
    """
    low, high = 15000, _ephemeral_low() - 1
    rng = random.Random()
    for _ in range(1000):
        port = rng.randint(low, high)
        if port not in _handed_out and _bindable(port):
            _handed_out.add(port)
            return port
    raise HarnessError(f"no free loopback port in [{low}, {high}]")


def address_in_use(log_text: str) -> bool:
    """Whether a server's log says it lost a port race (Go, Python and etcd spellings)."""
    return "address already in use" in log_text.lower()


# --- polling -----------------------------------------------------------------------------------


def wait_until(
    check: Callable[[], T | None],
    *,
    timeout: float,
    what: str,
    interval: float = 0.05,
    abort: Callable[[], str | None] | None = None,
) -> T:
    """Call `check` until it returns a value that is not None, or fail after `timeout` seconds.

    `abort` is asked first on every round; a message from it ends the wait at once (for example
    "the process exited"), so a dead server is reported immediately, not at the deadline.
    """
    __tracebackhide__ = True
    deadline = time.monotonic() + timeout
    while True:
        if abort is not None and (reason := abort()) is not None:
            raise HarnessError(f"{what}: {reason}")
        result = check()
        if result is not None:
            return result
        if time.monotonic() >= deadline:
            raise HarnessError(f"{what}: not done after {timeout:.0f}s")
        time.sleep(interval)


def log_tail(path: Path, lines: int = 60) -> str:
    """The last lines of a log file, framed for an error message."""
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"(no log at {path}: {exc})"
    tail = "\n".join(text.splitlines()[-lines:])
    return f"--- last {lines} lines of {path} ---\n{tail}\n--- end of log ---"


# --- processes ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Proc:
    """One process as /proc/PID/stat shows it; (pid, start_time) identifies it across pid reuse."""

    pid: int
    ppid: int
    pgid: int
    state: str
    start_time: int
    comm: str

    @property
    def alive(self) -> bool:
        current = read_proc(self.pid)
        return current is not None and current.start_time == self.start_time and current.running

    @property
    def running(self) -> bool:
        return self.state not in ("Z", "X", "x")

    def __str__(self) -> str:
        return f"{self.pid} ({self.comm})"


def read_proc(pid: int) -> Proc | None:
    try:
        data = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    # comm is in parentheses and may itself hold spaces or ')': split at the last one.
    open_paren, close_paren = data.index("("), data.rindex(")")
    fields = data[close_paren + 2 :].split()
    return Proc(
        pid=pid,
        comm=data[open_paren + 1 : close_paren],
        state=fields[0],
        ppid=int(fields[1]),
        pgid=int(fields[2]),
        start_time=int(fields[19]),
    )


def all_procs() -> list[Proc]:
    procs = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (proc := read_proc(int(entry))) is not None:
            procs.append(proc)
    return procs


def children(pid: int) -> list[Proc]:
    """Live direct children of `pid`."""
    return sorted((p for p in all_procs() if p.ppid == pid and p.running), key=lambda p: p.pid)


def process_tree(root: Proc) -> list[Proc]:
    """Live descendants of `root` and members of its process group (not `root` itself).

    The process group catches descendants whose parent already exited (re-parented to init);
    the parent links catch those that left the group. Pids wrap quickly here (pid_max 32768
    and many short processes), so `root` is a snapshot: if its pid now belongs to another
    process, that process's tree is not ours and nothing is returned. While any member of the
    group lives, the kernel does not hand its number out as a new pid, so members found with the
    leader gone are still ours.
    """
    procs = all_procs()
    leader = next((p for p in procs if p.pid == root.pid), None)
    if leader is not None and leader.start_time != root.start_time:
        return []
    found: dict[int, Proc] = {p.pid: p for p in procs if p.pgid == root.pid and p.pid != root.pid}
    if leader is not None:
        by_parent: dict[int, list[Proc]] = {}
        for proc in procs:
            by_parent.setdefault(proc.ppid, []).append(proc)
        stack = [root.pid]
        while stack:
            for child in by_parent.get(stack.pop(), []):
                if child.pid not in found:
                    found[child.pid] = child
                stack.append(child.pid)
    return sorted((p for p in found.values() if p.running), key=lambda p: p.pid)


def still_alive(procs: Iterable[Proc]) -> list[Proc]:
    return [p for p in procs if p.alive]


def kill_all(procs: Iterable[Proc], wait: float = 5.0) -> None:
    """SIGKILL each process that is still the one we saw (same start time), and wait (up to
    ``wait`` seconds) until they are gone: the signal is delivered asynchronously, and a busy
    machine may take a moment to end a process."""
    killed = []
    for proc in procs:
        if proc.alive:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(proc.pid, signal.SIGKILL)
                killed.append(proc)
    deadline = time.monotonic() + wait
    while any(proc.alive for proc in killed) and time.monotonic() < deadline:
        time.sleep(0.01)
