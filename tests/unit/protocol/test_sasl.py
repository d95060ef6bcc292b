"""The per-connection SASL state machine: what each state admits, the handshake (versions 0 and
1), token exchanges that succeed or fail, and re-authentication (KIP-368). No sockets, no
clock: scripted mechanisms, times passed in."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from kio.schema.errors import ErrorCode

from kafscale.protocol.sasl import (
    API_VERSIONS,
    SASL_AUTHENTICATE,
    SASL_HANDSHAKE,
    Authentication,
    ExchangeFailed,
    State,
    Step,
    Verdict,
)

PRODUCE, METADATA = 0, 3


class Scripted:
    """A mechanism that expects ``tokens`` in order, the last one naming ``principal``."""

    def __init__(self, tokens: Sequence[bytes], principal: str = "User:alice") -> None:
        self.tokens = list(tokens)
        self.principal = principal
        self.user: str | None = None

    def step(self, token: bytes) -> Step:
        self.user = "alice"
        expected = self.tokens.pop(0) if self.tokens else None
        if token != expected:
            raise ExchangeFailed(f"unexpected token {token!r}")
        if self.tokens:
            return Step(b"reply-" + token)
        return Step(b"final", self.principal)


def sasl(reauth_ms: int = 0, principal: str = "User:alice") -> Authentication:
    return Authentication(
        True,
        {
            "PLAIN": lambda: Scripted([b"one"], principal),
            "SCRAM-SHA-512": lambda: Scripted([b"first", b"final"], principal),
        },
        reauth_ms,
    )


def authenticated(auth: Authentication, now_ms: int = 0) -> Authentication:
    assert auth.handshake("SCRAM-SHA-512", 1).error is ErrorCode.none
    assert auth.authenticate(b"first", now_ms).token == b"reply-first"
    done = auth.authenticate(b"final", now_ms)
    assert (done.error, done.token, done.close) == (ErrorCode.none, b"final", False)
    return auth


@pytest.mark.parametrize(
    ("api_key", "verdict"),
    [
        (API_VERSIONS, Verdict.SERVE),
        (SASL_HANDSHAKE, Verdict.SERVE),
        (SASL_AUTHENTICATE, Verdict.CLOSE),  # before a handshake
        (METADATA, Verdict.CLOSE),
        (PRODUCE, Verdict.CLOSE),
    ],
)
def test_before_a_handshake_only_api_versions_and_the_handshake_are_served(
    api_key: int, verdict: Verdict
) -> None:
    assert sasl().admit(api_key, 0).verdict is verdict


def test_between_handshake_and_the_end_only_tokens_are_served() -> None:
    auth = sasl()
    auth.handshake("SCRAM-SHA-512", 1)
    assert auth.state is State.HANDSHAKEN
    assert auth.admit(SASL_AUTHENTICATE, 0).verdict is Verdict.SERVE
    assert auth.admit(API_VERSIONS, 0).verdict is Verdict.SERVE
    for api_key in (METADATA, PRODUCE, SASL_HANDSHAKE):
        assert auth.admit(api_key, 0).verdict is Verdict.CLOSE
    auth.authenticate(b"first", 0)
    assert auth.admit(METADATA, 0).verdict is Verdict.CLOSE  # not done yet


def test_a_completed_exchange_serves_everything_as_its_principal() -> None:
    auth = authenticated(sasl())
    assert auth.authenticated and auth.principal == "User:alice"
    for api_key in (METADATA, PRODUCE, API_VERSIONS):
        assert auth.admit(api_key, 10**12).verdict is Verdict.SERVE  # no expiry


def test_a_mechanism_not_enabled_is_answered_with_the_list_then_closed() -> None:
    auth = sasl()
    result = auth.handshake("GSSAPI", 1)
    assert result.error is ErrorCode.unsupported_sasl_mechanism
    assert result.mechanisms == ("PLAIN", "SCRAM-SHA-512") and result.close
    assert auth.state is State.FAILED
    assert auth.admit(API_VERSIONS, 0).verdict is Verdict.CLOSE


def test_a_refused_token_fails_with_a_message_that_names_no_secret() -> None:
    auth = sasl()
    auth.handshake("SCRAM-SHA-512", 1)
    result = auth.authenticate(b"wrong-proof", 0)
    assert result.error is ErrorCode.sasl_authentication_failed and result.close
    assert result.message is not None and "SCRAM-SHA-512" in result.message
    assert "wrong-proof" not in result.message  # the client's token is only in the log reason
    assert "alice" in result.log
    assert auth.state is State.FAILED and not auth.authenticated


def test_a_second_handshake_during_an_exchange_is_illegal() -> None:
    auth = sasl()
    auth.handshake("SCRAM-SHA-512", 1)
    assert auth.admit(SASL_HANDSHAKE, 0).verdict is Verdict.CLOSE
    result = auth.handshake("SCRAM-SHA-512", 1)  # if a caller fed it anyway
    assert result.error is ErrorCode.illegal_sasl_state and result.close


def test_a_v0_handshake_takes_raw_tokens() -> None:
    auth = sasl()
    assert auth.handshake("PLAIN", 0).error is ErrorCode.none
    assert auth.raw_tokens
    # the tokens come as bare frames, not SaslAuthenticate requests
    assert auth.admit(SASL_AUTHENTICATE, 0).verdict is Verdict.CLOSE
    assert auth.authenticate(b"one", 0).error is ErrorCode.none
    assert auth.authenticated and not auth.raw_tokens


def test_a_listener_without_sasl_starts_authenticated_and_answers_no_mechanism() -> None:
    auth = Authentication(False, {"PLAIN": lambda: Scripted([b"x"])}, reauth_ms=1000,
                          anonymous="User:CN=client")  # fmt: skip
    assert auth.authenticated and auth.principal == "User:CN=client"
    assert auth.admit(PRODUCE, 10**12).verdict is Verdict.SERVE  # never expires
    result = auth.handshake("PLAIN", 1)
    assert (result.error, result.mechanisms, result.close) == (
        ErrorCode.unsupported_sasl_mechanism,
        (),
        False,
    )
    assert auth.authenticated


def test_a_token_without_a_handshake_is_illegal_but_an_authenticated_connection_stays() -> None:
    plain = Authentication(False, {})
    result = plain.authenticate(b"token", 0)
    assert result.error is ErrorCode.illegal_sasl_state and not result.close
    assert plain.authenticated
    done = authenticated(sasl())
    result = done.authenticate(b"token", 0)
    assert result.error is ErrorCode.illegal_sasl_state and not result.close
    assert done.authenticated and done.principal is not None


def test_a_session_expires_and_re_authentication_renews_it() -> None:
    auth = authenticated(sasl(reauth_ms=1000), now_ms=5000)
    assert auth.admit(PRODUCE, 5999).verdict is Verdict.SERVE
    expired = auth.admit(PRODUCE, 6000)
    assert expired.verdict is Verdict.CLOSE and "expired" in expired.reason
    assert auth.admit(SASL_HANDSHAKE, 6000).verdict is Verdict.SERVE
    assert auth.handshake("SCRAM-SHA-512", 1).error is ErrorCode.none
    assert auth.admit(SASL_AUTHENTICATE, 6000).verdict is Verdict.SERVE
    auth.authenticate(b"first", 6000)
    done = auth.authenticate(b"final", 6100)
    assert done.error is ErrorCode.none and done.session_lifetime_ms == 1000
    assert auth.admit(PRODUCE, 7099).verdict is Verdict.SERVE
    assert auth.admit(PRODUCE, 7100).verdict is Verdict.CLOSE


def test_re_authentication_before_expiry_keeps_the_connection_serving() -> None:
    auth = authenticated(sasl(reauth_ms=1000))
    auth.handshake("SCRAM-SHA-512", 1)
    assert auth.admit(PRODUCE, 500).verdict is Verdict.SERVE  # still within the session


def test_re_authentication_may_not_change_mechanism_or_principal() -> None:
    auth = authenticated(sasl(reauth_ms=1000))
    result = auth.handshake("PLAIN", 1)
    assert result.error is ErrorCode.illegal_sasl_state and result.close
    exchanges = iter([Scripted([b"one"]), Scripted([b"one"], "User:bob")])
    other = Authentication(True, {"PLAIN": lambda: next(exchanges)}, reauth_ms=1000)
    other.handshake("PLAIN", 1)
    assert other.authenticate(b"one", 0).error is ErrorCode.none
    other.handshake("PLAIN", 1)
    changed = other.authenticate(b"one", 10)
    assert changed.error is ErrorCode.sasl_authentication_failed and changed.close
    assert changed.message == "Cannot change principals during re-authentication"
