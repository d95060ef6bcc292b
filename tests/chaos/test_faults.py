"""The chaos run's pure parts: a seed's schedule, and the result file saying what happened."""

from __future__ import annotations

from collections import Counter

from tests.chaos.faults import KINDS, Exit, Outcome, RunResult, render, schedule


def test_a_seed_draws_the_same_schedule_and_another_seed_another() -> None:
    assert schedule(7, 100, 6.0) == schedule(7, 100, 6.0)
    assert schedule(7, 100, 6.0) != schedule(8, 100, 6.0)


def test_a_hundred_faults_cover_every_kind_and_hold_within_bounds() -> None:
    faults = schedule(3, 100, 6.0)
    assert [f.index for f in faults] == list(range(100))
    counts = Counter(f.kind for f in faults)
    assert set(counts) == set(KINDS)
    assert min(counts.values()) >= 10
    for a, b, c in zip(faults, faults[1:], faults[2:], strict=False):
        assert not a.kind == b.kind == c.kind
    for fault in faults:
        if fault.kind == "broker-pause":
            assert 7.0 <= fault.hold_s <= 11.0  # past the 6 s lease
        elif fault.kind in ("broker-kill", "broker-term"):
            assert fault.hold_s == 0.0
        else:
            assert 3.0 <= fault.hold_s <= 20.0
        assert 0 <= fault.target < 3


def result_with(outcomes: list[Outcome], exits: list[Exit], check_passed: bool) -> RunResult:
    return RunResult(
        seed=5,
        started="2026-11-27 16:00",
        command="python -m tests.chaos.run --faults 3 --seed 5",
        commit="abc1234",
        settings={"faults planned": "3"},
        outcomes=outcomes,
        exits=exits,
        sent=900,
        acked=890,
        read=890,
        check="890 acked, 890 read, no loss, no duplicate, in order" if check_passed else "FAILED",
        check_passed=check_passed,
    )


def test_the_result_reports_each_kind_and_passes_only_when_everything_held() -> None:
    kill, pause, term = schedule(1, 3, 6.0)[0], *schedule(2, 2, 6.0)
    outcomes = [
        Outcome(kill, recovered_s=7.0, after_repair_s=0.5, settled_s=30.0),
        Outcome(pause, recovered_s=9.0, after_repair_s=0.4, settled_s=40.0),
        Outcome(term, recovered_s=2.0, after_repair_s=0.3, settled_s=20.0),
    ]
    lease = Exit(pause.index, pause.target, 1, "stopped: the broker lease 1 expired", True)
    result = result_with(outcomes, [lease], check_passed=True)
    text = render(result)
    assert result.passed
    assert text.startswith("# Chaos run 2026-11-27 16:00 UTC: PASS")
    assert "seed 5" in text and "890 acked" in text
    kinds = Counter(o.fault.kind for o in outcomes)
    for kind, what in KINDS.items():  # every kind has its row, with how many faults it had
        assert f"| {kind} | {what} | {kinds[kind]} |" in text
    assert "1 x exit 1 (expected)" in text

    crash = Exit(2, 0, -9, "Traceback", False)
    assert not result_with(outcomes, [lease, crash], check_passed=True).passed
    assert "UNEXPECTED" in render(result_with(outcomes, [crash], check_passed=True))
    assert not result_with(outcomes, [], check_passed=False).passed
    stuck = Outcome(kill, failures=["not settled within 180 s"])
    failed = result_with([stuck], [], check_passed=True)
    assert not failed.passed
    assert "- fault 0: not settled within 180 s" in render(failed)
