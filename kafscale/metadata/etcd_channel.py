"""The connection to an etcd cluster: its endpoints, TLS, authentication and failover.

``EtcdCluster`` owns one gRPC channel per endpoint of ``KAFSCALE_ETCD_ENDPOINTS``, with etcd's
generated stubs (pyetcd's ``etcdrpc``) on each, and which endpoint is in use. ``rpc_error`` turns
a gRPC failure into the metadata store's errors. The store (``kafscale.metadata.etcd``) makes
every call through here. Invariants:

- An endpoint is ``https://host:port`` (TLS), ``http://host:port`` (plaintext) or ``host:port``,
  which uses TLS when a CA or a client certificate is configured, as etcdctl does. TLS checks the
  server against ``KAFSCALE_ETCD_CA_FILE`` (else the system's roots) and presents
  ``KAFSCALE_ETCD_CERT_FILE`` with its key when set (etcd's ``--client-cert-auth``).
- One endpoint is in use at a time, as etcd's own clients pin one. A call that finds it
  unavailable (UNAVAILABLE, DEADLINE_EXCEEDED: stopped, paused, cut off from its leader, failing
  the TLS handshake) moves the pin to the next endpoint, so the next call goes there; that call is
  not sent again (a Txn may have been applied). ``failed`` says when every endpoint has failed in
  a row with no answer between: only then is etcd as a whole unavailable. ``check`` pins the first
  endpoint that answers, starting at the pinned one.
- With a user name every call carries an auth token (gRPC metadata ``token``) from
  ``Authenticate``. Tokens expire (etcd's simple tokens after ``--auth-token-ttl`` unused, 5 min by
  default; a restarted member forgets them): ``token_rejected`` tells a call refused for its
  token, which etcd did not apply, so the store authenticates again and sends it once more.
- Every call carries ``hasleader``: a member cut off from the cluster's leader refuses at once
  (and ends its watch streams) instead of letting the call wait out its deadline.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc  # type: ignore[import-untyped]
from pyetcd import etcdrpc

from kafscale.metadata.store import (
    LeaseExpired,
    MetadataStoreError,
    MetadataStoreUnavailable,
)

DEFAULT_PORT = 2379
_GRPC_OPTIONS = [
    # Reconnect quickly after an etcd restart instead of gRPC's default backoff of up to 120 s.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
]
_HAS_LEADER = ("hasleader", "true")  # etcd's rpctypes.MetadataRequireLeaderKey
_AUTH_HINT = (
    "set KAFSCALE_ETCD_USERNAME and KAFSCALE_ETCD_PASSWORD (or KAFSCALE_ETCD_PASSWORD_FILE)"
)
_TLS_HINT = "check KAFSCALE_ETCD_CA_FILE, KAFSCALE_ETCD_CERT_FILE and KAFSCALE_ETCD_KEY_FILE"

Metadata = tuple[tuple[str, str], ...]


class CredentialsRefused(MetadataStoreError):
    """etcd refused the configured user name or password."""


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int
    tls: bool | None  # None: no scheme given, TLS as configured

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


def parse_endpoint(endpoint: str) -> Endpoint:
    """``host:port``, ``http://host:port``, ``https://host:port`` or ``host`` (port 2379)."""
    text = endpoint.strip().rstrip("/")
    scheme, sep, rest = text.partition("://")
    if not sep:
        scheme, rest = "", text
    elif scheme not in ("http", "https"):
        raise MetadataStoreError(f"etcd endpoint {endpoint!r}: expected http:// or https://")
    host, sep, port = rest.rpartition(":")
    if not (sep and port.isdigit() and host):
        host, port = rest, str(DEFAULT_PORT)
    return Endpoint(host, int(port), {"http": False, "https": True}.get(scheme))


@dataclass(frozen=True)
class EtcdSecurity:
    """TLS and authentication of the connection to etcd; empty fields mean none."""

    ca_file: str = ""
    cert_file: str = ""
    key: str = field(default="", repr=False)  # the client certificate's private key, PEM
    username: str = ""
    password: str = field(default="", repr=False)

    @property
    def tls(self) -> bool:
        """Whether a ``host:port`` endpoint (no scheme) uses TLS."""
        return bool(self.ca_file or self.cert_file)

    def channel_credentials(self) -> Any:
        """gRPC's TLS credentials; ``MetadataStoreError`` naming the setting if one is wrong."""
        if bool(self.cert_file) != bool(self.key):
            raise MetadataStoreError(
                "a client certificate needs its key: set KAFSCALE_ETCD_CERT_FILE and"
                " KAFSCALE_ETCD_KEY_FILE together"
            )
        roots = _read_pem(self.ca_file, "KAFSCALE_ETCD_CA_FILE") if self.ca_file else None
        chain = _read_pem(self.cert_file, "KAFSCALE_ETCD_CERT_FILE") if self.cert_file else None
        key = None
        if self.key:
            if "PRIVATE KEY-----" not in self.key:
                raise MetadataStoreError("KAFSCALE_ETCD_KEY holds no PEM private key")
            key = self.key.encode() + b"\n"  # a secret read from a file lost its final newline
        return grpc.ssl_channel_credentials(roots, key, chain)


def _read_pem(path: str, setting: str) -> bytes:
    try:
        with open(path, "rb") as file:
            data = file.read()
    except OSError as exc:
        raise MetadataStoreError(f"cannot read {setting}={path!r}: {exc.strerror}") from None
    if b"-----BEGIN CERTIFICATE-----" not in data:
        raise MetadataStoreError(f"{setting}={path!r} holds no PEM certificate")
    return data


class Member:
    """One endpoint: its channel and the stubs of etcd's services on it."""

    def __init__(self, endpoint: Endpoint, credentials: Any) -> None:
        self.address = endpoint.address
        if credentials is None:
            self.channel = grpc.insecure_channel(self.address, _GRPC_OPTIONS)
        else:
            self.channel = grpc.secure_channel(self.address, credentials, _GRPC_OPTIONS)
        self.kv = etcdrpc.KVStub(self.channel)
        self.lease = etcdrpc.LeaseStub(self.channel)
        self.watch = etcdrpc.WatchStub(self.channel)
        self.maintenance = etcdrpc.MaintenanceStub(self.channel)
        self.auth = etcdrpc.AuthStub(self.channel)


class EtcdCluster:
    def __init__(self, endpoints: Sequence[str], timeout: float, security: EtcdSecurity) -> None:
        if not endpoints:
            raise ValueError("EtcdCluster needs at least one endpoint")
        parsed = [parse_endpoint(endpoint) for endpoint in endpoints]
        tls = [security.tls if e.tls is None else e.tls for e in parsed]
        credentials = security.channel_credentials() if any(tls) else None
        self.members = [
            Member(e, credentials if use_tls else None)
            for e, use_tls in zip(parsed, tls, strict=True)
        ]
        self.timeout = timeout
        self._security = security
        self._pinned = 0
        self._failures = 0  # calls found the pinned endpoint unavailable, in a row
        self._lock = threading.Lock()
        self._auth_lock = threading.Lock()
        self._metadata: Metadata = (_HAS_LEADER,)

    @property
    def member(self) -> Member:
        """The endpoint in use."""
        return self.members[self._pinned]

    @property
    def metadata(self) -> Metadata:
        """What every call carries: ``hasleader`` and, with authentication, the token."""
        return self._metadata

    def answered(self) -> None:
        self._failures = 0

    def failed(self, member: Member) -> bool:
        """``member`` was found unavailable: pin the next endpoint, if ``member`` still was the
        pinned one. True once every endpoint has failed in a row with no answer between."""
        with self._lock:
            if self.members[self._pinned] is member:
                self._pinned = (self._pinned + 1) % len(self.members)
                self._failures += 1
            return self._failures >= len(self.members)

    def pin(self, member: Member) -> None:
        with self._lock:
            self._pinned, self._failures = self.members.index(member), 0

    def status(self, member: Member) -> None:
        """Raise unless ``member`` answers etcd's Status."""
        try:
            member.maintenance.Status(etcdrpc.StatusRequest(), self.timeout, metadata=self.metadata)
        except grpc.RpcError as exc:
            raise rpc_error(exc, member.address) from exc

    def check(self) -> None:
        """Pin the first endpoint that answers, from the pinned one on; raise naming each
        endpoint that did not if none did."""
        start, errors = self._pinned, []
        for offset in range(len(self.members)):
            member = self.members[(start + offset) % len(self.members)]
            try:
                self.status(member)
            except MetadataStoreError as exc:
                errors.append(exc)
                continue
            self.pin(member)
            return
        raise joined(errors)

    def authenticate(self, member: Member, stale: Metadata | None = None) -> Metadata:
        """A new token from ``member``, unless another call already replaced ``stale`` (the
        metadata that was refused). Raises ``grpc.RpcError`` as a call does."""
        with self._auth_lock:
            if stale is not None and self._metadata is not stale:
                return self._metadata
            request = etcdrpc.AuthenticateRequest(
                name=self._security.username, password=self._security.password
            )
            try:
                response = member.auth.Authenticate(request, self.timeout, metadata=(_HAS_LEADER,))
            except grpc.RpcError as exc:
                if "authentication is not enabled" not in _details(exc):
                    raise
                self._metadata = (_HAS_LEADER,)  # as etcd's Go client: no token needed then
            else:
                self._metadata = (_HAS_LEADER, ("token", response.token))
            return self._metadata

    def token_rejected(self, exc: grpc.RpcError) -> bool:
        """Whether etcd refused a call for its auth token (expired, or from an auth store
        revision it has moved past) and a new token may get it through."""
        if not self._security.username:
            return False
        code = exc.code() if hasattr(exc, "code") else None
        return code == grpc.StatusCode.UNAUTHENTICATED or "auth store is old" in _details(exc)

    def close(self) -> None:
        for member in self.members:
            member.channel.close()


def rpc_error(exc: grpc.RpcError, address: str) -> MetadataStoreError:
    """The store's error for a failed call to the etcd at ``address``."""
    code = exc.code() if hasattr(exc, "code") else None
    details = _details(exc)
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        if any(mark in details.lower() for mark in ("ssl", "tls", "tsi_", "certificate")):
            return MetadataStoreUnavailable(
                f"etcd at {address}: the TLS connection failed ({_TLS_HINT}): {details}"
            )
        return MetadataStoreUnavailable(f"etcd at {address} is unreachable: {details}")
    if code == grpc.StatusCode.NOT_FOUND and "lease" in details:
        return LeaseExpired(f"etcd at {address}: {details}")
    if "authentication failed" in details:
        return CredentialsRefused(
            f"etcd at {address} refused the user name or password (KAFSCALE_ETCD_USERNAME,"
            f" KAFSCALE_ETCD_PASSWORD): {details}"
        )
    if "user name is empty" in details:
        details += f" (etcd has authentication enabled: {_AUTH_HINT})"
    name = code.name if code is not None else "error"
    return MetadataStoreError(f"etcd at {address}: {name}: {details}")


def joined(errors: Sequence[MetadataStoreError]) -> MetadataStoreError:
    """One error for a failure at every endpoint: unavailable if any endpoint was (it may come
    back), else what they answered (a wrong setting)."""
    message = "; ".join(str(error) for error in errors)
    if any(isinstance(error, MetadataStoreUnavailable) for error in errors):
        return MetadataStoreUnavailable(message)
    return MetadataStoreError(message)


def _details(exc: grpc.RpcError) -> str:
    return str((exc.details() if hasattr(exc, "details") else None) or exc)
