"""A connection's SASL authentication, as a state machine without I/O (docs/design/security.md,
section 4): the connection asks ``Authentication`` about every request before dispatch, and the
SaslHandshake and SaslAuthenticate handlers feed it; it answers with decisions, never touching a
socket, a store or a clock (times come in as ``now_ms``).

States::

    START --handshake(enabled mechanism)--> HANDSHAKEN --token...--> AUTHENTICATED
      |                                         |  (bad token)             |  (session expired,
      |                                         v                          |   KIP-368)
      |                                       FAILED (closed)              v
      +-- a listener without SASL starts AUTHENTICATED              re-authentication:
                                                                    handshake + tokens again,
                                                                    other requests close

- ApiVersions is served in every state (clients ask it before the handshake).
- Before authentication only SaslHandshake and SaslAuthenticate are served; any other request
  closes the connection (Kafka: "Unexpected Kafka request of type X during SASL handshake").
- A v1 handshake carries the tokens in SaslAuthenticate requests; after a v0 handshake they come
  as raw length-prefixed frames without a request header (``raw_tokens``), answered raw.
- A mechanism not enabled gets UNSUPPORTED_SASL_MECHANISM with the enabled list, then the
  connection closes (as Kafka). A token the mechanism refuses gets SASL_AUTHENTICATION_FAILED with
  a message that never says whether the user exists, then the connection closes.
- With ``reauth_ms`` > 0 a session lasts that long (SaslAuthenticate v1+ tells the client);
  after it only a new handshake and its tokens are served, and the principal may not change.

Mechanisms are ``Exchange``s made per handshake by the factories the caller enables
(``kafscale.security.mechanisms``: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from kio.schema.errors import ErrorCode

API_VERSIONS = 18
SASL_HANDSHAKE = 17
SASL_AUTHENTICATE = 36


class ExchangeFailed(Exception):
    """The client's token is refused; ``str`` is for the log (never a password or a proof)."""


@dataclass(frozen=True, slots=True)
class Step:
    """A mechanism's answer to one client token: the token to send back, and, once the exchange
    is over, who authenticated (``principal`` set)."""

    reply: bytes
    principal: str | None = None


class Exchange(Protocol):
    """One run of a mechanism: fed the client's tokens in order."""

    def step(self, token: bytes) -> Step:
        """The reply to ``token``; raises ExchangeFailed when it is refused."""
        ...

    @property
    def user(self) -> str | None:
        """The user name the client gave, once known (for the log line of a failure)."""
        ...


MechanismFactory = Callable[[], Exchange]


class State(enum.Enum):
    START = "start"  # a SASL listener's connection: nothing authenticated yet
    HANDSHAKEN = "handshaken"  # a mechanism chosen, tokens in progress
    AUTHENTICATED = "authenticated"
    FAILED = "failed"  # the connection is closing


class Verdict(enum.Enum):
    SERVE = "serve"
    CLOSE = "close"  # close the connection without an answer (the reason says why)


@dataclass(frozen=True, slots=True)
class Admission:
    verdict: Verdict
    reason: str = ""


@dataclass(frozen=True, slots=True)
class HandshakeResult:
    error: ErrorCode
    mechanisms: tuple[str, ...]
    close: bool  # after the response is written


@dataclass(frozen=True, slots=True)
class AuthenticateResult:
    error: ErrorCode
    message: str | None  # to the client
    token: bytes
    session_lifetime_ms: int  # 0: no expiry
    close: bool  # after the response is written
    log: str = ""  # why it failed, for the log line (a user name, never a secret)
    completed: bool = False  # this token ended the exchange: ``principal`` is authenticated


SERVE = Admission(Verdict.SERVE)
FAILED_MESSAGE = (
    "Authentication failed during authentication due to invalid credentials with SASL mechanism {}"
)


class Authentication:
    def __init__(
        self,
        sasl: bool,
        mechanisms: Mapping[str, MechanismFactory],
        reauth_ms: int = 0,
        anonymous: str = "User:ANONYMOUS",
    ) -> None:
        """``sasl``: the listener is SASL_PLAINTEXT or SASL_SSL (else the connection starts
        authenticated as ``anonymous``, e.g. a TLS client certificate's principal)."""
        self.sasl = sasl
        self.mechanisms = dict(mechanisms) if sasl else {}
        self.reauth_ms = reauth_ms if sasl else 0
        self.state = State.START if sasl else State.AUTHENTICATED
        self.principal: str | None = None if sasl else anonymous
        self.mechanism: str | None = None
        self.expires_ms = 0  # 0: never
        self.raw_tokens = False  # after a v0 handshake: the next frames are bare tokens
        self._exchange: Exchange | None = None
        self._reauthenticating = False

    @property
    def authenticated(self) -> bool:
        return self.state is State.AUTHENTICATED

    def admit(self, api_key: int, now_ms: int) -> Admission:
        """Whether a request of ``api_key`` may be dispatched now."""
        if self.state is State.FAILED:
            return Admission(Verdict.CLOSE, "authentication failed on this connection")
        if api_key == API_VERSIONS:
            return SERVE
        if self.state is State.AUTHENTICATED and not self._expired(now_ms):
            return SERVE  # SaslHandshake too: re-authentication, or the handler says "none"
        if api_key == SASL_HANDSHAKE and self._exchange is None:
            return SERVE
        if api_key == SASL_AUTHENTICATE and self._exchange is not None and not self.raw_tokens:
            return SERVE
        if self.state is State.AUTHENTICATED:
            return Admission(Verdict.CLOSE, "the SASL session expired (re-authentication due)")
        return Admission(
            Verdict.CLOSE, f"request of API key {api_key} before SASL authentication completed"
        )

    def handshake(self, mechanism: str, version: int) -> HandshakeResult:
        """A SaslHandshake (admitted by ``admit``)."""
        enabled = tuple(self.mechanisms)
        if not self.sasl:
            # No mechanism on this listener: the client reports "not enabled, server supports
            # []" (Kafka answers ILLEGAL_SASL_STATE, which says less); the connection stays.
            return HandshakeResult(ErrorCode.unsupported_sasl_mechanism, (), close=False)
        if self._exchange is not None:
            self._fail()
            return HandshakeResult(ErrorCode.illegal_sasl_state, enabled, close=True)
        if mechanism not in self.mechanisms:
            self._fail()
            return HandshakeResult(ErrorCode.unsupported_sasl_mechanism, enabled, close=True)
        if self.state is State.AUTHENTICATED:
            if mechanism != self.mechanism:  # KIP-368: re-authenticate with the same mechanism
                self._fail()
                return HandshakeResult(ErrorCode.illegal_sasl_state, enabled, close=True)
            self._reauthenticating = True
        self.mechanism = mechanism
        self._exchange = self.mechanisms[mechanism]()
        self.raw_tokens = version == 0
        if self.state is State.START:
            self.state = State.HANDSHAKEN
        return HandshakeResult(ErrorCode.none, enabled, close=False)

    def authenticate(self, token: bytes, now_ms: int) -> AuthenticateResult:
        """A client token (from SaslAuthenticate, or a raw frame after a v0 handshake)."""
        exchange = self._exchange
        if exchange is None and self.state is State.AUTHENTICATED:
            # Nothing to authenticate (a listener without SASL, or no re-authentication begun):
            # answered, and the connection stays, as Kafka's KafkaApis answers it.
            return AuthenticateResult(
                ErrorCode.illegal_sasl_state,
                "SaslAuthenticate without a SaslHandshake before it",
                b"",
                0,
                False,
                "no handshake",
            )
        if exchange is None:
            self._fail()
            return AuthenticateResult(
                ErrorCode.illegal_sasl_state, "no SASL handshake", b"", 0, True, "no handshake"
            )
        try:
            step = exchange.step(token)
        except ExchangeFailed as exc:
            self._fail()
            return AuthenticateResult(
                ErrorCode.sasl_authentication_failed,
                FAILED_MESSAGE.format(self.mechanism),
                b"",
                0,
                True,
                f"user {exchange.user!r}: {exc}",
            )
        if step.principal is None:
            return AuthenticateResult(ErrorCode.none, None, step.reply, 0, False)
        if self._reauthenticating and step.principal != self.principal:
            self._fail()
            return AuthenticateResult(
                ErrorCode.sasl_authentication_failed,
                "Cannot change principals during re-authentication",
                b"",
                0,
                True,
                f"re-authentication as {step.principal!r} on a connection of {self.principal!r}",
            )
        self.principal = step.principal
        self.state = State.AUTHENTICATED
        self._exchange = None
        self._reauthenticating = False
        self.raw_tokens = False
        self.expires_ms = now_ms + self.reauth_ms if self.reauth_ms > 0 else 0
        return AuthenticateResult(
            ErrorCode.none, None, step.reply, self.reauth_ms, False, completed=True
        )

    def _expired(self, now_ms: int) -> bool:
        return self.expires_ms > 0 and now_ms >= self.expires_ms

    def _fail(self) -> None:
        self.state = State.FAILED
        self._exchange = None
        self.raw_tokens = False
