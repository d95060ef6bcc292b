"""A real server process for the test session: spawn, wait until healthy, stop, start again.

A `ManagedServer` keeps its data directory and ports across `stop()`/`start()` (a restart is the
same server), appends every run's output to one log file and shows that log's tail whenever it
fails to start. Subclasses say how to run the server (`argv`, `env`) and how to tell it is up
(`probe`). A first start that loses a port race is retried on fresh ports (`pick_ports`).
A test can also pause a server (SIGSTOP: it keeps its sockets and answers nothing) and resume it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from tests.harness.procs import HarnessError, address_in_use, log_tail, wait_until

START_TIMEOUT = 60.0
STOP_TIMEOUT = 20.0
PORT_ATTEMPTS = 4


def http_status(url: str, timeout: float = 2.0) -> int | None:
    """The HTTP status of a GET, or None when nothing answers (yet)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except (OSError, ValueError):
        return None


def _all_threads_stopped(pid: int) -> bool:
    """Whether every thread of ``pid`` is in state T (stopped), per /proc."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
        states = []
        for task in tasks:
            with open(f"/proc/{pid}/task/{task}/stat", encoding="ascii") as stat:
                states.append(stat.read().rsplit(")", 1)[1].split()[0])
    except (FileNotFoundError, ProcessLookupError):
        return False
    return bool(states) and all(state == "T" for state in states)


class ManagedServer:
    name = "server"

    def __init__(self, base_dir: Path) -> None:
        self.base_dir = base_dir
        self.data_dir = base_dir / "data"
        self.log_path = base_dir / f"{self.name}.log"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._proc: subprocess.Popen[bytes] | None = None
        self.pick_ports()

    # --- what a subclass provides ------------------------------------------------------------

    def pick_ports(self) -> None:
        """Choose the ports this server listens on (called again after a lost port race)."""
        raise NotImplementedError

    def argv(self) -> list[str]:
        raise NotImplementedError

    def env(self) -> dict[str, str]:
        return dict(os.environ)

    def probe(self) -> bool:
        """True once the server answers as healthy."""
        raise NotImplementedError

    # --- lifecycle ---------------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, timeout: float = START_TIMEOUT) -> None:
        """Start (or restart) with the same data directory and ports; return once healthy."""
        __tracebackhide__ = True
        if self.running:
            raise HarnessError(f"{self.name} is already running (pid {self.pid})")
        self._spawn()
        self._wait_healthy(timeout)

    def start_first(self, timeout: float = START_TIMEOUT) -> None:
        """The first start: like `start`, but a lost port race is retried on fresh ports."""
        __tracebackhide__ = True
        for attempt in range(1, PORT_ATTEMPTS + 1):
            log_size = self.log_path.stat().st_size if self.log_path.exists() else 0
            self._spawn()
            try:
                self._wait_healthy(timeout)
                return
            except HarnessError:
                lost_race = not self.running and address_in_use(self._log_since(log_size))
                if not lost_race or attempt == PORT_ATTEMPTS:
                    raise
            self.pick_ports()

    def stop(self, timeout: float = STOP_TIMEOUT) -> int:
        """SIGTERM and wait; SIGKILL if it does not exit in time. Returns the exit code."""
        return self._signal(signal.SIGTERM, timeout)

    def kill(self) -> int:
        """SIGKILL, as in a crash, and wait. Returns the exit code."""
        return self._signal(signal.SIGKILL, STOP_TIMEOUT)

    def pause(self) -> None:
        """SIGSTOP: the server keeps its sockets (the kernel still accepts connections into the
        listen backlog) but answers nothing -- a hung server, not a dead one."""
        if not self.running:
            raise HarnessError(f"{self.name} is not running")
        os.kill(self._pid(), signal.SIGSTOP)
        # The signal stops every thread, but not at once: until then a request may be served.
        wait_until(
            lambda: True if _all_threads_stopped(self._pid()) else None,
            timeout=STOP_TIMEOUT,
            what=f"{self.name} to stop on SIGSTOP",
            interval=0.01,
        )

    def resume(self) -> None:
        """SIGCONT after `pause`."""
        if self._proc is not None and self._proc.poll() is None:
            os.kill(self._pid(), signal.SIGCONT)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Paused for the block; resumed however the block ends (session fixtures are shared)."""
        self.pause()
        try:
            yield
        finally:
            self.resume()

    def _pid(self) -> int:
        assert self._proc is not None
        return self._proc.pid

    def ensure_running(self) -> None:
        """Start again if a test left the server stopped (session fixtures are shared)."""
        __tracebackhide__ = True
        if not self.running:
            self.start()

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    # --- internals ---------------------------------------------------------------------------

    def _spawn(self) -> None:
        with self.log_path.open("ab") as log:
            log.write(f"\n=== harness: starting {' '.join(self.argv())}\n".encode())
            log.flush()
            self._proc = subprocess.Popen(
                self.argv(),
                cwd=self.base_dir,
                env=self.env(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C meant for pytest does not hit it first
            )

    def _wait_healthy(self, timeout: float) -> None:
        __tracebackhide__ = True

        def exited() -> str | None:
            if self._proc is not None and (code := self._proc.poll()) is not None:
                return f"exited with code {code} before it was healthy\n{log_tail(self.log_path)}"
            return None

        try:
            wait_until(
                lambda: True if self.probe() else None,
                timeout=timeout,
                what=f"{self.name} ({' '.join(self.argv()[:1])})",
                interval=0.1,
                abort=exited,
            )
        except HarnessError as exc:
            if self.running:
                self._signal(signal.SIGKILL, STOP_TIMEOUT)
                raise HarnessError(f"{exc}\n{log_tail(self.log_path)}") from None
            raise

    def _signal(self, signum: int, timeout: float) -> int:
        proc = self._proc
        if proc is None:
            raise HarnessError(f"{self.name} was never started")
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signum)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout)
        return proc.returncode

    def _log_since(self, offset: int) -> str:
        with self.log_path.open("rb") as log:
            log.seek(offset)
            return log.read().decode(errors="replace")

    def close(self) -> None:
        """Session end: stop if running, escalating to SIGKILL."""
        self.resume()  # a paused server would sit out the whole SIGTERM timeout
        if self.running:
            self.stop()
