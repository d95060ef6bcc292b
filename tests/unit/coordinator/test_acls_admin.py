"""ACL administration on the coordinator (``kafscale.coordinator.acls.AclAdmin``) against the
real embedded SQLite metadata store, and the metadata view following ``acls/``.

Covered:

- CreateAcls: one key per distinct binding, at ``Keys.acl(record)`` (``acls/{sha256}``), all in
  one transaction (one revision, the store's); a binding given twice in one request, or created
  again later, is still one key; bindings that differ in any single field are distinct keys;
  nothing to create writes nothing and answers revision 0.
- DeleteAcls: each filter selects exactly what Kafka's ``AclBindingFilter`` selects -- the
  expectations are written out by hand per filter (ANY fields, an exact name with pattern ANY
  or LITERAL, MATCH, PREFIXED, principal, host, operation and permission filters), not computed
  with the code under test; what is selected is removed and nothing else; each filter's answer
  lists what it removed (a binding two filters select is listed under both and removed once, in
  one transaction); nothing selected: no write, revision 0; another namespace is untouched; an
  undecodable record does not stop the others from being deleted.
- Races: a concurrent change of a selected binding between the read and the write makes the
  transaction fail and the deletion is read again (a binding deleted meanwhile is then not
  listed); a binding created meanwhile is never deleted unseen; losing every attempt raises
  ``AclsChangedConcurrently`` (the coordinator's ``contained`` turns it into an ErrorReply).
- ``MetadataView``: ``snapshot.acls`` (digest -> ``AclRecord``) gains created bindings and loses
  deleted ones; a view loaded afresh agrees; an undecodable ACL record is skipped.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from kafscale.coordinator.acls import ATTEMPTS, AclAdmin, AclsChangedConcurrently
from kafscale.ipc.messages import AclFilterValue, AclsChanged, AclValue, CreateAcls, DeleteAcls
from kafscale.ipc.rpc import Incoming
from kafscale.metadata import records
from kafscale.metadata.records import AclRecord, Keys
from kafscale.metadata.sqlite import SqliteMetadataStore
from kafscale.metadata.store import Compare, Operation, TxnResult
from kafscale.metadata.view import MetadataView
from kafscale.protocol.acls import AclOperation as Op
from kafscale.security.authorizer import AclPermissionType as Perm
from kafscale.security.authorizer import PatternType as Pat
from kafscale.security.authorizer import ResourceType as Res

NS = "ns"
KEYS = Keys(NS)


def acl(
    resource: Res,
    name: str,
    pattern: Pat,
    principal: str,
    host: str,
    operation: Op,
    permission: Perm,
) -> AclValue:
    return AclValue(
        int(resource), name, int(pattern), principal, host, int(operation), int(permission)
    )


def record(value: AclValue) -> AclRecord:
    return AclRecord(
        value.resource_type,
        value.resource_name,
        value.pattern_type,
        value.principal,
        value.host,
        value.operation,
        value.permission_type,
    )


def acl_filter(
    resource: Res = Res.ANY,
    name: str | None = None,
    pattern: Pat = Pat.ANY,
    principal: str | None = None,
    host: str | None = None,
    operation: Op = Op.ANY,
    permission: Perm = Perm.ANY,
) -> AclFilterValue:
    return AclFilterValue(
        int(resource), name, int(pattern), principal, host, int(operation), int(permission)
    )


ALICE, BOB, ADMIN = "User:alice", "User:bob", "User:admin"

# The bindings every deletion test starts from.
ORDERS_READ = acl(Res.TOPIC, "orders", Pat.LITERAL, ALICE, "*", Op.READ, Perm.ALLOW)
ORDERS_BOB_DENY = acl(Res.TOPIC, "orders", Pat.LITERAL, BOB, "*", Op.WRITE, Perm.DENY)
EVERY_TOPIC = acl(Res.TOPIC, "*", Pat.LITERAL, "User:*", "*", Op.DESCRIBE, Perm.ALLOW)
ORD_PREFIX = acl(Res.TOPIC, "ord", Pat.PREFIXED, ALICE, "10.0.0.1", Op.WRITE, Perm.ALLOW)
PAY_PREFIX = acl(Res.TOPIC, "pay", Pat.PREFIXED, BOB, "*", Op.READ, Perm.DENY)
ORDERS_GROUP = acl(Res.GROUP, "orders", Pat.LITERAL, ALICE, "*", Op.READ, Perm.ALLOW)
CLUSTER_ALTER = acl(Res.CLUSTER, "kafka-cluster", Pat.LITERAL, ADMIN, "*", Op.ALTER, Perm.ALLOW)
ORDERS_TXN = acl(Res.TRANSACTIONAL_ID, "orders", Pat.LITERAL, ALICE, "*", Op.WRITE, Perm.ALLOW)

ALL = [
    ORDERS_READ,
    ORDERS_BOB_DENY,
    EVERY_TOPIC,
    ORD_PREFIX,
    PAY_PREFIX,
    ORDERS_GROUP,
    CLUSTER_ALTER,
    ORDERS_TXN,
]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteMetadataStore]:
    opened = SqliteMetadataStore(str(tmp_path / "metadata.sqlite"))
    try:
        yield opened
    finally:
        opened.close()


def stored(store: SqliteMetadataStore, namespace: str = NS) -> dict[str, AclRecord]:
    """Every ACL key of ``namespace`` and its record, read straight from the store."""
    return {kv.key: records.decode_acl(kv.value) for kv in store.get_prefix(Keys(namespace).acls)}


def create(admin: AclAdmin, *bindings: AclValue) -> AclsChanged:
    return admin.create(CreateAcls(list(bindings)))


def delete(admin: AclAdmin, *filters: AclFilterValue) -> AclsChanged:
    return admin.delete(DeleteAcls(list(filters)))


# -- CreateAcls --------------------------------------------------------------------------------


def test_create_writes_one_key_per_binding_in_one_transaction(store: SqliteMetadataStore) -> None:
    admin = AclAdmin(store, NS)
    before = store.revision()
    reply = create(admin, ORDERS_READ, ORD_PREFIX, CLUSTER_ALTER)
    assert reply.deleted == []
    assert reply.revision > before and reply.revision == store.revision()
    expected = {KEYS.acl(record(v)): record(v) for v in (ORDERS_READ, ORD_PREFIX, CLUSTER_ALTER)}
    assert stored(store) == expected
    for key in expected:
        assert key.startswith(f"/kafscale/{NS}/acls/")
        digest = key[len(KEYS.acls) :]
        assert len(digest) == 64 and set(digest) <= set("0123456789abcdef")
        kv = store.get(key)
        assert kv is not None and kv.mod_revision == reply.revision  # one transaction


def test_the_same_binding_is_one_key(store: SqliteMetadataStore) -> None:
    admin = AclAdmin(store, NS)
    first = create(admin, ORDERS_READ, ORDERS_READ, ORD_PREFIX, ORDERS_READ)
    assert set(stored(store)) == {KEYS.acl(record(ORDERS_READ)), KEYS.acl(record(ORD_PREFIX))}
    again = create(admin, acl(Res.TOPIC, "orders", Pat.LITERAL, ALICE, "*", Op.READ, Perm.ALLOW))
    assert again.revision > first.revision
    assert set(stored(store)) == {KEYS.acl(record(ORDERS_READ)), KEYS.acl(record(ORD_PREFIX))}


def test_bindings_differing_in_any_one_field_are_distinct_keys(
    store: SqliteMetadataStore,
) -> None:
    base = ORDERS_READ
    variants = [
        acl(Res.GROUP, "orders", Pat.LITERAL, ALICE, "*", Op.READ, Perm.ALLOW),
        acl(Res.TOPIC, "orderz", Pat.LITERAL, ALICE, "*", Op.READ, Perm.ALLOW),
        acl(Res.TOPIC, "orders", Pat.PREFIXED, ALICE, "*", Op.READ, Perm.ALLOW),
        acl(Res.TOPIC, "orders", Pat.LITERAL, BOB, "*", Op.READ, Perm.ALLOW),
        acl(Res.TOPIC, "orders", Pat.LITERAL, ALICE, "10.0.0.1", Op.READ, Perm.ALLOW),
        acl(Res.TOPIC, "orders", Pat.LITERAL, ALICE, "*", Op.WRITE, Perm.ALLOW),
        acl(Res.TOPIC, "orders", Pat.LITERAL, ALICE, "*", Op.READ, Perm.DENY),
    ]
    create(AclAdmin(store, NS), base, *variants)
    assert sorted(stored(store).values(), key=repr) == sorted(
        (record(v) for v in (base, *variants)), key=repr
    )


def test_create_nothing_writes_nothing(store: SqliteMetadataStore) -> None:
    before = store.revision()
    assert create(AclAdmin(store, NS)) == AclsChanged([], 0)
    assert store.revision() == before and stored(store) == {}


def test_handlers_serve_both_messages(store: SqliteMetadataStore) -> None:
    handlers = AclAdmin(store, NS).handlers()
    assert set(handlers) == {CreateAcls, DeleteAcls}
    created = handlers[CreateAcls](Incoming(b"id", b"r1", CreateAcls([ORDERS_READ])))
    assert isinstance(created, AclsChanged) and created.revision == store.revision()
    deleted = handlers[DeleteAcls](Incoming(b"id", b"r2", DeleteAcls([acl_filter()])))
    assert isinstance(deleted, AclsChanged) and deleted.deleted == [[ORDERS_READ]]
    assert stored(store) == {}


# -- DeleteAcls --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "selected"),
    [
        pytest.param(acl_filter(), ALL, id="everything ANY"),
        pytest.param(
            acl_filter(Res.TOPIC),
            [ORDERS_READ, ORDERS_BOB_DENY, EVERY_TOPIC, ORD_PREFIX, PAY_PREFIX],
            id="resource type",
        ),
        pytest.param(
            acl_filter(name="orders"),
            [ORDERS_READ, ORDERS_BOB_DENY, ORDERS_GROUP, ORDERS_TXN],
            id="exact name, any type and pattern",
        ),
        pytest.param(
            acl_filter(Res.TOPIC, "orders", Pat.LITERAL),
            [ORDERS_READ, ORDERS_BOB_DENY],
            id="exact literal topic (not the wildcard, not the prefix)",
        ),
        pytest.param(
            acl_filter(Res.TOPIC, "orders", Pat.MATCH),
            [ORDERS_READ, ORDERS_BOB_DENY, EVERY_TOPIC, ORD_PREFIX],
            id="MATCH: literal, wildcard and prefixes that apply",
        ),
        pytest.param(
            acl_filter(Res.ANY, "orders", Pat.MATCH),
            [ORDERS_READ, ORDERS_BOB_DENY, EVERY_TOPIC, ORD_PREFIX, ORDERS_GROUP, ORDERS_TXN],
            id="MATCH on any resource type",
        ),
        pytest.param(
            acl_filter(Res.TOPIC, "ord", Pat.MATCH), [EVERY_TOPIC, ORD_PREFIX], id="MATCH short"
        ),
        pytest.param(
            acl_filter(Res.TOPIC, "or", Pat.MATCH),
            [EVERY_TOPIC],
            id="MATCH shorter than the prefix",
        ),
        pytest.param(acl_filter(Res.GROUP, "payments", Pat.MATCH), [], id="MATCH nothing applies"),
        pytest.param(acl_filter(pattern=Pat.MATCH), ALL, id="MATCH without a name"),
        pytest.param(acl_filter(name="ord", pattern=Pat.PREFIXED), [ORD_PREFIX], id="prefix"),
        pytest.param(acl_filter(name="ord", pattern=Pat.LITERAL), [], id="prefix name literal"),
        pytest.param(acl_filter(name="ord"), [ORD_PREFIX], id="prefix name, pattern ANY"),
        pytest.param(
            acl_filter(pattern=Pat.PREFIXED), [ORD_PREFIX, PAY_PREFIX], id="every prefixed"
        ),
        pytest.param(
            acl_filter(Res.TOPIC, "*", Pat.LITERAL), [EVERY_TOPIC], id="the wildcard itself"
        ),
        pytest.param(
            acl_filter(principal=ALICE),
            [ORDERS_READ, ORD_PREFIX, ORDERS_GROUP, ORDERS_TXN],
            id="principal",
        ),
        pytest.param(acl_filter(principal="User:*"), [EVERY_TOPIC], id="User:* exactly"),
        pytest.param(acl_filter(principal="User:carol"), [], id="unknown principal"),
        pytest.param(acl_filter(host="10.0.0.1"), [ORD_PREFIX], id="host (not '*')"),
        pytest.param(
            acl_filter(host="*"),
            [a for a in ALL if a is not ORD_PREFIX],
            id="host '*' exactly",
        ),
        pytest.param(
            acl_filter(operation=Op.READ),
            [ORDERS_READ, PAY_PREFIX, ORDERS_GROUP],
            id="operation",
        ),
        pytest.param(
            acl_filter(permission=Perm.DENY), [ORDERS_BOB_DENY, PAY_PREFIX], id="permission"
        ),
        pytest.param(
            acl_filter(Res.TOPIC, "orders", Pat.MATCH, ALICE, operation=Op.WRITE),
            [ORD_PREFIX],
            id="MATCH and entry fields together",
        ),
        pytest.param(
            acl_filter(Res.CLUSTER, "kafka-cluster", Pat.LITERAL, ADMIN, "*", Op.ALTER, Perm.ALLOW),
            [CLUSTER_ALTER],
            id="every field exact",
        ),
    ],
)
def test_delete_removes_exactly_what_the_filter_selects(
    store: SqliteMetadataStore, given: AclFilterValue, selected: list[AclValue]
) -> None:
    admin = AclAdmin(store, NS)
    create(admin, *ALL)
    before = store.revision()
    reply = delete(admin, given)
    [removed] = reply.deleted
    assert sorted(removed, key=repr) == sorted(selected, key=repr)
    assert len(removed) == len(selected)  # each listed once
    kept = [a for a in ALL if a not in selected]
    assert sorted(stored(store).values(), key=repr) == sorted(map(record, kept), key=repr)
    if selected:
        assert reply.revision == store.revision() > before
    else:
        assert reply.revision == 0 and store.revision() == before


def test_each_filter_lists_what_it_removed_even_when_another_also_did(
    store: SqliteMetadataStore,
) -> None:
    admin = AclAdmin(store, NS)
    create(admin, *ALL)
    before = store.revision()
    reply = delete(
        admin,
        acl_filter(principal=ALICE, resource=Res.TOPIC),
        acl_filter(Res.TOPIC, "orders", Pat.LITERAL),
        acl_filter(Res.GROUP, "nothing-here"),
        acl_filter(permission=Perm.DENY),
    )
    by_alice, literal_orders, nothing, denials = reply.deleted
    assert sorted(by_alice, key=repr) == sorted([ORDERS_READ, ORD_PREFIX], key=repr)
    assert sorted(literal_orders, key=repr) == sorted([ORDERS_READ, ORDERS_BOB_DENY], key=repr)
    assert nothing == []
    assert sorted(denials, key=repr) == sorted([ORDERS_BOB_DENY, PAY_PREFIX], key=repr)
    # Four bindings removed, in one transaction.
    assert reply.revision == store.revision()
    assert sorted(stored(store).values(), key=repr) == sorted(
        map(record, [EVERY_TOPIC, ORDERS_GROUP, CLUSTER_ALTER, ORDERS_TXN]), key=repr
    )
    assert store.revision() == before + 1


def test_delete_of_nothing_matched_writes_nothing(store: SqliteMetadataStore) -> None:
    admin = AclAdmin(store, NS)
    assert delete(admin, acl_filter()) == AclsChanged([[]], 0)  # no ACL at all
    create(admin, ORDERS_READ)
    before = store.revision()
    reply = delete(admin, acl_filter(principal=BOB), acl_filter(Res.GROUP))
    assert reply == AclsChanged([[], []], 0)
    assert store.revision() == before and len(stored(store)) == 1
    assert delete(admin) == AclsChanged([], 0)  # no filter at all


def test_delete_is_confined_to_its_namespace(store: SqliteMetadataStore) -> None:
    create(AclAdmin(store, "other"), ORDERS_READ)
    create(AclAdmin(store, NS), ORDERS_READ, ORDERS_GROUP)
    reply = delete(AclAdmin(store, NS), acl_filter())
    assert sorted(reply.deleted[0], key=repr) == sorted([ORDERS_READ, ORDERS_GROUP], key=repr)
    assert stored(store) == {}
    assert list(stored(store, "other").values()) == [record(ORDERS_READ)]


def test_an_undecodable_record_does_not_stop_the_deletion(store: SqliteMetadataStore) -> None:
    admin = AclAdmin(store, NS)
    create(admin, ORDERS_READ)
    store.put(KEYS.acls + "garbage", b"{not json")
    reply = delete(admin, acl_filter())
    assert reply.deleted == [[ORDERS_READ]]
    assert KEYS.acl(record(ORDERS_READ)) not in stored_keys(store)


def stored_keys(store: SqliteMetadataStore) -> set[str]:
    return {kv.key for kv in store.get_prefix(KEYS.acls)}


# -- races -------------------------------------------------------------------------------------


class RacingStore:
    """The real store, except that before each of the first ``races`` transactions another
    writer acts: ``racer(store, compares)`` (by default it writes every compared key again, the
    same binding at a new revision: a concurrent CreateAcls of it)."""

    def __init__(self, store: SqliteMetadataStore, races: int, racer: object = None) -> None:
        self.store = store
        self.races = races
        self.racer = racer
        self.transactions = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.store, name)

    def transaction(self, compares: Sequence[Compare], ops: Sequence[Operation]) -> TxnResult:
        self.transactions += 1
        if self.races > 0:
            self.races -= 1
            if callable(self.racer):
                self.racer(self.store, compares)
            else:
                for compare in compares:
                    kv = self.store.get(compare.key)
                    assert kv is not None
                    self.store.put(compare.key, kv.value)
        return self.store.transaction(compares, ops)


def test_delete_reads_again_after_losing_a_race(store: SqliteMetadataStore) -> None:
    create(AclAdmin(store, NS), ORDERS_READ, ORDERS_GROUP, CLUSTER_ALTER)
    racing = RacingStore(store, races=1)
    reply = delete(AclAdmin(racing, NS), acl_filter(principal=ALICE))  # type: ignore[arg-type]
    assert racing.transactions == 2
    assert sorted(reply.deleted[0], key=repr) == sorted([ORDERS_READ, ORDERS_GROUP], key=repr)
    assert reply.revision == store.revision()
    assert list(stored(store).values()) == [record(CLUSTER_ALTER)]


def test_a_binding_deleted_meanwhile_is_not_listed(store: SqliteMetadataStore) -> None:
    create(AclAdmin(store, NS), ORDERS_READ, ORDERS_GROUP)

    def delete_orders_read(raw: SqliteMetadataStore, compares: Sequence[Compare]) -> None:
        assert {c.key for c in compares} == {
            KEYS.acl(record(ORDERS_READ)),
            KEYS.acl(record(ORDERS_GROUP)),
        }
        assert raw.delete(KEYS.acl(record(ORDERS_READ)))

    racing = RacingStore(store, races=1, racer=delete_orders_read)
    reply = delete(AclAdmin(racing, NS), acl_filter())  # type: ignore[arg-type]
    assert racing.transactions == 2
    assert reply.deleted == [[ORDERS_GROUP]]
    assert stored(store) == {}


def test_a_binding_created_meanwhile_is_never_deleted_unseen(store: SqliteMetadataStore) -> None:
    create(AclAdmin(store, NS), ORDERS_READ)

    def create_another(raw: SqliteMetadataStore, compares: Sequence[Compare]) -> None:
        create(AclAdmin(raw, NS), ORDERS_GROUP)  # matched by the filter, but not read

    racing = RacingStore(store, races=1, racer=create_another)
    reply = delete(AclAdmin(racing, NS), acl_filter(principal=ALICE))  # type: ignore[arg-type]
    assert reply.deleted == [[ORDERS_READ]]
    assert racing.transactions == 1
    assert list(stored(store).values()) == [record(ORDERS_GROUP)]


def test_delete_gives_up_when_it_always_loses(store: SqliteMetadataStore) -> None:
    create(AclAdmin(store, NS), ORDERS_READ, ORDERS_GROUP)
    racing = RacingStore(store, races=ATTEMPTS)
    with pytest.raises(AclsChangedConcurrently):
        delete(AclAdmin(racing, NS), acl_filter())  # type: ignore[arg-type]
    assert racing.transactions == ATTEMPTS
    assert sorted(stored(store).values(), key=repr) == sorted(
        [record(ORDERS_READ), record(ORDERS_GROUP)], key=repr
    )


# -- the metadata view -------------------------------------------------------------------------


def test_view_follows_acls(tmp_path: Path) -> None:
    path = str(tmp_path / "metadata.sqlite")
    writer, reader = SqliteMetadataStore(path), SqliteMetadataStore(path)
    admin = AclAdmin(writer, NS)
    create(admin, CLUSTER_ALTER)
    view = MetadataView(reader, NS)
    try:
        view.start()
        assert view.snapshot.acls == {record(CLUSTER_ALTER).digest: record(CLUSTER_ALTER)}

        reply = create(admin, ORDERS_READ, ORD_PREFIX, ORDERS_READ)
        assert view.wait_for_revision(reply.revision, 10)
        assert view.snapshot.acls == {
            record(v).digest: record(v) for v in (CLUSTER_ALTER, ORDERS_READ, ORD_PREFIX)
        }

        reply = delete(admin, acl_filter(principal=ALICE))
        assert view.wait_for_revision(reply.revision, 10)
        assert view.snapshot.acls == {record(CLUSTER_ALTER).digest: record(CLUSTER_ALTER)}

        # A view loaded afresh agrees with the one that followed the changes.
        fresh = MetadataView(writer, NS)
        fresh.start()
        try:
            assert fresh.snapshot.acls == view.snapshot.acls
        finally:
            fresh.stop()

        reply = delete(admin, acl_filter())
        assert view.wait_for_revision(reply.revision, 10)
        assert view.snapshot.acls == {}
    finally:
        view.stop()
        writer.close()
        reader.close()


def test_view_skips_an_undecodable_acl(store: SqliteMetadataStore) -> None:
    store.put(KEYS.acls + "bad", b"{not json")
    store.put(KEYS.acls + "half", records.encode({"resource_type": 2}))
    create(AclAdmin(store, NS), ORDERS_READ)
    view = MetadataView(store, NS)
    view.start()
    try:
        assert view.snapshot.acls == {record(ORDERS_READ).digest: record(ORDERS_READ)}
    finally:
        view.stop()
