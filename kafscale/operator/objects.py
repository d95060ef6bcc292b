"""What every object the operator makes has in common: names, labels, the owner reference, and
the merge of a user's pod template over a generated one. Pure."""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

from kafscale.operator import API_VERSION
from kafscale.operator.model import Cluster

Obj = dict[str, Any]

MANAGED_BY = "kafscale-operator"
LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
CONFIG_HASH = "kafscale.io/config-hash"
# Where pods find the files of the Secrets the cluster names.
SECRETS_DIR = "/var/run/secrets/kafscale"
TLS_DIR = "/etc/kafscale/tls"
S3_CA_DIR = "/etc/kafscale/s3-ca"


def config_name(cluster: Cluster) -> str:
    """The ConfigMap of the brokers' settings (also read by the metadata backup jobs)."""
    return f"{cluster.name}-config"


def selector(cluster: Cluster, component: str) -> dict[str, str]:
    """The labels that select one component's pods (never changed after creation: a
    StatefulSet's selector is immutable)."""
    return {LABEL_NAME: "kafscale", LABEL_INSTANCE: cluster.name, LABEL_COMPONENT: component}


def labels(cluster: Cluster, component: str) -> dict[str, str]:
    return {**selector(cluster, component), LABEL_MANAGED_BY: MANAGED_BY}


def managed_labels(cluster_name: str) -> dict[str, str]:
    """The labels of everything the operator made for one cluster (the prune lists by them)."""
    return {LABEL_MANAGED_BY: MANAGED_BY, LABEL_INSTANCE: cluster_name}


def owner_reference(cluster: Cluster) -> Obj:
    return {
        "apiVersion": API_VERSION,
        "kind": "KafscaleCluster",
        "name": cluster.name,
        "uid": cluster.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def metadata(
    cluster: Cluster, name: str, component: str, annotations: dict[str, str] | None = None
) -> Obj:
    meta: Obj = {
        "name": name,
        "namespace": cluster.namespace,
        "labels": labels(cluster, component),
        "ownerReferences": [owner_reference(cluster)],
    }
    if annotations:
        meta["annotations"] = dict(annotations)
    return meta


def digest(value: Any) -> str:
    """A short stable digest of a JSON value (a pod annotation that rolls the pods on change)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def merge(base: Any, override: Any) -> Any:
    """``override`` merged over ``base``, as a pod template override is: maps merge key by key;
    lists whose items are all maps with a ``name`` (containers, volumes, env, ports) merge by
    name, new names appended; anything else is replaced. Neither argument is changed."""
    if isinstance(base, dict) and isinstance(override, dict):
        out = copy.deepcopy(base)
        for key, value in override.items():
            out[key] = merge(base[key], value) if key in base else copy.deepcopy(value)
        return out
    if isinstance(base, list) and isinstance(override, list) and _named(base) and _named(override):
        merged = [copy.deepcopy(item) for item in base]
        index = {item["name"]: position for position, item in enumerate(merged)}
        for item in override:
            if item["name"] in index:
                merged[index[item["name"]]] = merge(merged[index[item["name"]]], item)
            else:
                merged.append(copy.deepcopy(item))
        return merged
    return copy.deepcopy(override)


def _named(items: list[Any]) -> bool:
    return all(isinstance(item, dict) and "name" in item for item in items)


def identity(obj: Obj) -> tuple[str, str, str]:
    """(apiVersion, kind, name): how desired and existing objects are matched."""
    return (str(obj["apiVersion"]), str(obj["kind"]), str(obj["metadata"]["name"]))
