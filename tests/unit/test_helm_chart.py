"""charts/kafscale, k8s/operator.yaml and the operator image, checked offline.

``helm`` (.tools/bin, scripts/install-deps.sh kube) lints and renders the chart in its two RBAC
modes; the rendered objects go through Kubernetes' API schemas (``kubernetes_validate``, strict);
the RBAC is compared with the table of what the operator needs; the Deployment's environment is
read back by the operator's own settings loader, and the console's (console.enabled) by the
console's, with its mounted Secrets' files in place. k8s/operator.yaml must be the rendered chart,
and every value must be in the chart's README. tests/integration/test_k8s_dry_run.py puts the same
objects in front of a real API server.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import tempfile
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from aiohttp import test_utils

from kafscale import config as broker_config
from kafscale.console import settings as console_settings
from kafscale.console.app import create_app
from kafscale.console.main import build as build_console
from kafscale.operator import model
from kafscale.operator import settings as operator_settings
from kafscale.settings import SETTINGS_BY_FIELD
from tests.harness.paths import ROOT, TOOLS_BIN
from tests.unit.test_dockerfile import stages

CHART = ROOT / "charts" / "kafscale"
HELM = TOOLS_BIN / "helm"
OPERATOR_YAML = ROOT / "k8s" / "operator.yaml"
EXAMPLES = ROOT / "k8s" / "examples"
RELEASE = "kafscale"
NAMESPACE = "kafscale-system"
# The oldest Kubernetes the chart is checked against, and the newest schema bundled.
KUBERNETES_VERSIONS = ("1.28", kubernetes_validate.latest_version())
WATCHED = ["team-a", "team-b"]
# The two RBAC modes, as values.
MODES: dict[str, dict[str, Any]] = {"cluster-wide": {}, "namespaced": {"watchNamespaces": WATCHED}}

Manifest = dict[str, Any]
Grants = dict[tuple[str, str], set[str]]  # (API group, resource) -> verbs

EVERYTHING = {"get", "list", "watch", "create", "patch", "update", "delete"}
# What the operator may do in each namespace it watches (docs/design/operator.md): its own
# resources and their status, and every kind a cluster's objects are made of.
NAMESPACED_GRANTS: Grants = {
    ("kafscale.io", "kafscaleclusters"): {"get", "list", "watch", "patch", "update"},
    ("kafscale.io", "kafscaletopics"): {"get", "list", "watch", "patch", "update"},
    ("kafscale.io", "kafscaleusers"): {"get", "list", "watch", "patch", "update"},
    ("kafscale.io", "kafscaleclusters/status"): {"get", "patch", "update"},
    ("kafscale.io", "kafscaletopics/status"): {"get", "patch", "update"},
    ("kafscale.io", "kafscaleusers/status"): {"get", "patch", "update"},
    ("", "configmaps"): EVERYTHING,
    ("", "services"): EVERYTHING,
    ("", "secrets"): EVERYTHING,
    ("", "events"): {"create", "patch"},
    ("events.k8s.io", "events"): {"create", "patch"},
    ("apps", "statefulsets"): EVERYTHING,
    ("policy", "poddisruptionbudgets"): EVERYTHING,
    ("autoscaling", "horizontalpodautoscalers"): EVERYTHING,
    ("batch", "cronjobs"): EVERYTHING,
    ("monitoring.coreos.com", "servicemonitors"): EVERYTHING,
}
# Cluster-scoped, read-only, in both modes: whether ServiceMonitor is served.
CLUSTER_GRANTS: Grants = {
    ("apiextensions.k8s.io", "customresourcedefinitions"): {"get", "list", "watch"},
}


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run helm with its caches and configuration in a scratch directory (never ~/.config)."""
    if not HELM.exists():
        pytest.fail(f"{HELM} is missing: run scripts/install-deps.sh kube", pytrace=False)
    scratch = Path(tempfile.gettempdir()) / "kafscale-helm-home"
    env = {**os.environ}
    for name in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"):
        env[name] = str(scratch / name.lower())
    result = subprocess.run(
        [str(HELM), *args], capture_output=True, text=True, timeout=120, env=env
    )
    if check and result.returncode != 0:
        pytest.fail(f"helm {' '.join(args)}: {result.stderr or result.stdout}", pytrace=False)
    return result


def template_text(
    values: dict[str, Any] | None = None, namespace: str = NAMESPACE, *extra: str
) -> str:
    """``helm template`` of the chart with ``values`` (as a values file), as text."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as file:
        json.dump(values or {}, file)
        file.flush()
        args = ["template", RELEASE, str(CHART), "--namespace", namespace, "-f", file.name]
        return helm(*args, *extra).stdout


def render(values: dict[str, Any] | None = None, namespace: str = NAMESPACE) -> list[Manifest]:
    return [doc for doc in yaml.safe_load_all(template_text(values, namespace)) if doc]


def one(docs: list[Manifest], kind: str) -> Manifest:
    found = [doc for doc in docs if doc["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def container(docs: list[Manifest]) -> dict[str, Any]:
    (operator,) = operator_deployment(docs)["spec"]["template"]["spec"]["containers"]
    assert isinstance(operator, dict)
    return operator


def operator_deployment(docs: list[Manifest]) -> Manifest:
    """The operator's Deployment (with console.enabled there is a second one)."""
    found = [
        doc
        for doc in docs
        if doc["kind"] == "Deployment"
        and doc["metadata"]["labels"]["app.kubernetes.io/component"] == "operator"
    ]
    assert len(found) == 1, f"expected the operator's Deployment, found {len(found)}"
    return found[0]


def environment(docs: list[Manifest]) -> dict[str, str]:
    return {var["name"]: var["value"] for var in container(docs)["env"]}


def values() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
    return loaded


RENDERED = {mode: render(mode_values) for mode, mode_values in MODES.items()}


# --- the chart as a whole ---------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_helm_lint_strict_passes(mode: str) -> None:
    args = [f"--set=watchNamespaces={{{','.join(WATCHED)}}}"] if MODES[mode] else []
    result = helm("lint", "--strict", str(CHART), *args)
    assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout, result.stdout


def test_the_chart_is_version_0_1_0_of_the_package() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2"
    assert chart["version"] == chart["appVersion"] == "0.1.0"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert chart["appVersion"] == project["version"]


def test_helm_installs_the_three_crds() -> None:
    included = template_text(None, NAMESPACE, "--include-crds")
    crds = [
        doc
        for doc in yaml.safe_load_all(included)
        if doc and doc["kind"] == "CustomResourceDefinition"
    ]
    names = {crd["metadata"]["name"] for crd in crds}
    assert names == {f"kafscale{kind}.kafscale.io" for kind in ("clusters", "topics", "users")}
    # Plain `helm template` leaves them out (k8s/operator.yaml is the operator alone).
    kinds = {doc["kind"] for docs in RENDERED.values() for doc in docs}
    assert "CustomResourceDefinition" not in kinds


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("mode", MODES)
def test_rendered_objects_are_valid_for_kubernetes(mode: str, version: str) -> None:
    docs = RENDERED[mode]
    assert {doc["kind"] for doc in docs} >= {"Deployment", "ServiceAccount", "ClusterRole"}
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)


def test_every_option_renders_valid_objects() -> None:
    """Every value set to something other than its default, through the same schemas."""
    docs = render(
        {
            "image": {"repository": "registry.example.com/kafscale-operator", "tag": "0.2.0"},
            "brokerImage": {"repository": "registry.example.com/kafscale", "tag": "0.2.0"},
            "imagePullSecrets": [{"name": "regcred"}],
            "serviceAccount": {"name": "ops", "annotations": {"team": "data"}},
            "operator": {
                "resyncSeconds": 30,
                "adminTimeoutSeconds": 10,
                "healthPort": 9000,
                "addressMap": {"c-bootstrap.ns.svc:9092": "127.0.0.1:19092"},
            },
            "logLevel": "debug",
            "extraEnv": [{"name": "HTTPS_PROXY", "value": "http://proxy:3128"}],
            "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}},
            "livenessProbe": {"periodSeconds": 5},
            "podAnnotations": {"example.com/owner": "data"},
            "podLabels": {"team": "data"},
            "nodeSelector": {"kubernetes.io/os": "linux"},
            "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": "pool", "operator": "In", "values": ["ops"]}
                                ]
                            }
                        ]
                    }
                }
            },
            "priorityClassName": "system-cluster-critical",
            "fullnameOverride": "ks",
        }
    )
    for doc in docs:
        kubernetes_validate.validate(doc, KUBERNETES_VERSIONS[-1], strict=True)
    pod = one(docs, "Deployment")["spec"]["template"]
    spec, operator = pod["spec"], container(docs)
    assert operator["image"] == "registry.example.com/kafscale-operator:0.2.0"
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    assert spec["serviceAccountName"] == "ops" == one(docs, "ServiceAccount")["metadata"]["name"]
    assert one(docs, "ServiceAccount")["metadata"]["annotations"] == {"team": "data"}
    assert operator["env"][-1] == {"name": "HTTPS_PROXY", "value": "http://proxy:3128"}
    # Helm merges maps with the defaults: the memory limit stays unless set to null.
    assert operator["resources"] == {
        "requests": {"cpu": "50m", "memory": "128Mi"},
        "limits": {"memory": "256Mi"},
    }
    assert operator["livenessProbe"]["periodSeconds"] == 5
    assert operator["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert operator["ports"] == [{"name": "health", "containerPort": 9000}]
    assert pod["metadata"]["annotations"] == {"example.com/owner": "data"}
    assert pod["metadata"]["labels"]["team"] == "data"
    assert spec["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert spec["tolerations"][0]["key"] == "dedicated"
    assert "nodeAffinity" in spec["affinity"]
    assert spec["priorityClassName"] == "system-cluster-critical"
    assert {doc["metadata"]["name"] for doc in docs} == {"ks", "ks-crds", "ops"}
    loaded = operator_settings.load(environment(docs))
    assert loaded.broker_image == "registry.example.com/kafscale:0.2.0"
    assert (loaded.resync_seconds, loaded.admin_timeout, loaded.health_port) == (30, 10, 9000)
    assert loaded.address("c-bootstrap.ns.svc:9092") == "127.0.0.1:19092"
    assert environment(docs)["KAFSCALE_LOG_LEVEL"] == "debug"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "logLevl=debug"], "additional properties 'logLevl' not allowed"),
        (["--set", "logLevel=verbose"], "logLevel"),
        (["--set", "watchNamespaces={Team_A}"], "watchNamespaces/0"),
        (["--set", "operator.resyncSeconds=0"], "resyncSeconds"),
        (["--set", "operator.addressMap.nohost=127.0.0.1:1"], "'nohost' does not match"),
        (["--set", "serviceAccount.create=false"], "serviceAccount.name: name an existing"),
    ],
)
def test_bad_values_are_refused_with_a_message(args: list[str], message: str) -> None:
    result = helm("template", RELEASE, str(CHART), *args, check=False)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr


# --- RBAC ---------------------------------------------------------------------------------------


def granted(docs: list[Manifest], account: str, namespace: str) -> dict[str, Grants]:
    """What the ServiceAccount may do, by scope ("cluster" or a namespace): every binding to it
    resolved to the rules of the role it names."""
    roles = {
        (doc["kind"], doc["metadata"].get("namespace"), doc["metadata"]["name"]): doc
        for doc in docs
        if doc["kind"] in ("Role", "ClusterRole")
    }
    subject = {"kind": "ServiceAccount", "name": account, "namespace": namespace}
    grants: dict[str, Grants] = {}
    for binding in (doc for doc in docs if doc["kind"] in ("RoleBinding", "ClusterRoleBinding")):
        assert binding["subjects"] == [subject], binding["metadata"]["name"]
        ref = binding["roleRef"]
        assert ref["apiGroup"] == "rbac.authorization.k8s.io"
        where = binding["metadata"].get("namespace")
        role = roles[(ref["kind"], where if ref["kind"] == "Role" else None, ref["name"])]
        scope = "cluster" if binding["kind"] == "ClusterRoleBinding" else where
        for rule in role["rules"]:
            # Least privilege: named groups, resources and verbs only.
            assert set(rule) == {"apiGroups", "resources", "verbs"}, rule
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    verbs = grants.setdefault(scope, {}).setdefault((group, resource), set())
                    verbs.update(rule["verbs"])
    return grants


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("cluster-wide", {"cluster": NAMESPACED_GRANTS | CLUSTER_GRANTS}),
        (
            "namespaced",
            {"cluster": CLUSTER_GRANTS, **{namespace: NAMESPACED_GRANTS for namespace in WATCHED}},
        ),
    ],
)
def test_rbac_grants_exactly_what_the_operator_needs(
    mode: str, expected: dict[str, Grants]
) -> None:
    docs = RENDERED[mode]
    account = one(docs, "ServiceAccount")["metadata"]
    assert account["namespace"] == NAMESPACE
    assert granted(docs, account["name"], NAMESPACE) == expected
    for doc in docs:
        for rule in doc.get("rules", []):
            assert "*" not in [*rule["apiGroups"], *rule["resources"], *rule["verbs"]], rule


def test_rbac_can_be_left_to_the_user() -> None:
    docs = render({"rbac": {"create": False}})
    assert {doc["kind"] for doc in docs} == {"ServiceAccount", "Deployment"}


# --- the Deployment -----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_the_operators_settings_come_from_the_values(mode: str) -> None:
    env = environment(RENDERED[mode])
    assert set(env) == {s.env for s in operator_settings.SETTINGS} | {"KAFSCALE_LOG_LEVEL"}
    loaded = operator_settings.load(env)  # the operator's own parser takes every value
    assert loaded.namespaces == tuple(MODES[mode].get("watchNamespaces", ()))
    defaults = {s.env: s.default for s in operator_settings.SETTINGS}
    # The chart's defaults are the operator's: a user reading either sees the same numbers.
    for name in ("BROKER_IMAGE", "HEALTH_PORT", "RESYNC_SECONDS", "ADMIN_TIMEOUT_SECONDS"):
        assert env[f"KAFSCALE_OPERATOR_{name}"] == defaults[f"KAFSCALE_OPERATOR_{name}"], name
    SETTINGS_BY_FIELD["log_level"].parse(env["KAFSCALE_LOG_LEVEL"])


def test_one_operator_at_a_time() -> None:
    deployment = one(RENDERED["cluster-wide"], "Deployment")
    # kopf standalone: no peering, so two replicas (or a rolling update) would both reconcile.
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    pod = deployment["spec"]["template"]
    assert (
        deployment["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    )
    operator = container(RENDERED["cluster-wide"])
    assert operator["image"] == "kafscale-operator:0.1.0"
    assert operator["args"] == ["operator"]


def test_the_liveness_probe_is_the_operators_health_port() -> None:
    docs = RENDERED["cluster-wide"]
    operator = container(docs)
    probe = operator["livenessProbe"]
    assert probe["httpGet"]["path"] == "/healthz"
    ports = {port["name"]: port["containerPort"] for port in operator["ports"]}
    assert ports[probe["httpGet"]["port"]] == operator_settings.load(environment(docs)).health_port
    assert "readinessProbe" not in operator  # nothing routes to the operator
    without = container(render({"operator": {"healthPort": 0}}))  # no endpoint, no probe
    assert "livenessProbe" not in without and "ports" not in without
    assert {"name": "KAFSCALE_OPERATOR_HEALTH_PORT", "value": "0"} in without["env"]


def test_the_pod_meets_the_restricted_pod_security_standard() -> None:
    spec = one(RENDERED["cluster-wide"], "Deployment")["spec"]["template"]["spec"]
    pod = spec["securityContext"]
    assert pod["runAsNonRoot"] is True and pod["runAsUser"] == 10001
    assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
    operator = container(RENDERED["cluster-wide"])["securityContext"]
    assert operator["allowPrivilegeEscalation"] is False
    assert operator["readOnlyRootFilesystem"] is True
    assert operator["capabilities"] == {"drop": ["ALL"]}
    assert spec["automountServiceAccountToken"] is True  # it calls the Kubernetes API
    assert spec["enableServiceLinks"] is False
    mounts = {m["mountPath"] for m in container(RENDERED["cluster-wide"])["volumeMounts"]}
    assert tempfile.gettempdir() in mounts  # the one writable directory


# --- k8s/operator.yaml, the README, the image ---------------------------------------------------


def test_k8s_operator_yaml_is_the_rendered_chart() -> None:
    header, separator, rendered = OPERATOR_YAML.read_text().partition("\n---\n")
    assert separator
    expected = template_text()
    assert separator[1:] + rendered == expected, (
        "k8s/operator.yaml differs from the chart: regenerate it with the command in its header"
    )
    # Above the rendered chart: only the namespace it goes in.
    (namespace,) = [doc for doc in yaml.safe_load_all(header) if doc]
    assert namespace["kind"] == "Namespace" and namespace["metadata"]["name"] == NAMESPACE
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    kubernetes_validate.validate(namespace, KUBERNETES_VERSIONS[-1], strict=True)


def leaves(tree: dict[str, Any], prefix: str = "") -> Iterator[str]:
    """The dotted paths of values.yaml's values (an empty map is a value of its own)."""
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            yield from leaves(value, path + ".")
        else:
            yield path


def readme_table() -> dict[str, str]:
    """The chart README's table of values: `path` -> the default cell's text."""
    rows: dict[str, str] = {}
    _, _, section = (CHART / "README.md").read_text().partition("\n## Values\n")
    for line in section.splitlines():
        match = re.match(r"^\| `([A-Za-z0-9_.]+)` \| `(.*?)` \| .+ \|$", line)
        if match:
            assert match.group(1) not in rows, f"{match.group(1)} twice in the README"
            rows[match.group(1)] = match.group(2)
    return rows


def lookup(tree: dict[str, Any], path: str) -> Any:
    for key in path.split("."):
        tree = tree[key]
    return tree


def test_every_value_is_in_the_readme_with_its_default() -> None:
    tree, rows = values(), readme_table()
    for leaf in leaves(tree):
        documented = [row for row in rows if leaf == row or leaf.startswith(row + ".")]
        assert len(documented) == 1, f"{leaf}: not in charts/kafscale/README.md's table"
    for row, default in rows.items():
        try:
            value = lookup(tree, row)
        except KeyError:
            pytest.fail(f"README.md documents {row}, which values.yaml does not have")
        assert yaml.safe_load(default) == value, f"README.md's default of {row}"


def test_every_top_level_value_is_commented_in_values_yaml() -> None:
    lines = (CHART / "values.yaml").read_text().splitlines()
    for index, line in enumerate(lines):
        if re.match(r"^[A-Za-z]\w*:", line):
            assert index and lines[index - 1].startswith("#"), f"values.yaml: {line!r}"


def test_the_schema_knows_every_value() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["additionalProperties"] is False
    assert set(schema["properties"]) == set(values())


def dockerfile_stage(name: str) -> dict[str, str]:
    for stage in stages():
        if stage[0][1].lower().endswith(f" as {name}"):
            return dict(stage)
    raise AssertionError(f"no stage {name} in the Dockerfile")


def test_the_operator_image_is_a_target_of_the_dockerfile() -> None:
    operator = dockerfile_stage("operator")
    assert json.loads(operator["ENTRYPOINT"]) == ["kafscale"]
    assert (
        json.loads(operator["CMD"]) == ["operator"] == container(RENDERED["cluster-wide"])["args"]
    )
    pod = values()["podSecurityContext"]
    assert operator["USER"] == str(pod["runAsUser"])
    assert operator["EXPOSE"] == str(values()["operator"]["healthPort"])
    install = operator["RUN"]
    assert '"kafscale[operator]"' in install
    assert "--no-index" in install and "--find-links=/wheels" in install
    # The broker (the default target, last) gets kafscale alone; the wheels hold the extra's.
    *_, broker = stages()
    broker_install = dict(broker)["RUN"]
    assert "operator" not in broker_install
    # The broker image gets kafscale and the console extra (test_the_console_runs_from_the_
    # broker_image); the wheels hold both extras'.
    assert '--find-links=/wheels "kafscale[console]" ' in broker_install, broker_install
    assert '".[operator,console]"' in dockerfile_stage("build")["RUN"]
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {re.split(r"[<>=\[ ]", req)[0] for req in extra["optional-dependencies"]["operator"]}
    assert names == {"kopf", "lightkube", "confluent-kafka"}


# --- k8s/examples ---------------------------------------------------------------------------------


def examples() -> dict[str, Manifest]:
    return {path.name: yaml.safe_load(path.read_text()) for path in sorted(EXAMPLES.glob("*.yaml"))}


def test_the_examples_cover_each_kind() -> None:
    kinds = sorted(doc["kind"] for doc in examples().values())
    assert kinds == ["KafscaleCluster", "KafscaleCluster", "KafscaleTopic", "KafscaleUser"]


def test_the_cluster_examples_pass_the_operators_checks() -> None:
    clusters = {
        name: model.parse_cluster(doc, "kafscale:0.1.0")
        for name, doc in examples().items()
        if doc["kind"] == "KafscaleCluster"
    }
    aws, minio = clusters["cluster-aws.yaml"].spec, clusters["cluster-minio.yaml"].spec
    assert aws.metadata.etcd.managed is not None and not aws.storage.endpoint
    assert aws.metadata.etcd.managed.snapshots is not None
    assert minio.metadata.etcd.endpoints and minio.storage.endpoint and minio.storage.path_style
    names = {cluster.name for cluster in clusters.values()}
    for doc in examples().values():
        if doc["kind"] in ("KafscaleTopic", "KafscaleUser"):
            assert doc["spec"]["cluster"] in names


# --- the console (console.enabled) --------------------------------------------------------------

CONSOLE_DIR = "/var/run/secrets/kafscale-console"
# The least a console needs: the brokers, and (auth basic) a user and the Secret of its password.
CONSOLE = {
    "enabled": True,
    "bootstrap": "events-bootstrap.kafka.svc:9092",
    "username": "admin",
    "existingSecret": "kafscale-console",
}
# Everything on: SASL_SSL with the console's own SCRAM user, a CA, metrics, a TLS etcd with a
# client certificate and a user, an Ingress with TLS.
CONSOLE_FULL = {
    **CONSOLE,
    "image": {
        "repository": "registry.example.com/kafscale",
        "tag": "0.2.0",
        "pullPolicy": "Always",
    },
    "passwordKey": "ui",
    "kafka": {
        "securityProtocol": "SASL_SSL",
        "saslMechanism": "SCRAM-SHA-256",
        "saslUsername": "console",
        "saslPasswordSecret": "console-scram",
        "saslPasswordKey": "pw",
        "ca": {"secretName": "events-tls", "key": "ca.pem"},
    },
    "metricsUrls": ["https://{host}:9093/metrics", "https://static:9093/metrics"],
    "metadata": {
        "enabled": True,
        "etcdEndpoints": ["https://etcd-0.etcd:2379", "etcd-1.etcd:2379"],
        "namespace": "kafka-events",
        "etcdTlsSecret": "etcd-client-tls",
        "etcdClientCert": True,
        "etcdUsername": "kafscale",
        "etcdPasswordSecret": "etcd-auth",
    },
    "service": {"type": "LoadBalancer", "port": 443, "annotations": {"example.com/lb": "internal"}},
    "ingress": {
        "enabled": True,
        "className": "nginx",
        "host": "console.example.com",
        "tlsSecret": "console-tls",
        "annotations": {"example.com/rewrite": "no"},
    },
    "logLevel": "debug",
    "extraEnv": [{"name": "KAFSCALE_CONSOLE_SESSION_IDLE_SECONDS", "value": "600"}],
    "resources": {"requests": {"cpu": "50m"}},
    "podAnnotations": {"example.com/owner": "data"},
    "nodeSelector": {"kubernetes.io/os": "linux"},
    "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
    "affinity": {"podAntiAffinity": {}},
}
# A fake private key: the brokers' settings check only that KAFSCALE_ETCD_KEY looks like one.
FAKE_KEY = "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIA==\n-----END PRIVATE KEY-----\n"


def console_docs(docs: list[Manifest]) -> list[Manifest]:
    return [
        doc
        for doc in docs
        if doc["metadata"]["labels"].get("app.kubernetes.io/component") == "console"
    ]


def console_deployment(docs: list[Manifest]) -> Manifest:
    (deployment,) = [doc for doc in console_docs(docs) if doc["kind"] == "Deployment"]
    return deployment


def console_container(docs: list[Manifest]) -> dict[str, Any]:
    (console,) = console_deployment(docs)["spec"]["template"]["spec"]["containers"]
    assert isinstance(console, dict)
    return console


def console_env(docs: list[Manifest]) -> dict[str, dict[str, Any]]:
    return {var["name"]: var for var in console_container(docs)["env"]}


def mounted_files(docs: list[Manifest]) -> dict[str, tuple[str, str, str]]:
    """The credentials volume: file path -> (secret or configMap, its name, the key)."""
    spec = console_deployment(docs)["spec"]["template"]["spec"]
    mounts = {m["name"]: m for m in console_container(docs)["volumeMounts"]}
    files: dict[str, tuple[str, str, str]] = {}
    for volume in spec["volumes"]:
        if "projected" not in volume:
            continue
        mount = mounts[volume["name"]]
        assert mount["readOnly"] is True and mount["mountPath"] == CONSOLE_DIR
        assert volume["projected"]["defaultMode"] == 0o440
        for source in volume["projected"]["sources"]:
            ((kind, ref),) = source.items()
            for item in ref["items"]:
                files[f"{CONSOLE_DIR}/{item['path']}"] = (kind, ref["name"], item["key"])
    return files


def with_mounted_files(docs: list[Manifest], where: Path) -> dict[str, str]:
    """The console container's environment as the console sees it, with the projected volume's
    files in ``where`` (dummy contents: a password, a fake key, a CA) instead of the mount."""
    for path, (_, _, key) in mounted_files(docs).items():
        name = path.removeprefix(CONSOLE_DIR + "/")
        (where / name).write_text(FAKE_KEY if name.endswith(".key") else f"dummy {key}\n")
    env: dict[str, str] = {}
    for name, var in console_env(docs).items():
        assert set(var) == {"name", "value"}, var  # literals and mounted files only
        env[name] = var["value"].replace(CONSOLE_DIR, str(where))
    return env


RENDERED_CONSOLE = render({"console": CONSOLE})
RENDERED_CONSOLE_FULL = render({"console": CONSOLE_FULL})


def test_the_console_is_off_by_default() -> None:
    for docs in RENDERED.values():
        assert console_docs(docs) == []
        assert {doc["kind"] for doc in docs} <= {
            "ServiceAccount",
            "Deployment",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
        }
    assert values()["console"]["enabled"] is False


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("case", ["least", "everything"])
def test_the_console_renders_valid_objects(case: str, version: str) -> None:
    docs = RENDERED_CONSOLE if case == "least" else RENDERED_CONSOLE_FULL
    kinds = sorted(doc["kind"] for doc in console_docs(docs))
    assert kinds == (
        ["Deployment", "Service"] if case == "least" else ["Deployment", "Ingress", "Service"]
    )
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)
    # The operator is rendered as without the console.
    assert [doc for doc in docs if doc not in console_docs(docs)] == RENDERED["cluster-wide"]


def test_the_console_is_one_pod_selected_apart_from_the_operator() -> None:
    docs = RENDERED_CONSOLE
    deployment = console_deployment(docs)
    assert deployment["metadata"]["name"] == f"{RELEASE}-console"
    assert deployment["metadata"]["namespace"] == NAMESPACE
    # Sessions live in memory: one pod, never two at once.
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert "replicas" not in values()["console"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    service = one(console_docs(docs), "Service")
    assert service["metadata"]["name"] == f"{RELEASE}-console"
    for selector in (deployment["spec"]["selector"]["matchLabels"], service["spec"]["selector"]):
        assert selector.items() <= labels.items()
    operator = operator_deployment(docs)
    assert not operator["spec"]["selector"]["matchLabels"].items() <= labels.items()
    operator_labels = operator["spec"]["template"]["metadata"]["labels"]
    assert not service["spec"]["selector"].items() <= operator_labels.items()
    console = console_container(docs)
    assert console["image"] == "kafscale:0.1.0"  # the broker image
    assert console["args"] == ["console"]
    named = render({"console": CONSOLE, "fullnameOverride": "ks"})
    assert {doc["metadata"]["name"] for doc in console_docs(named)} == {"ks-console"}


def test_the_consoles_settings_come_from_the_values(tmp_path: Path) -> None:
    env = with_mounted_files(RENDERED_CONSOLE, tmp_path)
    known = {s.env for s in console_settings.SETTINGS}
    known |= {f"{s.env}_FILE" for s in console_settings.SETTINGS if s.secret}
    assert set(env) <= known | {"KAFSCALE_LOG_LEVEL"}
    loaded = console_settings.load(env)  # the console's own parser takes every value
    assert loaded.bootstrap == CONSOLE["bootstrap"]
    assert (loaded.auth, loaded.ui_username, loaded.ui_password) == (
        "basic",
        "admin",
        "dummy password",
    )
    assert loaded.port == 8088 and loaded.host == "0.0.0.0"
    assert (loaded.security_protocol, loaded.metadata, loaded.metrics_urls) == (
        "PLAINTEXT",
        False,
        (),
    )
    assert loaded.secure_cookies is False
    SETTINGS_BY_FIELD["log_level"].parse(env["KAFSCALE_LOG_LEVEL"])
    # The chart's defaults are the console's.
    defaults = {s.env: s.default for s in console_settings.SETTINGS}
    for name in ("KAFSCALE_CONSOLE_SECURITY_PROTOCOL", "KAFSCALE_CONSOLE_SASL_MECHANISM"):
        assert env[name] == defaults[name], name
    assert mounted_files(RENDERED_CONSOLE) == {
        f"{CONSOLE_DIR}/ui-password": ("secret", "kafscale-console", "password")
    }


def test_every_console_option_reaches_its_setting(tmp_path: Path) -> None:
    docs = RENDERED_CONSOLE_FULL
    env = with_mounted_files(docs, tmp_path)
    loaded = console_settings.load(env)
    assert (loaded.security_protocol, loaded.sasl_mechanism) == ("SASL_SSL", "SCRAM-SHA-256")
    assert (loaded.sasl_username, loaded.sasl_password) == ("console", "dummy pw")
    assert loaded.ui_password == "dummy ui"
    assert loaded.ssl_ca_file == str(tmp_path / "kafka-ca.crt")
    assert loaded.metrics_urls == tuple(CONSOLE_FULL["metricsUrls"])  # type: ignore[arg-type]
    assert loaded.metadata is True
    assert loaded.secure_cookies is True  # the Ingress has TLS
    assert loaded.session_idle == 600  # extraEnv, after the chart's own
    # The metadata store: read with the brokers' own settings.
    store = broker_config.load(env)
    assert store.etcd_endpoints == ("https://etcd-0.etcd:2379", "etcd-1.etcd:2379")
    assert store.s3_namespace == "kafka-events"
    assert store.etcd_ca_file == str(tmp_path / "etcd-ca.crt")
    assert store.etcd_cert_file == str(tmp_path / "etcd-client.crt")
    assert store.etcd_key == FAKE_KEY.strip()
    assert (store.etcd_username, store.etcd_password) == ("kafscale", "dummy password")
    unknown = broker_config.unknown_variables(env)
    assert all(
        name.startswith("KAFSCALE_CONSOLE_")
        or name == "KAFSCALE_UI_USERNAME"
        or name == "KAFSCALE_UI_PASSWORD_FILE"
        for name in unknown
    ), unknown
    assert mounted_files(docs) == {
        f"{CONSOLE_DIR}/ui-password": ("secret", "kafscale-console", "ui"),
        f"{CONSOLE_DIR}/sasl-password": ("secret", "console-scram", "pw"),
        f"{CONSOLE_DIR}/kafka-ca.crt": ("secret", "events-tls", "ca.pem"),
        f"{CONSOLE_DIR}/etcd-ca.crt": ("secret", "etcd-client-tls", "ca.crt"),
        f"{CONSOLE_DIR}/etcd-client.crt": ("secret", "etcd-client-tls", "tls.crt"),
        f"{CONSOLE_DIR}/etcd-client.key": ("secret", "etcd-client-tls", "tls.key"),
        f"{CONSOLE_DIR}/etcd-password": ("secret", "etcd-auth", "password"),
    }
    pod = console_deployment(docs)["spec"]["template"]
    console = console_container(docs)
    assert console["image"] == "registry.example.com/kafscale:0.2.0"
    assert console["imagePullPolicy"] == "Always"
    assert console["resources"] == {
        "requests": {"cpu": "50m", "memory": "256Mi"},
        "limits": {"memory": "512Mi"},
    }
    assert pod["metadata"]["annotations"] == {"example.com/owner": "data"}
    assert pod["spec"]["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert pod["spec"]["tolerations"][0]["key"] == "dedicated"
    assert pod["spec"]["affinity"] == {"podAntiAffinity": {}}
    service = one(console_docs(docs), "Service")
    assert service["spec"]["type"] == "LoadBalancer"
    assert service["spec"]["ports"] == [{"name": "http", "port": 443, "targetPort": "http"}]
    assert service["metadata"]["annotations"] == {"example.com/lb": "internal"}


def test_the_sasl_login_mode_with_a_ca_from_a_configmap(tmp_path: Path) -> None:
    docs = render(
        {
            "console": {
                "enabled": True,
                "bootstrap": "events-bootstrap.kafka.svc:9094",
                "auth": "sasl",
                "kafka": {"securityProtocol": "SASL_SSL", "ca": {"configMapName": "kafka-ca"}},
            }
        }
    )
    env = with_mounted_files(docs, tmp_path)
    assert not {"KAFSCALE_UI_USERNAME", "KAFSCALE_UI_PASSWORD_FILE"} & set(env)
    assert "KAFSCALE_CONSOLE_SASL_PASSWORD_FILE" not in env  # each user logs in as themselves
    loaded = console_settings.load(env)
    assert loaded.auth == "sasl" and loaded.ssl_ca_file == str(tmp_path / "kafka-ca.crt")
    assert mounted_files(docs) == {
        f"{CONSOLE_DIR}/kafka-ca.crt": ("configMap", "kafka-ca", "ca.crt")
    }


@pytest.mark.parametrize(
    "docs", [RENDERED_CONSOLE, RENDERED_CONSOLE_FULL], ids=["least", "everything"]
)
def test_no_console_credential_is_a_plain_value(docs: list[Manifest]) -> None:
    secret_settings = {s.env for s in console_settings.SETTINGS if s.secret}
    secret_settings |= {s.env for s in SETTINGS_BY_FIELD.values() if s.secret}
    env = console_env(docs)
    assert not secret_settings & set(env)
    files = mounted_files(docs)
    for name, var in env.items():
        assert set(var) == {"name", "value"}, var
        if var["value"].startswith(CONSOLE_DIR + "/"):
            assert name.endswith("_FILE") and var["value"] in files, name
        if name.removesuffix("_FILE") in secret_settings:  # a password or a key: a Secret's
            assert files[var["value"]][0] == "secret", name
        elif "PASSWORD" in name:
            pytest.fail(f"{name} is not a secret setting's _FILE")
    # Nothing in the chart can take a password: the schema refuses one.
    result = helm("template", RELEASE, str(CHART), "--set", "console.password=hunter2", check=False)
    assert result.returncode != 0 and "'password' not allowed" in result.stderr, result.stderr


def test_the_console_pod_is_restricted_with_a_writable_tmp_only() -> None:
    spec = console_deployment(RENDERED_CONSOLE_FULL)["spec"]["template"]["spec"]
    pod = spec["securityContext"]
    assert pod["runAsNonRoot"] is True and pod["runAsUser"] == 10001
    assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
    console = console_container(RENDERED_CONSOLE_FULL)
    context = console["securityContext"]
    assert context["allowPrivilegeEscalation"] is False
    assert context["readOnlyRootFilesystem"] is True
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert spec["automountServiceAccountToken"] is False  # it never calls the Kubernetes API
    # Its own Service, <release>-console, would inject KAFSCALE_CONSOLE_PORT=tcp://...
    assert spec["enableServiceLinks"] is False
    writable = {m["mountPath"] for m in console["volumeMounts"] if not m.get("readOnly")}
    # The Kafka client copies the CA into a temporary file (librdkafka reads a CA from a file).
    assert writable == {tempfile.gettempdir()}
    (tmp,) = [v for v in spec["volumes"] if v["name"] == "tmp"]
    assert "emptyDir" in tmp


def test_the_console_probes_ask_a_path_the_console_serves(tmp_path: Path) -> None:
    console = console_container(RENDERED_CONSOLE)
    ports = {port["name"]: port["containerPort"] for port in console["ports"]}
    for probe in (console["livenessProbe"], console["readinessProbe"]):
        assert probe["httpGet"]["path"] == "/healthz"
        assert ports[probe["httpGet"]["port"]] == 8088
    env = with_mounted_files(RENDERED_CONSOLE, tmp_path)
    assert int(env["KAFSCALE_CONSOLE_PORT"]) == ports["http"]
    service = one(console_docs(RENDERED_CONSOLE), "Service")
    assert service["spec"]["ports"] == [{"name": "http", "port": 8088, "targetPort": "http"}]
    # The real application, built from the rendered settings, answers the probe without a login.
    state = build_console(console_settings.load(env), env)

    async def healthz() -> int:
        async with test_utils.TestClient(test_utils.TestServer(create_app(state))) as client:
            reply = await client.get("/healthz", allow_redirects=False)
            return reply.status

    assert asyncio.run(healthz()) == 200


def test_the_console_ingress_is_optional() -> None:
    assert "Ingress" not in {doc["kind"] for doc in RENDERED_CONSOLE}
    ingress = one(console_docs(RENDERED_CONSOLE_FULL), "Ingress")
    assert ingress["spec"]["ingressClassName"] == "nginx"
    assert ingress["spec"]["tls"] == [
        {"hosts": ["console.example.com"], "secretName": "console-tls"}
    ]
    (rule,) = ingress["spec"]["rules"]
    assert rule["host"] == "console.example.com"
    (path,) = rule["http"]["paths"]
    assert path["backend"]["service"] == {"name": f"{RELEASE}-console", "port": {"name": "http"}}
    assert ingress["metadata"]["annotations"] == {"example.com/rewrite": "no"}
    # Plain HTTP through an Ingress: cookies are Secure only when asked for.
    plain = {"enabled": True, "host": "console.example.com"}
    for secure in (False, True):
        docs = render({"console": {**CONSOLE, "ingress": plain, "secureCookies": secure}})
        assert "tls" not in one(console_docs(docs), "Ingress")["spec"]
        cookie = console_env(docs)["KAFSCALE_CONSOLE_SECURE_COOKIES"]["value"]
        assert cookie == str(secure).lower()


@pytest.mark.parametrize(
    ("console", "message"),
    [
        (
            {"auth": "ldap"},
            "at '/console/auth': value must be one of 'basic', 'sasl'",
        ),
        ({"kafka": {"securityProtocol": "TLS"}}, "/console/kafka/securityProtocol"),
        ({"bootstrap": "no-port"}, "/console/bootstrap"),
        ({"metricsUrls": ["ftp://b:9093/metrics"]}, "/console/metricsUrls/0"),
        ({"existingSecret": "Not_A_Name"}, "/console/existingSecret"),
        ({"replicas": 2}, "additional properties 'replicas' not allowed"),
        ({"bootstrap": ""}, "console.bootstrap: name the brokers' host:port"),
        ({"existingSecret": ""}, "console.existingSecret: auth basic needs a Secret"),
        ({"username": ""}, "console.username: auth basic needs"),
        ({"auth": "sasl"}, "console.auth sasl needs console.kafka.securityProtocol SASL_SSL"),
        (
            {"kafka": {"securityProtocol": "SASL_PLAINTEXT"}},
            "console.kafka.saslUsername: securityProtocol SASL_PLAINTEXT needs",
        ),
        (
            {"kafka": {"ca": {"secretName": "a", "configMapName": "b"}}},
            "give secretName or configMapName, not both",
        ),
        ({"metadata": {"enabled": True}}, "console.metadata.etcdEndpoints"),
        (
            {"metadata": {"enabled": True, "etcdEndpoints": ["etcd:2379"]}},
            "console.metadata.namespace",
        ),
        ({"ingress": {"enabled": True}}, "console.ingress.host"),
    ],
)
def test_bad_console_values_are_refused_with_a_message(
    console: dict[str, Any], message: str
) -> None:
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as file:
        json.dump({"console": {**CONSOLE, **console}}, file)
        file.flush()
        result = helm("template", RELEASE, str(CHART), "-f", file.name, check=False)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr


def test_the_console_runs_from_the_broker_image() -> None:
    *_, broker = stages()
    image = dict(broker)
    assert json.loads(image["ENTRYPOINT"]) == ["kafscale"]  # the chart's args: ["console"]
    assert '"kafscale[console]"' in image["RUN"]
    assert image["USER"] == str(values()["console"]["podSecurityContext"]["runAsUser"])
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {re.split(r"[<>=\[ ]", req)[0] for req in extra["optional-dependencies"]["console"]}
    assert names == {"aiohttp", "jinja2", "confluent-kafka"}


def test_helm_lint_strict_passes_with_the_console() -> None:
    # (NOTES.txt needs a cluster to render: tests/integration/test_k8s_dry_run.py reads it.)
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as file:
        json.dump({"console": CONSOLE_FULL}, file)
        file.flush()
        result = helm("lint", "--strict", str(CHART), "-f", file.name)
    assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout, result.stdout


@pytest.mark.parametrize("doc", ["charts/kafscale/README.md", "docs/kubernetes.md"])
def test_the_documented_console_values_work(doc: str, tmp_path: Path) -> None:
    """The console-values.yaml the docs show renders, and the console takes its settings."""
    (block,) = re.findall(
        r"```yaml\n(# console-values\.yaml.*?)```", (ROOT / doc).read_text(), re.S
    )
    docs = render(yaml.safe_load(block))
    env = with_mounted_files(docs, tmp_path)
    loaded = console_settings.load(env)
    assert loaded.metadata and loaded.metrics_urls == ("http://{host}:9093/metrics",)
    assert broker_config.load(env).s3_namespace == "kafka-events"
    secret = mounted_files(docs)[f"{CONSOLE_DIR}/ui-password"][1]
    assert f"create secret generic {secret}" in (ROOT / doc).read_text()
