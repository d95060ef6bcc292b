"""Who a new connection is, and how it may authenticate (docs/design/security.md, sections 3-4).

``new_session`` gives each accepted connection its ``Session``: the listener it came in on and an
``Authentication`` state machine. On a PLAINTEXT or SSL listener the connection starts
authenticated, as ``User:ANONYMOUS`` or, on SSL with a verified client certificate, as that
certificate's subject (Kafka's default principal builder). On SASL_PLAINTEXT and SASL_SSL it
starts unauthenticated with the mechanisms of ``KAFSCALE_SASL_ENABLED_MECHANISMS``, whose
credentials are looked up in this process's metadata view (``users/``) at the moment of each
exchange: a credential altered or deleted applies to the next (re-)authentication.

Unknown SCRAM users get a made-up salt that is stable within this process (``_SECRET``), so the
exchange looks the same as for a real user with a wrong password.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from kafscale.frontend.context import ANONYMOUS, Broker, Session
from kafscale.protocol.sasl import Authentication, MechanismFactory
from kafscale.security import mechanisms
from kafscale.security.listeners import Listener
from kafscale.security.mechanisms import PlainExchange, ScramCredential, ScramExchange
from kafscale.security.tls import principal

_SECRET = os.urandom(32)


def new_session(
    broker: Broker, listener: Listener, peer_certificate: dict[str, object] | None
) -> Session:
    sasl = listener.protocol.sasl
    anonymous = principal(peer_certificate) if listener.protocol.tls else ANONYMOUS
    auth = Authentication(
        sasl,
        enabled_mechanisms(broker) if sasl else {},
        broker.config.connections_max_reauth_ms,
        anonymous,
    )
    return Session(listener.name, auth)


def enabled_mechanisms(broker: Broker) -> dict[str, MechanismFactory]:
    lookup = credential_lookup(broker)
    out: dict[str, MechanismFactory] = {}
    for name in broker.config.sasl_enabled_mechanisms:
        if name == "PLAIN":
            out[name] = lambda: PlainExchange(lookup)
        else:
            out[name] = _scram(name, lookup)
    return out


def _scram(name: str, lookup: mechanisms.Lookup) -> MechanismFactory:
    return lambda: ScramExchange(name, lookup, _SECRET)


def credential_lookup(broker: Broker) -> Callable[[str, str], ScramCredential | None]:
    def lookup(user: str, mechanism: str) -> ScramCredential | None:
        record = broker.view.snapshot.credentials.get((user, mechanism))
        if record is None:
            return None
        return ScramCredential(record.salt, record.stored_key, record.server_key, record.iterations)

    return lookup
