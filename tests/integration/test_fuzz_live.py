"""Tens of thousands of mutated real-client frames (20,000 in .ci/run, 100,000 in
scripts/long-tests.sh) against a running broker, over many connections; afterwards no child has
restarted, the broker's memory is within a bound, and a normal client produces and reads back
every acknowledged record.

The frames are the unit fuzzer's (tests/unit/protocol/fuzz.py: captured client frames mutated
with a fixed seed). Each is sent with an ApiVersions request after it on the same connection:
its answer (responses come in request order) says the broker is done with the frame, and
``closed`` says it refused it; a frame that parks (a Fetch told to wait, a JoinGroup waiting for
its group) is abandoned after ``PATIENCE`` by closing the connection, as a client would.
"""

from __future__ import annotations

import asyncio
import random
import re
import struct
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from kio.index import load_request_schema

from bench.procstats import tree_pids
from kafscale.protocol import codec
from tests.harness.broker import BrokerProcess
from tests.unit.protocol import fuzz

pytestmark = pytest.mark.integration

FRAMES = 20_000  # in .ci/run; the long run (scripts/long-tests.sh) sends LONG_FRAMES
LONG_FRAMES = 100_000
CONNECTIONS = 24  # at once; each reconnects after the broker closes it
PATIENCE = 1.0  # seconds to wait for a frame's answer before abandoning its connection
RSS_GROWTH_BOUND = 256 << 20  # the broker's RSS (all processes) may grow this much
PROBE_ID = 0x7FFF_FFF0
PROBE = codec.encode_request(
    codec.build(load_request_schema(18, 3), client_software_name="t", client_software_version="1"),
    PROBE_ID,
)
PROBE_FRAME = struct.pack(">i", len(PROBE)) + PROBE


def rss(broker: BrokerProcess) -> int:
    total = 0
    for pid in tree_pids(broker.pid):
        try:
            with open(f"/proc/{pid}/status") as status:
                total += next(
                    int(line.split()[1]) * 1024 for line in status if line[:6] == "VmRSS:"
                )
        except (OSError, StopIteration):
            continue
    return total


def child_restarts(broker: BrokerProcess) -> float:
    found = re.findall(
        r"^kafscale_child_restarts_total\{[^}]*\} (\S+)$", broker.metrics_text(), re.M
    )
    return sum(float(value) for value in found)


async def send_all(port: int, frames: list[bytes], outcomes: Counter[str]) -> float:
    """Send every frame (see the module docstring); the peak RSS is sampled by the caller."""
    queue: asyncio.Queue[bytes] = asyncio.Queue()
    for frame in frames:
        queue.put_nowait(frame)

    async def worker() -> None:
        connection: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        while not queue.empty():
            frame = queue.get_nowait()
            if connection is None:
                connection = await asyncio.open_connection("127.0.0.1", port)
            reader, writer = connection
            outcome = await one_frame(reader, writer, frame)
            outcomes[outcome] += 1
            if outcome != "answered":
                writer.close()
                connection = None
        if connection is not None:
            connection[1].close()

    started = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(CONNECTIONS)))
    return time.monotonic() - started


async def one_frame(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, frame: bytes
) -> str:
    try:
        writer.write(struct.pack(">i", len(frame)) + frame + PROBE_FRAME)
        await writer.drain()
        async with asyncio.timeout(PATIENCE):
            while True:
                (length,) = struct.unpack(">i", await reader.readexactly(4))
                response = await reader.readexactly(length)
                if struct.unpack_from(">i", response)[0] == PROBE_ID:
                    return "answered"
    except (asyncio.IncompleteReadError, ConnectionError):
        return "closed"
    except TimeoutError:
        return "abandoned"


async def produce_and_read_back(bootstrap: str, topic: str, count: int) -> list[bytes]:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    try:
        sent = [f"record-{i}".encode() for i in range(count)]
        results = await asyncio.gather(*(producer.send(topic, value) for value in sent))
        await asyncio.gather(*results)  # every record acknowledged (acks=all)
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False
    )
    await consumer.start()
    read: list[bytes] = []
    try:
        async with asyncio.timeout(60):
            while len(read) < count:
                batches = await consumer.getmany(timeout_ms=1000)
                read += [record.value for records in batches.values() for record in records]
    finally:
        await consumer.stop()
    assert sorted(read) == sorted(sent)
    return read


@pytest.mark.parametrize(
    "count", [FRAMES, pytest.param(LONG_FRAMES, marks=pytest.mark.long)], ids=["20k", "100k"]
)
def test_mutated_frames_crash_nothing_and_a_client_still_reads_every_acknowledged_record(
    start_broker: Callable[..., Any], count: int
) -> None:
    broker = start_broker(
        env={"KAFSCALE_AUTO_CREATE_TOPICS": "false", "KAFSCALE_FLUSH_INTERVAL_MS": "100"}
    )
    broker.wait_ready()
    children = sorted(broker.children())
    corpus = fuzz.load_corpus()
    frames = list(fuzz.mutated_requests(random.Random(1414), corpus, count))
    baseline = rss(broker)
    peak = baseline
    outcomes: Counter[str] = Counter()

    async def run() -> float:
        async def sample() -> None:
            nonlocal peak
            while True:
                peak = max(peak, rss(broker))
                await asyncio.sleep(0.25)

        sampler = asyncio.create_task(sample())
        try:
            return await send_all(broker.port, frames, outcomes)
        finally:
            sampler.cancel()

    seconds = asyncio.run(run())
    print(f"{count} frames in {seconds:.0f} s: {dict(outcomes)}")
    print(f"broker RSS {baseline >> 20} MiB, peak {peak >> 20} MiB")
    assert sum(outcomes.values()) == count
    # both paths were taken, many times
    assert outcomes["closed"] > count // 10 and outcomes["answered"] > count // 10
    assert broker.running
    assert sorted(broker.children()) == children, "a child process was restarted"
    assert child_restarts(broker) == 0
    assert peak - baseline < RSS_GROWTH_BOUND, (baseline, peak)
    internal = [line for line in broker.log_text().splitlines() if '"level":"error"' in line]
    assert internal == [], "\n".join(internal[:5])

    topic = f"after-fuzz-{uuid.uuid4().hex[:8]}"
    asyncio.run(create_topic(broker.bootstrap, topic))
    asyncio.run(produce_and_read_back(broker.bootstrap, topic, 500))
    assert sorted(broker.children()) == children


async def create_topic(bootstrap: str, topic: str) -> None:
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, 2, 1)])
    finally:
        await admin.close()
