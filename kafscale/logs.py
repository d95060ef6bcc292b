"""Structured logging: one JSON object per line on stderr, from every process.

Each line carries the time, level, the process (``frontend-0``, ``shard-1``, ``supervisor``), its
pid, the message, and any ``extra={...}`` fields the caller gave.

Invariant: no line holds a configured credential. ``setup`` is given the credentials' values
(``Config.secret_values``) and every formatted line -- message, fields, exception text from any
library (a boto3 error, a traceback) -- has each of them replaced by ``***`` before it is written.
Uncaught exceptions (main thread and other threads) go through the same formatter, so they too
are one masked JSON line instead of a raw traceback.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Iterable
from types import TracebackType
from typing import Any

import msgspec

_STANDARD_ATTRS = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message"}

MASK = "***"
# A value this short cannot be told apart from ordinary text ("k" would mask every k): it is
# masked in the configuration dump only. Real credentials are far longer (AWS: 20 and 40).
MIN_MASKED_LENGTH = 4


class JsonFormatter(logging.Formatter):
    def __init__(self, process_name: str, secrets: Iterable[str] = ()) -> None:
        super().__init__()
        self.process_name = process_name
        # Longest first, so a secret that contains another is masked whole. Each is matched as
        # it appears inside a JSON string (escaped), since the line is masked after encoding.
        self._masked = [
            _encoder.encode(secret)[1:-1].decode()
            for secret in sorted(set(secrets), key=len, reverse=True)
            if len(secret) >= MIN_MASKED_LENGTH
        ]

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "process": self.process_name,
            "pid": record.process or os.getpid(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD_ATTRS and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        line = _encoder.encode(entry).decode("utf-8", "replace")
        for secret in self._masked:
            line = line.replace(secret, MASK)
        return line


def setup(process_name: str, level: str, secrets: Iterable[str] = ()) -> None:
    """Send all logging of this process to stderr as JSON lines at ``level``, with every value in
    ``secrets`` masked; uncaught exceptions are logged the same way. SIGQUIT (``kill -3``, as
    for a JVM's thread dump) writes every thread's stack to stderr as plain text and the
    process goes on: how to see where a hung broker process is stuck."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(process_name, secrets))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("botocore", "boto3", "urllib3", "s3transfer", "asyncio"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
    sys.excepthook = _log_uncaught
    threading.excepthook = _log_uncaught_in_thread
    faulthandler.register(signal.SIGQUIT, all_threads=True)


def _log_uncaught(
    kind: type[BaseException], value: BaseException, traceback: TracebackType | None
) -> None:
    logging.getLogger("kafscale").critical("uncaught exception", exc_info=(kind, value, traceback))


def _log_uncaught_in_thread(args: threading.ExceptHookArgs) -> None:
    if args.exc_type is SystemExit:
        return  # as threading's own hook: a thread that calls sys.exit() just ends
    thread = args.thread.name if args.thread is not None else "?"
    logging.getLogger("kafscale").error(
        "uncaught exception in a thread",
        extra={"thread_name": thread},
        exc_info=(args.exc_type, args.exc_value or args.exc_type(), args.exc_traceback),
    )


def _default(value: object) -> object:
    return str(value)


_encoder = msgspec.json.Encoder(enc_hook=_default)
