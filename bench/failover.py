"""Failover and hand-over times through three brokers (issue 16): how long the partitions of a
broker that leaves cannot acknowledge a produce.

    .venv/bin/python -m bench.failover                        # kill and term, TTL 10 s and 6 s
    .venv/bin/python -m bench.failover --ttl-ms 6000 --faults kill --repeats 2

For each lease TTL (KAFSCALE_STORE_LOCK_TTL_MS) a fresh `kafscale-s3x3` target (bench/targets.py:
three brokers on MinIO + etcd, S3 latency added as bench.run does), one topic, and an idempotent
acks=all confluent-kafka producer sending a steady rate round-robin over every partition, each
acknowledgement's arrival time and offset kept. Then, `--repeats` times per fault kind, one
broker (in turn) is SIGKILLed with its whole process family, or SIGTERMed (it hands its
partitions over and exits); once the survivors agree on new owners for everything, the figures
of each moved partition come from its acknowledgements and its new leader epoch's first offset
(bench/outage.py); the broker is started again on its id and ports, and the partitions balance
back before the next fault. Results: bench/results/<date>-<time>-failover.json and .md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import AdminClient

from bench import outage
from bench import python_driver as py
from bench.outage import Ack
from bench.procstats import tree_pids
from bench.run import RESULTS, command_line, load_average, machine
from bench.targets import KafScaleTarget, S3Latency
from kafscale.metadata import records
from kafscale.metadata.etcd import EtcdMetadataStore
from kafscale.metadata.records import Keys
from tests.harness.broker import BrokerProcess

TOPIC = "failover"
PRODUCER = {
    "acks": "all",
    "enable.idempotence": "true",
    "linger.ms": "5",
    "message.timeout.ms": "120000",
}
SETTLE_TIMEOUT = 120.0  # for owners to move, or for a moved partition's first acknowledgement
HOLD_S = 5.0  # steady load before each fault, after the partitions balanced and acknowledge
RECENT_S = 2.0  # every partition acknowledged within this before a fault
WATCH_INTERVAL = 0.2  # how often a survivor's Metadata is asked for the leaders during a fault


class Load:
    """An idempotent acks=all producer sending `rate` records/s round-robin over the topic's
    partitions from a thread; `acks[p]` holds (arrival time, offset) of each acknowledgement."""

    def __init__(self, bootstrap: str, partitions: int, rate: float, record_size: int) -> None:
        self.producer = Producer({"bootstrap.servers": bootstrap, **PRODUCER})
        self.partitions, self.rate = partitions, rate
        self.value = py.payload(record_size)
        self.acks: dict[int, list[Ack]] = {p: [] for p in range(partitions)}
        self.errors: Counter[str] = Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="load", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        left = self.producer.flush(120)
        if left:
            self.errors["unacknowledged at the end"] += left

    def acked_recently(self, seconds: float) -> bool:
        now = time.monotonic()
        return all(acks and acks[-1][0] > now - seconds for acks in self.acks.values())

    def _delivered(self, err: KafkaError | None, message: Message) -> None:
        if err is not None:
            self.errors[err.name()] += 1
            return
        partition, offset = message.partition(), message.offset()
        if partition is not None and offset is not None:
            self.acks[partition].append((time.monotonic(), offset))

    def _run(self) -> None:
        started, sent = time.monotonic(), 0
        while not self._stop.is_set():
            wait = started + sent / self.rate - time.monotonic()
            if wait > 0:
                self.producer.poll(min(wait, 0.01))  # callbacks are served while waiting
                continue
            try:
                self.producer.produce(
                    TOPIC, self.value, partition=sent % self.partitions, on_delivery=self._delivered
                )
                sent += 1
            except BufferError:
                self.producer.poll(0.01)
            self.producer.poll(0)


class Cluster:
    """The three brokers of a target, their leader views and the topic's etcd records."""

    def __init__(self, target: KafScaleTarget) -> None:
        self.target = target
        env = target.broker.env
        self.store = EtcdMetadataStore(env["KAFSCALE_ETCD_ENDPOINTS"].split(","))
        self.keys = Keys(env["KAFSCALE_S3_NAMESPACE"])

    def close(self) -> None:
        self.store.close()

    def leader_epochs(self) -> dict[int, tuple[int, int]]:
        """partition -> (owner, leader epoch), from the leader keys."""
        owners = {}
        for kv in self.store.get_prefix(self.keys.topic_leaders(TOPIC)):
            parsed = self.keys.parse_leader(kv.key)
            if parsed is not None:
                leader = records.decode_leader(kv.value)
                owners[parsed[1]] = (leader.owner, leader.epoch)
        return owners

    def epochs(self, partition: int) -> list[tuple[int, int]]:
        kv = self.store.get(self.keys.partition(TOPIC, partition))
        if kv is None:
            raise RuntimeError(f"{TOPIC}/{partition} has no partition record")
        return [tuple(entry) for entry in records.decode_partition(kv.value).epochs]  # type: ignore[misc]

    def wait_balanced(self, brokers: list[BrokerProcess], partitions: int) -> dict[int, int]:
        """Until each of `brokers` names one of them leader of every partition, they agree, and
        no broker leads more than one partition more than another: the leaders."""
        ids = {broker_id(b) for b in brokers}
        admins = [AdminClient({"bootstrap.servers": b.bootstrap}) for b in brokers]
        deadline = time.monotonic() + SETTLE_TIMEOUT
        views: list[dict[int, int]] = []
        while time.monotonic() < deadline:
            try:
                views = [leaders(admin) for admin in admins]
            except KafkaException:  # a broker slow to answer (claims, a loaded machine): again
                continue
            first = views[0]
            counts = Counter(first.values())
            if (
                len(first) == partitions
                and set(first.values()) <= ids
                and all(view == first for view in views[1:])
                and max(counts.get(i, 0) for i in ids) - min(counts.get(i, 0) for i in ids) <= 1
            ):
                return first
            time.sleep(0.2)
        raise RuntimeError(f"leaders did not settle on brokers {sorted(ids)}: {views}")


def broker_id(broker: BrokerProcess) -> int:
    return int(broker.env["KAFSCALE_BROKER_ID"])


def leaders(admin: AdminClient) -> dict[int, int]:
    metadata = admin.list_topics(TOPIC, timeout=10).topics.get(TOPIC)
    if metadata is None or metadata.error is not None:
        return {}
    return {p.id: p.leader for p in metadata.partitions.values()}


class LeaderWatch:
    """Polls the survivors' Metadata during a fault: when each partition was first named with
    a leader other than `before`'s."""

    def __init__(self, bootstrap: str, before: dict[int, int]) -> None:
        self.admin = AdminClient({"bootstrap.servers": bootstrap})
        self.before = before
        self.seen: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="leader-watch", daemon=True)
        self._thread.start()

    def stop(self) -> dict[int, float]:
        self._stop.set()
        self._thread.join(30)
        return self.seen

    def _run(self) -> None:
        while not self._stop.wait(WATCH_INTERVAL):
            try:
                view = leaders(self.admin)
            except Exception:  # a survivor busy or refusing for a moment: ask again
                continue
            now = time.monotonic()
            for p, leader in view.items():
                if leader >= 0 and leader != self.before.get(p) and p not in self.seen:
                    self.seen[p] = now


def kill_family(broker: BrokerProcess, family: list[int]) -> None:
    """SIGKILL every process of the broker (`family`, listed beforehand) at once, as a crash
    of its pod would, then reap them (and any process the list missed)."""
    for pid in family:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    broker.kill()


def one_fault(
    cluster: Cluster, load: Load, *, kind: str, victim_index: int, partitions: int
) -> dict[str, Any]:
    """One fault on the broker at `victim_index`, its figures, and the broker back in place."""
    target = cluster.target
    victim = target.brokers[victim_index]
    survivors = [b for b in target.brokers if b is not victim]
    before = cluster.leader_epochs()
    watch = LeaderWatch(
        ",".join(b.bootstrap for b in survivors), {p: owner for p, (owner, _) in before.items()}
    )
    errors_before = Counter(load.errors)
    exited: dict[str, float | int] = {}

    def terminate() -> None:
        exited["code"] = victim.terminate(timeout=90)
        exited["at"] = time.monotonic()

    stopper = threading.Thread(target=terminate, name="terminate")
    family = tree_pids(victim.pid)
    fault_at = time.monotonic()
    if kind == "kill":
        kill_family(victim, family)
    else:
        stopper.start()
    cluster.wait_balanced(survivors, partitions)
    after = cluster.leader_epochs()
    moved = {p: cluster.epochs(p) for p, (_, epoch) in after.items() if epoch > before[p][1]}
    starts = {p: outage.new_epoch(history, before[p][1]) for p, history in moved.items()}
    # Until every moved partition's new owner acknowledged something.
    deadline = time.monotonic() + SETTLE_TIMEOUT
    while waiting := [
        p for p, start in starts.items()
        if start is None or outage.first_ack_from(list(load.acks[p]), start[1]) is None
    ]:  # fmt: skip
        if time.monotonic() > deadline:
            raise RuntimeError(f"no acknowledgement from the new owners of {waiting}")
        time.sleep(0.2)
    seen = watch.stop()
    time.sleep(1.0)  # the acknowledgements just after the first, for the evidence below
    results: dict[int, dict[str, Any]] = {}
    for p, start in starts.items():
        assert start is not None
        acks = list(load.acks[p])
        found = outage.partition_outage(
            partition=p,
            acks=acks,
            fault_at=fault_at,
            old_owner=before[p][0],
            new_owner=after[p][0],
            epoch=start,
            leader_seen_at=seen.get(p),
        )
        assert found is not None
        last = fault_at + found.first_ack_s + 1.0
        results[p] = {**asdict(found), "acks": outage.bursts(acks, fault_at, last)}
    if kind == "term":
        stopper.join(120)
        if exited.get("code") != 0:
            raise RuntimeError(f"broker {broker_id(victim)} exited {exited.get('code')} on SIGTERM")
    # Back in place on its id and ports; the partitions balance back to it.
    target.brokers[victim_index] = target.start_broker(victim.env)
    return {
        "kind": kind,
        "victim": broker_id(victim),
        "partitions": [results[p] for p in sorted(results)],
        "exited_s": exited["at"] - fault_at if "at" in exited else None,
        "delivery_errors": dict(load.errors - errors_before),
    }


def measure_ttl(
    ttl_ms: int, args: argparse.Namespace, latency: S3Latency | None, broker_env: dict[str, str]
) -> tuple[str, dict[str, Any], list[dict[str, Any]]]:
    """A fresh cluster at this lease TTL and its faults: the target's description, its
    settings that matter here, and each fault's figures."""
    work = Path(tempfile.mkdtemp(prefix="kafscale-failover-"))
    env = {**broker_env, "KAFSCALE_STORE_LOCK_TTL_MS": str(ttl_ms)}
    target = KafScaleTarget(work, s3=True, latency=latency, env=env, brokers=3)
    faults: list[dict[str, Any]] = []
    target.start()
    cluster = Cluster(target)
    load: Load | None = None
    try:
        config = target.config()
        py.create_topic(target.bootstrap, TOPIC, args.partitions)
        cluster.wait_balanced(target.brokers, args.partitions)
        load = Load(target.bootstrap, args.partitions, args.rate, args.record_size)
        load.start()
        index = 0
        for kind in args.faults.split(","):
            for repeat in range(1, args.repeats + 1):
                cluster.wait_balanced(target.brokers, args.partitions)
                _hold(load)
                fault = one_fault(
                    cluster, load, kind=kind, victim_index=index % 3, partitions=args.partitions
                )
                fault.update(ttl_ms=ttl_ms, repeat=repeat)
                slowest = max((p["first_ack_s"] for p in fault["partitions"]), default=0.0)
                print(
                    f"  TTL {ttl_ms} ms {kind} #{repeat} broker {fault['victim']}: "
                    f"{len(fault['partitions'])} partitions moved, slowest first ack "
                    f"{slowest:.2f} s",
                    flush=True,
                )
                faults.append(fault)
                index += 1
        settings = {
            "flush_interval_ms": config.flush_interval,
            "shards_per_broker": int(target.broker.env["KAFSCALE_SHARDS"]),
        }
        return target.describe(), settings, faults
    finally:
        if load is not None:
            load.stop()
        cluster.close()
        target.stop()
        shutil.rmtree(work, ignore_errors=True)


def _hold(load: Load) -> None:
    """Steady load for HOLD_S, ending with every partition acknowledged recently."""
    time.sleep(HOLD_S)
    deadline = time.monotonic() + SETTLE_TIMEOUT
    while not load.acked_recently(RECENT_S):
        if time.monotonic() > deadline:
            raise RuntimeError("partitions stopped acknowledging before the fault")
        time.sleep(0.2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ttl-ms", default="10000,6000", help="lease TTLs, comma-separated")
    parser.add_argument("--faults", default="kill,term", help="kill, term or both")
    parser.add_argument("--repeats", type=int, default=5, help="faults of each kind per TTL")
    parser.add_argument("--partitions", type=int, default=12)
    parser.add_argument("--rate", type=float, default=600.0, help="records/s offered")
    parser.add_argument("--record-size", type=int, default=1024)
    parser.add_argument("--s3-latency-ms", default="50-100", help="as bench.run's")
    parser.add_argument("--s3-get-latency-ms", type=float, default=10.0)
    parser.add_argument("--broker-env", action="append", default=[], metavar="KAFSCALE_X=VALUE")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--label", default="", help="a word for the results' file names")
    parser.add_argument(
        "--note", action="append", default=[], help="a line for the report (repeatable)"
    )
    args = parser.parse_args(argv)
    if set(args.faults.split(",")) - set(outage.FAULTS):
        parser.error(f"--faults takes {', '.join(outage.FAULTS)}")
    broker_env = dict(item.split("=", 1) for item in args.broker_env)
    latency = S3Latency.parse(args.s3_latency_ms, args.s3_get_latency_ms)
    started = datetime.now(UTC)
    load_before = load_average()
    faults: list[dict[str, Any]] = []
    described, broker_settings = "", dict[str, Any]()
    for ttl_ms in (int(t) for t in args.ttl_ms.split(",")):
        print(f"== lease TTL {ttl_ms} ms", flush=True)
        described, broker_settings, measured = measure_ttl(ttl_ms, args, latency, broker_env)
        faults += measured
    run = {
        "started": started.isoformat(timespec="seconds"),
        "finished": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": command_line(argv, "bench.failover"),
        "load_before": load_before,
        "load_after": load_average(),
        "machine": machine(),
        "target": described,
        "settings": {
            "partitions": args.partitions,
            "rate": args.rate,
            "record_size": args.record_size,
            "producer": PRODUCER,
            "repeats": args.repeats,
            "broker_env": broker_env,
            "s3_latency": latency.describe() if latency else "none",
            **broker_settings,
        },
        "faults": faults,
        "notes": args.note,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = (
        started.strftime("%Y-%m-%d-%H%M") + "-failover" + (f"-{args.label}" if args.label else "")
    )
    (args.out / f"{stem}.json").write_text(json.dumps(run, indent=2) + "\n")
    (args.out / f"{stem}.md").write_text(outage.markdown(run))
    print(f"results: {args.out / (stem + '.json')}, {args.out / (stem + '.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
