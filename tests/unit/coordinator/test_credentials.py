"""SCRAM credential management on the coordinator (KIP-554, ``kafscale.coordinator.credentials``).

Covered:

- ``plan``, pure: one result per user in order of first mention; a deletion of a credential the
  user lacks fails that whole user with RESOURCE_NOT_FOUND and writes nothing of that user while
  the other users are still written; puts carry a ``ScramRecord`` built from the ``ScramValue``,
  deletions map to None.
- ``CredentialAdmin.alter`` against the real embedded SQLite metadata store: set, read back
  through ``Keys.user`` and ``records.decode_scram``, overwrite, delete; the revision is the
  write's (> 0) and 0 when nothing is written; a transaction that loses a race is read again and
  retried, and one that always loses ends with REQUEST_TIMED_OUT and writes nothing.
- ``CredentialAdmin.ensure_user``: SCRAM-SHA-256 and -512 credentials that
  ``password_matches`` accepts for the password, never overwritten by a second call.
- ``MetadataView`` over that store: ``snapshot.credentials`` keyed (user, mechanism), user names
  with '/' and '%' included (keys percent-encode them), dropped on deletion.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from kafscale.coordinator.credentials import ADMIN_ITERATIONS, ATTEMPTS, CredentialAdmin, plan
from kafscale.ipc.messages import AlterScramCredentials, ScramChange, ScramValue, UserResult
from kafscale.metadata import records
from kafscale.metadata.records import Keys, ScramRecord
from kafscale.metadata.sqlite import SqliteMetadataStore
from kafscale.metadata.store import Compare, Operation, TxnResult
from kafscale.metadata.view import MetadataView
from kafscale.protocol.errors import ErrorCode
from kafscale.security.mechanisms import (
    SCRAM_MECHANISMS,
    ScramCredential,
    from_password,
    password_matches,
)

NS = "ns"
SHA256, SHA512 = "SCRAM-SHA-256", "SCRAM-SHA-512"
NOT_FOUND = int(ErrorCode.resource_not_found)


def value(tag: bytes, iterations: int = 4096) -> ScramValue:
    return ScramValue(b"salt-" + tag, b"stored-" + tag, b"server-" + tag, iterations)


def record_of(v: ScramValue) -> ScramRecord:
    return ScramRecord(v.salt, v.stored_key, v.server_key, v.iterations)


def put(user: str, mechanism: str, v: ScramValue) -> ScramChange:
    return ScramChange(user, mechanism, v)


def delete(user: str, mechanism: str) -> ScramChange:
    return ScramChange(user, mechanism, None)


def as_credential(record: ScramRecord) -> ScramCredential:
    return ScramCredential(record.salt, record.stored_key, record.server_key, record.iterations)


# -- plan --------------------------------------------------------------------------------------

A, B = value(b"a"), value(b"b", 8192)


@pytest.mark.parametrize(
    ("present", "changes", "results", "writes"),
    [
        pytest.param(set(), [], [], {}, id="nothing"),
        pytest.param(
            set(),
            [put("alice", SHA512, A)],
            [UserResult("alice")],
            {("alice", SHA512): record_of(A)},
            id="one put",
        ),
        pytest.param(
            {("alice", SHA256)},
            [delete("alice", SHA256)],
            [UserResult("alice")],
            {("alice", SHA256): None},
            id="delete present",
        ),
        pytest.param(
            set(),
            [delete("alice", SHA256)],
            [
                UserResult(
                    "alice", NOT_FOUND, "Attempt to delete a user credential that does not exist"
                )
            ],
            {},
            id="delete missing",
        ),
        pytest.param(
            {("bob", SHA512)},
            [put("alice", SHA512, A), delete("alice", SHA256), delete("bob", SHA512)],
            [
                UserResult(
                    "alice", NOT_FOUND, "Attempt to delete a user credential that does not exist"
                ),
                UserResult("bob"),
            ],
            {("bob", SHA512): None},
            id="a missing deletion fails the whole user, not the others",
        ),
        pytest.param(
            {("alice", SHA256)},
            [put("carol", SHA256, B), put("alice", SHA512, A), put("carol", SHA512, A)],
            [UserResult("carol"), UserResult("alice")],
            {
                ("carol", SHA256): record_of(B),
                ("alice", SHA512): record_of(A),
                ("carol", SHA512): record_of(A),
            },
            id="results in order of first mention",
        ),
        pytest.param(
            {("alice", SHA512)},
            [put("alice", SHA512, B), delete("alice", SHA512)],
            [UserResult("alice")],
            {("alice", SHA512): None},
            id="later change of one key wins (the frontend refuses this)",
        ),
        pytest.param(
            {("bob", SHA256)},
            [delete("alice", SHA256)],
            [
                UserResult(
                    "alice", NOT_FOUND, "Attempt to delete a user credential that does not exist"
                )
            ],
            {},
            id="another user's credential does not count",
        ),
    ],
)
def test_plan(
    present: set[tuple[str, str]],
    changes: list[ScramChange],
    results: list[UserResult],
    writes: dict[tuple[str, str], ScramRecord | None],
) -> None:
    got_results, got_writes = plan(present, changes)
    assert got_results == results
    assert got_writes == writes


def test_plan_puts_carry_every_field_of_the_value() -> None:
    v = ScramValue(b"\x00\x01", b"\x02" * 64, b"\x03" * 64, 16384)
    _, writes = plan([], [put("u", SHA512, v)])
    [record] = writes.values()
    assert isinstance(record, ScramRecord)
    assert (record.salt, record.stored_key, record.server_key, record.iterations) == (
        b"\x00\x01",
        b"\x02" * 64,
        b"\x03" * 64,
        16384,
    )


def test_plan_accepts_any_iterable_of_present_keys_once() -> None:
    present = iter([("alice", SHA256), ("bob", SHA512)])  # a one-shot iterator
    results, writes = plan(present, [delete("alice", SHA256), delete("bob", SHA512)])
    assert results == [UserResult("alice"), UserResult("bob")]
    assert writes == {("alice", SHA256): None, ("bob", SHA512): None}


# -- CredentialAdmin over a real SQLite store --------------------------------------------------


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteMetadataStore]:
    opened = SqliteMetadataStore(str(tmp_path / "metadata.sqlite"))
    try:
        yield opened
    finally:
        opened.close()


def stored(store: SqliteMetadataStore, user: str, mechanism: str) -> ScramRecord | None:
    kv = store.get(Keys(NS).user(user, mechanism))
    return None if kv is None else records.decode_scram(kv.value)


def alter(admin: CredentialAdmin, *changes: ScramChange) -> tuple[list[UserResult], int]:
    reply = admin.alter(AlterScramCredentials(list(changes)))
    return reply.results, reply.revision


def test_alter_sets_reads_back_overwrites_and_deletes(store: SqliteMetadataStore) -> None:
    admin = CredentialAdmin(store, NS)
    results, revision = alter(admin, put("alice", SHA512, A), put("alice", SHA256, B))
    assert results == [UserResult("alice")]
    assert revision > 0 and revision == store.revision()
    assert stored(store, "alice", SHA512) == record_of(A)
    assert stored(store, "alice", SHA256) == record_of(B)
    # Both keys were written by the one transaction.
    key = Keys(NS).user
    kvs = [store.get(key("alice", m)) for m in (SHA512, SHA256)]
    assert [kv.mod_revision for kv in kvs if kv is not None] == [revision, revision]

    results, second = alter(admin, put("alice", SHA512, B))
    assert results == [UserResult("alice")] and second > revision
    assert stored(store, "alice", SHA512) == record_of(B)

    results, third = alter(admin, delete("alice", SHA256))
    assert results == [UserResult("alice")] and third > second
    assert stored(store, "alice", SHA256) is None
    assert stored(store, "alice", SHA512) == record_of(B)


def test_alter_writes_nothing_and_answers_revision_0_when_nothing_applies(
    store: SqliteMetadataStore,
) -> None:
    admin = CredentialAdmin(store, NS)
    before = store.revision()
    results, revision = alter(admin, put("alice", SHA512, A), delete("alice", SHA256))
    assert results == [
        UserResult("alice", NOT_FOUND, "Attempt to delete a user credential that does not exist")
    ]
    assert revision == 0
    assert store.revision() == before
    assert stored(store, "alice", SHA512) is None


def test_alter_fails_one_user_and_writes_the_others(store: SqliteMetadataStore) -> None:
    admin = CredentialAdmin(store, NS)
    alter(admin, put("bob", SHA256, A))
    results, revision = alter(
        admin, delete("alice", SHA512), put("bob", SHA512, B), delete("bob", SHA256)
    )
    assert [(r.user, r.error_code) for r in results] == [("alice", NOT_FOUND), ("bob", 0)]
    assert revision > 0
    assert stored(store, "bob", SHA512) == record_of(B)
    assert stored(store, "bob", SHA256) is None


def test_alter_sees_only_the_named_users_credentials(store: SqliteMetadataStore) -> None:
    """User "al" must not find "alice"'s credentials (a key prefix of one is not the other's)."""
    admin = CredentialAdmin(store, NS)
    alter(admin, put("alice", SHA512, A))
    results, revision = alter(admin, delete("al", SHA512))
    assert [(r.user, r.error_code) for r in results] == [("al", NOT_FOUND)]
    assert revision == 0
    assert stored(store, "alice", SHA512) == record_of(A)


def test_alter_is_confined_to_its_namespace(store: SqliteMetadataStore) -> None:
    alter(CredentialAdmin(store, "other"), put("alice", SHA512, A))
    results, _ = alter(CredentialAdmin(store, NS), delete("alice", SHA512))
    assert results[0].error_code == NOT_FOUND


class RacingStore:
    """The real store, except that before each of the first ``races`` transactions another
    writer changes every key the transaction compares (a concurrent alteration)."""

    def __init__(self, store: SqliteMetadataStore, races: int) -> None:
        self.store = store
        self.races = races
        self.transactions = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.store, name)

    def transaction(self, compares: Sequence[Compare], ops: Sequence[Operation]) -> TxnResult:
        self.transactions += 1
        if self.races > 0:
            self.races -= 1
            for compare in compares:
                self.store.put(compare.key, records.encode(record_of(value(b"racer"))))
        return self.store.transaction(compares, ops)


def test_alter_reads_again_after_losing_a_race(store: SqliteMetadataStore) -> None:
    racing = RacingStore(store, races=1)
    admin = CredentialAdmin(racing, NS)  # type: ignore[arg-type]
    results, revision = alter(admin, put("alice", SHA512, A))
    assert results == [UserResult("alice")]
    assert racing.transactions == 2
    assert revision == store.revision()
    assert stored(store, "alice", SHA512) == record_of(A)


def test_alter_gives_up_with_request_timed_out_when_it_always_loses(
    store: SqliteMetadataStore,
) -> None:
    racing = RacingStore(store, races=ATTEMPTS)
    admin = CredentialAdmin(racing, NS)  # type: ignore[arg-type]
    results, revision = alter(admin, put("alice", SHA512, A), put("bob", SHA256, B))
    assert [(r.user, r.error_code) for r in results] == [
        ("alice", int(ErrorCode.request_timed_out)),
        ("bob", int(ErrorCode.request_timed_out)),
    ]
    assert all(r.error_message for r in results)
    assert revision == 0
    assert racing.transactions == ATTEMPTS
    assert stored(store, "alice", SHA512) == record_of(value(b"racer"))  # the racer's, not ours


def test_ensure_user_creates_both_mechanisms_and_never_overwrites(
    store: SqliteMetadataStore,
) -> None:
    admin = CredentialAdmin(store, NS)
    admin.ensure_user("admin", "s3cret-pass")
    created = {m: stored(store, "admin", m) for m in SCRAM_MECHANISMS}
    assert set(created) == {SHA256, SHA512}
    for mechanism, record in created.items():
        assert record is not None
        assert record.iterations == ADMIN_ITERATIONS
        assert len(record.salt) >= 16
        assert password_matches(mechanism, as_credential(record), "s3cret-pass")
        assert not password_matches(mechanism, as_credential(record), "other-pass")
    sha256, sha512 = created[SHA256], created[SHA512]
    assert sha256 is not None and sha512 is not None and sha256.salt != sha512.salt
    revision = store.revision()

    admin.ensure_user("admin", "other-pass")
    assert store.revision() == revision  # nothing written
    assert {m: stored(store, "admin", m) for m in SCRAM_MECHANISMS} == created


def test_ensure_user_leaves_a_user_with_any_credential_alone(store: SqliteMetadataStore) -> None:
    """A user with a credential set (or changed) with kafka-configs keeps exactly what it has:
    a mechanism deleted since, or a retired password, never comes back at a restart."""
    admin = CredentialAdmin(store, NS)
    mine = from_password(SHA256, "changed-since", 4096)
    alter(
        admin,
        put("admin", SHA256, ScramValue(mine.salt, mine.stored_key, mine.server_key, 4096)),
    )
    admin.ensure_user("admin", "initial")
    sha256, sha512 = stored(store, "admin", SHA256), stored(store, "admin", SHA512)
    assert sha256 is not None and sha512 is None
    assert password_matches(SHA256, as_credential(sha256), "changed-since")
    assert not password_matches(SHA256, as_credential(sha256), "initial")


def test_a_retired_admin_password_does_not_come_back(store: SqliteMetadataStore) -> None:
    admin = CredentialAdmin(store, NS)
    admin.ensure_user("admin", "initial")
    fresh = from_password(SHA512, "rotated", 4096)
    alter(
        admin,
        put("admin", SHA512, ScramValue(fresh.salt, fresh.stored_key, fresh.server_key, 4096)),
        delete("admin", SHA256),
    )
    admin.ensure_user("admin", "initial")  # the next start
    assert stored(store, "admin", SHA256) is None
    sha512 = stored(store, "admin", SHA512)
    assert sha512 is not None and password_matches(SHA512, as_credential(sha512), "rotated")


def test_ensured_user_can_be_altered_and_deleted_afterwards(store: SqliteMetadataStore) -> None:
    admin = CredentialAdmin(store, NS)
    admin.ensure_user("admin", "pw-pw-pw")
    results, revision = alter(admin, delete("admin", SHA256), delete("admin", SHA512))
    assert results == [UserResult("admin")] and revision > 0
    assert stored(store, "admin", SHA256) is None and stored(store, "admin", SHA512) is None


# -- the metadata view -------------------------------------------------------------------------

ODD_USERS = ["alice", "ops/team", "100%", "a%2Fb", "x/%/y", "é user+1"]


def test_view_shows_credentials_by_user_and_mechanism(tmp_path: Path) -> None:
    path = str(tmp_path / "metadata.sqlite")
    writer, reader = SqliteMetadataStore(path), SqliteMetadataStore(path)
    view = MetadataView(reader, NS)
    admin = CredentialAdmin(writer, NS)
    try:
        admin.ensure_user("admin", "admin-password")
        view.start()
        loaded = view.snapshot.credentials
        assert set(loaded) == {("admin", SHA256), ("admin", SHA512)}
        assert loaded[("admin", SHA512)] == stored(writer, "admin", SHA512)

        changes = [put(user, SHA512, value(user.encode())) for user in ODD_USERS]
        results, revision = alter(admin, *changes, put("ops/team", SHA256, B))
        assert results == [UserResult(user) for user in ODD_USERS]
        assert view.wait_for_revision(revision, 10)
        credentials = view.snapshot.credentials
        expected = {(user, SHA512): record_of(value(user.encode())) for user in ODD_USERS}
        expected[("ops/team", SHA256)] = record_of(B)
        expected[("admin", SHA256)] = loaded[("admin", SHA256)]
        expected[("admin", SHA512)] = loaded[("admin", SHA512)]
        assert credentials == expected
        # The key of a name with '/' is one path segment: percent-encoded.
        assert Keys(NS).user("ops/team", SHA256) == f"/kafscale/{NS}/users/ops%2Fteam/{SHA256}"
        assert Keys(NS).parse_user(Keys(NS).user("x/%/y", SHA512)) == ("x/%/y", SHA512)

        results, revision = alter(admin, delete("ops/team", SHA512), delete("100%", SHA512))
        assert results == [UserResult("ops/team"), UserResult("100%")]
        assert view.wait_for_revision(revision, 10)
        credentials = view.snapshot.credentials
        assert ("ops/team", SHA512) not in credentials and ("100%", SHA512) not in credentials
        assert ("ops/team", SHA256) in credentials and ("a%2Fb", SHA512) in credentials
        assert len(credentials) == len(expected) - 2

        # A view loaded afresh agrees with the one that followed the changes.
        fresh = MetadataView(writer, NS)
        fresh.start()
        try:
            assert fresh.snapshot.credentials == credentials
        finally:
            fresh.stop()
    finally:
        view.stop()
        writer.close()
        reader.close()


def test_view_skips_an_undecodable_credential(tmp_path: Path) -> None:
    path = str(tmp_path / "metadata.sqlite")
    store = SqliteMetadataStore(path)
    try:
        keys = Keys(NS)
        store.put(keys.user("alice", SHA512), b"{not json")
        store.put(keys.users + "no-mechanism", records.encode(record_of(A)))
        store.put(keys.user("bob", SHA256), records.encode(record_of(B)))
        view = MetadataView(store, NS)
        view.start()
        try:
            assert view.snapshot.credentials == {("bob", SHA256): record_of(B)}
        finally:
            view.stop()
    finally:
        store.close()
