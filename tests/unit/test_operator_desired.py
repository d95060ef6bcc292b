"""A KafscaleCluster's objects as pure functions (kafscale/operator/model.py, cluster.py,
brokers.py, services.py, etcd.py): valid for Kubernetes, wired to each other, and carrying
settings, ports, probes and budgets the broker really has (the checks of test_k8s_manifests.py,
for the generated StatefulSet)."""

from __future__ import annotations

import copy
import subprocess
from typing import Any

import kubernetes_validate
import pytest

from kafscale import cli, config
from kafscale.ipc.shm_names import SHM_DIR
from kafscale.operator import brokers, cluster, etcd
from kafscale.operator.model import Cluster, SpecError, parse_cluster
from kafscale.operator.objects import LABEL_MANAGED_BY, merge
from kafscale.security import listeners
from kafscale.supervisor import arbiter, broker
from tests.unit.test_k8s_manifests import quantity_bytes

MINIMAL: dict[str, Any] = {
    "storage": {"bucket": "data"},
    "metadata": {"etcd": {"endpoints": ["etcd-0:2379", "etcd-1:2379"]}},
}
FULL: dict[str, Any] = {
    "image": "registry.example.com/kafscale:9",
    "imagePullSecrets": ["regcred"],
    "storage": {
        "bucket": "data",
        "region": "eu-west-1",
        "endpoint": "https://minio:9000",
        "pathStyle": True,
        "credentialsSecret": "s3",
        "ca": {"name": "s3-ca", "key": "ca.pem"},
    },
    "brokers": {
        "replicas": 3,
        "listeners": [
            {"name": "INTERNAL", "port": 9092},
            {"name": "SECURE", "port": 9095, "tls": True, "sasl": True},
            {
                "name": "EXTERNAL",
                "port": 9094,
                "tls": True,
                "sasl": True,
                "external": {
                    "type": "NodePort",
                    "nodePortBase": 31090,
                    "advertisedHostTemplate": "b{id}.kafka.example.com",
                },
            },
            {
                "name": "LB",
                "port": 9096,
                "tls": True,
                "external": {
                    "type": "LoadBalancer",
                    "advertisedHostTemplate": "lb-{id}.example.com",
                    "annotations": {"external-dns.alpha.kubernetes.io/hostname": "x"},
                },
            },
        ],
        "tls": {"secretName": "tls", "clientAuth": "requested"},
        "authentication": {"adminSecret": "admin"},
        "authorization": {"type": "acl", "superUsers": ["User:ops"]},
        "template": {
            "metadata": {"labels": {"team": "data"}, "annotations": {"a": "b"}},
            "spec": {
                "nodeSelector": {"pool": "kafka"},
                "tolerations": [{"key": "dedicated", "operator": "Exists"}],
                "containers": [
                    {"name": "broker", "env": [{"name": "EXTRA", "value": "1"}]},
                    {"name": "sidecar", "image": "busybox"},
                ],
            },
        },
    },
    "metadata": {
        "etcd": {
            "managed": {
                "replicas": 3,
                "storage": {"size": "4Gi", "storageClassName": "fast"},
                "snapshots": {"schedule": "0 * * * *", "keep": 5},
                "restore": {"snapshot": "metadata-backups/x.json.gz"},
            }
        }
    },
    "config": {"KAFSCALE_LOG_LEVEL": "debug", "KAFSCALE_BUFFER_BYTES": "256MiB"},
    "autoscaling": {"minReplicas": 2, "maxReplicas": 4, "targetCPUUtilizationPercentage": 60},
    "monitoring": {"serviceMonitor": True},
}


def make(spec: dict[str, Any], name: str = "demo") -> Cluster:
    return parse_cluster(
        {
            "metadata": {"name": name, "namespace": "ns", "uid": "uid-1", "generation": 2},
            "spec": copy.deepcopy(spec),
        },
        "kafscale:default",
    )


def objects(spec: dict[str, Any], observed: cluster.Observed | None = None) -> list[dict[str, Any]]:
    return cluster.desired(make(spec), observed or cluster.Observed(admin_user="admin")).objects


def find(found: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (match,) = [o for o in found if o["kind"] == kind and o["metadata"]["name"] == name]
    return match


def pod_of(found: list[dict[str, Any]]) -> dict[str, Any]:
    return find(found, "StatefulSet", "demo-broker")["spec"]["template"]


def container(found: list[dict[str, Any]]) -> dict[str, Any]:
    (match,) = [c for c in pod_of(found)["spec"]["containers"] if c["name"] == "broker"]
    return match


# --- the spec ----------------------------------------------------------------------------------


def test_defaults() -> None:
    parsed = make(MINIMAL)
    assert parsed.image == "kafscale:default"
    assert parsed.spec.brokers.replicas == 3
    assert [(li.name, li.port, li.protocol) for li in parsed.spec.brokers.listeners] == [
        ("INTERNAL", 9092, "PLAINTEXT")
    ]
    assert parsed.spec.brokers.authentication.mechanisms == ["SCRAM-SHA-512", "SCRAM-SHA-256"]
    assert make(FULL).spec.autoscaling is not None
    assert make(FULL).spec.autoscaling.target_cpu_utilization_percentage == 60


def with_(path: str, value: Any) -> dict[str, Any]:
    spec = copy.deepcopy(FULL)
    *parents, last = path.split(".")
    node: Any = spec
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    node[last] = value
    return spec


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        (with_("brokers.replicas", -1), "spec.brokers.replicas"),
        (with_("brokers.listeners", []), "spec.brokers.listeners"),
        (with_("brokers.listeners.0.name", "lower"), r"spec.brokers.listeners\[0\].name"),
        (with_("brokers.listeners.1.name", "INTERNAL"), r"spec.brokers.listeners\[1\].name"),
        (with_("brokers.listeners.1.port", 9092), r"spec.brokers.listeners\[1\].port"),
        (with_("brokers.listeners.1.port", 9093), r"spec.brokers.listeners\[1\].port"),
        (with_("brokers.tls", None), r"spec.brokers.listeners\[1\].tls"),
        (with_("brokers.authentication", {}), r"spec.brokers.listeners\[1\].sasl"),
        (
            with_("brokers.listeners.2.external.nodePortBase", 80),
            r"spec.brokers.listeners\[2\].external.nodePortBase",
        ),
        (
            with_("brokers.listeners.2.external.advertisedHostTemplate", "$(rm -rf)"),
            r"spec.brokers.listeners\[2\].external.advertisedHostTemplate",
        ),
        (
            with_("brokers.listeners.3.external.advertisedHostTemplate", ""),
            r"spec.brokers.listeners\[3\].external.advertisedHostTemplate",
        ),
        (with_("metadata.etcd.endpoints", ["e:2379"]), "spec.metadata.etcd"),
        (with_("metadata.etcd.managed.replicas", 2), "spec.metadata.etcd.managed.replicas"),
        (
            with_("metadata.etcd.managed.snapshots.schedule", "hourly"),
            "spec.metadata.etcd.managed.snapshots.schedule",
        ),
        (with_("autoscaling.minReplicas", 9), "spec.autoscaling"),
        (with_("config", {"KAFSCALE_NOPE": "1"}), "spec.config.KAFSCALE_NOPE"),
        (with_("config", {"LOG_LEVEL": "1"}), "spec.config.LOG_LEVEL"),
        (with_("config", {"KAFSCALE_S3_BUCKET": "x"}), "spec.config.KAFSCALE_S3_BUCKET"),
        (with_("config", {"KAFSCALE_ETCD_PASSWORD": "x"}), "spec.config.KAFSCALE_ETCD_PASSWORD"),
        (with_("config", {"KAFSCALE_BUFFER_BYTES": "lots"}), "spec.config.KAFSCALE_BUFFER_BYTES"),
        (with_("brokers.replicas", "three"), "spec.brokers.replicas"),
    ],
)
def test_specs_the_operator_cannot_carry_out_name_the_field(
    spec: dict[str, Any], field: str
) -> None:
    with pytest.raises(SpecError, match=f"^{field}"):
        make(spec)


def test_acls_need_authenticated_clients_and_some_listener_is_internal() -> None:
    with pytest.raises(SpecError, match=r"^spec\.brokers\.authorization"):
        make({**MINIMAL, "brokers": {"authorization": {"type": "acl"}}})
    external_only = {
        **MINIMAL,
        "brokers": {
            "listeners": [
                {
                    "name": "EXT",
                    "port": 9094,
                    "external": {"type": "LoadBalancer", "advertisedHostTemplate": "b{id}.x"},
                }
            ]
        },
    }
    with pytest.raises(SpecError, match="must be internal"):
        make(external_only)


# --- the objects -------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", [MINIMAL, FULL], ids=["minimal", "full"])
@pytest.mark.parametrize("version", ["1.28", kubernetes_validate.latest_version()])
def test_every_object_is_valid_for_kubernetes(spec: dict[str, Any], version: str) -> None:
    for obj in objects(spec):
        if obj["kind"] == "ServiceMonitor":
            continue  # not Kubernetes' own: its CRD checks it
        kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize("spec", [MINIMAL, FULL], ids=["minimal", "full"])
def test_every_object_is_owned_labelled_and_namespaced(spec: dict[str, Any]) -> None:
    for obj in objects(spec):
        meta = obj["metadata"]
        assert meta["namespace"] == "ns"
        assert meta["labels"][LABEL_MANAGED_BY] == "kafscale-operator"
        (owner,) = meta["ownerReferences"]
        assert owner == {
            "apiVersion": "kafscale.io/v1alpha1",
            "kind": "KafscaleCluster",
            "name": "demo",
            "uid": "uid-1",
            "controller": True,
            "blockOwnerDeletion": True,
        }


def test_selectors_select_the_pods_they_mean() -> None:
    found = objects(FULL)
    sts = find(found, "StatefulSet", "demo-broker")
    pod_labels = sts["spec"]["template"]["metadata"]["labels"]
    assert sts["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert pod_labels["team"] == "data"  # the template's labels are added, not instead
    for name in ("demo-brokers", "demo-bootstrap"):
        assert find(found, "Service", name)["spec"]["selector"].items() <= pod_labels.items()
    external = find(found, "Service", "demo-b1-external")["spec"]["selector"]
    assert external["statefulset.kubernetes.io/pod-name"] == "demo-broker-1"
    etcd_sts = find(found, "StatefulSet", "demo-etcd")
    assert (
        etcd_sts["spec"]["selector"]["matchLabels"].items()
        <= etcd_sts["spec"]["template"]["metadata"]["labels"].items()
    )
    assert (
        find(found, "Service", "demo-etcd")["spec"]["selector"]
        == (etcd_sts["spec"]["selector"]["matchLabels"])
    )
    assert sts["spec"]["serviceName"] == "demo-brokers"


def test_a_template_cannot_change_the_selector_labels() -> None:
    spec = with_("brokers.template.metadata.labels", {"app.kubernetes.io/instance": "other"})
    sts = find(objects(spec), "StatefulSet", "demo-broker")
    labels = sts["spec"]["template"]["metadata"]["labels"]
    assert labels["app.kubernetes.io/instance"] == "demo"


def test_the_template_merges_over_the_pod() -> None:
    found = objects(FULL)
    pod = pod_of(found)["spec"]
    assert pod["nodeSelector"] == {"pool": "kafka"}
    assert pod["tolerations"] == [{"key": "dedicated", "operator": "Exists"}]
    assert [c["name"] for c in pod["containers"]] == ["broker", "sidecar"]
    env = {e["name"] for e in container(found)["env"]}
    assert {"EXTRA", "KAFSCALE_BROKER_ID", "POD_NAME"} <= env  # merged by name, not replaced
    assert merge({"a": [1, 2]}, {"a": [3]}) == {"a": [3]}  # plain lists are replaced
    assert merge({"a": {"b": 1, "c": 2}}, {"a": {"c": 3}}) == {"a": {"b": 1, "c": 3}}


def test_the_settings_parse_as_the_broker_reads_them() -> None:
    found = objects(FULL)
    settings = find(found, "ConfigMap", "demo-config")["data"]
    assert settings["KAFSCALE_SUPER_USERS"] == "User:admin;User:ops"
    assert settings["KAFSCALE_LISTENER_SECURITY_PROTOCOL_MAP"] == (
        "INTERNAL:PLAINTEXT,SECURE:SASL_SSL,EXTERNAL:SASL_SSL,LB:SSL"
    )
    assert settings["KAFSCALE_S3_NAMESPACE"] == "ns-demo"
    assert settings["KAFSCALE_LOG_LEVEL"] == "debug"
    env = {
        **settings,
        "KAFSCALE_BROKER_ID": "1",
        "KAFSCALE_ADVERTISED_LISTENERS": advertised(FULL, 1),
        "KAFSCALE_S3_ACCESS_KEY": "a",
        "KAFSCALE_S3_SECRET_KEY": "b",
        "KAFSCALE_SASL_ADMIN_USER": "admin",
        "KAFSCALE_SASL_ADMIN_PASSWORD": "secret",
    }
    # The broker's own check of the whole configuration (files are opened later, at start).
    loaded = config.load(env)
    assert [li.name for li in loaded.kafka_listeners] == ["INTERNAL", "SECURE", "EXTERNAL", "LB"]
    names = {f"KAFSCALE_{s.upper()}" for s in config.SETTINGS_BY_FIELD}
    for var in container(found)["env"]:
        if var["name"].startswith("KAFSCALE_"):
            assert var["name"].removesuffix("_FILE") in names, var["name"]


def advertised(spec: dict[str, Any], broker_id: int) -> str:
    """KAFSCALE_ADVERTISED_LISTENERS as the container's shell computes it for pod N."""
    script = container(objects(spec))["command"][2].replace(
        "exec kafscale serve", 'printf %s "$KAFSCALE_ADVERTISED_LISTENERS"'
    )
    result = subprocess.run(
        ["/bin/sh", "-c", script],
        env={"POD_NAME": f"demo-broker-{broker_id}", "POD_NAMESPACE": "ns"},
        capture_output=True,
        text=True,
        check=True,
    )
    return result.stdout


def test_each_broker_advertises_its_own_addresses() -> None:
    text = advertised(FULL, 2)
    assert text == (
        "INTERNAL://demo-broker-2.demo-brokers.ns.svc.cluster.local:9092,"
        "SECURE://demo-broker-2.demo-brokers.ns.svc.cluster.local:9095,"
        "EXTERNAL://b2.kafka.example.com:31092,"
        "LB://lb-2.example.com:9096"
    )
    parsed = listeners.parse(
        "INTERNAL://:9092,SECURE://:9095,EXTERNAL://:9094,LB://:9096",
        text,
        "INTERNAL:PLAINTEXT,SECURE:SASL_SSL,EXTERNAL:SASL_SSL,LB:SSL",
        "0.0.0.0",
    )
    assert [(li.advertised_host, li.advertised_port) for li in parsed][2] == (
        "b2.kafka.example.com",
        31092,
    )
    nodeport = find(objects(FULL), "Service", "demo-b2-external")
    assert nodeport["spec"]["ports"][0]["nodePort"] == 31092


def test_ports_probes_and_hand_over_are_the_brokers() -> None:
    found = objects(FULL)
    broker_container = container(found)
    ports = {p["name"]: p["containerPort"] for p in broker_container["ports"]}
    assert ports == {
        "internal": 9092,
        "secure": 9095,
        "external": 9094,
        "lb": 9096,
        "metrics": 9093,
    }
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert broker_container[probe]["httpGet"]["port"] == "metrics"
    assert broker_container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert broker_container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    command = broker_container["lifecycle"]["preStop"]["exec"]["command"]
    parsed = cli.build_parser().parse_args(command[1:])
    assert (parsed.command, parsed.metrics_url) == ("drain", "http://127.0.0.1:9093")
    grace = pod_of(found)["spec"]["terminationGracePeriodSeconds"]
    assert grace > parsed.timeout + broker.HANDOVER_WAIT_S + sum(
        arbiter.STOP_GRACE_SECONDS.values()
    )
    bootstrap = find(found, "Service", "demo-bootstrap")["spec"]["ports"]
    assert [p["port"] for p in bootstrap] == [9092, 9095]  # internal listeners only


def test_memory_holds_the_budgets_at_the_default_resources() -> None:
    for spec in (MINIMAL, FULL):
        found = objects(spec)
        limit = quantity_bytes(container(found)["resources"]["limits"]["memory"])
        assert limit > brokers.memory_budget(make(spec))
        (shm,) = [v for v in pod_of(found)["spec"]["volumes"] if v["name"] == "shm"]
        buffers = 256 * 2**20 if spec is FULL else 512 * 2**20
        assert quantity_bytes(shm["emptyDir"]["sizeLimit"]) > buffers
    mounts = {m["mountPath"] for m in container(objects(MINIMAL))["volumeMounts"]}
    assert SHM_DIR in mounts


def test_secrets_are_files_or_references_never_values() -> None:
    found = objects(FULL)
    for var in container(found)["env"]:
        assert not (var["name"].endswith(("PASSWORD", "SECRET_KEY", "TOKEN")) and "value" in var), (
            var
        )
    settings = find(found, "ConfigMap", "demo-config")["data"]
    assert not any(k.endswith(("PASSWORD", "SECRET_KEY")) for k in settings)


def test_autoscaling_leaves_replicas_to_the_hpa() -> None:
    found = objects(FULL)
    assert "replicas" not in find(found, "StatefulSet", "demo-broker")["spec"]
    hpa = find(found, "HorizontalPodAutoscaler", "demo-broker")["spec"]
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (2, 4)
    assert hpa["behavior"]["scaleDown"]["policies"] == [
        {"type": "Pods", "value": 1, "periodSeconds": 60}
    ]
    # A Service per broker the HPA may run, per external listener.
    externals = [
        o
        for o in found
        if o["kind"] == "Service" and "statefulset.kubernetes.io/pod-name" in o["spec"]["selector"]
    ]
    assert len(externals) == 4 * 2
    assert "HorizontalPodAutoscaler" not in {o["kind"] for o in objects(MINIMAL)}


def test_the_config_hash_follows_the_settings_only() -> None:
    def config_hash(spec: dict[str, Any]) -> str:
        annotations = pod_of(objects(spec))["metadata"]["annotations"]
        return str(annotations["kafscale.io/config-hash"])

    base = config_hash(MINIMAL)
    assert config_hash({**MINIMAL, "brokers": {"replicas": 5}}) == base
    assert config_hash({**MINIMAL, "config": {"KAFSCALE_LOG_LEVEL": "debug"}}) != base


@pytest.mark.parametrize(
    ("want", "now", "status_replicas", "ready", "current", "applied", "waiting"),
    [
        (3, None, 0, 0, True, 3, ""),  # first apply
        (5, 3, 3, 1, True, 5, ""),  # up: at once, ready or not
        (3, 3, 3, 3, True, 3, ""),  # nothing to do
        (1, 3, 3, 3, True, 2, "one broker at a time"),  # down one step
        (2, 3, 3, 3, True, 2, ""),  # the last step
        (1, 3, 4, 3, True, 3, "previous broker to stop"),  # a pod still terminating
        (1, 3, 3, 2, True, 3, "all 3 brokers to be ready"),  # not all ready
        (1, 3, 3, 3, False, 3, "previous broker to stop"),  # controller behind
    ],
)
def test_scale_down_is_paced(
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
    replicas, why = cluster.broker_replicas(
        make({**MINIMAL, "brokers": {"replicas": want}}), observed
    )
    assert replicas == applied
    assert waiting in why if waiting else why == ""


# --- the managed etcd ---------------------------------------------------------------------------


def test_members_know_each_other_by_stable_names() -> None:
    found = objects(FULL)
    sts = find(found, "StatefulSet", "demo-etcd")
    command = sts["spec"]["template"]["spec"]["containers"][0]["command"]
    flags = dict(arg.split("=", 1) for arg in command[1:])
    members = flags["--initial-cluster"].split(",")
    assert members == [
        f"demo-etcd-{n}=http://demo-etcd-{n}.demo-etcd.ns.svc.cluster.local:2380" for n in range(3)
    ]
    assert flags["--name"] == "$(POD_NAME)"
    assert flags["--initial-advertise-peer-urls"] == (
        "http://$(POD_NAME).demo-etcd.ns.svc.cluster.local:2380"
    )
    settings = find(found, "ConfigMap", "demo-config")["data"]
    assert settings["KAFSCALE_ETCD_ENDPOINTS"].split(",") == [
        f"demo-etcd-{n}.demo-etcd.ns.svc.cluster.local:2379" for n in range(3)
    ]
    claim = sts["spec"]["volumeClaimTemplates"][0]["spec"]
    assert claim["resources"]["requests"]["storage"] == "4Gi"
    assert claim["storageClassName"] == "fast"
    assert find(found, "PodDisruptionBudget", "demo-etcd")["spec"]["maxUnavailable"] == 1


def test_an_existing_etcd_keeps_its_size() -> None:
    found = objects(FULL, cluster.Observed(admin_user="admin", etcd_replicas=5))
    assert find(found, "StatefulSet", "demo-etcd")["spec"]["replicas"] == 5
    assert etcd.replicas(make(FULL), None) == 3


def test_backups_and_the_restore_run_kafscales_own_commands() -> None:
    found = objects(FULL)
    cron = find(found, "CronJob", "demo-backup")
    (job,) = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    args = cli.build_parser().parse_args(job["command"][1:])
    assert (args.command, args.metadata_command) == ("metadata", "backup")
    assert (args.bucket, args.prefix, args.keep) == ("data", "metadata-backups/ns/demo/", 5)
    assert cron["spec"]["schedule"] == "0 * * * *"
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"
    (init,) = pod_of(found)["spec"]["initContainers"]
    restore = cli.build_parser().parse_args(init["command"][1:])
    assert (restore.metadata_command, restore.key) == ("restore", "metadata-backups/x.json.gz")
    assert init["envFrom"] == container(found)["envFrom"]  # the brokers' own settings
    without = with_("metadata.etcd.managed.restore", None)
    assert "initContainers" not in pod_of(objects(without))["spec"]
    no_backups = with_("metadata.etcd.managed.snapshots", None)
    assert "CronJob" not in {o["kind"] for o in objects(no_backups)}


def test_external_etcd_has_no_etcd_objects() -> None:
    kinds = {(o["kind"], o["metadata"]["name"]) for o in objects(MINIMAL)}
    assert ("StatefulSet", "demo-etcd") not in kinds
    settings = find(objects(MINIMAL), "ConfigMap", "demo-config")["data"]
    assert settings["KAFSCALE_ETCD_ENDPOINTS"] == "etcd-0:2379,etcd-1:2379"


def test_the_admin_endpoint_prefers_the_strongest_scram() -> None:
    spec = with_(
        "brokers.listeners", [{"name": "INTERNAL", "port": 9092, "tls": True, "sasl": True}]
    )
    spec["brokers"]["authentication"]["mechanisms"] = ["PLAIN", "SCRAM-SHA-256"]
    spec.pop("autoscaling")
    assert cluster.admin_endpoint(make(spec)) == (
        "demo-bootstrap.ns.svc.cluster.local:9092",
        "SASL_SSL",
        "SCRAM-SHA-256",
    )
    assert cluster.admin_endpoint(make(MINIMAL))[1:] == ("PLAINTEXT", None)


def test_a_template_annotation_cannot_stop_a_roll() -> None:
    spec = with_("brokers.template.metadata.annotations", {"kafscale.io/config-hash": "pinned"})
    annotations = pod_of(objects(spec))["metadata"]["annotations"]
    assert annotations["kafscale.io/config-hash"] != "pinned"
