"""``kafscale operator``: run the operator until SIGTERM (kopf, standalone: one replica).

Watches the namespaces of ``KAFSCALE_OPERATOR_NAMESPACES`` (every namespace when empty) and
serves ``GET /healthz`` on ``KAFSCALE_OPERATOR_HEALTH_PORT`` for the liveness probe.
Credentials: the pod's ServiceAccount in a cluster, else ``KUBECONFIG`` (or ~/.kube/config).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys

from kafscale import logs
from kafscale.operator.settings import load


def _kopf_extras(record: logging.LogRecord) -> bool:
    """kopf's log records carry its whole settings object and an object reference: keep the
    object's namespace/name only (the JSON lines stay one short line each)."""
    fields = record.__dict__
    fields.pop("settings", None)
    fields.pop("k8s_skip", None)
    ref = fields.pop("k8s_ref", None)
    if isinstance(ref, dict):
        record.object = f"{ref.get('kind', '')} {ref.get('namespace', '')}/{ref.get('name', '')}"
    return True


def main() -> int:
    try:
        settings = load(os.environ)
    except ValueError as exc:
        print(f"kafscale operator: {exc}", file=sys.stderr)
        return 2
    logs.setup("operator", os.environ.get("KAFSCALE_LOG_LEVEL", "info"))
    for handler in logging.getLogger().handlers:
        handler.addFilter(_kopf_extras)
    import kopf  # the operator extra: imported only when the operator runs

    from kafscale.operator.handlers import register

    registry = kopf.OperatorRegistry()
    register(registry, settings)
    liveness = f"http://0.0.0.0:{settings.health_port}/healthz" if settings.health_port else None
    asyncio.run(
        kopf.operator(
            registry=registry,
            standalone=True,
            clusterwide=not settings.namespaces,
            namespaces=list(settings.namespaces),
            liveness_endpoint=liveness,
            memo=kopf.Memo(settings=settings),
        )
    )
    return 0
