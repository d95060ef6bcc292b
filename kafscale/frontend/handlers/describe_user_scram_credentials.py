"""DescribeUserScramCredentials (key 50), v0 (KIP-554): which SCRAM mechanisms each user has a
credential for, and with how many iterations (never the salt or keys), as ``kafka-configs
--describe --entity-type users`` shows them.

Answered from this frontend's metadata view. All users when the request names none (null or
empty, as Kafka); a named user without a credential is RESOURCE_NOT_FOUND, a user named twice
DUPLICATE_RESOURCE. With ACLs on, DESCRIBE on the cluster is needed (else
CLUSTER_AUTHORIZATION_FAILED).
"""

from __future__ import annotations

import datetime
from collections import Counter

from kio.schema.describe_user_scram_credentials.v0.request import (
    DescribeUserScramCredentialsRequest,
)

from kafscale.frontend import authz
from kafscale.frontend.context import RequestContext
from kafscale.frontend.handlers.alter_user_scram_credentials import MECHANISMS
from kafscale.protocol.acls import AclOperation
from kafscale.protocol.codec import build, element, response_schema
from kafscale.protocol.errors import ErrorCode

API_KEY = 50
MIN_VERSION, MAX_VERSION = 0, 0
CODES = {name: code for code, name in MECHANISMS.items()}


async def handle(ctx: RequestContext, request: DescribeUserScramCredentialsRequest) -> object:
    schema = response_schema(API_KEY, ctx.version)
    assert schema is not None
    result = element(schema, "results")
    info = element(result, "credential_infos")
    have: dict[str, list[tuple[int, int]]] = {}
    for (user, mechanism), record in sorted(ctx.broker.view.snapshot.credentials.items()):
        if mechanism in CODES:
            have.setdefault(user, []).append((CODES[mechanism], record.iterations))
    if not authz.cluster_allowed(ctx, AclOperation.DESCRIBE):
        return build(
            schema,
            throttle_time=datetime.timedelta(0),
            error_code=ErrorCode.cluster_authorization_failed,
            error_message=None,
            results=(),
        )
    named = [user.name for user in request.users or ()]
    counts = Counter(named)
    results = []
    for user in dict.fromkeys(named) if named else have:
        if counts[user] > 1:
            code, message = (
                ErrorCode.duplicate_resource,
                "Cannot describe SCRAM credentials for the same user twice in a single request",
            )
        elif user not in have:
            code, message = (
                ErrorCode.resource_not_found,
                "Attempt to describe a user credential that does not exist",
            )
        else:
            code, message = ErrorCode.none, None
        infos = tuple(
            build(info, mechanism=mechanism, iterations=iterations)
            for mechanism, iterations in (have.get(user, []) if code is ErrorCode.none else [])
        )
        results.append(
            build(result, user=user, error_code=code, error_message=message, credential_infos=infos)
        )
    return build(
        schema,
        throttle_time=datetime.timedelta(0),
        error_code=ErrorCode.none,
        error_message=None,
        results=tuple(results),
    )
