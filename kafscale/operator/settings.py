"""The operator's own settings, from ``KAFSCALE_OPERATOR_*`` variables (docs/kubernetes.md,
"Operator settings"). Pure: an environment in, `OperatorSettings` or a ``ValueError`` naming the
variable out."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class OperatorSetting:
    env: str
    default: str
    help: str


SETTINGS: tuple[OperatorSetting, ...] = (
    OperatorSetting(
        "KAFSCALE_OPERATOR_NAMESPACES",
        "",
        "Namespaces whose resources the operator reconciles, comma-separated; empty: every "
        "namespace (needs the chart's cluster-wide RBAC)",
    ),
    OperatorSetting(
        "KAFSCALE_OPERATOR_BROKER_IMAGE",
        "kafscale:0.1.0",
        "The broker image of a KafscaleCluster that names none (spec.image)",
    ),
    OperatorSetting(
        "KAFSCALE_OPERATOR_HEALTH_PORT",
        "8080",
        "Port of the operator's liveness endpoint (GET /healthz); 0: none",
    ),
    OperatorSetting(
        "KAFSCALE_OPERATOR_RESYNC_SECONDS",
        "60",
        "Seconds between reconciles of a resource that did not change (repairs drift, refreshes "
        "topic status)",
    ),
    OperatorSetting(
        "KAFSCALE_OPERATOR_ADDRESS_MAP",
        "",
        "host:port=host:port pairs, comma-separated: where the operator connects instead of an "
        "in-cluster address (an operator outside the cluster, through port-forwards)",
    ),
    OperatorSetting(
        "KAFSCALE_OPERATOR_ADMIN_TIMEOUT_SECONDS",
        "30",
        "Seconds a Kafka admin call of the operator may take before the reconcile is retried",
    ),
)


@dataclass(frozen=True)
class OperatorSettings:
    namespaces: tuple[str, ...]
    broker_image: str
    health_port: int
    resync_seconds: float
    address_map: dict[str, str]
    admin_timeout: float

    def address(self, host_port: str) -> str:
        """Where to connect for an in-cluster ``host:port``."""
        return self.address_map.get(host_port, host_port)


def _get(environ: Mapping[str, str], env: str) -> str:
    default = next(s.default for s in SETTINGS if s.env == env)
    return environ.get(env, default).strip()


def _number(environ: Mapping[str, str], env: str, low: float, high: float) -> float:
    text = _get(environ, env)
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{env}: {text!r} is not a number") from None
    if not low <= value <= high:
        raise ValueError(f"{env}: {text} is not between {low:g} and {high:g}")
    return value


def _address_map(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        source, sep, target = item.partition("=")
        if not sep or ":" not in source or ":" not in target:
            raise ValueError(f"KAFSCALE_OPERATOR_ADDRESS_MAP: {item!r} is not host:port=host:port")
        out[source.strip()] = target.strip()
    return out


def load(environ: Mapping[str, str]) -> OperatorSettings:
    namespaces = tuple(
        n.strip() for n in _get(environ, "KAFSCALE_OPERATOR_NAMESPACES").split(",") if n.strip()
    )
    image = _get(environ, "KAFSCALE_OPERATOR_BROKER_IMAGE")
    if not image:
        raise ValueError("KAFSCALE_OPERATOR_BROKER_IMAGE: empty")
    return OperatorSettings(
        namespaces=namespaces,
        broker_image=image,
        health_port=int(_number(environ, "KAFSCALE_OPERATOR_HEALTH_PORT", 0, 65535)),
        resync_seconds=_number(environ, "KAFSCALE_OPERATOR_RESYNC_SECONDS", 1, 86400),
        address_map=_address_map(_get(environ, "KAFSCALE_OPERATOR_ADDRESS_MAP")),
        admin_timeout=_number(environ, "KAFSCALE_OPERATOR_ADMIN_TIMEOUT_SECONDS", 1, 600),
    )
