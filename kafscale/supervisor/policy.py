"""The supervisor's decisions about its children, as pure functions over ``Child`` records.

No I/O here: the arbiter (``kafscale.supervisor.arbiter``) reaps, spawns and kills; this module
says what to do when a child exits and when a child counts as hung. The rules:

- A child that dies while serving (it had said ``Ready``) is respawned at once, whatever else is
  going on -- another group's boot included.
- A child that exits before it is ready with ``EXIT_BOOT_FAILED`` (bad configuration, a port in
  use) or ``EXIT_DEPENDENCY_DOWN`` (S3 or the metadata store unreachable) on its *first* boot
  stops the broker with its reason: nothing worked yet, so the operator must look.
- ``EXIT_DEPENDENCY_DOWN`` from a child that served before is an outage, not a configuration
  error (the same settings reached the backend earlier): respawned with back-off up to
  ``OUTAGE_BACKOFF_MAX_S``, for as long as the outage lasts. The broker never exits for it.
- Any other failure before ``Ready`` (``EXIT_BOOT_FAILED`` of a respawn, a crash, a kill) is
  respawned with back-off; ``MAX_BOOT_FAILURES`` of them in a row stop the broker.
- A serving child that has answered none of its liveness pings for the hang timeout, with at
  least ``MIN_MISSED_PINGS`` missed, is hung: the arbiter kills it and the first rule respawns it.
  Several missed pings, not a span of time alone, so a pause of the pinging thread itself (it
  also runs the backend checks) never condemns a child.
- A respawned child still not ready after the hang timeout is hung in its boot: the arbiter kills
  it and it is respawned like an outage (a boot can wait on a backend that is down), so this
  never stops the broker either.
"""

from __future__ import annotations

from dataclasses import dataclass

EXIT_BOOT_FAILED = 3
EXIT_DEPENDENCY_DOWN = 4
MAX_BOOT_FAILURES = 5
BOOT_BACKOFF_MAX_S = 5.0
OUTAGE_BACKOFF_MAX_S = 10.0
MIN_MISSED_PINGS = 3


@dataclass(frozen=True, slots=True)
class Silence:
    """Liveness pings that went unanswered in a row, by one process (``pid``) of a child."""

    pid: int
    since: float  # monotonic time the first of them was sent
    missed: int


@dataclass
class Child:
    """One child slot (role + index); ``pid`` changes with each respawn. The arbiter's thread
    writes every field except ``silence``, which the health checker's thread writes."""

    role: str
    index: int
    pid: int = 0
    started_at: float = 0.0
    ready: bool = False
    ever_ready: bool = False  # some process of this slot served: later boot failures are respawns
    boot_failures: int = 0  # consecutive failed boots
    outages: int = 0  # consecutive boots that found a backend unreachable
    respawn_at: float | None = None  # when a dead child is due to be spawned again
    boot_error: str | None = None
    silence: Silence | None = None
    overdue: bool = False  # killed for not becoming ready in time

    @property
    def name(self) -> str:
        return f"{self.role}-{self.index}"

    @property
    def alive(self) -> bool:
        return self.pid > 0


@dataclass(frozen=True, slots=True)
class Respawn:
    delay_s: float
    reason: str


@dataclass(frozen=True, slots=True)
class StopBroker:
    reason: str


Decision = Respawn | StopBroker


def describe_exit(code: int) -> str:
    """``os.waitstatus_to_exitcode``'s result in words."""
    return f"signal {-code}" if code < 0 else f"exit status {code}"


def on_ready(child: Child) -> None:
    child.ready = child.ever_ready = True
    child.boot_failures = child.outages = 0
    child.boot_error = None


def on_exit(child: Child, code: int) -> Decision:
    """What to do about ``child``, whose process just exited with ``code``. Updates the child's
    failure counters; the caller clears its pid and ready flag."""
    described = describe_exit(code)
    if child.ready:
        return Respawn(0.0, f"died ({described})")
    if child.overdue:
        child.overdue = False
        child.outages += 1
        return Respawn(
            _backoff(child.outages, OUTAGE_BACKOFF_MAX_S), "did not become ready in time"
        )
    reason = child.boot_error or f"exited with {described} before it was ready"
    if code in (EXIT_BOOT_FAILED, EXIT_DEPENDENCY_DOWN) and not child.ever_ready:
        return StopBroker(f"{child.name} failed to boot: {reason}")
    if code == EXIT_DEPENDENCY_DOWN:
        child.outages += 1
        return Respawn(_backoff(child.outages, OUTAGE_BACKOFF_MAX_S), reason)
    child.boot_failures += 1
    if child.boot_failures >= MAX_BOOT_FAILURES:
        return StopBroker(
            f"{child.name} failed to boot {child.boot_failures} times in a row: {reason}"
        )
    return Respawn(_backoff(child.boot_failures, BOOT_BACKOFF_MAX_S), reason)


def _backoff(failures: int, cap: float) -> float:
    """0.2 s, 0.4 s, 0.8 s, ... up to ``cap``."""
    return min(cap, 0.1 * (1 << min(failures, 16)))


def note_ping(child: Child, pid: int, answered: bool, sent_at: float) -> None:
    """Record the outcome of a liveness ping sent at ``sent_at`` to process ``pid`` of ``child``
    (ignored if the child was respawned meanwhile)."""
    if child.pid != pid:
        return
    if answered:
        child.silence = None
        return
    silence = child.silence
    if silence is None or silence.pid != pid:
        child.silence = Silence(pid, sent_at, 1)
    else:
        child.silence = Silence(pid, silence.since, silence.missed + 1)


def hung(child: Child, now: float, timeout_s: float) -> Silence | None:
    """The silence that makes ``child`` hung, or None if it is not."""
    silence = child.silence
    if (
        silence is None
        or not (child.alive and child.ready)
        or silence.pid != child.pid
        or silence.missed < MIN_MISSED_PINGS
        or now - silence.since < timeout_s
    ):
        return None
    return silence


def boot_overdue(child: Child, now: float, timeout_s: float) -> bool:
    """Whether a respawned ``child`` has been booting for ``timeout_s`` without becoming ready
    (the first boot has its own deadline, ``KAFSCALE_BOOT_TIMEOUT_MS``)."""
    return (
        child.alive
        and not child.ready
        and child.ever_ready
        and not child.overdue
        and now - child.started_at >= timeout_s
    )
