"""Stored data that cannot be read: said once per object, counted every time, never fatal.

Read paths (Fetch, ListOffsets, retention, recovery, ``segments dump``, the Spark reader) can meet
batches no KafScale broker validated: written by an older version or by another implementation of
the format. Each contains the fault to the request or the segment at hand and goes on; this is
how it says so. The first time an object is found faulty in a process it is logged as an error
naming the object and the fault; later occurrences (a client retrying every 100 ms) are logged at
debug level only, so the log shows each bad object once rather than a flood. Every occurrence is
counted (``kafscale_read_faults_total{path}`` in the broker). The set of objects already reported
is bounded: past ``remember`` entries the oldest are forgotten (and may be reported again).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable

REMEMBERED = 4096


class FaultLog:
    """Reports faulty objects of one read path (``path``: fetch, list_offsets, retention, ...)."""

    def __init__(
        self,
        logger: logging.Logger,
        path: str,
        count: Callable[[], None] | None = None,
        remember: int = REMEMBERED,
    ) -> None:
        self._log = logger
        self.path = path
        self._count = count
        self._remember = remember
        self._seen: OrderedDict[str, None] = OrderedDict()

    def report(self, key: str, fault: str, **extra: object) -> bool:
        """Log ``fault`` of object ``key``: as an error the first time, else at debug level.
        True if this was the first time."""
        if self._count is not None:
            self._count()
        first = key not in self._seen
        if first:
            self._seen[key] = None
            if len(self._seen) > self._remember:
                self._seen.popitem(last=False)
        else:
            self._seen.move_to_end(key)
        fields = {"key": key, "error": fault, "path": self.path, **extra}
        if first:
            self._log.error("stored data cannot be read; this request gets an error", extra=fields)
        else:
            self._log.debug("stored data cannot be read (reported before)", extra=fields)
        return first
