"""Authorization for the request handlers (docs/design/security.md, section 6).

``KAFSCALE_AUTHORIZER=none`` (the default): everything is allowed, and authorized operations
are every operation a resource supports, as Kafka answers without an authorizer.
``acl``: Kafka's ACL semantics (``kafscale.security.authorizer``) over the ACLs in this process's
metadata view (``acls/``), with ``KAFSCALE_SUPER_USERS`` and
``KAFSCALE_ALLOW_EVERYONE_IF_NO_ACL_FOUND``. The authorizer is rebuilt when the view's ACLs change
(the snapshot keeps the same ACL dict until then), so a decision costs dict lookups.

The principal is the connection's (``Session.principal``: SASL user, TLS certificate subject or
``User:ANONYMOUS``), the host the client's address. A denial is counted
(``kafscale_authorization_denied_total{api}``) and logged at most once per principal per minute.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

import msgspec

from kafscale import metrics
from kafscale.frontend.context import Broker, RequestContext
from kafscale.frontend.limits import LogLimiter
from kafscale.ipc.messages import AclValue
from kafscale.metadata.records import AclRecord
from kafscale.protocol.acls import AclOperation
from kafscale.security.authorizer import (
    SUPPORTED_OPERATIONS,
    WILDCARD_PRINCIPAL,
    AclBinding,
    AclPermissionType,
    Authorizer,
    PatternType,
    ResourceType,
    binding_error,
    binding_from_codes,
)

log = logging.getLogger(__name__)

CLUSTER = "kafka-cluster"
UNNAMED = "hardcode"  # Kafka's stand-in for "a topic no ACL names" (authorizeByResourceType)
_denials_logged = LogLimiter(60.0)
_built: tuple[dict[str, AclRecord], tuple[str, ...], bool, Authorizer] | None = None


def binding_of(record: AclRecord | AclValue) -> AclBinding:
    """A stored or requested binding (same fields, Kafka's codes) as the authorizer's."""
    return binding_from_codes(*msgspec.structs.astuple(record))


def authorizer(broker: Broker) -> Authorizer | None:
    """The authorizer of the view's current ACLs; None with ``KAFSCALE_AUTHORIZER=none``."""
    global _built
    config = broker.config
    if config.authorizer != "acl":
        return None
    acls = broker.view.snapshot.acls
    settings = (config.super_users, config.allow_everyone_if_no_acl_found)
    if _built is not None and _built[0] is acls and _built[1:3] == settings:
        return _built[3]
    bindings = []
    for key, record in acls.items():
        binding = binding_of(record)
        if (problem := binding_error(binding)) is not None:
            log.error("skipping an invalid stored ACL", extra={"key": key, "error": problem})
            continue
        bindings.append(binding)
    built = Authorizer(
        bindings, frozenset(config.super_users), config.allow_everyone_if_no_acl_found
    )
    _built = (acls, *settings, built)
    return built


def host(ctx: RequestContext) -> str:
    """The client's address as ACL hosts name it (no port, IPv6 without brackets)."""
    address = ctx.peer.rsplit(":", 1)[0] if ":" in ctx.peer else ctx.peer
    return address.strip("[]")


def allowed(
    ctx: RequestContext,
    operation: AclOperation,
    resource_type: ResourceType,
    name: str,
    *,
    count_denial: bool = True,
) -> bool:
    """May this request's principal do ``operation`` on the resource? Denials are counted and
    logged unless ``count_denial`` is False (a listing that silently leaves things out)."""
    decider = authorizer(ctx.broker)
    if decider is None:
        return True
    principal = ctx.session.principal
    if decider.authorize(principal, host(ctx), operation, resource_type, name):
        return True
    if count_denial:
        denied(ctx, operation, resource_type, name)
    return False


def denied(
    ctx: RequestContext, operation: AclOperation, resource_type: ResourceType, name: str
) -> None:
    api = _api_name(ctx)
    metrics.AUTHORIZATION_DENIED.labels(api).inc()
    principal = ctx.session.principal
    held_back = _denials_logged.allow(principal, time.monotonic())
    if held_back is not None:
        log.info(
            "authorization denied",
            extra={
                "principal": principal,
                "peer": ctx.peer,
                "api": api,
                "operation": operation.name,
                "resource": f"{resource_type.name}:{name}",
                "denials_not_logged": held_back,
            },
        )


def cluster_allowed(ctx: RequestContext, operation: AclOperation) -> bool:
    return allowed(ctx, operation, ResourceType.CLUSTER, CLUSTER)


def authorized_operations(ctx: RequestContext, resource_type: ResourceType, name: str) -> int:
    """KIP-430's bit field for the resource: from the ACLs, or all it supports without them."""
    decider = authorizer(ctx.broker)
    if decider is None:
        return sum(1 << op for op in SUPPORTED_OPERATIONS[resource_type])
    return decider.authorized_operations(ctx.session.principal, host(ctx), resource_type, name)


def _api_name(ctx: RequestContext) -> str:
    api: Any = ctx.broker.apis.get(ctx.header.api_key)
    return str(api.name) if api is not None else str(ctx.header.api_key)


def topics_allowed(
    ctx: RequestContext, operation: AclOperation, names: Iterable[str], *, count_denial: bool = True
) -> set[str]:
    """The topics of ``names`` the principal may ``operation``."""
    return {
        name
        for name in set(names)
        if allowed(ctx, operation, ResourceType.TOPIC, name, count_denial=count_denial)
    }


def may_create_topic(ctx: RequestContext, name: str, *, count_denial: bool = True) -> bool:
    """CREATE on the cluster, or on the topic itself (Kafka's rule for CreateTopics and
    auto-creation)."""
    if allowed(ctx, AclOperation.CREATE, ResourceType.CLUSTER, CLUSTER, count_denial=False):
        return True
    return allowed(ctx, AclOperation.CREATE, ResourceType.TOPIC, name, count_denial=count_denial)


def may_write_some_topic(ctx: RequestContext) -> bool:
    """Kafka's ``authorizeByResourceType(TOPIC, WRITE)`` (KIP-679: an idempotent producer needs
    WRITE on some topic or IDEMPOTENT_WRITE on the cluster). As Kafka: a topic no ACL names
    decides first (super users, allow-everyone, an ALLOW on every topic); else some ALLOW of
    WRITE (or ALL) for this principal (or ``User:*``) and host that no DENY shadows (a DENY of
    the same literal name, of a prefix of it, or of every topic)."""
    decider = authorizer(ctx.broker)
    if decider is None:
        return True
    principal, address = ctx.session.principal, host(ctx)
    if decider.authorize(principal, address, AclOperation.WRITE, ResourceType.TOPIC, UNNAMED):
        return True
    denied_names: dict[PatternType, set[str]] = {
        PatternType.LITERAL: set(),
        PatternType.PREFIXED: set(),
    }
    allowed_names: dict[PatternType, set[str]] = {
        PatternType.LITERAL: set(),
        PatternType.PREFIXED: set(),
    }
    for binding in map(binding_of, ctx.broker.view.snapshot.acls.values()):
        if (
            binding.resource_type != ResourceType.TOPIC
            or binding.principal not in (principal, WILDCARD_PRINCIPAL)
            or binding.host not in (address, "*")
            or binding.operation not in (AclOperation.WRITE, AclOperation.ALL)
        ):
            continue
        every = binding.pattern_type == PatternType.LITERAL and binding.resource_name == "*"
        if binding.permission_type == AclPermissionType.DENY:
            if every:
                return False
            denied_names[binding.pattern_type].add(binding.resource_name)
        elif binding.permission_type == AclPermissionType.ALLOW:
            if every:
                return True
            allowed_names[binding.pattern_type].add(binding.resource_name)
    for kind, names in allowed_names.items():
        for name in names:
            if kind == PatternType.LITERAL and name in denied_names[PatternType.LITERAL]:
                continue
            prefixes = (name[:i] for i in range(1, len(name) + 1))
            if any(prefix in denied_names[PatternType.PREFIXED] for prefix in prefixes):
                continue
            return True
    return False
