"""Whether a shard takes appends now: its buffer budget and the health of the write path.

Pure (the time is passed in). Appends are refused at once, with a retriable error, while the
shard's buffers hold its whole budget, while a partition's data failed to commit for a storage
reason (until that partition commits again), for a while after an upload or a cycle ran slow
(a paused S3 answers nothing, so slowness is seen before any answer), and while the shard stops.
"""

from __future__ import annotations

from collections.abc import Iterable

SLOW_PENALTY_MS = 2_000  # how long a slow upload keeps produce refused

Key = tuple[str, int]  # (topic, partition)


class Admission:
    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.unflushed = 0  # bytes appended and not yet committed
        self.failing: set[Key] = set()  # partitions whose last attempt failed in the stores
        self.slow_until_ms = 0
        self.stopping = False

    def refusal(self, now_ms: int, size: int) -> str | None:
        """Why an append of ``size`` bytes must be refused now, or None."""
        if self.stopping:
            return "the shard is stopping; retry later"
        if self.failing:
            return "the object store or metadata store is failing; retry later"
        if now_ms < self.slow_until_ms:
            return "the object store is slow; retry later"
        if self.unflushed + size > self.budget:
            return f"the shard's buffers are full ({self.unflushed} bytes unflushed)"
        return None

    def healthy(self, now_ms: int) -> bool:
        return not self.failing and now_ms >= self.slow_until_ms

    def failed(self, keys: Iterable[Key]) -> None:
        """These partitions' data failed to commit for a storage reason (or went unanswered)."""
        self.failing.update(keys)

    def recovered(self, key: Key) -> None:
        """The partition committed (or is gone): it no longer holds produce back."""
        self.failing.discard(key)

    def slow(self, now_ms: int) -> bool:
        """The stores are slow now: refuse for ``SLOW_PENALTY_MS``. True if they were not."""
        was_slow = now_ms < self.slow_until_ms
        self.slow_until_ms = now_ms + SLOW_PENALTY_MS
        return not was_slow
