"""The entry point of every child process: ``python -m kafscale.supervisor.child ROLE INDEX DIR``.

Sets up what all roles share (config from the runtime directory, JSON logs, signals, the
parent-death signal, the notice socket to the supervisor), then runs the role's ``run``. A role
calls ``ChildContext.ready()`` once it serves; any exception before that is a boot failure,
reported to the supervisor with its reason and exit status ``EXIT_BOOT_FAILED`` so that the
supervisor stops the broker instead of respawning forever (gunicorn's WORKER_BOOT_ERROR).
"""

from __future__ import annotations

import ctypes
import importlib
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import zmq

from kafscale import logs
from kafscale.config import Config
from kafscale.ipc import endpoints, messages

EXIT_BOOT_FAILED = 3
CONFIG_FILE = "config.json"

ROLES: dict[str, str] = {
    "coordinator": "kafscale.coordinator.process",
    "flusher": "kafscale.flusher.process",
    "shard": "kafscale.shards.process",
    "frontend": "kafscale.frontend.process",
}

log = logging.getLogger(__name__)


@dataclass
class ChildContext:
    config: Config
    role: str
    index: int
    runtime_dir: str
    run_id: str
    zmq_context: zmq.Context[zmq.Socket[bytes]]
    stopping: threading.Event = field(default_factory=threading.Event)
    started_at: float = field(default_factory=time.time)
    is_ready: bool = False
    _notices: zmq.Socket[bytes] | None = None

    @property
    def name(self) -> str:
        return f"{self.role}-{self.index}"

    def address(self) -> str:
        return endpoints.address(self.runtime_dir, self.role, self.index)

    def pong(self) -> messages.Pong:
        return messages.Pong(
            role=self.role, index=self.index, pid=os.getpid(), started_at=self.started_at
        )

    def ready(self) -> None:
        """Tell the supervisor this process serves; failures after this are crashes."""
        self.is_ready = True
        self._notify(messages.Ready(role=self.role, index=self.index, pid=os.getpid()))
        log.info("ready", extra={"role": self.role, "index": self.index})

    def boot_failed(self, reason: str) -> None:
        self._notify(
            messages.BootFailed(role=self.role, index=self.index, pid=os.getpid(), reason=reason)
        )

    def _notify(self, message: messages.Message) -> None:
        if self._notices is None:
            self._notices = self.zmq_context.socket(zmq.PUSH)
            self._notices.setsockopt(zmq.LINGER, 2000)
            self._notices.connect(endpoints.supervisor_address(self.runtime_dir))
        self._notices.send(messages.encode(message))

    def close(self) -> None:
        if self._notices is not None:
            self._notices.close(linger=2000)


def load_config(runtime_dir: str) -> tuple[Config, str]:
    with open(os.path.join(runtime_dir, CONFIG_FILE), encoding="utf-8") as file:
        document: dict[str, Any] = json.load(file)
    return Config.from_json_dict(document["config"]), str(document["run_id"])


def _die_with_parent(parent_pid: int) -> None:
    """Get SIGTERM when the supervisor dies, even by SIGKILL: no orphaned children (Linux)."""
    pr_set_pdeathsig = 1
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(pr_set_pdeathsig, signal.SIGTERM)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)


def main(argv: list[str]) -> int:
    role, index, runtime_dir, parent_pid = argv[0], int(argv[1]), argv[2], int(argv[3])
    config, run_id = load_config(runtime_dir)
    logs.setup(f"{role}-{index}", config.log_level, config.secret_values())
    context = ChildContext(
        config=config,
        role=role,
        index=index,
        runtime_dir=runtime_dir,
        run_id=run_id,
        zmq_context=zmq.Context(),
    )

    def request_stop(signum: int, _frame: object) -> None:
        context.stopping.set()

    signal.signal(signal.SIGTERM, request_stop)
    # Ctrl-C reaches the whole process group; the supervisor turns it into an ordered shutdown.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent(parent_pid)

    run: Callable[[ChildContext], None] = importlib.import_module(ROLES[role]).run
    try:
        run(context)
    except Exception as exc:
        if not context.is_ready:
            reason = f"{type(exc).__name__}: {exc}"
            log.error("boot failed", extra={"reason": reason}, exc_info=exc)
            context.boot_failed(reason)
            context.close()
            return EXIT_BOOT_FAILED
        log.critical("crashed", exc_info=exc)
        context.close()
        return 1
    context.close()
    log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
