"""The coordinator's side of AlterUserScramCredentials (KIP-554), and the first admin user
(docs/design/security.md, section 5).

Credentials live at ``users/{user}/{mechanism}`` (``ScramRecord``: salt, StoredKey, ServerKey,
iterations; never a password). Any broker's coordinator may write them: each request is one
transaction that compares every key it read, so two brokers altering one user at once never
interleave, and a lost race is read again (``ATTEMPTS`` times).

``plan`` is pure: the credentials a request's users have now and its changes in, the results and
the writes out. A user's changes apply all or none: deleting a credential the user does not have
fails the user with RESOURCE_NOT_FOUND, as Kafka does, and nothing of that user is written.

``ensure_user`` creates the first admin (``KAFSCALE_SASL_ADMIN_USER``) at start: a credential
per SCRAM mechanism, written only when the user has none, so a password changed or a mechanism
deleted since with ``kafka-configs`` is never put back. (A user deleted entirely is created again
at the next start while the variable is set: unset it once users are managed.)
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from kafscale.ipc.messages import (
    AlterScramCredentials,
    ScramChange,
    ScramCredentialsAltered,
    UserResult,
)
from kafscale.ipc.rpc import Handler, Incoming
from kafscale.metadata import records
from kafscale.metadata.records import Keys, ScramRecord
from kafscale.metadata.store import Compare, Delete, MetadataStore, Operation, Put
from kafscale.protocol.errors import ErrorCode
from kafscale.security.mechanisms import MIN_ITERATIONS, SCRAM_MECHANISMS, from_password

log = logging.getLogger(__name__)

ATTEMPTS = 5
ADMIN_ITERATIONS = MIN_ITERATIONS * 2  # the first admin's credentials (Kafka's tools use 4096)

Plan = tuple[list[UserResult], dict[tuple[str, str], ScramRecord | None]]


def plan(present: Iterable[tuple[str, str]], changes: Iterable[ScramChange]) -> Plan:
    """Each user's result, in order of first mention, and the writes: (user, mechanism) ->
    the record to put, or None to delete. ``present``: the credentials that exist now."""
    exists = set(present)
    by_user: dict[str, list[ScramChange]] = {}
    for change in changes:
        by_user.setdefault(change.user, []).append(change)
    results: list[UserResult] = []
    writes: dict[tuple[str, str], ScramRecord | None] = {}
    for user, mine in by_user.items():
        missing = [
            c.mechanism for c in mine if c.credential is None and (user, c.mechanism) not in exists
        ]
        if missing:
            results.append(
                UserResult(
                    user,
                    int(ErrorCode.resource_not_found),
                    "Attempt to delete a user credential that does not exist",
                )
            )
            continue
        for change in mine:
            value = change.credential
            writes[(user, change.mechanism)] = (
                None
                if value is None
                else ScramRecord(value.salt, value.stored_key, value.server_key, value.iterations)
            )
        results.append(UserResult(user))
    return results, writes


class CredentialAdmin:
    def __init__(self, store: MetadataStore, namespace: str) -> None:
        self.store = store
        self.keys = Keys(namespace)

    def handlers(self) -> dict[type, Handler]:
        return {AlterScramCredentials: self.handle_alter}

    def handle_alter(self, incoming: Incoming) -> ScramCredentialsAltered:
        assert isinstance(incoming.message, AlterScramCredentials)
        return self.alter(incoming.message)

    def alter(self, request: AlterScramCredentials) -> ScramCredentialsAltered:
        users = list(dict.fromkeys(change.user for change in request.changes))
        for _ in range(ATTEMPTS):
            current = self._read(users)
            results, writes = plan(current, request.changes)
            if not writes:
                return ScramCredentialsAltered(results, 0)
            compares = [
                Compare(self.keys.user(*um), mod_revision=current.get(um, 0)) for um in writes
            ]
            ops: list[Operation] = [
                Delete(self.keys.user(*um))
                if record is None
                else Put(self.keys.user(*um), records.encode(record))
                for um, record in writes.items()
            ]
            txn = self.store.transaction(compares, ops)
            if txn.succeeded:
                for (user, mechanism), record in writes.items():
                    log.info(
                        "SCRAM credential %s",
                        "deleted" if record is None else "set",
                        extra={"user": user, "mechanism": mechanism},
                    )
                return ScramCredentialsAltered(results, txn.revision)
        message = "the users' credentials kept changing during the update; retry"
        code = int(ErrorCode.request_timed_out)
        return ScramCredentialsAltered([UserResult(u, code, message) for u in users], 0)

    def _read(self, users: Iterable[str]) -> Mapping[tuple[str, str], int]:
        """The credentials ``users`` have: (user, mechanism) -> the key's mod revision."""
        out: dict[tuple[str, str], int] = {}
        for user in users:
            for kv in self.store.get_prefix(self.keys.user_credentials(user)):
                parsed = self.keys.parse_user(kv.key)
                if parsed is not None and parsed[0] == user:
                    out[parsed] = kv.mod_revision
        return out

    def ensure_user(self, user: str, password: str) -> None:
        """Create ``user``'s SCRAM-SHA-256 and -512 credentials when the user has none: one
        transaction, each key compared absent. A user with any credential (one mechanism deleted
        or changed with kafka-configs) is left alone, so a retired password never comes back."""
        if self.store.get_prefix(self.keys.user_credentials(user)):
            return
        keys, puts = [], []
        for mechanism in SCRAM_MECHANISMS:
            credential = from_password(mechanism, password, ADMIN_ITERATIONS)
            record = ScramRecord(
                credential.salt, credential.stored_key, credential.server_key, credential.iterations
            )
            key = self.keys.user(user, mechanism)
            keys.append(key)
            puts.append(Put(key, records.encode(record)))
        txn = self.store.transaction([Compare.absent(key) for key in keys], puts)
        if txn.succeeded:
            log.info(
                "created the admin user's SCRAM credentials (KAFSCALE_SASL_ADMIN_USER)",
                extra={"user": user, "mechanisms": list(SCRAM_MECHANISMS)},
            )
