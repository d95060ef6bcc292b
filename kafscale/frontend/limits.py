"""Connection limits of the frontend as pure state: who may connect, who has idled too long, and
how often a refusal may be logged.

- ``ConnectionQuotas`` is Kafka's ``ConnectionQuotas``: open connections counted in total and per
  client address. The listener asks ``has_slot`` before accepting (at ``max_connections`` it stops
  accepting, so new clients wait in the listen backlog, as Kafka's acceptor does) and ``admit`` once
  it knows the client's address (over ``max_connections_per_ip`` the connection is closed at once).
  Invariant: ``total`` and the per-address counts are exactly the connections admitted and not yet
  released, and never exceed their limits.
- ``IdleExpiry`` is Kafka's ``connections.max.idle.ms``: a connection expires once it has had no
  request in progress and received no bytes (nor finished writing a response) for ``max_idle``
  seconds. A connection with a request in progress, a parked long-poll Fetch included, is never
  idle. Connections not busy are kept in order of last activity, so finding the expired ones
  costs only as many steps as there are expired ones (plus one).
- ``LogLimiter`` lets a flood of refusals log one line per key per interval, with the number of
  lines it held back, in bounded memory.

Nothing here reads a clock or touches a socket: every method that needs the time is given ``now``
(seconds, monotonic).
"""

from __future__ import annotations

import enum
import ipaddress
from collections import OrderedDict
from collections.abc import Hashable, Mapping
from typing import Generic, TypeVar


def address_key(host: str) -> str:
    """The address connections are counted under: an IP address in its canonical text form, with
    an IPv4 address seen through a dual-stack IPv6 socket (``::ffff:10.0.0.1``) counted as IPv4."""
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(address)


class Admission(enum.Enum):
    ADMITTED = "admitted"
    OVER_MAX_CONNECTIONS = "max_connections"
    OVER_MAX_CONNECTIONS_PER_IP = "max_connections_per_ip"


class ConnectionQuotas:
    def __init__(
        self,
        max_connections: int,
        max_connections_per_ip: int,
        overrides: Mapping[str, int] | None = None,
    ) -> None:
        self.max_connections = max_connections
        self.max_connections_per_ip = max_connections_per_ip
        self.overrides = {address_key(host): count for host, count in (overrides or {}).items()}
        self.total = 0
        self._per_address: dict[str, int] = {}

    def has_slot(self) -> bool:
        return self.total < self.max_connections

    def count(self, address: str) -> int:
        return self._per_address.get(address, 0)

    def limit_for(self, address: str) -> int:
        return self.overrides.get(address, self.max_connections_per_ip)

    def admit(self, address: str) -> Admission:
        """Count a new connection from ``address`` (an ``address_key``) if both limits allow."""
        if not self.has_slot():
            return Admission.OVER_MAX_CONNECTIONS
        count = self._per_address.get(address, 0)
        if count >= self.limit_for(address):
            return Admission.OVER_MAX_CONNECTIONS_PER_IP
        self._per_address[address] = count + 1
        self.total += 1
        return Admission.ADMITTED

    def release(self, address: str) -> None:
        """Forget an admitted connection that closed."""
        count = self._per_address[address]
        if count == 1:
            del self._per_address[address]
        else:
            self._per_address[address] = count - 1
        self.total -= 1


K = TypeVar("K", bound=Hashable)


class IdleExpiry(Generic[K]):
    """``max_idle`` in seconds; None never expires anything (Kafka's -1)."""

    def __init__(self, max_idle: float | None) -> None:
        self.max_idle = max_idle
        self._idle_since: OrderedDict[K, float] = OrderedDict()  # not busy, oldest first
        self._busy: dict[K, int] = {}  # requests in progress, for connections that have some

    def opened(self, key: K, now: float) -> None:
        self._idle_since[key] = now

    def active(self, key: K, now: float) -> None:
        """Bytes arrived from the client, or a response was written: restart its idle clock."""
        if key in self._idle_since:
            self._idle_since[key] = now
            self._idle_since.move_to_end(key)

    def request_started(self, key: K) -> None:
        busy = self._busy.get(key, 0)
        if busy == 0:
            self._idle_since.pop(key, None)
        self._busy[key] = busy + 1

    def request_finished(self, key: K, now: float) -> None:
        if key not in self._busy:  # closed meanwhile
            return
        busy = self._busy.pop(key) - 1
        if busy > 0:
            self._busy[key] = busy
        else:
            self._idle_since[key] = now
            self._idle_since.move_to_end(key)

    def closed(self, key: K) -> None:
        self._idle_since.pop(key, None)
        self._busy.pop(key, None)

    def expired(self, now: float) -> list[K]:
        """Connections idle for ``max_idle`` or longer; each is reported once (it is forgotten
        until ``opened`` again), so the caller closes it."""
        if self.max_idle is None:
            return []
        found: list[K] = []
        while self._idle_since:
            key, since = next(iter(self._idle_since.items()))
            if now - since < self.max_idle:
                break
            del self._idle_since[key]
            found.append(key)
        return found

    def next_expiry(self) -> float | None:
        """When the oldest idle connection expires if nothing happens meanwhile."""
        if self.max_idle is None or not self._idle_since:
            return None
        return next(iter(self._idle_since.values())) + self.max_idle

    def is_busy(self, key: K) -> bool:
        return key in self._busy


OTHER_KEYS = "(other)"


class LogLimiter:
    """At most one log line per key per ``interval`` seconds.

    ``allow`` answers None while a key's window is open (the event is counted), and otherwise the
    number of events held back since the key's last line. At most ``max_keys`` keys are tracked:
    past that, expired windows are dropped (with their counts) and, if every window is still open,
    new keys share the one key ``OTHER_KEYS``: a flood from many addresses cannot grow this."""

    def __init__(self, interval: float, max_keys: int = 1024) -> None:
        self.interval = interval
        self.max_keys = max_keys
        self._windows: dict[str, tuple[float, int]] = {}  # key -> (window start, held back)

    def allow(self, key: str, now: float) -> int | None:
        window = self._windows.get(key)
        if window is None and len(self._windows) >= self.max_keys:
            self._drop_expired(now)
            if len(self._windows) >= self.max_keys:
                key = OTHER_KEYS
                window = self._windows.get(key)
        if window is not None and now - window[0] < self.interval:
            self._windows[key] = (window[0], window[1] + 1)
            return None
        self._windows[key] = (now, 0)
        return 0 if window is None else window[1]

    def _drop_expired(self, now: float) -> None:
        for key in [k for k, (start, _) in self._windows.items() if now - start >= self.interval]:
            del self._windows[key]
