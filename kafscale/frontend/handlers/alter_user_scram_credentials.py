"""AlterUserScramCredentials (key 51), v0 (KIP-554): set and delete users' SCRAM credentials, as
``kafka-configs --alter --entity-type users --add-config 'SCRAM-SHA-512=[password=...]'`` does
(docs/design/security.md, section 5).

The client sends the salt and the salted password (``kafka-configs`` computes them); this handler
derives StoredKey and ServerKey (``security.mechanisms.from_salted_password``) and the coordinator
writes them, one transaction per request (``kafscale.coordinator.credentials``). One result per
user, as Kafka's, whose changes apply all or none:

- a mechanism other than SCRAM-SHA-256 (1) and SCRAM-SHA-512 (2): UNSUPPORTED_SASL_MECHANISM;
- an empty user name, an empty salt or salted password, iterations outside 4,096-16,384:
  UNACCEPTABLE_CREDENTIAL;
- one user and mechanism twice in the request: DUPLICATE_RESOURCE;
- deleting a credential the user does not have: RESOURCE_NOT_FOUND;
- with ACLs on, a principal without ALTER on the cluster: CLUSTER_AUTHORIZATION_FAILED.

The answer waits until this frontend's view holds the change, so the user can authenticate
against this broker at once (the other brokers follow within their views' lag).
"""

from __future__ import annotations

import datetime
import logging
from collections import Counter

from kio.schema.alter_user_scram_credentials.v0.request import (
    AlterUserScramCredentialsRequest,
)

from kafscale.frontend import authz
from kafscale.frontend.context import RequestContext
from kafscale.ipc.messages import (
    AlterScramCredentials,
    ScramChange,
    ScramCredentialsAltered,
    ScramValue,
)
from kafscale.ipc.rpc import RpcError
from kafscale.protocol.acls import AclOperation
from kafscale.protocol.codec import build, element, response_schema
from kafscale.protocol.errors import ErrorCode
from kafscale.security.mechanisms import MAX_ITERATIONS, MIN_ITERATIONS, from_salted_password

API_KEY = 51
MIN_VERSION, MAX_VERSION = 0, 0
MECHANISMS = {1: "SCRAM-SHA-256", 2: "SCRAM-SHA-512"}  # Kafka's ScramMechanism type codes

log = logging.getLogger(__name__)

Outcome = tuple[ErrorCode, str | None]


def check(
    user: str, mechanism: int, iterations: int | None, salt: bytes, salted: bytes
) -> Outcome | None:
    """Why one change is refused (None: it is acceptable); ``iterations`` None for a deletion."""
    if not user:
        return ErrorCode.unacceptable_credential, "Username must not be empty"
    if mechanism not in MECHANISMS:
        return ErrorCode.unsupported_sasl_mechanism, "Unknown SCRAM mechanism"
    if iterations is None:
        return None
    if iterations < MIN_ITERATIONS:
        return ErrorCode.unacceptable_credential, "Too few iterations"
    if iterations > MAX_ITERATIONS:
        return ErrorCode.unacceptable_credential, "Too many iterations"
    if not salt or not salted:
        return ErrorCode.unacceptable_credential, "Salt and salted password must not be empty"
    return None


async def handle(ctx: RequestContext, request: AlterUserScramCredentialsRequest) -> object:
    schema = response_schema(API_KEY, ctx.version)
    assert schema is not None
    named = [(d.name, int(d.mechanism)) for d in request.deletions]
    named += [(u.name, int(u.mechanism)) for u in request.upsertions]
    pairs = Counter(named)
    users = list(dict.fromkeys(user for user, _ in named))
    outcomes: dict[str, Outcome] = {}
    if not authz.cluster_allowed(ctx, AclOperation.ALTER):
        outcomes = dict.fromkeys(users, (ErrorCode.cluster_authorization_failed, None))
    changes: list[ScramChange] = []
    for deletion in request.deletions:
        problem = check(deletion.name, int(deletion.mechanism), None, b"", b"")
        if problem is not None:
            outcomes.setdefault(deletion.name, problem)
        elif pairs[(deletion.name, int(deletion.mechanism))] == 1:
            changes.append(ScramChange(deletion.name, MECHANISMS[deletion.mechanism], None))
    for upsertion in request.upsertions:
        mechanism, iterations = int(upsertion.mechanism), int(upsertion.iterations)
        salt, salted = upsertion.salt, upsertion.salted_password
        problem = check(upsertion.name, mechanism, iterations, salt, salted)
        if problem is not None:
            outcomes.setdefault(upsertion.name, problem)
        elif pairs[(upsertion.name, mechanism)] == 1:
            credential = from_salted_password(MECHANISMS[mechanism], salt, salted, iterations)
            value = ScramValue(
                credential.salt, credential.stored_key, credential.server_key, iterations
            )
            changes.append(ScramChange(upsertion.name, MECHANISMS[mechanism], value))
    for (user, _), count in pairs.items():
        if count > 1:
            outcomes.setdefault(
                user,
                (
                    ErrorCode.duplicate_resource,
                    "A user credential cannot be altered twice in the same request",
                ),
            )
    wanted = [change for change in changes if change.user not in outcomes]
    if wanted:
        outcomes.update(await _ask(ctx, AlterScramCredentials(wanted)))
    entry = element(schema, "results")
    return build(
        schema,
        throttle_time=datetime.timedelta(0),
        results=tuple(
            build(entry, user=user, error_code=code, error_message=message)
            for user in users
            for code, message in (outcomes.get(user, (ErrorCode.none, None)),)
        ),
    )


async def _ask(ctx: RequestContext, message: AlterScramCredentials) -> dict[str, Outcome]:
    users = dict.fromkeys(change.user for change in message.changes)
    try:
        reply = await ctx.broker.coordinator.call(message)
    except RpcError as exc:
        log.warning("coordinator unavailable", extra={"error": str(exc), "peer": ctx.peer})
        return {
            user: (ErrorCode.request_timed_out, "the coordinator is unavailable") for user in users
        }
    if not isinstance(reply, ScramCredentialsAltered):
        log.error("unexpected reply from the coordinator", extra={"reply": repr(reply)})
        return dict.fromkeys(users, (ErrorCode.unknown_server_error, "unexpected reply"))
    if reply.revision:
        await ctx.broker.coordinator.caught_up(reply.revision)
    return {r.user: (ErrorCode(r.error_code), r.error_message) for r in reply.results}
