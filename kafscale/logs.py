"""Structured logging: one JSON object per line on stderr, from every process.

Each line carries the time, level, the process (``frontend-0``, ``shard-1``, ``supervisor``), its
pid, the message, and any ``extra={...}`` fields the caller gave.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any

import msgspec

_STANDARD_ATTRS = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message"}


class JsonFormatter(logging.Formatter):
    def __init__(self, process_name: str) -> None:
        super().__init__()
        self.process_name = process_name

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
        return _encoder.encode(entry).decode("utf-8", "replace")


def setup(process_name: str, level: str) -> None:
    """Send all logging of this process to stderr as JSON lines at ``level``."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(process_name))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("botocore", "boto3", "urllib3", "s3transfer", "asyncio"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))


def _default(value: object) -> object:
    return str(value)


_encoder = msgspec.json.Encoder(enc_hook=_default)
