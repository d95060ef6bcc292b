"""SIGKILL in the middle of an acks=all load: no acknowledged record is lost or duplicated.

The Java producer with its default settings (idempotence on, acks=all, retries) writes while a
shard, the flusher, or the whole broker is killed; the broker (or the supervisor) brings it back.
Afterwards every record the producer got acknowledged is in the committed log exactly once, with
contiguous offsets, and the producer carried on by itself, without ever bumping its epoch.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable
from typing import Any

import pytest

from kafscale.protocol import records
from tests.harness.clients import JVM_FLAGS, PROBE_MAIN
from tests.harness.procs import wait_until
from tests.harness.stored import committed_batches, committed_records

from .test_produce import high_watermark
from .test_supervision import roles

pytestmark = [pytest.mark.integration, pytest.mark.java]

ROUNDS = 3
PER_ROUND = 6000
PARTITIONS = 3


def start_producer(java_probe: Any, bootstrap: str, prefix: str) -> subprocess.Popen[str]:
    argv = [
        java_probe.java,
        *JVM_FLAGS,
        "-cp",
        java_probe.classpath("4"),
        PROBE_MAIN,
        "produce",
        "--bootstrap",
        bootstrap,
        "--topic",
        "crash",
        "--count",
        str(PER_ROUND),
        "--prefix",
        prefix,
        "--timeout-ms",
        "180000",
        "--config",
        "linger.ms=20",
        "--config",
        "batch.size=4096",
        "--config",
        "delivery.timeout.ms=170000",
        "--config",
        "request.timeout.ms=15000",
    ]
    return subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL
    )


def committed(broker: Any) -> int:
    return sum(high_watermark(broker, "crash", p) for p in range(PARTITIONS))


@pytest.mark.parametrize("victim", ["shard-0", "flusher-0", "broker"])
def test_sigkill_under_acks_all_load_loses_nothing(
    start_broker: Callable[..., Any], java_probe: Any, victim: str
) -> None:
    broker = start_broker(backends="real", env={"KAFSCALE_SHARDS": "2"})
    broker.wait_ready()
    created = java_probe(
        "4",
        "create-topic",
        "--bootstrap",
        broker.bootstrap,
        "--topic",
        "crash",
        "--partitions",
        str(PARTITIONS),
    )
    assert created.returncode == 0, created.stderr
    unkilled = 0
    for round_number in range(ROUNDS):
        before = committed(broker)
        producer = start_producer(java_probe, broker.bootstrap, f"r{round_number}")

        # Kill once this round's records are flowing into S3, i.e. mid-load.
        def flowing(
            broker: Any = broker, before: int = before, producer: subprocess.Popen[str] = producer
        ) -> bool | None:
            return True if committed(broker) > before or producer.poll() is not None else None

        wait_until(flowing, timeout=120, what="records to be committed")
        if producer.poll() is not None:
            # A loaded machine noticed the commits only after the whole round was sent: this
            # round killed nothing (its records are still checked below); the others must.
            unkilled += 1
            assert unkilled < ROUNDS, "no round's load outlasted its first commit"
            stdout, stderr = producer.communicate(timeout=240)
            assert producer.returncode == 0, stderr[-3000:]
            continue
        if victim == "broker":
            broker.kill()
            broker = start_broker(env=broker.env)  # same ports, bucket and namespace
            broker.wait_ready()
        else:
            os.kill(roles(broker)[victim], signal.SIGKILL)
        stdout, stderr = producer.communicate(timeout=240)
        assert producer.returncode == 0, stderr[-3000:]
        assert f'"count":{PER_ROUND}' in stdout.replace(" ", "")
    seen: dict[bytes, int] = {}
    where: dict[bytes, list[tuple[int, int]]] = {}
    for partition in range(PARTITIONS):
        stored = committed_records(broker.env, "crash", partition)
        assert [r.offset for r in stored] == list(range(len(stored)))
        for record in stored:
            assert record.value is not None
            seen[record.value] = seen.get(record.value, 0) + 1
            where.setdefault(record.value, []).append((partition, record.offset))
    duplicated = {value: n for value, n in seen.items() if n > 1}
    # Where they are (partition, offsets) says which commit or adoption stored them twice.
    places = sorted(where[value] for value in duplicated)
    assert not duplicated, (
        f"{len(duplicated)} records stored more than once, first at {places[:3]}, last at "
        f"{places[-3:]}"
    )
    expected = {f"r{r}-{i}".encode() for r in range(ROUNDS) for i in range(PER_ROUND)}
    assert set(seen) == expected
    # No producer had to bump its epoch. It does when answered OUT_OF_ORDER_SEQUENCE_NUMBER
    # for the batch after the last one acknowledged (data lost, it concludes), and sends every
    # batch not yet acknowledged again as a new one: stored twice if the broker had it. A
    # restarted shard that got a connection's requests out of order caused such bumps after
    # most kills, duplicates only when a stored batch was among those sent again.
    bumped = {
        (partition, header.producer_id, header.producer_epoch)
        for partition in range(PARTITIONS)
        for batch in committed_batches(broker.env, "crash", partition)
        if (header := records.read_header(batch)).producer_epoch != 0
    }
    assert not bumped, f"(partition, producer, epoch) of batches after a bump: {sorted(bumped)}"
