"""The supervisor: starts, watches, restarts and stops the broker's child processes.

Modelled on gunicorn's arbiter. Signal handlers only enqueue the signal (and wake the loop through
``signal.set_wakeup_fd``); children are reaped with ``waitpid(WNOHANG)``, at every moment --
during another group's boot too -- and what happens next is decided by
``kafscale.supervisor.policy``: respawn (at once, or with back-off while a child cannot boot or
a backend is down), or stop the broker with the child's reason (a first boot that failed, or a
child that keeps failing to boot). A serving child that stops answering its liveness pings for
``KAFSCALE_CHILD_HANG_TIMEOUT_MS``, or a respawned one not ready within it, is killed (SIGKILL)
and respawned like one that died.

Start-up order is coordinator, flusher, shards, frontend: the listener opens last, once everything
behind it serves. Shutdown runs the other way round, so no client request arrives at a process
that is already gone. Invariants on exit: no child process left, no shared memory segment of this
run left in /dev/shm, the runtime directory removed.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable

import zmq
from prometheus_client import multiprocess

from kafscale import metrics
from kafscale.config import Config
from kafscale.ipc import endpoints, messages
from kafscale.ipc.shm import sweep_segments
from kafscale.supervisor import policy
from kafscale.supervisor.child import CONFIG_FILE
from kafscale.supervisor.policy import Child, Respawn

__all__ = ["Arbiter", "Child", "StartupError", "metrics_dir"]

log = logging.getLogger(__name__)

BOOT_ORDER = ("coordinator", "flusher", "shard", "frontend")
STOP_GRACE_SECONDS = {"frontend": 10.0, "shard": 30.0, "flusher": 60.0, "coordinator": 10.0}
# How long to wait for a child's BootFailed notice once its exit status says it sent one.
BOOT_NOTICE_WAIT_S = 0.5
# How long to wait before trying again to spawn a child that could not be spawned (EAGAIN, ENOMEM).
SPAWN_RETRY_S = 1.0


def metrics_dir(runtime_dir: str) -> str:
    return os.path.join(runtime_dir, "metrics")


class StartupError(Exception):
    """The broker cannot start; the message says why and is shown to the operator."""


class Arbiter:
    def __init__(self, config: Config, run_id: str, runtime_dir: str, lease_id: int = 0) -> None:
        self.config = config
        self.run_id = run_id
        self.lease_id = lease_id  # the broker lease (kafscale.supervisor.membership)
        self.runtime_dir = runtime_dir
        self.children = [
            Child("coordinator", 0),
            Child("flusher", 0),
            *(Child("shard", i) for i in range(config.shards)),
            Child("frontend", 0),
        ]
        self._signals: collections.deque[int] = collections.deque()
        self._zmq = zmq.Context()
        self._notices: zmq.Socket[bytes] = self._zmq.socket(zmq.PULL)
        self._wakeup_r, self._wakeup_w = os.pipe()
        self.stopping = False
        self.failure: str | None = None  # why the broker stopped itself, if it did
        self.stop_requested = False  # a SIGTERM/SIGINT came, handled or not
        self._boot_failure: str | None = None  # why start-up cannot complete
        self._booted = False
        self.hang_timeout_s = config.child_hang_timeout_ms / 1000

    # -- lifecycle ----------------------------------------------------------------------------

    def prepare(self) -> None:
        """Write the children's config, bind the notice socket, install signal handlers."""
        path = os.path.join(self.runtime_dir, CONFIG_FILE)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            document = {
                "config": self.config.to_json_dict(),
                "run_id": self.run_id,
                "lease_id": self.lease_id,
            }
            json.dump(document, file)
        self._notices.setsockopt(zmq.LINGER, 0)
        self._notices.bind(endpoints.supervisor_address(self.runtime_dir))
        os.set_blocking(self._wakeup_w, False)
        signal.set_wakeup_fd(self._wakeup_w, warn_on_full_buffer=False)
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
            signal.signal(signum, self._on_signal)

    @property
    def metrics_dir(self) -> str:
        return metrics_dir(self.runtime_dir)

    def boot(self) -> None:
        """Start every child in order, each group ready before the next. Raises StartupError."""
        deadline_s = self.config.boot_timeout_ms / 1000
        for role in BOOT_ORDER:
            group = [child for child in self.children if child.role == role]
            for child in group:
                self._spawn(child)
            deadline = time.monotonic() + deadline_s
            while not all(child.ready for child in group):
                if self._boot_failure:
                    raise StartupError(self._boot_failure)
                if self.stopping or (self._signals and self._handle_signals()):
                    raise StartupError("interrupted during start-up")
                if time.monotonic() > deadline:
                    late = ", ".join(child.name for child in group if not child.ready)
                    raise StartupError(
                        f"{late} did not become ready within {deadline_s:g} s "
                        f"(KAFSCALE_BOOT_TIMEOUT_MS)"
                    )
                self._wait(100)
                # A child of an earlier group may die meanwhile: it is respawned as always.
                self._reap()
                self._respawn_due()
        self._booted = True

    def run(self) -> None:
        """Supervise until SIGTERM/SIGINT or an unrecoverable child."""
        while not self.stopping:
            self._wait(500)
            self._handle_signals()
            self._reap()
            self._respawn_due()
            self._kill_hung()

    def supervise_while(self, step: Callable[[], bool], timeout_s: float) -> bool:
        """Keep supervising (reaping, respawning) and call ``step`` every ~200 ms until it
        returns True (done), ``timeout_s`` passes or a second SIGTERM/SIGINT asks to stop now.
        Returns whether ``step`` finished."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if step():
                return True
            self._wait(200)
            if self._second_signal():
                log.warning("stopping now: a second signal interrupted the hand-over")
                return False
            self._reap()
            self._respawn_due()
        return False

    def shutdown(self) -> None:
        """Stop children in reverse boot order, then remove what this run left behind."""
        self.stopping = True
        for role in reversed(BOOT_ORDER):
            group = [child for child in self.children if child.role == role and child.alive]
            if group:
                log.info("stopping children", extra={"role": role, "count": len(group)})
            self._stop_group(group, STOP_GRACE_SECONDS[role])
        with contextlib.suppress(FileNotFoundError):  # a next run on a new lease writes its own
            os.unlink(os.path.join(self.runtime_dir, CONFIG_FILE))
        leaked = sweep_segments(self.run_id)
        if leaked:
            log.warning("removed shared memory left by children", extra={"segments": leaked})
        signal.set_wakeup_fd(-1)
        self._notices.close(linger=0)
        self._zmq.term()
        os.close(self._wakeup_r)
        os.close(self._wakeup_w)

    # -- children -----------------------------------------------------------------------------

    def _spawn(self, child: Child) -> None:
        argv = [
            sys.executable,
            "-m",
            "kafscale.supervisor.child",
            child.role,
            str(child.index),
            self.runtime_dir,
            str(os.getpid()),
        ]
        env = dict(os.environ, PROMETHEUS_MULTIPROC_DIR=self.metrics_dir)
        child.pid = os.posix_spawn(sys.executable, argv, env)
        child.started_at = time.monotonic()
        child.ready = False
        child.boot_error = None
        child.respawn_at = None
        child.silence = None
        child.overdue = False
        log.info("spawned", extra={"child": child.name, "child_pid": child.pid})

    def _find(self, pid: int) -> Child | None:
        return next((child for child in self.children if child.pid == pid), None)

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            child = self._find(pid)
            if child is None:
                continue
            self._on_exit(child, status)

    def _on_exit(self, child: Child, status: int) -> None:
        multiprocess.mark_process_dead(child.pid, self.metrics_dir)  # type: ignore[no-untyped-call]
        code = os.waitstatus_to_exitcode(status)
        if code in (policy.EXIT_BOOT_FAILED, policy.EXIT_DEPENDENCY_DOWN):
            self._await_boot_notice(child)
        if self.stopping and code != 0:
            log.warning(
                "child stopped with an error",
                extra={"child": child.name, "exit": policy.describe_exit(code)},
            )
        decision = policy.on_exit(child, code) if not self.stopping else None
        child.pid, child.ready, child.silence = 0, False, None
        if decision is None:
            return
        if not isinstance(decision, Respawn):
            if not self._booted:  # boot() raises it: the broker cannot start
                self._boot_failure = decision.reason
                return
            log.critical(
                "child cannot boot; stopping the broker",
                extra={"child": child.name, "reason": decision.reason},
            )
            self.failure = decision.reason
            self.stopping = True
            return
        child.respawn_at = time.monotonic() + decision.delay_s
        metrics.CHILD_RESTARTS.labels(child.role).inc()
        log.warning(
            "child died; respawning",
            extra={
                "child": child.name,
                "exit": policy.describe_exit(code),
                "reason": decision.reason,
                "respawn_in_s": decision.delay_s,
            },
        )

    def _await_boot_notice(self, child: Child) -> None:
        """The child said why it failed just before exiting; make sure we read it."""
        deadline = time.monotonic() + BOOT_NOTICE_WAIT_S
        while child.boot_error is None and time.monotonic() < deadline:
            if self._notices.poll(20, zmq.POLLIN):
                self._on_notice(self._notices.recv())

    def _kill_hung(self) -> None:
        now = time.monotonic()
        for child in self.children:
            if policy.boot_overdue(child, now, self.hang_timeout_s):
                child.overdue = True
                self._kill(
                    child,
                    "child did not become ready in time; killing it",
                    booting_for_s=round(now - child.started_at, 1),
                )
                continue
            silence = policy.hung(child, now, self.hang_timeout_s)
            if silence is not None:
                child.silence = None
                self._kill(
                    child,
                    "child does not answer its liveness pings; killing it",
                    silent_for_s=round(now - silence.since, 1),
                    missed_pings=silence.missed,
                )

    def _kill(self, child: Child, message: str, **details: object) -> None:
        """SIGKILL a hung child (a stopped or wedged process ignores SIGTERM); its exit is reaped
        and respawned as any other."""
        log.error(message, extra={"child": child.name, "child_pid": child.pid, **details})
        metrics.CHILD_HANGS.labels(child.role).inc()
        _signal(child.pid, signal.SIGKILL)

    def _respawn_due(self) -> None:
        now = time.monotonic()
        for child in self.children:
            if not child.alive and child.respawn_at is not None and child.respawn_at <= now:
                try:
                    self._spawn(child)
                except OSError as exc:
                    # Out of processes or memory for a moment: no reason to stop the broker.
                    log.error(
                        "cannot spawn a child; trying again",
                        extra={"child": child.name, "error": str(exc)},
                    )
                    child.respawn_at = now + SPAWN_RETRY_S

    def _stop_group(self, group: list[Child], grace: float) -> None:
        for child in group:
            _signal(child.pid, signal.SIGTERM)
            _signal(child.pid, signal.SIGCONT)  # a stopped child would sit out its grace
        deadline = time.monotonic() + grace
        while any(child.alive for child in group):
            if time.monotonic() > deadline or self._second_signal():
                for child in group:
                    if child.alive:
                        log.warning(
                            "child did not stop in time; killing it", extra={"child": child.name}
                        )
                        _signal(child.pid, signal.SIGKILL)
                deadline = float("inf")
            self._wait(100)
            self._reap()

    # -- events -------------------------------------------------------------------------------

    def _on_signal(self, signum: int, _frame: object) -> None:
        self._signals.append(signum)
        if signum in (signal.SIGTERM, signal.SIGINT):
            self.stop_requested = True

    def _handle_signals(self) -> bool:
        """Act on queued signals; True if one asked us to stop."""
        while self._signals:
            signum = self._signals.popleft()
            if signum in (signal.SIGTERM, signal.SIGINT):
                log.info("stopping", extra={"signal": signal.Signals(signum).name})
                self.stopping = True
        return self.stopping

    def _second_signal(self) -> bool:
        """A SIGTERM/SIGINT during shutdown means: stop waiting, kill what is left."""
        return any(s in (signal.SIGTERM, signal.SIGINT) for s in self._drain_signals())

    def _drain_signals(self) -> list[int]:
        drained = list(self._signals)
        self._signals.clear()
        return drained

    def _wait(self, timeout_ms: int) -> None:
        """Sleep until a notice, a signal or the timeout; then handle notices."""
        poller = zmq.Poller()
        poller.register(self._notices, zmq.POLLIN)
        poller.register(self._wakeup_r, zmq.POLLIN)
        events = dict(poller.poll(timeout_ms))
        if self._wakeup_r in events:
            with contextlib.suppress(BlockingIOError):
                os.read(self._wakeup_r, 4096)
        while self._notices.poll(0, zmq.POLLIN):
            self._on_notice(self._notices.recv())

    def _on_notice(self, data: bytes) -> None:
        try:
            notice = messages.decode(data)
        except Exception:
            log.error("undecodable notice from a child")
            return
        if isinstance(notice, messages.Ready | messages.BootFailed):
            child = self._find(notice.pid)
            if child is None:
                return
            if isinstance(notice, messages.Ready):
                policy.on_ready(child)
            else:
                child.boot_error = notice.reason


def _signal(pid: int, signum: int) -> None:
    if pid > 0:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)
