"""Reconciles of KafscaleTopics and KafscaleUsers: find the resource's cluster, connect to its
brokers as its admin (`connection`), let `admin` carry out what `topics`/`users` plan, write the
status. A failure is said in the status and retried by kopf (docs/design/operator.md, section 5).
"""

from __future__ import annotations

import logging
from typing import Any

import kopf
from lightkube import ApiError

from kafscale.kafka_admin import AdminError, Connection
from kafscale.operator import GROUP, VERSION, admin, cluster, status, topics, users
from kafscale.operator.context import RETRY_DELAY, Context, lock, now
from kafscale.operator.kube import CLUSTERS, TOPICS, USERS, random_token
from kafscale.operator.model import Cluster, SpecError, parse_cluster
from kafscale.operator.objects import LABEL_INSTANCE, LABEL_MANAGED_BY, MANAGED_BY

log = logging.getLogger("kafscale.operator")


# --- access to a cluster's brokers ---------------------------------------------------------


class NotReachable(Exception):
    """The resource's cluster cannot be reached yet; the message says why (for the status)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


async def _cluster_of(ctx: Context, namespace: str, cluster_name: str) -> Cluster:
    try:
        found = await ctx.kube.client.get(CLUSTERS, cluster_name, namespace=namespace)
    except ApiError as exc:
        if exc.status.code == 404:
            raise NotReachable(
                "ClusterNotFound", f"no KafscaleCluster {cluster_name} in namespace {namespace}"
            ) from None
        raise
    body = dict(found)
    try:
        return parse_cluster(body, ctx.settings.broker_image)
    except SpecError as exc:
        raise NotReachable("ClusterInvalid", f"the cluster's spec is invalid: {exc}") from None


async def connection(ctx: Context, parsed: Cluster) -> Connection:
    bootstrap, protocol, mechanism = cluster.admin_endpoint(parsed)
    username = password = None
    if mechanism is not None:
        secret = parsed.spec.brokers.authentication.admin_secret
        data = await ctx.kube.secret_data(parsed.namespace, secret)
        if data is None or "username" not in data or "password" not in data:
            raise NotReachable(
                "AdminSecretMissing", f"the cluster's admin Secret {secret} is missing"
            )
        username, password = data["username"].decode(), data["password"].decode()
    ca_pem = None
    tls = parsed.spec.brokers.tls
    if protocol in ("SSL", "SASL_SSL") and tls is not None:
        data = await ctx.kube.secret_data(parsed.namespace, tls.secret_name) or {}
        # The CA that signed the brokers' certificate; a self-signed certificate is its own.
        ca_pem = data.get("ca.crt") or data.get("tls.crt")
    return Connection(
        bootstrap=ctx.settings.address(bootstrap),
        security_protocol=protocol,
        sasl_mechanism=mechanism,
        username=username,
        password=password,
        ca_pem=ca_pem,
        timeout=ctx.settings.admin_timeout,
    )


def _simple_status(
    generation: int,
    previous: list[dict[str, Any]] | None,
    ready: bool,
    reason: str,
    message: str,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "observedGeneration": generation,
        "conditions": status.conditions(
            [status.Cond("Ready", ready, reason, message)], previous, generation, now()
        ),
        **(extra or {}),
    }


# --- topics --------------------------------------------------------------------------------


async def reconcile_topic(ctx: Context, body: dict[str, Any]) -> None:
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    generation = int(meta.get("generation", 0))
    previous = (body.get("status") or {}).get("conditions")
    async with lock("topic", namespace, name):
        try:
            spec = topics.parse_topic(body)
            parsed = await _cluster_of(ctx, namespace, spec.cluster)
            conn = await connection(ctx, parsed)
            result = await admin.reconcile_topic(conn, spec)
        except SpecError as exc:
            await ctx.kube.patch_status(
                TOPICS,
                namespace,
                name,
                _simple_status(generation, previous, False, "InvalidSpec", str(exc)),
            )
            return  # said in the status; nothing to retry until the spec changes
        except NotReachable as exc:
            await ctx.kube.patch_status(
                TOPICS,
                namespace,
                name,
                _simple_status(generation, previous, False, exc.reason, str(exc)),
            )
            raise kopf.TemporaryError(str(exc), delay=RETRY_DELAY) from None
        except AdminError as exc:
            await ctx.kube.patch_status(
                TOPICS,
                namespace,
                name,
                _simple_status(generation, previous, False, "AdminError", str(exc)),
            )
            raise kopf.TemporaryError(str(exc), delay=RETRY_DELAY) from None
        await ctx.kube.patch_status(
            TOPICS,
            namespace,
            name,
            _simple_status(
                generation, previous, result.ready, result.reason, result.message, result.to_dict()
            ),
        )


async def delete_topic(ctx: Context, body: dict[str, Any]) -> None:
    """The resource is going: delete the topic when the spec says so and the cluster is there
    (a cluster already deleted took its topics along; the finalizer must not hang on it)."""
    meta = body["metadata"]
    try:
        spec = topics.parse_topic(body)
    except SpecError:
        return
    if spec.deletion_policy != "Delete":
        return
    try:
        parsed = await _cluster_of(ctx, meta["namespace"], spec.cluster)
        conn = await connection(ctx, parsed)
    except NotReachable as exc:
        log.warning("topic not deleted: %s", exc, extra={"topic": spec.name})
        return
    try:
        await admin.delete_topic(conn, spec.name)
    except AdminError as exc:
        raise kopf.TemporaryError(f"deleting topic {spec.name}: {exc}", delay=RETRY_DELAY) from None


# --- users ---------------------------------------------------------------------------------


def user_owner(body: dict[str, Any]) -> dict[str, Any]:
    meta = body["metadata"]
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "KafscaleUser",
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


async def reconcile_user(ctx: Context, body: dict[str, Any]) -> None:
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    generation = int(meta.get("generation", 0))
    old_status = body.get("status") or {}
    previous = old_status.get("conditions")

    async def say(
        ready: bool, reason: str, message: str, extra: dict[str, Any] | None = None
    ) -> None:
        await ctx.kube.patch_status(
            USERS,
            namespace,
            name,
            _simple_status(generation, previous, ready, reason, message, extra),
        )

    async with lock("user", namespace, name):
        try:
            spec = users.parse_user(body)
            parsed = await _cluster_of(ctx, namespace, spec.cluster)
        except SpecError as exc:
            await say(False, "InvalidSpec", str(exc))
            return  # said in the status; nothing to retry until the spec changes
        except NotReachable as exc:
            await say(False, exc.reason, str(exc))
            raise kopf.TemporaryError(str(exc), delay=RETRY_DELAY) from None
        if not any(listener.sasl for listener in parsed.spec.brokers.listeners):
            await say(
                False,
                "AuthenticationNotEnabled",
                f"cluster {parsed.name} has no SASL listener: SCRAM users cannot authenticate",
                {"userName": spec.name},
            )
            return
        if spec.password_secret is not None:
            data = await ctx.kube.secret_data(namespace, spec.password_secret.name)
            key = spec.password_secret.key
            if data is None or key not in data:
                message = f"the password Secret {spec.password_secret.name} (key {key}) is missing"
                await say(False, "SecretNotFound", message, {"userName": spec.name})
                raise kopf.TemporaryError(message, delay=RETRY_DELAY)
            password = data[key].decode()
            secret_name = spec.password_secret.name
        else:
            secret_name = f"{name}-credentials"
            data = await ctx.kube.ensure_secret(
                namespace,
                secret_name,
                {"username": spec.name, "password": random_token()},
                user_owner(body),
                {LABEL_MANAGED_BY: MANAGED_BY, LABEL_INSTANCE: parsed.name},
            )
            password = data["password"].decode()
        try:
            conn = await connection(ctx, parsed)
            result = await admin.reconcile_user(
                conn, spec, password, str(old_status.get("credentialDigest", ""))
            )
        except NotReachable as exc:
            await say(False, exc.reason, str(exc), {"userName": spec.name})
            raise kopf.TemporaryError(str(exc), delay=RETRY_DELAY) from None
        except AdminError as exc:
            await say(False, "AdminError", str(exc), {"userName": spec.name})
            raise kopf.TemporaryError(str(exc), delay=RETRY_DELAY) from None
        await say(
            result.ready, result.reason, result.message, {**result.to_dict(), "secret": secret_name}
        )


async def delete_user(ctx: Context, body: dict[str, Any]) -> None:
    meta = body["metadata"]
    try:
        spec = users.parse_user(body)
        parsed = await _cluster_of(ctx, meta["namespace"], spec.cluster)
        if not any(listener.sasl for listener in parsed.spec.brokers.listeners):
            return
        conn = await connection(ctx, parsed)
    except (SpecError, NotReachable) as exc:
        log.warning("user not removed from its cluster: %s", exc)
        return
    try:
        await admin.delete_user(conn, spec.name)
    except AdminError as exc:
        raise kopf.TemporaryError(f"deleting user {spec.name}: {exc}", delay=RETRY_DELAY) from None
