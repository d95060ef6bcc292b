"""A Kafka admin session over confluent-kafka's AdminClient, shared by the operator
(`kafscale.operator.admin`) and the console (`kafscale.console.kafka`).

librdkafka's futures block, so a session is used from one thread (callers run it with
``asyncio.to_thread``). Every call waits at most the connection's timeout, and fails at once when
librdkafka reports on the side that waiting cannot help (a refused login, a certificate not
trusted). Every failure is an `AdminError` whose message says what was being done and what the
broker or librdkafka answered, never a password.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ScramMechanism

POLL_INTERVAL = 0.1  # seconds between looks at librdkafka's side errors while a call waits
# Side errors (error_cb) no waiting cures: said at once, not after the call's timeout.
FATAL = frozenset({KafkaError._AUTHENTICATION, KafkaError._SSL})
MECHANISMS = {
    "SCRAM-SHA-256": ScramMechanism.SCRAM_SHA_256,
    "SCRAM-SHA-512": ScramMechanism.SCRAM_SHA_512,
}
MECHANISM_NAMES = {value: key for key, value in MECHANISMS.items()}


@dataclass(frozen=True)
class Connection:
    bootstrap: str  # host:port, already address-mapped
    security_protocol: str  # PLAINTEXT | SSL | SASL_PLAINTEXT | SASL_SSL
    sasl_mechanism: str | None  # SCRAM-SHA-512 | SCRAM-SHA-256 | PLAIN
    username: str | None
    password: str | None = field(repr=False)  # never in a log line
    ca_pem: bytes | None = field(repr=False)  # the CA to trust for TLS
    timeout: float = 30.0  # seconds per admin call


class AdminError(Exception):
    """An admin call failed; ``retriable``: trying again later may succeed; ``code``: Kafka's
    (or librdkafka's) error name, "" for no answer."""

    def __init__(self, message: str, retriable: bool = True, code: str = "") -> None:
        super().__init__(message)
        self.retriable = retriable
        self.code = code


def as_error(what: str, exc: BaseException) -> AdminError:
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        error: KafkaError = exc.args[0]
        return AdminError(
            f"{what}: {error.name()}: {error.str()}", bool(error.retriable()), error.name()
        )
    return AdminError(f"{what}: {type(exc).__name__}: {exc}")


class _Debug:
    """librdkafka's log, served by poll(), at debug: what it logs as errors (a refused
    connection, at every reconnect) is said once in the AdminError instead."""

    def __init__(self) -> None:
        self.logger = logging.getLogger("kafscale.librdkafka")

    def log(self, level: int, message: str, *args: object) -> None:
        self.logger.debug(message, *args)


_LIBRDKAFKA_LOG = _Debug()


def broker_answered(exc: AdminError) -> bool:
    """The broker answered with an error (librdkafka's own errors start with "_")."""
    return bool(exc.code) and not exc.code.startswith("_")


class _SideErrors:
    """librdkafka's error_cb: what it reported besides the calls' results. Not the session's
    method: the client would hold its session and the session its client, a cycle that keeps
    librdkafka's threads alive until the garbage collector runs."""

    def __init__(self) -> None:
        self.last: KafkaError | None = None
        self.fatal: KafkaError | None = None

    def __call__(self, error: KafkaError) -> None:
        self.last = error
        if error.code() in FATAL:
            self.fatal = error


class Session:
    """One AdminClient, used for one piece of work and dropped with the session."""

    def __init__(self, conn: Connection, client_id: str = "kafscale-admin") -> None:
        self.conn = conn
        self.timeout = conn.timeout
        self._side = _SideErrors()
        self._ca_path: str | None = None
        config: dict[str, Any] = {
            "bootstrap.servers": conn.bootstrap,
            "security.protocol": conn.security_protocol.lower(),
            "socket.timeout.ms": max(1000, int(conn.timeout * 1000)),
            "client.id": client_id,
            "error_cb": self._side,
            "logger": _LIBRDKAFKA_LOG,
        }
        if conn.sasl_mechanism:
            config["sasl.mechanisms"] = conn.sasl_mechanism
            config["sasl.username"] = conn.username or ""
            config["sasl.password"] = conn.password or ""
        if conn.ca_pem:
            # librdkafka reads a CA from a file: a private one (mkstemp: mode 0600), removed
            # when the session ends.
            handle, self._ca_path = tempfile.mkstemp(prefix="kafscale-admin-ca-", suffix=".pem")
            with os.fdopen(handle, "wb") as out:
                out.write(conn.ca_pem)
            config["ssl.ca.location"] = self._ca_path
        try:
            self.client: Any = AdminClient(config)
        except KafkaException as exc:
            self.close()
            raise as_error(f"connecting to {conn.bootstrap}", exc) from None

    def close(self) -> None:
        self.client = None  # librdkafka's threads end with it, whoever holds the session
        if self._ca_path is not None:
            os.unlink(self._ca_path)
            self._ca_path = None

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def wait(self, future: Future[Any], what: str) -> Any:
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                return future.result(timeout=POLL_INTERVAL)
            except TimeoutError:
                pass
            except Exception as exc:
                error = as_error(what, exc)
                if error.code.startswith("_"):  # librdkafka's own (a timeout): say why
                    self.client.poll(0)
                    error = AdminError(f"{error}{self._last()}", True, error.code)
                raise error from None
            self.client.poll(0)  # serves error_cb and the log
            fatal = self._side.fatal
            if fatal is not None:
                raise AdminError(f"{what}: {fatal.str()}", True, fatal.name())
            if time.monotonic() >= deadline:
                raise AdminError(f"{what}: no answer in {self.timeout:g} s{self._last()}")

    def _last(self) -> str:
        last = self._side.last
        return f" (last error: {last.str()})" if last is not None else ""

    def wait_all(self, futures: Iterable[Future[Any]], what: str) -> list[Any]:
        return [self.wait(future, what) for future in futures]
