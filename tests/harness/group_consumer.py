"""A consumer-group member for the group tests, with aiokafka, confluent-kafka or kafka-python:
the Python twin of the Java probe's `group-consume` (GroupCommands.java), run as a process
(`python -m tests.harness.group_consumer --client NAME ...` from the repository root) so a test
can SIGTERM or SIGKILL it like the Java one. tests/harness/groups.py starts and reads both.

Options and output are the Java command's: (--topic T | --topics T1,T2) --group G [--count N]
[--timeout-ms T] [--assignor A] [--instance-id ID] [--commit after-processing|auto|none]
[--auto-offset-reset earliest|latest] [--exit-after-assigned-ms X] [--poll-ms P]
[--config k=v ...], printing one JSON object a line: started, assigned / revoked / lost
({"partitions": [{"topic", "partition"}], "memberId", "generationId"}), record ({"topic",
"partition", "offset", "key", "value"}, text), committed / commit-failed ({"offsets": [{"topic",
"partition", "offset"}]}), error, and done ({"consumed", "reason", "everAssigned"}). Each line is
flushed before the next step, so a record line always precedes the commit of its offset.
--config takes Kafka's (Java) property names: confluent-kafka gets them as they are (librdkafka
spells most the same; max.poll.records becomes the batch size of consume()), aiokafka and
kafka-python as keyword arguments with dots turned into underscores, numbers and booleans parsed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

TP = tuple[str, int]

# What each client calls the assignors; a name missing here is one the client does not have.
ASSIGNORS: dict[str, dict[str, str]] = {
    "confluent-kafka": {
        "range": "range",
        "roundrobin": "roundrobin",
        "cooperative-sticky": "cooperative-sticky",
    },
    "aiokafka": {
        "range": "aiokafka.coordinator.assignors.range:RangePartitionAssignor",
        "roundrobin": "aiokafka.coordinator.assignors.roundrobin:RoundRobinPartitionAssignor",
        "sticky": "aiokafka.coordinator.assignors.sticky.sticky_assignor:StickyPartitionAssignor",
    },
    "kafka-python": {
        "range": "kafka.coordinator.assignors.range:RangePartitionAssignor",
        "roundrobin": "kafka.coordinator.assignors.roundrobin:RoundRobinPartitionAssignor",
        "sticky": "kafka.coordinator.assignors.sticky.sticky_assignor:StickyPartitionAssignor",
        "cooperative-sticky": (
            "kafka.coordinator.assignors.cooperative_sticky:CooperativeStickyAssignor"
        ),
    },
}


def emit(event: str, **fields: Any) -> None:
    sys.stdout.write(json.dumps({"event": event, **fields}, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def _text(data: bytes | None) -> str | None:
    return None if data is None else data.decode("utf-8", "replace")


def _partitions(tps: Iterable[TP]) -> list[dict[str, Any]]:
    return [{"topic": t, "partition": p} for t, p in sorted(tps)]


def _offsets(offsets: dict[TP, int]) -> list[dict[str, Any]]:
    return [{"topic": t, "partition": p, "offset": o} for (t, p), o in offsets.items()]


class Member:
    """What every client shares: the bookkeeping of processed offsets, the output, the ending."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.pending: dict[TP, int] = {}  # processed, not committed: the next offset
        self.consumed = 0
        self.ever_assigned = False
        self.stop_requested = False
        self.deadline = time.monotonic() + args.timeout_ms / 1000
        self.stop_at = float("inf")

    def stop_reason(self) -> str | None:
        if self.stop_requested:
            return "signal"
        if self.args.count >= 0 and self.consumed >= self.args.count:
            return "count"
        if time.monotonic() >= self.stop_at:
            return "assigned-time"
        if time.monotonic() >= self.deadline:
            return "timeout"
        return None

    def record(self, topic: str, partition: int, offset: int, key: Any, value: Any) -> bool:
        """Prints one record; False once --count records were processed (the rest is not)."""
        if self.args.count >= 0 and self.consumed >= self.args.count:
            return False
        print(
            json.dumps(
                {"event": "record", "topic": topic, "partition": partition, "offset": offset,
                 "key": _text(key), "value": _text(value)},
                separators=(",", ":"),
            )
        )  # fmt: skip
        self.pending[(topic, partition)] = offset + 1
        self.consumed += 1
        return True

    def take_pending(self, partitions: Iterable[TP] | None = None) -> dict[TP, int]:
        if self.args.commit != "after-processing":
            self.pending.clear()
            return {}
        wanted = None if partitions is None else set(partitions)
        return {tp: o for tp, o in self.pending.items() if wanted is None or tp in wanted}

    def committed(self, offsets: dict[TP, int], error: BaseException | None) -> None:
        for tp in offsets:
            self.pending.pop(tp, None)
        if error is None:
            emit("committed", offsets=_offsets(offsets))
        else:
            emit("commit-failed", error=type(error).__name__, message=str(error),
                 offsets=_offsets(offsets))  # fmt: skip

    def rebalance(self, event: str, tps: Iterable[TP], member_id: Any, generation: Any) -> None:
        """Prints assigned / revoked / lost; an empty revoked or lost is not printed (some clients
        revoke nothing before their first join), an empty assigned is (a rebalance finished)."""
        tps = list(tps)
        if event != "assigned":
            if not tps:
                return
            for tp in tps:
                self.pending.pop(tp, None)
        elif tps and not self.ever_assigned:
            self.ever_assigned = True
            if self.args.exit_after_assigned_ms >= 0:
                self.stop_at = time.monotonic() + self.args.exit_after_assigned_ms / 1000
        emit(event, partitions=_partitions(tps), memberId=member_id, generationId=generation)

    def done(self, reason: str) -> None:
        emit("done", consumed=self.consumed, reason=reason, everAssigned=self.ever_assigned)


def _class(path: str) -> Any:
    module, name = path.split(":")
    return getattr(__import__(module, fromlist=[name]), name)


def _kwargs(configs: Sequence[str]) -> dict[str, Any]:
    """Java property names as Python keyword arguments: session.timeout.ms=6000 ->
    session_timeout_ms=6000."""
    out: dict[str, Any] = {}
    for pair in configs:
        key, value = pair.split("=", 1)
        parsed: Any = value
        if value.lstrip("-").isdigit():
            parsed = int(value)
        elif value in ("true", "false"):
            parsed = value == "true"
        out[key.replace(".", "_")] = parsed
    return out


def _python_client_options(args: argparse.Namespace) -> dict[str, Any]:
    options: dict[str, Any] = {
        "bootstrap_servers": args.bootstrap,
        "group_id": args.group,
        "enable_auto_commit": args.commit == "auto",
        "auto_offset_reset": args.auto_offset_reset,
    }
    if args.instance_id is not None:
        options["group_instance_id"] = args.instance_id
    if args.assignor is not None:
        options["partition_assignment_strategy"] = (_class(ASSIGNORS[args.client][args.assignor]),)
    options.update(_kwargs(args.config))
    return options


def _member_id(metadata: Callable[[], tuple[Any, Any]]) -> tuple[Any, Any]:
    """(member id, generation id) from `metadata`, or nulls where the client cannot say."""
    try:
        return metadata()
    except Exception:  # not every version exposes it: the event says null
        return None, None


# --- the clients ---------------------------------------------------------------------------------


def run_confluent(member: Member, args: argparse.Namespace) -> str:
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    config: dict[str, Any] = {
        "bootstrap.servers": args.bootstrap,
        "group.id": args.group,
        "enable.auto.commit": args.commit == "auto",
        "auto.offset.reset": args.auto_offset_reset,
        # librdkafka retries most errors by itself and says nothing unless asked: a broker
        # without the group APIs is just "no broker available for coordinator query" (debug).
        "error_cb": lambda error: emit("warning", message=str(error)),
    }
    if args.instance_id is not None:
        config["group.instance.id"] = args.instance_id
    if args.assignor is not None:
        config["partition.assignment.strategy"] = ASSIGNORS[args.client][args.assignor]
    batch = 500
    for pair in args.config:
        key, value = pair.split("=", 1)
        if key == "max.poll.records":
            batch = int(value)
        else:
            config[key] = value
    consumer = Consumer(config)

    def ids() -> tuple[Any, Any]:
        return _member_id(lambda: (consumer.memberid(), None))  # librdkafka hides the generation

    def tps(partitions: Any) -> list[TP]:
        return [(tp.topic, tp.partition) for tp in partitions]

    def commit(offsets: dict[TP, int]) -> None:
        if not offsets:
            return
        try:
            result = consumer.commit(
                offsets=[TopicPartition(t, p, o) for (t, p), o in offsets.items()],
                asynchronous=False,
            )
            failed = [tp.error for tp in result or () if tp.error is not None]
            if failed:
                raise KafkaException(failed[0])
        except KafkaException as exc:
            member.committed(offsets, exc)
            return
        member.committed(offsets, None)

    def on_revoke(_: Any, partitions: Any) -> None:
        commit(member.take_pending(tps(partitions)))
        member.rebalance("revoked", tps(partitions), *ids())

    consumer.subscribe(
        list(args.topics),
        on_assign=lambda _, partitions: member.rebalance("assigned", tps(partitions), *ids()),
        on_revoke=on_revoke,
        on_lost=lambda _, partitions: member.rebalance("lost", tps(partitions), *ids()),
    )
    emit("started", group=args.group, topics=args.topics)
    try:
        while (reason := member.stop_reason()) is None:
            for message in consumer.consume(num_messages=batch, timeout=args.poll_ms / 1000):
                error = message.error()
                if error is not None:
                    if error.fatal():
                        raise KafkaException(error)
                    emit("warning", message=str(error))
                    continue
                topic, partition, offset = message.topic(), message.partition(), message.offset()
                assert topic is not None and partition is not None and offset is not None
                if not member.record(topic, partition, offset, message.key(), message.value()):
                    break
            sys.stdout.flush()
            commit(member.take_pending())
        commit(member.take_pending())
    finally:
        consumer.close()  # leaves the group (not a static member), after on_revoke
    return reason


def run_kafka_python(member: Member, args: argparse.Namespace) -> str:
    from kafka import KafkaConsumer, OffsetAndMetadata, TopicPartition
    from kafka.consumer.subscription_state import ConsumerRebalanceListener
    from kafka.errors import KafkaError

    consumer = KafkaConsumer(**_python_client_options(args))

    def ids() -> tuple[Any, Any]:
        def metadata() -> tuple[Any, Any]:
            found = consumer.group_metadata()
            return found.member_id, found.generation_id

        return _member_id(metadata)

    def commit(offsets: dict[TP, int]) -> None:
        if not offsets:
            return
        try:
            consumer.commit(
                {
                    TopicPartition(t, p): OffsetAndMetadata(o, "", -1)
                    for (t, p), o in offsets.items()
                }
            )
        except KafkaError as exc:
            member.committed(offsets, exc)
            return
        member.committed(offsets, None)

    class Listener(ConsumerRebalanceListener):
        def on_partitions_revoked(self, revoked: Any) -> None:
            tps = [(tp.topic, tp.partition) for tp in revoked]
            commit(member.take_pending(tps))
            member.rebalance("revoked", tps, *ids())

        def on_partitions_assigned(self, assigned: Any) -> None:
            member.rebalance("assigned", [(tp.topic, tp.partition) for tp in assigned], *ids())

        def on_partitions_lost(self, lost: Any) -> None:
            member.rebalance("lost", [(tp.topic, tp.partition) for tp in lost], *ids())

    consumer.subscribe(topics=list(args.topics), listener=Listener())
    emit("started", group=args.group, topics=args.topics)
    try:
        while (reason := member.stop_reason()) is None:
            for records in consumer.poll(timeout_ms=args.poll_ms).values():
                if not all(
                    member.record(r.topic, r.partition, r.offset, r.key, r.value) for r in records
                ):
                    break
            sys.stdout.flush()
            commit(member.take_pending())
        commit(member.take_pending())
    finally:
        consumer.close(autocommit=args.commit == "auto", timeout_ms=5000)
    return reason


async def run_aiokafka(member: Member, args: argparse.Namespace) -> str:
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from aiokafka.abc import ConsumerRebalanceListener
    from aiokafka.errors import KafkaError

    consumer = AIOKafkaConsumer(**_python_client_options(args))

    def ids() -> tuple[Any, Any]:
        coordinator = consumer._coordinator  # aiokafka has no public accessor
        return _member_id(lambda: (coordinator.member_id, coordinator.generation))

    async def commit(offsets: dict[TP, int]) -> None:
        if not offsets:
            return
        try:
            await consumer.commit({TopicPartition(t, p): o for (t, p), o in offsets.items()})
        except KafkaError as exc:
            member.committed(offsets, exc)
            return
        member.committed(offsets, None)

    class Listener(ConsumerRebalanceListener):  # aiokafka reports lost partitions as revoked
        async def on_partitions_revoked(self, revoked: Any) -> None:
            tps = [(tp.topic, tp.partition) for tp in revoked]
            await commit(member.take_pending(tps))
            member.rebalance("revoked", tps, *ids())

        async def on_partitions_assigned(self, assigned: Any) -> None:
            member.rebalance("assigned", [(tp.topic, tp.partition) for tp in assigned], *ids())

    await consumer.start()
    try:
        consumer.subscribe(topics=list(args.topics), listener=Listener())
        emit("started", group=args.group, topics=args.topics)
        while (reason := member.stop_reason()) is None:
            for records in (await consumer.getmany(timeout_ms=args.poll_ms)).values():
                if not all(
                    member.record(r.topic, r.partition, r.offset, r.key, r.value) for r in records
                ):
                    break
            sys.stdout.flush()
            await commit(member.take_pending())
        await commit(member.take_pending())
    finally:
        await consumer.stop()  # leaves the group (not a static member), after the listener
    return reason


# --- the command line -----------------------------------------------------------------------------


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.harness.group_consumer")
    parser.add_argument("--client", required=True, choices=sorted(ASSIGNORS))
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic")
    parser.add_argument("--topics")
    parser.add_argument("--group", required=True)
    parser.add_argument("--count", type=int, default=-1)
    parser.add_argument("--timeout-ms", type=int, default=20000)
    parser.add_argument("--assignor")
    parser.add_argument("--instance-id")
    parser.add_argument(
        "--commit", default="after-processing", choices=("after-processing", "auto", "none")
    )
    parser.add_argument("--auto-offset-reset", default="earliest", choices=("earliest", "latest"))
    parser.add_argument("--exit-after-assigned-ms", type=int, default=-1)
    parser.add_argument("--poll-ms", type=int, default=200)
    parser.add_argument("--config", action="append", default=[], help="KEY=VALUE (Java name)")
    args = parser.parse_args(argv)
    if (args.topic is None) == (args.topics is None):
        parser.error("give one of --topic and --topics")
    args.topics = [args.topic] if args.topics is None else args.topics.split(",")
    if args.assignor is not None and args.assignor not in ASSIGNORS[args.client]:
        known = sorted(ASSIGNORS[args.client])
        parser.error(f"{args.client} has no {args.assignor!r} assignor (only {known})")
    if any("=" not in pair for pair in args.config):
        parser.error("--config needs KEY=VALUE")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    member = Member(args)

    def on_signal(signum: int, frame: Any) -> None:  # only a flag: the loop stops and closes
        member.stop_requested = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        if args.client == "aiokafka":
            reason = asyncio.run(run_aiokafka(member, args))
        elif args.client == "kafka-python":
            reason = run_kafka_python(member, args)
        else:
            reason = run_confluent(member, args)
    except Exception as exc:
        emit("error", error=f"{type(exc).__module__}.{type(exc).__qualname__}", message=str(exc))
        import traceback

        traceback.print_exc()
        return 1
    member.done(reason)
    return 0


if __name__ == "__main__":
    sys.exit(main())
