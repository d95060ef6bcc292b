"""The operator's kopf handlers and the cluster reconcile: read, call the pure modules, carry
out what they return, write the status (docs/design/operator.md). Topics and users:
`kafscale.operator.resources`. Registered on a registry of their own (`register`), so
the settings (the resync interval) are known when the timers are made.

One reconcile per resource at a time (a lock per resource), whatever woke it: a change of the
resource, of a StatefulSet it owns, or the resync timer. Each reconcile is complete and
idempotent; a failed one writes its reason to the status and is retried by kopf with a delay.
"""

from __future__ import annotations

import logging
from typing import Any

import kopf
from lightkube import ApiError

from kafscale.operator import GROUP, VERSION, cluster, etcd, names, status
from kafscale.operator.context import RETRY_DELAY, Context, lock, now
from kafscale.operator.kube import CLUSTERS, PRUNED, SERVICE_MONITOR_CRD, Kube, random_token
from kafscale.operator.model import SpecError, parse_cluster
from kafscale.operator.objects import (
    LABEL_INSTANCE,
    LABEL_MANAGED_BY,
    MANAGED_BY,
    labels,
    owner_reference,
)
from kafscale.operator.resources import (
    delete_topic,
    delete_user,
    reconcile_topic,
    reconcile_user,
)
from kafscale.operator.settings import OperatorSettings

log = logging.getLogger("kafscale.operator")

# --- clusters ----------------------------------------------------------------------------------


async def reconcile_cluster(ctx: Context, body: dict[str, Any]) -> None:
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    async with lock("cluster", namespace, name):
        # The resource as it is now (a StatefulSet event carries no cluster body).
        current = await ctx.kube.client.get(CLUSTERS, name, namespace=namespace)
        body = dict(current)
        if body["metadata"].get("deletionTimestamp"):
            return  # the garbage collector deletes what it owns
        await _reconcile_cluster(ctx, body)


async def _reconcile_cluster(ctx: Context, body: dict[str, Any]) -> None:
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    generation = int(meta.get("generation", 0))
    previous = (body.get("status") or {}).get("conditions")
    try:
        parsed = parse_cluster(body, ctx.settings.broker_image)
    except SpecError as exc:
        await _cluster_status(
            ctx,
            namespace,
            name,
            generation,
            previous,
            [
                status.Cond("Ready", False, "InvalidSpec", str(exc)),
                status.Cond("Degraded", False, "InvalidSpec", str(exc)),
                status.Cond("Reconciling", False, "InvalidSpec", "nothing applied"),
            ],
            {},
        )
        return  # said in the status; retrying cannot help until the spec changes
    kube = ctx.kube
    error: str | None = None
    admin_user: str | None = None
    secret_name = parsed.spec.brokers.authentication.admin_secret
    if secret_name:
        data = await kube.secret_data(namespace, secret_name)
        if data is None or "username" not in data or "password" not in data:
            error = f"the admin Secret {secret_name} (keys username, password) is missing"
        else:
            admin_user = data["username"].decode()
    for secret, keys in cluster.generated_secrets(parsed).items():
        await kube.ensure_secret(
            namespace,
            secret,
            {key: random_token() for key in keys},
            owner_reference(parsed),
            labels(parsed, names.BROKER),
        )
    brokers_sts = await kube.get(
        "apps/v1", "StatefulSet", namespace, names.statefulset_name(parsed)
    )
    etcd_sts = (
        await kube.get("apps/v1", "StatefulSet", namespace, etcd.name(parsed))
        if parsed.spec.metadata.etcd.managed is not None
        else None
    )
    brokers = status.workload(brokers_sts)
    members = status.workload(etcd_sts)
    monitor_served = await kube.served(SERVICE_MONITOR_CRD)
    observed = cluster.Observed(
        admin_user=admin_user,
        broker_replicas=brokers.replicas if brokers else None,
        broker_status_replicas=brokers.status_replicas if brokers else 0,
        broker_ready_replicas=brokers.ready if brokers else 0,
        broker_observed_current=brokers.current_generation if brokers else True,
        etcd_replicas=members.replicas if members else None,
        service_monitor_served=monitor_served,
    )
    wanted = cluster.desired(parsed, observed)
    notes: list[str] = []
    managed = parsed.spec.metadata.etcd.managed
    if managed is not None and members is not None and members.replicas != managed.replicas:
        notes.append(
            f"the managed etcd keeps its {members.replicas} members: changing a running etcd's "
            f"size to {managed.replicas} is not supported"
        )
    try:
        for obj in wanted.objects:
            if obj["kind"] == "ServiceMonitor" and not monitor_served:
                notes.append("a ServiceMonitor was asked for, but the API does not serve it")
                continue
            await kube.apply(obj)
        kinds = [k for k in PRUNED if k[1] != "ServiceMonitor" or monitor_served]
        pruned = await kube.prune(namespace, name, wanted.objects, kinds)
        if pruned:
            log.info("deleted objects the spec no longer asks for", extra={"objects": pruned})
    except ApiError as exc:
        error = f"applying the cluster's objects failed: {exc.status.message}"
    # The StatefulSet as applied (its replicas may have been one step of a scale-down).
    brokers_now = status.workload(
        await kube.get("apps/v1", "StatefulSet", namespace, names.statefulset_name(parsed))
    )
    conditions = status.cluster_conditions(
        parsed, brokers_now, members, wanted.scaling, notes, error
    )
    extra: dict[str, Any] = {
        "bootstrap": names.bootstrap_address(parsed),
        "brokers": {
            "desired": parsed.spec.brokers.replicas
            if parsed.spec.autoscaling is None
            else (brokers_now.replicas if brokers_now else parsed.spec.autoscaling.min_replicas),
            "current": brokers_now.replicas if brokers_now else 0,
            "ready": brokers_now.ready if brokers_now else 0,
        },
    }
    if managed is not None:
        extra["etcd"] = {
            "endpoints": ",".join(etcd.endpoints(parsed, members.replicas if members else None)),
            "replicas": members.replicas if members else managed.replicas,
            "ready": members.ready if members else 0,
        }
    await _cluster_status(ctx, namespace, name, generation, previous, conditions, extra)
    if error is not None:
        raise kopf.TemporaryError(error, delay=RETRY_DELAY)
    # A scale-down's next step comes with the StatefulSet's next status change (a pod gone, a
    # broker ready), or at the next resync.


async def _cluster_status(
    ctx: Context,
    namespace: str,
    name: str,
    generation: int,
    previous: list[dict[str, Any]] | None,
    conds: list[status.Cond],
    extra: dict[str, Any],
) -> None:
    body = {
        "observedGeneration": generation,
        "conditions": status.conditions(conds, previous, generation, now()),
        **extra,
    }
    await ctx.kube.patch_status(CLUSTERS, namespace, name, body)


# --- registration --------------------------------------------------------------------------


def register(registry: kopf.OperatorRegistry, settings: OperatorSettings) -> None:
    """Every handler, on ``registry``; ``settings.resync_seconds`` is the timers' interval."""
    resync = settings.resync_seconds

    def ctx_of(memo: Any) -> Context:
        return memo["ctx"]  # type: ignore[no-any-return]

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
        # Progress and the last handled spec in annotations of our own prefix, not status:
        # the status belongs to the conditions.
        settings.persistence.finalizer = f"{GROUP}/finalizer"
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
            prefix=GROUP, key="last-handled-configuration"
        )
        settings.posting.level = logging.WARNING
        # Namespaced (the chart's Roles): the namespaces are given, not listed; the operator
        # may not list them.
        settings.scanning.disabled = bool(memo["settings"].namespaces)
        settings.watching.server_timeout = 300
        settings.watching.client_timeout = 330
        memo["ctx"] = Context(memo["settings"], Kube())

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        # In a pod: its ServiceAccount; elsewhere: KUBECONFIG (or ~/.kube/config).
        return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)

    @kopf.on.cleanup(registry=registry)
    async def cleanup(memo: kopf.Memo, **_: Any) -> None:
        if "ctx" in memo:
            await ctx_of(memo).kube.close()

    # Clusters: on every change, on a resume after the operator restarts, on the timer, and when
    # a StatefulSet of theirs changes (readiness, a scale-down step done).
    @kopf.on.resume(GROUP, VERSION, "kafscaleclusters", registry=registry)
    @kopf.on.create(GROUP, VERSION, "kafscaleclusters", registry=registry)
    @kopf.on.update(GROUP, VERSION, "kafscaleclusters", registry=registry, field="spec")
    async def cluster_changed(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        await reconcile_cluster(ctx_of(memo), dict(body))

    @kopf.timer(GROUP, VERSION, "kafscaleclusters", interval=resync, registry=registry)
    async def cluster_resync(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        await reconcile_cluster(ctx_of(memo), dict(body))

    @kopf.on.event(
        "apps", "v1", "statefulsets", labels={LABEL_MANAGED_BY: MANAGED_BY}, registry=registry
    )
    async def statefulset_event(
        body: kopf.Body, memo: kopf.Memo, type: str | None, **_: Any
    ) -> None:
        owner = (body.get("metadata", {}).get("labels") or {}).get(LABEL_INSTANCE)
        if not owner or type is None:
            return  # the initial listing: the clusters' own resume handlers cover it
        namespace = body["metadata"]["namespace"]
        try:
            await reconcile_cluster(
                ctx_of(memo), {"metadata": {"namespace": namespace, "name": owner}}
            )
        except ApiError as exc:
            if exc.status.code != 404:
                raise
        except kopf.TemporaryError:
            pass  # written to the status; the cluster's own handlers retry

    # Topics.
    @kopf.on.resume(GROUP, VERSION, "kafscaletopics", registry=registry)
    @kopf.on.create(GROUP, VERSION, "kafscaletopics", registry=registry)
    @kopf.on.update(GROUP, VERSION, "kafscaletopics", registry=registry, field="spec")
    async def topic_changed(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        await reconcile_topic(ctx_of(memo), dict(body))

    @kopf.timer(GROUP, VERSION, "kafscaletopics", interval=resync, registry=registry)
    async def topic_resync(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        await reconcile_topic(ctx_of(memo), dict(body))

    @kopf.on.delete(GROUP, VERSION, "kafscaletopics", registry=registry)
    async def topic_deleted(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        await delete_topic(ctx_of(memo), dict(body))

    # Users.
    @kopf.on.resume(GROUP, VERSION, "kafscaleusers", registry=registry)
    @kopf.on.create(GROUP, VERSION, "kafscaleusers", registry=registry)
    @kopf.on.update(GROUP, VERSION, "kafscaleusers", registry=registry, field="spec")
    async def user_changed(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        await reconcile_user(ctx_of(memo), dict(body))

    @kopf.timer(GROUP, VERSION, "kafscaleusers", interval=resync, registry=registry)
    async def user_resync(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        await reconcile_user(ctx_of(memo), dict(body))

    @kopf.on.delete(GROUP, VERSION, "kafscaleusers", registry=registry)
    async def user_deleted(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        await delete_user(ctx_of(memo), dict(body))
