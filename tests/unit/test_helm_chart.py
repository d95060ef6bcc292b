"""charts/kafscale, k8s/operator.yaml and the operator image, checked offline.

``helm`` (.tools/bin, scripts/install-deps.sh kube) lints and renders the chart in its two RBAC
modes; the rendered objects go through Kubernetes' API schemas (``kubernetes_validate``, strict);
the RBAC is compared with the table of what the operator needs; the Deployment's environment is
read back by the operator's own settings loader. k8s/operator.yaml must be the rendered chart, and
every value must be in the chart's README. tests/integration/test_k8s_dry_run.py puts the same
objects in front of a real API server.
"""

from __future__ import annotations

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
    (operator,) = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert isinstance(operator, dict)
    return operator


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
    assert "[operator]" not in broker_install
    assert re.search(r"--find-links=/wheels kafscale( |$)", broker_install), broker_install
    assert '".[operator]"' in dockerfile_stage("build")["RUN"]
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
