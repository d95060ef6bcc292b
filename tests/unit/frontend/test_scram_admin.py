"""SCRAM credential administration (KIP-554) end to end from request bytes to response bytes:
AlterUserScramCredentials (key 51, v0), DescribeUserScramCredentials (key 50, v0) and
DescribeClientQuotas (key 48, v0-v1), as ``kafka-configs --entity-type users`` uses them.

The coordinator's decision is the real pure ``kafscale.coordinator.credentials.plan`` applied to
the static view's ``credentials``, as ``FakeCoordinator`` does for topic creation.

Covered:

- upsertion as ``kafka-configs`` sends it (salt and salted password, mechanism codes 1 =
  SCRAM-SHA-256 and 2 = SCRAM-SHA-512), after which the password is accepted against the stored
  record (``password_matches``, and a whole SCRAM exchange with ``scramp``'s client);
- refusals: unknown mechanism code (UNSUPPORTED_SASL_MECHANISM); iterations outside
  4096-16384, an empty user, an empty salt (UNACCEPTABLE_CREDENTIAL); one user and mechanism twice
  (DUPLICATE_RESOURCE, nothing of that user written); deleting a missing credential
  (RESOURCE_NOT_FOUND); the coordinator unreachable (REQUEST_TIMED_OUT); a user's refusal keeps
  its other changes from being written while other users are written;
- DescribeUserScramCredentials: every user for null and for empty ``users``; a missing user
  (RESOURCE_NOT_FOUND); a user named twice (DUPLICATE_RESOURCE); the infos carry only mechanism
  codes and iterations;
- DescribeClientQuotas: no entries, no error, both versions.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any

import pytest
from kio.index import load_request_schema
from scramp import ScramClient

from kafscale.coordinator.credentials import plan
from kafscale.frontend.authn import credential_lookup
from kafscale.frontend.context import Broker
from kafscale.ipc import messages
from kafscale.ipc.rpc import RpcError
from kafscale.metadata.records import ScramRecord
from kafscale.protocol import codec
from kafscale.protocol.errors import ErrorCode
from kafscale.protocol.sasl import ExchangeFailed
from kafscale.security.mechanisms import (
    ScramCredential,
    ScramExchange,
    from_password,
    password_matches,
    salted_password,
)
from tests.unit.frontend.test_requests import (
    FakeCoordinator,
    StaticView,
    decode_response,
    make_broker,
    process,
)
from tests.unit.protocol.test_codec import request_frame

SHA256, SHA512 = 1, 2  # Kafka's ScramMechanism codes
NAMES = {SHA256: "SCRAM-SHA-256", SHA512: "SCRAM-SHA-512"}
ALTER, DESCRIBE, QUOTAS = 51, 50, 48


class ScramCoordinator(FakeCoordinator):
    """Answers AlterScramCredentials with ``plan`` applied to the view's credentials (revision:
    the view's + 1 when anything was written, else 0). ``calls`` records the requests,
    ``caught_up_to`` the revisions the handler waited for."""

    def __init__(self, view: StaticView) -> None:
        super().__init__(view)
        self.calls: list[messages.AlterScramCredentials] = []
        self.caught_up_to: list[int] = []
        self.unreachable = False

    async def call(self, request: messages.Message, timeout: float = 30.0) -> messages.Message:
        if self.unreachable:
            raise RpcError("no answer")
        assert isinstance(request, messages.AlterScramCredentials), request
        self.calls.append(request)
        credentials = self.view.snapshot.credentials
        results, writes = plan(credentials, request.changes)
        for key, record in writes.items():
            if record is None:
                del credentials[key]
            else:
                credentials[key] = record
        return messages.ScramCredentialsAltered(
            results, self.view.snapshot.revision + 1 if writes else 0
        )

    async def caught_up(self, revision: int) -> None:
        self.caught_up_to.append(revision)


def scram_broker() -> tuple[Broker, ScramCoordinator]:
    base = make_broker()
    assert isinstance(base.view, StaticView)
    coordinator = ScramCoordinator(base.view)
    return Broker(base.config, base.view, base.apis, coordinator, base.shards), coordinator


def credentials(broker: Broker) -> dict[tuple[str, str], ScramRecord]:
    return broker.view.snapshot.credentials


def call(broker: Broker, request: Any, api_key: int) -> Any:
    frame = process(broker, request_frame(request))
    assert isinstance(frame, bytes)
    return decode_response(frame, api_key, int(request.__version__))[1]


Upsertion = tuple[str, int, int, bytes, bytes]  # user, mechanism, iterations, salt, salted


def upsertion(user: str, mechanism: int, password: str, iterations: int = 4096) -> Upsertion:
    """What ``kafka-configs --add-config 'SCRAM-SHA-...=[password=...]'`` sends."""
    salt = f"salt-of-{user}-{mechanism}".encode()
    name = NAMES.get(mechanism, "SCRAM-SHA-256")
    salted = salted_password(name, password, salt, max(iterations, 1))  # 0: refused anyway
    return user, mechanism, iterations, salt, salted


def alter_request(
    deletions: Sequence[tuple[str, int]] = (), upsertions: Sequence[Upsertion] = ()
) -> Any:
    schema = load_request_schema(ALTER, 0)
    deletion = codec.nested(schema, "ScramCredentialDeletion")
    upsert = codec.nested(schema, "ScramCredentialUpsertion")
    return codec.build(
        schema,
        deletions=tuple(codec.build(deletion, name=n, mechanism=m) for n, m in deletions),
        upsertions=tuple(
            codec.build(upsert, name=n, mechanism=m, iterations=i, salt=s, salted_password=p)
            for n, m, i, s, p in upsertions
        ),
    )


def alter(
    broker: Broker,
    deletions: Sequence[tuple[str, int]] = (),
    upsertions: Sequence[Upsertion] = (),
) -> list[tuple[str, ErrorCode, str | None]]:
    response = call(broker, alter_request(deletions, upsertions), ALTER)
    assert response.throttle_time == datetime.timedelta(0)
    return [(r.user, r.error_code, r.error_message) for r in response.results]


def codes(results: list[tuple[str, ErrorCode, str | None]]) -> list[tuple[str, ErrorCode]]:
    return [(user, code) for user, code, _ in results]


def as_credential(record: ScramRecord) -> ScramCredential:
    return ScramCredential(record.salt, record.stored_key, record.server_key, record.iterations)


def scram_login(broker: Broker, mechanism: str, user: str, password: str) -> str | None:
    """A whole SCRAM exchange against the broker's credentials; the client checks the server's
    signature (ServerKey) too. The principal, or None when the server refuses the proof."""
    client = ScramClient([mechanism], user, password)
    exchange = ScramExchange(mechanism, credential_lookup(broker), b"secret")
    first = exchange.step(client.get_client_first().encode())
    client.set_server_first(first.reply.decode())
    try:
        final = exchange.step(client.get_client_final().encode())
    except ExchangeFailed:
        return None
    client.set_server_final(final.reply.decode())
    return final.principal


# -- AlterUserScramCredentials -----------------------------------------------------------------


def test_upsertion_as_kafka_configs_sends_it_then_the_password_works() -> None:
    broker, coordinator = scram_broker()
    sent = [
        upsertion("alice", SHA512, "alice-secret", 8192),
        upsertion("alice", SHA256, "alice-secret"),
        upsertion("bob", SHA256, "bob-secret", 16384),
    ]
    results = alter(broker, upsertions=sent)
    assert results == [("alice", ErrorCode.none, None), ("bob", ErrorCode.none, None)]
    assert set(credentials(broker)) == {
        ("alice", "SCRAM-SHA-512"),
        ("alice", "SCRAM-SHA-256"),
        ("bob", "SCRAM-SHA-256"),
    }
    for (user, mechanism), record in credentials(broker).items():
        password = f"{user}-secret"
        assert password_matches(mechanism, as_credential(record), password)
        assert not password_matches(mechanism, as_credential(record), password + "!")
        assert scram_login(broker, mechanism, user, password) == f"User:{user}"
        assert scram_login(broker, mechanism, user, "wrong") is None
    alice = credentials(broker)[("alice", "SCRAM-SHA-512")]
    assert alice.iterations == 8192 and alice.salt == b"salt-of-alice-2"
    assert credentials(broker)[("bob", "SCRAM-SHA-256")].iterations == 16384
    # Only StoredKey and ServerKey are sent to the coordinator, never the salted password.
    [request] = coordinator.calls
    assert [(c.user, c.mechanism) for c in request.changes] == [
        ("alice", "SCRAM-SHA-512"),
        ("alice", "SCRAM-SHA-256"),
        ("bob", "SCRAM-SHA-256"),
    ]
    salted = {u[4] for u in sent}
    for change in request.changes:
        assert change.credential is not None
        assert not {change.credential.stored_key, change.credential.server_key} & salted
    assert coordinator.caught_up_to == [broker.view.snapshot.revision + 1]


def test_upsertion_replaces_a_password_and_the_old_one_stops_working() -> None:
    broker, _ = scram_broker()
    alter(broker, upsertions=[upsertion("alice", SHA512, "first")])
    assert scram_login(broker, "SCRAM-SHA-512", "alice", "first") == "User:alice"
    user, mechanism, iterations, _, _ = upsertion("alice", SHA512, "second")
    salt = b"another salt"
    salted = salted_password("SCRAM-SHA-512", "second", salt, iterations)
    assert alter(broker, upsertions=[(user, mechanism, iterations, salt, salted)]) == [
        ("alice", ErrorCode.none, None)
    ]
    record = credentials(broker)[("alice", "SCRAM-SHA-512")]
    assert record.salt == salt
    assert password_matches("SCRAM-SHA-512", as_credential(record), "second")
    assert scram_login(broker, "SCRAM-SHA-512", "alice", "first") is None


def test_deletion_removes_the_credential() -> None:
    broker, _ = scram_broker()
    alter(broker, upsertions=[upsertion("alice", SHA512, "pw"), upsertion("alice", SHA256, "pw")])
    assert alter(broker, deletions=[("alice", SHA256)]) == [("alice", ErrorCode.none, None)]
    assert set(credentials(broker)) == {("alice", "SCRAM-SHA-512")}
    assert scram_login(broker, "SCRAM-SHA-256", "alice", "pw") is None


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        pytest.param(
            upsertion("alice", 3, "pw"),
            ErrorCode.unsupported_sasl_mechanism,
            "Unknown SCRAM mechanism",
            id="mechanism 3",
        ),
        pytest.param(
            upsertion("alice", 0, "pw"),
            ErrorCode.unsupported_sasl_mechanism,
            "Unknown SCRAM mechanism",
            id="mechanism 0 (Kafka's UNKNOWN)",
        ),
        pytest.param(
            upsertion("alice", -1, "pw"),
            ErrorCode.unsupported_sasl_mechanism,
            "Unknown SCRAM mechanism",
            id="mechanism -1",
        ),
        pytest.param(
            upsertion("alice", SHA512, "pw", 4095),
            ErrorCode.unacceptable_credential,
            "Too few iterations",
            id="4095 iterations",
        ),
        pytest.param(
            upsertion("alice", SHA256, "pw", 16385),
            ErrorCode.unacceptable_credential,
            "Too many iterations",
            id="16385 iterations",
        ),
        pytest.param(
            upsertion("alice", SHA512, "pw", 0),
            ErrorCode.unacceptable_credential,
            "Too few iterations",
            id="0 iterations",
        ),
        pytest.param(
            upsertion("", SHA512, "pw"),
            ErrorCode.unacceptable_credential,
            "Username must not be empty",
            id="empty user",
        ),
        pytest.param(
            ("alice", SHA512, 4096, b"", b"salted"),
            ErrorCode.unacceptable_credential,
            "must not be empty",
            id="empty salt",
        ),
        pytest.param(
            ("alice", SHA512, 4096, b"salt", b""),
            ErrorCode.unacceptable_credential,
            "must not be empty",
            id="empty salted password",
        ),
    ],
)
def test_upsertion_refusals(change: Upsertion, error: ErrorCode, message: str) -> None:
    broker, coordinator = scram_broker()
    [(user, code, text)] = alter(broker, upsertions=[change])
    assert (user, code) == (change[0], error)
    assert text is not None and message in text
    assert credentials(broker) == {}
    assert coordinator.calls == []


@pytest.mark.parametrize(
    ("deletion", "error"),
    [
        (("alice", 7), ErrorCode.unsupported_sasl_mechanism),
        (("", SHA512), ErrorCode.unacceptable_credential),
    ],
)
def test_deletion_refusals(deletion: tuple[str, int], error: ErrorCode) -> None:
    broker, coordinator = scram_broker()
    assert codes(alter(broker, deletions=[deletion])) == [(deletion[0], error)]
    assert coordinator.calls == []


@pytest.mark.parametrize(
    ("deletions", "upsertions"),
    [
        pytest.param(
            [],
            [upsertion("alice", SHA512, "one"), upsertion("alice", SHA512, "two")],
            id="two upsertions",
        ),
        pytest.param([("alice", SHA512), ("alice", SHA512)], [], id="two deletions"),
        pytest.param([("alice", SHA512)], [upsertion("alice", SHA512, "one")], id="both"),
    ],
)
def test_the_same_user_and_mechanism_twice_is_a_duplicate(
    deletions: list[tuple[str, int]], upsertions: list[Upsertion]
) -> None:
    broker, _ = scram_broker()
    alter(broker, upsertions=[upsertion("alice", SHA512, "old")])
    before = dict(credentials(broker))
    results = alter(
        broker,
        deletions=deletions,
        upsertions=[*upsertions, upsertion("alice", SHA256, "x"), upsertion("bob", SHA256, "b")],
    )
    assert codes(results) == [("alice", ErrorCode.duplicate_resource), ("bob", ErrorCode.none)]
    assert results[0][2] == "A user credential cannot be altered twice in the same request"
    # Nothing of alice's is written (not even her SHA-256 one); bob's is.
    assert credentials(broker) == {
        **before,
        ("bob", "SCRAM-SHA-256"): credentials(broker)[("bob", "SCRAM-SHA-256")],
    }


def test_one_users_refusal_writes_none_of_its_changes_and_all_of_the_others() -> None:
    broker, coordinator = scram_broker()
    results = alter(
        broker,
        deletions=[("carol", SHA512)],
        upsertions=[
            upsertion("alice", SHA256, "ok"),
            upsertion("alice", SHA512, "too-few", 100),
            upsertion("bob", SHA512, "fine"),
        ],
    )
    assert codes(results) == [
        ("carol", ErrorCode.resource_not_found),
        ("alice", ErrorCode.unacceptable_credential),
        ("bob", ErrorCode.none),
    ]
    assert results[0][2] == "Attempt to delete a user credential that does not exist"
    assert set(credentials(broker)) == {("bob", "SCRAM-SHA-512")}
    [request] = coordinator.calls
    assert {c.user for c in request.changes} == {"carol", "bob"}  # alice was refused up front


def test_deleting_a_missing_credential_is_resource_not_found() -> None:
    broker, coordinator = scram_broker()
    alter(broker, upsertions=[upsertion("alice", SHA512, "pw")])
    results = alter(broker, deletions=[("alice", SHA256), ("ghost", SHA512)])
    assert codes(results) == [
        ("alice", ErrorCode.resource_not_found),
        ("ghost", ErrorCode.resource_not_found),
    ]
    assert set(credentials(broker)) == {("alice", "SCRAM-SHA-512")}
    assert coordinator.caught_up_to == [broker.view.snapshot.revision + 1]  # the first only


def test_coordinator_unreachable_is_request_timed_out() -> None:
    broker, coordinator = scram_broker()
    coordinator.unreachable = True
    results = alter(
        broker,
        deletions=[("bob", SHA256)],
        upsertions=[upsertion("alice", SHA512, "pw"), upsertion("carol", 9, "pw")],
    )
    assert codes(results) == [
        ("bob", ErrorCode.request_timed_out),
        ("alice", ErrorCode.request_timed_out),
        ("carol", ErrorCode.unsupported_sasl_mechanism),
    ]
    assert results[0][1].retriable
    assert credentials(broker) == {}


def test_empty_request_answers_no_results_and_asks_nothing() -> None:
    broker, coordinator = scram_broker()
    assert alter(broker) == []
    assert coordinator.calls == []


# -- DescribeUserScramCredentials --------------------------------------------------------------


def describe_request(users: Sequence[str] | None) -> Any:
    schema = load_request_schema(DESCRIBE, 0)
    name = codec.nested(schema, "UserName")
    return codec.build(
        schema, users=None if users is None else tuple(codec.build(name, name=u) for u in users)
    )


def describe(broker: Broker, users: Sequence[str] | None) -> list[tuple[Any, ...]]:
    response = call(broker, describe_request(users), DESCRIBE)
    assert (response.error_code, response.error_message) == (ErrorCode.none, None)
    assert response.throttle_time == datetime.timedelta(0)
    return [
        (
            r.user,
            r.error_code,
            r.error_message,
            [(int(i.mechanism), int(i.iterations)) for i in r.credential_infos],
        )
        for r in response.results
    ]


def described_broker() -> Broker:
    broker, _ = scram_broker()
    alter(
        broker,
        upsertions=[
            upsertion("zed", SHA256, "z"),
            upsertion("alice", SHA512, "a", 8192),
            upsertion("alice", SHA256, "a", 4096),
        ],
    )
    return broker


@pytest.mark.parametrize("users", [None, []], ids=["null", "empty"])
def test_describe_every_user(users: list[str] | None) -> None:
    assert describe(described_broker(), users) == [
        ("alice", ErrorCode.none, None, [(SHA256, 4096), (SHA512, 8192)]),
        ("zed", ErrorCode.none, None, [(SHA256, 4096)]),
    ]


def test_describe_with_no_credentials_at_all() -> None:
    broker, _ = scram_broker()
    assert describe(broker, None) == []


def test_describe_named_users() -> None:
    results = describe(described_broker(), ["zed", "ghost", "alice", "ghost"])
    assert [(u, c, i) for u, c, _, i in results] == [
        ("zed", ErrorCode.none, [(SHA256, 4096)]),
        ("ghost", ErrorCode.duplicate_resource, []),
        ("alice", ErrorCode.none, [(SHA256, 4096), (SHA512, 8192)]),
    ]
    assert "twice" in results[1][2]


def test_describe_a_missing_user_and_a_user_named_twice() -> None:
    results = describe(described_broker(), ["ghost", "alice", "alice"])
    assert results == [
        (
            "ghost",
            ErrorCode.resource_not_found,
            "Attempt to describe a user credential that does not exist",
            [],
        ),
        (
            "alice",
            ErrorCode.duplicate_resource,
            "Cannot describe SCRAM credentials for the same user twice in a single request",
            [],
        ),
    ]


def test_describe_shows_only_mechanism_and_iterations() -> None:
    response = call(described_broker(), describe_request(["zed"]), DESCRIBE)
    [info] = response.results[0].credential_infos
    fields = {f for f in dir(info) if not f.startswith("_")}
    assert fields == {"mechanism", "iterations"}


def test_describe_follows_deletions() -> None:
    broker = described_broker()
    alter(broker, deletions=[("zed", SHA256), ("alice", SHA512)])
    assert describe(broker, None) == [("alice", ErrorCode.none, None, [(SHA256, 4096)])]
    assert describe(broker, ["zed"])[0][1] == ErrorCode.resource_not_found


def test_describe_ignores_credentials_of_other_mechanisms() -> None:
    broker = described_broker()
    credential = from_password("SCRAM-SHA-256", "pw")
    credentials(broker)[("eve", "SCRAM-SHA-1")] = ScramRecord(
        credential.salt, credential.stored_key, credential.server_key, 4096
    )
    assert [r[0] for r in describe(broker, None)] == ["alice", "zed"]
    assert describe(broker, ["eve"])[0][1] == ErrorCode.resource_not_found


# -- DescribeClientQuotas ----------------------------------------------------------------------


@pytest.mark.parametrize("version", [0, 1])
@pytest.mark.parametrize(
    "components",
    [[], [("user", 2, None)], [("user", 0, "alice"), ("client-id", 1, None)]],
    ids=["no filter", "any user", "named"],
)
def test_describe_client_quotas_finds_none(
    version: int, components: list[tuple[str, int, str | None]]
) -> None:
    schema = load_request_schema(QUOTAS, version)
    component = codec.nested(schema, "ComponentData")
    request = codec.build(
        schema,
        components=tuple(
            codec.build(component, entity_type=t, match_type=m, match=n) for t, m, n in components
        ),
        strict=False,
    )
    response = call(described_broker(), request, QUOTAS)
    assert (response.error_code, response.error_message) == (ErrorCode.none, None)
    assert response.entries == ()
    assert response.throttle_time == datetime.timedelta(0)
