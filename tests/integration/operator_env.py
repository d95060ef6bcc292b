"""What the operator's integration tests share: the CRDs on the API server, and the operator's
ServiceAccount with the chart's own namespaced RBAC (rendered by helm from charts/kafscale, so
the tests prove those rules are enough)."""

from __future__ import annotations

import subprocess
import threading

import yaml

from tests.harness.kube import HELM, KubeControlPlane
from tests.harness.paths import ROOT
from tests.harness.procs import HarnessError

CHART = ROOT / "charts" / "kafscale"
RELEASE = "kafscale"
_crds_lock = threading.Lock()
_crds_on: set[str] = set()


def install_crds(kube: KubeControlPlane) -> None:
    """The chart's CRDs, applied once per API server and established."""
    with _crds_lock:
        if kube.apiserver.url in _crds_on:
            return
        kube.apiserver.kubectl("apply", "--server-side", "-f", str(CHART / "crds"))
        kube.apiserver.kubectl(
            "wait", "--for=condition=Established", "crd", "--all", "--timeout=60s"
        )
        _crds_on.add(kube.apiserver.url)


def render_chart(namespace: str, *values: str) -> list[dict[str, object]]:
    result = subprocess.run(
        [str(HELM), "template", RELEASE, str(CHART), "--namespace", namespace, *values],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if result.returncode != 0:
        raise HarnessError(f"helm template: {result.stderr}")
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def install_operator_rbac(kube: KubeControlPlane, namespace: str) -> str:
    """The chart's ServiceAccount and RBAC for an operator watching ``namespace`` only, in
    ``namespace``; returns a token of that ServiceAccount."""
    install_crds(kube)
    docs = render_chart(namespace, "--set", f"watchNamespaces={{{namespace}}}")
    kinds = {"ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"}
    wanted = [doc for doc in docs if doc["kind"] in kinds]
    # Cluster-scoped objects are shared by every test namespace: name them per namespace.
    for doc in wanted:
        if doc["kind"] in ("ClusterRole", "ClusterRoleBinding"):
            meta = doc["metadata"]
            assert isinstance(meta, dict)
            meta["name"] = f"{meta['name']}-{namespace}"
            if doc["kind"] == "ClusterRoleBinding":
                ref = doc["roleRef"]
                assert isinstance(ref, dict)
                ref["name"] = f"{ref['name']}-{namespace}"
    kube.apiserver.kubectl("apply", "--server-side", "-f", "-", stdin=yaml.safe_dump_all(wanted))
    (account,) = [doc for doc in wanted if doc["kind"] == "ServiceAccount"]
    meta = account["metadata"]
    assert isinstance(meta, dict)
    return kube.apiserver.service_account_token(namespace, str(meta["name"]))
