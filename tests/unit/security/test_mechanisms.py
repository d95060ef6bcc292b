"""SASL mechanisms and SCRAM credentials: RFC 7677's SCRAM-SHA-256 test vector, exchanges with
scramp's client (as a Kafka client runs them), PLAIN against the stored SCRAM credential, and the
credential arithmetic of KIP-554."""

from __future__ import annotations

import base64

import pytest
from scramp import ScramClient

from kafscale.protocol.sasl import ExchangeFailed
from kafscale.security.mechanisms import (
    MAX_TOKEN_BYTES,
    PlainExchange,
    ScramCredential,
    ScramExchange,
    decode_saslname,
    from_password,
    from_salted_password,
    password_matches,
    salted_password,
)

SECRET = b"k" * 32


def store(**users: str) -> dict[tuple[str, str], ScramCredential]:
    return {
        (user, mechanism): from_password(mechanism, password)
        for user, password in users.items()
        for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512")
    }


def test_rfc_7677_scram_sha_256_vector() -> None:
    """RFC 7677 section 3: user "user", password "pencil", 4096 iterations."""
    salt = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
    credential = from_password("SCRAM-SHA-256", "pencil", 4096, salt)
    exchange = ScramExchange(
        "SCRAM-SHA-256",
        lambda user, mechanism: credential if user == "user" else None,
        SECRET,
        nonce="%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0",
    )
    first = exchange.step(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO")
    assert first.reply == (
        b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    )
    assert first.principal is None
    final = exchange.step(
        b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
        b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
    )
    assert final.reply == b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
    assert final.principal == "User:user"


def run_scram(mechanism: str, users: dict[tuple[str, str], ScramCredential], user: str,
              password: str) -> str | None:  # fmt: skip
    client = ScramClient([mechanism], user, password)
    exchange = ScramExchange(mechanism, lambda u, m: users.get((u, m)), SECRET)
    first = exchange.step(client.get_client_first().encode())
    client.set_server_first(first.reply.decode())
    final = exchange.step(client.get_client_final().encode())
    client.set_server_final(final.reply.decode())  # the client checks the server's signature
    return final.principal


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_with_the_right_password_authenticates_the_user(mechanism: str) -> None:
    assert run_scram(mechanism, store(alice="s3cret"), "alice", "s3cret") == "User:alice"


@pytest.mark.parametrize(
    ("user", "password", "logged"),
    [("alice", "wrong", "invalid-proof"), ("mallory", "s3cret", "no such user")],
)
def test_a_wrong_password_and_an_unknown_user_fail_alike(
    user: str, password: str, logged: str
) -> None:
    users = store(alice="s3cret")
    client = ScramClient(["SCRAM-SHA-512"], user, password)
    exchange = ScramExchange("SCRAM-SHA-512", lambda u, m: users.get((u, m)), SECRET)
    first = exchange.step(client.get_client_first().encode())  # a server-first for both
    assert b",s=" in first.reply and b",i=" in first.reply
    client.set_server_first(first.reply.decode())
    with pytest.raises(ExchangeFailed, match=logged):
        exchange.step(client.get_client_final().encode())
    assert exchange.user == user


def test_an_unknown_users_made_up_salt_is_stable() -> None:
    def salt_of(user: str) -> bytes:
        exchange = ScramExchange("SCRAM-SHA-512", lambda u, m: None, SECRET)
        reply = exchange.step(b"n,,n=" + user.encode() + b",r=abcdefgh").reply.decode()
        return base64.b64decode(reply.split(",s=")[1].split(",")[0])

    assert salt_of("mallory") == salt_of("mallory") != salt_of("eve")


@pytest.mark.parametrize(
    "token",
    [
        b"",
        b"garbage",
        b"\xff\xfe",
        b"n,,n=al=ice,r=abc",  # "=" must be escaped in a saslname
        b"p=tls-unique,,n=alice,r=abc",  # channel binding: not offered
        b"x" * (MAX_TOKEN_BYTES + 1),
    ],
)
def test_a_malformed_client_first_message_fails(token: bytes) -> None:
    users = store(alice="s3cret")
    exchange = ScramExchange("SCRAM-SHA-512", lambda u, m: users.get((u, m)), SECRET)
    with pytest.raises(ExchangeFailed):
        exchange.step(token)


@pytest.mark.parametrize("authzid", [b"bob", b"alice"])
def test_an_authorization_id_is_refused(authzid: bytes) -> None:
    users = store(alice="s3cret", bob="b")
    exchange = ScramExchange("SCRAM-SHA-512", lambda u, m: users.get((u, m)), SECRET)
    with pytest.raises(ExchangeFailed, match="authzid"):
        exchange.step(b"n,a=" + authzid + b",n=alice,r=abcdefgh")


def test_a_token_after_the_exchange_fails() -> None:
    users = store(alice="s3cret")
    client = ScramClient(["SCRAM-SHA-256"], "alice", "s3cret")
    exchange = ScramExchange("SCRAM-SHA-256", lambda u, m: users.get((u, m)), SECRET)
    client.set_server_first(exchange.step(client.get_client_first().encode()).reply.decode())
    exchange.step(client.get_client_final().encode())
    with pytest.raises(ExchangeFailed):
        exchange.step(b"more")


def test_saslnames_decode_as_rfc_5802_says() -> None:
    assert decode_saslname("a=2Cb=3Dc") == "a,b=c"
    with pytest.raises(ExchangeFailed):
        decode_saslname("a=b")


@pytest.mark.parametrize(
    ("token", "principal"),
    [
        (b"\0alice\0s3cret", "User:alice"),
        (b"alice\0alice\0s3cret", "User:alice"),
        (b"\0bob\0b0b", "User:bob"),  # only a SHA-256 credential: PLAIN falls back to it
    ],
)
def test_plain_checks_the_password_against_the_scram_credential(
    token: bytes, principal: str
) -> None:
    users = store(alice="s3cret")
    users[("bob", "SCRAM-SHA-256")] = from_password("SCRAM-SHA-256", "b0b")
    assert PlainExchange(lambda u, m: users.get((u, m))).step(token).principal == principal


@pytest.mark.parametrize(
    "token",
    [
        b"\0alice\0wrong",
        b"\0mallory\0s3cret",
        b"bob\0alice\0s3cret",  # another authorization id
        b"\0alice\0",
        b"\0\0s3cret",
        b"alice\0s3cret",
        b"\0alice\0s3cret\0extra",
        b"\0\xff\0s3cret",
        b"\0alice\0" + b"x" * MAX_TOKEN_BYTES,
    ],
)
def test_plain_refuses(token: bytes) -> None:
    users = store(alice="s3cret")
    with pytest.raises(ExchangeFailed):
        PlainExchange(lambda u, m: users.get((u, m))).step(token)


def test_a_credential_from_a_salted_password_is_what_kip_554_describes() -> None:
    """AlterUserScramCredentials sends the salt and the salted password: the credential built
    from them checks the password, and holds no password."""
    salt = b"0123456789abcdef"
    salted = salted_password("SCRAM-SHA-512", "pw", salt, 8192)
    credential = from_salted_password("SCRAM-SHA-512", salt, salted, 8192)
    assert credential == from_password("SCRAM-SHA-512", "pw", 8192, salt)
    assert password_matches("SCRAM-SHA-512", credential, "pw")
    assert not password_matches("SCRAM-SHA-512", credential, "pW")
    assert salted not in (credential.stored_key, credential.server_key)


@pytest.mark.parametrize(
    ("mechanism", "salt", "iterations"),
    [("SCRAM-SHA-1", b"s", 4096), ("SCRAM-SHA-256", b"", 4096), ("SCRAM-SHA-256", b"s", 4095),
     ("SCRAM-SHA-256", b"s", 16385)],
)  # fmt: skip
def test_a_credential_outside_kafkas_bounds_is_refused(
    mechanism: str, salt: bytes, iterations: int
) -> None:
    with pytest.raises(ValueError):
        from_salted_password(mechanism, salt, b"x" * 32, iterations)
