"""The supervisor's decisions: respawn or stop on a child's exit, and when a child is hung."""

from __future__ import annotations

import signal

import pytest

from kafscale.supervisor import policy
from kafscale.supervisor.policy import (
    EXIT_BOOT_FAILED,
    EXIT_DEPENDENCY_DOWN,
    MAX_BOOT_FAILURES,
    MIN_MISSED_PINGS,
    Child,
    Respawn,
    StopBroker,
)

KILLED = -int(signal.SIGKILL)


def serving(pid: int = 100) -> Child:
    child = Child("coordinator", 0, pid=pid)
    policy.on_ready(child)
    return child


def respawned(child: Child, pid: int) -> Child:
    """As the arbiter does: the old process is gone, a new one starts booting."""
    child.pid, child.ready, child.silence = pid, False, None
    return child


@pytest.mark.parametrize("code", [KILLED, 1, 0, EXIT_BOOT_FAILED, EXIT_DEPENDENCY_DOWN])
def test_a_child_that_dies_while_serving_is_respawned_at_once(code: int) -> None:
    child = serving()
    assert policy.on_exit(child, code) == Respawn(0.0, f"died ({policy.describe_exit(code)})")


@pytest.mark.parametrize("code", [EXIT_BOOT_FAILED, EXIT_DEPENDENCY_DOWN])
def test_a_first_boot_that_fails_stops_the_broker_with_the_childs_reason(code: int) -> None:
    child = Child("frontend", 0, pid=7, boot_error="OSError: cannot listen on 127.0.0.1:9092")
    decision = policy.on_exit(child, code)
    assert decision == StopBroker(
        "frontend-0 failed to boot: OSError: cannot listen on 127.0.0.1:9092"
    )


def test_a_first_boot_without_a_notice_names_the_exit_status() -> None:
    decision = policy.on_exit(Child("shard", 1, pid=7), EXIT_BOOT_FAILED)
    assert decision == StopBroker(
        "shard-1 failed to boot: exited with exit status 3 before it was ready"
    )


def test_a_backend_outage_after_the_child_served_is_retried_with_backoff_forever() -> None:
    child = serving()
    policy.on_exit(child, KILLED)
    delays = []
    for attempt in range(40):
        respawned(child, 200 + attempt)
        child.boot_error = "MetadataStoreUnavailable: etcd at 127.0.0.1:2379 is unreachable"
        decision = policy.on_exit(child, EXIT_DEPENDENCY_DOWN)
        assert isinstance(decision, Respawn), decision
        assert "etcd at 127.0.0.1:2379 is unreachable" in decision.reason
        delays.append(decision.delay_s)
    assert delays[:3] == [0.2, 0.4, 0.8]
    assert delays == sorted(delays)
    assert max(delays) == policy.OUTAGE_BACKOFF_MAX_S
    assert child.boot_failures == 0  # outages never count towards giving up


def test_a_respawn_that_keeps_failing_to_boot_stops_the_broker() -> None:
    child = serving()
    policy.on_exit(child, KILLED)
    decisions = []
    for attempt in range(MAX_BOOT_FAILURES):
        respawned(child, 300 + attempt)
        child.boot_error = "ValueError: bad"
        decisions.append(policy.on_exit(child, EXIT_BOOT_FAILED))
    assert all(isinstance(d, Respawn) for d in decisions[:-1])
    assert [d.delay_s for d in decisions[:-1] if isinstance(d, Respawn)] == [0.2, 0.4, 0.8, 1.6]
    assert decisions[-1] == StopBroker(
        f"coordinator-0 failed to boot {MAX_BOOT_FAILURES} times in a row: ValueError: bad"
    )


def test_being_ready_again_resets_the_failure_counts() -> None:
    child = serving()
    policy.on_exit(child, KILLED)
    for attempt in range(MAX_BOOT_FAILURES - 1):
        respawned(child, 400 + attempt)
        assert isinstance(policy.on_exit(child, EXIT_BOOT_FAILED), Respawn)
        respawned(child, 500 + attempt)
        assert isinstance(policy.on_exit(child, EXIT_DEPENDENCY_DOWN), Respawn)
    respawned(child, 600)
    policy.on_ready(child)
    assert (child.boot_failures, child.outages, child.boot_error) == (0, 0, None)
    policy.on_exit(child, KILLED)
    respawned(child, 601)
    assert policy.on_exit(child, EXIT_BOOT_FAILED) == Respawn(
        0.2, "exited with exit status 3 before it was ready"
    )


def test_a_child_killed_during_its_own_first_boot_is_respawned() -> None:
    child = Child("shard", 0, pid=9)
    decision = policy.on_exit(child, KILLED)
    assert decision == Respawn(0.2, "exited with signal 9 before it was ready")


def test_a_crash_loop_before_ready_stops_the_broker_after_the_limit() -> None:
    child = Child("shard", 0, pid=9)
    decisions = [policy.on_exit(respawned(child, 10 + i), 1) for i in range(MAX_BOOT_FAILURES)]
    assert isinstance(decisions[-1], StopBroker)
    assert all(isinstance(d, Respawn) for d in decisions[:-1])


def test_a_child_is_hung_only_after_enough_missed_pings_over_the_timeout() -> None:
    child = serving(pid=42)
    for sent in (0.0, 2.0):
        policy.note_ping(child, 42, answered=False, sent_at=sent)
    assert policy.hung(child, now=100.0, timeout_s=10.0) is None  # 2 misses are not enough
    policy.note_ping(child, 42, answered=False, sent_at=4.0)
    assert child.silence == policy.Silence(42, 0.0, MIN_MISSED_PINGS)
    assert policy.hung(child, now=9.9, timeout_s=10.0) is None  # not silent long enough
    assert policy.hung(child, now=10.0, timeout_s=10.0) == policy.Silence(42, 0.0, 3)


def test_one_answer_ends_the_silence() -> None:
    child = serving(pid=42)
    for sent in (0.0, 2.0, 4.0):
        policy.note_ping(child, 42, answered=False, sent_at=sent)
    policy.note_ping(child, 42, answered=True, sent_at=6.0)
    assert child.silence is None
    assert policy.hung(child, now=1000.0, timeout_s=10.0) is None


def test_pings_of_a_previous_process_never_condemn_its_successor() -> None:
    child = serving(pid=42)
    for sent in (0.0, 2.0, 4.0):
        policy.note_ping(child, 42, answered=False, sent_at=sent)
    respawned(child, 43)
    policy.on_ready(child)
    policy.note_ping(child, 42, answered=False, sent_at=6.0)  # a late result for the old pid
    assert child.silence is None
    child.silence = policy.Silence(42, 0.0, 10)  # even if one slipped through
    assert policy.hung(child, now=1000.0, timeout_s=10.0) is None


def test_a_child_not_yet_ready_is_never_hung() -> None:
    child = Child("shard", 0, pid=42)
    child.silence = policy.Silence(42, 0.0, 10)
    assert policy.hung(child, now=1000.0, timeout_s=10.0) is None


def test_a_respawn_that_never_becomes_ready_is_overdue_and_respawned_like_an_outage() -> None:
    child = serving(pid=42)
    policy.on_exit(child, KILLED)
    respawned(child, 43)
    child.started_at = 100.0
    assert not policy.boot_overdue(child, now=159.9, timeout_s=60.0)
    assert policy.boot_overdue(child, now=160.0, timeout_s=60.0)
    child.overdue = True  # the arbiter kills it
    assert not policy.boot_overdue(child, now=200.0, timeout_s=60.0)  # killed once
    for attempt in range(MAX_BOOT_FAILURES + 2):
        decision = policy.on_exit(child, KILLED)
        assert isinstance(decision, Respawn), decision  # never stops the broker
        assert decision.reason == "did not become ready in time"
        respawned(child, 50 + attempt)
        child.overdue = True
    assert child.boot_failures == 0


def test_a_first_boot_is_never_overdue_here() -> None:
    # The first boot has its own deadline (KAFSCALE_BOOT_TIMEOUT_MS) in the arbiter's boot().
    child = Child("shard", 0, pid=9, started_at=0.0)
    assert not policy.boot_overdue(child, now=1000.0, timeout_s=60.0)
