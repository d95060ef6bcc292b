"""A KafscaleCluster's objects (docs/design/operator.md, sections 3 and 4). Pure: the checked spec
and what was observed in, the objects to apply out.

Here: what is shared by every broker (the ConfigMap ``c-config`` of settings, the generated
Secret ``c-admin-token``), the scale-down pacing, and `desired`, which gathers every object:
the StatefulSet (`kafscale.operator.brokers`), Services, PDB, HPA and ServiceMonitor
(`kafscale.operator.services`), the managed etcd's (`kafscale.operator.etcd`). Names are in
`kafscale.operator.names`.
"""

from __future__ import annotations

from dataclasses import dataclass

from kafscale.operator import etcd
from kafscale.operator.brokers import statefulset
from kafscale.operator.model import Cluster
from kafscale.operator.names import (
    BROKER,
    admin_token_secret,
    bootstrap_address,
    internal_listener,
)
from kafscale.operator.objects import S3_CA_DIR, TLS_DIR, Obj, config_name, metadata
from kafscale.operator.services import (
    autoscaler,
    bootstrap_service,
    disruption_budget,
    external_services,
    headless_service,
    service_monitor,
)


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


def admin_endpoint(cluster: Cluster) -> tuple[str, str, str | None]:
    """How the operator reaches the brokers as the cluster's admin: the bootstrap address, the
    listener's security protocol, and the SASL mechanism (None without SASL; SCRAM preferred,
    the strongest enabled)."""
    listener = internal_listener(cluster)
    mechanism = None
    if listener.sasl:
        enabled = cluster.spec.brokers.authentication.mechanisms
        mechanism = next(
            (m for m in ("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN") if m in enabled), None
        )
    return bootstrap_address(cluster), listener.protocol, mechanism


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
    # for the brokers still draining (until the StatefulSet reports them gone).
    scaling_spec = cluster.spec.autoscaling
    most = (
        scaling_spec.max_replicas
        if scaling_spec is not None
        else max(
            replicas,
            cluster.spec.brokers.replicas,
            observed.broker_replicas or 0,
            observed.broker_status_replicas,
        )
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
        "KAFSCALE_ETCD_ENDPOINTS": ",".join(etcd.endpoints(cluster, observed.etcd_replicas)),
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


# --- the StatefulSet ---------------------------------------------------------------------------
