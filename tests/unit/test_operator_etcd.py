"""A KafscaleCluster's managed etcd (kafscale/operator/etcd.py): members that find each other by
their stable DNS names, the brokers pointed at them, a disruption budget that keeps a quorum, the
size kept once running, and the metadata backups: the CronJob running ``kafscale metadata
backup`` and the brokers' init container running ``kafscale metadata restore``, each with the
brokers' own settings (loaded with kafscale.config as the broker would)."""

from __future__ import annotations

import re
import socket
import tempfile
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from kafscale import cli, config
from kafscale.operator import cluster, etcd
from tests.unit.test_k8s_manifests import KUBERNETES_VERSIONS
from tests.unit.test_operator_cluster import (
    ADMIN,
    FULL,
    MINIMAL,
    Obj,
    broker_container,
    broker_pod,
    find,
    make,
    objects,
    of_kind,
    pod_environment,
    pod_labels,
    selected,
    with_,
)

MANAGED: Obj = {
    "storage": {"bucket": "data", "credentialsSecret": "s3"},
    "metadata": {"etcd": {"managed": {"snapshots": {"schedule": "*/30 * * * *"}}}},
}


def managed(**fields: Any) -> Obj:
    return with_(
        MANAGED, "metadata.etcd.managed", {**MANAGED["metadata"]["etcd"]["managed"], **fields}
    )


def members(found: list[Obj]) -> Obj:
    return find(found, "StatefulSet", "demo-etcd")


def etcd_container(found: list[Obj]) -> Obj:
    container: Obj
    (container,) = members(found)["spec"]["template"]["spec"]["containers"]
    return container


def flags(found: list[Obj]) -> dict[str, str]:
    command = etcd_container(found)["command"]
    assert command[0] == "etcd"
    return dict(arg.removeprefix("--").split("=", 1) for arg in command[1:])


def expand(text: str, variables: dict[str, str]) -> str:
    """Kubernetes' expansion of ``$(VAR)`` in a container's command (defined variables only)."""
    return re.sub(r"\$\((\w+)\)", lambda m: variables.get(m.group(1), m.group(0)), text)


def backup_job(found: list[Obj]) -> tuple[Obj, Obj]:
    """The backup CronJob's pod spec and its one container."""
    (cron,) = of_kind(found, "CronJob")
    pod_spec = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    (container,) = pod_spec["containers"]
    return pod_spec, container


# --- the members ---------------------------------------------------------------------------------


@pytest.mark.parametrize("replicas", [1, 3, 5])
def test_members_know_each_other_by_stable_dns_names(replicas: int) -> None:
    found = objects(managed(replicas=replicas))
    sts = members(found)
    assert sts["spec"]["replicas"] == replicas
    assert sts["spec"]["podManagementPolicy"] == "Parallel"  # they wait for each other
    headless = find(found, "Service", sts["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is True  # a quorum forms before ready
    assert {p["name"]: p["port"] for p in headless["spec"]["ports"]} == {
        "client": 2379,
        "peer": 2380,
    }
    domain = "demo-etcd.ns.svc.cluster.local"
    given = flags(found)
    assert given["initial-cluster"].split(",") == [
        f"demo-etcd-{n}=http://demo-etcd-{n}.{domain}:2380" for n in range(replicas)
    ]
    assert given["initial-cluster-state"] == "new"
    assert given["initial-cluster-token"] == "ns-demo"
    # Every $(VAR) of the command is a variable the container defines (else Kubernetes leaves
    # it as is), and each member, its name expanded, is the one the others expect.
    env = {v["name"]: v for v in etcd_container(found)["env"]}
    for arg in etcd_container(found)["command"]:
        assert set(re.findall(r"\$\((\w+)\)", arg)) <= env.keys(), arg
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    expected = dict(entry.split("=", 1) for entry in given["initial-cluster"].split(","))
    for n in range(replicas):
        pod = f"demo-etcd-{n}"  # a StatefulSet's pod: <name>-<ordinal>
        own = {k: expand(v, {"POD_NAME": pod}) for k, v in given.items()}
        assert own["name"] == pod
        assert own["initial-advertise-peer-urls"] == expected[pod]
        assert own["advertise-client-urls"] == f"http://{pod}.{domain}:2379"


def test_the_brokers_use_every_member() -> None:
    found = objects(managed())
    advertised = [
        expand(flags(found)["advertise-client-urls"], {"POD_NAME": f"demo-etcd-{n}"})
        for n in range(3)
    ]
    settings = find(found, "ConfigMap", "demo-config")["data"]
    endpoints = settings["KAFSCALE_ETCD_ENDPOINTS"].split(",")
    assert [f"http://{e}" for e in endpoints] == advertised
    assert etcd.endpoints(make(managed())) == endpoints
    assert config.load(settings).etcd_endpoints == tuple(endpoints)
    client = find(found, "Service", "demo-etcd-client")["spec"]
    assert client["ports"] == [{"name": "client", "port": 2379, "targetPort": 2379}]
    pods = pod_labels(found)
    assert selected(client["selector"], pods["demo-etcd"]) == 3
    assert selected(client["selector"], pods["demo-broker"]) == 0


def test_a_custom_cluster_domain_names_the_members() -> None:
    found = objects(with_(managed(replicas=1), "clusterDomain", "corp.internal"))
    assert flags(found)["initial-cluster"] == (
        "demo-etcd-0=http://demo-etcd-0.demo-etcd.ns.svc.corp.internal:2380"
    )
    settings = find(found, "ConfigMap", "demo-config")["data"]
    assert settings["KAFSCALE_ETCD_ENDPOINTS"] == "demo-etcd-0.demo-etcd.ns.svc.corp.internal:2379"


def test_each_member_keeps_its_data_on_its_own_volume() -> None:
    found = objects(managed(storage={"size": "8Gi", "storageClassName": "fast"}))
    sts = members(found)["spec"]
    (claim,) = sts["volumeClaimTemplates"]
    assert claim["spec"] == {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "8Gi"}},
        "storageClassName": "fast",
    }
    (mount,) = etcd_container(found)["volumeMounts"]
    assert mount["name"] == claim["metadata"]["name"]
    assert flags(found)["data-dir"].startswith(mount["mountPath"] + "/")
    assert sts["persistentVolumeClaimRetentionPolicy"] == {
        "whenDeleted": "Delete",
        "whenScaled": "Retain",
    }
    default_claim = members(objects(managed()))["spec"]["volumeClaimTemplates"][0]["spec"]
    assert default_claim["resources"]["requests"]["storage"] == "1Gi"
    assert "storageClassName" not in default_claim  # the cluster's default class


def test_the_probes_use_the_metrics_listener() -> None:
    found = objects(managed())
    container = etcd_container(found)
    metrics = flags(found)["listen-metrics-urls"]
    port = int(metrics.rsplit(":", 1)[1])
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": port}
    assert container["livenessProbe"]["httpGet"] == {"path": "/livez", "port": port}
    assert port in {p["containerPort"] for p in container["ports"]}


@pytest.mark.parametrize(("replicas", "unavailable"), [(1, 0), (3, 1), (5, 1)])
def test_the_disruption_budget_keeps_a_quorum(replicas: int, unavailable: int) -> None:
    found = objects(managed(replicas=replicas))
    budget = find(found, "PodDisruptionBudget", "demo-etcd")["spec"]
    assert budget["maxUnavailable"] == unavailable
    assert replicas - unavailable > replicas // 2  # a quorum stays
    pods = pod_labels(found)
    assert selected(budget["selector"]["matchLabels"], pods["demo-etcd"]) == replicas
    assert selected(budget["selector"]["matchLabels"], pods["demo-broker"]) == 0


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_the_etcd_objects_are_valid_for_kubernetes(version: str) -> None:
    found = objects(managed(replicas=5, restore={"snapshot": "b/x.json.gz"}))
    kinds = set()
    for obj in found:
        if obj["metadata"]["labels"]["app.kubernetes.io/component"] in ("etcd", "metadata-backup"):
            kinds.add(obj["kind"])
            kubernetes_validate.validate(obj, version, strict=True)
    assert kinds == {"Service", "StatefulSet", "PodDisruptionBudget", "CronJob"}


def test_external_etcd_has_no_etcd_objects() -> None:
    found = objects(MINIMAL)
    components = {o["metadata"]["labels"]["app.kubernetes.io/component"] for o in found}
    assert components == {"broker"}
    settings = find(found, "ConfigMap", "demo-config")["data"]
    assert settings["KAFSCALE_ETCD_ENDPOINTS"] == ",".join(MINIMAL["metadata"]["etcd"]["endpoints"])
    assert "initContainers" not in broker_pod(found)["spec"]


# --- a running etcd keeps its size ---------------------------------------------------------------


def test_an_existing_etcd_keeps_its_members() -> None:
    """The initial cluster is fixed at creation: a changed spec.replicas is not applied to a
    running etcd (it would need members added one at a time)."""
    spec = managed(replicas=5)
    found = objects(spec, cluster.Observed(etcd_replicas=3))
    assert members(found)["spec"]["replicas"] == 3
    assert len(flags(found)["initial-cluster"].split(",")) == 3
    assert etcd.replicas(make(spec), 3) == 3
    assert etcd.replicas(make(spec), None) == 5  # none yet: the spec's
    assert members(objects(spec))["spec"]["replicas"] == 5


def test_the_brokers_are_given_the_members_that_exist() -> None:
    """With spec.replicas 5 and 3 members running, the brokers must be given the 3 members,
    not 2 more names that never resolve (a changed list also rolls every broker for nothing).
    The CRD refuses changing replicas, but not setting it where it was left to default."""
    grown = objects(managed(replicas=5), cluster.Observed(etcd_replicas=3))
    settings = find(grown, "ConfigMap", "demo-config")["data"]
    assert settings["KAFSCALE_ETCD_ENDPOINTS"].split(",") == [
        f"demo-etcd-{n}.demo-etcd.ns.svc.cluster.local:2379" for n in range(3)
    ]


def test_the_budget_follows_the_members_that_exist() -> None:
    """With spec.replicas 1 and 3 members running, one member may still go (0 would block
    every node drain)."""
    shrunk = objects(managed(replicas=1), cluster.Observed(etcd_replicas=3))
    assert find(shrunk, "PodDisruptionBudget", "demo-etcd")["spec"]["maxUnavailable"] == 1


# --- backups -----------------------------------------------------------------------------------


def test_the_cronjob_runs_kafscale_metadata_backup() -> None:
    found = objects(managed())
    (cron,) = of_kind(found, "CronJob")
    assert cron["metadata"]["name"] == "demo-backup"
    assert cron["spec"]["schedule"] == "*/30 * * * *"
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"  # one backup at a time
    pod_spec, container = backup_job(found)
    assert pod_spec["restartPolicy"] == "Never"
    assert container["image"] == "kafscale:default"  # the brokers' image
    assert container["command"][0] == "kafscale"
    args = cli.build_parser().parse_args(container["command"][1:])  # the real CLI takes it
    assert (args.command, args.metadata_command) == ("metadata", "backup")
    assert (args.bucket, args.prefix, args.keep) == ("data", "metadata-backups/ns/demo/", 24)
    # The brokers' settings: their etcd, bucket and namespace.
    assert container["envFrom"] == [{"configMapRef": {"name": "demo-config"}}]


def test_the_backup_bucket_prefix_and_count_are_the_specs() -> None:
    spec = managed(
        snapshots={"schedule": "0 3 * * *", "bucket": "backups", "prefix": "kafka/", "keep": 7}
    )
    _, container = backup_job(objects(spec))
    args = cli.build_parser().parse_args(container["command"][1:])
    assert (args.bucket, args.prefix, args.keep) == ("backups", "kafka/", 7)


def test_without_snapshots_there_is_no_cronjob() -> None:
    spec = with_(MANAGED, "metadata.etcd.managed", {})
    assert of_kind(objects(spec), "CronJob") == []


def test_the_backup_job_loads_the_brokers_settings_and_credentials(tmp_path: Path) -> None:
    found = objects(with_(managed(), "storage.ca", {"name": "s3-ca", "key": "ca.pem"}))
    pod_spec, container = backup_job(found)
    env = pod_environment(found, "demo-metadata-backup-x", container, tmp_path, pod_spec)
    assert config.unknown_variables(env) == []
    loaded = config.load(env)  # what `kafscale metadata backup` reads first
    assert (loaded.s3_access_key, loaded.s3_secret_key) == ("AKIAEXAMPLE", "secret-key-example")
    assert loaded.s3_ca_file == "/etc/kafscale/s3-ca/ca.pem"
    (ca_mount,) = [m for m in container["volumeMounts"] if m["name"] == "s3-ca"]
    assert loaded.s3_ca_file.startswith(ca_mount["mountPath"] + "/")
    assert loaded.s3_namespace == "ns-demo"
    assert loaded.etcd_endpoints == tuple(etcd.endpoints(make(managed())))


def test_the_backup_job_runs_unprivileged_and_apart_from_the_brokers() -> None:
    found = objects(managed())
    pod_spec, container = backup_job(found)
    assert pod_spec["securityContext"]["runAsNonRoot"] is True
    assert pod_spec["automountServiceAccountToken"] is False
    assert pod_spec["enableServiceLinks"] is False
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    writable = {m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")}
    assert tempfile.gettempdir() in writable
    # Its pods are not the brokers' or the members': no Service or budget picks them up.
    (cron,) = of_kind(found, "CronJob")
    job_labels = cron["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["labels"]
    for obj in found:
        chosen = obj.get("spec", {}).get("selector")
        if isinstance(chosen, dict):
            chosen = chosen.get("matchLabels", chosen)
            assert not chosen.items() <= job_labels.items(), obj["metadata"]["name"]


def test_the_longest_cluster_name_still_names_a_valid_cronjob() -> None:
    """Kubernetes refuses a CronJob name over 52 characters (its Jobs add 11); the model
    allows cluster names of 40, and the CronJob adds "-backup" (7)."""
    found = objects(managed(), name="k" * 40)
    (cron,) = of_kind(found, "CronJob")
    assert len(cron["metadata"]["name"]) <= 52, cron["metadata"]["name"]


# --- restore -----------------------------------------------------------------------------------


def test_the_restore_runs_before_each_broker_only_when_asked() -> None:
    assert "initContainers" not in broker_pod(objects(managed()))["spec"]
    found = objects(managed(restore={"snapshot": "metadata-backups/ns/demo/ns-demo-1.json.gz"}))
    pod_spec = broker_pod(found)["spec"]
    (init,) = pod_spec["initContainers"]
    assert init["name"] == "restore-metadata"
    args = cli.build_parser().parse_args(init["command"][1:])
    assert (args.command, args.metadata_command) == ("metadata", "restore")
    assert (args.bucket, args.key) == ("data", "metadata-backups/ns/demo/ns-demo-1.json.gz")
    broker_ = broker_container(found)
    # The broker's own settings, variables and Secrets: it restores into the broker's etcd
    # and namespace.
    assert init["envFrom"] == broker_["envFrom"]
    assert init["env"] == broker_["env"]
    assert init["volumeMounts"] == broker_["volumeMounts"]
    assert init["image"] == broker_["image"]


def test_the_restore_reads_from_the_bucket_the_spec_names() -> None:
    found = objects(managed(restore={"snapshot": "x.json.gz", "bucket": "old-cluster"}))
    (init,) = broker_pod(found)["spec"]["initContainers"]
    args = cli.build_parser().parse_args(init["command"][1:])
    assert (args.bucket, args.key) == ("old-cluster", "x.json.gz")


def test_the_restore_loads_the_brokers_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    found = objects(FULL, ADMIN)
    pod_spec = broker_pod(found)["spec"]
    (init,) = pod_spec["initContainers"]
    env = pod_environment(found, "demo-broker-1", init, tmp_path, pod_spec)
    assert config.unknown_variables(env) == []
    monkeypatch.setattr(socket, "gethostname", lambda: "demo-broker-1")
    loaded = config.load(env)  # with no advertised listeners: the restore serves no clients
    # The namespace the backups of this cluster are of: the CronJob reads the same settings.
    _, job = backup_job(found)
    assert job["envFrom"] == init["envFrom"]
    assert loaded.s3_namespace == "ns-demo"
    assert loaded.etcd_endpoints == tuple(etcd.endpoints(make(FULL)))
    assert loaded.metadata_max_txn_ops == 128
