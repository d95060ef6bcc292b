"""Requests waiting for commits: acks=all produces and explicit flushes (``FlushAll``).

Pure: the shard adds a request with what it waits for (per result index, a partition and the
last offset that must be committed) and asks, after commits and on each tick, which requests
can be answered now and with what; it sends the answers. A request is answered once: when every
partition it waits on has a high watermark past its offset, or at its deadline, with
``request_timed_out`` for the partitions that were not committed in time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from kafscale.ipc import messages
from kafscale.ipc.rpc import Incoming
from kafscale.protocol.errors import ErrorCode

NOT_IN_TIME = "the data was not committed in time"


class Committing(Protocol):
    """A partition as the waiters see it (``kafscale.shards.partition.PartitionLog``)."""

    @property
    def high_watermark(self) -> int: ...


@dataclass
class Waiting:
    """An acks=all request (or an explicit flush) waiting for its partitions' commits."""

    incoming: Incoming
    results: list[messages.AppendResult]
    waits: Mapping[int, tuple[Committing, int]]  # result index -> (partition, last offset)
    deadline_ms: int
    since_ms: int
    flush_all: bool = False

    def done(self) -> bool:
        return all(partition.high_watermark > last for partition, last in self.waits.values())

    def answer(self, timed_out: bool) -> messages.Message:
        if self.flush_all:
            error = "not everything was committed in time" if timed_out else None
            return messages.FlushedAll(partitions=len(self.waits), error=error)
        results = list(self.results)
        for index, (partition, last) in self.waits.items():
            if partition.high_watermark <= last:
                results[index] = messages.AppendResult(
                    error_code=int(ErrorCode.request_timed_out), message=NOT_IN_TIME
                )
        return messages.Appended(results=results)


Answers = list[tuple[Incoming, messages.Message]]


class Waiters:
    def __init__(self) -> None:
        self._waiting: list[Waiting] = []

    def __len__(self) -> int:
        return len(self._waiting)

    def since_ms(self) -> int | None:
        """Since when the longest-waiting request waits (None: none does)."""
        return min((w.since_ms for w in self._waiting), default=None)

    def add(self, waiting: Waiting) -> Answers:
        """Wait for ``waiting``'s commits; answered at once if nothing is left to wait for."""
        if waiting.done():
            return [(waiting.incoming, waiting.answer(timed_out=False))]
        self._waiting.append(waiting)
        return []

    def committed(self) -> Answers:
        """High watermarks moved: the requests that are now answered."""
        answers: Answers = []
        still = []
        for waiting in self._waiting:
            if waiting.done():
                answers.append((waiting.incoming, waiting.answer(timed_out=False)))
            else:
                still.append(waiting)
        self._waiting = still
        return answers

    def lost(self, partition: Committing, error: messages.AppendResult) -> Answers:
        """``partition`` will never commit what they wait for (this broker lost it): those
        entries are answered ``error``; requests left with nothing to wait for are answered."""
        answers: Answers = []
        still = []
        for waiting in self._waiting:
            gone = [i for i, (p, _) in waiting.waits.items() if p is partition]
            if gone:
                results = list(waiting.results)
                for index in gone:
                    if not waiting.flush_all:  # a flush has no per-partition results
                        results[index] = error
                waits = {i: w for i, w in waiting.waits.items() if i not in gone}
                waiting = Waiting(
                    waiting.incoming,
                    results,
                    waits,
                    waiting.deadline_ms,
                    waiting.since_ms,
                    waiting.flush_all,
                )
            if waiting.done():
                answers.append((waiting.incoming, waiting.answer(timed_out=False)))
            else:
                still.append(waiting)
        self._waiting = still
        return answers

    def expire(self, now_ms: int) -> Answers:
        """The requests whose deadline passed, answered with what was committed."""
        expired = [w for w in self._waiting if w.deadline_ms <= now_ms]
        if expired:
            self._waiting = [w for w in self._waiting if w.deadline_ms > now_ms]
        return [(w.incoming, w.answer(timed_out=True)) for w in expired]
