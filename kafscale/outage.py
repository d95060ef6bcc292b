"""Fail fast while a backend is down: one call finds out, the calls after it are refused at once.

A call to S3 or etcd that finds the backend unreachable (a timeout, a refused connection, a 5xx)
opens the backend's ``OutageGate``. While it is open every call raises the backend's own
"unavailable" error at once, without touching the network, and one background thread probes the
backend (its ``check``) with back-off until it answers, which closes the gate. So a paused or
dead backend costs a process one timeout per outage, not one per call: the coordinator's and the
shards' loops keep answering -- with retriable errors -- instead of waiting out a timeout for
every request, and they recover by themselves within ``MAX_PROBE_INTERVAL_S`` of the backend's
return. Invariants: the gate never refuses a call while closed; it closes only after a probe
succeeded; at most one probe thread per gate.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

FIRST_PROBE_S = 0.2
MAX_PROBE_INTERVAL_S = 2.0


class OutageGate:
    def __init__(
        self,
        backend: str,
        probe: Callable[[], None],
        unavailable: Callable[[str], Exception],
        max_probe_interval_s: float = MAX_PROBE_INTERVAL_S,
    ) -> None:
        """``backend`` names it in logs and metrics ("s3", "etcd"); ``probe`` raises unless the
        backend answers; ``unavailable`` builds the error raised while the gate is open."""
        self.backend = backend
        self._probe = probe
        self._unavailable = unavailable
        self._max_interval = max_probe_interval_s
        self._lock = threading.Lock()
        self._closed = threading.Event()  # set by close(): no more probing
        self._error: Exception | None = None  # what opened the gate; None while closed
        self._opened_at = 0.0
        self._prober: threading.Thread | None = None

    @property
    def open(self) -> bool:
        return self._error is not None

    def admit(self) -> None:
        """Return if calls may go to the backend; raise its "unavailable" error if not."""
        error = self._error
        if error is not None:
            # The same text for the whole outage, so callers that log a changed error log once.
            raise self._unavailable(f"{error} (refusing calls until it answers again)")

    def failed(self, error: Exception) -> None:
        """A call found the backend unreachable: open the gate (if not yet) and probe."""
        with self._lock:
            if self._error is not None or self._closed.is_set():
                return
            self._error, self._opened_at = error, time.monotonic()
            self._prober = threading.Thread(
                target=self._probe_until_up, name=f"{self.backend}-probe", daemon=True
            )
            self._prober.start()
        # Imported here: the offline readers (``segments dump``, Spark) use the stores too, and
        # prometheus-client must not be imported before PROMETHEUS_MULTIPROC_DIR is known.
        from kafscale import metrics

        metrics.BACKEND_OUTAGES.labels(self.backend).inc()
        log.warning(
            "backend unreachable: refusing calls to it until it answers",
            extra={"backend": self.backend, "error": str(error)},
        )

    def _probe_until_up(self) -> None:
        interval = FIRST_PROBE_S
        while not self._closed.wait(interval):
            try:
                self._probe()
            except Exception:
                interval = min(interval * 2, self._max_interval)
                continue
            with self._lock:
                down_s = time.monotonic() - self._opened_at
                self._error, self._prober = None, None
            log.info(
                "backend reachable again",
                extra={"backend": self.backend, "down_s": round(down_s, 1)},
            )
            return

    def close(self) -> None:
        """Stop probing (the store is being closed)."""
        self._closed.set()
        prober = self._prober
        if prober is not None and prober is not threading.current_thread():
            prober.join(timeout=5)
