"""`kafscale operator` as a real process against the test control plane (tests/harness/kube.py).

It authenticates as a ServiceAccount (a token from the TokenRequest API in its kubeconfig), so
the RBAC the chart grants is what it runs with. Healthy: its liveness endpoint answers 200.
"""

from __future__ import annotations

import os
from pathlib import Path

from tests.harness.kube import KubeApiServer
from tests.harness.paths import ROOT
from tests.harness.procs import free_port
from tests.harness.servers import ManagedServer, http_status

KAFSCALE = ROOT / ".venv" / "bin" / "kafscale"


class OperatorProcess(ManagedServer):
    name = "operator"

    def __init__(
        self,
        base_dir: Path,
        apiserver: KubeApiServer,
        token: str,
        namespaces: list[str],
        env: dict[str, str] | None = None,
    ) -> None:
        self.apiserver = apiserver
        self.token = token
        self.namespaces = namespaces
        self.extra_env = env or {}
        base_dir.mkdir(parents=True, exist_ok=True)
        self.kubeconfig = apiserver.kubeconfig(base_dir / "operator.kubeconfig", token=token)
        super().__init__(base_dir)

    def pick_ports(self) -> None:
        self.health_port = free_port()

    def argv(self) -> list[str]:
        return [str(KAFSCALE), "operator"]

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("KAFSCALE_")}
        env.update(
            {
                "KUBECONFIG": str(self.kubeconfig),
                "KAFSCALE_OPERATOR_NAMESPACES": ",".join(self.namespaces),
                "KAFSCALE_OPERATOR_HEALTH_PORT": str(self.health_port),
                "KAFSCALE_OPERATOR_RESYNC_SECONDS": "5",
                "KAFSCALE_OPERATOR_BROKER_IMAGE": "kafscale:test",
                "KAFSCALE_LOG_LEVEL": "debug",
            }
        )
        env.update(self.extra_env)
        return env

    def probe(self) -> bool:
        return http_status(f"http://127.0.0.1:{self.health_port}/healthz") == 200
