"""Every manifest and the Helm chart against a real kube-apiserver (the `kube` fixture).

The CRDs are applied for real; everything else goes through ``kubectl apply --server-side
--dry-run=server``, which runs the API server's whole admission and validation (OpenAPI schemas,
the CRDs' CEL rules, Pod Security admission) without storing anything. Bad custom resources are
refused with the CRD's own message. Then ``helm install`` for real, in both RBAC modes, and
``kubectl auth can-i`` as the operator's ServiceAccount: what the chart grants, and what it does
not.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.harness.kube import HELM, KubeControlPlane
from tests.unit.test_helm_chart import CHART, CONSOLE, CONSOLE_FULL, template_text

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "k8s"
CRDS = CHART / "crds"
CRD_NAMES = [f"kafscale{kind}.kafscale.io" for kind in ("clusters", "topics", "users")]
# Pod Security admission warns (never refuses) about a workload whose pod template would violate
# the namespace's level; kubectl prints the warning on stderr.
RESTRICTED = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/warn": "restricted",
}
PSS_WARNING = "would violate PodSecurity"


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


@pytest.fixture(scope="module")
def api(kube: KubeControlPlane) -> KubeControlPlane:
    """The session's API server with the chart's CRDs applied (as the operator's tests apply
    them: server-side, kubectl's field manager) and established."""
    kube.apiserver.kubectl("apply", "--server-side", "-f", str(CRDS))
    kube.apiserver.kubectl(
        "wait", "--for=condition=Established", "--timeout=60s", *(f"crd/{n}" for n in CRD_NAMES)
    )
    return kube


def create_namespace(
    kube: KubeControlPlane, name: str, labels: dict[str, str] | None = None
) -> None:
    kube.apiserver.ok(
        "POST",
        "/api/v1/namespaces",
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": name, "labels": labels or {}},
        },
    )


@pytest.fixture
def namespace(api: KubeControlPlane) -> Iterator[str]:
    """A fresh namespace enforcing the "restricted" Pod Security Standard; deleted after."""
    name = unique("dry-run")
    create_namespace(api, name, RESTRICTED)
    yield name
    api.apiserver.request("DELETE", f"/api/v1/namespaces/{name}")


def dry_run(
    kube: KubeControlPlane, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return kube.apiserver.kubectl(
        "apply", "--server-side", "--dry-run=server", *args, check=False, stdin=stdin
    )


def exists(kube: KubeControlPlane, path: str) -> bool:
    status, reply = kube.apiserver.request("GET", path)
    assert status in (200, 404), (path, status, reply)
    return status == 200


def assert_accepted(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 0, result.stderr
    assert PSS_WARNING not in result.stderr, result.stderr
    assert "(server dry run)" in result.stdout, result.stdout


# --- every manifest and the rendered chart ------------------------------------------------


def test_broker_yaml_is_accepted(api: KubeControlPlane, namespace: str) -> None:
    result = dry_run(api, "--namespace", namespace, "-f", str(K8S / "broker.yaml"))
    assert_accepted(result)
    assert "statefulset.apps/kafscale serverside-applied (server dry run)" in result.stdout


def test_operator_yaml_is_accepted(api: KubeControlPlane) -> None:
    # The namespace the file opens with (kafscale-system, "restricted") must exist for the
    # objects in it, and a dry run stores nothing: create it for real first.
    system = yaml.safe_load((K8S / "operator.yaml").read_text().partition("\n---\n")[0])
    path = f"/api/v1/namespaces/{system['metadata']['name']}"
    created = not exists(api, path)
    if created:
        api.apiserver.ok("POST", "/api/v1/namespaces", system)
    try:
        result = dry_run(api, "-f", str(K8S / "operator.yaml"))
    finally:
        if created:
            api.apiserver.request("DELETE", path)
    assert_accepted(result)
    for applied in (
        "namespace/kafscale-system",
        "serviceaccount/kafscale-operator",
        "clusterrole.rbac.authorization.k8s.io/kafscale-operator-crds",
        "clusterrolebinding.rbac.authorization.k8s.io/kafscale-operator",
        "deployment.apps/kafscale-operator",
    ):
        assert f"{applied} serverside-applied (server dry run)" in result.stdout, result.stdout


@pytest.mark.parametrize("mode", ["cluster-wide", "namespaced"])
def test_the_rendered_chart_is_accepted(api: KubeControlPlane, namespace: str, mode: str) -> None:
    watched = [unique("team"), unique("team")] if mode == "namespaced" else []
    for name in watched:
        create_namespace(api, name)
    try:
        rendered = template_text({"watchNamespaces": watched}, namespace)
        result = dry_run(api, "-f", "-", stdin=rendered)
        assert_accepted(result)
        kinds = {line.split("/")[0] for line in result.stdout.splitlines()}
        assert {"serviceaccount", "deployment.apps"} <= kinds
        for kind in ("role", "rolebinding"):
            line = f"{kind}.rbac.authorization.k8s.io/kafscale-operator serverside-applied"
            found = [out for out in result.stdout.splitlines() if out.startswith(line)]
            assert len(found) == len(watched), result.stdout
    finally:
        for name in watched:
            api.apiserver.request("DELETE", f"/api/v1/namespaces/{name}")


def test_console_yaml_is_accepted(api: KubeControlPlane, namespace: str) -> None:
    result = dry_run(api, "--namespace", namespace, "-f", str(K8S / "console.yaml"))
    assert_accepted(result)
    for applied in ("service/kafscale-console", "deployment.apps/kafscale-console"):
        assert f"{applied} serverside-applied (server dry run)" in result.stdout, result.stdout


@pytest.mark.parametrize("console", [CONSOLE, CONSOLE_FULL], ids=["least", "everything"])
def test_the_rendered_chart_with_the_console_is_accepted(
    api: KubeControlPlane, namespace: str, console: dict[str, object]
) -> None:
    rendered = template_text({"console": console}, namespace)
    result = dry_run(api, "-f", "-", stdin=rendered)
    assert_accepted(result)  # the console's pod passes "restricted" too
    applied = ["deployment.apps/kafscale-console", "service/kafscale-console"]
    if console is CONSOLE_FULL:
        applied.append("ingress.networking.k8s.io/kafscale-console")
    for name in applied:
        assert f"{name} serverside-applied (server dry run)" in result.stdout, result.stdout


def test_pod_security_admission_would_catch_an_unsafe_operator_pod(
    api: KubeControlPlane, namespace: str
) -> None:
    """The control for assert_accepted's Pod Security check: it sees a violation."""
    rendered = template_text({"securityContext": {"allowPrivilegeEscalation": True}}, namespace)
    result = dry_run(api, "-f", "-", stdin=rendered)
    assert result.returncode == 0  # a Deployment is only warned about; its pods would be refused
    assert PSS_WARNING in result.stderr and "allowPrivilegeEscalation" in result.stderr


def test_the_examples_are_accepted(api: KubeControlPlane, namespace: str) -> None:
    result = dry_run(api, "--namespace", namespace, "-f", str(K8S / "examples"))
    assert_accepted(result)
    for applied in (
        "kafscalecluster.kafscale.io/events",
        "kafscalecluster.kafscale.io/dev",
        "kafscaletopic.kafscale.io/orders",
        "kafscaleuser.kafscale.io/orders-app",
    ):
        assert f"{applied} serverside-applied (server dry run)" in result.stdout, result.stdout


# --- bad custom resources, refused with the CRD's message ---------------------------------------

CLUSTER = """
apiVersion: kafscale.io/v1alpha1
kind: KafscaleCluster
metadata: {name: bad}
spec:
  storage: {bucket: kafscale-bad}
  metadata: {etcd: {endpoints: ["etcd:2379"]}}
"""
TOPIC = """
apiVersion: kafscale.io/v1alpha1
kind: KafscaleTopic
metadata: {name: bad}
spec: {cluster: events, partitions: 3}
"""
USER = """
apiVersion: kafscale.io/v1alpha1
kind: KafscaleUser
metadata: {name: bad}
spec: {cluster: events}
"""


def with_spec(base: str, **spec: object) -> str:
    """``base`` with its spec's fields replaced (None deletes one)."""
    doc = yaml.safe_load(base)
    for key, value in spec.items():
        if value is None:
            doc["spec"].pop(key)
        else:
            doc["spec"][key] = value
    return json.dumps(doc)


BAD = {
    "etcd endpoints and managed": (
        with_spec(CLUSTER, metadata={"etcd": {"endpoints": ["etcd:2379"], "managed": {}}}),
        "give either endpoints (your etcd) or managed (the operator runs one)",
    ),
    "no etcd at all": (
        with_spec(CLUSTER, metadata={"etcd": {}}),
        "give either endpoints (your etcd) or managed (the operator runs one)",
    ),
    "no storage": (with_spec(CLUSTER, storage=None), "spec.storage: Required value"),
    "negative replicas": (
        with_spec(CLUSTER, brokers={"replicas": -1}),
        "spec.brokers.replicas: Invalid value: -1",
    ),
    "two listeners on one port": (
        with_spec(
            CLUSTER,
            brokers={"listeners": [{"name": "A", "port": 9092}, {"name": "B", "port": 9092}]},
        ),
        "every listener needs its own port",
    ),
    "SASL without an admin": (
        with_spec(CLUSTER, brokers={"listeners": [{"name": "A", "port": 9092, "sasl": True}]}),
        "a SASL listener needs brokers.authentication.adminSecret",
    ),
    "NodePort without a base": (
        with_spec(
            CLUSTER,
            brokers={
                "listeners": [
                    {"name": "IN", "port": 9092},
                    {
                        "name": "OUT",
                        "port": 9094,
                        "external": {"type": "NodePort", "advertisedHostTemplate": "b{id}.x"},
                    },
                ]
            },
        ),
        "a NodePort listener needs nodePortBase in 30000-32767",
    ),
    "a setting that is not KAFSCALE_": (
        with_spec(CLUSTER, config={"LOG_LEVEL": "debug"}),
        "every key is a KAFSCALE_ setting",
    ),
    "managed etcd of 2": (
        with_spec(CLUSTER, metadata={"etcd": {"managed": {"replicas": 2}}}),
        "spec.metadata.etcd.managed.replicas: Unsupported value: 2: supported values: "
        '"1", "3", "5"',
    ),
    "autoscaling min above max": (
        with_spec(CLUSTER, autoscaling={"minReplicas": 5, "maxReplicas": 3}),
        "minReplicas must not exceed maxReplicas",
    ),
    "topic without a cluster": (with_spec(TOPIC, cluster=None), "spec.cluster: Required value"),
    "zero partitions": (
        with_spec(TOPIC, partitions=0),
        "spec.partitions: Invalid value: 0: spec.partitions in body should be greater than or "
        "equal to 1",
    ),
    "a topic name Kafka refuses": (
        with_spec(TOPIC, topicName="no spaces"),
        'spec.topicName: Invalid value: "no spaces": spec.topicName in body should match',
    ),
    "an unknown deletion policy": (
        with_spec(TOPIC, deletionPolicy="Orphan"),
        'spec.deletionPolicy: Unsupported value: "Orphan"',
    ),
    "an ACL on a topic without a name": (
        with_spec(
            USER,
            authorization={"acls": [{"resource": {"type": "topic"}, "operations": ["Read"]}]},
        ),
        "a topic, group or transactionalId ACL needs a name",
    ),
    "an operation Kafka lacks": (
        with_spec(
            USER,
            authorization={
                "acls": [{"resource": {"type": "topic", "name": "t"}, "operations": ["Fly"]}]
            },
        ),
        'Unsupported value: "Fly"',
    ),
    "PLAIN users": (
        with_spec(USER, authentication={"type": "plain"}),
        'spec.authentication.type: Unsupported value: "plain"',
    ),
}


@pytest.mark.parametrize("case", BAD)
def test_a_bad_spec_is_refused_with_the_crds_message(
    api: KubeControlPlane, namespace: str, case: str
) -> None:
    manifest, message = BAD[case]
    result = dry_run(api, "--namespace", namespace, "-f", "-", stdin=manifest)
    assert result.returncode != 0, result.stdout
    assert message in result.stderr, result.stderr


def test_changes_the_crds_forbid_are_refused(api: KubeControlPlane, namespace: str) -> None:
    """Rules on the change (oldSelf): a stored resource, then an edit that breaks them."""
    stored = with_spec(TOPIC, partitions=6, topicName="orders")
    api.apiserver.kubectl(
        "apply", "--server-side", "--namespace", namespace, "-f", "-", stdin=stored
    )
    for edit, message in (
        ({"partitions": 3}, "partitions can be added, never removed"),
        ({"topicName": "renamed"}, "topicName cannot change (create another KafscaleTopic)"),
    ):
        changed = with_spec(stored, **edit)
        result = dry_run(api, "--namespace", namespace, "-f", "-", stdin=changed)
        assert result.returncode != 0 and message in result.stderr, result.stderr
    grown = dry_run(
        api, "--namespace", namespace, "-f", "-", stdin=with_spec(stored, partitions=12)
    )
    assert grown.returncode == 0, grown.stderr


# --- helm install, and what the operator's ServiceAccount may do ----------------------------------


def helm(kube: KubeControlPlane, tmp_path: Path, *args: str) -> str:
    config = kube.apiserver.kubeconfig(tmp_path / "helm.kubeconfig")
    env = {
        "HOME": str(tmp_path),
        "PATH": "/usr/bin:/bin",
        **{
            name: str(tmp_path / name.lower())
            for name in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME")
        },
    }
    result = subprocess.run(
        [str(HELM), f"--kubeconfig={config}", *args],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )
    assert result.returncode == 0, f"helm {' '.join(args)}: {result.stderr}"
    return result.stdout


def can_i(kube: KubeControlPlane, account: str, *args: str) -> bool:
    result = kube.apiserver.kubectl("auth", "can-i", f"--as={account}", *args, check=False)
    answer = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    assert answer in ("yes", "no"), result.stderr
    return answer == "yes"


def installed_objects(release: str, system: str) -> list[str]:
    name = f"{release}-operator"
    return [
        f"/apis/apps/v1/namespaces/{system}/deployments/{name}",
        f"/api/v1/namespaces/{system}/serviceaccounts/{name}",
        f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{name}-crds",
        f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{name}-crds",
    ]


def test_helm_install_cluster_wide(api: KubeControlPlane, tmp_path: Path) -> None:
    release, system = unique("kafscale"), unique("kafscale-system")
    other = unique("apps")
    create_namespace(api, other)
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    objects = [
        *installed_objects(release, system),
        f"{rbac}/clusterroles/{release}-operator",
        f"{rbac}/clusterrolebindings/{release}-operator",
    ]
    notes = helm(
        api,
        tmp_path,
        "install",
        release,
        str(CHART),
        "--namespace",
        system,
        "--create-namespace",
        "--wait=false",
    )
    assert f"rollout status deployment/{release}-operator" in notes  # NOTES.txt
    assert "in every namespace" in notes
    try:
        for crd in CRD_NAMES:
            assert exists(api, f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd}")
        for path in objects:
            assert exists(api, path), path
        account = f"system:serviceaccount:{system}:{release}-operator"
        # Everything it reconciles, in any namespace.
        for allowed in (
            ["patch", "statefulsets.apps", "-n", other],
            ["create", "secrets", "-n", other],
            ["delete", "horizontalpodautoscalers.autoscaling", "-n", other],
            ["create", "cronjobs.batch", "-n", other],
            ["update", "poddisruptionbudgets.policy", "-n", other],
            ["watch", "kafscaleclusters.kafscale.io", "--all-namespaces"],
            ["patch", "kafscaletopics.kafscale.io", "--subresource=status", "-n", other],
            ["create", "events.events.k8s.io", "-n", other],
            ["list", "customresourcedefinitions.apiextensions.k8s.io"],
        ):
            assert can_i(api, account, *allowed), allowed
        # Nothing else.
        for denied in (
            ["delete", "namespaces"],
            ["list", "pods", "-n", other],
            ["create", "pods/exec", "-n", other],
            ["create", "deployments.apps", "-n", other],
            ["delete", "persistentvolumeclaims", "-n", other],
            ["create", "kafscaleclusters.kafscale.io", "-n", other],
            ["delete", "kafscaleusers.kafscale.io", "-n", other],
            ["delete", "customresourcedefinitions.apiextensions.k8s.io"],
            ["create", "clusterrolebindings.rbac.authorization.k8s.io"],
            ["get", "nodes"],
        ):
            assert not can_i(api, account, *denied), denied
    finally:
        helm(api, tmp_path, "uninstall", release, "--namespace", system)
        for path in objects:
            api.apiserver.wait_gone(path)
        api.apiserver.request("DELETE", f"/api/v1/namespaces/{system}")
        api.apiserver.request("DELETE", f"/api/v1/namespaces/{other}")
    # Helm never deletes CRDs (nor, with them, everyone's clusters).
    for crd in CRD_NAMES:
        assert exists(api, f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd}")


def test_helm_install_namespaced(api: KubeControlPlane, tmp_path: Path) -> None:
    release, system = unique("kafscale"), unique("kafscale-system")
    watched, other = unique("team"), unique("apps")
    for name in (watched, other):
        create_namespace(api, name)
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    objects = [
        *installed_objects(release, system),
        f"{rbac}/namespaces/{watched}/roles/{release}-operator",
        f"{rbac}/namespaces/{watched}/rolebindings/{release}-operator",
    ]
    notes = helm(
        api,
        tmp_path,
        "install",
        release,
        str(CHART),
        "--namespace",
        system,
        "--create-namespace",
        "--wait=false",
        f"--set=watchNamespaces={{{watched}}}",
    )
    assert f"KafscaleUsers in: {watched}." in notes  # NOTES.txt
    try:
        for path in objects:
            assert exists(api, path), path
        assert not exists(api, f"{rbac}/clusterroles/{release}-operator")
        deployment = api.apiserver.ok(
            "GET", f"/apis/apps/v1/namespaces/{system}/deployments/{release}-operator"
        )
        env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
        assert {"name": "KAFSCALE_OPERATOR_NAMESPACES", "value": watched} in env
        account = f"system:serviceaccount:{system}:{release}-operator"
        assert can_i(api, account, "patch", "statefulsets.apps", "-n", watched)
        assert can_i(api, account, "get", "secrets", "-n", watched)
        assert can_i(api, account, "list", "customresourcedefinitions.apiextensions.k8s.io")
        for denied in (
            ["patch", "statefulsets.apps", "-n", other],
            ["get", "secrets", "-n", other],
            ["list", "kafscaleclusters.kafscale.io", "--all-namespaces"],
            ["list", "pods", "-n", watched],
            ["list", "pods", "-n", other],
            ["get", "secrets", "-n", "kube-system"],
        ):
            assert not can_i(api, account, *denied), denied
    finally:
        helm(api, tmp_path, "uninstall", release, "--namespace", system)
        for path in objects:
            api.apiserver.wait_gone(path)
        for name in (system, watched, other):
            api.apiserver.request("DELETE", f"/api/v1/namespaces/{name}")


def test_helm_install_with_the_console(api: KubeControlPlane, tmp_path: Path) -> None:
    release, system = unique("kafscale"), unique("kafscale-system")
    notes = helm(
        api,
        tmp_path,
        "install",
        release,
        str(CHART),
        "--namespace",
        system,
        "--create-namespace",
        "--wait=false",
        "--set=console.enabled=true",
        f"--set=console.bootstrap={CONSOLE['bootstrap']}",
        "--set=console.username=admin",
        "--set=console.existingSecret=kafscale-console",
    )
    # NOTES.txt: how to log in and reach it.
    assert f"port-forward service/{release}-console 8088:8088" in notes, notes
    assert "get secret kafscale-console -o jsonpath='{.data.password}'" in notes, notes
    paths = [
        f"/apis/apps/v1/namespaces/{system}/deployments/{release}-console",
        f"/api/v1/namespaces/{system}/services/{release}-console",
    ]
    try:
        for path in paths:
            assert exists(api, path), path
        deployment = api.apiserver.ok("GET", paths[0])
        env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
        assert {
            "name": "KAFSCALE_UI_PASSWORD_FILE",
            "value": "/var/run/secrets/kafscale-console/ui-password",
        } in env
    finally:
        helm(api, tmp_path, "uninstall", release, "--namespace", system)
        for path in paths:
            api.apiserver.wait_gone(path)
        api.apiserver.request("DELETE", f"/api/v1/namespaces/{system}")
