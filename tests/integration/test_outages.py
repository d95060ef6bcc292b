"""Dependency outages under produce load: etcd stopped for a minute, S3 paused (SIGSTOP: it keeps
its sockets and answers nothing), shards SIGKILLed again and again while S3 is paused.

What must hold: while a backend is down, produce is refused with retriable errors -- at once,
not after hanging for the outage -- and /readyz says not ready; the broker never exits; it
recovers by itself once the backend is back; no acknowledged record is lost; and no committed
object's bytes ever change (every committed segment record matches its object).
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from kio.index import load_request_schema, load_response_schema

from kafscale import config as configuration
from kafscale.metadata import open_metadata_store, records
from kafscale.metadata.records import Keys
from kafscale.protocol import codec
from kafscale.protocol import records as batches
from kafscale.protocol.errors import ErrorCode
from kafscale.storage import open_object_store, wal
from kafscale.storage import segment as segments
from tests.harness.procs import LOOPBACK
from tests.harness.stored import committed_records

from .test_produce import high_watermark
from .test_supervision import roles
from .wire import Wire

pytestmark = pytest.mark.integration

REQUEST = load_request_schema(0, 9)
RESPONSE = load_response_schema(0, 9)
REQUEST_TIMEOUT_MS = 3000


@dataclass(frozen=True)
class Outcome:
    sent_at: float
    elapsed: float
    value: bytes
    error: ErrorCode | None  # None: the connection failed
    base_offset: int = -1


@dataclass(eq=False)  # a Thread must stay hashable
class Load(threading.Thread):
    """One connection producing one record per request to one partition until stopped."""

    broker: Any
    topic: str
    partition: int
    acks: int
    prefix: str
    outcomes: list[Outcome] = field(default_factory=list)
    stopping: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        threading.Thread.__init__(self, name=f"load-{self.prefix}", daemon=True)

    def run(self) -> None:
        wire: Wire | None = None
        sequence = 0
        while not self.stopping.is_set():
            sequence += 1
            value = f"{self.prefix}-{sequence}".encode()
            sent = time.monotonic()
            try:
                if wire is None:
                    wire = Wire((LOOPBACK, self.broker.port), timeout=60)
                wire.send(self._request(value), sequence)
                _, response = wire.read_response(RESPONSE)
            except (OSError, ConnectionError):
                self.outcomes.append(Outcome(sent, time.monotonic() - sent, value, None))
                if wire is not None:
                    wire.close()
                wire = None
                self.stopping.wait(0.2)
                continue
            result = response.responses[0].partition_responses[0]
            error = ErrorCode(result.error_code)
            self.outcomes.append(
                Outcome(sent, time.monotonic() - sent, value, error, int(result.base_offset))
            )
            if error != ErrorCode.none:
                self.stopping.wait(0.05)  # pacing while refused, as a client's retry.backoff.ms
        if wire is not None:
            wire.close()

    def _request(self, value: bytes) -> Any:
        blob = batches.build_batch([(None, value, (), int(time.time() * 1000))])
        return codec.build(
            REQUEST,
            transactional_id=None,
            acks=self.acks,
            timeout=datetime.timedelta(milliseconds=REQUEST_TIMEOUT_MS),
            topic_data=(
                codec.build(
                    codec.nested(REQUEST, "TopicProduceData"),
                    name=self.topic,
                    partition_data=(
                        codec.build(
                            codec.nested(REQUEST, "PartitionProduceData"),
                            index=self.partition,
                            records=blob,
                        ),
                    ),
                ),
            ),
        )

    def acknowledged(self) -> list[Outcome]:
        return [o for o in list(self.outcomes) if o.error == ErrorCode.none]

    def succeeded_after(self, moment: float) -> bool:
        return any(o.sent_at >= moment for o in self.acknowledged())

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=90)
        assert not self.is_alive(), f"{self.name} did not stop"


def produce_once(broker: Any, topic: str) -> ErrorCode:
    """One acks=all request on a fresh connection; its error code (raises if the broker closed
    the connection instead of answering)."""
    load = Load(broker, topic, 0, -1, "once")
    with Wire((LOOPBACK, broker.port), timeout=60) as wire:
        wire.send(load._request(b"once"), 1)
        _, response = wire.read_response(RESPONSE)
    return ErrorCode(response.responses[0].partition_responses[0].error_code)


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.2)


def readyz(broker: Any) -> tuple[int, list[str]]:
    url = f"http://{LOOPBACK}:{broker.metrics_port}/readyz"
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status), json.loads(response.read())["problems"]
    except urllib.error.HTTPError as exc:
        return int(exc.code), json.loads(exc.read())["problems"]


def s3_healthy(broker: Any) -> list[float]:
    """The values of kafscale_s3_healthy{shard}, one per shard."""
    return [
        float(line.rsplit(" ", 1)[1])
        for line in broker.metrics_text().splitlines()
        if line.startswith("kafscale_s3_healthy{")
    ]


@dataclass
class Watch:
    """What the broker showed during an outage, sampled about once a second."""

    readyz: list[tuple[int, list[str]]] = field(default_factory=list)
    s3_healthy: list[list[float]] = field(default_factory=list)

    def sample(self, broker: Any, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            assert broker.running, f"the broker exited during the outage\n{broker.log_tail()}"
            self.readyz.append(readyz(broker))
            self.s3_healthy.append(s3_healthy(broker))
            time.sleep(1.0)


@pytest.fixture
def loads() -> Iterator[list[Load]]:
    started: list[Load] = []
    yield started
    for load in started:
        load.stopping.set()
    for load in started:
        load.join(timeout=90)


def start_loads(
    loads: list[Load], broker: Any, topic: str, partitions: int, acks: int = -1
) -> list[Load]:
    for partition in range(partitions):
        load = Load(broker, topic, partition, acks, f"{topic}-p{partition}-acks{acks}")
        loads.append(load)
        load.start()
    return loads


# --- what is committed ---------------------------------------------------------------------------


def committed_objects(
    broker: Any, topic: str, partitions: int, quiescent: bool = True
) -> dict[str, str]:
    """{object key: sha256} of every object a committed log entry lies in (a segment's ``.kfs``,
    a chunk's write-ahead object), after checking each entry's record against its object: the
    object exists, parses with every CRC right, and holds exactly the size, offsets, record count
    and seal time its record says (a chunk: its directory entry at the record's position); and
    the records cover the log without a gap, up to the high watermark (beyond it too if commits
    go on while we read: ``quiescent=False``)."""
    config = configuration.load(broker.env)
    store = open_metadata_store(config)
    objects = open_object_store(config)
    keys = Keys(config.s3_namespace)
    found: dict[str, str] = {}
    wal_objects: dict[str, wal.ParsedObject] = {}
    problems: list[str] = []
    try:
        for partition in range(partitions):
            state_kv = store.get(keys.partition(topic, partition))
            state = records.decode_partition(state_kv.value) if state_kv else None
            expected_next = state.log_start_offset if state else 0
            for kv in store.get_prefix(keys.segments(topic, partition)):
                record = records.decode_segment(kv.value)
                if record.is_chunk:
                    key = record.object
                    if key not in wal_objects:
                        data = objects.get(key)
                        found[key] = hashlib.sha256(data).hexdigest()
                        wal_objects[key] = wal.parse_object(data)  # verifies every CRC
                    problem = chunk_problem(wal_objects[key], topic, partition, record)
                else:
                    key = segments.segment_key(
                        config.s3_namespace, topic, partition, record.base_offset
                    )
                    data = objects.get(key)
                    found[key] = hashlib.sha256(data).hexdigest()
                    problem = segment_problem(data, record)
                if problem:
                    problems.append(f"{key}: {problem}")
                if record.base_offset != expected_next:
                    problems.append(f"{key}: expected an entry at {expected_next}")
                expected_next = record.last_offset + 1
            reached = state.high_watermark if state is not None else 0
            if expected_next != reached and (quiescent or expected_next < reached):
                problems.append(
                    f"{topic}/{partition}: entries end at {expected_next}, high watermark {reached}"
                )
    finally:
        store.close()
        objects.close()
    assert not problems, "\n".join(problems)
    return found


def segment_problem(data: bytes, record: records.SegmentRecord) -> str | None:
    """What a ``.kfs`` holds that its segment record does not say, if anything."""
    try:
        parsed = segments.parse_segment(data)
    except segments.CorruptSegment as exc:
        return str(exc)
    held = (len(data), parsed.base_offset, parsed.last_offset, parsed.record_count)
    said = (record.size, record.base_offset, record.last_offset, record.records)
    if (*held, parsed.created_ms) != (*said, record.created_ms):
        return (
            f"the record says (size, base, last, records, created ms) "
            f"{(*said, record.created_ms)}, the object holds {(*held, parsed.created_ms)}"
        )
    return None


def chunk_problem(
    parsed: wal.ParsedObject, topic: str, partition: int, record: records.SegmentRecord
) -> str | None:
    """What the write-ahead object's directory says of the chunk at the record's position that
    the chunk record does not, if anything (the chunk's batches are checked by their CRCs)."""
    at = [e for e in parsed.entries if e.position == record.position]
    if len(at) != 1:
        return f"no chunk starts at position {record.position}"
    entry = at[0]
    fields = ("topic", "partition", "size", "base", "last", "records", "codec", "created ms")
    held = (
        entry.topic,
        entry.partition,
        entry.size,
        entry.base_offset,
        entry.last_offset,
        entry.records,
        entry.codec,
        entry.created_ms,
    )
    said = (
        topic,
        partition,
        record.size,
        record.base_offset,
        record.last_offset,
        record.records,
        record.codec,
        record.created_ms,
    )
    if held != said:
        return f"the record says {dict(zip(fields, said, strict=True))}, the directory holds {held}"
    return None


def committed_values(broker: Any, topic: str, partition: int) -> list[bytes]:
    """The values of the partition's committed records, in offset order (segments and chunks)."""
    return [r.value for r in committed_records(broker.env, topic, partition) if r.value is not None]


def assert_nothing_acknowledged_lost(
    broker: Any, loads: list[Load], acks1_committed_before: float | None = None
) -> None:
    """Every acknowledged record is committed, once. With ``acks1_committed_before`` (the broker
    lost its lease and rejoined), acks=1 records are only required up to 5 s before that moment
    (a flush interval and a commit, with room): later ones may have been dropped with the old
    children."""
    for load in loads:
        acknowledged = load.acknowledged()
        if acks1_committed_before is not None and load.acks == 1:
            acknowledged = [o for o in acknowledged if o.sent_at < acks1_committed_before - 5.0]
        # acks=1 records are committed a flush interval after their answer: wait for the last.
        last = max((o.base_offset for o in acknowledged), default=-1)
        wait_for(
            lambda load=load, last=last: high_watermark(broker, load.topic, load.partition) > last,
            60,
            f"{load.name}: every acknowledged record committed",
        )
        stored = committed_values(broker, load.topic, load.partition)
        assert len(stored) == len(set(stored)), f"{load.name}: a record stored twice"
        missing = {o.value for o in acknowledged} - set(stored)
        assert not missing, f"{load.name}: {len(missing)} acknowledged records lost"
        dropped = len({o.value for o in load.acknowledged()} - set(stored))
        if dropped:
            print(f"{load.name}: {dropped} acks=1 records acknowledged late were dropped")


def assert_refused_with_retriable_errors(loads: list[Load], start: float, end: float) -> None:
    """Between ``start`` and ``end`` (monotonic) nothing was acknowledged, every answer was a
    retriable error, and some refusals came at once (not after waiting out a timeout)."""
    during = [o for load in loads for o in load.outcomes if start <= o.sent_at < end]
    assert during, "no request was sent during the outage"
    assert not [o for o in during if o.error == ErrorCode.none], "acknowledged during the outage"
    assert not [o for o in during if o.error is None], "connections failed during the outage"
    assert all(o.error is not None and o.error.retriable for o in during), {o.error for o in during}
    fast = [o for o in during if o.error == ErrorCode.kafka_storage_error and o.elapsed < 1.0]
    assert fast, f"never refused at once: {sorted({str(o.error) for o in during})}"


def assert_only_retriable_errors(loads: list[Load], closed_after: float | None = None) -> None:
    """Every answer a success or a retriable error, and no failed connection -- except, with
    ``closed_after``, from then until the load's next success (the broker rejoined: its
    listener was closed while its children restarted)."""
    for load in loads:
        reopened = min(
            (o.sent_at for o in load.acknowledged() if o.sent_at >= (closed_after or 0.0)),
            default=float("inf"),
        )
        bad = [
            o
            for o in load.outcomes
            if (
                o.error is None
                and not (closed_after is not None and closed_after <= o.sent_at < reopened)
            )
            or (o.error is not None and o.error != ErrorCode.none and not o.error.retriable)
        ]
        assert not bad, f"{load.name}: {bad[:5]}"


# --- the tests -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("how", "seconds"),
    [
        pytest.param("stopped", 60, marks=pytest.mark.long),
        ("paused", 30),
    ],
)
def test_etcd_down_under_load(
    start_broker: Callable[..., Any], etcd_server: Any, loads: list[Load], how: str, seconds: int
) -> None:
    broker = start_broker(backends="real", env={"KAFSCALE_AUTO_CREATE_PARTITIONS": "2"})
    broker.wait_ready()
    start_loads(loads, broker, "etcd-outage", 2)
    start_loads(loads, broker, "etcd-outage-acks1", 1, acks=1)
    wait_for(lambda: all(len(load.acknowledged()) >= 5 for load in loads), 60, "produce")
    watch = Watch()
    if how == "stopped":
        etcd_server.stop()
    else:
        etcd_server.pause()  # calls time out instead of being refused
    stopped_at = time.monotonic()
    try:
        watch.sample(broker, 10)
        # A topic that does not exist cannot be created now: a retriable error, not a closed
        # connection (the coordinator answers that its store is down).
        assert produce_once(broker, "etcd-outage-new").retriable
        # Processes that must boot while etcd is down (the reported failure: the coordinator
        # failed to boot 5 times in 11 s and the broker exited) keep trying, with back-off.
        before = roles(broker)
        for victim in ("coordinator-0", "flusher-0"):
            os.kill(before[victim], signal.SIGKILL)
        watch.sample(broker, seconds - 10)
    finally:
        if how == "stopped":
            etcd_server.start()
        else:
            etcd_server.resume()
    restarted_at = time.monotonic()
    wait_for(
        lambda: all(load.succeeded_after(restarted_at) for load in loads),
        90,
        "produce to succeed again after etcd came back",
    )
    recovered_in = max(
        min(o.sent_at for o in load.acknowledged() if o.sent_at >= restarted_at) - restarted_at
        for load in loads
    )
    for load in loads:
        load.stop()
    assert broker.running
    after = roles(broker)
    assert after["coordinator-0"] != before["coordinator-0"]
    assert after["flusher-0"] != before["flusher-0"]
    assert '"stopping the broker"' not in broker.log_text()
    # A stopped etcd keeps its leases (it re-arms them when it starts). A paused one expires the
    # broker lease when it resumes (the lease was not refreshed for 30 s, 10 s TTL), unless a
    # refresh wins the race: the broker then kills its children and rejoins in place, its
    # listener closed for a moment, its acks=1 records not yet committed dropped (as a Kafka
    # leader that lost its leadership truncates).
    rejoined = "rejoining the cluster with a new broker lease" in broker.log_text()
    assert not (rejoined and how == "stopped")
    # Detection: a stopped etcd refuses connections at once (the flush interval and one commit);
    # a paused one lets a commit wait out KAFSCALE_ETCD_TIMEOUT_MS (5 s) first.
    detected = 5.0 if how == "stopped" else 10.0
    assert_refused_with_retriable_errors(loads, stopped_at + detected, restarted_at)
    assert_only_retriable_errors(loads, closed_after=restarted_at if rejoined else None)
    assert any(status == 503 and "metadata" in " ".join(p) for status, p in watch.readyz)
    wait_for(lambda: readyz(broker)[0] == 200, 60, "/readyz to say ready again")
    assert_nothing_acknowledged_lost(
        broker, loads, acks1_committed_before=stopped_at if rejoined else None
    )
    print(
        f"etcd {how} {seconds} s: {'rejoined with a new lease' if rejoined else 'kept its lease'}"
    )
    committed_objects(broker, "etcd-outage", 2)
    print(f"etcd {how} {seconds} s: produce recovered {recovered_in:.1f} s after etcd was back")


@pytest.mark.long
def test_s3_paused_under_load(
    start_broker: Callable[..., Any], s3_server: Any, loads: list[Load]
) -> None:
    broker = start_broker(backends="real", env={"KAFSCALE_AUTO_CREATE_PARTITIONS": "2"})
    broker.wait_ready()
    start_loads(loads, broker, "s3-outage", 2)
    start_loads(loads, broker, "s3-outage-acks1", 1, acks=1)
    wait_for(lambda: all(len(load.acknowledged()) >= 5 for load in loads), 60, "produce")
    before = committed_objects(broker, "s3-outage", 2, quiescent=False)
    watch = Watch()
    with s3_server.paused():
        paused_at = time.monotonic()
        watch.sample(broker, 30)
    resumed_at = time.monotonic()
    wait_for(
        lambda: all(load.succeeded_after(resumed_at) for load in loads),
        90,
        "produce to succeed again after S3 came back",
    )
    for load in loads:
        load.stop()
    assert broker.running
    # Detection is bounded by KAFSCALE_S3_LATENCY_THRESHOLD_MS (5 s) plus an in-flight request.
    assert_refused_with_retriable_errors(loads, paused_at + 10.0, resumed_at)
    assert_only_retriable_errors(loads)
    assert any(status == 503 and "objects" in " ".join(p) for status, p in watch.readyz)
    assert any(values and 0.0 in values for values in watch.s3_healthy), watch.s3_healthy
    first_refused = min(
        o.sent_at + o.elapsed
        for load in loads
        for o in load.outcomes
        if o.sent_at >= paused_at and o.error == ErrorCode.kafka_storage_error
    )
    wait_for(lambda: readyz(broker)[0] == 200, 60, "/readyz to say ready again")
    assert_nothing_acknowledged_lost(broker, loads)
    after = committed_objects(broker, "s3-outage", 2)
    assert {key: after.get(key) for key in before} == before
    print(f"S3 paused 30 s: first KAFKA_STORAGE_ERROR {first_refused - paused_at:.1f} s in")


# Its waits alone can add up past the default 300 s on a loaded machine (a 30 s pause, dozens of
# shard kills, recovery, then reading back every committed object): a clean-clone run once hit
# the timeout in that last read, and another took 304 s. .ci/run pauses S3 for 10 s (a handful
# of kills per shard); scripts/long-tests.sh for 30.
@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "pause", [10, pytest.param(30, marks=pytest.mark.long)], ids=["10s", "30s"]
)
def test_shards_killed_while_s3_is_paused_never_change_a_committed_object(
    start_broker: Callable[..., Any], s3_server: Any, loads: list[Load], pause: float
) -> None:
    broker = start_broker(
        backends="real",
        env={"KAFSCALE_AUTO_CREATE_PARTITIONS": "4", "KAFSCALE_FLUSH_INTERVAL_MS": "100"},
    )
    broker.wait_ready()
    start_loads(loads, broker, "kill-paused", 4, acks=1)
    start_loads(loads, broker, "kill-paused-all", 2, acks=-1)
    wait_for(lambda: all(len(load.acknowledged()) >= 20 for load in loads), 60, "produce")
    snapshots = [committed_objects(broker, "kill-paused", 4, quiescent=False)]
    kills = 0
    with s3_server.paused():
        paused_at = time.monotonic()
        while time.monotonic() - paused_at < pause:
            for victim in ("shard-0", "shard-1"):
                pid = roles(broker)[victim]
                os.kill(pid, signal.SIGKILL)
                kills += 1
                wait_for(
                    lambda victim=victim, pid=pid: roles(broker).get(victim, pid) != pid,
                    30,
                    f"{victim} to be respawned",
                )
                assert broker.running
                # The new shard takes appends until its own first flush stalls: let some in
                # (they make the buffers whose flushes race their predecessor's), if it does.
                acked = acknowledged_count(loads)
                with contextlib.suppress(AssertionError):
                    wait_for(lambda acked=acked: acknowledged_count(loads) > acked + 10, 5, "")
    resumed_at = time.monotonic()
    wait_for(
        lambda: all(load.succeeded_after(resumed_at) for load in loads),
        120,
        "produce to succeed again on every partition after S3 came back",
    )
    snapshots.append(committed_objects(broker, "kill-paused", 4, quiescent=False))
    acked = acknowledged_count(loads)
    wait_for(lambda: acknowledged_count(loads) > acked + 200, 60, "more produce after recovery")
    for load in loads:
        load.stop()
    assert broker.running
    assert_nothing_acknowledged_lost(broker, [load for load in loads if load.acks == -1])
    for load in loads:  # wait for the buffered acks=1 records to be committed
        last = max(o.base_offset for o in load.acknowledged())
        wait_for(
            lambda load=load, last=last: high_watermark(broker, load.topic, load.partition) > last,
            60,
            f"{load.name}: everything committed",
        )
    final = committed_objects(broker, "kill-paused", 4)
    committed_objects(broker, "kill-paused-all", 2)
    for snapshot in snapshots:
        changed = [key for key, digest in snapshot.items() if final.get(key) != digest]
        assert not changed, f"committed objects changed: {changed}"
    assert_only_retriable_errors(loads)
    # A killed shard's successor adopts its buffers: acks=1 records survive too (issue 14, 3).
    assert_nothing_acknowledged_lost(broker, [load for load in loads if load.acks == 1])
    print(f"{kills} shard kills during a {pause} s S3 pause; {len(final)} committed objects intact")


def acknowledged_count(loads: list[Load]) -> int:
    return sum(len(load.acknowledged()) for load in loads)
