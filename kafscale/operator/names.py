"""Names of a KafscaleCluster's broker objects and how clients reach them (docs/design/operator.md,
section 3). For a cluster ``c``: StatefulSet ``c-broker`` (pods ``c-broker-N`` are broker N),
Services ``c-brokers`` (headless: pod names) and ``c-bootstrap`` (clients), Secret
``c-admin-token``. Pure."""

from __future__ import annotations

from kafscale.operator.model import Cluster, ListenerSpec

BROKER = "broker"
# Marks the headless Service, the one a ServiceMonitor scrapes through (every pod's port).
SERVICE_LABEL = "kafscale.io/service"


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


def port_name(listener: ListenerSpec) -> str:
    """A listener's port name: a DNS label of at most 15 characters."""
    return listener.name.lower().replace("_", "-")[:15].strip("-") or "kafka"
