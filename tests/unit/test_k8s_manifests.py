"""k8s/*.yaml against Kubernetes' API schemas and against the broker they run.

Offline: ``kubernetes_validate`` carries the JSON schemas of Kubernetes' API, checked strictly
(an unknown or misspelt field is an error). The other tests check what no schema sees: names and
selectors between the objects, the settings, ports and health paths the broker really has, the
hand-over on stop, and the sizes the broker's memory budgets need.
"""

from __future__ import annotations

import copy
import re
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from kafscale import cli, config
from kafscale.ipc.shm_names import SHM_DIR
from kafscale.settings import SETTINGS, SETTINGS_BY_FIELD, parse_size
from kafscale.supervisor import arbiter, broker, health

K8S = Path(__file__).resolve().parents[2] / "k8s"
# The oldest Kubernetes the manifests are checked against, and the newest schema bundled.
KUBERNETES_VERSIONS = ("1.28", kubernetes_validate.latest_version())

Manifest = dict[str, Any]


def load() -> list[Manifest]:
    documents: list[Manifest] = []
    for path in sorted(K8S.glob("*.yaml")):
        documents.extend(doc for doc in yaml.safe_load_all(path.read_text()) if doc)
    return documents


DOCUMENTS = load()


def one(kind: str, name: str | None = None) -> Manifest:
    found = [
        doc for doc in DOCUMENTS if doc["kind"] == kind and name in (None, doc["metadata"]["name"])
    ]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


STATEFULSET = one("StatefulSet")
HEADLESS = one("Service", STATEFULSET["spec"]["serviceName"])
BOOTSTRAP = one("Service", "kafscale")
CONFIGMAP = one("ConfigMap")
POD = STATEFULSET["spec"]["template"]
(BROKER,) = POD["spec"]["containers"]
ENV = {var["name"]: var for var in BROKER["env"]}


def setting_value(field: str) -> str:
    """What the manifests set a setting to: the pod's variable, the ConfigMap, or its default."""
    setting = SETTINGS_BY_FIELD[field]
    if setting.env in ENV:
        return str(ENV[setting.env]["value"])
    return str(CONFIGMAP["data"].get(setting.env, setting.default))


def quantity_bytes(quantity: str) -> int:
    """A Kubernetes memory quantity (``3Gi``, ``512Mi``, ``1G``) in bytes."""
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6}
    units |= {"G": 10**9, "T": 10**12, "": 1}
    match = re.fullmatch(r"(\d+)([A-Za-z]*)", quantity)
    assert match and match.group(2) in units, quantity
    return int(match.group(1)) * units[match.group(2)]


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_document_is_valid_for_kubernetes(version: str) -> None:
    assert {doc["kind"] for doc in DOCUMENTS} >= {
        "ConfigMap",
        "Service",
        "StatefulSet",
        "PodDisruptionBudget",
    }
    for doc in DOCUMENTS:
        kubernetes_validate.validate(doc, version, strict=True)


def test_the_schema_check_rejects_a_misspelt_field() -> None:
    statefulset = copy.deepcopy(STATEFULSET)
    container = statefulset["spec"]["template"]["spec"]["containers"][0]
    container["readinesProbe"] = container.pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError, match="readinesProbe"):
        kubernetes_validate.validate(statefulset, KUBERNETES_VERSIONS[-1], strict=True)


def test_the_headless_service_names_every_pod_even_before_it_is_ready() -> None:
    assert HEADLESS["spec"]["clusterIP"] == "None"
    assert HEADLESS["spec"]["publishNotReadyAddresses"] is True
    assert STATEFULSET["spec"]["podManagementPolicy"] == "Parallel"
    assert STATEFULSET["spec"]["updateStrategy"]["type"] == "RollingUpdate"


def test_the_bootstrap_service_routes_to_ready_brokers_only() -> None:
    assert BOOTSTRAP["spec"].get("clusterIP") != "None"
    assert not BOOTSTRAP["spec"].get("publishNotReadyAddresses", False)
    assert [port["port"] for port in BOOTSTRAP["spec"]["ports"]] == [9092]
    assert BROKER["readinessProbe"]["httpGet"]["path"] == "/readyz"


def test_selectors_select_the_brokers_pods() -> None:
    labels = POD["metadata"]["labels"]
    selectors = [
        STATEFULSET["spec"]["selector"]["matchLabels"],
        one("PodDisruptionBudget")["spec"]["selector"]["matchLabels"],
        *(doc["spec"]["selector"] for doc in DOCUMENTS if doc["kind"] == "Service"),
        *(c["labelSelector"]["matchLabels"] for c in POD["spec"]["topologySpreadConstraints"]),
    ]
    for selector in selectors:
        assert selector and selector.items() <= labels.items(), selector


def test_ports_are_the_brokers() -> None:
    ports = {port["name"]: port["containerPort"] for port in BROKER["ports"]}
    assert ports == {
        "kafka": int(setting_value("broker_port")),
        "metrics": int(setting_value("metrics_port")),
    }
    assert POD["metadata"]["annotations"]["prometheus.io/port"] == str(ports["metrics"])
    for service in (doc for doc in DOCUMENTS if doc["kind"] == "Service"):
        for port in service["spec"]["ports"]:
            assert ports[port["targetPort"]] == port["port"], (service["metadata"]["name"], port)


def test_every_kafscale_variable_is_a_setting() -> None:
    assert BROKER["envFrom"] == [{"configMapRef": {"name": CONFIGMAP["metadata"]["name"]}}]
    names = [*CONFIGMAP["data"], *ENV]
    assert sum(name.startswith("KAFSCALE_") for name in names) >= 10
    assert config.unknown_variables(dict.fromkeys(names, "")) == []


def test_every_literal_setting_parses() -> None:
    by_env = {setting.env: setting for setting in SETTINGS}
    literals = {**CONFIGMAP["data"], **{n: v["value"] for n, v in ENV.items() if "value" in v}}
    # "ordinal" is the pod's own setting: test_the_broker_id_is_the_pods_ordinal.
    literals.pop("KAFSCALE_BROKER_ID")
    for name, value in literals.items():
        if name in by_env and "$(" not in value:
            by_env[name].parse(value)


def test_credentials_are_files_of_a_mounted_secret() -> None:
    secret_volumes = {v["name"] for v in POD["spec"]["volumes"] if "secret" in v}
    secret_dirs = [m["mountPath"] for m in BROKER["volumeMounts"] if m["name"] in secret_volumes]
    for setting in (setting for setting in SETTINGS if setting.secret):
        assert setting.env not in ENV and setting.env not in CONFIGMAP["data"], setting.env
        if setting.file_env in ENV:
            path = ENV[setting.file_env]["value"]
            assert any(path.startswith(directory + "/") for directory in secret_dirs), path


def test_the_broker_id_is_the_pods_ordinal() -> None:
    assert ENV["KAFSCALE_BROKER_ID"]["value"] == "ordinal"
    # The pods are <statefulset>-<ordinal>: the number after the last "-" is the ordinal.
    assert not re.search(r"-\d+$", STATEFULSET["metadata"]["name"])


def test_each_broker_advertises_its_stable_dns_name() -> None:
    assert ENV["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert ENV["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    headless = HEADLESS["metadata"]["name"]
    assert ENV["KAFSCALE_ADVERTISED_HOST"]["value"] == (
        f"$(POD_NAME).{headless}.$(POD_NAMESPACE).svc.cluster.local"
    )
    # Kubernetes expands $(VAR) only for variables defined earlier in the list.
    defined: set[str] = set()
    for var in BROKER["env"]:
        assert set(re.findall(r"\$\((\w+)\)", var.get("value", ""))) <= defined, var
        defined.add(var["name"])


def test_shards_follow_the_cpu_request() -> None:
    source = ENV["KAFSCALE_SHARDS"]["valueFrom"]["resourceFieldRef"]
    assert source == {"containerName": BROKER["name"], "resource": "requests.cpu"}
    assert BROKER["resources"]["requests"]["cpu"]  # rounded up to whole shards


def test_probes_use_paths_the_metrics_port_serves(tmp_path: Path) -> None:
    probes = [BROKER[probe] for probe in ("startupProbe", "livenessProbe", "readinessProbe")]
    assert all(probe["httpGet"]["port"] == "metrics" for probe in probes)
    assert BROKER["livenessProbe"]["httpGet"]["path"] == "/healthz"
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
            assert status in (200, 503), probe  # /readyz is 503 until the children are up
    finally:
        server.stop()


def test_stopping_hands_partitions_over_within_the_grace_period() -> None:
    command = BROKER["lifecycle"]["preStop"]["exec"]["command"]
    assert command[:2] == ["kafscale", "drain"]
    parsed = cli.build_parser().parse_args(command[1:])  # the real CLI takes it
    assert parsed.command == "drain"
    drain_s = parsed.timeout
    shutdown_s = sum(arbiter.STOP_GRACE_SECONDS.values())  # SIGTERM's ordered shutdown, at most
    handover_s = broker.HANDOVER_WAIT_S  # SIGTERM's hand-over of what the drain left, at most
    assert POD["spec"]["terminationGracePeriodSeconds"] > drain_s + handover_s + shutdown_s


def test_the_pod_runs_unprivileged_on_a_read_only_root() -> None:
    pod = POD["spec"]["securityContext"]
    assert pod["runAsNonRoot"] is True and pod["runAsUser"] == 10001
    assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
    container = BROKER["securityContext"]
    assert container["allowPrivilegeEscalation"] is False
    assert container["capabilities"]["drop"] == ["ALL"]
    assert container["readOnlyRootFilesystem"] is True
    assert POD["spec"]["automountServiceAccountToken"] is False
    # What the broker writes: its runtime directory (tempfile.mkdtemp) and /dev/shm.
    writable = {m["mountPath"] for m in BROKER["volumeMounts"] if not m.get("readOnly")}
    assert writable >= {tempfile.gettempdir(), SHM_DIR}


def test_service_links_are_off_when_they_would_inject_kafscale_variables() -> None:
    # A Service s injects S_SERVICE_HOST, S_PORT, ... (S = s upper-cased, "-" -> "_").
    prefixes = [doc["metadata"]["name"].upper().replace("-", "_") for doc in DOCUMENTS]
    if any(prefix.startswith("KAFSCALE") for prefix in prefixes):
        assert POD["spec"]["enableServiceLinks"] is False


def test_memory_holds_the_brokers_budgets() -> None:
    (shm,) = [m["name"] for m in BROKER["volumeMounts"] if m["mountPath"] == SHM_DIR]
    (volume,) = [v for v in POD["spec"]["volumes"] if v["name"] == shm]
    assert volume["emptyDir"]["medium"] == "Memory"
    buffers = parse_size(setting_value("buffer_bytes"))
    assert quantity_bytes(volume["emptyDir"]["sizeLimit"]) > buffers
    # tmpfs pages count against the container's memory: the limit holds them and the caches.
    caches = ("cache_size", "index_cache_size", "compaction_buffer_bytes")
    budgets = buffers + sum(parse_size(setting_value(field)) for field in caches)
    resources = BROKER["resources"]
    assert quantity_bytes(resources["limits"]["memory"]) > budgets
    assert resources["requests"]["memory"] == resources["limits"]["memory"]


def test_the_disruption_budget_takes_one_broker_at_a_time() -> None:
    assert one("PodDisruptionBudget")["spec"]["maxUnavailable"] == 1
