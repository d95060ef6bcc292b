"""A KafscaleCluster's broker StatefulSet: the pod that runs ``kafscale serve`` with its
addresses, settings, Secrets, probes, hand-over on stop and resources (the choices of
k8s/broker.yaml, explained there). Pure."""

from __future__ import annotations

from kafscale.ipc.shm_names import SHM_DIR
from kafscale.operator import etcd, model
from kafscale.operator.model import DEFAULT_RESOURCES, Cluster
from kafscale.operator.names import (
    BROKER,
    admin_token_secret,
    headless_name,
    port_name,
    statefulset_name,
)
from kafscale.operator.objects import (
    CONFIG_HASH,
    S3_CA_DIR,
    SECRETS_DIR,
    TLS_DIR,
    Obj,
    config_name,
    digest,
    labels,
    merge,
    metadata,
    selector,
)
from kafscale.settings import SETTINGS_BY_FIELD, parse_size


def advertised_listeners(cluster: Cluster) -> str:
    """KAFSCALE_ADVERTISED_LISTENERS with the pod's names as shell variables: ``${POD_NAME}``,
    ``${POD_NAMESPACE}`` and ``${id}`` (the ordinal)."""
    host = (
        f"${{POD_NAME}}.{headless_name(cluster)}.${{POD_NAMESPACE}}.svc."
        f"{cluster.spec.cluster_domain}"
    )
    parts = []
    for listener in cluster.spec.brokers.listeners:
        external = listener.external
        if external is None:
            parts.append(f"{listener.name}://{host}:{listener.port}")
        else:
            external_host = external.advertised_host_template.replace("{id}", "${id}")
            port = (
                f"$(({external.node_port_base} + id))"
                if external.type == "NodePort"
                else str(listener.port)
            )
            parts.append(f"{listener.name}://{external_host}:{port}")
    return ",".join(parts)


def broker_command(cluster: Cluster) -> list[str]:
    """The container's command: each broker advertises its own addresses, which a
    StatefulSet's shared environment cannot hold (external ones depend on the ordinal), so a
    shell computes them from the pod's name, then becomes the broker."""
    script = (
        'id="${POD_NAME##*-}"\n'
        f'export KAFSCALE_ADVERTISED_LISTENERS="{advertised_listeners(cluster)}"\n'
        "exec kafscale serve\n"
    )
    return ["/bin/sh", "-c", script]


def _env(cluster: Cluster) -> list[Obj]:
    spec = cluster.spec
    env: list[Obj] = [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "KAFSCALE_BROKER_ID", "value": "ordinal"},
        {"name": "KAFSCALE_ADMIN_TOKEN_FILE", "value": f"{SECRETS_DIR}/admin-token/token"},
    ]
    resources = spec.brokers.resources or DEFAULT_RESOURCES
    if "cpu" in (resources.get("requests") or {}):
        # One shard per CPU core requested (rounded up): Python sees the node's cores.
        env.append(
            {
                "name": "KAFSCALE_SHARDS",
                "valueFrom": {
                    "resourceFieldRef": {"containerName": BROKER, "resource": "requests.cpu"}
                },
            }
        )
    if spec.storage.credentials_secret:
        env.append({"name": "KAFSCALE_S3_ACCESS_KEY_FILE", "value": f"{SECRETS_DIR}/s3/access-key"})
        env.append({"name": "KAFSCALE_S3_SECRET_KEY_FILE", "value": f"{SECRETS_DIR}/s3/secret-key"})
    admin = spec.brokers.authentication.admin_secret
    if admin:
        env.append(
            {
                "name": "KAFSCALE_SASL_ADMIN_USER",
                "valueFrom": {"secretKeyRef": {"name": admin, "key": "username"}},
            }
        )
        env.append(
            {
                "name": "KAFSCALE_SASL_ADMIN_PASSWORD_FILE",
                "value": f"{SECRETS_DIR}/sasl-admin/password",
            }
        )
    return env


def _volumes(cluster: Cluster) -> tuple[list[Obj], list[Obj]]:
    spec = cluster.spec
    buffers = parse_size(spec.config.get("KAFSCALE_BUFFER_BYTES", _default("buffer_bytes")))
    volumes: list[Obj] = [
        # Partition buffers live in shared memory, with room for the last cycle's buffers
        # still uploading (the runtime's default /dev/shm is 64 MiB).
        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": _mib(2 * buffers)}},
        # The root filesystem is read-only; the broker writes its runtime directory here.
        {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}},
        {
            "name": "admin-token",
            "secret": {"secretName": admin_token_secret(cluster), "defaultMode": 0o440},
        },
    ]
    mounts: list[Obj] = [
        {"name": "shm", "mountPath": SHM_DIR},
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "admin-token", "mountPath": f"{SECRETS_DIR}/admin-token", "readOnly": True},
    ]

    def secret(name: str, secret_name: str, path: str) -> None:
        volumes.append({"name": name, "secret": {"secretName": secret_name, "defaultMode": 0o440}})
        mounts.append({"name": name, "mountPath": path, "readOnly": True})

    if spec.storage.credentials_secret:
        secret("s3-credentials", spec.storage.credentials_secret, f"{SECRETS_DIR}/s3")
    if spec.storage.ca is not None:
        secret("s3-ca", spec.storage.ca.name, S3_CA_DIR)
    if spec.brokers.tls is not None:
        secret("tls", spec.brokers.tls.secret_name, TLS_DIR)
    if spec.brokers.authentication.admin_secret:
        secret("sasl-admin", spec.brokers.authentication.admin_secret, f"{SECRETS_DIR}/sasl-admin")
    return volumes, mounts


def _default(field: str) -> str:
    return SETTINGS_BY_FIELD[field].default


def _mib(size: int) -> str:
    return f"{-(-size // 2**20)}Mi"


def memory_budget(cluster: Cluster) -> int:
    """Bytes the broker's budgets take at the cluster's settings: what its memory must hold."""
    return model.memory_budget(cluster.spec.config)


def statefulset(cluster: Cluster, config: Obj, replicas: int) -> Obj:
    spec = cluster.spec
    brokers = spec.brokers
    metrics = brokers.metrics_port
    probe_scheme = "HTTPS" if "KAFSCALE_METRICS_TLS_CERT_FILE" in spec.config else "HTTP"
    volumes, mounts = _volumes(cluster)
    container: Obj = {
        "name": BROKER,
        "image": cluster.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": broker_command(cluster),
        "envFrom": [{"configMapRef": {"name": config_name(cluster)}}],
        "env": _env(cluster),
        "ports": [
            *({"name": port_name(li), "containerPort": li.port} for li in brokers.listeners),
            {"name": "metrics", "containerPort": metrics},
        ],
        # Allow 60 s for the metrics port to open: a broker may first wait out its crashed
        # predecessor's lease (one TTL) after the backend checks.
        "startupProbe": {
            "httpGet": {"path": "/healthz", "port": "metrics", "scheme": probe_scheme},
            "periodSeconds": 2,
            "failureThreshold": 30,
        },
        "livenessProbe": {
            "httpGet": {"path": "/healthz", "port": "metrics", "scheme": probe_scheme},
            "periodSeconds": 10,
            "failureThreshold": 3,
        },
        # Every child answers and S3 and etcd answer: only then does the bootstrap Service
        # send clients here.
        "readinessProbe": {
            "httpGet": {"path": "/readyz", "port": "metrics", "scheme": probe_scheme},
            "periodSeconds": 5,
        },
        # Hand every partition over before SIGTERM (SIGTERM hands over whatever is left).
        "lifecycle": {
            "preStop": {
                "exec": {
                    "command": [
                        "kafscale",
                        "drain",
                        "--timeout",
                        "60",
                        "--metrics-url",
                        f"{probe_scheme.lower()}://127.0.0.1:{metrics}",
                    ]
                }
            }
        },
        "resources": brokers.resources or DEFAULT_RESOURCES,
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": mounts,
    }
    pod_spec: Obj = {
        "terminationGracePeriodSeconds": brokers.termination_grace_period_seconds,
        # A Service named like a KAFSCALE_ setting would inject variables into the environment.
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,  # the broker never calls the Kubernetes API
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 10001,
            "runAsGroup": 10001,
            "fsGroup": 10001,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": key,
                "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": {"matchLabels": selector(cluster, BROKER)},
            }
            for key in ("kubernetes.io/hostname", "topology.kubernetes.io/zone")
        ],
        "containers": [container],
        "volumes": volumes,
    }
    if spec.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": name} for name in spec.image_pull_secrets]
    if spec.metadata.etcd.managed is not None and spec.metadata.etcd.managed.restore is not None:
        pod_spec["initContainers"] = [etcd.restore_container(cluster, _env(cluster), mounts)]
    template = brokers.template
    pod_spec = merge(pod_spec, template.spec)
    annotations = {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(metrics),
        **template.metadata.annotations,
        # The settings are read at start: a change rolls the brokers, one at a time (after the
        # template's annotations, which cannot stop it).
        CONFIG_HASH: digest(config["data"]),
    }
    sts_spec: Obj = {
        "serviceName": headless_name(cluster),
        "podManagementPolicy": "Parallel",
        "updateStrategy": {"type": "RollingUpdate"},
        "minReadySeconds": 10,
        "selector": {"matchLabels": selector(cluster, BROKER)},
        "template": {
            "metadata": {
                "labels": {**template.metadata.labels, **labels(cluster, BROKER)},
                "annotations": annotations,
            },
            "spec": pod_spec,
        },
    }
    if cluster.spec.autoscaling is None:
        sts_spec["replicas"] = replicas  # else the HPA owns it
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": metadata(cluster, statefulset_name(cluster), BROKER),
        "spec": sts_spec,
    }
