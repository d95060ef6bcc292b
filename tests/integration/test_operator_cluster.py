"""The operator reconciling KafscaleClusters against a real Kubernetes API server
(tests/harness/kube.py: no nodes, so no pod runs; the tests set the StatefulSet statuses the
operator waits on). The operator is a real `kafscale operator` process authenticated as its
ServiceAccount with the chart's namespaced RBAC.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness.kube import KubeControlPlane
from tests.harness.operator import OperatorProcess
from tests.integration.operator_env import install_operator_rbac

CLUSTER = "/apis/kafscale.io/v1alpha1/namespaces/{ns}/kafscaleclusters"
STS = "/apis/apps/v1/namespaces/{ns}/statefulsets"


@pytest.fixture
def namespace(kube: KubeControlPlane) -> Iterator[str]:
    name = f"op-{uuid.uuid4().hex[:8]}"
    kube.apiserver.ok(
        "POST",
        "/api/v1/namespaces",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
    )
    yield name
    kube.apiserver.request("DELETE", f"/api/v1/namespaces/{name}")


@pytest.fixture
def operator(kube: KubeControlPlane, namespace: str, tmp_path: Path) -> Iterator[OperatorProcess]:
    token = install_operator_rbac(kube, namespace)
    process = OperatorProcess(tmp_path / "operator", kube.apiserver, token, [namespace])
    process.start_first()
    try:
        yield process
    finally:
        process.stop()


def cluster_body(name: str, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "kafscale.io/v1alpha1",
        "kind": "KafscaleCluster",
        "metadata": {"name": name},
        "spec": {
            "storage": {"bucket": "kafscale-data", "credentialsSecret": "s3"},
            "metadata": {"etcd": {"endpoints": ["etcd-0.etcd:2379", "etcd-1.etcd:2379"]}},
            "brokers": {"replicas": 3},
        },
    }
    body["spec"].update(spec)
    return body


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond["type"] == kind:
            return dict(cond)
    return {}


def set_ready(kube: KubeControlPlane, ns: str, name: str, replicas: int, ready: int) -> None:
    """What the StatefulSet controller and kubelets would report."""
    path = f"{STS.format(ns=ns)}/{name}"
    sts = kube.apiserver.ok("GET", path)
    kube.apiserver.set_status(
        path,
        {
            "observedGeneration": sts["metadata"]["generation"],
            "replicas": replicas,
            "readyReplicas": ready,
            "currentReplicas": replicas,
            "updatedReplicas": replicas,
            "availableReplicas": ready,
        },
    )


def test_a_cluster_gets_its_objects_status_and_garbage_collection(
    kube: KubeControlPlane, namespace: str, operator: OperatorProcess
) -> None:
    api = kube.apiserver
    api.ok("POST", CLUSTER.format(ns=namespace), cluster_body("demo"))
    sts = api.wait_for(
        f"{STS.format(ns=namespace)}/demo-broker", lambda o: True, what="StatefulSet"
    )
    assert sts["spec"]["replicas"] == 3
    owner = sts["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("KafscaleCluster", "demo", True)
    for path in (
        f"/api/v1/namespaces/{namespace}/configmaps/demo-config",
        f"/api/v1/namespaces/{namespace}/services/demo-brokers",
        f"/api/v1/namespaces/{namespace}/services/demo-bootstrap",
        f"/api/v1/namespaces/{namespace}/secrets/demo-admin-token",
        f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets/demo-broker",
    ):
        assert api.request("GET", path)[0] == 200, path
    config = api.ok("GET", f"/api/v1/namespaces/{namespace}/configmaps/demo-config")
    assert config["data"]["KAFSCALE_ETCD_ENDPOINTS"] == "etcd-0.etcd:2379,etcd-1.etcd:2379"
    assert config["data"]["KAFSCALE_S3_NAMESPACE"] == f"{namespace}-demo"

    # No pod runs: not ready, with the reason.
    cluster = api.wait_for(
        f"{CLUSTER.format(ns=namespace)}/demo",
        lambda o: condition(o, "Ready").get("reason") == "BrokersNotReady",
        what="Ready=False BrokersNotReady",
    )
    assert condition(cluster, "Ready")["status"] == "False"
    assert "0 of 3 brokers are ready" in condition(cluster, "Ready")["message"]
    assert cluster["status"]["bootstrap"] == f"demo-bootstrap.{namespace}.svc.cluster.local:9092"

    set_ready(kube, namespace, "demo-broker", 3, 2)
    cluster = api.wait_for(
        f"{CLUSTER.format(ns=namespace)}/demo",
        lambda o: condition(o, "Degraded").get("status") == "True",
        what="Degraded with 2 of 3 ready",
    )
    assert "2 of 3 brokers are ready" in condition(cluster, "Degraded")["message"]
    set_ready(kube, namespace, "demo-broker", 3, 3)
    cluster = api.wait_for(
        f"{CLUSTER.format(ns=namespace)}/demo",
        lambda o: condition(o, "Ready").get("status") == "True",
        what="Ready with 3 of 3",
    )
    assert condition(cluster, "Degraded")["status"] == "False"
    assert cluster["status"]["brokers"] == {"desired": 3, "current": 3, "ready": 3}

    # Deleting the cluster deletes everything it owns (Kubernetes' garbage collector).
    api.ok("DELETE", f"{CLUSTER.format(ns=namespace)}/demo")
    api.wait_gone(f"{STS.format(ns=namespace)}/demo-broker")
    api.wait_gone(f"/api/v1/namespaces/{namespace}/configmaps/demo-config")
    api.wait_gone(f"/api/v1/namespaces/{namespace}/secrets/demo-admin-token")


def test_edits_are_applied_and_what_is_no_longer_asked_for_is_deleted(
    kube: KubeControlPlane, namespace: str, operator: OperatorProcess
) -> None:
    api = kube.apiserver
    path = f"{CLUSTER.format(ns=namespace)}/edit"
    api.ok("POST", CLUSTER.format(ns=namespace), cluster_body("edit"))
    sts_path = f"{STS.format(ns=namespace)}/edit-broker"
    sts = api.wait_for(sts_path, lambda o: True)
    first_hash = sts["spec"]["template"]["metadata"]["annotations"]["kafscale.io/config-hash"]

    # A setting: the ConfigMap changes and so does the pods' hash (the brokers roll).
    api.ok(
        "PATCH",
        path,
        {"spec": {"config": {"KAFSCALE_LOG_LEVEL": "debug"}}},
        "application/merge-patch+json",
    )
    sts = api.wait_for(
        sts_path,
        lambda o: (
            o["spec"]["template"]["metadata"]["annotations"]["kafscale.io/config-hash"]
            != first_hash
        ),
        what="the config hash to change",
    )
    config = api.ok("GET", f"/api/v1/namespaces/{namespace}/configmaps/edit-config")
    assert config["data"]["KAFSCALE_LOG_LEVEL"] == "debug"

    # Autoscaling on: an HPA, and the StatefulSet's replicas are the HPA's to set.
    hpa = f"/apis/autoscaling/v2/namespaces/{namespace}/horizontalpodautoscalers/edit-broker"
    api.ok(
        "PATCH",
        path,
        {"spec": {"autoscaling": {"minReplicas": 2, "maxReplicas": 6}}},
        "application/merge-patch+json",
    )
    found = api.wait_for(hpa, lambda o: True, what="the HPA")
    assert (found["spec"]["minReplicas"], found["spec"]["maxReplicas"]) == (2, 6)
    api.ok(
        "PATCH",
        f"{sts_path}/scale",
        {"spec": {"replicas": 5}},
        "application/merge-patch+json",
    )  # as the HPA would
    api.ok(
        "PATCH",
        path,
        {"spec": {"config": {"KAFSCALE_LOG_LEVEL": "info"}}},
        "application/merge-patch+json",
    )
    api.wait_for(
        f"/api/v1/namespaces/{namespace}/configmaps/edit-config",
        lambda o: o["data"]["KAFSCALE_LOG_LEVEL"] == "info",
    )
    assert api.ok("GET", sts_path)["spec"]["replicas"] == 5  # the operator left it alone

    # Autoscaling off: the HPA goes (the prune), the spec's replicas come back.
    api.ok(
        "PATCH",
        path,
        {"spec": {"autoscaling": None, "brokers": {"replicas": 6}}},
        "application/merge-patch+json",
    )
    api.wait_gone(hpa)
    api.wait_for(sts_path, lambda o: o["spec"]["replicas"] == 6, what="replicas 6")


def test_scale_down_removes_one_ready_broker_at_a_time(
    kube: KubeControlPlane, namespace: str, operator: OperatorProcess
) -> None:
    api = kube.apiserver
    path = f"{CLUSTER.format(ns=namespace)}/shrink"
    sts_path = f"{STS.format(ns=namespace)}/shrink-broker"
    api.ok("POST", CLUSTER.format(ns=namespace), cluster_body("shrink", brokers={"replicas": 4}))
    api.wait_for(sts_path, lambda o: o["spec"]["replicas"] == 4)
    set_ready(kube, namespace, "shrink-broker", 4, 4)

    api.ok("PATCH", path, {"spec": {"brokers": {"replicas": 2}}}, "application/merge-patch+json")
    api.wait_for(sts_path, lambda o: o["spec"]["replicas"] == 3, what="one step down")
    # The step's own reconcile says "one broker at a time"; the next ones, which see the
    # StatefulSet's status lag its spec, say what they wait for.
    cluster = api.wait_for(
        path,
        lambda o: (
            "waiting for the previous broker to stop"
            in condition(o, "Reconciling").get("message", "")
        ),
        what="Reconciling ScalingDown, waiting for the previous broker",
    )
    assert condition(cluster, "Reconciling")["reason"] == "ScalingDown"
    # The StatefulSet still reports the fourth pod (terminating, draining): no next step.
    set_ready(kube, namespace, "shrink-broker", 4, 3)
    cluster = api.wait_for(
        path,
        lambda o: "previous broker" in condition(o, "Reconciling").get("message", ""),
    )
    assert api.ok("GET", sts_path)["spec"]["replicas"] == 3
    # It is gone and the three left are ready: the next broker may go.
    set_ready(kube, namespace, "shrink-broker", 3, 3)
    api.wait_for(sts_path, lambda o: o["spec"]["replicas"] == 2, what="the second step")
    set_ready(kube, namespace, "shrink-broker", 2, 2)
    api.wait_for(
        path,
        lambda o: (
            condition(o, "Reconciling").get("status") == "False"
            and condition(o, "Ready").get("status") == "True"
        ),
        what="done: Ready, not Reconciling",
    )

    # Up is at once.
    api.ok("PATCH", path, {"spec": {"brokers": {"replicas": 5}}}, "application/merge-patch+json")
    api.wait_for(sts_path, lambda o: o["spec"]["replicas"] == 5, what="scale up to 5")


def test_managed_etcd_and_an_invalid_spec(
    kube: KubeControlPlane, namespace: str, operator: OperatorProcess
) -> None:
    api = kube.apiserver
    body = cluster_body(
        "managed",
        metadata={"etcd": {"managed": {"replicas": 3, "snapshots": {"schedule": "*/30 * * * *"}}}},
    )
    api.ok("POST", CLUSTER.format(ns=namespace), body)
    etcd = api.wait_for(f"{STS.format(ns=namespace)}/managed-etcd", lambda o: True)
    assert etcd["spec"]["replicas"] == 3
    cron = api.wait_for(
        f"/apis/batch/v1/namespaces/{namespace}/cronjobs/managed-backup", lambda o: True
    )
    assert cron["spec"]["schedule"] == "*/30 * * * *"
    config = api.ok("GET", f"/api/v1/namespaces/{namespace}/configmaps/managed-config")
    assert config["data"]["KAFSCALE_ETCD_ENDPOINTS"].startswith(
        f"managed-etcd-0.managed-etcd.{namespace}.svc.cluster.local:2379,"
    )
    cluster = api.wait_for(
        f"{CLUSTER.format(ns=namespace)}/managed",
        lambda o: "etcd members are ready" in condition(o, "Ready").get("message", ""),
    )
    assert cluster["status"]["etcd"]["replicas"] == 3

    # Switching to external endpoints removes the managed etcd's objects.
    api.ok(
        "PATCH",
        f"{CLUSTER.format(ns=namespace)}/managed",
        {"spec": {"metadata": {"etcd": {"managed": None, "endpoints": ["etcd:2379"]}}}},
        "application/merge-patch+json",
    )
    api.wait_gone(f"{STS.format(ns=namespace)}/managed-etcd")
    api.wait_gone(f"/apis/batch/v1/namespaces/{namespace}/cronjobs/managed-backup")

    # A spec the schema accepts but the operator cannot carry out: said in the status.
    bad = cluster_body("bad", config={"KAFSCALE_NO_SUCH_SETTING": "1"})
    api.ok("POST", CLUSTER.format(ns=namespace), bad)
    cluster = api.wait_for(
        f"{CLUSTER.format(ns=namespace)}/bad",
        lambda o: condition(o, "Ready").get("reason") == "InvalidSpec",
        what="InvalidSpec",
    )
    assert (
        "spec.config.KAFSCALE_NO_SUCH_SETTING: not a KafScale setting"
        in condition(cluster, "Ready")["message"]
    )
    assert api.request("GET", f"{STS.format(ns=namespace)}/bad-broker")[0] == 404


SERVICE_MONITOR_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "servicemonitors.monitoring.coreos.com"},
    "spec": {
        "group": "monitoring.coreos.com",
        "scope": "Namespaced",
        "names": {
            "kind": "ServiceMonitor",
            "plural": "servicemonitors",
            "singular": "servicemonitor",
            "listKind": "ServiceMonitorList",
        },
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "x-kubernetes-preserve-unknown-fields": True,
                    }
                },
            }
        ],
    },
}


def test_a_service_monitor_once_its_crd_is_served_and_changes_made_while_the_operator_was_down(
    kube: KubeControlPlane, namespace: str, operator: OperatorProcess
) -> None:
    api = kube.apiserver
    monitors = f"/apis/monitoring.coreos.com/v1/namespaces/{namespace}/servicemonitors"
    status, _ = api.request(
        "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", SERVICE_MONITOR_CRD
    )
    assert status in (201, 409)
    api.kubectl(
        "wait",
        "--for=condition=Established",
        "crd/servicemonitors.monitoring.coreos.com",
        "--timeout=60s",
    )
    api.ok("POST", CLUSTER.format(ns=namespace), cluster_body("watched"))
    monitor = api.wait_for(f"{monitors}/watched-broker", lambda o: True, what="ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    headless = api.ok("GET", f"/api/v1/namespaces/{namespace}/services/watched-brokers")
    selected = monitor["spec"]["selector"]["matchLabels"]
    assert selected.items() <= headless["metadata"]["labels"].items()
    api.ok(
        "PATCH",
        f"{CLUSTER.format(ns=namespace)}/watched",
        {"spec": {"monitoring": {"serviceMonitor": False}}},
        "application/merge-patch+json",
    )
    api.wait_gone(f"{monitors}/watched-broker")

    # The operator is down while the spec changes: it catches up when it comes back.
    operator.stop()
    api.ok(
        "PATCH",
        f"{CLUSTER.format(ns=namespace)}/watched",
        {"spec": {"brokers": {"replicas": 7}}},
        "application/merge-patch+json",
    )
    operator.start()
    api.wait_for(
        f"{STS.format(ns=namespace)}/watched-broker",
        lambda o: o["spec"]["replicas"] == 7,
        what="the change made while the operator was down",
    )
