"""Three brokers on a 3-member etcd cluster under idempotent acks=all load, while etcd loses a
member or S3 goes away (docs/design/scale-out.md, section 9): nothing acknowledged is lost or
duplicated, the load carries on, and ownership does not move.

- An etcd member SIGKILLed (the follower every broker's client is talking to; then a member
  that is both the raft leader and every client's endpoint) and started again: the clients fail
  over to another endpoint, the broker leases survive (a lost follower changes nothing for them;
  a new raft leader re-arms every lease), so no broker stops and no partition changes owner or
  epoch.
- MinIO stopped for 15 s and started again: nothing is acknowledged while it is down (the
  durability contract: an acks=all reply follows the upload), librdkafka reports no record as
  failed (every error the brokers returned was retriable), no broker stops, and the load is
  acknowledged again on every partition once it is back.
- A broker SIGKILLed and started again at once with the same id, as an orchestrator does: its
  partitions must not wait for its whole boot (found by the chaos run: it registers booting,
  ``BrokerRecord.ready``, and gets partitions handed back only once it serves).

The etcd cluster is this module's own. MinIO is the suite's session `s3_server`: tests on one
pytest-xdist worker run one after another and every worker has its own MinIO, so a test may stop
it as long as it starts it again whatever happens (`finally`), as test_s3_outage.py and
test_outages.py do; `ensure_running` in the fixtures restarts it if a test could not.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.harness.cluster import LoadProducer, finish, loaded_cluster, wait_for_leaders
from tests.harness.etcd import EtcdCluster, EtcdServer
from tests.harness.minio import MinioServer
from tests.harness.procs import HarnessError, wait_until

pytestmark = pytest.mark.integration

MEMBER_DOWN_S = 10.0  # longer than the 6 s broker lease: a lease that is not kept would expire
S3_DOWN_S = 15.0
SLOW_BOOT_S = 25.0  # the restarted broker's flusher is paused this long


@pytest.fixture(scope="module")
def etcd_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    cluster = EtcdCluster(tmp_path_factory.mktemp("etcd-cluster"), size=3)
    try:
        cluster.start_first()
    except HarnessError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.fixture
def on_cluster(etcd_cluster: EtcdCluster) -> dict[str, str]:
    """The brokers' environment for the cluster, every member running (a test that failed
    midway may have left one stopped)."""
    for member in etcd_cluster.members:
        if not member.running:
            member.start()
    return {"KAFSCALE_ETCD_ENDPOINTS": ",".join(etcd_cluster.endpoints)}


def hold(brokers: list[Any], load: LoadProducer, seconds: float) -> None:
    """Keep the fault for ``seconds``, failing at once if a broker stops meanwhile."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        stopped = [b.env["KAFSCALE_BROKER_ID"] for b in brokers if not b.running]
        assert not stopped, f"brokers {stopped} stopped:\n{brokers[0].log_tail()}"
        assert load.fatal is None, load.fatal
        time.sleep(0.2)


def lose_member(
    start_broker: Callable[..., Any], env: dict[str, str], pick: Callable[[], EtcdServer]
) -> None:
    brokers, before, load = loaded_cluster(start_broker, 3, env)
    member = pick()
    member.kill()
    try:
        hold(brokers, load, MEMBER_DOWN_S)
        load.more(500)  # acknowledged on two members
    finally:
        member.start()
    load.more(500)
    assert wait_for_leaders(brokers, {0, 1, 2}) == before  # same owners, same epochs
    for broker in brokers:
        assert "broker lease lost" not in broker.log_text()
    assert not load.errors, dict(load.errors)
    finish(load, brokers, f"{member.member_name} down {MEMBER_DOWN_S:.0f} s")


@pytest.mark.long
def test_an_etcd_follower_in_use_killed_under_load_changes_nothing(
    start_broker: Callable[..., Any], etcd_cluster: EtcdCluster, on_cluster: dict[str, str]
) -> None:
    first, second = etcd_cluster.members[:2]
    etcd_cluster.move_leader(second)  # the first endpoint, every client's first choice, follows

    def follower_in_use() -> EtcdServer:
        assert etcd_cluster.leader() is not first
        return first

    lose_member(start_broker, on_cluster, follower_in_use)


def test_the_etcd_leader_in_use_killed_under_load_changes_nothing(
    start_broker: Callable[..., Any], etcd_cluster: EtcdCluster, on_cluster: dict[str, str]
) -> None:
    first = etcd_cluster.members[0]
    etcd_cluster.move_leader(first)  # lost: the raft leader and every client's endpoint

    def leader_in_use() -> EtcdServer:
        assert etcd_cluster.leader() is first
        return first

    lose_member(start_broker, on_cluster, leader_in_use)


def test_minio_stopped_under_load_refuses_retriably_and_recovers(
    start_broker: Callable[..., Any], s3_server: MinioServer, on_cluster: dict[str, str]
) -> None:
    brokers, before, load = loaded_cluster(start_broker, 3, on_cluster)
    s3_server.stop()
    stopped_at = time.monotonic()
    try:
        hold(brokers, load, S3_DOWN_S)
    finally:
        s3_server.start()
    started_at = time.monotonic()
    sent_after = load.sent
    deadline = time.monotonic() + 60
    while not load.acked_since(sent_after):
        assert time.monotonic() < deadline, f"no acks on every partition: {load.last_acked_seq}"
        time.sleep(0.2)
    # Acks of uploads that ended before MinIO did arrive within a moment; none may come after.
    late = [
        round(t - stopped_at, 1)
        for times in load.acked_at.values()
        for t in times
        if stopped_at + 5.0 < t < started_at
    ]
    assert not late, f"acknowledged while S3 was down, at {late[:10]} s"
    load.more(500)
    assert wait_for_leaders(brokers, {0, 1, 2}) == before  # nothing moved
    assert not load.errors, dict(load.errors)  # librdkafka retried every refusal
    finish(load, brokers, f"S3 down {S3_DOWN_S:.0f} s")


def spawned(broker: Any, child: str) -> int | None:
    """The pid of ``child`` (e.g. "flusher-0") once the supervisor's log says it spawned it."""
    for line in broker.log_text().splitlines():
        if '"spawned"' in line and f'"{child}"' in line:
            return int(json.loads(line)["child_pid"])
    return None


@pytest.mark.long
def test_a_crashed_broker_started_again_at_once_does_not_hold_its_partitions_while_it_boots(
    start_broker: Callable[..., Any], on_cluster: dict[str, str]
) -> None:
    brokers, before, load = loaded_cluster(start_broker, 3, on_cluster)
    victim = brokers[1]
    victim.kill()
    killed_at = time.monotonic()
    # As an orchestrator does after a crash: the same id, at once. Its boot is made slow (as on
    # a loaded machine, or with many write-ahead objects to recover) by pausing its flusher.
    brokers[1] = start_broker(env=victim.env)
    flusher = wait_until(
        lambda: spawned(brokers[1], "flusher-0"), timeout=90, what="the new flusher to spawn"
    )
    os.kill(flusher, signal.SIGSTOP)
    try:
        time.sleep(SLOW_BOOT_S)
    finally:
        os.kill(flusher, signal.SIGCONT)
    brokers[1].wait_ready()
    load.more(500)
    moved = [p for p, (leader, _) in before.items() if leader == 1]
    offline = load.outage(killed_at, moved)
    finish(load, brokers, f"partitions {moved} went {offline:.1f} s without an ack")
    # Failover takes the 6 s lease and a claim; a slow boot of the new broker must not add to it.
    assert offline < SLOW_BOOT_S, f"partitions {moved} went {offline:.1f} s without an ack"
