"""SASL mechanisms and SCRAM credentials (docs/design/security.md, sections 4 and 5): the
``Exchange``s that ``kafscale.protocol.sasl`` runs, and the credential arithmetic of RFC 5802.
No I/O: credentials come from a ``Lookup`` the caller gives (the metadata view).

- A credential is what Kafka stores per user and mechanism: salt, StoredKey = H(ClientKey),
  ServerKey, iterations; never a password. ``from_salted_password`` is KIP-554's
  AlterUserScramCredentials (the client sends salt and salted password), ``from_password`` the
  first admin's.
- SCRAM-SHA-256 and SCRAM-SHA-512: the message parsing and proofs are ``scramp``'s; no channel
  binding (as Kafka). The user name is SCRAM's ``saslname`` ("=2C" for ",", "=3D" for "="). An
  ``a=`` authorization id is refused (scramp's rule; Kafka accepts one equal to the user, and
  neither the Java client nor librdkafka sends one). An unknown user gets a made-up credential (salt
  derived from the name and a per-process secret, so it is stable) and fails at the proof like a
  wrong password: no user is revealed by message or by the number of round trips.
- PLAIN (RFC 4616) checks the password against the user's SCRAM credential (SHA-512 first, then
  SHA-256): PBKDF2 with its salt and iterations, then H(HMAC(salted, "Client Key")) == StoredKey.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Callable
from dataclasses import dataclass

from scramp import ScramException, ScramMechanism

from kafscale.protocol.sasl import ExchangeFailed, Step

SCRAM_MECHANISMS = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
MIN_ITERATIONS = 4096  # Kafka's bounds for a SCRAM credential's iterations
MAX_ITERATIONS = 16384
PLAIN_ORDER = ("SCRAM-SHA-512", "SCRAM-SHA-256")
MAX_TOKEN_BYTES = 4096  # a PLAIN or SCRAM token is far shorter; longer is refused unread


@dataclass(frozen=True, slots=True)
class ScramCredential:
    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int


Lookup = Callable[[str, str], ScramCredential | None]  # (user, mechanism) -> its credential


def _hash(mechanism: str) -> str:
    try:
        return SCRAM_MECHANISMS[mechanism]
    except KeyError:
        raise ValueError(f"not a SCRAM mechanism: {mechanism}") from None


def from_salted_password(
    mechanism: str, salt: bytes, salted_password: bytes, iterations: int
) -> ScramCredential:
    """The credential for a salted password (RFC 5802: ClientKey, StoredKey, ServerKey)."""
    name = _hash(mechanism)
    if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise ValueError(f"iterations must be {MIN_ITERATIONS}-{MAX_ITERATIONS}, not {iterations}")
    if not salt:
        raise ValueError("the salt is empty")
    client_key = hmac.digest(salted_password, b"Client Key", name)
    server_key = hmac.digest(salted_password, b"Server Key", name)
    return ScramCredential(salt, hashlib.new(name, client_key).digest(), server_key, iterations)


def salted_password(mechanism: str, password: str, salt: bytes, iterations: int) -> bytes:
    """Hi(password, salt, i) of RFC 5802 (PBKDF2-HMAC)."""
    return hashlib.pbkdf2_hmac(_hash(mechanism), password.encode(), salt, iterations)


def from_password(
    mechanism: str, password: str, iterations: int = MIN_ITERATIONS, salt: bytes | None = None
) -> ScramCredential:
    salt = salt if salt is not None else os.urandom(32)
    salted = salted_password(mechanism, password, salt, iterations)
    return from_salted_password(mechanism, salt, salted, iterations)


def password_matches(mechanism: str, credential: ScramCredential, password: str) -> bool:
    derived = from_salted_password(
        mechanism,
        credential.salt,
        salted_password(mechanism, password, credential.salt, credential.iterations),
        credential.iterations,
    )
    return hmac.compare_digest(derived.stored_key, credential.stored_key)


def decode_saslname(name: str) -> str:
    """SCRAM's ``saslname``: "=2C" is ",", "=3D" is "=", and any other "=" is malformed."""
    out, i = [], 0
    while i < len(name):
        if name[i] != "=":
            out.append(name[i])
            i += 1
        elif name[i : i + 3] in ("=2C", "=3D"):
            out.append("," if name[i : i + 3] == "=2C" else "=")
            i += 3
        else:
            raise ExchangeFailed("malformed user name in the SCRAM message")
    return "".join(out)


class PlainExchange:
    """PLAIN: one token, ``authzid NUL authcid NUL password``."""

    def __init__(self, lookup: Lookup) -> None:
        self.lookup = lookup
        self.user: str | None = None

    def step(self, token: bytes) -> Step:
        if len(token) > MAX_TOKEN_BYTES:
            raise ExchangeFailed(f"PLAIN token of {len(token)} bytes")
        try:
            authzid, user, password = token.decode().split("\0")
        except (UnicodeDecodeError, ValueError):
            raise ExchangeFailed("malformed PLAIN token") from None
        self.user = user
        if not user or not password:
            raise ExchangeFailed("empty user name or password")
        if authzid and authzid != user:
            raise ExchangeFailed(f"authorization id {authzid!r} is not the user")
        for mechanism in PLAIN_ORDER:
            credential = self.lookup(user, mechanism)
            if credential is not None:
                if password_matches(mechanism, credential, password):
                    return Step(b"", principal=f"User:{user}")
                raise ExchangeFailed("wrong password")
        raise ExchangeFailed("no such user")


class ScramExchange:
    """SCRAM-SHA-256/512, server side: client-first -> server-first, client-final ->
    server-final (the exchange ends there: Kafka clients send no third token)."""

    def __init__(
        self, mechanism: str, lookup: Lookup, secret: bytes, nonce: str | None = None
    ) -> None:
        """``secret`` makes unknown users' credentials up; ``nonce``: the server's nonce part
        (random by default; fixed by the RFC's test vectors)."""
        _hash(mechanism)
        self.mechanism = mechanism
        self.lookup = lookup
        self.secret = secret
        self.user: str | None = None
        self._known = False
        self._server = ScramMechanism(mechanism).make_server(self._auth_info, s_nonce=nonce)
        self._round = 0

    def _auth_info(self, saslname: str) -> tuple[bytes, bytes, bytes, int]:
        self.user = decode_saslname(saslname)
        credential = self.lookup(self.user, self.mechanism)
        self._known = credential is not None
        if credential is None:
            credential = self._made_up(self.user)
        return credential.salt, credential.stored_key, credential.server_key, credential.iterations

    def _made_up(self, user: str) -> ScramCredential:
        name = _hash(self.mechanism)
        salt = hmac.digest(self.secret, b"salt:" + user.encode(), name)[:32]
        stored = hmac.digest(self.secret, b"stored:" + user.encode(), name)
        return ScramCredential(salt, stored, os.urandom(len(stored)), MIN_ITERATIONS)

    def _accept_repeated_nonce(self, client_final: str) -> None:
        """librdkafka sends the client's nonce again before the whole nonce in its final message
        (``r=`` c-nonce + c-nonce + s-nonce). Kafka accepts a final nonce that ends with the
        one it sent (``ScramSaslServer``), so this does too: the proof still covers the message
        exactly as sent."""
        expected = self._server.nonce  # scramp's Nonce (str() is its text)
        for attribute in client_final.split(","):
            if attribute.startswith("r="):
                sent = attribute[2:]
                if expected is not None and sent != str(expected) and sent.endswith(str(expected)):
                    self._server.nonce = type(expected)(sent)
                return

    def step(self, token: bytes) -> Step:
        if len(token) > MAX_TOKEN_BYTES:
            raise ExchangeFailed(f"SCRAM token of {len(token)} bytes")
        self._round += 1
        try:
            message = token.decode()
            if self._round == 1:
                self._server.set_client_first(message)
                return Step(self._server.get_server_first().encode())
            if self._round == 2:
                self._accept_repeated_nonce(message)
                self._server.set_client_final(message)
                if not self._known:
                    raise ExchangeFailed("no such user")
                return Step(self._server.get_server_final().encode(), f"User:{self.user}")
        except (ScramException, UnicodeDecodeError, ValueError) as exc:
            reason = "no such user" if self._round == 2 and not self._known else str(exc)
            raise ExchangeFailed(reason) from None
        raise ExchangeFailed("a token after the SCRAM exchange ended")
