"""A real single-member etcd (the Debian etcd-server package's /usr/bin/etcd) on loopback.

Its data directory outlives `stop()`/`kill()`, so a restart serves the same keys. Healthy means
GET /health answers {"health": "true"} (the member has a leader and serves requests).
"""

from __future__ import annotations

import base64
import json
import shutil
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tests.harness.procs import LOOPBACK, HarnessError, free_port
from tests.harness.servers import ManagedServer

ETCD_BINARY = "/usr/bin/etcd"


def find_etcd() -> str:
    path = shutil.which("etcd") or (ETCD_BINARY if Path(ETCD_BINARY).exists() else None)
    if path is None:
        raise HarnessError("etcd is not installed: run scripts/install-deps.sh")
    return path


class EtcdServer(ManagedServer):
    name = "etcd"

    def __init__(self, base_dir: Path) -> None:
        self.binary = find_etcd()
        self.client_port = 0
        self.peer_port = 0
        super().__init__(base_dir)

    def pick_ports(self) -> None:
        self.client_port = free_port()
        self.peer_port = free_port()

    @property
    def endpoint(self) -> str:
        """host:port, the form KAFSCALE_ETCD_ENDPOINTS takes."""
        return f"{LOOPBACK}:{self.client_port}"

    @property
    def url(self) -> str:
        return f"http://{self.endpoint}"

    def argv(self) -> list[str]:
        peer = f"http://{LOOPBACK}:{self.peer_port}"
        return [
            self.binary,
            "--name=kafscale-test",
            f"--data-dir={self.data_dir}",
            f"--listen-client-urls={self.url}",
            f"--advertise-client-urls={self.url}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=kafscale-test={peer}",
            "--initial-cluster-state=new",
            "--logger=zap",
            "--log-outputs=stderr",
        ]

    def probe(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2.0) as response:
                body = json.loads(response.read())
        except (OSError, ValueError):
            return False
        return bool(body.get("health") == "true")

    # --- a tiny v3 JSON-gateway client, for tests that check the server itself ------------------

    def call(self, path: str, body: dict[str, Any], timeout: float = 10.0) -> dict[str, Any]:
        """POST to the v3 JSON gateway (e.g. "kv/put"); keys and values are base64 in the body."""
        request = urllib.request.Request(
            f"{self.url}/v3/{path}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                result: dict[str, Any] = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            raise HarnessError(f"etcd {path}: HTTP {exc.code}: {exc.read()!r}") from None
        return result

    def put(self, key: bytes, value: bytes) -> None:
        self.call("kv/put", {"key": _b64(key), "value": _b64(value)})

    def get(self, key: bytes) -> bytes | None:
        kvs = self.call("kv/range", {"key": _b64(key)}).get("kvs", [])
        return base64.b64decode(kvs[0].get("value", "")) if kvs else None


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()
