"""TLS for a listener (docs/design/security.md, section 3): server contexts from PEM files,
reloaded when the files change, and the principal of a verified client certificate.

- ``server_context`` builds a context: TLS 1.2 and 1.3, the certificate chain and key (with
  its password, if encrypted), and for client certificates (``client_auth`` ``requested`` or
  ``required``, Kafka's ``ssl.client.auth``) the CAs they are checked against.
- ``ReloadingContext`` is what a listener listens with. Each handshake is handed the context
  current at that moment (the listening context's ``sni_callback``, which OpenSSL calls for every
  ClientHello, with or without a server name). ``check`` compares the files' size and mtime to
  the last look and, when they changed, builds a new context; it replaces the current one only
  if it loads, else the old one stays and the error is logged once per change of the files.
  Connections already open keep their session.
- ``principal`` is Kafka's default for a client certificate: ``User:`` and its subject in RFC
  2253 form (most specific first, ``CN=writer,OU=apps,O=example``), special characters escaped.
"""

from __future__ import annotations

import logging
import os
import ssl
from collections.abc import Sequence
from dataclasses import dataclass

log = logging.getLogger(__name__)

CLIENT_AUTH = {
    "none": ssl.CERT_NONE,
    "requested": ssl.CERT_OPTIONAL,
    "required": ssl.CERT_REQUIRED,
}
ANONYMOUS = "User:ANONYMOUS"
# getpeercert()'s attribute names -> RFC 2253's keywords (others are kept as they come)
_KEYWORDS = {
    "commonName": "CN",
    "localityName": "L",
    "stateOrProvinceName": "ST",
    "organizationName": "O",
    "organizationalUnitName": "OU",
    "countryName": "C",
    "streetAddress": "STREET",
    "domainComponent": "DC",
    "userId": "UID",
}


@dataclass(frozen=True, slots=True)
class TlsFiles:
    cert_file: str
    key_file: str
    ca_file: str = ""  # the CAs client certificates are checked against
    client_auth: str = "none"  # none | requested | required
    key_password: str | None = None

    def paths(self) -> tuple[str, ...]:
        return tuple(path for path in (self.cert_file, self.key_file, self.ca_file) if path)


def server_context(files: TlsFiles) -> ssl.SSLContext:
    """A server context from ``files``; raises OSError or ssl.SSLError if they do not load,
    ValueError for a ``client_auth`` that is not one of ``CLIENT_AUTH`` or that needs a CA."""
    if files.client_auth not in CLIENT_AUTH:
        raise ValueError(
            f"client auth {files.client_auth!r} is not one of {', '.join(CLIENT_AUTH)}"
        )
    if files.client_auth != "none" and not files.ca_file:
        raise ValueError(f"client auth {files.client_auth!r} needs a CA file to check against")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(files.cert_file, files.key_file, password=files.key_password)
    context.verify_mode = CLIENT_AUTH[files.client_auth]
    if files.ca_file:
        context.load_verify_locations(cafile=files.ca_file)
    return context


def _stamp(paths: Sequence[str]) -> tuple[tuple[int, int], ...]:
    out = []
    for path in paths:
        try:
            found = os.stat(path)
            out.append((found.st_size, found.st_mtime_ns))
        except OSError:
            out.append((-1, -1))
    return tuple(out)


class ReloadingContext:
    def __init__(self, name: str, files: TlsFiles) -> None:
        """``name``: the listener's (for log lines). Raises as ``server_context`` when the
        files do not load at start: a listener never starts without its certificate."""
        self.name = name
        self.files = files
        self._stamp = _stamp(files.paths())
        self.current = server_context(files)
        self.listening = server_context(files)
        self.listening.sni_callback = self._pick
        self.reloads = 0
        self.failures = 0  # changes whose files did not load

    def _pick(self, connection: ssl.SSLObject, server_name: str | None, _: ssl.SSLContext) -> None:
        connection.context = self.current

    def check(self) -> bool:
        """Load the files again if they changed since the last look; whether the context did."""
        stamp = _stamp(self.files.paths())
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        try:
            fresh = server_context(self.files)
        except (OSError, ssl.SSLError, ValueError) as exc:
            self.failures += 1
            log.error(
                "TLS files changed but do not load: still serving the previous certificate",
                extra={"listener": self.name, "files": self.files.paths(), "error": str(exc)},
            )
            return False
        self.current = fresh
        self.reloads += 1
        log.info("TLS certificate reloaded", extra={"listener": self.name})
        return True


def principal(peer_certificate: dict[str, object] | None) -> str:
    """Kafka's principal for a verified client certificate (``SSLObject.getpeercert()``):
    ``User:`` + the subject in RFC 2253 form; ``User:ANONYMOUS`` without one."""
    if not peer_certificate or not peer_certificate.get("subject"):
        return ANONYMOUS
    subject = peer_certificate["subject"]
    assert isinstance(subject, tuple)
    rdns = []
    for rdn in reversed(subject):  # RFC 2253: the most specific RDN first
        rdns.append("+".join(f"{_KEYWORDS.get(key, key)}={_escape(value)}" for key, value in rdn))
    return "User:" + ",".join(rdns)


def _escape(value: str) -> str:
    out = []
    for i, char in enumerate(value):
        if (
            char in ',+"\\<>;'
            or (char == "#" and i == 0)
            or (char == " " and i in (0, len(value) - 1))
        ):
            out.append("\\" + char)
        else:
            out.append(char)
    return "".join(out)
