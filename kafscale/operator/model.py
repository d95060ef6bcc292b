"""The custom resources' specs as typed values (docs/design/operator.md, section 1).

The CRDs' OpenAPI schemas (charts/kafscale/crds/) are the first check: the API server refuses a
spec of the wrong shape with a message naming the field. `parse_*` is the second, for what a schema
does not say, and gives the defaults in one place. Every error is a `SpecError` naming the field as
the resource's YAML spells it (``spec.brokers.listeners[1].port``). Pure: dicts in, values out.
"""

from __future__ import annotations

import re
from typing import Any, Literal

import msgspec

from kafscale import config as configuration
from kafscale.settings import SETTINGS_BY_FIELD, parse_size

# A cluster's name starts its objects' names: a Service's must start with a letter.
DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
LISTENER_NAME = re.compile(r"^[A-Z][A-Z0-9_]*$")
# A host name with "{id}" where the broker's id goes: nothing a shell would expand.
HOST_TEMPLATE = re.compile(r"^([a-z0-9.-]|\{id\})+$")
# Settings the operator derives from the spec's own sections: given in spec.config they would be
# overwritten or contradict the pod (its listeners, its id, its backends).
OPERATOR_OWNED_SETTINGS = frozenset(
    {
        "KAFSCALE_BROKER_HOST",
        "KAFSCALE_BROKER_PORT",
        "KAFSCALE_ADVERTISED_HOST",
        "KAFSCALE_BROKER_ID",
        "KAFSCALE_LISTENERS",
        "KAFSCALE_ADVERTISED_LISTENERS",
        "KAFSCALE_LISTENER_SECURITY_PROTOCOL_MAP",
        "KAFSCALE_METRICS_PORT",
        "KAFSCALE_S3_BUCKET",
        "KAFSCALE_S3_REGION",
        "KAFSCALE_S3_ENDPOINT",
        "KAFSCALE_S3_NAMESPACE",
        "KAFSCALE_S3_PATH_STYLE",
        "KAFSCALE_S3_ACCESS_KEY",
        "KAFSCALE_S3_SECRET_KEY",
        "KAFSCALE_S3_CA_FILE",
        "KAFSCALE_ETCD_ENDPOINTS",
        "KAFSCALE_DATA_DIR",
        "KAFSCALE_SSL_CERT_FILE",
        "KAFSCALE_SSL_KEY_FILE",
        "KAFSCALE_SSL_CA_FILE",
        "KAFSCALE_SSL_CLIENT_AUTH",
        "KAFSCALE_SASL_ENABLED_MECHANISMS",
        "KAFSCALE_SASL_ADMIN_USER",
        "KAFSCALE_SASL_ADMIN_PASSWORD",
        "KAFSCALE_AUTHORIZER",
        "KAFSCALE_SUPER_USERS",
        "KAFSCALE_ADMIN_TOKEN",
        "KAFSCALE_SHARDS",
    }
)


# The broker container's resources when the spec gives none (k8s/broker.yaml explains them).
DEFAULT_RESOURCES: dict[str, Any] = {
    "requests": {"cpu": "2", "memory": "3Gi"},
    "limits": {"memory": "3Gi"},
}
# Budgets the pod's memory must hold: partition buffers (in /dev/shm) and the caches.
BUDGET_SETTINGS = ("buffer_bytes", "cache_size", "index_cache_size", "compaction_buffer_bytes")


class SpecError(ValueError):
    """A spec the operator cannot carry out; the message names the field."""


class _Spec(msgspec.Struct, rename="camel", frozen=True, forbid_unknown_fields=False):
    pass


class SecretKeyRef(_Spec, frozen=True):
    name: str
    key: str


class External(_Spec, frozen=True):
    type: Literal["LoadBalancer", "NodePort"] = "LoadBalancer"
    # The address each broker advertises on this listener; "{id}" is the broker's id.
    advertised_host_template: str = ""
    # NodePort: broker N is reached at nodePortBase + N (the port it advertises too).
    node_port_base: int = 0
    annotations: dict[str, str] = {}


class ListenerSpec(_Spec, frozen=True):
    name: str
    port: int
    tls: bool = False
    sasl: bool = False
    external: External | None = None

    @property
    def protocol(self) -> str:
        if self.tls:
            return "SASL_SSL" if self.sasl else "SSL"
        return "SASL_PLAINTEXT" if self.sasl else "PLAINTEXT"


class TlsSpec(_Spec, frozen=True):
    # A Secret of type kubernetes.io/tls (tls.crt, tls.key) and, optionally, ca.crt: the CA that
    # signs client certificates and that the operator trusts when it connects.
    secret_name: str
    client_auth: Literal["none", "requested", "required"] = "none"


class AuthenticationSpec(_Spec, frozen=True):
    mechanisms: list[str] = msgspec.field(
        default_factory=lambda: ["SCRAM-SHA-512", "SCRAM-SHA-256"]
    )
    # The first admin (username, password keys): created by the brokers at start, used by the
    # operator for topics and users.
    admin_secret: str = ""


class AuthorizationSpec(_Spec, frozen=True):
    type: Literal["none", "acl"] = "none"
    super_users: list[str] = []
    allow_everyone_if_no_acl_found: bool = False


class PodTemplateMeta(_Spec, frozen=True):
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}


class PodTemplate(_Spec, frozen=True):
    metadata: PodTemplateMeta = PodTemplateMeta()
    # Merged over the generated pod spec: maps merge, lists of named items (containers, volumes,
    # env) merge by name, anything else replaces.
    spec: dict[str, Any] = {}


class BrokersSpec(_Spec, frozen=True):
    replicas: int = 3
    resources: dict[str, Any] = {}
    listeners: list[ListenerSpec] = msgspec.field(
        default_factory=lambda: [ListenerSpec(name="INTERNAL", port=9092)]
    )
    metrics_port: int = 9093
    tls: TlsSpec | None = None
    authentication: AuthenticationSpec = AuthenticationSpec()
    authorization: AuthorizationSpec = AuthorizationSpec()
    template: PodTemplate = PodTemplate()
    termination_grace_period_seconds: int = 240


class StorageSpec(_Spec, frozen=True):
    bucket: str
    region: str = "us-east-1"
    endpoint: str = ""
    path_style: bool = False
    # The cluster's prefix in the bucket (KAFSCALE_S3_NAMESPACE): default the resource's
    # namespace and name, so two clusters can share a bucket.
    namespace: str = ""
    # A Secret with the keys access-key and secret-key; none: the pod's own identity (IRSA,
    # instance role).
    credentials_secret: str = ""
    ca: SecretKeyRef | None = None


class EtcdStorage(_Spec, frozen=True):
    size: str = "1Gi"
    storage_class_name: str = ""


class Snapshots(_Spec, frozen=True):
    schedule: str
    bucket: str = ""  # default: spec.storage.bucket
    prefix: str = ""  # default: etcd-snapshots/<namespace>/<cluster>/
    keep: int = 24


class Restore(_Spec, frozen=True):
    snapshot: str  # the object key in the snapshots' bucket
    bucket: str = ""


class ManagedEtcd(_Spec, frozen=True):
    replicas: int = 3
    image: str = "registry.k8s.io/etcd:3.6.5-0"
    storage: EtcdStorage = EtcdStorage()
    resources: dict[str, Any] = {}
    snapshots: Snapshots | None = None
    restore: Restore | None = None


class EtcdSpec(_Spec, frozen=True):
    endpoints: list[str] = []
    managed: ManagedEtcd | None = None


class MetadataSpec(_Spec, frozen=True):
    etcd: EtcdSpec = EtcdSpec()


class AutoscalingSpec(_Spec, frozen=True):
    min_replicas: int = 1
    max_replicas: int = 3
    target_cpu_utilization_percentage: int = msgspec.field(
        default=70, name="targetCPUUtilizationPercentage"
    )


class MonitoringSpec(_Spec, frozen=True):
    # None: a ServiceMonitor when the Prometheus operator's CRD is served.
    service_monitor: bool | None = None
    interval: str = "30s"


class ClusterSpec(_Spec, frozen=True):
    storage: StorageSpec
    image: str = ""
    image_pull_policy: str = "IfNotPresent"
    image_pull_secrets: list[str] = []
    brokers: BrokersSpec = BrokersSpec()
    metadata: MetadataSpec = MetadataSpec()
    config: dict[str, str] = {}
    autoscaling: AutoscalingSpec | None = None
    monitoring: MonitoringSpec = MonitoringSpec()
    cluster_domain: str = "cluster.local"


class Cluster(msgspec.Struct, frozen=True):
    """A KafscaleCluster: its identity and its checked spec."""

    name: str
    namespace: str
    uid: str
    generation: int
    spec: ClusterSpec
    image: str  # spec.image, else the operator's default broker image


def _convert(data: Any, kind: type[_Spec], where: str) -> Any:
    try:
        return msgspec.convert(data, kind)
    except msgspec.ValidationError as exc:
        # msgspec says "... - at `$.brokers.replicas`": name the field the YAML way.
        text = str(exc)
        message, _, path = text.partition(" - at `$")
        field = where + path.rstrip("`") if path else where
        raise SpecError(f"{field}: {message}") from None


def parse_cluster(resource: dict[str, Any], default_image: str) -> Cluster:
    """A KafscaleCluster resource (as the API returns it) checked into a `Cluster`."""
    meta = resource.get("metadata") or {}
    spec: ClusterSpec = _convert(resource.get("spec") or {}, ClusterSpec, "spec")
    name = str(meta.get("name", ""))
    if not DNS_LABEL.match(name) or len(name) > 40:
        # Pods are named <name>-broker-<n> and Services <name>-broker-<n>-external: keep the
        # longest within a DNS label (63).
        raise SpecError(
            f"metadata.name: {name!r} must be a DNS label of at most 40 characters, starting "
            "with a letter"
        )
    _check_cluster(spec)
    image = spec.image or default_image
    if not image:
        raise SpecError("spec.image: no image given and the operator has no default")
    return Cluster(
        name=name,
        namespace=str(meta.get("namespace", "default")),
        uid=str(meta.get("uid", "")),
        generation=int(meta.get("generation", 0)),
        spec=spec,
        image=image,
    )


def _check_cluster(spec: ClusterSpec) -> None:
    brokers = spec.brokers
    if brokers.replicas < 0:
        raise SpecError("spec.brokers.replicas: must be >= 0")
    if not brokers.listeners:
        raise SpecError("spec.brokers.listeners: at least one listener is needed")
    names: set[str] = set()
    ports = {brokers.metrics_port: "spec.brokers.metricsPort"}
    # Broker N of a NodePort listener is on nodePortBase + N, for every broker that may run.
    most = max(brokers.replicas, spec.autoscaling.max_replicas if spec.autoscaling else 0, 1)
    node_ranges: list[tuple[int, int, str]] = []
    for index, listener in enumerate(brokers.listeners):
        where = f"spec.brokers.listeners[{index}]"
        if not LISTENER_NAME.match(listener.name):
            raise SpecError(f"{where}.name: {listener.name!r} must be upper case A-Z, 0-9 and _")
        if listener.name in names:
            raise SpecError(f"{where}.name: {listener.name} is used twice")
        names.add(listener.name)
        if not 1 <= listener.port <= 65535:
            raise SpecError(f"{where}.port: {listener.port} is out of range")
        if listener.port in ports:
            raise SpecError(f"{where}.port: {listener.port} is also {ports[listener.port]}")
        ports[listener.port] = f"{where}.port"
        if listener.tls and brokers.tls is None:
            raise SpecError(f"{where}.tls: a TLS listener needs spec.brokers.tls.secretName")
        if listener.sasl and not brokers.authentication.admin_secret:
            raise SpecError(
                f"{where}.sasl: a SASL listener needs spec.brokers.authentication.adminSecret "
                "(the first admin, whom the operator uses for topics and users)"
            )
        external = listener.external
        if external is not None:
            if external.type == "NodePort":
                first, last = external.node_port_base, external.node_port_base + most - 1
                if not (first >= 30000 and last <= 32767):
                    raise SpecError(
                        f"{where}.external.nodePortBase: brokers 0-{most - 1} would take node "
                        f"ports {first}-{last}, outside Kubernetes' range 30000-32767"
                    )
                for other_first, other_last, other in node_ranges:
                    if first <= other_last and other_first <= last:
                        raise SpecError(
                            f"{where}.external.nodePortBase: node ports {first}-{last} overlap "
                            f"those of {other} ({other_first}-{other_last})"
                        )
                node_ranges.append((first, last, where))
            template = external.advertised_host_template
            if external.type == "LoadBalancer" and template and "{id}" not in template:
                raise SpecError(
                    f"{where}.external.advertisedHostTemplate: {template!r} has no {{id}}: every "
                    "broker has its own load balancer and must advertise its own name"
                )
            if template and not HOST_TEMPLATE.match(template):
                raise SpecError(
                    f"{where}.external.advertisedHostTemplate: {template!r} must be a host name "
                    "(a-z, 0-9, '.', '-') with {id} where the broker's id goes"
                )
            if not template:
                raise SpecError(
                    f"{where}.external.advertisedHostTemplate: an external listener needs the "
                    "address clients reach each broker at, e.g. broker-{id}.kafka.example.com"
                )
    if not any(listener.external is None for listener in brokers.listeners):
        raise SpecError(
            "spec.brokers.listeners: at least one listener must be internal (the brokers and "
            "the operator talk over it)"
        )
    if brokers.authorization.type == "acl" and not any(
        listener.sasl or (listener.tls and brokers.tls and brokers.tls.client_auth != "none")
        for listener in brokers.listeners
    ):
        raise SpecError(
            "spec.brokers.authorization: ACLs need authenticated clients: a SASL listener or "
            "TLS client certificates"
        )
    if any(li.sasl for li in brokers.listeners) and not brokers.authentication.mechanisms:
        raise SpecError("spec.brokers.authentication.mechanisms: a SASL listener needs one")
    for mechanism in brokers.authentication.mechanisms:
        if mechanism not in ("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"):
            raise SpecError(f"spec.brokers.authentication.mechanisms: unknown {mechanism!r}")
    etcd = spec.metadata.etcd
    if bool(etcd.endpoints) == (etcd.managed is not None):
        raise SpecError(
            "spec.metadata.etcd: give either endpoints (an etcd of yours) or managed (the "
            "operator runs one), not both or neither"
        )
    if etcd.managed is not None:
        if etcd.managed.replicas not in (1, 3, 5):
            raise SpecError("spec.metadata.etcd.managed.replicas: must be 1, 3 or 5")
        snapshots = etcd.managed.snapshots
        if snapshots is not None and len(snapshots.schedule.split()) != 5:
            raise SpecError(
                f"spec.metadata.etcd.managed.snapshots.schedule: {snapshots.schedule!r} is not "
                "a cron schedule of five fields"
            )
    scaling = spec.autoscaling
    if scaling is not None:
        if not 1 <= scaling.min_replicas <= scaling.max_replicas:
            raise SpecError("spec.autoscaling: need 1 <= minReplicas <= maxReplicas")
        if not 1 <= scaling.target_cpu_utilization_percentage <= 100:
            raise SpecError("spec.autoscaling.targetCPUUtilizationPercentage: 1-100")
    for key, value in spec.config.items():
        _check_setting(key, value)
    _check_consistency(spec)
    _check_memory(spec)


def _check_consistency(spec: ClusterSpec) -> None:
    """The broker's own check of its whole configuration (settings that only work together),
    on spec.config with stand-ins for what the operator sets: a refusal here is a crash-looping
    pod there."""
    environ = {
        "KAFSCALE_BROKER_HOST": "0.0.0.0",
        "KAFSCALE_S3_BUCKET": spec.storage.bucket,
        "KAFSCALE_ETCD_ENDPOINTS": "etcd:2379",
        **spec.config,
    }
    try:
        configuration.load(environ)
    except configuration.ConfigError as exc:
        raise SpecError(f"spec.config: the broker would refuse it: {exc}") from None


def memory_budget(settings: dict[str, str]) -> int:
    """Bytes the broker's budgets take with these settings (the rest at their defaults): the
    partition buffers and the caches, which its memory limit must hold."""
    total = 0
    for field in BUDGET_SETTINGS:
        setting = SETTINGS_BY_FIELD[field]
        total += parse_size(settings.get(setting.env, setting.default))
    return total


def _check_memory(spec: ClusterSpec) -> None:
    resources = spec.brokers.resources or DEFAULT_RESOURCES
    limit = (resources.get("limits") or {}).get("memory")
    if limit is None:
        return
    budget = memory_budget(spec.config)
    try:
        limit_bytes = quantity_bytes(str(limit))
    except ValueError as exc:
        raise SpecError(f"spec.brokers.resources.limits.memory: {exc}") from None
    if limit_bytes <= budget:
        where = "spec.brokers.resources" if spec.brokers.resources else "spec.config"
        raise SpecError(
            f"{where}: the memory limit {limit} does not hold the broker's budgets "
            f"({budget // 2**20} MiB of buffers and caches, plus ~100 MiB a process): raise "
            "spec.brokers.resources.limits.memory or lower the cache settings"
        )


def quantity_bytes(quantity: str) -> int:
    """A Kubernetes memory quantity (3Gi, 512Mi, 1G, 1073741824) in bytes."""
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6}
    units |= {"G": 10**9, "T": 10**12, "": 1}
    found = re.fullmatch(r"(\d+)([A-Za-z]*)", quantity.strip())
    if found is None or found.group(2) not in units:
        raise ValueError(f"{quantity!r} is not a memory quantity")
    return int(found.group(1)) * units[found.group(2)]


def _check_setting(key: str, value: str) -> None:
    where = f"spec.config.{key}"
    field = key.removeprefix("KAFSCALE_").lower()
    setting = SETTINGS_BY_FIELD.get(field)
    # Variables are case-sensitive: KAFSCALE_Log_Level would be ignored by the broker.
    if setting is None or key != setting.env:
        raise SpecError(f"{where}: not a KafScale setting (see the README's configuration table)")
    if key in OPERATOR_OWNED_SETTINGS:
        raise SpecError(f"{where}: set by the operator from the spec's own sections")
    if setting.secret:
        raise SpecError(f"{where}: a secret, which a ConfigMap must not hold")
    try:
        setting.parse(value)
    except (ValueError, TypeError) as exc:
        raise SpecError(f"{where}: {exc}") from None
