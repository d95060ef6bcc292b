"""A KafscaleCluster's objects (kafscale/operator/cluster.py, brokers.py, services.py, objects.py):
valid for Kubernetes, owned and labelled, wired to each other, and running the broker the way it
really is configured -- its settings (loaded with kafscale.config from the ConfigMap and the pod's
environment), ports, health paths, hand-over and memory budgets, as test_k8s_manifests.py checks
k8s/broker.yaml -- plus the template merge, autoscaling, the scale-down pacing and the config
hash."""

from __future__ import annotations

import copy
import math
import re
import socket
import subprocess
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from kafscale import cli, config
from kafscale.ipc.shm_names import SHM_DIR
from kafscale.operator import brokers, cluster
from kafscale.operator.model import Cluster, SpecError, parse_cluster
from kafscale.operator.names import port_name
from kafscale.operator.objects import digest, identity, managed_selector
from kafscale.security import listeners
from kafscale.settings import SETTINGS, SETTINGS_BY_FIELD, parse_size
from kafscale.supervisor import arbiter, broker, health
from tests.unit.test_k8s_manifests import KUBERNETES_VERSIONS, quantity_bytes

Obj = dict[str, Any]

MINIMAL: Obj = {
    "storage": {"bucket": "data"},
    "metadata": {"etcd": {"endpoints": ["etcd-0.etcd:2379", "etcd-1.etcd:2379"]}},
}
# Every section: TLS and SASL listeners, NodePort and LoadBalancer external listeners, ACLs, a
# managed etcd with backups and a restore, autoscaling, template overrides, monitoring.
FULL: Obj = {
    "image": "registry.example.com/kafscale:9",
    "imagePullSecrets": ["regcred"],
    "storage": {
        "bucket": "data",
        "region": "eu-west-1",
        "endpoint": "https://minio.minio:9000",
        "pathStyle": True,
        "credentialsSecret": "s3",
        "ca": {"name": "s3-ca", "key": "ca.pem"},
    },
    "brokers": {
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
                    "annotations": {"service.beta.kubernetes.io/aws-load-balancer-type": "nlb"},
                },
            },
        ],
        "tls": {"secretName": "tls", "clientAuth": "requested"},
        "authentication": {"adminSecret": "admin"},
        "authorization": {"type": "acl", "superUsers": ["User:ops"]},
        "template": {
            "metadata": {"labels": {"team": "data"}, "annotations": {"owner": "data-team"}},
            "spec": {
                "nodeSelector": {"pool": "kafka"},
                "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
                "containers": [
                    {"name": "broker", "env": [{"name": "EXTRA", "value": "1"}]},
                    {"name": "sidecar", "image": "busybox:1", "command": ["sleep", "infinity"]},
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
                "restore": {"snapshot": "metadata-backups/ns/demo/ns-demo-x.json.gz"},
            }
        }
    },
    "config": {"KAFSCALE_LOG_LEVEL": "debug", "KAFSCALE_BUFFER_BYTES": "256MiB"},
    "autoscaling": {"minReplicas": 2, "maxReplicas": 4, "targetCPUUtilizationPercentage": 60},
    "monitoring": {"serviceMonitor": True},
}
# A fixed size (no autoscaling), TLS client certificates for ACLs, one NodePort listener, a
# one-member managed etcd without backups, a custom DNS domain, a ServiceMonitor if served.
FIXED: Obj = {
    "clusterDomain": "corp.internal",
    "storage": {"bucket": "data", "namespace": "shared-prefix"},
    "brokers": {
        "replicas": 3,
        "resources": {"requests": {"cpu": "1500m", "memory": "4Gi"}, "limits": {"memory": "4Gi"}},
        "listeners": [
            {"name": "PLAIN", "port": 9092},
            {"name": "MTLS", "port": 9093, "tls": True},
            {
                "name": "OUTSIDE",
                "port": 9094,
                "external": {
                    "type": "NodePort",
                    "nodePortBase": 30100,
                    "advertisedHostTemplate": "node.example.com",
                },
            },
        ],
        "metricsPort": 9100,
        "tls": {"secretName": "tls", "clientAuth": "required"},
        "authorization": {"type": "acl"},
    },
    "metadata": {"etcd": {"managed": {"replicas": 1}}},
}
SPECS = {"minimal": MINIMAL, "full": FULL, "fixed": FIXED}
ADMIN = cluster.Observed(admin_user="admin", service_monitor_served=True)

# The Secrets the specs name, as the pods would find them mounted.
SECRETS: dict[str, dict[str, str]] = {
    "s3": {"access-key": "AKIAEXAMPLE", "secret-key": "secret-key-example"},
    "s3-ca": {"ca.pem": "-----BEGIN CERTIFICATE-----"},
    "admin": {"username": "admin", "password": "admin-password"},
    "demo-admin-token": {"token": "t" * 32},
    "tls": {"tls.crt": "crt", "tls.key": "key", "ca.crt": "ca"},
}


def make(spec: Obj, name: str = "demo") -> Cluster:
    return parse_cluster(
        {
            "apiVersion": "kafscale.io/v1alpha1",
            "kind": "KafscaleCluster",
            "metadata": {"name": name, "namespace": "ns", "uid": "uid-1", "generation": 3},
            "spec": copy.deepcopy(spec),
        },
        "kafscale:default",
    )


def objects(spec: Obj, observed: cluster.Observed = ADMIN, name: str = "demo") -> list[Obj]:
    return cluster.desired(make(spec, name), observed).objects


def find(found: list[Obj], kind: str, name: str) -> Obj:
    (match,) = [o for o in found if o["kind"] == kind and o["metadata"]["name"] == name]
    return match


def of_kind(found: list[Obj], kind: str) -> list[Obj]:
    return [o for o in found if o["kind"] == kind]


def broker_pod(found: list[Obj]) -> Obj:
    (sts,) = [
        o
        for o in of_kind(found, "StatefulSet")
        if o["metadata"]["labels"]["app.kubernetes.io/component"] == "broker"
    ]
    template: Obj = sts["spec"]["template"]
    return template


def broker_container(found: list[Obj]) -> Obj:
    match: Obj
    (match,) = [c for c in broker_pod(found)["spec"]["containers"] if c["name"] == "broker"]
    return match


def with_(spec: Obj, path: str, value: Any) -> Obj:
    out = copy.deepcopy(spec)
    *parents, last = path.split(".")
    node: Any = out
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
    return out


# --- schemas, names, owners, labels ------------------------------------------------------------


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("spec", SPECS.values(), ids=SPECS.keys())
def test_every_object_is_valid_for_kubernetes(spec: Obj, version: str) -> None:
    found = objects(spec)
    assert len(found) >= 6
    for obj in found:
        if obj["kind"] == "ServiceMonitor":
            continue  # the Prometheus operator's CRD checks it (test_a_service_monitor_...)
        kubernetes_validate.validate(obj, version, strict=True)


def test_the_schema_check_sees_a_misspelt_field_in_a_generated_object() -> None:
    sts = copy.deepcopy(find(objects(FULL), "StatefulSet", "demo-broker"))
    sts["spec"]["template"]["spec"]["nodeSelectr"] = {"pool": "kafka"}
    with pytest.raises(kubernetes_validate.ValidationError, match="nodeSelectr"):
        kubernetes_validate.validate(sts, KUBERNETES_VERSIONS[-1], strict=True)


@pytest.mark.parametrize("spec", SPECS.values(), ids=SPECS.keys())
def test_every_object_is_owned_labelled_and_found_by_the_prune(spec: Obj) -> None:
    wanted = dict(part.split("=") for part in managed_selector("demo").split(","))
    found = objects(spec)
    identities = [identity(obj) for obj in found]
    assert len(set(identities)) == len(identities)  # two objects would be one apply
    for obj in found:
        meta = obj["metadata"]
        assert meta["namespace"] == "ns"
        assert meta["labels"].items() >= wanted.items(), meta["name"]  # pruned when unwanted
        assert meta["labels"]["app.kubernetes.io/name"] == "kafscale"
        assert meta["labels"]["app.kubernetes.io/component"]
        assert meta["ownerReferences"] == [
            {
                "apiVersion": "kafscale.io/v1alpha1",
                "kind": "KafscaleCluster",
                "name": "demo",
                "uid": "uid-1",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        for claim in obj.get("spec", {}).get("volumeClaimTemplates", []):
            assert claim["metadata"]["labels"].items() >= wanted.items()


DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def service_names_fit(found: list[Obj]) -> list[str]:
    """Names the API server would refuse: Services are DNS-1035 labels; other names here must
    fit a label too (pods and their hostname label are named after them)."""
    bad = []
    for obj in found:
        name = obj["metadata"]["name"]
        if len(name) > 63 or (obj["kind"] == "Service" and not DNS_1035.match(name)):
            bad.append(name)
    return bad


def test_the_longest_cluster_name_fits_every_object_name() -> None:
    """model.py allows 40 characters so that ``<name>-broker-<n>-external`` fits 63; with two
    external listeners a Service is named after its listener's port (up to 15 characters)."""
    spec = copy.deepcopy(FULL)
    spec["brokers"]["listeners"][2]["name"] = "PUBLIC_INTERNET"
    found = objects(spec, name="k" * 40)
    assert any(o["metadata"]["name"].endswith("-public-internet") for o in found)
    assert service_names_fit(found) == []


def test_a_cluster_name_starting_with_a_digit_still_names_valid_services() -> None:
    """A DNS label may start with a digit, a Service name may not: the API server would refuse
    ``7kafka-brokers``, so the model refuses the cluster's name."""
    with pytest.raises(SpecError, match=r"^metadata\.name: '7kafka'"):
        objects(MINIMAL, name="7kafka")
    assert service_names_fit(objects(MINIMAL, name="k7kafka")) == []


# --- wiring: selectors and ports ---------------------------------------------------------------


def pod_labels(found: list[Obj]) -> dict[str, list[dict[str, str]]]:
    """The labels of every pod each StatefulSet would run (the controller adds the pod's name),
    by StatefulSet name."""
    pods: dict[str, list[dict[str, str]]] = {}
    for sts in of_kind(found, "StatefulSet"):
        name = sts["metadata"]["name"]
        template = sts["spec"]["template"]["metadata"]["labels"]
        count = sts["spec"].get("replicas", 4)
        pods[name] = [
            {**template, "statefulset.kubernetes.io/pod-name": f"{name}-{n}"} for n in range(count)
        ]
    return pods


def selected(selector: dict[str, str], pods: list[dict[str, str]]) -> int:
    return sum(selector.items() <= labels.items() for labels in pods)


@pytest.mark.parametrize("spec", SPECS.values(), ids=SPECS.keys())
def test_selectors_select_the_pods_they_mean(spec: Obj) -> None:
    found = objects(spec)
    pods = pod_labels(found)
    brokers_, etcd_ = pods["demo-broker"], pods.get("demo-etcd", [])
    for sts in of_kind(found, "StatefulSet"):
        own = pods[sts["metadata"]["name"]]
        assert selected(sts["spec"]["selector"]["matchLabels"], own) == len(own)
        for constraint in sts["spec"]["template"]["spec"].get("topologySpreadConstraints", []):
            assert selected(constraint["labelSelector"]["matchLabels"], own) == len(own)
    for service in of_kind(found, "Service"):
        name, chosen = service["metadata"]["name"], service["spec"]["selector"]
        if name.startswith("demo-etcd"):
            assert (selected(chosen, etcd_), selected(chosen, brokers_)) == (len(etcd_), 0)
        elif service["spec"].get("type") in ("NodePort", "LoadBalancer"):
            # One broker's own Service, named after its broker (and listener).
            pod = chosen["statefulset.kubernetes.io/pod-name"]
            broker_id = pod.rsplit("-", 1)[1]
            named = rf"demo-b{broker_id}-[a-z-]+|{pod}-external"
            assert re.fullmatch(named, name), (name, pod)
            assert (selected(chosen, brokers_), selected(chosen, etcd_)) == (1, 0)
        else:
            assert (selected(chosen, brokers_), selected(chosen, etcd_)) == (len(brokers_), 0)
    for budget in of_kind(found, "PodDisruptionBudget"):
        target = brokers_ if budget["metadata"]["name"] == "demo-broker" else etcd_
        assert selected(budget["spec"]["selector"]["matchLabels"], target) == len(target)
    for hpa in of_kind(found, "HorizontalPodAutoscaler"):
        assert hpa["spec"]["scaleTargetRef"] == {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "name": "demo-broker",
        }
    sts = find(found, "StatefulSet", "demo-broker")
    headless = find(found, "Service", sts["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is True
    assert find(found, "Service", "demo-bootstrap")["spec"].get("clusterIP") != "None"


def test_a_service_monitor_scrapes_the_headless_services_metrics_port() -> None:
    found = objects(FULL)
    monitor = find(found, "ServiceMonitor", "demo-broker")
    headless = find(found, "Service", "demo-brokers")
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= headless["metadata"]["labels"].items()
    )
    # No other Service carries those labels: every broker is scraped once.
    others = [
        s
        for s in of_kind(found, "Service")
        if s is not headless
        and monitor["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()
    ]
    assert others == []
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in headless["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"


@pytest.mark.parametrize(
    ("asked", "served", "present"),
    [(None, True, True), (None, False, False), (True, False, True), (False, True, False)],
)
def test_a_service_monitor_when_asked_or_when_its_crd_is_served(
    asked: bool | None, served: bool, present: bool
) -> None:
    spec = with_(MINIMAL, "monitoring", {} if asked is None else {"serviceMonitor": asked})
    found = objects(spec, cluster.Observed(service_monitor_served=served))
    assert bool(of_kind(found, "ServiceMonitor")) is present


@pytest.mark.parametrize("spec", SPECS.values(), ids=SPECS.keys())
def test_ports_are_the_listeners_and_the_metrics_port(spec: Obj) -> None:
    found = objects(spec)
    parsed = make(spec)
    container = broker_container(found)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    expected = {port_name(li): li.port for li in parsed.spec.brokers.listeners}
    assert ports == {**expected, "metrics": parsed.spec.brokers.metrics_port}
    settings = find(found, "ConfigMap", "demo-config")["data"]
    bound = listeners.parse(
        settings["KAFSCALE_LISTENERS"], "", settings["KAFSCALE_LISTENER_SECURITY_PROTOCOL_MAP"]
    )
    assert {li.port for li in bound} == set(expected.values())
    assert settings["KAFSCALE_METRICS_PORT"] == str(ports["metrics"])
    pod = broker_pod(found)
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == str(ports["metrics"])
    for service in of_kind(found, "Service"):
        if service["metadata"]["name"].startswith("demo-etcd"):
            continue
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in ports.values(), (service["metadata"]["name"], port)
            assert ports[port["name"]] == port["targetPort"]
    bootstrap = find(found, "Service", "demo-bootstrap")["spec"]["ports"]
    internal = [li.port for li in parsed.spec.brokers.listeners if li.external is None]
    assert [p["port"] for p in bootstrap] == internal


def test_probes_use_paths_the_metrics_port_serves(tmp_path: Path) -> None:
    container = broker_container(objects(FULL))
    probes = [container[probe] for probe in ("startupProbe", "livenessProbe", "readinessProbe")]
    assert all(probe["httpGet"]["port"] == "metrics" for probe in probes)
    assert all(probe["httpGet"]["scheme"] == "HTTP" for probe in probes)
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    server = health.HealthServer("127.0.0.1", 0, health.HealthChecker(str(tmp_path), [], {}))
    server.start()
    try:
        base = f"http://127.0.0.1:{server.httpd.server_address[1]}"
        for probe in probes:
            try:
                with urllib.request.urlopen(base + probe["httpGet"]["path"], timeout=10) as reply:
                    status = reply.status
            except urllib.error.HTTPError as error:
                status = error.code
            assert status in (200, 503), probe  # /readyz: 503 until the children are up
    finally:
        server.stop()


def test_a_metrics_port_on_https_is_probed_and_drained_over_https() -> None:
    spec = with_(
        MINIMAL,
        "config",
        {
            "KAFSCALE_METRICS_TLS_CERT_FILE": "/etc/metrics/tls.crt",
            "KAFSCALE_METRICS_TLS_KEY_FILE": "/etc/metrics/tls.key",
        },
    )
    container = broker_container(objects(spec))
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["scheme"] == "HTTPS"
    drain = cli.build_parser().parse_args(container["lifecycle"]["preStop"]["exec"]["command"][1:])
    assert drain.metrics_url == "https://127.0.0.1:9093"


@pytest.mark.parametrize("spec", SPECS.values(), ids=SPECS.keys())
def test_stopping_hands_partitions_over_within_the_grace_period(spec: Obj) -> None:
    found = objects(spec)
    container = broker_container(found)
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[:2] == ["kafscale", "drain"]
    parsed = cli.build_parser().parse_args(command[1:])  # the real CLI takes it
    assert parsed.command == "drain"
    assert parsed.metrics_url == f"http://127.0.0.1:{make(spec).spec.brokers.metrics_port}"
    shutdown_s = sum(arbiter.STOP_GRACE_SECONDS.values())
    grace = broker_pod(found)["spec"]["terminationGracePeriodSeconds"]
    assert grace > parsed.timeout + broker.HANDOVER_WAIT_S + shutdown_s


# --- the broker's settings, as the pod gives them ----------------------------------------------


def advertised(found: list[Obj], pod: str, namespace: str = "ns") -> str:
    """KAFSCALE_ADVERTISED_LISTENERS as the container's shell computes it, run for real."""
    command = broker_container(found)["command"]
    assert command[:2] == ["/bin/sh", "-c"]
    script = command[2]
    assert script.rstrip().endswith("exec kafscale serve")
    script = script.replace("exec kafscale serve", 'printf %s "$KAFSCALE_ADVERTISED_LISTENERS"')
    result = subprocess.run(
        ["/bin/sh", "-c", script],
        env={"POD_NAME": pod, "POD_NAMESPACE": namespace, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    assert result.stderr == ""
    return result.stdout


def cpu_cores(quantity: str) -> int:
    """A CPU quantity as a resourceFieldRef gives it (divisor 1: rounded up)."""
    if quantity.endswith("m"):
        return math.ceil(int(quantity[:-1]) / 1000)
    return math.ceil(float(quantity))


def mounted_file(pod_spec: Obj, container: Obj, path: str) -> tuple[str, str]:
    """(Secret name, key) of a file the container reads from a mounted Secret."""
    directory, _, key = path.rpartition("/")
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == directory]
    assert mount.get("readOnly") is True, mount
    (volume,) = [v for v in pod_spec["volumes"] if v["name"] == mount["name"]]
    return volume["secret"]["secretName"], key


def pod_environment(
    found: list[Obj], pod: str, container: Obj, files: Path, pod_spec: Obj | None = None
) -> dict[str, str]:
    """The KAFSCALE_* environment ``container`` of pod ``pod`` would see: its ConfigMap, its
    variables with their references resolved, the Secrets' files it names (written under
    ``files``, where they are read from instead)."""
    pod_spec = pod_spec or broker_pod(found)["spec"]
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env.update(find(found, "ConfigMap", source["configMapRef"]["name"])["data"])
    for var in container.get("env", []):
        name = var["name"]
        if "value" in var:
            env[name] = var["value"]
            continue
        ref = var["valueFrom"]
        if "fieldRef" in ref:
            path = ref["fieldRef"]["fieldPath"]
            env[name] = {"metadata.name": pod, "metadata.namespace": "ns"}[path]
        elif "resourceFieldRef" in ref:
            (named,) = [
                c
                for c in pod_spec["containers"]
                if c["name"] == ref["resourceFieldRef"]["containerName"]
            ]
            assert ref["resourceFieldRef"]["resource"] == "requests.cpu"
            env[name] = str(cpu_cores(named["resources"]["requests"]["cpu"]))
        else:
            secret = ref["secretKeyRef"]
            env[name] = SECRETS[secret["name"]][secret["key"]]
    for name, value in list(env.items()):
        if name.endswith("_FILE") and value.startswith("/var/run/secrets/"):
            secret_name, key = mounted_file(pod_spec, container, value)
            copy_ = files / secret_name / key
            copy_.parent.mkdir(parents=True, exist_ok=True)
            copy_.write_text(SECRETS[secret_name][key] + "\n")
            env[name] = str(copy_)
    return {k: v for k, v in env.items() if k.startswith("KAFSCALE_")}


@pytest.mark.parametrize("spec", SPECS.values(), ids=SPECS.keys())
def test_the_pods_settings_load_as_the_broker_reads_them(
    spec: Obj, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    found = objects(spec)
    parsed = make(spec)
    pod = "demo-broker-2"
    container = broker_container(found)
    env = pod_environment(found, pod, container, tmp_path)
    env["KAFSCALE_ADVERTISED_LISTENERS"] = advertised(found, pod)
    assert config.unknown_variables(env) == []
    # KAFSCALE_BROKER_ID=ordinal reads the host name, which is the pod's name.
    monkeypatch.setattr(socket, "gethostname", lambda: pod)
    loaded = config.load(env)  # the broker's own check of the whole configuration
    assert loaded.broker_id == 2
    assert [(li.name, li.protocol.value, li.port) for li in loaded.kafka_listeners] == [
        (li.name, li.protocol, li.port) for li in parsed.spec.brokers.listeners
    ]
    assert loaded.metrics_port == parsed.spec.brokers.metrics_port
    assert (loaded.s3_bucket, loaded.s3_region) == ("data", parsed.spec.storage.region)
    assert loaded.s3_namespace == (parsed.spec.storage.namespace or "ns-demo")
    assert loaded.etcd_endpoints  # the spec's, or the managed members (test_operator_etcd)
    requests = (parsed.spec.brokers.resources or brokers.DEFAULT_RESOURCES)["requests"]
    assert loaded.shards == cpu_cores(requests["cpu"])
    assert loaded.admin_token == SECRETS["demo-admin-token"]["token"]  # kafscale drain uses it
    for field, value in spec.get("config", {}).items():
        setting = SETTINGS_BY_FIELD[field.removeprefix("KAFSCALE_").lower()]
        assert getattr(loaded, setting.field) == setting.parse(value)


def test_the_full_specs_security_settings_reach_the_broker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    found = objects(FULL)
    env = pod_environment(found, "demo-broker-0", broker_container(found), tmp_path)
    env["KAFSCALE_ADVERTISED_LISTENERS"] = advertised(found, "demo-broker-0")
    monkeypatch.setattr(socket, "gethostname", lambda: "demo-broker-0")
    loaded = config.load(env)
    assert (loaded.s3_access_key, loaded.s3_secret_key) == ("AKIAEXAMPLE", "secret-key-example")
    assert loaded.s3_endpoint == "https://minio.minio:9000" and loaded.s3_path_style is True
    assert loaded.s3_ca_file == "/etc/kafscale/s3-ca/ca.pem"
    assert (loaded.sasl_admin_user, loaded.sasl_admin_password) == ("admin", "admin-password")
    assert loaded.sasl_enabled_mechanisms == ("SCRAM-SHA-512", "SCRAM-SHA-256")
    assert loaded.authorizer == "acl"
    assert loaded.super_users[0] == "User:admin" and "User:ops" in loaded.super_users
    assert loaded.ssl_client_auth == "requested"
    pod_spec = broker_pod(found)["spec"]
    container = broker_container(found)
    for path, secret in (
        (loaded.ssl_cert_file, ("tls", "tls.crt")),
        (loaded.ssl_key_file, ("tls", "tls.key")),
        (loaded.ssl_ca_file, ("tls", "ca.crt")),
        (loaded.s3_ca_file, ("s3-ca", "ca.pem")),
    ):
        assert mounted_file(pod_spec, container, path) == secret
    assert pod_spec["imagePullSecrets"] == [{"name": "regcred"}]


@pytest.mark.parametrize(
    ("observed_admin", "super_users", "expected"),
    [
        ("admin", [], "User:admin"),
        ("admin", ["User:ops"], "User:admin;User:ops"),
        ("admin", ["User:ops", "User:admin"], "User:ops;User:admin"),  # not twice
        (None, ["User:ops"], "User:ops"),  # the admin Secret is not read yet
    ],
)
def test_the_admin_is_a_super_user(
    observed_admin: str | None, super_users: list[str], expected: str
) -> None:
    spec = with_(FULL, "brokers.authorization.superUsers", super_users)
    found = objects(spec, cluster.Observed(admin_user=observed_admin))
    settings = find(found, "ConfigMap", "demo-config")["data"]
    assert settings["KAFSCALE_SUPER_USERS"] == expected
    assert settings["KAFSCALE_ALLOW_EVERYONE_IF_NO_ACL_FOUND"] == "false"
    assert config.load(settings).super_users == tuple(expected.split(";"))


@pytest.mark.parametrize("spec", SPECS.values(), ids=SPECS.keys())
def test_credentials_are_files_of_mounted_secrets_never_values(spec: Obj) -> None:
    found = objects(spec)
    container, pod_spec = broker_container(found), broker_pod(found)["spec"]
    env = {var["name"]: var for var in container["env"]}
    data = find(found, "ConfigMap", "demo-config")["data"]
    for setting in (s for s in SETTINGS if s.secret):
        assert setting.env not in data, setting.env
        assert "value" not in env.get(setting.env, {}), setting.env
        if setting.file_env in env:
            secret_name, key = mounted_file(pod_spec, container, env[setting.file_env]["value"])
            assert key in SECRETS[secret_name], (setting.file_env, secret_name, key)
    token = next(v for v in pod_spec["volumes"] if v["name"] == "admin-token")
    assert token["secret"]["secretName"] in cluster.generated_secrets(make(spec))
    assert cluster.generated_secrets(make(spec))[token["secret"]["secretName"]] == ("token",)


# --- advertised addresses ----------------------------------------------------------------------


def test_each_broker_advertises_its_own_addresses() -> None:
    found = objects(FULL)
    text = advertised(found, "demo-broker-2")
    assert text == (
        "INTERNAL://demo-broker-2.demo-brokers.ns.svc.cluster.local:9092,"
        "SECURE://demo-broker-2.demo-brokers.ns.svc.cluster.local:9095,"
        "EXTERNAL://b2.kafka.example.com:31092,"
        "LB://lb-2.example.com:9096"
    )
    settings = find(found, "ConfigMap", "demo-config")["data"]
    parsed = listeners.parse(
        settings["KAFSCALE_LISTENERS"],
        text,
        settings["KAFSCALE_LISTENER_SECURITY_PROTOCOL_MAP"],
        settings["KAFSCALE_BROKER_HOST"],
    )
    assert [
        (li.name, li.protocol.value, li.advertised_host, li.advertised_port) for li in parsed
    ] == [
        ("INTERNAL", "PLAINTEXT", "demo-broker-2.demo-brokers.ns.svc.cluster.local", 9092),
        ("SECURE", "SASL_SSL", "demo-broker-2.demo-brokers.ns.svc.cluster.local", 9095),
        ("EXTERNAL", "SASL_SSL", "b2.kafka.example.com", 31092),
        ("LB", "SSL", "lb-2.example.com", 9096),
    ]
    # The NodePort a broker advertises is the one its own Service opens.
    service = find(found, "Service", "demo-b2-external")
    assert service["spec"]["ports"] == [
        {"name": "external", "port": 9094, "nodePort": 31092, "targetPort": 9094}
    ]
    assert find(found, "Service", "demo-b2-lb")["metadata"]["annotations"] == {
        "service.beta.kubernetes.io/aws-load-balancer-type": "nlb"
    }


@pytest.mark.parametrize(
    ("name", "pod", "namespace", "internal", "outside"),
    [
        ("demo", "demo-broker-0", "ns", "demo-broker-0.demo-brokers.ns", "node.example.com:30100"),
        (
            "demo",
            "demo-broker-11",
            "prod",
            "demo-broker-11.demo-brokers.prod",
            "node.example.com:30111",
        ),
        (
            "my-kafka-2",
            "my-kafka-2-broker-3",
            "ns",
            "my-kafka-2-broker-3.my-kafka-2-brokers.ns",
            "node.example.com:30103",
        ),
    ],
)
def test_the_ordinal_is_the_pods_and_the_domain_the_clusters(
    name: str, pod: str, namespace: str, internal: str, outside: str
) -> None:
    text = advertised(objects(FIXED, name=name), pod, namespace)
    assert text == (
        f"PLAIN://{internal}.svc.corp.internal:9092,"
        f"MTLS://{internal}.svc.corp.internal:9093,"
        f"OUTSIDE://{outside}"
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
