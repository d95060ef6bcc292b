"""A shard's side of the flush cycles: which cycle holds which sealed buffer, what a cycle's
results mean, and when to tell the flusher what is pending.

Pure: no I/O and no clock (times come in as wall-clock milliseconds, the clock of
``ShardPending``). ``kafscale.shards.process`` feeds the events in and does the I/O
(docs/design/write-path.md, sections 4 and 5).

``Holds``: a sealed buffer is *held* by a cycle from the ``Cut`` that handed it to the flusher
until its result comes, its cycle is answered without naming it, or its cycle times out. A
buffer no cycle holds, and every open buffer, is *pending*: the next cut hands it over.

- A buffer is held by at most one cycle; ``held_bytes`` is the sum of the held buffers' sizes.
- A result is acted on only if its cycle still holds the buffer; otherwise a later cycle took
  the buffer (or will): its own result decides.
- A buffer that did not commit is released with every later buffer of its partition, whichever
  cycle holds them: their commits would be refused for not starting at the high watermark, so
  they are all offered again, in offset order, at the next cut.

``PendingReport``: the ``ShardPending`` notices. One is sent when pending bytes appear (after a
cut took everything), when an acks=all request or a flush starts waiting on pending bytes, when
the pending bytes cross another quarter of ``KAFSCALE_OBJECT_BYTES``, and again every
``RESEND_MS`` while bytes stay pending (a notice sent while the flusher restarted is lost, and
the flusher forgets a report once it cut the shard). Not on every append, and not while backing
off after cycles that failed (a store that is down is not retried in a tight loop).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from kafscale.ipc.write_path import ShardPending

# A cycle unanswered this long after its cut is presumed lost with its flusher: its buffers are
# released, and the flusher's successor gets them at its first cut.
FLUSH_TIMEOUT_MS = 10_000
RESEND_MS = 1_000
# After a cycle that did not commit, the shard waits before reporting again (so before the
# flusher cuts its data again): RETRY_MS more per failure in a row, at most MAX_RETRY_MS.
RETRY_MS = 500
MAX_RETRY_MS = 5_000

Key = tuple[str, int]  # (topic, partition)


class Buffer(Protocol):
    """What the holds need of a sealed buffer (``kafscale.shards.partition.BufferedSegment``)."""

    @property
    def base_offset(self) -> int: ...

    @property
    def size(self) -> int: ...


B = TypeVar("B", bound=Buffer)


class Outcome(enum.Enum):
    COMMITTED = "committed"  # the hold ended: free the buffer (the high watermark moved)
    RELEASED = "released"  # the buffer and the partition's later ones are pending again
    IGNORED = "ignored"  # the cycle no longer holds the buffer: nothing to do


@dataclass
class _Cycle:
    cut_ms: int
    held: set[tuple[Key, int]] = field(default_factory=set)  # (partition, base offset)


class Holds:
    """The cycles between ``Cut`` and ``ObjectCommitted``, and the buffers each holds."""

    def __init__(self, timeout_ms: int = FLUSH_TIMEOUT_MS) -> None:
        self.timeout_ms = timeout_ms
        self.held_bytes = 0
        self._cycles: dict[int, _Cycle] = {}
        self._holds: dict[Key, dict[int, tuple[int, int]]] = {}  # base -> (cycle, size)

    def holder(self, key: Key, base_offset: int) -> int | None:
        """The cycle holding the buffer, if one does."""
        hold = self._holds.get(key, {}).get(base_offset)
        return None if hold is None else hold[0]

    def oldest_cut_ms(self) -> int | None:
        """When the oldest cycle still unanswered was cut (None: none is)."""
        return min((c.cut_ms for c in self._cycles.values()), default=None)

    def cut(
        self, cycle: int, now_ms: int, offered: Iterable[tuple[Key, Iterable[B]]]
    ) -> list[tuple[Key, B]]:
        """The flusher cut ``cycle``: every offered buffer no cycle holds is now held by it and
        handed over, in the order offered (each partition's buffers in offset order)."""
        state = self._cycles.setdefault(cycle, _Cycle(now_ms))
        # A cycle number seen again is a new flusher counting from where a dead one did: its
        # buffers stay held until this cycle is answered, which releases what it did not name.
        state.cut_ms = now_ms
        taken = self._take(cycle, state, offered)
        if not state.held:
            # Nothing handed over: the flusher answers only the shards its object holds, so a
            # cycle kept here would wait for an answer that never comes (and, after
            # KAFSCALE_S3_LATENCY_THRESHOLD_MS, count as a slow store and refuse produce).
            del self._cycles[cycle]
        return taken

    def _take(
        self, cycle: int, state: _Cycle, offered: Iterable[tuple[Key, Iterable[B]]]
    ) -> list[tuple[Key, B]]:
        taken = []
        for key, buffers in offered:
            holds = self._holds.setdefault(key, {})
            for buffer in buffers:
                if buffer.base_offset in holds:
                    continue
                holds[buffer.base_offset] = (cycle, buffer.size)
                state.held.add((key, buffer.base_offset))
                self.held_bytes += buffer.size
                taken.append((key, buffer))
            if not holds:
                del self._holds[key]
        return taken

    def settle(self, cycle: int, key: Key, base_offset: int, committed: bool) -> Outcome:
        """One result of cycle ``cycle``: what it means for the buffer at ``base_offset``."""
        if self.holder(key, base_offset) != cycle:
            return Outcome.IGNORED
        if committed:
            self._unhold(key, base_offset)
            return Outcome.COMMITTED
        for base in [b for b in self._holds[key] if b >= base_offset]:
            self._unhold(key, base)
        return Outcome.RELEASED

    def freed(self, key: Key, base_offset: int) -> None:
        """The buffer is gone (committed, whichever answer said so): no cycle holds it now."""
        if self.holder(key, base_offset) is not None:
            self._unhold(key, base_offset)

    def answered(self, cycle: int) -> set[Key]:
        """Every result of ``cycle`` is in: it ends, and releases what it still holds (a buffer
        its answer did not name). Returns the partitions of those buffers."""
        return self._end(cycle)

    def expire(self, now_ms: int) -> list[tuple[int, set[Key]]]:
        """End the cycles unanswered ``timeout_ms`` after their cut, releasing their buffers:
        each cycle with the partitions it held."""
        lost = [n for n, c in self._cycles.items() if now_ms - c.cut_ms >= self.timeout_ms]
        return [(n, self._end(n)) for n in lost]

    def forget(self, key: Key) -> None:
        """The partition's buffers are gone (the topic was deleted or re-created)."""
        for base in list(self._holds.get(key, {})):
            self._unhold(key, base)

    def _end(self, cycle: int) -> set[Key]:
        state = self._cycles.pop(cycle, None)
        if state is None:
            return set()
        keys = {key for key, _ in state.held}
        for key, base in list(state.held):
            self._unhold(key, base)
        return keys

    def _unhold(self, key: Key, base_offset: int) -> None:
        holds = self._holds[key]
        cycle, size = holds.pop(base_offset)
        if not holds:
            del self._holds[key]
        self.held_bytes -= size
        state = self._cycles.get(cycle)
        if state is not None:
            state.held.discard((key, base_offset))


class PendingReport:
    """Decides when the shard sends ``ShardPending`` (see the module docstring)."""

    def __init__(self, shard: int, object_bytes: int, resend_ms: int = RESEND_MS) -> None:
        self.shard = shard
        self.quarter = max(object_bytes // 4, 1)
        self.resend_ms = resend_ms
        self._failures = 0
        self._quiet_until_ms = 0
        self._reset()

    def _reset(self) -> None:
        self._sent = False  # since pending bytes last appeared
        self._quarters = 0
        self._urgent_ms = -1
        self._urgent_sent = False
        self._sent_ms = 0

    def cut(self) -> None:
        """A cut took every pending byte: what comes next is news to the flusher, which forgot
        this shard's report when it cut it."""
        self._reset()

    def urgent(self, since_ms: int) -> None:
        """An acks=all request or a flush waits, since ``since_ms``, on pending bytes."""
        if self._urgent_ms < 0 or since_ms < self._urgent_ms:
            self._urgent_ms = since_ms
            self._urgent_sent = False

    def failed(self, now_ms: int) -> None:
        """A cycle gave buffers back (not committed, or unanswered): report again only later."""
        self._failures += 1
        self._quiet_until_ms = now_ms + min(RETRY_MS * self._failures, MAX_RETRY_MS)

    def succeeded(self) -> None:
        """A cycle committed some of the shard's buffers: no more backing off."""
        self._failures, self._quiet_until_ms = 0, 0

    def report(
        self, now_ms: int, pending_bytes: int, oldest_ms: Callable[[], int]
    ) -> ShardPending | None:
        """The notice to send now, if one is due; ``oldest_ms`` (the first append time of the
        oldest pending byte) is asked only then."""
        if pending_bytes <= 0:
            self._reset()
            return None
        if now_ms < self._quiet_until_ms:
            return None
        quarters = pending_bytes // self.quarter
        due = (
            not self._sent
            or quarters > self._quarters
            or (self._urgent_ms >= 0 and not self._urgent_sent)
            or now_ms - self._sent_ms >= self.resend_ms
        )
        if not due:
            return None
        self._sent, self._sent_ms = True, now_ms
        self._quarters = quarters
        self._urgent_sent = self._urgent_ms >= 0
        return ShardPending(self.shard, pending_bytes, oldest_ms(), self._urgent_ms)
