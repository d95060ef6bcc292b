"""A KIP-848 consumer group (``group.protocol=consumer``) on three brokers whose coordinator fails
in the middle of a reconciliation (docs/design/ecosystem.md, section 5.3, "Failover"): a member
joined, the others are giving partitions up to it, and the coordinator is SIGKILLed -- or
SIGSTOPped past its lease, then woken. The group converges on another broker without a new group
epoch: the same members, each at or past its epoch, every partition owned by exactly one of them;
no member is fenced (no partition is lost); every acknowledged record is read; committed offsets
never go backwards; and what the woken coordinator still had to say (a member leaving, queued in
its socket while it slept, and the requests and timers of its own) is fenced and changes nothing.
The classic protocol's relative is test_scale_out_groups.py."""

from __future__ import annotations

import datetime
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from kio.index import load_request_schema, load_response_schema

from kafscale.metadata.etcd import EtcdMetadataStore
from kafscale.metadata.group_records import ConsumerGroupKeys
from kafscale.metadata.records import Keys
from kafscale.protocol import codec
from kafscale.protocol.errors import ErrorCode
from tests.harness import cluster as scale_out
from tests.harness.cluster import (
    LoadProducer,
    bootstrap,
    create_topic,
    start_cluster,
    wait_for_leaders,
)
from tests.harness.groups import GroupConsumer, GroupConsumers, wait_for_assignment
from tests.harness.history import History

from .test_group_clients import committed_offsets, end_offsets
from .test_scale_out_groups import (
    ask,
    coordinator_seen_by,
    restarts_below_commits,
    signal_all,
    timeline,
    wait_until_everything_acked_was_read,
)
from .wire import Wire

pytestmark = pytest.mark.integration

GROUP = "reconciling848"
SESSION_MS = 12_000
ENV = {
    "KAFSCALE_OFFSETS_TOPIC_PARTITIONS": "6",
    # Longer than the members' request timeout towards a paused coordinator (a new coordinator
    # gives every member a fresh session when it loads the group, after the 6 s lease and a
    # claim): no member's session runs out because of the fault.
    "KAFSCALE_GROUP_CONSUMER_SESSION_TIMEOUT_MS": str(SESSION_MS),
    "KAFSCALE_GROUP_CONSUMER_HEARTBEAT_INTERVAL_MS": "1000",
}
MEMBER_CONFIGS = {"group.protocol": "consumer", "group.remote.assignor": "uniform"}
# Not 30-60 s for a request to a paused broker.
REQUEST_TIMEOUT = {"java-4": "request.timeout.ms", "confluent-kafka": "socket.timeout.ms"}
TopicPartitionIds = frozenset[tuple[str, int]]


def describe(broker: Any) -> Any:
    """The group as ``broker`` answers ConsumerGroupDescribe (v0): its epochs and members."""
    answer = ask(broker, 69, 0, group_ids=(GROUP,), include_authorized_operations=False)
    (found,) = answer.groups
    return found


def described_by_coordinator(brokers: list[Any], old: int | None = None) -> Any:
    """The group as the coordinator every broker of ``brokers`` names (not ``old``) describes
    it; None while they disagree or it does not answer (it may be rejoining)."""
    named = {coordinator_seen_by(b, GROUP) for b in brokers}
    if len(named) != 1 or old in named:
        return None
    (node,) = named
    (coordinator,) = [b for b in brokers if int(b.env["KAFSCALE_BROKER_ID"]) == node] or [None]
    try:
        found = describe(coordinator) if coordinator is not None else None
    except OSError:
        return None
    return found if found is not None and found.error_code == ErrorCode.none else None


def owned(assignment: Any) -> TopicPartitionIds:
    return frozenset(
        (str(t.topic_id), p) for t in assignment.topic_partitions for p in t.partitions
    )


def members_of(found: Any) -> dict[str, Any]:
    """A described group's members by id (none if it was not described)."""
    if found is None or found.error_code != ErrorCode.none:
        return {}
    return {m.member_id: m for m in found.members}


def reconciling(found: Any, paused: str, others: set[str]) -> bool:
    """The moment of the fault: the joiner is in, the target (which moves partitions from both
    old members to it) computed; every member but ``paused`` reached its epoch, and the joiner
    still waits for what ``paused`` must give up."""
    members = members_of(found)
    if len(members) != 3 or paused not in members or found.assignment_epoch != found.group_epoch:
        return False
    (joiner,) = set(members) - others - {paused}
    return (
        str(found.group_state) == "Reconciling"
        and members[paused].member_epoch < found.assignment_epoch
        and all(members[m].member_epoch == found.assignment_epoch for m in others | {joiner})
        and owned(members[joiner].assignment) != owned(members[joiner].target_assignment)
    )


def stable(found: Any, member_ids: set[str], epoch: int, partitions: int) -> bool:
    """Stable at ``epoch`` (no rebalance since the fault), the same members, each at the
    assignment epoch with its whole target, every partition owned by exactly one."""
    members = members_of(found)
    if set(members) != member_ids or str(found.group_state) != "Stable":
        return False
    shares = [owned(m.assignment) for m in members.values()]
    return (
        found.group_epoch == found.assignment_epoch == epoch
        and all(m.member_epoch == epoch for m in members.values())
        and all(owned(m.assignment) == owned(m.target_assignment) for m in members.values())
        and sum(map(len, shares)) == len(frozenset().union(*shares)) == partitions
    )


def wait_for(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"not after {timeout:.0f} s: {what}"
        time.sleep(0.2)
    return found


class CommittedOffsets:
    """The group's committed offsets as its coordinator answers OffsetFetch, sampled from a
    thread until stopped (from whichever broker answers: some are dead or asleep):
    `stop()` lists every partition whose committed offset ever went down. (Not an admin client:
    librdkafka 2.16's aborts on an assertion when a coordinator dies under its ListOffsets.)"""

    def __init__(self, brokers: list[Any]) -> None:
        self.by_id = {int(b.env["KAFSCALE_BROKER_ID"]): b for b in brokers}
        self.samples: list[dict[int, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.3):
            for broker in self.by_id.values():
                try:
                    found = ask_quickly(broker, 10, 3, key=GROUP, key_type=0)
                    if found.error_code != ErrorCode.none:
                        continue
                    fetched = ask_quickly(self.by_id[found.node_id], 9, 5, group_id=GROUP,
                                          topics=None)  # fmt: skip
                except (OSError, KeyError):  # dead, asleep, or not a broker of ours
                    continue
                if fetched.error_code == ErrorCode.none:
                    self.samples.append(
                        {
                            int(p.partition_index): int(p.committed_offset)
                            for t in fetched.topics
                            if t.name == scale_out.TOPIC
                            for p in t.partitions
                            if p.error_code == ErrorCode.none and p.committed_offset >= 0
                        }
                    )
                    break

    def stop(self) -> list[str]:
        self._stop.set()
        self._thread.join(30)
        wrong: list[str] = []
        highest: dict[int, int] = {}
        for n, sample in enumerate(self.samples):
            for partition, offset in sample.items():
                if offset < highest.get(partition, -1):
                    wrong.append(f"p{partition}: {highest[partition]} then {offset} (#{n})")
                highest[partition] = max(offset, highest.get(partition, -1))
        return wrong


def ask_quickly(broker: Any, api_key: int, version: int, **fields: Any) -> Any:
    request = codec.build(load_request_schema(api_key, version), **fields)
    with Wire(("127.0.0.1", broker.port), timeout=2) as wire:
        wire.send(request)
        return wire.read_response(load_response_schema(api_key, version))[1]


def stored_group(broker: Any) -> dict[str, tuple[bytes, int]]:
    """The group's keys in etcd: key -> (value, mod revision)."""
    store = EtcdMetadataStore(list(broker.env["KAFSCALE_ETCD_ENDPOINTS"].split(",")))
    try:
        keys = ConsumerGroupKeys(Keys(broker.env["KAFSCALE_S3_NAMESPACE"]).root)
        prefix = keys.group_prefix(GROUP)
        return {kv.key: (kv.value, kv.mod_revision) for kv in store.get_prefix(prefix)}
    finally:
        store.close()


def leave_request(member_id: str, epoch: int = -1) -> Any:
    return codec.build(
        load_request_schema(68, 1),
        group_id=GROUP,
        member_id=member_id,
        member_epoch=epoch,
        instance_id=None,
        rack_id=None,
        rebalance_timeout=datetime.timedelta(milliseconds=-1),
        subscribed_topic_names=None,
        subscribed_topic_regex=None,
        server_assignor=None,
        topic_partitions=None,
    )


@pytest.mark.parametrize(
    ("fault", "clients"),
    [
        ("kill", "confluent-kafka"),
        ("pause", "confluent-kafka"),
        pytest.param("kill", "java-4", marks=[pytest.mark.java, pytest.mark.long]),
    ],
)
def test_a_consumer_group_converges_when_its_coordinator_fails_while_it_reconciles(
    start_broker: Callable[..., Any],
    group_consumers: GroupConsumers,
    request: pytest.FixtureRequest,
    fault: str,
    clients: str,
) -> None:
    """Two members share six partitions under idempotent load; one is paused (SIGSTOP) and a
    third joins, so the target moves a partition from each old member to it: the other old
    member gives its up, the joiner gets it and waits for the paused one's. Then the coordinator
    is SIGKILLed (or SIGSTOPped past its lease) and the paused member woken. The members are
    librdkafka's; with "java-4" the paused member and the joiner are kafka-clients 4's."""
    brokers = start_cluster(start_broker, 3, ENV)
    create_topic(brokers)
    wait_for_leaders(brokers, {0, 1, 2})
    by_id = {int(b.env["KAFSCALE_BROKER_ID"]): b for b in brokers}
    old = coordinator_seen_by(brokers[0], GROUP)
    coordinator = by_id[old]
    survivors = [b for node, b in by_id.items() if node != old]
    partitions = {(scale_out.TOPIC, p) for p in range(scale_out.PARTITIONS)}
    load = LoadProducer(brokers, History(), "p1")
    load.start()
    load.wait_acked(300)  # records before the group exists, then during everything below
    commits = CommittedOffsets(brokers)

    def member(client: str) -> GroupConsumer:
        return group_consumers.start(
            client, bootstrap(brokers), [scale_out.TOPIC], GROUP,
            timeout=150, configs={**MEMBER_CONFIGS, REQUEST_TIMEOUT[client]: 6000},
        )  # fmt: skip

    paused, other = member(clients), member("confluent-kafka")
    members = [paused, other]
    wait_for_assignment(members, partitions, timeout=60)
    for m in members:
        m.wait_for(lambda c: c.committed, timeout=30, what="a commit")
    paused_id, other_id = paused.member_id, other.member_id
    assert paused_id is not None and other_id is not None
    family = [coordinator.pid, *coordinator.children()]
    # Whatever fails below, nothing stays stopped for the teardown.
    request.addfinalizer(lambda: signal_all([paused.pid, *family], signal.SIGCONT))

    signal_all([paused.pid], signal.SIGSTOP)
    members.append(member(clients))
    moment = wait_for(
        lambda: reconciling(found := describe(coordinator), paused_id, {other_id}) and found,
        30,
        "the joiner waiting for the paused member's partition",
    )
    ids = set(members_of(moment))
    joiner = next(iter(ids - {paused_id, other_id}))
    print(f"broker {old} coordinates at group epoch {moment.group_epoch}: the joiner has "
          f"{sorted(owned(members_of(moment)[joiner].assignment))} of "
          f"{sorted(owned(members_of(moment)[joiner].target_assignment))}")  # fmt: skip

    faulted = time.monotonic()
    try:
        if fault == "kill":
            coordinator.kill()
        else:
            signal_all(family, signal.SIGSTOP)
        signal_all([paused.pid], signal.SIGCONT)
        # The members finish the reconciliation on another broker, which every live broker
        # names: the same members, each at or past its epoch, no new group epoch.
        wait_for_assignment(members, partitions, timeout=60)
        converged = time.monotonic()
        found = wait_for(
            lambda: stable(found := described_by_coordinator(survivors, old), ids,
                           moment.group_epoch, len(partitions)) and found,
            30,
            "the group stable at its epoch on another coordinator",
        )  # fmt: skip
        for member_id, before in members_of(moment).items():
            assert members_of(found)[member_id].member_epoch >= before.member_epoch
        # As an admin client sees it (ConsumerGroupDescribe through librdkafka).
        admin_view = describe_with_admin(survivors)
        assert str(admin_view.type).endswith("CONSUMER"), admin_view
        assert str(admin_view.state).endswith("STABLE"), admin_view
        assert admin_view.coordinator.id != old, admin_view
        shares = [
            sorted((tp.topic, tp.partition) for tp in m.assignment.topic_partitions)
            for m in admin_view.members
        ]
        assert sorted(tp for share in shares for tp in share) == sorted(partitions), shares
        print(f"stable {converged - faulted:.1f} s after the fault on broker "
              f"{admin_view.coordinator.id}: {sorted(shares)}")  # fmt: skip

        if fault == "pause":
            print(wake_the_old_coordinator(coordinator, family, joiner, faulted))
            again = wait_for(
                lambda: stable(found := described_by_coordinator(survivors), ids,
                               moment.group_epoch, len(partitions)) and found,
                30,
                "the group still stable at its epoch",
            )  # fmt: skip
            assert again.group_epoch == moment.group_epoch

        # Consumption carries on: every partition gets 100 new records, every member reads some.
        deadline = time.monotonic() + 60
        while min(sum(t > converged for t in load.acked_at[p]) for p in load.acked_at) < 100:
            assert time.monotonic() < deadline, "the load did not carry on"
            time.sleep(0.2)
        load.stop()
        for m in members:
            m.wait_for(lambda c: sum(r.at > converged for r in c.records) >= 50, 60, "50 records")
        wait_until_everything_acked_was_read(members, load.history)
        lost = [(m.name, e.data) for m in members for e in m.of_kind("lost")]
        assert not lost, f"members were fenced and lost their partitions: {lost}"
        for m in members:  # each commits what it read and leaves
            assert m.terminate() == 0, m.report()
    finally:
        backwards = commits.stop()
        for m in members:  # what each member went through, for the log
            print(timeline(m, faulted))
    assert len(commits.samples) > 10, commits.samples
    assert not backwards, f"committed offsets went backwards: {backwards}"
    ends = end_offsets(bootstrap(survivors), scale_out.TOPIC, scale_out.PARTITIONS)
    wait_for(lambda: committed(survivors) == ends, 30, f"everything committed: {ends}")
    wrong = restarts_below_commits(members)
    assert not wrong, wrong
    for m in members:
        for r in m.records:
            assert r.value is not None
            load.history.saw(scale_out.TOPIC, r.tp[1], r.offset, r.value.encode())
    print(load.history.check(), dict(load.errors))


def describe_with_admin(brokers: list[Any]) -> Any:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap(brokers)})
    return admin.describe_consumer_groups([GROUP])[GROUP].result(30)


def committed(brokers: list[Any]) -> list[int]:
    return committed_offsets(bootstrap(brokers), GROUP, scale_out.TOPIC, scale_out.PARTITIONS)


def wake_the_old_coordinator(
    coordinator: Any, family: list[int], joiner: str, paused_at: float
) -> str:
    """While it still sleeps, a leave of the joiner reaches the old coordinator (queued in its
    socket, as a heartbeat sent just before the pause would be); once every member's session it
    remembers has run out, its processes are woken, the supervisor last (which, finding its
    lease gone, restarts them and rejoins). Before it notices it lost the group's partition,
    the coordinator removes the members it thinks dead (or serves the leave): writes its fence
    refuses. The group's keys in etcd stay as they were. Returns what happened, for the log."""
    supervisor, children = family[0], family[1:]
    before = stored_group(coordinator)
    with Wire(("127.0.0.1", coordinator.port), timeout=60) as wire:
        wire.send(leave_request(joiner))
        log_from = len(coordinator.log_text())
        time.sleep(max(0.0, paused_at + SESSION_MS / 1000 + 1 - time.monotonic()))
        signal_all(children, signal.SIGCONT)
        try:
            answer = wire.read_response(load_response_schema(68, 1))[1]
            said = f"the stale leave was answered {ErrorCode(answer.error_code).name}"
            assert answer.error_code == ErrorCode.not_coordinator, said
        except ConnectionError:
            said = "the stale leave's connection was closed"
        wait_for(
            lambda: "no longer coordinating groups" in coordinator.log_text()[log_from:],
            30,
            "the woken coordinator to stop coordinating the group",
        )
    signal_all([supervisor], signal.SIGCONT)
    assert stored_group(coordinator) == before, "the woken coordinator changed the group's keys"
    woken = coordinator.log_text()[log_from:].splitlines()
    told = [line for line in woken if '"msg":"' in line and _about_groups(line)]
    assert any("a group write was fenced" in line for line in told), "\n".join(woken[-40:])
    return "\n".join([said, *told])


def _about_groups(line: str) -> bool:
    message = line.split('"msg":"', 1)[1].split('"', 1)[0]
    return any(word in message for word in ("fenced", "not stored", "coordinating groups"))
