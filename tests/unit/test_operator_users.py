"""A KafscaleUser's spec, plan and status (kafscale/operator/users.py): what the operator does about
a user's SCRAM credentials and ACLs as the brokers describe them. Pure; the last tests check the
names against the CRD's enums and confluent-kafka's, which admin.py passes them to."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from kafscale.operator import users
from kafscale.operator.model import SpecError

CRD = Path(__file__).parents[2] / "charts/kafscale/crds/kafscaleusers.yaml"
DIGEST = users.credential_digest


def user(**spec: Any) -> users.UserSpec:
    return users.parse_user({"metadata": {"name": "app"}, "spec": {"cluster": "c", **spec}})


def acls(*rules: dict[str, Any]) -> frozenset[users.Acl]:
    return user(authorization={"acls": list(rules)}).acls


def rule(kind: str, name: str | None = None, *operations: str, **more: Any) -> dict[str, Any]:
    resource: dict[str, Any] = {"type": kind}
    if name is not None:
        resource["name"] = name
    if "patternType" in more:
        resource["patternType"] = more.pop("patternType")
    return {"resource": resource, "operations": list(operations or ("Read",)), **more}


# --- the spec ------------------------------------------------------------------------------


def test_defaults() -> None:
    spec = user()
    assert spec == users.UserSpec("c", "app", "SCRAM-SHA-512", 4096, None, frozenset())
    assert spec.principal == "User:app"


def test_every_field_given() -> None:
    spec = user(
        userName="svc@example.com",
        authentication={
            "type": "scram-sha-256",
            "iterations": 8192,
            "passwordSecret": {"name": "pw", "key": "secret"},
        },
    )
    assert (spec.name, spec.mechanism, spec.iterations) == (
        "svc@example.com",
        "SCRAM-SHA-256",
        8192,
    )
    assert spec.password_secret == users.SecretRef("pw", "secret")
    assert spec.principal == "User:svc@example.com"


def test_the_password_key_defaults_to_password() -> None:
    spec = user(authentication={"passwordSecret": {"name": "pw"}})
    assert spec.password_secret == users.SecretRef("pw", "password")


def test_acls_in_kafkas_names_one_per_operation() -> None:
    assert acls(rule("topic", "orders", "Read", "Describe")) == {
        ("TOPIC", "orders", "LITERAL", "READ", "*", "ALLOW"),
        ("TOPIC", "orders", "LITERAL", "DESCRIBE", "*", "ALLOW"),
    }


def test_prefixed_deny_and_a_host() -> None:
    assert acls(
        rule("group", "app-", "Read", patternType="prefix", type="deny", host="10.0.0.1")
    ) == {("GROUP", "app-", "PREFIXED", "READ", "10.0.0.1", "DENY")}


def test_the_cluster_resource_is_kafka_cluster_whatever_name_is_given() -> None:
    assert acls(rule("cluster", None, "IdempotentWrite"), rule("cluster", "mine", "Alter")) == {
        ("BROKER", "kafka-cluster", "LITERAL", "IDEMPOTENT_WRITE", "*", "ALLOW"),
        ("BROKER", "kafka-cluster", "LITERAL", "ALTER", "*", "ALLOW"),
    }


def test_transactional_ids() -> None:
    assert acls(rule("transactionalId", "tx-1", "Write", "Describe")) == {
        ("TRANSACTIONAL_ID", "tx-1", "LITERAL", "WRITE", "*", "ALLOW"),
        ("TRANSACTIONAL_ID", "tx-1", "LITERAL", "DESCRIBE", "*", "ALLOW"),
    }


@pytest.mark.parametrize(("given", "kafka"), sorted(users.OPERATIONS.items()))
def test_every_operation_maps(given: str, kafka: str) -> None:
    assert acls(rule("topic", "t", given)) == {("TOPIC", "t", "LITERAL", kafka, "*", "ALLOW")}


def test_the_same_acl_twice_is_one() -> None:
    assert len(acls(rule("topic", "t", "Read", "Read"), rule("topic", "t", "Read"))) == 1


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"cluster": ""}, "spec.cluster"),
        ({"userName": "a b"}, "spec.userName"),
        ({"userName": "app\n"}, "spec.userName"),
        ({"userName": "x" * 129}, "spec.userName"),
        ({"authentication": {"type": "plain"}}, "spec.authentication.type"),
        ({"authentication": {"type": ["scram-sha-512"]}}, "spec.authentication.type"),
        ({"authentication": {"iterations": 100}}, "spec.authentication.iterations"),
        ({"authentication": {"iterations": 20000}}, "spec.authentication.iterations"),
        ({"authentication": {"iterations": True}}, "spec.authentication.iterations"),
        ({"authentication": {"passwordSecret": {}}}, "spec.authentication.passwordSecret.name"),
        ({"authorization": {"acls": {"a": 1}}}, "spec.authorization.acls"),
        ({"authorization": {"acls": ["read"]}}, r"spec.authorization.acls\[0\]"),
        (
            {"authorization": {"acls": [rule("user", "x")]}},
            r"spec.authorization.acls\[0\].resource.type",
        ),
        (
            {"authorization": {"acls": [{"resource": {"type": "topic"}, "operations": ["Read"]}]}},
            r"spec.authorization.acls\[0\].resource.name",
        ),
        (
            {"authorization": {"acls": [rule("topic", "t", patternType="match")]}},
            r"spec.authorization.acls\[0\].resource.patternType",
        ),
        (
            {"authorization": {"acls": [rule("cluster", None, patternType="prefix")]}},
            r"spec.authorization.acls\[0\].resource.patternType",
        ),
        (
            {"authorization": {"acls": [rule("topic", "t"), rule("topic", "t", "Fly")]}},
            r"spec.authorization.acls\[1\].operations",
        ),
        (
            {"authorization": {"acls": [{"resource": {"type": "topic", "name": "t"}}]}},
            r"spec.authorization.acls\[0\].operations",
        ),
        (
            {"authorization": {"acls": [{**rule("topic", "t"), "operations": "Read"}]}},
            r"spec.authorization.acls\[0\].operations",
        ),
        (
            {"authorization": {"acls": [rule("topic", "t", type="maybe")]}},
            r"spec.authorization.acls\[0\].type",
        ),
        (
            {"authorization": {"acls": [rule("topic", "t", host=["*"])]}},
            r"spec.authorization.acls\[0\].host",
        ),
    ],
)
def test_a_bad_spec_names_its_field(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError, match=f"^{field}:"):
        user(**spec)


# --- the credential digest -----------------------------------------------------------------


def test_the_digest_is_a_sha256_hex_without_the_password() -> None:
    digest = DIGEST("app", "SCRAM-SHA-512", 4096, "hunter2-secret")
    assert len(digest) == 64 and int(digest, 16) >= 0
    assert "hunter2" not in digest
    assert digest == DIGEST("app", "SCRAM-SHA-512", 4096, "hunter2-secret")  # no salt


def test_the_digest_changes_with_each_input() -> None:
    digests = {
        DIGEST("app", "SCRAM-SHA-512", 4096, "pw"),
        DIGEST("app2", "SCRAM-SHA-512", 4096, "pw"),
        DIGEST("app", "SCRAM-SHA-256", 4096, "pw"),
        DIGEST("app", "SCRAM-SHA-512", 8192, "pw"),
        DIGEST("app", "SCRAM-SHA-512", 4096, "pw2"),
        # The fields are separated: moving text from one to the next is another credential.
        DIGEST("ap", "pSCRAM-SHA-512", 4096, "pw"),
    }
    assert len(digests) == 6


# --- the plan ------------------------------------------------------------------------------

READ_ORDERS = rule("topic", "orders", "Read", "Describe")


def test_a_new_user_gets_its_credential_and_every_acl() -> None:
    spec = user(authorization={"acls": [READ_ORDERS]})
    todo = users.plan(spec, "pw", "", set(), set())
    assert todo == users.Plan(
        upsert=True,
        delete_mechanisms=(),
        create_acls=tuple(sorted(spec.acls)),
        delete_acls=(),
        digest=DIGEST("app", "SCRAM-SHA-512", 4096, "pw"),
    )


def test_nothing_to_do_when_digest_mechanism_and_acls_match() -> None:
    spec = user(authorization={"acls": [READ_ORDERS]})
    digest = DIGEST("app", "SCRAM-SHA-512", 4096, "pw")
    todo = users.plan(spec, "pw", digest, {"SCRAM-SHA-512"}, set(spec.acls))
    assert todo == users.Plan(False, (), (), (), digest)


def test_a_changed_password_is_stored() -> None:
    old = DIGEST("app", "SCRAM-SHA-512", 4096, "old")
    todo = users.plan(user(), "new", old, {"SCRAM-SHA-512"}, set())
    assert todo.upsert and todo.digest == DIGEST("app", "SCRAM-SHA-512", 4096, "new")


def test_changed_iterations_are_stored() -> None:
    old = DIGEST("app", "SCRAM-SHA-512", 4096, "pw")
    spec = user(authentication={"iterations": 8192})
    assert users.plan(spec, "pw", old, {"SCRAM-SHA-512"}, set()).upsert


def test_a_credential_deleted_behind_the_operators_back_is_stored_again() -> None:
    digest = DIGEST("app", "SCRAM-SHA-512", 4096, "pw")
    assert users.plan(user(), "pw", digest, set(), set()).upsert
    assert users.plan(user(), "pw", digest, {"SCRAM-SHA-256"}, set()).upsert


def test_a_mechanism_switch_stores_the_new_and_deletes_the_other() -> None:
    spec = user(authentication={"type": "scram-sha-256"})
    digest512 = DIGEST("app", "SCRAM-SHA-512", 4096, "pw")
    todo = users.plan(spec, "pw", digest512, {"SCRAM-SHA-512"}, set())
    assert todo.upsert and todo.delete_mechanisms == ("SCRAM-SHA-512",)
    assert todo.digest == DIGEST("app", "SCRAM-SHA-256", 4096, "pw")


def test_both_mechanisms_present_the_unwanted_one_goes() -> None:
    digest = DIGEST("app", "SCRAM-SHA-512", 4096, "pw")
    todo = users.plan(user(), "pw", digest, {"SCRAM-SHA-256", "SCRAM-SHA-512"}, set())
    assert not todo.upsert and todo.delete_mechanisms == ("SCRAM-SHA-256",)


def test_missing_acls_are_created_and_extra_ones_deleted() -> None:
    spec = user(authorization={"acls": [READ_ORDERS]})
    extra = ("TOPIC", "payments", "LITERAL", "WRITE", "*", "ALLOW")
    kept = ("TOPIC", "orders", "LITERAL", "READ", "*", "ALLOW")
    digest = DIGEST("app", "SCRAM-SHA-512", 4096, "pw")
    todo = users.plan(spec, "pw", digest, {"SCRAM-SHA-512"}, {extra, kept})
    assert not todo.upsert
    assert todo.create_acls == (("TOPIC", "orders", "LITERAL", "DESCRIBE", "*", "ALLOW"),)
    assert todo.delete_acls == (extra,)


def test_an_acl_differing_only_in_host_or_permission_is_another_acl() -> None:
    spec = user(authorization={"acls": [rule("topic", "t", "Read")]})
    other_host = ("TOPIC", "t", "LITERAL", "READ", "10.0.0.1", "ALLOW")
    denied = ("TOPIC", "t", "LITERAL", "READ", "*", "DENY")
    todo = users.plan(spec, "pw", "", set(), {other_host, denied})
    assert todo.create_acls == (("TOPIC", "t", "LITERAL", "READ", "*", "ALLOW"),)
    assert todo.delete_acls == tuple(sorted({other_host, denied}))


def test_the_plan_never_holds_the_password() -> None:
    todo = users.plan(user(), "hunter2-secret", "", set(), set())
    assert "hunter2" not in repr(todo)


# --- what the cluster supports -------------------------------------------------------------


def test_sasl_from_the_listener_map() -> None:
    found = users.features(
        {
            "listener.security.protocol.map": "INTERNAL:PLAINTEXT,EXTERNAL:SASL_SSL",
            "kafscale.authorizer": "acl",
        },
        connected_with_sasl=False,
    )
    assert found == users.Features(True, True, "INTERNAL:PLAINTEXT,EXTERNAL:SASL_SSL")


def test_no_sasl_listener() -> None:
    found = users.features(
        {
            "listener.security.protocol.map": "PLAIN:PLAINTEXT,TLS:SSL",
            "kafscale.authorizer": "none",
        },
        connected_with_sasl=False,
    )
    assert (found.sasl, found.authorizer) == (False, False)


def test_an_operator_logged_in_with_sasl_knows_sasl_is_on() -> None:
    assert users.features(None, connected_with_sasl=True) == users.Features(True, None, "")
    assert users.features(None, connected_with_sasl=False) == users.Features(False, None, "")


@pytest.mark.parametrize(
    ("configs", "authorizer"),
    [
        ({"kafscale.authorizer": "acl"}, True),
        ({"kafscale.authorizer": "none"}, False),
        (
            {"authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer"},
            True,
        ),
        ({"authorizer.class.name": ""}, False),
        ({}, None),
    ],
)
def test_the_authorizer(configs: dict[str, str], authorizer: bool | None) -> None:
    assert users.features(configs, connected_with_sasl=True).authorizer is authorizer


# --- the status ----------------------------------------------------------------------------


def test_reconciled_with_acls() -> None:
    spec = user(authorization={"acls": [READ_ORDERS]})
    todo = users.plan(spec, "pw", "", set(), set())
    result = users.status(spec, todo, authorizer=True)
    assert (result.ready, result.reason, result.acls) == (True, "Reconciled", 2)
    assert result.message == "credentials stored (SCRAM-SHA-512), 2 ACLs"
    assert result.to_dict() == {
        "userName": "app",
        "mechanism": "SCRAM-SHA-512",
        "credentialDigest": todo.digest,
        "acls": 2,
    }


def test_up_to_date() -> None:
    digest = DIGEST("app", "SCRAM-SHA-512", 4096, "pw")
    todo = users.plan(user(), "pw", digest, {"SCRAM-SHA-512"}, set())
    result = users.status(user(), todo, authorizer=True)
    assert result.message == "credentials up to date (SCRAM-SHA-512), 0 ACLs"


def test_without_an_authorizer_acls_make_it_not_ready() -> None:
    spec = user(authorization={"acls": [READ_ORDERS]})
    todo = users.plan(spec, "pw", "", set(), set())
    result = users.status(spec, todo, authorizer=False)
    assert (result.ready, result.reason, result.acls) == (False, "AuthorizationNotEnabled", 0)
    assert result.credential_digest == todo.digest  # the credentials were stored
    assert "2 ACLs are not applied" in result.message


def test_without_an_authorizer_and_without_acls_it_is_ready() -> None:
    todo = users.plan(user(), "pw", "", set(), set())
    result = users.status(user(), todo, authorizer=False)
    assert (result.ready, result.reason, result.acls) == (True, "Reconciled", 0)


def test_without_sasl_nothing_is_stored() -> None:
    found = users.features({"listener.security.protocol.map": "PLAIN:PLAINTEXT"}, False)
    result = users.authentication_not_enabled(user(), found)
    assert (result.ready, result.reason) == (False, "AuthenticationNotEnabled")
    assert result.credential_digest == "" and result.acls == 0
    assert "no SASL listener (listener.security.protocol.map: PLAIN:PLAINTEXT)" in result.message


# --- the names: the CRD's and confluent-kafka's --------------------------------------------


def crd_spec() -> dict[str, Any]:
    crd = yaml.safe_load(CRD.read_text())
    return dict(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"])


def test_the_crds_enums_are_the_ones_mapped() -> None:
    spec = crd_spec()["spec"]["properties"]
    acl = spec["authorization"]["properties"]["acls"]["items"]["properties"]
    assert set(acl["operations"]["items"]["enum"]) == set(users.OPERATIONS)
    assert set(acl["resource"]["properties"]["type"]["enum"]) == set(users.RESOURCE_TYPES)
    assert set(acl["resource"]["properties"]["patternType"]["enum"]) == set(users.PATTERN_TYPES)
    assert set(acl["type"]["enum"]) == set(users.PERMISSIONS)
    assert set(spec["authentication"]["properties"]["type"]["enum"]) == set(users.MECHANISMS)


def test_the_status_keys_are_the_crds() -> None:
    todo = users.plan(user(), "pw", "", set(), set())
    assert set(users.status(user(), todo, True).to_dict()) <= set(
        crd_spec()["status"]["properties"]
    )


def test_acls_go_through_confluent_kafkas_names_and_back() -> None:
    from confluent_kafka.admin import AclBinding, AclBindingFilter

    from kafscale.operator import admin

    every = acls(
        *(rule("topic", "t", operation) for operation in users.OPERATIONS),
        rule("group", "g-", "Read", patternType="prefix", type="deny", host="10.1.2.3"),
        rule("cluster", None, "ClusterAction"),
        rule("transactionalId", "tx", "Write"),
    )
    for acl in every:
        assert admin._as_acl(admin._binding(AclBinding, "User:app", acl)) == acl
        assert admin._binding(AclBindingFilter, "User:app", acl).principal == "User:app"
    assert set(admin.MECHANISMS) == set(users.MECHANISMS.values())


def test_a_connection_never_shows_its_password() -> None:
    from kafscale.kafka_admin import Connection

    conn = Connection("b:9094", "SASL_SSL", "SCRAM-SHA-512", "admin", "hunter2", b"PEM")
    assert "hunter2" not in repr(conn) and "hunter2" not in str(conn)
    assert "admin" in repr(conn) and conn.timeout == 30.0
