"""A KafscaleCluster's spec as the operator reads it (kafscale/operator/model.py): the defaults,
the field names of the CRD (camelCase, as charts/kafscale/crds/ spells them), and every spec it
cannot carry out refused with a `SpecError` whose message starts with the field's YAML path."""

from __future__ import annotations

import copy
import typing
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml

from kafscale import config
from kafscale.operator import brokers
from kafscale.operator.model import (
    OPERATOR_OWNED_SETTINGS,
    Cluster,
    ClusterSpec,
    ListenerSpec,
    SpecError,
    parse_cluster,
)
from kafscale.settings import SETTINGS
from tests.unit.test_k8s_manifests import quantity_bytes

CRD = Path(__file__).resolve().parents[2] / "charts/kafscale/crds/kafscaleclusters.yaml"

MINIMAL: dict[str, Any] = {
    "storage": {"bucket": "data"},
    "metadata": {"etcd": {"endpoints": ["etcd-0:2379"]}},
}
# Every section given, each valid: the base the refusals below break one field of.
FULL: dict[str, Any] = {
    "storage": {"bucket": "data", "credentialsSecret": "s3"},
    "brokers": {
        "replicas": 3,
        "listeners": [
            {"name": "INTERNAL", "port": 9092},
            {"name": "SECURE", "port": 9095, "tls": True, "sasl": True},
            {
                "name": "EXTERNAL",
                "port": 9094,
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
                "external": {"advertisedHostTemplate": "lb-{id}.kafka.example.com"},
            },
        ],
        "tls": {"secretName": "tls", "clientAuth": "requested"},
        "authentication": {"adminSecret": "admin"},
        "authorization": {"type": "acl", "superUsers": ["User:ops"]},
    },
    "metadata": {
        "etcd": {"managed": {"replicas": 3, "snapshots": {"schedule": "0 * * * *"}}},
    },
    "config": {"KAFSCALE_LOG_LEVEL": "debug"},
    "autoscaling": {"minReplicas": 2, "maxReplicas": 4},
}


def resource(spec: dict[str, Any], name: str = "demo") -> dict[str, Any]:
    return {
        "apiVersion": "kafscale.io/v1alpha1",
        "kind": "KafscaleCluster",
        "metadata": {"name": name, "namespace": "ns", "uid": "uid-1", "generation": 7},
        "spec": copy.deepcopy(spec),
    }


def parse(spec: dict[str, Any], name: str = "demo", default_image: str = "kafscale:1") -> Cluster:
    return parse_cluster(resource(spec, name), default_image)


def changed(path: str, value: Any, base: dict[str, Any] = FULL) -> dict[str, Any]:
    """``base`` with the field at the dotted ``path`` set to ``value`` (None: removed)."""
    spec = copy.deepcopy(base)
    *parents, last = path.split(".")
    node: Any = spec
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
    if value is None:
        node.pop(last, None)
    elif isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return spec


def test_the_specs_used_here_are_valid() -> None:
    assert parse(MINIMAL).spec.metadata.etcd.endpoints == ["etcd-0:2379"]
    assert parse(FULL).spec.metadata.etcd.managed is not None


# --- defaults ------------------------------------------------------------------------------------


def test_defaults_of_a_minimal_spec() -> None:
    parsed = parse(MINIMAL)
    assert (parsed.name, parsed.namespace, parsed.uid, parsed.generation) == (
        "demo",
        "ns",
        "uid-1",
        7,
    )
    assert parsed.image == "kafscale:1"  # the operator's default
    spec = parsed.spec
    assert (spec.image_pull_policy, spec.image_pull_secrets) == ("IfNotPresent", [])
    assert spec.cluster_domain == "cluster.local"
    assert spec.config == {}
    assert spec.autoscaling is None
    assert (spec.monitoring.service_monitor, spec.monitoring.interval) == (None, "30s")
    b = spec.brokers
    assert b.replicas == 3
    assert b.listeners == [ListenerSpec(name="INTERNAL", port=9092)]
    assert b.listeners[0].protocol == "PLAINTEXT"
    assert b.metrics_port == 9093
    assert b.tls is None
    assert b.authentication.mechanisms == ["SCRAM-SHA-512", "SCRAM-SHA-256"]
    assert b.authentication.admin_secret == ""
    assert (b.authorization.type, b.authorization.super_users) == ("none", [])
    assert b.authorization.allow_everyone_if_no_acl_found is False
    assert (b.template.metadata.labels, b.template.spec) == ({}, {})
    assert b.resources == {}
    assert b.termination_grace_period_seconds == 240
    s = spec.storage
    assert (s.bucket, s.region, s.endpoint, s.path_style) == ("data", "us-east-1", "", False)
    assert (s.namespace, s.credentials_secret, s.ca) == ("", "", None)
    assert spec.metadata.etcd.managed is None


def test_defaults_of_optional_sections() -> None:
    spec = {
        "storage": {"bucket": "data"},
        "metadata": {"etcd": {"managed": {"snapshots": {"schedule": "0 * * * *"}}}},
        "autoscaling": {},
        "brokers": {
            "listeners": [
                {"name": "INTERNAL", "port": 9092},
                {"name": "EXT", "port": 9094, "external": {"advertisedHostTemplate": "b{id}.x"}},
            ],
            "tls": {"secretName": "tls"},
        },
    }
    parsed = parse(spec).spec
    managed = parsed.metadata.etcd.managed
    assert managed is not None
    assert (managed.replicas, managed.image) == (3, "registry.k8s.io/etcd:3.6.5-0")
    assert (managed.storage.size, managed.storage.storage_class_name) == ("1Gi", "")
    assert managed.snapshots is not None and managed.restore is None
    snaps = managed.snapshots
    assert (snaps.bucket, snaps.prefix, snaps.keep) == ("", "", 24)
    assert parsed.autoscaling is not None
    scaling = parsed.autoscaling
    assert (scaling.min_replicas, scaling.max_replicas) == (1, 3)
    assert scaling.target_cpu_utilization_percentage == 70
    external = parsed.brokers.listeners[1].external
    assert external is not None
    assert (external.type, external.node_port_base, external.annotations) == (
        "LoadBalancer",
        0,
        {},
    )
    assert parsed.brokers.tls is not None and parsed.brokers.tls.client_auth == "none"


def test_the_namespace_defaults_and_the_image_of_the_spec_wins() -> None:
    body = resource({**MINIMAL, "image": "mine:2"})
    del body["metadata"]["namespace"]
    parsed = parse_cluster(body, "kafscale:1")
    assert (parsed.namespace, parsed.image) == ("default", "mine:2")
    # No image anywhere is refused, naming the field.
    with pytest.raises(SpecError, match=r"^spec\.image: "):
        parse(MINIMAL, default_image="")


@pytest.mark.parametrize(
    ("tls", "sasl", "protocol"),
    [
        (False, False, "PLAINTEXT"),
        (True, False, "SSL"),
        (False, True, "SASL_PLAINTEXT"),
        (True, True, "SASL_SSL"),
    ],
)
def test_a_listeners_security_protocol(tls: bool, sasl: bool, protocol: str) -> None:
    assert ListenerSpec(name="L", port=1, tls=tls, sasl=sasl).protocol == protocol


# --- field names ---------------------------------------------------------------------------------


def test_camel_case_names_as_the_crd_spells_them() -> None:
    spec = {
        "image": "x:1",
        "imagePullPolicy": "Always",
        "imagePullSecrets": ["regcred"],
        "clusterDomain": "corp.local",
        "storage": {
            "bucket": "data",
            "pathStyle": True,
            "credentialsSecret": "s3",
            "ca": {"name": "ca", "key": "ca.pem"},
        },
        "brokers": {
            "metricsPort": 9999,
            "terminationGracePeriodSeconds": 300,
            "listeners": [
                {"name": "INTERNAL", "port": 9092, "sasl": True},
                {
                    "name": "EXT",
                    "port": 9094,
                    "tls": True,
                    "external": {
                        "type": "NodePort",
                        "nodePortBase": 31000,
                        "advertisedHostTemplate": "b{id}.example.com",
                    },
                },
            ],
            "tls": {"secretName": "tls", "clientAuth": "required"},
            "authentication": {"adminSecret": "admin"},
            "authorization": {
                "type": "acl",
                "superUsers": ["User:ops"],
                "allowEveryoneIfNoAclFound": True,
            },
        },
        "metadata": {"etcd": {"managed": {"storage": {"size": "8Gi", "storageClassName": "fast"}}}},
        "autoscaling": {"minReplicas": 2, "maxReplicas": 6, "targetCPUUtilizationPercentage": 55},
        "monitoring": {"serviceMonitor": False},
    }
    parsed = parse(spec).spec
    assert (parsed.image_pull_policy, parsed.image_pull_secrets) == ("Always", ["regcred"])
    assert parsed.cluster_domain == "corp.local"
    assert (parsed.storage.path_style, parsed.storage.credentials_secret) == (True, "s3")
    b = parsed.brokers
    assert (b.metrics_port, b.termination_grace_period_seconds) == (9999, 300)
    external = b.listeners[1].external
    assert external is not None
    assert (external.node_port_base, external.advertised_host_template) == (
        31000,
        "b{id}.example.com",
    )
    assert b.tls is not None and (b.tls.secret_name, b.tls.client_auth) == ("tls", "required")
    assert b.authentication.admin_secret == "admin"
    assert b.authorization.super_users == ["User:ops"]
    assert b.authorization.allow_everyone_if_no_acl_found is True
    managed = parsed.metadata.etcd.managed
    assert managed is not None and managed.storage.storage_class_name == "fast"
    scaling = parsed.autoscaling
    assert scaling is not None
    assert (scaling.min_replicas, scaling.max_replicas) == (2, 6)
    assert scaling.target_cpu_utilization_percentage == 55
    assert parsed.monitoring.service_monitor is False


def test_python_or_mis_cased_spellings_are_not_the_fields() -> None:
    # targetCPUUtilizationPercentage is the CRD's (and Kubernetes' HPA v1) spelling; the
    # generic camelCase "targetCpuUtilizationPercentage" is not it.
    spec = {
        **MINIMAL,
        "autoscaling": {
            "targetCpuUtilizationPercentage": 10,
            "target_cpu_utilization_percentage": 20,
        },
    }
    scaling = parse(spec).spec.autoscaling
    assert scaling is not None and scaling.target_cpu_utilization_percentage == 70


def _struct_of(annotation: Any) -> type[msgspec.Struct] | None:
    """The Struct an annotation holds (``X``, ``X | None``, ``list[X]``), if any."""
    if isinstance(annotation, type) and issubclass(annotation, msgspec.Struct):
        return annotation
    for argument in typing.get_args(annotation):
        inner = _struct_of(argument)
        if inner is not None:
            return inner
    return None


def test_every_crd_property_is_a_model_field_and_back() -> None:
    """The CRD's schema and the model name the same fields, so a field the API server accepts
    is never silently ignored by the operator (and the reverse: pruned before it arrives)."""
    (crd,) = [doc for doc in yaml.safe_load_all(CRD.read_text()) if doc]
    (version,) = crd["spec"]["versions"]
    schema = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    checked: list[str] = []

    def walk(node: dict[str, Any], struct: type[msgspec.Struct], path: str) -> None:
        if node.get("type") == "array":
            walk(node["items"], struct, path + "[]")
            return
        properties = node.get("properties", {})
        fields = {f.encode_name: f for f in msgspec.structs.fields(struct)}
        assert set(properties) == set(fields), path
        for name, field in fields.items():
            checked.append(f"{path}.{name}")
            inner = _struct_of(field.type)
            if inner is not None:
                walk(properties[name], inner, f"{path}.{name}")

    walk(schema, ClusterSpec, "spec")
    assert "spec.autoscaling.targetCPUUtilizationPercentage" in checked
    assert "spec.brokers.listeners[].external.nodePortBase" in checked
    assert "spec.brokers.listeners[].external.advertisedHostTemplate" in checked
    assert len(checked) > 60


# --- refusals ------------------------------------------------------------------------------------

NODE_PORT = "brokers.listeners.2.external"
REFUSED: list[tuple[str, dict[str, Any], str, str]] = [
    # (id, spec, the field the message starts with, words of the message)
    ("replicas-negative", changed("brokers.replicas", -1), "spec.brokers.replicas", ">= 0"),
    ("replicas-type", changed("brokers.replicas", "3"), "spec.brokers.replicas", "Expected `int`"),
    ("no-storage", changed("storage", None), "spec", "missing required field `storage`"),
    ("no-bucket", changed("storage.bucket", None), "spec.storage", "field `bucket`"),
    (
        "listener-without-name",
        changed("brokers.listeners.0", {"port": 9092}),
        "spec.brokers.listeners[0]",
        "field `name`",
    ),
    (
        "external-type",
        changed(f"{NODE_PORT}.type", "ClusterIP"),
        "spec.brokers.listeners[2].external.type",
        "ClusterIP",
    ),
    (
        "client-auth",
        changed("brokers.tls.clientAuth", "maybe"),
        "spec.brokers.tls.clientAuth",
        "maybe",
    ),
    (
        "authorization-type",
        changed("brokers.authorization.type", "rbac"),
        "spec.brokers.authorization.type",
        "rbac",
    ),
    (
        "target-cpu-type",
        changed("autoscaling.targetCPUUtilizationPercentage", "high"),
        "spec.autoscaling.targetCPUUtilizationPercentage",
        "Expected `int`",
    ),
    ("no-listeners", changed("brokers.listeners", []), "spec.brokers.listeners", "at least one"),
    (
        "listener-name-case",
        changed("brokers.listeners.1.name", "secure"),
        "spec.brokers.listeners[1].name",
        "upper case",
    ),
    (
        "listener-name-twice",
        changed("brokers.listeners.1.name", "INTERNAL"),
        "spec.brokers.listeners[1].name",
        "used twice",
    ),
    (
        "port-zero",
        changed("brokers.listeners.1.port", 0),
        "spec.brokers.listeners[1].port",
        "range",
    ),
    (
        "port-too-big",
        changed("brokers.listeners.1.port", 65536),
        "spec.brokers.listeners[1].port",
        "range",
    ),
    (
        "port-twice",
        changed("brokers.listeners.3.port", 9092),
        "spec.brokers.listeners[3].port",
        "also spec.brokers.listeners[0].port",
    ),
    (
        "port-is-metrics",
        changed("brokers.listeners.1.port", 9093),
        "spec.brokers.listeners[1].port",
        "also spec.brokers.metricsPort",
    ),
    (
        "metrics-port-is-a-listeners",
        changed("brokers.metricsPort", 9092),
        "spec.brokers.listeners[0].port",
        "also spec.brokers.metricsPort",
    ),
    ("tls-without-secret", changed("brokers.tls", None), "spec.brokers.listeners[1].tls", "tls"),
    (
        "sasl-without-admin",
        changed("brokers.authentication", None),
        "spec.brokers.listeners[1].sasl",
        "adminSecret",
    ),
    (
        "node-port-below",
        changed(f"{NODE_PORT}.nodePortBase", 29999),
        "spec.brokers.listeners[2].external.nodePortBase",
        "30000-32767",
    ),
    (
        "node-port-above",
        changed(f"{NODE_PORT}.nodePortBase", 32768),
        "spec.brokers.listeners[2].external.nodePortBase",
        "30000-32767",
    ),
    (
        "node-port-missing",
        changed(f"{NODE_PORT}.nodePortBase", None),
        "spec.brokers.listeners[2].external.nodePortBase",
        "30000-32767",
    ),
    (
        "host-template-shell",
        changed(f"{NODE_PORT}.advertisedHostTemplate", "b$(id).example.com"),
        "spec.brokers.listeners[2].external.advertisedHostTemplate",
        "host name",
    ),
    (
        "host-template-upper",
        changed(f"{NODE_PORT}.advertisedHostTemplate", "B{id}.example.com"),
        "spec.brokers.listeners[2].external.advertisedHostTemplate",
        "host name",
    ),
    (
        "host-template-empty",
        changed("brokers.listeners.3.external.advertisedHostTemplate", ""),
        "spec.brokers.listeners[3].external.advertisedHostTemplate",
        "needs the address",
    ),
    (
        "no-internal-listener",
        changed(
            "brokers.listeners",
            [
                {
                    "name": "EXT",
                    "port": 9094,
                    "external": {"advertisedHostTemplate": "b{id}.example.com"},
                }
            ],
        ),
        "spec.brokers.listeners",
        "must be internal",
    ),
    (
        "acl-without-authentication",
        changed("brokers", {"authorization": {"type": "acl"}}),
        "spec.brokers.authorization",
        "authenticated clients",
    ),
    (
        "acl-with-tls-but-no-client-certificates",
        changed(
            "brokers",
            {
                "listeners": [{"name": "INTERNAL", "port": 9092, "tls": True}],
                "tls": {"secretName": "tls", "clientAuth": "none"},
                "authorization": {"type": "acl"},
            },
        ),
        "spec.brokers.authorization",
        "TLS client certificates",
    ),
    (
        "mechanism",
        changed("brokers.authentication.mechanisms", ["GSSAPI"]),
        "spec.brokers.authentication.mechanisms",
        "'GSSAPI'",
    ),
    (
        "etcd-both",
        changed("metadata.etcd.endpoints", ["etcd:2379"]),
        "spec.metadata.etcd",
        "not both or neither",
    ),
    ("etcd-neither", changed("metadata.etcd", {}), "spec.metadata.etcd", "not both or neither"),
    (
        "etcd-replicas",
        changed("metadata.etcd.managed.replicas", 2),
        "spec.metadata.etcd.managed.replicas",
        "1, 3 or 5",
    ),
    (
        "schedule-words",
        changed("metadata.etcd.managed.snapshots.schedule", "@hourly"),
        "spec.metadata.etcd.managed.snapshots.schedule",
        "five fields",
    ),
    (
        "schedule-six-fields",
        changed("metadata.etcd.managed.snapshots.schedule", "0 0 * * * *"),
        "spec.metadata.etcd.managed.snapshots.schedule",
        "five fields",
    ),
    ("min-above-max", changed("autoscaling.minReplicas", 5), "spec.autoscaling", "minReplicas"),
    ("min-zero", changed("autoscaling.minReplicas", 0), "spec.autoscaling", "1 <= minReplicas"),
    (
        "target-zero",
        changed("autoscaling.targetCPUUtilizationPercentage", 0),
        "spec.autoscaling.targetCPUUtilizationPercentage",
        "1-100",
    ),
    (
        "target-above-100",
        changed("autoscaling.targetCPUUtilizationPercentage", 101),
        "spec.autoscaling.targetCPUUtilizationPercentage",
        "1-100",
    ),
]


@pytest.mark.parametrize(
    ("spec", "field", "words"),
    [pytest.param(spec, field, words, id=name) for name, spec, field, words in REFUSED],
)
def test_a_spec_the_operator_cannot_carry_out_names_the_field(
    spec: dict[str, Any], field: str, words: str
) -> None:
    with pytest.raises(SpecError) as refused:
        parse(spec)
    message = str(refused.value)
    assert message.startswith(field + ": "), message
    assert words in message


@pytest.mark.parametrize("name", ["Demo", "demo_1", "-demo", "", "a" * 41])
def test_a_cluster_name_that_cannot_name_its_pods_is_refused(name: str) -> None:
    with pytest.raises(SpecError, match=r"^metadata\.name: .*DNS label of at most 40"):
        parse(MINIMAL, name=name)


def test_acls_with_client_certificates_need_no_sasl() -> None:
    spec = changed(
        "brokers",
        {
            "listeners": [{"name": "INTERNAL", "port": 9092, "tls": True}],
            "tls": {"secretName": "tls", "clientAuth": "required"},
            "authorization": {"type": "acl"},
        },
    )
    assert parse(spec).spec.brokers.authorization.type == "acl"


# --- spec.config ---------------------------------------------------------------------------------

SECRETS = sorted(s.env for s in SETTINGS if s.secret and s.env not in OPERATOR_OWNED_SETTINGS)


def test_the_refusal_lists_cover_the_kinds_of_settings() -> None:
    known = {s.env for s in SETTINGS}
    assert known >= OPERATOR_OWNED_SETTINGS  # every operator-owned name is a real setting
    assert len(SECRETS) >= 3  # e.g. KAFSCALE_ETCD_PASSWORD, which the user gives by Secret


def test_a_broker_setting_is_taken() -> None:
    spec = {**MINIMAL, "config": {"KAFSCALE_LOG_LEVEL": "debug", "KAFSCALE_CACHE_SIZE": "1GiB"}}
    assert parse(spec).spec.config == {
        "KAFSCALE_LOG_LEVEL": "debug",
        "KAFSCALE_CACHE_SIZE": "1GiB",
    }


@pytest.mark.parametrize(
    "key", ["KAFSCALE_NO_SUCH_SETTING", "LOG_LEVEL", "kafscale_log_level", "KAFSCALE_"]
)
def test_an_unknown_setting_is_refused(key: str) -> None:
    with pytest.raises(SpecError) as refused:
        parse({**MINIMAL, "config": {key: "1"}})
    assert str(refused.value) == (
        f"spec.config.{key}: not a KafScale setting (see the README's configuration table)"
    )


def test_a_setting_spelt_in_another_case_is_refused() -> None:
    """The broker reads KAFSCALE_LOG_LEVEL only: KAFSCALE_Log_Level would be put in the
    ConfigMap and silently do nothing (environment variables are case-sensitive)."""
    with pytest.raises(SpecError, match=r"^spec\.config\.KAFSCALE_Log_Level: not a KafScale"):
        parse({**MINIMAL, "config": {"KAFSCALE_Log_Level": "debug"}})


@pytest.mark.parametrize("key", sorted(OPERATOR_OWNED_SETTINGS))
def test_a_setting_the_operator_derives_is_refused(key: str) -> None:
    with pytest.raises(SpecError) as refused:
        parse({**MINIMAL, "config": {key: "x"}})
    assert (
        str(refused.value) == f"spec.config.{key}: set by the operator from the spec's own sections"
    )


@pytest.mark.parametrize("key", SECRETS)
def test_a_secret_setting_is_refused(key: str) -> None:
    with pytest.raises(SpecError) as refused:
        parse({**MINIMAL, "config": {key: "hunter2"}})
    assert str(refused.value) == f"spec.config.{key}: a secret, which a ConfigMap must not hold"
    assert "hunter2" not in str(refused.value)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("KAFSCALE_BUFFER_BYTES", "lots"),
        ("KAFSCALE_LOG_LEVEL", "loud"),
        ("KAFSCALE_METADATA_MAX_TXN_OPS", "2"),
        ("KAFSCALE_COMPRESSION_CODEC", "brotli"),
    ],
)
def test_a_value_the_broker_cannot_parse_is_refused(key: str, value: str) -> None:
    with pytest.raises(SpecError) as refused:
        parse({**MINIMAL, "config": {key: value}})
    message = str(refused.value)
    assert message.startswith(f"spec.config.{key}: ")
    assert len(message) > len(f"spec.config.{key}: ")  # says what was expected


def test_settings_the_broker_refuses_together_are_refused() -> None:
    """Each value parses alone, but the broker's consistency check refuses the pair (a
    metrics certificate without its key): the pods would crash-loop."""
    with pytest.raises(SpecError, match=r"^spec\.config"):
        parse({**MINIMAL, "config": {"KAFSCALE_METRICS_TLS_CERT_FILE": "/etc/metrics/tls.crt"}})
    # The broker itself refuses it: what the operator should say in the status instead.
    with pytest.raises(config.ConfigError, match="METRICS_TLS_KEY_FILE"):
        config.load({"KAFSCALE_METRICS_TLS_CERT_FILE": "/etc/metrics/tls.crt"})


# --- what a schema cannot say, and the model does not check yet ----------------------------------


def node_port(name: str, port: int, base: int) -> dict[str, Any]:
    return {
        "name": name,
        "port": port,
        "external": {
            "type": "NodePort",
            "nodePortBase": base,
            "advertisedHostTemplate": "b{id}.example.com",
        },
    }


def test_node_port_ranges_of_two_listeners_must_not_overlap() -> None:
    """Broker N of each listener gets nodePortBase + N: the same base (or ranges overlapping
    over the brokers) gives two Services one node port, which the API server refuses."""
    spec = changed(
        "brokers.listeners",
        [
            {"name": "INTERNAL", "port": 9092},
            node_port("A", 9094, 31000),
            node_port("B", 9095, 31002),  # broker 2 of A is broker 0 of B
        ],
        MINIMAL,
    )
    spec["brokers"]["replicas"] = 3
    with pytest.raises(SpecError, match=r"^spec\.brokers\.listeners\[2\]\.external\.nodePortBase"):
        parse(spec)


def test_the_last_brokers_node_port_must_be_in_range() -> None:
    spec = changed(
        "brokers.listeners",
        [{"name": "INTERNAL", "port": 9092}, node_port("A", 9094, 32766)],
        MINIMAL,
    )
    spec["brokers"]["replicas"] = 3  # broker 2: 32768
    with pytest.raises(SpecError, match=r"^spec\.brokers\.listeners\[1\]\.external\.nodePortBase"):
        parse(spec)
    spec["brokers"]["replicas"] = 2
    spec["autoscaling"] = {"minReplicas": 1, "maxReplicas": 3}  # the HPA may run broker 2
    with pytest.raises(SpecError, match=r"^spec\.brokers\.listeners\[1\]\.external\.nodePortBase"):
        parse(spec)


def test_a_load_balancer_listener_needs_the_id_in_its_host() -> None:
    """Each broker has its own load balancer: without {id} every broker advertises the same
    host and port, and clients send every partition's requests to one of them."""
    spec = changed("brokers.listeners.3.external.advertisedHostTemplate", "kafka.example.com", FULL)
    with pytest.raises(
        SpecError, match=r"^spec\.brokers\.listeners\[3\]\.external\.advertisedHostTemplate"
    ):
        parse(spec)


def test_a_sasl_listener_needs_a_mechanism() -> None:
    """An empty list gives KAFSCALE_SASL_ENABLED_MECHANISMS="", which the broker refuses."""
    spec = changed("brokers.authentication.mechanisms", [], FULL)
    with pytest.raises(SpecError, match=r"^spec\.brokers\.authentication\.mechanisms"):
        parse(spec)
    with pytest.raises(config.ConfigError, match="SASL_ENABLED_MECHANISMS"):
        config.load({"KAFSCALE_SASL_ENABLED_MECHANISMS": ""})


def test_budgets_beyond_the_default_memory_limit_are_refused() -> None:
    """Without spec.brokers.resources the pod gets the default limit (3Gi); settings whose
    budgets exceed it give pods the kernel kills once their caches fill. With resources that
    hold them, the same settings are fine."""
    big_cache = {"KAFSCALE_CACHE_SIZE": "8GiB"}
    roomy = {"requests": {"cpu": "2", "memory": "12Gi"}, "limits": {"memory": "12Gi"}}
    parsed = parse({**MINIMAL, "config": big_cache, "brokers": {"resources": roomy}})
    budget = brokers.memory_budget(parsed)
    assert quantity_bytes(brokers.DEFAULT_RESOURCES["limits"]["memory"]) < budget
    assert budget < quantity_bytes(roomy["limits"]["memory"])
    with pytest.raises(SpecError, match=r"^spec\.(config|brokers\.resources)"):
        parse({**MINIMAL, "config": big_cache})
