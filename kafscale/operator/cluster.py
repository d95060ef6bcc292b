"""A KafscaleCluster's objects (docs/design/operator.md, sections 3 and 4). Pure: the checked spec
and what was observed in, the objects to apply out.

Names, for a cluster ``c``: ConfigMap ``c-config``; Services ``c-brokers`` (headless: pod names)
and ``c-bootstrap`` (clients); StatefulSet ``c-broker`` (pods ``c-broker-N`` are broker N);
``c-broker-N-external`` per broker of an external listener; PDB and HPA ``c-broker``; Secret
``c-admin-token`` (made once by the I/O layer, `generated_secrets`). The managed etcd's objects
come from `kafscale.operator.etcd`.
"""

from __future__ import annotations

from dataclasses import dataclass

from kafscale.ipc.shm_names import SHM_DIR
from kafscale.operator import etcd
from kafscale.operator.model import Cluster, ListenerSpec
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

BROKER = "broker"
# Budgets the pod's memory must hold besides the partition buffers (k8s/broker.yaml explains).
CACHE_SETTINGS = ("cache_size", "index_cache_size", "compaction_buffer_bytes")
# Marks the headless Service, the one a ServiceMonitor scrapes through (every pod's port).
SERVICE_LABEL = "kafscale.io/service"
DEFAULT_RESOURCES: Obj = {"requests": {"cpu": "2", "memory": "3Gi"}, "limits": {"memory": "3Gi"}}


@dataclass(frozen=True)
class Observed:
    """What the I/O layer read that the objects depend on."""

    # The username in spec.brokers.authentication.adminSecret (None: no secret, or not yet).
    admin_user: str | None = None
    # The broker StatefulSet as it is: spec.replicas, status.replicas and readyReplicas, and
    # whether the controller has seen its latest spec (None: no StatefulSet yet).
    broker_replicas: int | None = None
    broker_status_replicas: int = 0
    broker_ready_replicas: int = 0
    broker_observed_current: bool = True
    # The managed etcd StatefulSet's replicas (None: none yet).
    etcd_replicas: int | None = None
    # Whether the API serves monitoring.coreos.com/v1 ServiceMonitor.
    service_monitor_served: bool = False


@dataclass(frozen=True)
class Desired:
    objects: list[Obj]
    # The broker StatefulSet's replicas as applied now (the spec's, or one step towards it).
    broker_replicas: int
    # Why the applied replicas are not the spec's yet, for the status ("" when they are).
    scaling: str


def headless_name(cluster: Cluster) -> str:
    return f"{cluster.name}-brokers"


def bootstrap_name(cluster: Cluster) -> str:
    return f"{cluster.name}-bootstrap"


def statefulset_name(cluster: Cluster) -> str:
    return f"{cluster.name}-{BROKER}"


def admin_token_secret(cluster: Cluster) -> str:
    return f"{cluster.name}-admin-token"


def internal_listener(cluster: Cluster) -> ListenerSpec:
    """The listener the operator and in-cluster clients use: the first internal one."""
    return next(li for li in cluster.spec.brokers.listeners if li.external is None)


def bootstrap_address(cluster: Cluster) -> str:
    listener = internal_listener(cluster)
    return (
        f"{bootstrap_name(cluster)}.{cluster.namespace}.svc.{cluster.spec.cluster_domain}"
        f":{listener.port}"
    )


def generated_secrets(cluster: Cluster) -> dict[str, tuple[str, ...]]:
    """Secrets the operator creates once with random values, by name: their keys."""
    return {admin_token_secret(cluster): ("token",)}


def broker_replicas(cluster: Cluster, observed: Observed) -> tuple[int, str]:
    """The StatefulSet's replicas to apply now, and why it is not the spec's yet.

    Up: at once. Down: one broker at a time, and only when the previous step is done (no pod
    beyond the current count left, the controller caught up) and every remaining broker is
    ready -- so at most one broker's partitions move at once, to brokers that are up
    (each leaving broker's preStop drain hands them over).
    """
    want = cluster.spec.brokers.replicas
    now = observed.broker_replicas
    if now is None or want >= now:
        return want, ""
    if not observed.broker_observed_current or observed.broker_status_replicas > now:
        return now, f"scaling down to {want}: waiting for the previous broker to stop"
    if observed.broker_ready_replicas < now:
        return now, (
            f"scaling down to {want}: waiting for all {now} brokers to be ready "
            f"({observed.broker_ready_replicas} are) before the next one leaves"
        )
    step = now - 1
    return step, "" if step == want else f"scaling down to {want}: one broker at a time"


def desired(cluster: Cluster, observed: Observed) -> Desired:
    """Every object the cluster should have now."""
    replicas, scaling = (
        (cluster.spec.autoscaling.min_replicas, "")
        if cluster.spec.autoscaling is not None
        else broker_replicas(cluster, observed)
    )
    config = config_map(cluster, observed)
    objects: list[Obj] = [
        config,
        headless_service(cluster),
        bootstrap_service(cluster),
        statefulset(cluster, config, replicas),
        disruption_budget(cluster),
    ]
    # A Service for every broker that may run: up to the HPA's maximum, and while scaling down
    # for the brokers still draining.
    scaling_spec = cluster.spec.autoscaling
    most = (
        scaling_spec.max_replicas
        if scaling_spec is not None
        else max(replicas, cluster.spec.brokers.replicas)
    )
    objects.extend(external_services(cluster, most))
    if cluster.spec.autoscaling is not None:
        objects.append(autoscaler(cluster))
    if cluster.spec.metadata.etcd.managed is not None:
        objects.extend(etcd.objects(cluster, observed.etcd_replicas))
    monitor = cluster.spec.monitoring.service_monitor
    if monitor or (monitor is None and observed.service_monitor_served):
        objects.append(service_monitor(cluster))
    return Desired(objects=objects, broker_replicas=replicas, scaling=scaling)


# --- the brokers' settings ---------------------------------------------------------------------


def settings(cluster: Cluster, observed: Observed) -> dict[str, str]:
    """The KAFSCALE_* settings every broker shares (the ConfigMap's data)."""
    spec = cluster.spec
    brokers = spec.brokers
    out: dict[str, str] = {
        "KAFSCALE_BROKER_HOST": "0.0.0.0",
        "KAFSCALE_LISTENERS": ",".join(f"{li.name}://:{li.port}" for li in brokers.listeners),
        "KAFSCALE_LISTENER_SECURITY_PROTOCOL_MAP": ",".join(
            f"{li.name}:{li.protocol}" for li in brokers.listeners
        ),
        "KAFSCALE_METRICS_PORT": str(brokers.metrics_port),
        "KAFSCALE_S3_BUCKET": spec.storage.bucket,
        "KAFSCALE_S3_REGION": spec.storage.region,
        "KAFSCALE_S3_NAMESPACE": spec.storage.namespace or f"{cluster.namespace}-{cluster.name}",
        "KAFSCALE_ETCD_ENDPOINTS": ",".join(etcd.endpoints(cluster)),
    }
    if spec.storage.endpoint:
        out["KAFSCALE_S3_ENDPOINT"] = spec.storage.endpoint
    if spec.storage.path_style:
        out["KAFSCALE_S3_PATH_STYLE"] = "true"
    if spec.storage.ca is not None:
        out["KAFSCALE_S3_CA_FILE"] = f"{S3_CA_DIR}/{spec.storage.ca.key}"
    if brokers.tls is not None:
        out["KAFSCALE_SSL_CERT_FILE"] = f"{TLS_DIR}/tls.crt"
        out["KAFSCALE_SSL_KEY_FILE"] = f"{TLS_DIR}/tls.key"
        if brokers.tls.client_auth != "none":
            out["KAFSCALE_SSL_CA_FILE"] = f"{TLS_DIR}/ca.crt"
            out["KAFSCALE_SSL_CLIENT_AUTH"] = brokers.tls.client_auth
    if any(li.sasl for li in brokers.listeners):
        out["KAFSCALE_SASL_ENABLED_MECHANISMS"] = ",".join(brokers.authentication.mechanisms)
    authorization = brokers.authorization
    if authorization.type == "acl":
        out["KAFSCALE_AUTHORIZER"] = "acl"
        supers = list(authorization.super_users)
        if observed.admin_user and f"User:{observed.admin_user}" not in supers:
            supers.insert(0, f"User:{observed.admin_user}")
        out["KAFSCALE_SUPER_USERS"] = ";".join(supers)
        out["KAFSCALE_ALLOW_EVERYONE_IF_NO_ACL_FOUND"] = str(
            authorization.allow_everyone_if_no_acl_found
        ).lower()
    out.update(spec.config)
    return out


def config_map(cluster: Cluster, observed: Observed) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(cluster, config_name(cluster), BROKER),
        "data": settings(cluster, observed),
    }


# --- Services ----------------------------------------------------------------------------------


def metadata_with(meta: Obj, extra_labels: dict[str, str]) -> Obj:
    return {**meta, "labels": {**meta["labels"], **extra_labels}}


def _listener_ports(cluster: Cluster, internal_only: bool) -> list[Obj]:
    return [
        {"name": _port_name(li), "port": li.port, "targetPort": li.port}
        for li in cluster.spec.brokers.listeners
        if not (internal_only and li.external is not None)
    ]


def _port_name(listener: ListenerSpec) -> str:
    # A port name is a DNS label of at most 15 characters.
    return listener.name.lower().replace("_", "-")[:15].strip("-") or "kafka"


def headless_service(cluster: Cluster) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata_with(
            metadata(cluster, headless_name(cluster), BROKER), {SERVICE_LABEL: "headless"}
        ),
        "spec": {
            "clusterIP": "None",
            # A broker's name resolves before it is ready: brokers boot and drain while others
            # (and clients holding Metadata that names them) already address them.
            "publishNotReadyAddresses": True,
            "selector": selector(cluster, BROKER),
            "ports": [
                *_listener_ports(cluster, internal_only=False),
                {
                    "name": "metrics",
                    "port": cluster.spec.brokers.metrics_port,
                    "targetPort": cluster.spec.brokers.metrics_port,
                },
            ],
        },
    }


def bootstrap_service(cluster: Cluster) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(cluster, bootstrap_name(cluster), BROKER),
        "spec": {
            "type": "ClusterIP",
            "selector": selector(cluster, BROKER),
            "ports": _listener_ports(cluster, internal_only=True),
        },
    }


def external_services(cluster: Cluster, count: int) -> list[Obj]:
    """One Service per broker and external listener, reaching that broker's pod only."""
    out: list[Obj] = []
    for listener in cluster.spec.brokers.listeners:
        external = listener.external
        if external is None:
            continue
        for broker_id in range(count):
            pod = f"{statefulset_name(cluster)}-{broker_id}"
            port: Obj = {"name": _port_name(listener), "port": listener.port}
            if external.type == "NodePort":
                port["nodePort"] = external.node_port_base + broker_id
            port["targetPort"] = listener.port
            suffix = "external" if _external_count(cluster) == 1 else _port_name(listener)
            out.append(
                {
                    "apiVersion": "v1",
                    "kind": "Service",
                    "metadata": metadata(
                        cluster, f"{pod}-{suffix}", BROKER, external.annotations or None
                    ),
                    "spec": {
                        "type": external.type,
                        "publishNotReadyAddresses": True,
                        "selector": {
                            **selector(cluster, BROKER),
                            "statefulset.kubernetes.io/pod-name": pod,
                        },
                        "ports": [port],
                    },
                }
            )
    return out


def _external_count(cluster: Cluster) -> int:
    return sum(1 for li in cluster.spec.brokers.listeners if li.external is not None)


# --- the StatefulSet ---------------------------------------------------------------------------


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
    config = cluster.spec.config
    total = parse_size(config.get("KAFSCALE_BUFFER_BYTES", _default("buffer_bytes")))
    for field in CACHE_SETTINGS:
        total += parse_size(config.get("KAFSCALE_" + field.upper(), _default(field)))
    return total


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
            *({"name": _port_name(li), "containerPort": li.port} for li in brokers.listeners),
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
        # The settings are read at start: a change rolls the brokers, one at a time.
        CONFIG_HASH: digest(config["data"]),
        **template.metadata.annotations,
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


def disruption_budget(cluster: Cluster) -> Obj:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": metadata(cluster, statefulset_name(cluster), BROKER),
        "spec": {
            "maxUnavailable": 1,
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
            "selector": {"matchLabels": selector(cluster, BROKER)},
        },
    }


def autoscaler(cluster: Cluster) -> Obj:
    scaling = cluster.spec.autoscaling
    assert scaling is not None
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": metadata(cluster, statefulset_name(cluster), BROKER),
        "spec": {
            "scaleTargetRef": {
                "apiVersion": "apps/v1",
                "kind": "StatefulSet",
                "name": statefulset_name(cluster),
            },
            "minReplicas": scaling.min_replicas,
            "maxReplicas": scaling.max_replicas,
            "metrics": [
                {
                    "type": "Resource",
                    "resource": {
                        "name": "cpu",
                        "target": {
                            "type": "Utilization",
                            "averageUtilization": scaling.target_cpu_utilization_percentage,
                        },
                    },
                }
            ],
            # Down one broker per minute after five calm minutes: each leaving broker hands
            # its partitions over before the next goes.
            "behavior": {
                "scaleDown": {
                    "stabilizationWindowSeconds": 300,
                    "policies": [{"type": "Pods", "value": 1, "periodSeconds": 60}],
                }
            },
        },
    }


def service_monitor(cluster: Cluster) -> Obj:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": metadata(cluster, statefulset_name(cluster), BROKER),
        "spec": {
            "selector": {"matchLabels": selector(cluster, BROKER) | {SERVICE_LABEL: "headless"}},
            "endpoints": [
                {
                    "port": "metrics",
                    "path": "/metrics",
                    "interval": cluster.spec.monitoring.interval,
                }
            ],
        },
    }
