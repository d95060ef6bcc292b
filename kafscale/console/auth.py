"""Sessions, CSRF tokens and login throttling for the console (docs/design/console.md, section 3).

Pure state with an injected clock: `Sessions` keeps each logged-in session server-side under a
random 256-bit id (the cookie holds only the id), ends it after an idle time or an absolute
lifetime, and gives each its own CSRF token; `Throttle` delays repeated failed logins per client
address and per user name. Nothing here does I/O; the web layer (`console.app`) sets the cookie,
reads the form and answers 403/429.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

COOKIE = "kafscale_session"


@dataclass
class Session:
    id: str = field(repr=False)
    username: str
    csrf: str = field(repr=False)
    created: float
    used: float
    # What the session needs kept with it (auth sasl: the user's Kafka clients); closed with it.
    resources: dict[str, Any] = field(default_factory=dict, repr=False)
    on_close: list[Callable[[], None]] = field(default_factory=list, repr=False)

    def check_csrf(self, token: str | None) -> bool:
        return token is not None and hmac.compare_digest(token.encode(), self.csrf.encode())

    def close(self) -> None:
        for callback in self.on_close:
            callback()
        self.on_close.clear()
        self.resources.clear()


class Sessions:
    """The logged-in sessions. ``get`` returns a live session (and marks it used) or None."""

    def __init__(
        self, idle: float, lifetime: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.idle = idle
        self.lifetime = lifetime
        self.clock = clock
        self._sessions: dict[str, Session] = {}

    def __len__(self) -> int:
        return len(self._sessions)

    def create(self, username: str) -> Session:
        now = self.clock()
        session = Session(
            id=secrets.token_urlsafe(32),
            username=username,
            csrf=secrets.token_urlsafe(32),
            created=now,
            used=now,
        )
        self._sessions[session.id] = session
        self.expire()
        return session

    def get(self, session_id: str | None) -> Session | None:
        if not session_id:
            return None
        session = self._sessions.get(session_id)
        if session is None:
            return None
        now = self.clock()
        if now - session.used > self.idle or now - session.created > self.lifetime:
            self.end(session_id)
            return None
        session.used = now
        return session

    def end(self, session_id: str) -> None:
        session = self._sessions.pop(session_id, None)
        if session is not None:
            session.close()

    def expire(self) -> int:
        """End every session past its idle time or lifetime; how many ended."""
        now = self.clock()
        stale = [
            sid
            for sid, s in self._sessions.items()
            if now - s.used > self.idle or now - s.created > self.lifetime
        ]
        for sid in stale:
            self.end(sid)
        return len(stale)

    def close(self) -> None:
        for sid in list(self._sessions):
            self.end(sid)


def same_secret(given: str, expected: str) -> bool:
    """Constant-time comparison of a typed password with the configured one."""
    return hmac.compare_digest(given.encode(), expected.encode())


class Throttle:
    """Failed logins per key (a client address, a user name): after ``free`` failures each
    further attempt must wait ``base * 2**(failures - free)`` seconds (at most ``ceiling``) after
    the last failure. A success clears the key; keys idle for ``forget`` seconds are dropped."""

    def __init__(
        self,
        free: int = 3,
        base: float = 1.0,
        ceiling: float = 300.0,
        forget: float = 3600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.free = free
        self.base = base
        self.ceiling = ceiling
        self.forget = forget
        self.clock = clock
        self._failures: dict[str, tuple[int, float]] = {}

    def wait(self, *keys: str) -> float:
        """Seconds before another attempt for these keys may be tried (0: now)."""
        now = self.clock()
        longest = 0.0
        for key in keys:
            count, last = self._failures.get(key, (0, 0.0))
            if count >= self.free:
                delay = min(self.ceiling, self.base * 2 ** (count - self.free))
                longest = max(longest, last + delay - now)
        return max(0.0, longest)

    def failed(self, *keys: str) -> None:
        now = self.clock()
        for key in keys:
            count, _ = self._failures.get(key, (0, 0.0))
            self._failures[key] = (count + 1, now)
        if len(self._failures) > 10_000:  # a flood of keys: forget the stale ones
            self._failures = {k: v for k, v in self._failures.items() if now - v[1] < self.forget}

    def succeeded(self, *keys: str) -> None:
        for key in keys:
            self._failures.pop(key, None)
