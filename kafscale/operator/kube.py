"""The operator's Kubernetes I/O (docs/design/operator.md, section 2): server-side apply, the
prune of objects no longer wanted, reads of Secrets and StatefulSets, status patches.

Every kind is a lightkube generic resource (plain dicts in and out), so the pure modules' objects
go to the API as they are. Credentials: lightkube's own discovery (the pod's ServiceAccount, else
KUBECONFIG), the same kopf uses.
"""

from __future__ import annotations

import base64
import secrets
from typing import Any

from lightkube import ApiError, AsyncClient
from lightkube.generic_resource import create_global_resource, create_namespaced_resource
from lightkube.types import PatchType

from kafscale.operator import FIELD_MANAGER, GROUP, VERSION
from kafscale.operator.objects import Obj, identity, managed_labels

Resource = Any  # a lightkube generic resource class

# Every kind a cluster's objects may have: apiVersion, kind -> (group, version, plural).
KINDS: dict[tuple[str, str], tuple[str, str, str]] = {
    ("v1", "ConfigMap"): ("", "v1", "configmaps"),
    ("v1", "Service"): ("", "v1", "services"),
    ("v1", "Secret"): ("", "v1", "secrets"),
    ("apps/v1", "StatefulSet"): ("apps", "v1", "statefulsets"),
    ("policy/v1", "PodDisruptionBudget"): ("policy", "v1", "poddisruptionbudgets"),
    ("autoscaling/v2", "HorizontalPodAutoscaler"): (
        "autoscaling",
        "v2",
        "horizontalpodautoscalers",
    ),
    ("batch/v1", "CronJob"): ("batch", "v1", "cronjobs"),
    ("monitoring.coreos.com/v1", "ServiceMonitor"): (
        "monitoring.coreos.com",
        "v1",
        "servicemonitors",
    ),
}
# What the prune lists (Secrets are never pruned: the generated ones go with the cluster).
PRUNED = [key for key in KINDS if key[1] != "Secret"]
SERVICE_MONITOR_CRD = "servicemonitors.monitoring.coreos.com"

_RESOURCES: dict[tuple[str, str], Resource] = {}


def resource(api_version: str, kind: str) -> Resource:
    key = (api_version, kind)
    if key not in _RESOURCES:
        group, version, plural = KINDS[key]
        _RESOURCES[key] = create_namespaced_resource(group, version, kind, plural)
    return _RESOURCES[key]


CLUSTERS = create_namespaced_resource(GROUP, VERSION, "KafscaleCluster", "kafscaleclusters")
TOPICS = create_namespaced_resource(GROUP, VERSION, "KafscaleTopic", "kafscaletopics")
USERS = create_namespaced_resource(GROUP, VERSION, "KafscaleUser", "kafscaleusers")
CRDS = create_global_resource(
    "apiextensions.k8s.io", "v1", "CustomResourceDefinition", "customresourcedefinitions"
)


class Kube:
    """One API client for the operator's life."""

    def __init__(self, client: AsyncClient | None = None) -> None:
        self.client = client or AsyncClient(field_manager=FIELD_MANAGER)

    async def close(self) -> None:
        await self.client.close()

    async def apply(self, obj: Obj) -> Obj:
        """Server-side apply, forced: the operator owns the fields it sets."""
        res = resource(obj["apiVersion"], obj["kind"])
        meta = obj["metadata"]
        applied = await self.client.patch(
            res,
            meta["name"],
            obj,
            namespace=meta["namespace"],
            patch_type=PatchType.APPLY,
            field_manager=FIELD_MANAGER,
            force=True,
        )
        return dict(applied)

    async def get(self, api_version: str, kind: str, namespace: str, name: str) -> Obj | None:
        try:
            found = await self.client.get(resource(api_version, kind), name, namespace=namespace)
        except ApiError as exc:
            if exc.status.code == 404:
                return None
            raise
        return dict(found)

    async def delete(self, api_version: str, kind: str, namespace: str, name: str) -> None:
        try:
            await self.client.delete(resource(api_version, kind), name, namespace=namespace)
        except ApiError as exc:
            if exc.status.code != 404:
                raise

    async def prune(
        self, namespace: str, cluster: str, keep: list[Obj], kinds: list[tuple[str, str]]
    ) -> list[str]:
        """Delete the cluster's objects of ``kinds`` that ``keep`` does not name; their names."""
        wanted = {identity(obj) for obj in keep}
        deleted: list[str] = []
        for api_version, kind in kinds:
            async for found in self.client.list(
                resource(api_version, kind),
                namespace=namespace,
                labels=dict(managed_labels(cluster)),
            ):
                name = found.metadata.name
                if (api_version, kind, name) not in wanted:
                    await self.delete(api_version, kind, namespace, name)
                    deleted.append(f"{kind}/{name}")
        return deleted

    async def served(self, crd_name: str) -> bool:
        try:
            await self.client.get(CRDS, crd_name)
        except ApiError as exc:
            if exc.status.code in (403, 404):
                return False
            raise
        return True

    async def secret_data(self, namespace: str, name: str) -> dict[str, bytes] | None:
        found = await self.get("v1", "Secret", namespace, name)
        if found is None:
            return None
        return {key: base64.b64decode(value) for key, value in (found.get("data") or {}).items()}

    async def ensure_secret(
        self,
        namespace: str,
        name: str,
        values: dict[str, str],
        owner: Obj | None,
        labels: dict[str, str],
    ) -> dict[str, bytes]:
        """The Secret's data; created first with ``values`` when it does not exist (never
        overwritten: a generated password stays the same)."""
        existing = await self.secret_data(namespace, name)
        if existing is not None:
            return existing
        meta: Obj = {"name": name, "namespace": namespace, "labels": labels}
        if owner is not None:
            meta["ownerReferences"] = [owner]
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": meta,
            "type": "Opaque",
            "stringData": values,
        }
        try:
            await self.client.create(resource("v1", "Secret")(body))
        except ApiError as exc:
            if exc.status.code != 409:  # created meanwhile: read what won
                raise
        return await self.secret_data(namespace, name) or {}

    async def patch_status(self, res: Resource, namespace: str, name: str, status: Obj) -> None:
        try:
            await self.client.patch(
                res.Status,
                name,
                {"status": status},
                namespace=namespace,
                patch_type=PatchType.MERGE,
                field_manager=FIELD_MANAGER,
            )
        except ApiError as exc:
            if exc.status.code != 404:  # deleted meanwhile
                raise


def random_token() -> str:
    return secrets.token_urlsafe(32)
