"""What the operator's handlers share: settings and the API client (`Context`, kept in kopf's
memo), one lock per resource, the time format of conditions."""

from __future__ import annotations

import asyncio
import datetime
from collections import defaultdict

from kafscale.operator.kube import Kube
from kafscale.operator.settings import OperatorSettings

RETRY_DELAY = 15.0  # seconds before kopf retries a failed reconcile
_LOCKS: defaultdict[tuple[str, str, str], asyncio.Lock] = defaultdict(asyncio.Lock)


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def lock(kind: str, namespace: str, name: str) -> asyncio.Lock:
    """One reconcile of a resource at a time, whatever woke it."""
    return _LOCKS[(kind, namespace, name)]


class Context:
    """What every handler shares: the settings and the API client (kopf's memo)."""

    def __init__(self, settings: OperatorSettings, kube: Kube) -> None:
        self.settings = settings
        self.kube = kube
