"""A KafscaleCluster's objects, continued from test_operator_cluster.py (same specs and helpers):
resources, security and the pod template; autoscaling and the paced scale-down; the config
hash that rolls the brokers."""

from __future__ import annotations

import tempfile

import kubernetes_validate
import pytest

from kafscale.ipc.shm_names import SHM_DIR
from kafscale.operator import brokers, cluster
from kafscale.operator.objects import digest
from kafscale.settings import SETTINGS_BY_FIELD, parse_size
from tests.unit.test_k8s_manifests import KUBERNETES_VERSIONS, quantity_bytes
from tests.unit.test_operator_cluster import (
    ADMIN,
    FIXED,
    FULL,
    MINIMAL,
    SPECS,
    Obj,
    broker_container,
    broker_pod,
    find,
    make,
    objects,
    of_kind,
    with_,
)

# --- resources, security, the template ---------------------------------------------------------


@pytest.mark.parametrize("spec", SPECS.values(), ids=SPECS.keys())
def test_memory_holds_the_brokers_budgets(spec: Obj) -> None:
    found = objects(spec)
    container, pod_spec = broker_container(found), broker_pod(found)["spec"]
    (shm,) = [m["name"] for m in container["volumeMounts"] if m["mountPath"] == SHM_DIR]
    (volume,) = [v for v in pod_spec["volumes"] if v["name"] == shm]
    assert volume["emptyDir"]["medium"] == "Memory"
    buffers = parse_size(
        spec.get("config", {}).get(
            "KAFSCALE_BUFFER_BYTES", SETTINGS_BY_FIELD["buffer_bytes"].default
        )
    )
    assert quantity_bytes(volume["emptyDir"]["sizeLimit"]) >= 2 * buffers
    caches = ("cache_size", "index_cache_size", "compaction_buffer_bytes")
    budget = buffers + sum(parse_size(SETTINGS_BY_FIELD[field].default) for field in caches)
    assert brokers.memory_budget(make(spec)) == budget
    resources = container["resources"]
    assert quantity_bytes(resources["limits"]["memory"]) > budget
    assert resources["requests"]["memory"] == resources["limits"]["memory"]


def test_the_default_resources_are_used_when_none_are_given() -> None:
    assert broker_container(objects(MINIMAL))["resources"] == brokers.DEFAULT_RESOURCES
    assert broker_container(objects(FIXED))["resources"] == FIXED["brokers"]["resources"]


@pytest.mark.parametrize("spec", SPECS.values(), ids=SPECS.keys())
def test_the_pod_runs_unprivileged_on_a_read_only_root(spec: Obj) -> None:
    found = objects(spec)
    container, pod_spec = broker_container(found), broker_pod(found)["spec"]
    assert pod_spec["securityContext"]["runAsNonRoot"] is True
    assert pod_spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert pod_spec["automountServiceAccountToken"] is False
    # A Service named like a setting (kafscale-...) would inject KAFSCALE_* variables.
    assert pod_spec["enableServiceLinks"] is False
    writable = {m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")}
    assert writable >= {tempfile.gettempdir(), SHM_DIR}


def test_the_template_merges_over_the_pod() -> None:
    found = objects(FULL)
    plain = objects(with_(FULL, "brokers.template", {}))
    pod, before = broker_pod(found), broker_pod(plain)
    assert pod["metadata"]["labels"] == {**before["metadata"]["labels"], "team": "data"}
    assert pod["metadata"]["annotations"] == {
        **before["metadata"]["annotations"],
        "owner": "data-team",
    }
    spec = pod["spec"]
    assert spec["nodeSelector"] == {"pool": "kafka"}
    assert spec["tolerations"] == [
        {"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}
    ]
    assert [c["name"] for c in spec["containers"]] == ["broker", "sidecar"]
    assert spec["containers"][1] == {
        "name": "sidecar",
        "image": "busybox:1",
        "command": ["sleep", "infinity"],
    }
    # The broker's variables are merged by name: all generated ones kept, in order, the new
    # one after them.
    generated = broker_container(plain)["env"]
    assert broker_container(found)["env"] == [*generated, {"name": "EXTRA", "value": "1"}]
    # Everything else of the pod is the generated one.
    rest = {k: v for k, v in spec.items() if k not in ("nodeSelector", "tolerations", "containers")}
    assert rest == {k: v for k, v in before["spec"].items() if k != "containers"}


def test_the_template_can_change_a_generated_field_by_name() -> None:
    template = {
        "spec": {
            "containers": [
                {"name": "broker", "resources": {"limits": {"memory": "6Gi"}}},
            ],
            "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "2Gi"}}],
        }
    }
    found = objects(with_(MINIMAL, "brokers.template", template))
    container = broker_container(found)
    assert container["resources"] == {
        "requests": {"cpu": "2", "memory": "3Gi"},
        "limits": {"memory": "6Gi"},
    }
    (tmp,) = [v for v in broker_pod(found)["spec"]["volumes"] if v["name"] == "tmp"]
    assert tmp == {"name": "tmp", "emptyDir": {"sizeLimit": "2Gi"}}
    kubernetes_validate.validate(
        find(found, "StatefulSet", "demo-broker"), KUBERNETES_VERSIONS[-1], strict=True
    )


def test_a_template_cannot_change_the_selector_labels() -> None:
    theirs = {
        "app.kubernetes.io/name": "mine",
        "app.kubernetes.io/instance": "other",
        "app.kubernetes.io/component": "db",
        "app.kubernetes.io/managed-by": "helm",
        "team": "data",
    }
    found = objects(with_(MINIMAL, "brokers.template", {"metadata": {"labels": theirs}}))
    sts = find(found, "StatefulSet", "demo-broker")
    labels = sts["spec"]["template"]["metadata"]["labels"]
    assert labels == {
        "app.kubernetes.io/name": "kafscale",
        "app.kubernetes.io/instance": "demo",
        "app.kubernetes.io/component": "broker",
        "app.kubernetes.io/managed-by": "kafscale-operator",
        "team": "data",
    }
    assert sts["spec"]["selector"]["matchLabels"].items() <= labels.items()
    for service in of_kind(found, "Service"):
        assert service["spec"]["selector"].items() <= labels.items()


# --- autoscaling and scaling down ---------------------------------------------------------------


def external_services(found: list[Obj]) -> list[str]:
    return sorted(
        s["metadata"]["name"]
        for s in of_kind(found, "Service")
        if s["spec"].get("type") in ("NodePort", "LoadBalancer")
    )


def test_autoscaling_leaves_the_replicas_to_an_hpa_that_scales_down_one_pod_a_minute() -> None:
    desired = cluster.desired(make(FULL), ADMIN)
    found = desired.objects
    assert "replicas" not in find(found, "StatefulSet", "demo-broker")["spec"]
    assert (desired.broker_replicas, desired.scaling) == (2, "")
    hpa = find(found, "HorizontalPodAutoscaler", "demo-broker")["spec"]
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (2, 4)
    assert hpa["metrics"] == [
        {
            "type": "Resource",
            "resource": {
                "name": "cpu",
                "target": {"type": "Utilization", "averageUtilization": 60},
            },
        }
    ]
    assert hpa["behavior"]["scaleDown"] == {
        "stabilizationWindowSeconds": 300,
        "policies": [{"type": "Pods", "value": 1, "periodSeconds": 60}],
    }
    assert "scaleUp" not in hpa["behavior"]  # up: Kubernetes' default, at once
    # A Service per external listener for every broker the HPA may run.
    assert external_services(found) == sorted(
        f"demo-b{n}-{suffix}" for n in range(4) for suffix in ("external", "lb")
    )


def test_without_autoscaling_the_statefulset_has_the_replicas_and_no_hpa() -> None:
    found = objects(FIXED)
    assert find(found, "StatefulSet", "demo-broker")["spec"]["replicas"] == 3
    assert of_kind(found, "HorizontalPodAutoscaler") == []
    assert external_services(found) == [f"demo-broker-{n}-external" for n in range(3)]
    ports = [find(found, "Service", f"demo-broker-{n}-external")["spec"]["ports"] for n in range(3)]
    assert [p[0]["nodePort"] for p in ports] == [30100, 30101, 30102]
    assert external_services(objects(MINIMAL)) == []


PACING = [
    # (want, spec.replicas now, status.replicas, ready, controller current) -> (apply, waiting)
    pytest.param(3, None, 0, 0, True, 3, "", id="first-apply"),
    pytest.param(5, 3, 3, 1, True, 5, "", id="up-at-once-ready-or-not"),
    pytest.param(5, 3, 4, 2, False, 5, "", id="up-while-the-controller-is-behind"),
    pytest.param(3, 3, 3, 3, True, 3, "", id="steady"),
    pytest.param(0, 1, 1, 1, True, 0, "", id="down-to-zero"),
    pytest.param(1, 4, 4, 4, True, 3, "scaling down to 1: one broker at a time", id="one-step"),
    pytest.param(2, 3, 3, 3, True, 2, "", id="the-last-step"),
    pytest.param(
        1, 3, 4, 3, True, 3, "waiting for the previous broker to stop", id="a-pod-still-stopping"
    ),
    pytest.param(
        1, 3, 3, 3, False, 3, "waiting for the previous broker to stop", id="controller-behind"
    ),
    pytest.param(
        1, 3, 3, 2, True, 3, "waiting for all 3 brokers to be ready (2 are)", id="not-all-ready"
    ),
    pytest.param(1, 3, 3, 0, True, 3, "waiting for all 3 brokers", id="none-ready"),
]


@pytest.mark.parametrize(
    ("want", "now", "status_replicas", "ready", "current", "applied", "waiting"), PACING
)
def test_scaling_is_paced(
    want: int,
    now: int | None,
    status_replicas: int,
    ready: int,
    current: bool,
    applied: int,
    waiting: str,
) -> None:
    observed = cluster.Observed(
        broker_replicas=now,
        broker_status_replicas=status_replicas,
        broker_ready_replicas=ready,
        broker_observed_current=current,
    )
    parsed = make(with_(MINIMAL, "brokers.replicas", want))
    replicas, why = cluster.broker_replicas(parsed, observed)
    assert replicas == applied
    if waiting:
        assert waiting in why and why.startswith(f"scaling down to {want}: ")
    else:
        assert why == ""
    # desired() applies the same step to the StatefulSet and says why in Desired.scaling.
    desired = cluster.desired(parsed, observed)
    assert (desired.broker_replicas, desired.scaling) == (replicas, why)
    assert find(desired.objects, "StatefulSet", "demo-broker")["spec"]["replicas"] == replicas


def test_scaling_down_step_by_step_reaches_the_spec_one_broker_at_a_time() -> None:
    parsed = make(with_(MINIMAL, "brokers.replicas", 1))
    now, steps = 5, []
    while True:
        # Each step done: the controller caught up, the pod gone, the rest ready.
        observed = cluster.Observed(
            broker_replicas=now, broker_status_replicas=now, broker_ready_replicas=now
        )
        applied, _ = cluster.broker_replicas(parsed, observed)
        if applied == now:
            break
        steps.append(applied)
        now = applied
    assert steps == [4, 3, 2, 1]


def test_the_draining_broker_keeps_its_external_service() -> None:
    """Lowering the StatefulSet from 3 to 2 starts broker 2's preStop drain, which hands its
    partitions over while external clients still reach it (desired's comment: "while scaling
    down for the brokers still draining"). Its Service must outlive the step that stops it."""
    spec = with_(FIXED, "brokers.replicas", 1)
    observed = cluster.Observed(
        broker_replicas=3, broker_status_replicas=3, broker_ready_replicas=3
    )
    desired = cluster.desired(make(spec), observed)
    assert desired.broker_replicas == 2  # this reconcile stops broker 2
    assert "demo-broker-2-external" in external_services(desired.objects)
    # Once it is gone (status.replicas caught up), its Service goes on the next reconcile.
    gone = cluster.Observed(broker_replicas=2, broker_status_replicas=2, broker_ready_replicas=2)
    later = cluster.desired(make(spec), gone)
    assert later.broker_replicas == 1
    assert "demo-broker-2-external" not in external_services(later.objects)


# --- the config hash ----------------------------------------------------------------------------


def config_hash(spec: Obj, observed: cluster.Observed = ADMIN) -> str:
    found = objects(spec, observed)
    annotations = broker_pod(found)["metadata"]["annotations"]
    assert annotations["kafscale.io/config-hash"] == digest(
        find(found, "ConfigMap", "demo-config")["data"]
    )
    return str(annotations["kafscale.io/config-hash"])


def test_the_config_hash_changes_with_a_setting() -> None:
    base = config_hash(FIXED)
    changes = [
        with_(FIXED, "config", {"KAFSCALE_LOG_LEVEL": "debug"}),
        with_(FIXED, "storage.region", "eu-west-1"),
        with_(FIXED, "brokers.tls.clientAuth", "requested"),
        with_(FIXED, "brokers.authorization.superUsers", ["User:ops"]),
        with_(FIXED, "metadata.etcd", {"endpoints": ["etcd:2379"]}),
    ]
    hashes = [config_hash(spec) for spec in changes]
    assert base not in hashes and len(set(hashes)) == len(hashes)
    # The admin's name is a setting too (a super user), once its Secret is read.
    assert config_hash(FIXED, cluster.Observed(admin_user="root")) != base


def test_the_config_hash_does_not_change_otherwise() -> None:
    base = config_hash(FIXED)
    same = [
        with_(FIXED, "brokers.replicas", 7),
        with_(FIXED, "image", "kafscale:2"),
        with_(FIXED, "brokers.resources", {"requests": {"cpu": "4", "memory": "8Gi"}}),
        with_(FIXED, "brokers.template", {"metadata": {"labels": {"team": "x"}}}),
        with_(FIXED, "autoscaling", {"minReplicas": 1, "maxReplicas": 9}),
        with_(FIXED, "brokers.terminationGracePeriodSeconds", 600),
    ]
    assert [config_hash(spec) for spec in same] == [base] * len(same)
    assert config_hash(FIXED) == base  # stable from one reconcile to the next
