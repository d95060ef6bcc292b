"""The supervisor process of one broker: preflight, health endpoints, then the arbiter.

A configured backend that cannot be reached stops start-up with a message naming its endpoint,
within ``KAFSCALE_BOOT_TIMEOUT_MS`` -- never a silent fallback to the embedded backends.
"""

from __future__ import annotations

import concurrent.futures
import logging
from collections.abc import Callable

from kafscale.config import Config
from kafscale.metadata import open_metadata_store
from kafscale.storage import open_object_store
from kafscale.supervisor.arbiter import Arbiter, StartupError
from kafscale.supervisor.health import HealthChecker, HealthServer

log = logging.getLogger("kafscale.supervisor")


def run_broker(config: Config, run_id: str, runtime_dir: str) -> int:
    arbiter = Arbiter(config, run_id, runtime_dir)
    try:
        arbiter.prepare()
        _supervise(config, arbiter)
    except StartupError as exc:
        log.critical("cannot start: %s", exc)
        return 1
    finally:
        arbiter.shutdown()
    if arbiter.failure:
        log.critical("stopped: %s", arbiter.failure)
        return 1
    log.info("stopped")
    return 0


def _supervise(config: Config, arbiter: Arbiter) -> None:
    try:
        objects = open_object_store(config)
        store = open_metadata_store(config)
    except Exception as exc:
        raise StartupError(str(exc)) from None
    try:
        checks: dict[str, Callable[[], None]] = {"objects": objects.check, "metadata": store.check}
        preflight(checks, config.boot_timeout_ms / 1000)
        checker = HealthChecker(arbiter.runtime_dir, arbiter.children, checks)
        try:
            http = HealthServer(
                config.broker_host, config.metrics_port, checker, config.admin_token
            )
        except OSError as exc:
            raise StartupError(
                f"cannot listen on {config.broker_host}:{config.metrics_port} "
                f"(KAFSCALE_METRICS_PORT): {exc}"
            ) from None
        http.start()
        try:
            arbiter.boot()
            checker.start()
            log.info(
                "broker running",
                extra={
                    "bootstrap": f"{config.broker_host}:{config.broker_port}",
                    "run_id": arbiter.run_id,
                    "objects": objects.description,
                    "metadata": store.description,
                },
            )
            arbiter.run()
        finally:
            checker.stop()
            http.stop()
    finally:
        store.close()
        objects.close()


def preflight(checks: dict[str, Callable[[], None]], timeout_s: float) -> None:
    """Run the backend checks in parallel; raise StartupError for the first that fails."""
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=len(checks))
    futures = {name: pool.submit(check) for name, check in checks.items()}
    try:
        _, pending = concurrent.futures.wait(futures.values(), timeout=timeout_s)
        for name, future in futures.items():
            if future in pending:
                raise StartupError(f"the {name} backend did not answer within {timeout_s:g} s")
            error = future.exception()
            if error is not None:
                raise StartupError(str(error))
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
