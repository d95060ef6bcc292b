"""/metrics aggregates every process; /healthz and /readyz tell liveness and readiness."""

from __future__ import annotations

import json
import re
import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest

from tests.harness.procs import wait_until

pytestmark = pytest.mark.integration


def get(broker: Any, path: str) -> tuple[int, str]:
    url = f"http://127.0.0.1:{broker.metrics_port}{path}"
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def sample(metrics: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)} ([0-9.e+]+)$", metrics, re.MULTILINE)
    assert match is not None, f"{name} not in /metrics"
    return float(match.group(1))


def test_metrics_come_from_every_process(start_broker: Callable[..., Any], kcat: str) -> None:
    broker = start_broker()
    broker.wait_ready()
    assert get(broker, "/healthz") == (200, "ok\n")
    status, body = get(broker, "/readyz")
    assert status == 200 and json.loads(body) == {"ready": True, "problems": []}
    for _ in range(3):
        subprocess.run(
            [kcat, "-L", "-b", broker.bootstrap, "-m", "15"],
            capture_output=True,
            timeout=60,
            check=True,
        )
    metrics = broker.metrics_text()
    # Counted in the frontend process, served by the supervisor: multiprocess aggregation.
    assert sample(metrics, 'kafscale_requests_total{api="metadata"}') >= 3
    assert sample(metrics, 'kafscale_requests_total{api="api_versions"}') >= 3
    assert sample(metrics, "kafscale_network_bytes_in_total") > 0
    # Set in the supervisor's health thread.
    assert 'kafscale_backend_up{backend="metadata"' in metrics
    assert get(broker, "/nope")[0] == 404


def test_readyz_follows_the_object_store(start_broker: Callable[..., Any], s3_server: Any) -> None:
    broker = start_broker(backends="real")
    broker.wait_ready()
    s3_server.stop()
    try:

        def not_ready() -> str | None:
            status, body = get(broker, "/readyz")
            return body if status == 503 else None

        body = wait_until(not_ready, timeout=60, what="/readyz to report S3 down")
        # Which backend, not the error (it names the endpoint: that is in the log).
        assert "objects backend is not reachable" in json.loads(body)["problems"], body
        assert s3_server.endpoint_url not in body
        assert get(broker, "/healthz")[0] == 200  # alive, just not ready
    finally:
        s3_server.start()
    broker.wait_ready(timeout=60)
