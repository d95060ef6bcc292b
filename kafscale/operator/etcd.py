"""The managed etcd of a KafscaleCluster (docs/design/operator.md, section 3): a StatefulSet of
``replicas`` members with a volume each, a headless Service (members' names) and a client
Service, a PodDisruptionBudget that keeps a quorum, and the backup CronJob. Pure.

Members are ``c-etcd-N``; their peer and client URLs are their stable DNS names, so the initial
cluster is fixed by ``replicas`` at creation. Changing the replicas of a running managed etcd
would need members added or removed one at a time (etcd's runtime reconfiguration), which the
operator does not do: it keeps the existing size and says so in the status.
"""

from __future__ import annotations

from kafscale.operator.model import Cluster, ManagedEtcd
from kafscale.operator.objects import (
    S3_CA_DIR,
    SECRETS_DIR,
    Obj,
    config_name,
    labels,
    metadata,
    selector,
)

ETCD = "etcd"
BACKUP = "metadata-backup"  # the component; the CronJob is <cluster>-backup
CLIENT_PORT = 2379
PEER_PORT = 2380


def name(cluster: Cluster) -> str:
    return f"{cluster.name}-etcd"


def _managed(cluster: Cluster) -> ManagedEtcd:
    managed = cluster.spec.metadata.etcd.managed
    assert managed is not None
    return managed


def _host(cluster: Cluster, member: int | str) -> str:
    return (
        f"{name(cluster)}-{member}.{name(cluster)}.{cluster.namespace}.svc."
        f"{cluster.spec.cluster_domain}"
    )


def endpoints(cluster: Cluster, observed_replicas: int | None = None) -> list[str]:
    """The etcd endpoints the brokers use: the spec's, or every managed member that exists
    (``replicas``: the running size wins over the spec's)."""
    etcd = cluster.spec.metadata.etcd
    if etcd.managed is None:
        return list(etcd.endpoints)
    members = replicas(cluster, observed_replicas)
    return [f"{_host(cluster, n)}:{CLIENT_PORT}" for n in range(members)]


def replicas(cluster: Cluster, observed: int | None) -> int:
    """The members to run: the spec's at creation, the existing count after."""
    return _managed(cluster).replicas if observed is None else observed


def objects(cluster: Cluster, observed_replicas: int | None) -> list[Obj]:
    members = replicas(cluster, observed_replicas)
    out = [headless_service(cluster), client_service(cluster)]
    out.append(statefulset(cluster, members))
    out.append(disruption_budget(cluster, members))
    if _managed(cluster).snapshots is not None:
        out.append(backup_cronjob(cluster))
    return out


def headless_service(cluster: Cluster) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(cluster, name(cluster), ETCD),
        "spec": {
            "clusterIP": "None",
            # Members find each other before they are ready: a quorum forms only once they do.
            "publishNotReadyAddresses": True,
            "selector": selector(cluster, ETCD),
            "ports": [
                {"name": "client", "port": CLIENT_PORT, "targetPort": CLIENT_PORT},
                {"name": "peer", "port": PEER_PORT, "targetPort": PEER_PORT},
            ],
        },
    }


def client_service(cluster: Cluster) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(cluster, f"{name(cluster)}-client", ETCD),
        "spec": {
            "type": "ClusterIP",
            "selector": selector(cluster, ETCD),
            "ports": [{"name": "client", "port": CLIENT_PORT, "targetPort": CLIENT_PORT}],
        },
    }


def statefulset(cluster: Cluster, members: int) -> Obj:
    managed = _managed(cluster)
    peers = ",".join(
        f"{name(cluster)}-{n}=http://{_host(cluster, n)}:{PEER_PORT}" for n in range(members)
    )
    me = f"$(POD_NAME).{name(cluster)}.{cluster.namespace}.svc.{cluster.spec.cluster_domain}"
    container: Obj = {
        "name": ETCD,
        "image": managed.image,
        "imagePullPolicy": cluster.spec.image_pull_policy,
        "command": [
            "etcd",
            "--name=$(POD_NAME)",
            "--data-dir=/var/lib/etcd/data",
            f"--listen-client-urls=http://0.0.0.0:{CLIENT_PORT}",
            f"--advertise-client-urls=http://{me}:{CLIENT_PORT}",
            f"--listen-peer-urls=http://0.0.0.0:{PEER_PORT}",
            f"--initial-advertise-peer-urls=http://{me}:{PEER_PORT}",
            f"--initial-cluster={peers}",
            "--initial-cluster-state=new",
            f"--initial-cluster-token={cluster.namespace}-{cluster.name}",
            "--listen-metrics-urls=http://0.0.0.0:2381",
            # KafScale compacts history itself (KAFSCALE_METADATA_COMPACTION_INTERVAL_MS); this
            # is the quota its records must stay within.
            "--quota-backend-bytes=4294967296",
        ],
        "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        "ports": [
            {"name": "client", "containerPort": CLIENT_PORT},
            {"name": "peer", "containerPort": PEER_PORT},
            {"name": "metrics", "containerPort": 2381},
        ],
        # /readyz: this member serves (it has a leader); /livez: the process is sound.
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": 2381}, "periodSeconds": 5},
        "livenessProbe": {
            "httpGet": {"path": "/livez", "port": 2381},
            "periodSeconds": 10,
            "failureThreshold": 6,
            "initialDelaySeconds": 15,
        },
        "resources": managed.resources
        or {"requests": {"cpu": "250m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [{"name": "data", "mountPath": "/var/lib/etcd"}],
    }
    claim_spec: Obj = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": managed.storage.size}},
    }
    if managed.storage.storage_class_name:
        claim_spec["storageClassName"] = managed.storage.storage_class_name
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": metadata(cluster, name(cluster), ETCD),
        "spec": {
            "serviceName": name(cluster),
            "replicas": members,
            # Members start together: the first waits for a quorum of the others.
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": selector(cluster, ETCD)},
            "template": {
                "metadata": {"labels": labels(cluster, ETCD)},
                "spec": {
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": 10001,
                        "runAsGroup": 10001,
                        "fsGroup": 10001,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "topologySpreadConstraints": [
                        {
                            "maxSkew": 1,
                            "topologyKey": "kubernetes.io/hostname",
                            "whenUnsatisfiable": "ScheduleAnyway",
                            "labelSelector": {"matchLabels": selector(cluster, ETCD)},
                        }
                    ],
                    "containers": [container],
                },
            },
            "volumeClaimTemplates": [
                {
                    "apiVersion": "v1",
                    "kind": "PersistentVolumeClaim",
                    "metadata": {"name": "data", "labels": labels(cluster, ETCD)},
                    "spec": claim_spec,
                }
            ],
            # Deleting the cluster deletes the members' volumes; scaling down keeps them.
            "persistentVolumeClaimRetentionPolicy": {
                "whenDeleted": "Delete",
                "whenScaled": "Retain",
            },
        },
    }


def disruption_budget(cluster: Cluster, members: int) -> Obj:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": metadata(cluster, name(cluster), ETCD),
        "spec": {
            # One member at a time: 3 keep a quorum of 2, 5 of 4; 1 member cannot be evicted.
            "maxUnavailable": 0 if members == 1 else 1,
            "selector": {"matchLabels": selector(cluster, ETCD)},
        },
    }


def backup_name(cluster: Cluster) -> str:
    return f"{cluster.name}-backup"


def backup_bucket(cluster: Cluster, bucket: str) -> str:
    return bucket or cluster.spec.storage.bucket


def backup_prefix(cluster: Cluster) -> str:
    snapshots = _managed(cluster).snapshots
    prefix = snapshots.prefix if snapshots is not None else ""
    return prefix or f"metadata-backups/{cluster.namespace}/{cluster.name}/"


def _kafscale_container(
    cluster: Cluster, container_name: str, args: list[str], env: list[Obj], mounts: list[Obj]
) -> Obj:
    return {
        "name": container_name,
        "image": cluster.image,
        "imagePullPolicy": cluster.spec.image_pull_policy,
        "command": ["kafscale", *args],
        "envFrom": [{"configMapRef": {"name": config_name(cluster)}}],
        "env": env,
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": mounts,
    }


def restore_container(cluster: Cluster, env: list[Obj], mounts: list[Obj]) -> Obj:
    """The brokers' init container: restore the backup before the first broker starts (once)."""
    restore = _managed(cluster).restore
    assert restore is not None
    return _kafscale_container(
        cluster,
        "restore-metadata",
        [
            "metadata",
            "restore",
            "--bucket",
            backup_bucket(cluster, restore.bucket),
            "--key",
            restore.snapshot,
        ],
        env,
        mounts,
    )


def backup_cronjob(cluster: Cluster) -> Obj:
    snapshots = _managed(cluster).snapshots
    assert snapshots is not None
    env: list[Obj] = []
    mounts: list[Obj] = [{"name": "tmp", "mountPath": "/tmp"}]
    volumes: list[Obj] = [{"name": "tmp", "emptyDir": {"sizeLimit": "256Mi"}}]
    if cluster.spec.storage.credentials_secret:
        env += [
            {"name": "KAFSCALE_S3_ACCESS_KEY_FILE", "value": f"{SECRETS_DIR}/s3/access-key"},
            {"name": "KAFSCALE_S3_SECRET_KEY_FILE", "value": f"{SECRETS_DIR}/s3/secret-key"},
        ]
        mounts.append(
            {"name": "s3-credentials", "mountPath": f"{SECRETS_DIR}/s3", "readOnly": True}
        )
        volumes.append(
            {
                "name": "s3-credentials",
                "secret": {"secretName": cluster.spec.storage.credentials_secret},
            }
        )
    if cluster.spec.storage.ca is not None:
        mounts.append({"name": "s3-ca", "mountPath": S3_CA_DIR, "readOnly": True})
        volumes.append({"name": "s3-ca", "secret": {"secretName": cluster.spec.storage.ca.name}})
    container = _kafscale_container(
        cluster,
        BACKUP,
        [
            "metadata",
            "backup",
            "--bucket",
            backup_bucket(cluster, snapshots.bucket),
            "--prefix",
            backup_prefix(cluster),
            "--keep",
            str(snapshots.keep),
        ],
        env,
        mounts,
    )
    return {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        # Short: Kubernetes allows CronJob names of 52 characters (its Jobs add 11).
        "metadata": metadata(cluster, backup_name(cluster), BACKUP),
        "spec": {
            "schedule": snapshots.schedule,
            "concurrencyPolicy": "Forbid",
            "successfulJobsHistoryLimit": 3,
            "failedJobsHistoryLimit": 3,
            "jobTemplate": {
                "spec": {
                    "backoffLimit": 2,
                    "activeDeadlineSeconds": 1800,
                    "template": {
                        "metadata": {"labels": labels(cluster, BACKUP)},
                        "spec": {
                            "restartPolicy": "Never",
                            "automountServiceAccountToken": False,
                            "enableServiceLinks": False,
                            "securityContext": {
                                "runAsNonRoot": True,
                                "runAsUser": 10001,
                                "runAsGroup": 10001,
                                "seccompProfile": {"type": "RuntimeDefault"},
                            },
                            "containers": [container],
                            "volumes": volumes,
                        },
                    },
                }
            },
        },
    }
