"""A KafscaleCluster's Services (headless, bootstrap, one per broker and external listener),
PodDisruptionBudget, HorizontalPodAutoscaler and ServiceMonitor. Pure."""

from __future__ import annotations

from kafscale.operator.model import Cluster
from kafscale.operator.names import (
    BROKER,
    SERVICE_LABEL,
    bootstrap_name,
    headless_name,
    port_name,
    statefulset_name,
)
from kafscale.operator.objects import Obj, metadata, selector


def metadata_with(meta: Obj, extra_labels: dict[str, str]) -> Obj:
    return {**meta, "labels": {**meta["labels"], **extra_labels}}


def _listener_ports(cluster: Cluster, internal_only: bool) -> list[Obj]:
    return [
        {"name": port_name(li), "port": li.port, "targetPort": li.port}
        for li in cluster.spec.brokers.listeners
        if not (internal_only and li.external is not None)
    ]


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
    """One Service per broker and external listener, reaching that broker's pod only:
    ``<cluster>-broker-<N>-external``, or with several external listeners
    ``<cluster>-b<N>-<listener>`` (a listener's port name is up to 15 characters; both fit a
    Service name's 63 with a cluster name of 40)."""
    out: list[Obj] = []
    for listener in cluster.spec.brokers.listeners:
        external = listener.external
        if external is None:
            continue
        for broker_id in range(count):
            pod = f"{statefulset_name(cluster)}-{broker_id}"
            port: Obj = {"name": port_name(listener), "port": listener.port}
            if external.type == "NodePort":
                port["nodePort"] = external.node_port_base + broker_id
            port["targetPort"] = listener.port
            if _external_count(cluster) == 1:
                service = f"{pod}-external"
            else:
                service = f"{cluster.name}-b{broker_id}-{port_name(listener)}"
            out.append(
                {
                    "apiVersion": "v1",
                    "kind": "Service",
                    "metadata": metadata(cluster, service, BROKER, external.annotations or None),
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
