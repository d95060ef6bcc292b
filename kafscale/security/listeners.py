"""Listener settings as Kafka's (docs/design/security.md, section 2): ``KAFSCALE_LISTENERS``,
``KAFSCALE_ADVERTISED_LISTENERS`` and ``KAFSCALE_LISTENER_SECURITY_PROTOCOL_MAP`` parsed and
checked into ``Listener``s. Pure: strings in, listeners or a ``ValueError`` naming the setting out.

Kafka's rules, kept:

- A listener is ``NAME://host:port``; an empty host binds every interface (advertised: the
  broker's host). IPv6 hosts go in brackets (``[::1]:9092``). Names are unique (case-insensitive,
  as Kafka upper-cases them), and so are ports.
- The map gives each name its protocol (``PLAINTEXT``, ``SSL``, ``SASL_PLAINTEXT``,
  ``SASL_SSL``). Unset, each name must be a protocol itself (``SASL_SSL://:9094``).
- Every advertised listener names a listener; a listener not advertised is advertised at its own
  host:port, or at the broker's host when it binds every interface (empty, ``0.0.0.0``, ``::``;
  Kafka refuses that instead). An advertised host given as empty or ``0.0.0.0`` is refused: a
  client cannot connect there.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass


class SecurityProtocol(enum.Enum):
    PLAINTEXT = "PLAINTEXT"
    SSL = "SSL"
    SASL_PLAINTEXT = "SASL_PLAINTEXT"
    SASL_SSL = "SASL_SSL"

    @property
    def tls(self) -> bool:
        return self in (SecurityProtocol.SSL, SecurityProtocol.SASL_SSL)

    @property
    def sasl(self) -> bool:
        return self in (SecurityProtocol.SASL_PLAINTEXT, SecurityProtocol.SASL_SSL)


@dataclass(frozen=True, slots=True)
class Listener:
    name: str  # upper case
    protocol: SecurityProtocol
    host: str  # to bind ("" = every interface)
    port: int
    advertised_host: str
    advertised_port: int


_ENDPOINT = re.compile(
    r"^(?P<name>[A-Za-z0-9_]+)://(?P<host>\[[0-9A-Fa-f:.]+\]|[^:/\[\]]*):(?P<port>\d+)$"
)
_NAME = re.compile(r"^[A-Za-z0-9_]+$")
UNROUTABLE = {"", "0.0.0.0", "::", "[::]"}


def _endpoints(setting: str, value: str) -> dict[str, tuple[str, int]]:
    out: dict[str, tuple[str, int]] = {}
    ports: set[int] = set()
    for item in (part.strip() for part in value.split(",")):
        if not item:
            continue
        found = _ENDPOINT.match(item)
        if found is None:
            raise ValueError(f"{setting}: {item!r} is not NAME://host:port")
        name, host, port = found["name"].upper(), found["host"], int(found["port"])
        if not 0 < port < 65536:
            raise ValueError(f"{setting}: {item!r}: port {port} is out of range")
        if name in out:
            raise ValueError(f"{setting}: listener {name} is named twice")
        if setting == "KAFSCALE_LISTENERS" and port in ports:
            raise ValueError(f"{setting}: port {port} is used twice")
        ports.add(port)
        out[name] = (host[1:-1] if host.startswith("[") else host, port)
    if not out:
        raise ValueError(f"{setting}: no listener")
    return out


def _protocol_map(value: str) -> dict[str, SecurityProtocol]:
    out: dict[str, SecurityProtocol] = {}
    for item in (part.strip() for part in value.split(",")):
        if not item:
            continue
        name, sep, protocol = item.partition(":")
        name = name.strip().upper()
        if not sep or not _NAME.match(name):
            raise ValueError(
                f"KAFSCALE_LISTENER_SECURITY_PROTOCOL_MAP: {item!r} is not NAME:PROTOCOL"
            )
        try:
            out[name] = SecurityProtocol(protocol.strip().upper())
        except ValueError:
            raise ValueError(
                f"KAFSCALE_LISTENER_SECURITY_PROTOCOL_MAP: {protocol.strip()!r} is not one of "
                + ", ".join(p.value for p in SecurityProtocol)
            ) from None
    return out


def parse(
    listeners: str, advertised: str = "", protocol_map: str = "", broker_host: str = "localhost"
) -> tuple[Listener, ...]:
    """The listeners the settings describe, in the order given. ``broker_host``: what a listener
    bound to every interface advertises when no advertised listener names it."""
    bound = _endpoints("KAFSCALE_LISTENERS", listeners)
    told = _endpoints("KAFSCALE_ADVERTISED_LISTENERS", advertised) if advertised.strip() else {}
    protocols = _protocol_map(protocol_map) if protocol_map.strip() else {}
    for name in told.keys() - bound.keys():
        raise ValueError(f"KAFSCALE_ADVERTISED_LISTENERS: {name} is not in KAFSCALE_LISTENERS")
    out = []
    for name, (host, port) in bound.items():
        if name in protocols:
            protocol = protocols[name]
        elif protocol_map.strip():
            raise ValueError(f"KAFSCALE_LISTENER_SECURITY_PROTOCOL_MAP: no protocol for {name}")
        else:
            try:
                protocol = SecurityProtocol(name)
            except ValueError:
                raise ValueError(
                    f"KAFSCALE_LISTENERS: {name} is not a security protocol; name its protocol "
                    "in KAFSCALE_LISTENER_SECURITY_PROTOCOL_MAP"
                ) from None
        default = (broker_host if host in UNROUTABLE else host, port)
        advertised_host, advertised_port = told.get(name, default)
        if advertised_host in UNROUTABLE:
            raise ValueError(
                f"listener {name}: advertised host {advertised_host!r} is not an address a client "
                "can connect to (set KAFSCALE_ADVERTISED_LISTENERS)"
            )
        out.append(Listener(name, protocol, host, port, advertised_host, advertised_port))
    return tuple(out)
