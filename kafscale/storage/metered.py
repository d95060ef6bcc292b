"""An object store that counts what it does: requests by operation, bytes and latency of GETs.

Wraps any backend (``kafscale.storage.objects.ObjectStore``); the broker's processes use it so
``/metrics`` shows how often and how much the read path goes to S3 (the figures behind the cache
hit ratio, and what the S3 bill is made of).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from kafscale import metrics
from kafscale.storage.objects import DELETE_BATCH, ObjectInfo, ObjectStore


class MeteredObjectStore:
    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner

    @property
    def description(self) -> str:
        return self.inner.description

    def put_if_absent(self, key: str, data: bytes | memoryview) -> bool:
        metrics.S3_REQUESTS.labels("put").inc()
        return self.inner.put_if_absent(key, data)

    def get(self, key: str, start: int = 0, length: int | None = None) -> bytes:
        metrics.S3_REQUESTS.labels("get").inc()
        started = time.perf_counter()
        data = self.inner.get(key, start, length)
        metrics.S3_GET_SECONDS.observe(time.perf_counter() - started)
        metrics.S3_GET_BYTES.inc(len(data))
        return data

    def size(self, key: str) -> int:
        metrics.S3_REQUESTS.labels("head").inc()
        return self.inner.size(key)

    def list(self, prefix: str) -> list[ObjectInfo]:
        metrics.S3_REQUESTS.labels("list").inc()
        return self.inner.list(prefix)

    def delete(self, key: str) -> None:
        metrics.S3_REQUESTS.labels("delete").inc()
        self.inner.delete(key)

    def delete_many(self, keys: Sequence[str]) -> None:
        # one DeleteObjects request per batch on S3
        metrics.S3_REQUESTS.labels("delete").inc(-(-len(keys) // DELETE_BATCH))
        self.inner.delete_many(keys)

    def check(self) -> None:
        self.inner.check()

    def close(self) -> None:
        self.inner.close()
