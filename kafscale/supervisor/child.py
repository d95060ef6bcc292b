"""The entry point of every child process: ``python -m kafscale.supervisor.child ROLE INDEX DIR``.

Sets up what all roles share (config from the runtime directory, JSON logs, signals, the
parent-death signal, the notice socket to the supervisor), then runs the role's ``run``. A role
calls ``ChildContext.ready()`` once it serves; any exception before that is a boot failure,
reported to the supervisor with its reason and an exit status saying which kind:
``EXIT_DEPENDENCY_DOWN`` when S3 or the metadata store could not be reached (an outage: the
supervisor keeps respawning with back-off if the child served before), ``EXIT_BOOT_FAILED``
otherwise (gunicorn's WORKER_BOOT_ERROR: the supervisor stops the broker instead of respawning
forever). See ``kafscale.supervisor.policy``.

Test-only: with ``KAFSCALE_TEST_HOLD_READY_DIR`` set, ``ready()`` waits while the file
``{dir}/{role}-{index}.hold`` exists, so a test can hold one child in its boot and do something
meanwhile (kill another). Never set it in production; it is not a setting of ``kafscale.config``
(the broker logs it as an unknown variable).
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
from kafscale.metadata.store import MetadataStoreUnavailable
from kafscale.runtime import without_hypothesis
from kafscale.storage.objects import ObjectStoreUnavailable
from kafscale.supervisor.policy import EXIT_BOOT_FAILED, EXIT_DEPENDENCY_DOWN

CONFIG_FILE = "config.json"
TEST_HOLD_READY_DIR = "KAFSCALE_TEST_HOLD_READY_DIR"

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
    # The broker lease the supervisor holds; keys that must go with this broker go on it.
    lease_id: int = 0
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
        self._hold_for_test()
        self.is_ready = True
        self._notify(messages.Ready(role=self.role, index=self.index, pid=os.getpid()))
        log.info("ready", extra={"role": self.role, "index": self.index})

    def _hold_for_test(self) -> None:
        directory = os.environ.get(TEST_HOLD_READY_DIR)
        if not directory:
            return
        hold = os.path.join(directory, f"{self.name}.hold")
        if os.path.exists(hold):
            log.warning("holding ready (test knob)", extra={"hold": hold})
            while os.path.exists(hold) and not self.stopping.is_set():
                time.sleep(0.05)

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


def load_config(runtime_dir: str) -> tuple[Config, str, int]:
    """The broker's config, run id and broker lease id, as the supervisor wrote them."""
    with open(os.path.join(runtime_dir, CONFIG_FILE), encoding="utf-8") as file:
        document: dict[str, Any] = json.load(file)
    config = Config.from_json_dict(document["config"])
    return config, str(document["run_id"]), int(document.get("lease_id", 0))


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


def unreachable_backend(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception it was raised from) says S3 or the metadata store could
    not be reached."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, MetadataStoreUnavailable | ObjectStoreUnavailable):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def main(argv: list[str]) -> int:
    role, index, runtime_dir, parent_pid = argv[0], int(argv[1]), argv[2], int(argv[3])
    config, run_id, lease_id = load_config(runtime_dir)
    logs.setup(f"{role}-{index}", config.log_level, config.secret_values())
    context = ChildContext(
        config=config,
        role=role,
        index=index,
        runtime_dir=runtime_dir,
        run_id=run_id,
        zmq_context=zmq.Context(),
        lease_id=lease_id,
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
            if unreachable_backend(exc):
                # An outage, retried for as long as it lasts: one line each time, no traceback.
                log.warning("cannot boot: a backend is unreachable", extra={"reason": reason})
                code = EXIT_DEPENDENCY_DOWN
            else:
                log.error("boot failed", extra={"reason": reason}, exc_info=exc)
                code = EXIT_BOOT_FAILED
            context.boot_failed(reason)
            context.close()
            return code
        log.critical("crashed", exc_info=exc)
        context.close()
        return 1
    context.close()
    log.info("stopped")
    return 0


if __name__ == "__main__":
    without_hypothesis()  # before the role's modules import kio
    sys.exit(main(sys.argv[1:]))
