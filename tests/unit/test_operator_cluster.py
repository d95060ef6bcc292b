"""A KafscaleCluster's objects (kafscale/operator/cluster.py, brokers.py, services.py, objects.py):
valid for Kubernetes, owned and labelled, wired to each other, and running the broker the way it
really is configured -- its settings (loaded with kafscale.config from the ConfigMap and the pod's
environment), ports, health paths, hand-over and memory budgets, as test_k8s_manifests.py checks
k8s/broker.yaml. Resources, the template merge, autoscaling, the scale-down pacing and the config
hash: test_operator_cluster_scaling.py."""

from __future__ import annotations

import copy
import math
import re
import socket
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from kafscale import cli, config
from kafscale.operator import brokers, cluster
from kafscale.operator.model import Cluster, SpecError, parse_cluster
from kafscale.operator.names import port_name
from kafscale.operator.objects import identity, managed_labels
from kafscale.security import listeners
from kafscale.settings import SETTINGS, SETTINGS_BY_FIELD
from kafscale.supervisor import arbiter, broker, health
from tests.unit.test_k8s_manifests import KUBERNETES_VERSIONS

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
    wanted = managed_labels("demo")
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
