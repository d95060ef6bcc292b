"""TLS contexts for a listener: real handshakes over loopback with certificates made at test
time; a certificate replaced on disk served to the next handshake, a broken one not; mTLS and
the principal of a client certificate (RFC 2253, as Kafka)."""

from __future__ import annotations

import os
import shutil
import socket
import ssl
import threading
from pathlib import Path

import pytest

from kafscale.security.tls import ReloadingContext, TlsFiles, principal, server_context
from tests.harness.tls import Pki, make_pki


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return make_pki(tmp_path / "pki")


def handshake(
    listening: ssl.SSLContext, client: ssl.SSLContext
) -> tuple[bytes | None, dict[str, object] | None]:
    """One handshake over loopback: the server's certificate (DER) as the client saw it, and the
    client's certificate as the server saw it. Raises the client's SSLError on failure."""
    server = socket.create_server(("127.0.0.1", 0))
    seen: dict[str, object] = {}

    def serve() -> None:
        conn, _ = server.accept()
        try:
            with listening.wrap_socket(conn, server_side=True) as tls:
                seen["peer"] = tls.getpeercert()
                tls.sendall(b"ok")
        except (ssl.SSLError, OSError) as exc:
            seen["error"] = exc

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        # an IP address: Python's client sends no server name, and the reload must still work
        with (
            socket.create_connection(server.getsockname()) as raw,
            client.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
        ):
            cert = tls.getpeercert(binary_form=True)
            tls.recv(2)
    finally:
        thread.join(10)
        server.close()
    peer = seen.get("peer")
    return cert, peer if isinstance(peer, dict) else None


def client_context(pki: Pki, with_cert: bool = False) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki.ca_file))
    if with_cert:
        context.load_cert_chain(pki.client_cert, pki.client_key)
    return context


def files(pki: Pki, **kwargs: str) -> TlsFiles:
    return TlsFiles(str(pki.server_cert), str(pki.server_key), **kwargs)


def test_a_client_trusting_the_ca_completes_the_handshake(pki: Pki) -> None:
    cert, peer = handshake(server_context(files(pki)), client_context(pki))
    assert cert and principal(peer) == "User:ANONYMOUS"  # no client certificate asked for


def test_mtls_gives_the_certificates_subject_as_principal(pki: Pki) -> None:
    required = server_context(files(pki, ca_file=str(pki.ca_file), client_auth="required"))
    _, peer = handshake(required, client_context(pki, with_cert=True))
    assert principal(peer) == "User:CN=kafscale"


def test_required_client_auth_refuses_a_client_without_a_certificate(pki: Pki) -> None:
    required = server_context(files(pki, ca_file=str(pki.ca_file), client_auth="required"))
    with pytest.raises((ssl.SSLError, OSError)):
        handshake(required, client_context(pki))


def test_requested_client_auth_accepts_a_client_without_a_certificate(pki: Pki) -> None:
    requested = server_context(files(pki, ca_file=str(pki.ca_file), client_auth="requested"))
    _, peer = handshake(requested, client_context(pki))
    assert principal(peer) == "User:ANONYMOUS"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"client_auth": "maybe"}, "not one of"), ({"client_auth": "required"}, "needs a CA")],
)
def test_bad_settings_are_refused(pki: Pki, kwargs: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        server_context(files(pki, **kwargs))


def serving(pki: Pki, live: Path) -> None:
    """Put ``pki``'s server certificate and key where a listener reads them."""
    live.mkdir(exist_ok=True)
    shutil.copy(pki.server_cert, live / "cert.pem")
    shutil.copy(pki.server_key, live / "key.pem")


def reloading_from(live: Path) -> ReloadingContext:
    return ReloadingContext("EXTERNAL", TlsFiles(str(live / "cert.pem"), str(live / "key.pem")))


def test_a_certificate_replaced_on_disk_is_served_to_the_next_handshake(
    pki: Pki, tmp_path: Path
) -> None:
    live = tmp_path / "live"
    serving(pki, live)
    reloading = reloading_from(live)
    first, _ = handshake(reloading.listening, client_context(pki))
    assert not reloading.check()  # nothing changed

    renewed = make_pki(tmp_path / "renewed")  # a new CA and server certificate
    serving(renewed, live)
    os.utime(live / "cert.pem", ns=(1, 1))  # a different mtime even within the clock's grain
    assert reloading.check() and reloading.reloads == 1
    second, _ = handshake(reloading.listening, client_context(renewed))
    assert second and second != first
    with pytest.raises(ssl.SSLError):  # the old CA no longer vouches for what is served
        handshake(reloading.listening, client_context(pki))


def test_a_broken_replacement_keeps_the_previous_certificate(pki: Pki, tmp_path: Path) -> None:
    live = tmp_path / "live"
    serving(pki, live)
    reloading = reloading_from(live)
    (live / "key.pem").write_text("half a key")
    assert not reloading.check()
    cert, _ = handshake(reloading.listening, client_context(pki))
    assert cert
    assert not reloading.check()  # the same broken files: not tried (and logged) again
    assert reloading.failures == 1


def test_a_listener_does_not_start_without_its_certificate(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        ReloadingContext("EXTERNAL", TlsFiles(str(tmp_path / "no.pem"), str(tmp_path / "no.key")))


@pytest.mark.parametrize(
    ("subject", "expected"),
    [
        (
            ((("countryName", "US"),), (("organizationName", "example"),),
             (("organizationalUnitName", "apps"),), (("commonName", "writer"),)),
            "User:CN=writer,OU=apps,O=example,C=US",
        ),
        (((("commonName", "a,b+c"),),), "User:CN=a\\,b\\+c"),
        (((("commonName", " #lead"),),), "User:CN=\\ #lead"),
        (((("commonName", "#x "),),), "User:CN=\\#x\\ "),
        (((("commonName", "x"), ("userId", "7")),), "User:CN=x+UID=7"),
        (((("emailAddress", "a@b"),),), "User:emailAddress=a@b"),
    ],
)  # fmt: skip
def test_principals_are_rfc_2253_subjects(subject: tuple[object, ...], expected: str) -> None:
    assert principal({"subject": subject}) == expected


def test_no_certificate_is_anonymous() -> None:
    assert principal(None) == principal({}) == "User:ANONYMOUS"
