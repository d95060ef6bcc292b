"""bench's failover figures (``bench.outage``, pure) and its S3 latency option."""

from __future__ import annotations

import pytest

from bench import outage
from bench.targets import S3Latency


def test_s3_latency_from_the_command_line() -> None:
    assert S3Latency.parse("0", 10.0) is None
    assert S3Latency.parse("50-100", 10.0) == S3Latency(0.05, 0.1, 0.01)
    assert S3Latency.parse("20", 0.0) == S3Latency(0.02, 0.02, 0.0)


def test_the_new_owners_first_ack_is_the_first_at_its_epochs_start_offset() -> None:
    fault = 100.0
    acks = [
        (97.0, 10), (97.5, 11), (98.0, 12), (99.0, 13),  # steady, one a second
        (100.1, 14),  # a late callback of the old owner's acknowledgement, after the fault
        (108.0, 15),  # a duplicate the new owner answered with its original offset
        (108.2, 16), (108.7, 17),
    ]  # fmt: skip
    # Epoch 3 began at offset 16 (epoch 2 was the one before the fault).
    epoch = outage.new_epoch([(0, 0), (2, 5), (3, 16), (4, 40)], before=2)
    assert epoch == (3, 16)
    moved = outage.partition_outage(
        partition=4,
        acks=acks,
        fault_at=fault,
        old_owner=1,
        new_owner=2,
        epoch=epoch,
        leader_seen_at=106.0,
    )
    assert moved is not None
    assert moved.first_ack_s == pytest.approx(8.2)
    # The producer waited from the late callback to the duplicate's answer.
    assert moved.gap_s == pytest.approx(108.0 - 100.1)
    assert moved.leader_seen_s == pytest.approx(6.0)
    assert moved.gap_before_s == pytest.approx(1.0)  # 97.0 .. 99.0, the last 4 s
    # Nothing at or above the new epoch's start yet: no figure.
    assert (
        outage.partition_outage(
            partition=4,
            acks=acks[:6],
            fault_at=fault,
            old_owner=1,
            new_owner=2,
            epoch=epoch,
            leader_seen_at=None,
        )
        is None
    )
    assert outage.new_epoch([(0, 0), (2, 5)], before=2) is None
    # Nothing arrived before the fault: the silence starts at the fault.
    assert outage.longest_silence([(103.0, 1)], 100.0, 103.0) == pytest.approx(3.0)
    # The evidence: arrivals within a millisecond merged, from 4 s before the fault.
    evidence = outage.bursts([(95.0, 9), (99.0, 13), (99.0005, 12), (108.2, 16)], fault, 108.2)
    assert evidence == [[-1000.0, 12, 13, 2], [8200.0, 16, 16, 1]]


def test_failover_summary_is_over_the_victims_partitions() -> None:
    def moved(p: int, old: int, first: float, gap: float | None) -> dict[str, object]:
        return {
            "partition": p,
            "old_owner": old,
            "first_ack_s": first,
            "gap_s": gap,
            "leader_seen_s": None,
            "gap_before_s": 0.6,
        }

    faults = [
        {"kind": "kill", "ttl_ms": 6000, "victim": 1,
         "partitions": [moved(0, 1, 8.0, 8.5), moved(3, 1, 9.0, 9.4), moved(5, 2, 1.0, 0.5)]},
        {"kind": "kill", "ttl_ms": 6000, "victim": 2,
         "partitions": [moved(1, 2, 7.0, 7.5), moved(4, 2, 7.5, None)]},
    ]  # fmt: skip
    rows = outage.summary_rows(faults)
    assert len(rows) == 3
    # Slowest per fault: 9.0 and 7.5; every moved partition of a victim: 7.0 .. 9.0 (the
    # partition moved between survivors, 5, is not one of them).
    assert rows[2].startswith(
        "| kill | 6 s | 2 | 4 | 7.50 / 8.25 / 9.00 | 7.00 / 7.75 / 9.00 | 7.50 / 8.50 / 9.40 | - |"
    )
    assert outage.spread([None, 2.0, 1.0, 4.0]) == {"min": 1.0, "median": 2.0, "max": 4.0}
    assert outage.spread([None]) is None
