"""The broker under test as real processes: `python -m kafscale serve` and its children.

The contract the harness holds `kafscale serve` to:
- /readyz on the metrics port answers 200 once the broker serves Kafka requests;
- SIGTERM makes the supervisor stop all its children and exit 0;
- no process of the broker outlives the supervisor, unless the test SIGKILLed it (`kill()`).
The `start_broker` fixture checks the last two at teardown and fails the test when they do not
hold.

Each broker runs in its own session (process group = supervisor pid), so the harness can find
and SIGKILL every process it left, even children re-parented to init.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from kafscale.config import SETTINGS
from tests.harness.etcd import EtcdServer
from tests.harness.minio import MinioServer
from tests.harness.procs import (
    LOOPBACK,
    HarnessError,
    Proc,
    address_in_use,
    children,
    free_port,
    kill_all,
    log_tail,
    process_tree,
    read_proc,
    still_alive,
    wait_until,
)
from tests.harness.servers import PORT_ATTEMPTS, http_status

Backends = Literal["embedded", "real"]

BROKER_ARGV = (sys.executable, "-m", "kafscale", "serve")
PORT_VARIABLES = ("KAFSCALE_BROKER_PORT", "KAFSCALE_METRICS_PORT")
READY_TIMEOUT = 75.0  # longer than the boot timeout below, so the broker says why it failed
STOP_TIMEOUT = 30.0
# A broker that does not stop is asked for its stacks (SIGQUIT) before it is killed.
DUMP_WAIT_S = 1.0
DUMP_TAIL_LINES = 300
# How long children may take to vanish after the supervisor exited (e.g. multiprocessing's
# resource tracker, which exits when its last user closes the pipe).
LEFTOVER_GRACE = 5.0
# Not written to the broker's log by the harness either, so a test can check the whole log.
CREDENTIAL_VARIABLES = frozenset(s.env for s in SETTINGS if s.secret)


class BrokerProcess:
    """One `kafscale serve`; the supervisor is our child and its pid is the process group id.

    `env` holds the KAFSCALE_* variables it was started with (pass it to `start_broker` to
    start another broker on the same ports, data directory and backends).
    """

    def __init__(
        self,
        *,
        env: dict[str, str],
        base_dir: Path,
        process_env: dict[str, str],
        argv: tuple[str, ...] = BROKER_ARGV,
        pick_ports: bool = False,
    ) -> None:
        self.env = env
        self.base_dir = base_dir
        self.log_path = base_dir / "broker.log"
        self.problems: list[str] = []
        self._argv = argv
        self._process_env = process_env
        # Whether the harness chose the ports, and so may move to others after a lost race.
        self._pick_ports = pick_ports
        self._killed = False
        self._seen: dict[int, Proc] = {}
        self._launch_offset = 0
        self._proc = self._launch()
        self._root = self._snapshot()

    def _launch(self) -> subprocess.Popen[bytes]:
        with self.log_path.open("ab") as log:
            self._launch_offset = log.tell()
            shown = {k: "***" if k in CREDENTIAL_VARIABLES else v for k, v in self.env.items()}
            log.write(f"=== harness: starting {' '.join(self._argv)} with {shown}\n".encode())
            log.flush()
            return subprocess.Popen(
                list(self._argv),
                cwd=self.base_dir,
                env={**self._process_env, **self.env},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def _snapshot(self) -> Proc:
        # Taken while the supervisor is our unreaped child, so the pid is surely its own.
        root = read_proc(self._proc.pid)
        if root is None:
            raise HarnessError(f"cannot read /proc/{self._proc.pid}/stat of the broker")
        return root

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def port(self) -> int:
        return int(self.env["KAFSCALE_BROKER_PORT"])

    @property
    def metrics_port(self) -> int:
        return int(self.env["KAFSCALE_METRICS_PORT"])

    @property
    def bootstrap(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    @property
    def returncode(self) -> int | None:
        return self._proc.poll()

    @property
    def running(self) -> bool:
        return self._proc.poll() is None

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, lines: int = 60) -> str:
        return log_tail(self.log_path, lines)

    def metrics_text(self, timeout: float = 10.0) -> str:
        """The body of GET /metrics (Prometheus text format)."""
        url = f"http://{LOOPBACK}:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return bytes(response.read()).decode()

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> None:
        """Poll GET /readyz until 200; fail at once, with the log, if the broker exits.

        Ports the harness picked can lose a race with another process (another xdist worker,
        a client's outgoing port). If the broker exits saying "address already in use" before
        it was ever ready, it is started again on fresh ports (this changes `pid`, `port`,
        `metrics_port` and `env`, so call this before using them).
        """
        __tracebackhide__ = True
        for attempt in range(1, PORT_ATTEMPTS + 1):
            try:
                self._poll_ready(timeout)
                return
            except HarnessError:
                if self.running or not self._pick_ports or attempt == PORT_ATTEMPTS:
                    raise
                if not address_in_use(self._log_since(self._launch_offset)):
                    raise
            self._reap_quietly()
            for variable in PORT_VARIABLES:
                self.env[variable] = str(free_port())
            self._proc = self._launch()
            self._root = self._snapshot()

    def _poll_ready(self, timeout: float) -> None:
        __tracebackhide__ = True
        url = f"http://{LOOPBACK}:{self.metrics_port}/readyz"

        def exited() -> str | None:
            code = self._proc.poll()
            return None if code is None else f"exited with code {code}\n{self.log_tail()}"

        try:
            wait_until(
                lambda: True if http_status(url, timeout=1.0) == 200 else None,
                timeout=timeout,
                what=f"broker pid {self.pid} ready at {url}",
                interval=0.1,
                abort=exited,
            )
        except HarnessError as exc:
            if self.running:
                raise HarnessError(f"{exc}\n{self.log_tail()}") from None
            raise

    def children(self) -> list[int]:
        """Pids of the supervisor's live direct children."""
        return [p.pid for p in children(self.pid)] if self.running else []

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the supervisor to exit; raises subprocess.TimeoutExpired."""
        return self._proc.wait(timeout)

    def terminate(self, timeout: float = STOP_TIMEOUT) -> int:
        """SIGTERM the supervisor and wait for it; returns its exit code.

        Raises if it does not exit in time (after SIGKILLing the whole tree). Processes of the
        broker still alive after it exited are killed and recorded in `problems`, which the
        fixture reports at teardown.
        """
        __tracebackhide__ = True
        if not self.running:
            return self._proc.wait()
        self._remember_tree()
        self._proc.send_signal(signal.SIGTERM)
        try:
            code = self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._dump_stacks()
            self.kill()
            message = f"broker pid {self.pid} did not exit within {timeout:.0f}s of SIGTERM"
            tail = self.log_tail(DUMP_TAIL_LINES)
            self.problems.append(f"{message}\n{tail}")
            raise HarnessError(f"{message}\n{tail}") from None
        self._reap_leftovers(f"after SIGTERM and exit code {code}")
        return code

    def kill(self) -> int:
        """SIGKILL the supervisor and every process of the broker (a crash of the whole pod)."""
        self._killed = True
        return self._reap_quietly()

    def close(self, timeout: float = STOP_TIMEOUT) -> list[str]:
        """Teardown: stop the broker if running, check the contract; returns what went wrong."""
        if self.running:
            try:
                code = self.terminate(timeout)
            except HarnessError:
                code = None  # already recorded in problems
            if code not in (None, 0):
                self.problems.append(
                    f"broker pid {self.pid} exited with code {code} after SIGTERM (want 0)\n"
                    f"{self.log_tail()}"
                )
        elif not self._killed:
            # It exited on its own (or via terminate()): its children must be gone too.
            self._reap_leftovers(f"after it exited with code {self._proc.returncode}")
        # Whatever happened above, nothing of this broker survives the test.
        self._reap_quietly()
        return self.problems

    # --- internals ---------------------------------------------------------------------------

    def _dump_stacks(self) -> None:
        """Have every process of the broker write its threads' stacks to the log (SIGQUIT)."""
        self._remember_tree()
        for pid in [self.pid, *self._seen]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGQUIT)
        time.sleep(DUMP_WAIT_S)

    def _remember_tree(self) -> None:
        for proc in process_tree(self._root):
            self._seen.setdefault(proc.pid, proc)

    def _reap_quietly(self) -> int:
        if self.running:
            self._remember_tree()
            self._proc.kill()
        code = self._proc.wait()
        self._remember_tree()  # the process group: children re-parented to init
        kill_all(self._seen.values())
        self._seen = {}
        return code

    def _reap_leftovers(self, when: str) -> None:
        def gone() -> bool | None:
            self._remember_tree()
            return True if not still_alive(self._seen.values()) else None

        try:
            wait_until(gone, timeout=LEFTOVER_GRACE, what="broker processes to exit")
        except HarnessError:
            left = still_alive(self._seen.values())
            kill_all(left)
            self.problems.append(
                f"broker pid {self.pid}: processes still alive {when}: "
                f"{', '.join(map(str, left))} (SIGKILLed)\n{self.log_tail()}"
            )
        self._seen = {}

    def _log_since(self, offset: int) -> str:
        with self.log_path.open("rb") as log:
            log.seek(offset)
            return log.read().decode(errors="replace")


class BrokerFactory:
    """`start_broker(env=None, backends="embedded") -> BrokerProcess`, the `start_broker` fixture.

    Every broker gets a fresh KAFSCALE_DATA_DIR and free ports. With backends="real" it also
    gets the session's etcd (unless `env` names KAFSCALE_ETCD_ENDPOINTS, e.g. an EtcdCluster's)
    and MinIO; all brokers of one test share one fresh bucket and one S3 namespace (also the
    metadata key prefix), so a broker started after another sees its data. `env` overrides
    anything (pass `old.env` to restart a broker on the same ports and data directory). The
    broker is returned as soon as it is spawned; call `.wait_ready()`, or pass `ready=True`.
    """

    def __init__(
        self,
        tmp_dir: Path,
        test_name: str,
        etcd: Callable[[], EtcdServer],
        s3: Callable[[], MinioServer],
    ) -> None:
        self._tmp_dir = tmp_dir
        self._etcd = etcd
        self._s3 = s3
        slug = re.sub(r"[^a-z0-9]+", "-", test_name.lower()).strip("-")[:30]
        self.namespace = f"{slug}-{uuid.uuid4().hex[:8]}"
        self._bucket: str | None = None
        self.started: list[BrokerProcess] = []
        # The command run; harness self-tests swap in a stand-in supervisor.
        self.argv: tuple[str, ...] = BROKER_ARGV

    def __call__(
        self,
        env: dict[str, str] | None = None,
        backends: Backends = "embedded",
        *,
        ready: bool = False,
        ready_timeout: float = READY_TIMEOUT,
    ) -> BrokerProcess:
        __tracebackhide__ = True
        overrides = dict(env or {})
        base_dir = self._tmp_dir / f"broker{len(self.started)}"
        data_dir = base_dir / "data"
        data_dir.mkdir(parents=True)
        kafscale_env = {
            "KAFSCALE_DATA_DIR": str(data_dir),
            "KAFSCALE_BROKER_HOST": LOOPBACK,
            "KAFSCALE_BROKER_PORT": str(free_port()),
            "KAFSCALE_METRICS_PORT": str(free_port()),
            "KAFSCALE_SHARDS": "2",
            "KAFSCALE_LOG_LEVEL": "info",
            # A cold start on a loaded 2-core CI machine (parallel workers, other brokers
            # booting) can take longer than the 15 s default to import and spawn every child.
            "KAFSCALE_BOOT_TIMEOUT_MS": "60000",
        }
        if backends == "real":
            kafscale_env.update(self._real_backends(overrides))
        elif backends != "embedded":
            raise ValueError(f"backends must be 'embedded' or 'real', not {backends!r}")
        kafscale_env.update(overrides)
        process_env = {k: v for k, v in os.environ.items() if not k.startswith("KAFSCALE_")}
        process_env["PYTHONUNBUFFERED"] = "1"
        broker = BrokerProcess(
            env=kafscale_env,
            base_dir=base_dir,
            process_env=process_env,
            argv=self.argv,
            pick_ports=not set(PORT_VARIABLES) & overrides.keys(),
        )
        self.started.append(broker)
        if ready:
            broker.wait_ready(ready_timeout)
        return broker

    def close(self) -> list[str]:
        problems: list[str] = []
        for broker in self.started:
            problems.extend(broker.close())
        return problems

    def _real_backends(self, overrides: dict[str, str]) -> dict[str, str]:
        s3 = self._s3()
        s3.ensure_running()
        if "KAFSCALE_ETCD_ENDPOINTS" in overrides:  # e.g. an EtcdCluster's: the session etcd
            endpoints = overrides["KAFSCALE_ETCD_ENDPOINTS"]  # is not needed (nor started)
        else:
            etcd = self._etcd()
            etcd.ensure_running()
            endpoints = etcd.endpoint
        if self._bucket is None and "KAFSCALE_S3_BUCKET" not in overrides:
            self._bucket = s3.create_bucket(unique_bucket_name())
        return {
            "KAFSCALE_ETCD_ENDPOINTS": endpoints,
            "KAFSCALE_S3_BUCKET": self._bucket or overrides["KAFSCALE_S3_BUCKET"],
            "KAFSCALE_S3_ENDPOINT": s3.endpoint_url,
            "KAFSCALE_S3_ACCESS_KEY": s3.access_key,
            "KAFSCALE_S3_SECRET_KEY": s3.secret_key,
            "KAFSCALE_S3_REGION": s3.region,
            "KAFSCALE_S3_PATH_STYLE": "true",
            "KAFSCALE_S3_NAMESPACE": self.namespace,
        }


def unique_bucket_name() -> str:
    """A valid, unused S3 bucket name (3-63 lowercase letters, digits, hyphens)."""
    return f"kafscale-test-{uuid.uuid4().hex[:20]}"
