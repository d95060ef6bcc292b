"""The data directory's flock: exclusive, described, released by the OS, inherited by children."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from kafscale.supervisor.datadir_lock import LOCK_FILE, DataDirLock

TIMEOUT_S = 15.0

# A holder in its own process: takes the lock, optionally spawns a child the way the arbiter
# does (os.posix_spawn, which keeps inheritable fds), prints the child's pid, then waits.
HOLDER = textwrap.dedent(
    """
    import os, sys, time
    from kafscale.supervisor.datadir_lock import DataDirLock
    lock = DataDirLock(sys.argv[1])
    assert lock.acquire(b'{"pid": %d}' % os.getpid()) is None
    child = 0
    if sys.argv[2] == "spawn":
        argv = [sys.executable, "-c", "import time; time.sleep(600)"]
        child = os.posix_spawn(sys.executable, argv, dict(os.environ))
    print(child, flush=True)
    time.sleep(600)
    """
)


def start_holder(data_dir: Path, spawn: bool) -> tuple[subprocess.Popen[str], int]:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(data_dir), "spawn" if spawn else "alone"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None
    line = holder.stdout.readline()  # printed once the lock is held
    assert line.strip().isdigit(), f"holder failed: {line!r}"
    return holder, int(line)


def wait_free(data_dir: Path) -> DataDirLock:
    lock = DataDirLock(str(data_dir))
    deadline = time.monotonic() + TIMEOUT_S
    while lock.acquire(b"{}") is not None:
        assert time.monotonic() < deadline, "the lock was never released"
        time.sleep(0.05)
    return lock


def test_second_holder_is_refused_with_the_first_ones_description(tmp_path: Path) -> None:
    first = DataDirLock(str(tmp_path / "data"))  # the directory is created
    assert first.acquire(b'{"broker_id": 0, "pid": 1}') is None
    assert first.held
    assert (tmp_path / "data" / LOCK_FILE).read_bytes() == b'{"broker_id": 0, "pid": 1}\n'
    second = DataDirLock(str(tmp_path / "data"))
    assert second.acquire(b'{"pid": 2}') == b'{"broker_id": 0, "pid": 1}'
    assert not second.held
    first.release()
    assert (tmp_path / "data" / LOCK_FILE).read_bytes() == b""  # no stale description
    assert second.acquire(b'{"pid": 2}') is None
    second.release()
    second.release()  # idempotent


def test_the_os_releases_the_lock_of_a_sigkilled_holder(tmp_path: Path) -> None:
    holder, _ = start_holder(tmp_path, spawn=False)
    try:
        description = DataDirLock(str(tmp_path)).acquire(b"{}")
        assert description == b'{"pid": %d}' % holder.pid
    finally:
        holder.kill()
        holder.wait()
    wait_free(tmp_path).release()


def test_children_hold_the_lock_until_the_last_one_exits(tmp_path: Path) -> None:
    holder, child = start_holder(tmp_path, spawn=True)
    try:
        holder.kill()  # the supervisor dies; its child lives on (draining, say)
        holder.wait()
        assert DataDirLock(str(tmp_path)).acquire(b"{}") == b'{"pid": %d}' % holder.pid
    finally:
        os.kill(child, signal.SIGKILL)
    wait_free(tmp_path).release()
