"""Users (SCRAM credentials, KIP-554) and ACLs, viewed and edited through the Kafka protocol:
the brokers decide who may (DescribeUserScramCredentials and the ACL requests need the cluster's
Describe/Alter), so a user without the rights gets the broker's refusal on the page."""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)

from kafscale.console.kafka import KafkaAccess
from kafscale.console.web import call, failed, flash, form_int, kafka, redirect, render
from kafscale.kafka_admin import MECHANISM_NAMES, MECHANISMS, AdminError

RESOURCE_TYPES = ("TOPIC", "GROUP", "CLUSTER", "TRANSACTIONAL_ID")
PATTERNS = ("LITERAL", "PREFIXED")
OPERATIONS = (
    "ALL",
    "READ",
    "WRITE",
    "CREATE",
    "DELETE",
    "ALTER",
    "DESCRIBE",
    "CLUSTER_ACTION",
    "DESCRIBE_CONFIGS",
    "ALTER_CONFIGS",
    "IDEMPOTENT_WRITE",
)
PERMISSIONS = ("ALLOW", "DENY")
MIN_ITERATIONS = 4096  # Kafka's minimum for SCRAM credentials


@dataclass(frozen=True, order=True)
class Acl:
    resource_type: str
    name: str
    pattern: str
    principal: str
    host: str
    operation: str
    permission: str


def may_describe_cluster(access: KafkaAccess) -> bool:
    """Whether this identity has Describe on the cluster (what DescribeUserScramCredentials
    needs), as the brokers report its authorized operations."""
    future = access.session.client.describe_cluster(
        include_authorized_operations=True, request_timeout=access.timeout
    )
    cluster = access.session.wait(future, "describing the cluster")
    allowed = set(cluster.authorized_operations or ())
    return bool(allowed & {AclOperation.DESCRIBE, AclOperation.ALL})


def users(access: KafkaAccess) -> dict[str, list[tuple[str, int]]]:
    """user -> [(mechanism, iterations)].

    Asked only of an identity with Describe on the cluster: confluent-kafka (2.16.1) aborts the
    whole process (``munmap_chunk(): invalid pointer``) when a DescribeUserScramCredentials
    answer carries an error such as CLUSTER_AUTHORIZATION_FAILED, so the refusal is foreseen
    here instead of asked for."""
    if not may_describe_cluster(access):
        raise AdminError(
            "listing SCRAM users: CLUSTER_AUTHORIZATION_FAILED: this user may not describe the "
            "cluster (an ACL allowing Describe on the cluster is needed)",
            False,
            "CLUSTER_AUTHORIZATION_FAILED",
        )
    future = access.session.client.describe_user_scram_credentials(request_timeout=access.timeout)
    found = access.session.wait(future, "listing SCRAM users")
    return {
        name: sorted(
            (MECHANISM_NAMES.get(info.mechanism, str(info.mechanism)), int(info.iterations))
            for info in description.scram_credential_infos
        )
        for name, description in sorted(found.items())
    }


def set_password(
    access: KafkaAccess, user: str, mechanism: str, iterations: int, password: str
) -> None:
    info = ScramCredentialInfo(MECHANISMS[mechanism], iterations)
    upsert = UserScramCredentialUpsertion(user, info, password.encode())
    futures = access.session.client.alter_user_scram_credentials(
        [upsert], request_timeout=access.timeout
    )
    access.session.wait_all(futures.values(), f"storing user {user}'s credential")


def delete_user(access: KafkaAccess, user: str, mechanisms: list[str]) -> None:
    deletions: list[Any] = [UserScramCredentialDeletion(user, MECHANISMS[m]) for m in mechanisms]
    futures = access.session.client.alter_user_scram_credentials(
        deletions, request_timeout=access.timeout
    )
    access.session.wait_all(futures.values(), f"deleting user {user}'s credentials")


def acls(access: KafkaAccess) -> list[Acl]:
    match_all = AclBindingFilter(
        ResourceType.ANY,
        None,
        ResourcePatternType.ANY,
        None,
        None,
        AclOperation.ANY,
        AclPermissionType.ANY,
    )
    future = access.session.client.describe_acls(match_all, request_timeout=access.timeout)
    return sorted(
        Acl(
            b.restype.name,
            b.name,
            b.resource_pattern_type.name,
            b.principal,
            b.host,
            b.operation.name,
            b.permission_type.name,
        )
        for b in access.session.wait(future, "listing ACLs")
    )


def _binding(kind: type[Any], acl: Acl) -> Any:
    return kind(
        ResourceType[acl.resource_type],
        acl.name,
        ResourcePatternType[acl.pattern],
        acl.principal,
        acl.host,
        AclOperation[acl.operation],
        AclPermissionType[acl.permission],
    )


def create_acl(access: KafkaAccess, acl: Acl) -> None:
    futures = access.session.client.create_acls(
        [_binding(AclBinding, acl)], request_timeout=access.timeout
    )
    access.session.wait_all(futures.values(), "creating the ACL")


def delete_acl(access: KafkaAccess, acl: Acl) -> None:
    futures = access.session.client.delete_acls(
        [_binding(AclBindingFilter, acl)], request_timeout=access.timeout
    )
    access.session.wait_all(futures.values(), "deleting the ACL")


def _acl_from(form: Any) -> Acl:
    def choice(name: str, choices: tuple[str, ...]) -> str:
        value = str(form.get(name, ""))
        if value not in choices:
            raise web.HTTPBadRequest(text=f"{name}: {value!r} is not one of {', '.join(choices)}")
        return value

    resource_type = choice("resource_type", RESOURCE_TYPES)
    name = str(form.get("name", "")).strip()
    if resource_type == "CLUSTER":
        name = "kafka-cluster"
    principal = str(form.get("principal", "")).strip()
    if not name or ":" not in principal:
        raise web.HTTPBadRequest(text="an ACL needs a resource name and a principal Type:name")
    return Acl(
        resource_type,
        name,
        choice("pattern", PATTERNS),
        principal,
        str(form.get("host", "*")).strip() or "*",
        choice("operation", OPERATIONS),
        choice("permission", PERMISSIONS),
    )


async def security_page(request: web.Request) -> web.StreamResponse:
    access = kafka(request)
    found_users: dict[str, list[tuple[str, int]]] | None = None
    found_acls: list[Acl] | None = None
    errors = []
    try:
        found_users = await call(users, access)
    except AdminError as exc:
        errors.append(str(exc))
    try:
        found_acls = await call(acls, access)
    except AdminError as exc:
        errors.append(str(exc))
    principal = request.query.get("principal", "").strip()
    if found_acls is not None and principal:
        found_acls = [a for a in found_acls if principal.lower() in a.principal.lower()]
    return render(
        request,
        "security.html",
        users=found_users,
        acls=found_acls,
        errors=errors,
        principal=principal,
        mechanisms=sorted(MECHANISMS),
        resource_types=RESOURCE_TYPES,
        patterns=PATTERNS,
        operations=OPERATIONS,
        permissions=PERMISSIONS,
        quote=lambda text: urllib.parse.quote(text, safe=""),
    )


async def user_set(request: web.Request) -> web.StreamResponse:
    form = await request.post()
    user = str(form.get("user", "")).strip()
    mechanism = str(form.get("mechanism", ""))
    password = str(form.get("password", ""))
    if not user or mechanism not in MECHANISMS or not password:
        flash(request, "error", "A user needs a name, a SCRAM mechanism and a password.")
        raise redirect("/security")
    iterations = form_int(form, "iterations", MIN_ITERATIONS, low=MIN_ITERATIONS)
    try:
        await call(set_password, kafka(request), user, mechanism, iterations, password)
    except AdminError as exc:
        raise failed(request, exc, "/security") from None
    flash(request, "ok", f"{mechanism} credential of {user} stored.")
    raise redirect("/security")


async def user_delete(request: web.Request) -> web.StreamResponse:
    form = await request.post()
    user = str(form.get("user", ""))
    mechanisms = [m for m in form.getall("mechanism", []) if m in MECHANISMS]
    try:
        await call(delete_user, kafka(request), user, mechanisms)
    except AdminError as exc:
        raise failed(request, exc, "/security") from None
    flash(request, "ok", f"Credentials of {user} deleted.")
    raise redirect("/security")


async def acl_create(request: web.Request) -> web.StreamResponse:
    acl = _acl_from(await request.post())
    try:
        await call(create_acl, kafka(request), acl)
    except AdminError as exc:
        raise failed(request, exc, "/security") from None
    flash(request, "ok", f"ACL created: {acl.permission} {acl.principal} {acl.operation}.")
    raise redirect("/security")


async def acl_delete(request: web.Request) -> web.StreamResponse:
    acl = _acl_from(await request.post())
    try:
        await call(delete_acl, kafka(request), acl)
    except AdminError as exc:
        raise failed(request, exc, "/security") from None
    flash(request, "ok", "ACL deleted.")
    raise redirect("/security")


def register(router: web.UrlDispatcher) -> None:
    router.add_get("/security", security_page)
    router.add_post("/security/users", user_set)
    router.add_post("/security/users/delete", user_delete)
    router.add_post("/security/acls", acl_create)
    router.add_post("/security/acls/delete", acl_delete)
