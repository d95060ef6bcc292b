"""A real Kubernetes control plane without nodes: kube-apiserver on its own etcd, and
kube-controller-manager running only the controllers that need no node (the garbage collector,
which deletes what an owner's deletion orphans, and the namespace controller). No kubelet, no
scheduler and no StatefulSet controller run -- no container runtime exists here -- so no pod
ever starts: tests set the statuses the operator waits on through the API (`set_status`).

Binaries come from .tools/bin (scripts/install-deps.sh, step kube: built from the Go module
proxy). The admin authenticates with a static token (system:masters); every other identity is a
ServiceAccount whose token the TokenRequest API issues (`service_account_token`), checked by
RBAC like in a real cluster.
"""

from __future__ import annotations

import json
import secrets
import ssl
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.harness.etcd import EtcdServer
from tests.harness.paths import TOOLS_BIN
from tests.harness.procs import LOOPBACK, HarnessError, free_port, wait_until
from tests.harness.servers import ManagedServer

APISERVER = TOOLS_BIN / "kube-apiserver"
CONTROLLER_MANAGER = TOOLS_BIN / "kube-controller-manager"
KUBECTL = TOOLS_BIN / "kubectl"
HELM = TOOLS_BIN / "helm"


def require_tools() -> None:
    for tool in (APISERVER, CONTROLLER_MANAGER, KUBECTL, HELM):
        if not tool.exists():
            raise HarnessError(f"{tool} is missing: run scripts/install-deps.sh kube")


def _insecure_context() -> ssl.SSLContext:
    # The API server's serving certificate is self-signed (its --cert-dir); tests trust it as
    # kubectl does with insecure-skip-tls-verify. Nothing secret crosses loopback.
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


class KubeApiServer(ManagedServer):
    name = "kube-apiserver"

    def __init__(self, base_dir: Path, etcd: EtcdServer) -> None:
        self.etcd = etcd
        self.admin_token = secrets.token_hex(16)
        base_dir.mkdir(parents=True, exist_ok=True)
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        (base_dir / "sa.key").write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        (base_dir / "sa.pub").write_bytes(
            key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
        (base_dir / "tokens.csv").write_text(f"{self.admin_token},admin,admin,system:masters\n")
        super().__init__(base_dir)

    def pick_ports(self) -> None:
        self.port = free_port()

    @property
    def url(self) -> str:
        return f"https://{LOOPBACK}:{self.port}"

    def argv(self) -> list[str]:
        return [
            str(APISERVER),
            f"--etcd-servers={self.etcd.url}",
            f"--etcd-prefix=/registry-{self.port}",
            f"--bind-address={LOOPBACK}",
            f"--secure-port={self.port}",
            f"--cert-dir={self.base_dir / 'certs'}",
            f"--token-auth-file={self.base_dir / 'tokens.csv'}",
            "--authorization-mode=RBAC",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={self.base_dir / 'sa.pub'}",
            f"--service-account-signing-key-file={self.base_dir / 'sa.key'}",
            "--service-cluster-ip-range=10.96.0.0/16",
            "--endpoint-reconciler-type=none",
            "--enable-priority-and-fairness=false",
        ]

    def probe(self) -> bool:
        try:
            return self.request("GET", "/readyz")[0] == 200
        except OSError:
            return False

    def kubeconfig(self, path: Path, token: str | None = None, namespace: str = "default") -> Path:
        """A kubeconfig for this server, as the admin or with ``token``."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": "test", "cluster": {"server": self.url, "insecure-skip-tls-verify": True}}
            ],
            "users": [{"name": "user", "user": {"token": token or self.admin_token}}],
            "contexts": [
                {
                    "name": "test",
                    "context": {"cluster": "test", "user": "user", "namespace": namespace},
                }
            ],
            "current-context": "test",
        }
        path.write_text(json.dumps(config))
        return path

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
        token: str | None = None,
    ) -> tuple[int, Any]:
        """One API call as the admin (or ``token``): (status, decoded JSON or text)."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method)
        request.add_header("Authorization", f"Bearer {token or self.admin_token}")
        if data is not None:
            request.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(request, timeout=10, context=_insecure_context()) as reply:
                status, raw = reply.status, reply.read()
        except urllib.error.HTTPError as exc:
            status, raw = exc.code, exc.read()
        try:
            return status, json.loads(raw)
        except ValueError:
            return status, raw.decode(errors="replace")

    def ok(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> Any:
        status, reply = self.request(method, path, body, content_type)
        if status >= 300:
            raise HarnessError(f"{method} {path}: {status} {reply}")
        return reply

    def kubectl(
        self, *args: str, check: bool = True, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        config = self.base_dir / "admin.kubeconfig"
        if not config.exists():
            self.kubeconfig(config)
        result = subprocess.run(
            [str(KUBECTL), f"--kubeconfig={config}", *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if check and result.returncode != 0:
            raise HarnessError(f"kubectl {' '.join(args)}: {result.stderr or result.stdout}")
        return result

    def service_account_token(self, namespace: str, name: str, seconds: int = 3600) -> str:
        reply = self.ok(
            "POST",
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {"expirationSeconds": seconds},
            },
        )
        return str(reply["status"]["token"])

    def set_status(self, path: str, status: dict[str, Any]) -> None:
        """Merge-patch an object's status subresource (what a controller that does not run
        here would write: a StatefulSet's ready replicas, a Service's load balancer)."""
        self.ok("PATCH", f"{path}/status", {"status": status}, "application/merge-patch+json")

    def wait_for(self, path: str, check: Any, timeout: float = 60.0, what: str = "") -> Any:
        """GET ``path`` until ``check(object)`` is truthy; returns the object."""

        def attempt() -> Any:
            status, reply = self.request("GET", path)
            return reply if status == 200 and check(reply) else None

        return wait_until(attempt, timeout=timeout, what=what or f"{path} to match", interval=0.2)

    def wait_gone(self, path: str, timeout: float = 60.0) -> None:
        wait_until(
            lambda: True if self.request("GET", path)[0] == 404 else None,
            timeout=timeout,
            what=f"{path} to be deleted",
            interval=0.2,
        )


class ControllerManager(ManagedServer):
    name = "kube-controller-manager"

    def __init__(self, base_dir: Path, apiserver: KubeApiServer) -> None:
        self.apiserver = apiserver
        super().__init__(base_dir)

    def pick_ports(self) -> None:
        self.port = free_port()

    def argv(self) -> list[str]:
        config = self.apiserver.kubeconfig(self.base_dir / "kcm.kubeconfig")
        return [
            str(CONTROLLER_MANAGER),
            f"--kubeconfig={config}",
            "--controllers=garbagecollector,namespace",
            "--leader-elect=false",
            f"--bind-address={LOOPBACK}",
            f"--secure-port={self.port}",
            "--concurrent-gc-syncs=5",
        ]

    def probe(self) -> bool:
        return "Proceeding to collect garbage" in self.log_text()


class KubeControlPlane:
    """etcd + kube-apiserver + kube-controller-manager, started and stopped together."""

    def __init__(self, base_dir: Path) -> None:
        require_tools()
        self.etcd = EtcdServer(base_dir / "etcd")
        self.apiserver = KubeApiServer(base_dir / "apiserver", self.etcd)
        self.controllers = ControllerManager(base_dir / "controllers", self.apiserver)

    def start(self) -> None:
        self.etcd.start_first()
        self.apiserver.start_first(timeout=120)
        self.controllers.start_first(timeout=120)

    def close(self) -> None:
        for server in (self.controllers, self.apiserver, self.etcd):
            if server.running:
                server.stop()
