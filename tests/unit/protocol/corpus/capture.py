"""Record the request frames real clients send, for the fuzzer's seed corpus (frames.txt).

    .venv/bin/python -m tests.unit.protocol.corpus.capture [--out FILE] [--skip java ...]

Starts an embedded broker on 127.0.0.1:PORT advertising 127.0.0.2 (KAFSCALE_ADVERTISED_HOST), and
a recording proxy on 127.0.0.2:PORT: clients bootstrap to the proxy and, told by Metadata that
the broker is 127.0.0.2:PORT, keep talking through it. Each client then does what an application
does (admin, produce, group consume and commit) and every client-to-broker frame is recorded.

Written: one line per distinct frame, ``client api_key api_version hex``, at most
``PER_KIND`` per (client, API, version), frames over ``MAX_FRAME`` bytes left out (records are
kept small), sorted. Re-run it when a client is added or upgraded; the corpus is committed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.harness.broker import BrokerFactory
from tests.harness.clients import PROBE_MAIN, JavaProbe, find_java, find_kcat
from tests.harness.kafka_tools import KafkaTools

PROXY_HOST = "127.0.0.2"
PER_KIND = 4
MAX_FRAME = 16 * 1024
DEFAULT_OUT = Path(__file__).with_name("frames.txt")


class Recorder:
    """A proxy that forwards both ways and keeps the client's frames, labelled by client."""

    def __init__(self, listen: tuple[str, int], upstream: tuple[str, int]) -> None:
        self.listen, self.upstream = listen, upstream
        self.client = "none"
        self.frames: dict[tuple[str, int, int], list[bytes]] = defaultdict(list)
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._ready.wait(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._serve, *self.listen))
        self._ready.set()
        self._loop.run_until_complete(server.serve_forever())

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        back = asyncio.create_task(_pipe(up_reader, writer))
        try:
            while True:
                head = await reader.readexactly(4)
                frame = await reader.readexactly(struct.unpack(">i", head)[0])
                self._keep(frame)
                up_writer.write(head + frame)
                await up_writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            up_writer.close()
            back.cancel()

    def _keep(self, frame: bytes) -> None:
        if len(frame) > MAX_FRAME:
            return
        api_key, version = struct.unpack_from(">hh", frame)
        kept = self.frames[self.client, api_key, version]
        # the correlation id differs between otherwise equal frames: compare without it
        if len(kept) < PER_KIND and all(k[:4] + k[8:] != frame[:4] + frame[8:] for k in kept):
            kept.append(frame)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


def run_python_clients(bootstrap: str, recorder: Recorder) -> None:
    recorder.client = "confluent-kafka"
    _confluent(bootstrap)
    recorder.client = "kafka-python"
    _kafka_python(bootstrap)
    recorder.client = "aiokafka"
    asyncio.run(_aiokafka(bootstrap))


def _confluent(bootstrap: str) -> None:
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, ConfigResource, NewPartitions, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics(
        [NewTopic("ck-a", 2, 1, config={"retention.ms": "3600000"}), NewTopic("ck-b", 1, 1)]
    ).values():
        future.result()
    admin.describe_configs([ConfigResource("topic", "ck-a")])[
        ConfigResource("topic", "ck-a")
    ].result()
    admin.create_partitions([NewPartitions("ck-b", 2)])["ck-b"].result()
    producer = Producer(
        {"bootstrap.servers": bootstrap, "enable.idempotence": True, "compression.type": "lz4"}
    )
    for i in range(20):
        producer.produce("ck-a", key=f"k{i}".encode(), value=b"v" * i, headers={"h": b"x"})
    producer.flush(30)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "ck-group",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe(["ck-a"])
    _poll_until(lambda: consumer.poll(0.5), 20)
    consumer.commit(asynchronous=False)
    consumer.committed([TopicPartition("ck-a", 0)], timeout=10)
    consumer.close()
    admin.list_consumer_groups().result()
    admin.describe_consumer_groups(["ck-group"])["ck-group"].result()
    admin.delete_topics(["ck-b"])["ck-b"].result()


def _kafka_python(bootstrap: str) -> None:
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
    from kafka.admin import NewTopic

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic("kp-a", 2, 1)])
    admin.describe_configs([])
    producer = KafkaProducer(bootstrap_servers=bootstrap, compression_type="gzip", acks="all")
    for i in range(20):
        producer.send("kp-a", key=f"k{i}".encode(), value=b"v" * i, headers=[("h", b"x")])
    producer.flush(30)
    producer.close()
    consumer = KafkaConsumer(
        "kp-a",
        bootstrap_servers=bootstrap,
        group_id="kp-group",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        consumer_timeout_ms=5000,
    )
    for _ in range(20):
        next(consumer)
    consumer.commit()
    consumer.close()
    admin.list_groups()
    admin.describe_groups(["kp-group"])
    admin.list_group_offsets("kp-group")
    admin.list_partition_offsets({})
    admin.delete_topics(["kp-a"])
    admin.close()


async def _aiokafka(bootstrap: str) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    await admin.create_topics([NewTopic("ak-a", 2, 1)])
    await admin.describe_configs([])
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, compression_type="snappy")
    await producer.start()
    for i in range(20):
        await producer.send_and_wait("ak-a", key=f"k{i}".encode(), value=b"v" * i)
    await producer.stop()
    consumer = AIOKafkaConsumer(
        "ak-a",
        bootstrap_servers=bootstrap,
        group_id="ak-group",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    for _ in range(20):
        await consumer.getone()
    await consumer.commit()
    await consumer.stop()
    await admin.list_consumer_groups()
    await admin.delete_topics(["ak-a"])
    await admin.close()


def run_kcat(bootstrap: str, recorder: Recorder) -> None:
    recorder.client = "kcat"
    kcat = find_kcat()
    base = [kcat, "-b", bootstrap]
    subprocess.run([*base, "-L"], check=True, capture_output=True, timeout=60)
    subprocess.run(
        [*base, "-P", "-t", "kc-a", "-K", ":", "-z", "zstd"],
        input=b"".join(f"k{i}:value {i}\n".encode() for i in range(20)),
        check=True,
        capture_output=True,
        timeout=60,
    )
    subprocess.run(
        [*base, "-C", "-t", "kc-a", "-o", "beginning", "-e"],
        check=True,
        capture_output=True,
        timeout=60,
    )
    subprocess.run(
        [*base, "-G", "kc-group", "kc-a", "-o", "beginning", "-e", "-X", "enable.auto.commit=true"],
        check=False,  # -G with -e exits once the partitions are drained
        capture_output=True,
        timeout=60,
    )


def run_java(bootstrap: str, recorder: Recorder) -> None:
    java = find_java()
    probe = JavaProbe(java)
    tools = KafkaTools(java)
    recorder.client = "java"
    bootstrap_args = ("--bootstrap", bootstrap)
    probe.json("4", "create-topic", *bootstrap_args, "--topic", "jv-a")
    probe.json("4", "describe-configs", *bootstrap_args, "--topic", "jv-a")
    probe.json("4", "produce", *bootstrap_args, "--topic", "jv-a", "--count", "20")
    argv = [
        java,
        "-cp",
        probe.classpath("4"),
        PROBE_MAIN,
        "group-consume",
        *bootstrap_args,
        "--topic",
        "jv-a",
        "--group",
        "jv-group",
        "--count",
        "20",
    ]
    subprocess.run(argv, check=True, capture_output=True, timeout=120)
    tools.check(
        "consumer-groups", "--bootstrap-server", bootstrap, "--describe", "--group", "jv-group"
    )
    tools.check("consumer-groups", "--bootstrap-server", bootstrap, "--list")
    tools.check("topics", "--bootstrap-server", bootstrap, "--describe", "--topic", "jv-a")
    probe.json("4", "delete-topic", *bootstrap_args, "--topic", "jv-a")


def _poll_until(poll: Callable[[], Any], count: int, timeout: float = 60) -> None:
    deadline, seen = time.monotonic() + timeout, 0
    while seen < count and time.monotonic() < deadline:
        message = poll()
        if message is not None and not message.error():
            seen += 1
    if seen < count:
        raise RuntimeError(f"consumed {seen} of {count}")


def write(recorder: Recorder, out: Path) -> int:
    lines = sorted(
        f"{client} {api_key} {version} {frame.hex()}"
        for (client, api_key, version), frames in recorder.frames.items()
        if client != "none"
        for frame in frames
    )
    out.write_text("\n".join(lines) + "\n")
    return len(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--skip", action="append", default=[], help="python, kcat or java")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        factory = BrokerFactory(Path(tmp), "capture", _no_backend, _no_backend)
        try:
            broker = factory(
                {"KAFSCALE_ADVERTISED_HOST": PROXY_HOST, "KAFSCALE_FLUSH_INTERVAL_MS": "100"},
                ready=True,
            )
            recorder = Recorder((PROXY_HOST, broker.port), ("127.0.0.1", broker.port))
            recorder.start()
            bootstrap = f"{PROXY_HOST}:{broker.port}"
            for name, run in (
                ("python", run_python_clients),
                ("kcat", run_kcat),
                ("java", run_java),
            ):
                if name not in args.skip:
                    run(bootstrap, recorder)
                    print(f"{name}: done", file=sys.stderr, flush=True)
            time.sleep(1)
            print(json.dumps({"frames": write(recorder, args.out), "out": str(args.out)}))
        finally:
            for problem in factory.close():
                print("harness:", problem, file=sys.stderr)


def _no_backend() -> Any:
    raise RuntimeError("the capture runs the embedded backends")


if __name__ == "__main__":
    main()
