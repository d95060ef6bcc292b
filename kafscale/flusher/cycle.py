"""The flush cycle state machine: when to cut a write-ahead object, and in which order to commit.

Pure: no I/O and no clock. The flusher process (``kafscale.flusher.process``) feeds it events,
with the time in wall-clock milliseconds (the clock of ``ShardPending.oldest_ms``), and carries
out the instructions it returns (docs/design/write-path.md, sections 4 and 5)::

    pending(report, now)         a shard's ShardPending notice     -> maybe SendCut
    tick(now)                    time passed                       -> SendCut, or a cut times out
    cut_answered(n, shard, ...)  a shard's CutEntries              -> Build when all answered
    uploaded(n, ok, ...)         the object of cycle n is in S3    -> Commit, or Answer (failure)
    committed(n, results)        the coordinator answered cycle n  -> Answer, then the next Commit

A cycle is cut when, over the shards not already being cut, the oldest pending byte is
``flush_interval_ms`` old, the pending bytes reach ``object_bytes``, or an acks=all request (a
flush) has waited ``group_commit_ms``; and fewer than ``max_in_flight`` cycles are between cut
and commit. Invariants:

- ``Commit(n)`` is issued only after cycle n's upload succeeded and every earlier cycle finished
  (committed, failed, or gathered nothing), so commits go strictly in cycle order, one at a time.
- Every entry a shard handed over is answered exactly once: after its cycle's commit, when its
  cycle's upload failed, or at once when it arrived after its cycle stopped waiting for it.
- A shard that has not answered within ``cut_timeout_ms`` is left out of the cycle; its report
  is dropped (it reports again, or its successor does), so a dead shard delays one cycle only.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field

from kafscale.ipc.write_path import EntryResult, ShardPending, WalEntry

CUT_TIMEOUT_MS = 1000  # a shard that has not answered a cut by then is left out of the cycle


@dataclass(frozen=True, slots=True)
class SendCut:
    """Ask ``shards`` for their sealed buffers (``Cut(cycle)``); ``reason`` is the trigger."""

    cycle: int
    shards: tuple[int, ...]
    reason: str


@dataclass(frozen=True, slots=True)
class Build:
    """Build cycle ``cycle``'s object from ``entries`` and upload it (on a worker); then report
    ``uploaded``. ``created_ms`` is when the cycle was cut (the object header's)."""

    cycle: int
    entries: tuple[WalEntry, ...]
    created_ms: int


@dataclass(frozen=True, slots=True)
class Commit:
    """Commit cycle ``cycle``'s uploaded object; then report ``committed`` with one result per
    entry of its ``Build``, in the same order."""

    cycle: int


@dataclass(frozen=True, slots=True)
class Answer:
    """Tell ``shard`` the outcome of its entries in ``cycle`` (``ObjectCommitted``)."""

    cycle: int
    shard: int
    results: list[EntryResult]


Instruction = SendCut | Build | Commit | Answer


class Phase(enum.Enum):
    CUTTING = "cutting"  # waiting for the shards' CutEntries
    BUILDING = "building"  # building and uploading the object
    UPLOADED = "uploaded"  # in S3, waiting for earlier cycles to finish
    COMMITTING = "committing"  # the coordinator is committing it


@dataclass
class _Cycle:
    number: int
    cut_ms: int
    cut_seq: int  # reports received before this (sequence number) are covered by the cut
    waiting: set[int]
    entries: dict[int, list[WalEntry]] = field(default_factory=dict)  # by shard
    phase: Phase = Phase.CUTTING

    def owners(self) -> list[tuple[int, WalEntry]]:
        """(shard, entry) in ``Build`` order: by shard, each shard's entries as it gave them."""
        return [(shard, entry) for shard in sorted(self.entries) for entry in self.entries[shard]]


@dataclass(frozen=True, slots=True)
class _Report:
    pending: ShardPending
    seq: int


def failed(entry: WalEntry, error: str, storage_error: bool) -> EntryResult:
    """The result of an entry that was not committed (its shard offers it again)."""
    return EntryResult(
        topic=entry.topic,
        partition=entry.partition,
        base_offset=entry.base_offset,
        committed=False,
        error=error,
        storage_error=storage_error,
    )


@dataclass(frozen=True, slots=True)
class Limits:
    flush_interval_ms: int
    object_bytes: int
    group_commit_ms: int
    max_in_flight: int
    cut_timeout_ms: int = CUT_TIMEOUT_MS


def due(reports: Sequence[ShardPending], now: int, limits: Limits) -> str | None:
    """Why a cycle should be cut now over ``reports`` ("age", "bytes", "urgent"), or None."""
    if sum(max(r.bytes, 0) for r in reports) >= limits.object_bytes:
        return "bytes"
    urgent = [r.urgent_ms for r in reports if r.urgent_ms >= 0]
    if urgent and now - min(urgent) >= limits.group_commit_ms:
        return "urgent"
    oldest = [r.oldest_ms for r in reports if r.oldest_ms >= 0 and r.bytes > 0]
    if oldest and now - min(oldest) >= limits.flush_interval_ms:
        return "age"
    return None


class Cycles:
    """The cycles between cut and commit, and the shards' latest reports."""

    def __init__(self, limits: Limits, first_cycle: int = 0) -> None:
        self.limits = limits
        self._next_cycle = first_cycle
        self._cycles: dict[int, _Cycle] = {}  # unfinished, in cycle order (insertion order)
        self._reports: dict[int, _Report] = {}
        self._seq = 0
        self._stopping = False

    # -- queries ----------------------------------------------------------------------------

    @property
    def idle(self) -> bool:
        """No cycle is between cut and commit."""
        return not self._cycles

    @property
    def in_flight(self) -> int:
        return len(self._cycles)

    def active(self, cycle: int) -> bool:
        """Cycle ``cycle`` is between cut and commit (its shards have not all been answered)."""
        return cycle in self._cycles

    def wakeup_ms(self) -> int | None:
        """The earliest time a ``tick`` may have something to do (None: only events can)."""
        times = [c.cut_ms + self.limits.cut_timeout_ms for c in self._cutting()]
        if not self._stopping and len(self._cycles) < self.limits.max_in_flight:
            for report in self._eligible():
                if report.urgent_ms >= 0:
                    times.append(report.urgent_ms + self.limits.group_commit_ms)
                if report.oldest_ms >= 0 and report.bytes > 0:
                    times.append(report.oldest_ms + self.limits.flush_interval_ms)
        return min(times, default=None)

    # -- events -----------------------------------------------------------------------------

    def stop(self) -> None:
        """Cut no more cycles; the ones in flight still finish."""
        self._stopping = True

    def pending(self, report: ShardPending, now: int) -> list[Instruction]:
        self._seq += 1
        if report.bytes > 0 or report.urgent_ms >= 0:
            self._reports[report.shard] = _Report(report, self._seq)
        else:
            self._reports.pop(report.shard, None)
        return self._maybe_cut(now)

    def tick(self, now: int) -> list[Instruction]:
        out: list[Instruction] = []
        for cycle in self._cutting():
            if now - cycle.cut_ms >= self.limits.cut_timeout_ms:
                for shard in cycle.waiting:
                    self._forget_report(shard, cycle.cut_seq)
                cycle.waiting.clear()
                out += self._gathered(cycle)
        return out + self._maybe_cut(now)

    def cut_answered(
        self, cycle: int, shard: int, entries: Sequence[WalEntry], now: int
    ) -> list[Instruction]:
        state = self._cycles.get(cycle)
        if state is None or shard not in state.waiting:
            if not entries:
                return self._maybe_cut(now)
            late = [
                failed(e, "the cut was answered after its cycle closed", False) for e in entries
            ]
            return [Answer(cycle, shard, late), *self._maybe_cut(now)]
        state.waiting.discard(shard)
        self._forget_report(shard, state.cut_seq)
        if entries:
            state.entries[shard] = list(entries)
        out = self._gathered(state) if not state.waiting else []
        return out + self._maybe_cut(now)

    def uploaded(
        self, cycle: int, ok: bool, error: str | None, storage_error: bool
    ) -> list[Instruction]:
        state = self._cycles.get(cycle)
        if state is None or state.phase is not Phase.BUILDING:
            raise ValueError(f"cycle {cycle} is not uploading")
        if ok:
            state.phase = Phase.UPLOADED
            return self._advance()
        reason = error or "the upload failed"
        answers = self._answer(state, [failed(e, reason, storage_error) for _, e in state.owners()])
        return answers + self._advance()

    def committed(self, cycle: int, results: Sequence[EntryResult]) -> list[Instruction]:
        state = self._cycles.get(cycle)
        if state is None or state.phase is not Phase.COMMITTING:
            raise ValueError(f"cycle {cycle} is not committing")
        if len(results) != len(state.owners()):
            raise ValueError(f"cycle {cycle}: {len(results)} results for {len(state.owners())}")
        return self._answer(state, list(results)) + self._advance()

    # -- internals --------------------------------------------------------------------------

    def _cutting(self) -> list[_Cycle]:
        return [c for c in self._cycles.values() if c.phase is Phase.CUTTING]

    def _eligible(self) -> list[ShardPending]:
        """Reports of shards not being cut right now (their data is not yet in any cycle)."""
        busy = {shard for cycle in self._cutting() for shard in cycle.waiting}
        return [r.pending for shard, r in self._reports.items() if shard not in busy]

    def _forget_report(self, shard: int, cut_seq: int) -> None:
        """The cut covered what the shard had reported before it; a later report may say more
        (it may also be stale: then the next cut gathers nothing, which costs one round trip)."""
        report = self._reports.get(shard)
        if report is not None and report.seq < cut_seq:
            del self._reports[shard]

    def _maybe_cut(self, now: int) -> list[Instruction]:
        if self._stopping or len(self._cycles) >= self.limits.max_in_flight:
            return []
        reports = self._eligible()
        reason = due(reports, now, self.limits)
        if reason is None:
            return []
        shards = tuple(sorted(r.shard for r in reports))
        self._seq += 1
        number = self._next_cycle
        self._next_cycle += 1
        self._cycles[number] = _Cycle(number, now, self._seq, set(shards))
        return [SendCut(number, shards, reason)]

    def _gathered(self, cycle: _Cycle) -> list[Instruction]:
        """Every shard answered (or was left out): build the object, or finish an empty cycle."""
        owners = cycle.owners()
        if not owners:
            del self._cycles[cycle.number]
            return self._advance()
        cycle.phase = Phase.BUILDING
        return [Build(cycle.number, tuple(e for _, e in owners), cycle.cut_ms)]

    def _answer(self, cycle: _Cycle, results: list[EntryResult]) -> list[Instruction]:
        """Answer each shard of a finished cycle and forget the cycle."""
        by_shard: dict[int, list[EntryResult]] = {}
        for (shard, _), result in zip(cycle.owners(), results, strict=True):
            by_shard.setdefault(shard, []).append(result)
        del self._cycles[cycle.number]
        return [Answer(cycle.number, shard, rs) for shard, rs in by_shard.items()]

    def _advance(self) -> list[Instruction]:
        """Commit the oldest unfinished cycle if its upload is done (one commit at a time)."""
        head = next(iter(self._cycles.values()), None)
        if head is None or head.phase is not Phase.UPLOADED:
            return []
        head.phase = Phase.COMMITTING
        return [Commit(head.number)]
