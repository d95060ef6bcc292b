"""`kafscale console` as a real process, pointed at a broker under test (tests/harness/broker.py).

It reads the broker's metadata store (the broker's own KAFSCALE_* settings for etcd or the data
directory, and its S3 namespace) and scrapes the broker's /metrics. Healthy: GET /healthz
answers 200. The login is `USERNAME` / `PASSWORD` unless the test passes other settings.
"""

from __future__ import annotations

import os
from pathlib import Path

from tests.harness.paths import ROOT
from tests.harness.procs import LOOPBACK, free_port
from tests.harness.servers import ManagedServer, http_status

KAFSCALE = ROOT / ".venv" / "bin" / "kafscale"
USERNAME = "ops"
PASSWORD = "console-test-password"
# The broker settings the console needs to find the metadata store the broker uses.
METADATA_SETTINGS = (
    "KAFSCALE_DATA_DIR",
    "KAFSCALE_ETCD_ENDPOINTS",
    "KAFSCALE_S3_NAMESPACE",
    "KAFSCALE_S3_BUCKET",
    "KAFSCALE_S3_ENDPOINT",
    "KAFSCALE_S3_ACCESS_KEY",
    "KAFSCALE_S3_SECRET_KEY",
    "KAFSCALE_S3_REGION",
    "KAFSCALE_S3_PATH_STYLE",
)


class ConsoleProcess(ManagedServer):
    name = "console"

    def __init__(
        self,
        base_dir: Path,
        broker_env: dict[str, str],
        bootstrap: str,
        metrics_url: str | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.broker_env = broker_env
        self.bootstrap = bootstrap
        self.metrics_url = metrics_url
        self.extra_env = env or {}
        base_dir.mkdir(parents=True, exist_ok=True)
        super().__init__(base_dir)

    def pick_ports(self) -> None:
        self.port = free_port()

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def argv(self) -> list[str]:
        return [str(KAFSCALE), "console"]

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("KAFSCALE_")}
        env.update({k: v for k, v in self.broker_env.items() if k in METADATA_SETTINGS})
        env.update(
            {
                "KAFSCALE_CONSOLE_HOST": LOOPBACK,
                "KAFSCALE_CONSOLE_PORT": str(self.port),
                "KAFSCALE_CONSOLE_BOOTSTRAP": self.bootstrap,
                "KAFSCALE_UI_USERNAME": USERNAME,
                "KAFSCALE_UI_PASSWORD": PASSWORD,
                "KAFSCALE_CONSOLE_SAMPLE_SECONDS": "1",
                "KAFSCALE_CONSOLE_METADATA": "on",
                "KAFSCALE_LOG_LEVEL": "debug",
            }
        )
        if self.metrics_url:
            env["KAFSCALE_CONSOLE_METRICS_URLS"] = self.metrics_url
        env.update(self.extra_env)
        return env

    def probe(self) -> bool:
        return http_status(f"{self.url}/healthz") == 200
