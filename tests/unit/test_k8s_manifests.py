"""k8s/*.yaml against Kubernetes' API schemas and against the broker (and console) they run.

Offline: ``kubernetes_validate`` carries the JSON schemas of Kubernetes' API, checked strictly
(an unknown or misspelt field is an error). The other tests check what no schema sees: names and
selectors between the objects, the settings, ports and health paths the broker really has, the
hand-over on stop, and the sizes the broker's memory budgets need; for k8s/console.yaml, that the
console's own settings loader takes its environment (with the Secret's file and the brokers'
ConfigMap in place) and that it reaches the brokers of k8s/broker.yaml.
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
from kafscale.console import settings as console_settings
from kafscale.ipc.shm_names import SHM_DIR
from kafscale.settings import SETTINGS, SETTINGS_BY_FIELD, parse_size
from kafscale.supervisor import arbiter, broker, health

K8S = Path(__file__).resolve().parents[2] / "k8s"
# The oldest Kubernetes the manifests are checked against, and the newest schema bundled.
KUBERNETES_VERSIONS = ("1.28", kubernetes_validate.latest_version())

Manifest = dict[str, Any]


def load() -> dict[str, list[Manifest]]:
    """Every k8s/*.yaml: file name -> its documents."""
    return {
        path.name: [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
        for path in sorted(K8S.glob("*.yaml"))
    }


FILES = load()
DOCUMENTS = [doc for docs in FILES.values() for doc in docs]


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
# The brokers' Services (k8s/console.yaml has one of its own).
BROKER_SERVICES = [doc for doc in FILES["broker.yaml"] if doc["kind"] == "Service"]


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
        *(service["spec"]["selector"] for service in BROKER_SERVICES),
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
    for service in BROKER_SERVICES:
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


# --- k8s/console.yaml: the web console of these brokers -------------------------------------------

CONSOLE_DOCS = FILES["console.yaml"]
(CONSOLE_DEPLOYMENT,) = [doc for doc in CONSOLE_DOCS if doc["kind"] == "Deployment"]
(CONSOLE_SERVICE,) = [doc for doc in CONSOLE_DOCS if doc["kind"] == "Service"]
CONSOLE_POD = CONSOLE_DEPLOYMENT["spec"]["template"]
(CONSOLE,) = CONSOLE_POD["spec"]["containers"]
CONSOLE_ENV = {var["name"]: var for var in CONSOLE["env"]}


def console_secret_files() -> dict[str, tuple[str, str]]:
    """Files of the console's Secret volumes: path -> (Secret name, key)."""
    mounts = {m["name"]: m for m in CONSOLE["volumeMounts"]}
    files = {}
    for volume in CONSOLE_POD["spec"]["volumes"]:
        if "secret" in volume:
            mount = mounts[volume["name"]]
            assert mount["readOnly"] is True
            assert volume["secret"]["defaultMode"] == 0o440
            for item in volume["secret"]["items"]:
                path = f"{mount['mountPath']}/{item['path']}"
                files[path] = (volume["secret"]["secretName"], item["key"])
    return files


def console_environment(where: Path) -> dict[str, str]:
    """The console's environment as it sees it: the brokers' ConfigMap's values in place of its
    references, the Secret's files (a dummy password) in ``where``."""
    env = {}
    for name, var in CONSOLE_ENV.items():
        if "valueFrom" in var:
            ref = var["valueFrom"]["configMapKeyRef"]
            assert ref["name"] == CONFIGMAP["metadata"]["name"]  # the brokers' own settings
            env[name] = CONFIGMAP["data"][ref["key"]]
        else:
            env[name] = var["value"]
    for path, (secret, key) in console_secret_files().items():
        local = where / Path(path).name
        local.write_text(f"dummy {secret} {key}\n")
        env = {name: value.replace(path, str(local)) for name, value in env.items()}
    return env


def test_the_console_is_one_pod_behind_its_service() -> None:
    labels = CONSOLE_POD["metadata"]["labels"]
    for selector in (
        CONSOLE_DEPLOYMENT["spec"]["selector"]["matchLabels"],
        CONSOLE_SERVICE["spec"]["selector"],
    ):
        assert selector and selector.items() <= labels.items()
        # ... and never a broker's, nor does a broker's selector take the console.
        assert not selector.items() <= POD["metadata"]["labels"].items()
    for service in BROKER_SERVICES:
        assert not service["spec"]["selector"].items() <= labels.items()
    # Sessions live in memory: one pod, never two at once.
    assert CONSOLE_DEPLOYMENT["spec"]["replicas"] == 1
    assert CONSOLE_DEPLOYMENT["spec"]["strategy"] == {"type": "Recreate"}
    assert CONSOLE["args"] == ["console"] and CONSOLE["image"] == BROKER["image"]


def test_the_console_reads_its_settings(tmp_path: Path) -> None:
    env = console_environment(tmp_path)
    known = {s.env for s in console_settings.SETTINGS}
    known |= {f"{s.env}_FILE" for s in console_settings.SETTINGS if s.secret}
    broker_side = set(env) - known - {"KAFSCALE_LOG_LEVEL"}
    assert broker_side == {"KAFSCALE_ETCD_ENDPOINTS", "KAFSCALE_S3_NAMESPACE"}
    loaded = console_settings.load(env)  # the console's own parser
    assert loaded.ui_username == "admin" and loaded.ui_password == "dummy kafscale-console password"
    assert loaded.metadata is True
    # The brokers of broker.yaml: their bootstrap Service, their metrics port, their store.
    host, port = loaded.bootstrap.split(":")
    assert host == BOOTSTRAP["metadata"]["name"]
    assert int(port) in [p["port"] for p in BOOTSTRAP["spec"]["ports"]]
    (metrics,) = loaded.metrics_urls
    assert metrics == f"http://{{host}}:{setting_value('metrics_port')}/metrics"
    store = config.load(env)
    assert store.etcd_endpoints == config.load(CONFIGMAP["data"]).etcd_endpoints
    assert store.s3_namespace == setting_value("s3_namespace")
    SETTINGS_BY_FIELD["log_level"].parse(env["KAFSCALE_LOG_LEVEL"])


def test_the_consoles_password_is_a_file_of_the_secret_the_header_creates() -> None:
    secrets = {s.env for s in console_settings.SETTINGS if s.secret}
    assert not secrets & set(CONSOLE_ENV)
    files = console_secret_files()
    path = CONSOLE_ENV["KAFSCALE_UI_PASSWORD_FILE"]["value"]
    secret, key = files[path]
    header = (K8S / "console.yaml").read_text().partition("\napiVersion:")[0]
    assert f"kubectl create secret generic {secret}" in header
    assert f"--from-literal={key}=" in header
    assert not [doc for doc in CONSOLE_DOCS if doc["kind"] == "Secret"]  # never a password here


def test_the_console_probes_its_http_port() -> None:
    ports = {port["name"]: port["containerPort"] for port in CONSOLE["ports"]}
    assert ports == {"http": int(CONSOLE_ENV["KAFSCALE_CONSOLE_PORT"]["value"])}
    for probe in (CONSOLE["livenessProbe"], CONSOLE["readinessProbe"]):
        assert probe["httpGet"] == {"path": "/healthz", "port": "http"}
    (port,) = CONSOLE_SERVICE["spec"]["ports"]
    assert ports[port["targetPort"]] == port["port"]


def test_the_console_runs_unprivileged_on_a_read_only_root() -> None:
    pod = CONSOLE_POD["spec"]["securityContext"]
    assert pod["runAsNonRoot"] is True and pod["runAsUser"] == 10001
    assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
    container = CONSOLE["securityContext"]
    assert container["allowPrivilegeEscalation"] is False
    assert container["capabilities"]["drop"] == ["ALL"]
    assert container["readOnlyRootFilesystem"] is True
    assert CONSOLE_POD["spec"]["automountServiceAccountToken"] is False
    # Its Service, kafscale-console, injects KAFSCALE_CONSOLE_PORT=tcp://... where links are on.
    assert CONSOLE_POD["spec"]["enableServiceLinks"] is False
    # What it writes: a temporary copy of a CA, when it has one.
    writable = {m["mountPath"] for m in CONSOLE["volumeMounts"] if not m.get("readOnly")}
    assert writable == {tempfile.gettempdir()}
