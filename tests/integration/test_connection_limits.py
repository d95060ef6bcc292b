"""Connection limits against a running broker, with real sockets: the connection caps, the idle
timeout, back-pressure on a pipelining client, and a client that never reads its responses.

Clients connect from several loopback addresses (127.0.0.2, ...) to count as several IPs.
"""

from __future__ import annotations

import re
import select
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from kio.index import load_request_schema, load_response_schema

from kafscale import config as configuration
from kafscale.metadata import open_metadata_store, records
from kafscale.metadata.records import Keys
from kafscale.protocol import codec
from kafscale.protocol import records as batches
from kafscale.protocol.errors import ErrorCode
from tests.unit.protocol.test_codec import metadata_request as topic_metadata_request

from .test_fetch import FETCH_RESPONSE, fetch_request
from .test_produce import high_watermark, produce_request
from .test_supervision import roles
from .wire import Wire

pytestmark = pytest.mark.integration

METADATA_V12 = load_response_schema(3, 12)
PRODUCE_V9 = load_response_schema(0, 9)
MiB = 1024 * 1024


class WireFrom(Wire):
    """A raw client connection from a chosen local address."""

    def __init__(self, address: tuple[str, int], source: str, timeout: float = 10.0) -> None:
        self.sock = socket.create_connection(address, timeout=timeout, source_address=(source, 0))


def metadata_request() -> Any:
    return codec.build(
        load_request_schema(3, 12),
        topics=None,
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )


def answers(wire: Wire, correlation_id: int = 5) -> bool:
    wire.send(metadata_request(), correlation_id)
    return wire.read_response(METADATA_V12)[0] == correlation_id


def metric(broker: Any, name: str, labels: str = "") -> float:
    """The sum of the samples of ``name`` whose labels include ``labels``."""
    total = 0.0
    for line in broker.metrics_text().splitlines():
        match = re.fullmatch(rf"{name}(\{{[^}}]*\}})? (\S+)", line)
        if match and labels in (match.group(1) or ""):
            total += float(match.group(2))
    return total


def wait_for(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
    return value


def closed_by_peer(wire: Wire, timeout: float) -> bool:
    """Whether the broker closes ``wire`` within ``timeout`` (the client sends nothing)."""
    wire.sock.settimeout(timeout)
    try:
        return wire.sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def frontend_rss(broker: Any) -> int:
    with open(f"/proc/{roles(broker)['frontend-0']}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_connection_caps_refuse_the_extra_connection_and_others_keep_working(
    start_broker: Callable[..., Any],
) -> None:
    broker = start_broker(
        env={
            "KAFSCALE_MAX_CONNECTIONS": "6",
            "KAFSCALE_MAX_CONNECTIONS_PER_IP": "2",
            "KAFSCALE_MAX_CONNECTIONS_PER_IP_OVERRIDES": "127.0.0.3:3",
        },
        ready=True,
    )
    address = ("127.0.0.1", broker.port)
    open_wires = [WireFrom(address, "127.0.0.2") for _ in range(2)]
    assert all(answers(wire) for wire in open_wires)

    # A third connection from 127.0.0.2 is closed right after accept; a flood of them logs once.
    for _ in range(20):
        with WireFrom(address, "127.0.0.2") as refused:
            assert closed_by_peer(refused, timeout=10)
    wait_for(
        lambda: metric(broker, "kafscale_connections_refused_total") == 20,
        10,
        "20 refusals counted",
    )
    refusal_lines = [
        line
        for line in broker.log_text().splitlines()
        if "refused a connection" in line and "127.0.0.2" in line
    ]
    assert 1 <= len(refusal_lines) <= 2  # one per 10 s window, with the count held back
    assert all(answers(wire) for wire in open_wires)  # the address's open ones are untouched

    # Other addresses are not affected; an override raises one address's limit.
    open_wires.append(WireFrom(address, "127.0.0.1"))
    open_wires += [WireFrom(address, "127.0.0.3") for _ in range(3)]
    assert all(answers(wire) for wire in open_wires)

    # Six open: the broker stops accepting. A seventh client completes its TCP handshake in
    # the listen backlog but is not served until a connection closes.
    wait_for(lambda: metric(broker, "kafscale_accept_paused") == 1, 10, "accepting paused")
    waiting = WireFrom(address, "127.0.0.4")
    waiting.send(metadata_request(), correlation_id=77)
    waiting.sock.settimeout(1.0)
    with pytest.raises(TimeoutError):
        waiting.sock.recv(1)
    assert all(answers(wire) for wire in open_wires)
    assert "not accepting connections until one closes" in broker.log_text()
    assert metric(broker, "kafscale_accept_pauses_total") >= 1

    open_wires.pop().close()
    waiting.sock.settimeout(15)
    assert waiting.read_response(METADATA_V12)[0] == 77  # served once a slot freed
    assert all(answers(wire) for wire in [*open_wires, waiting])
    wait_for(lambda: metric(broker, "kafscale_connections") == 6, 10, "six connections")
    for wire in [*open_wires, waiting]:
        wire.close()


def test_idle_connection_is_closed_and_active_or_parked_ones_are_not(
    start_broker: Callable[..., Any],
) -> None:
    idle_ms = 1500
    broker = start_broker(env={"KAFSCALE_CONNECTIONS_MAX_IDLE_MS": str(idle_ms)}, ready=True)
    address = ("127.0.0.1", broker.port)
    with Wire(address) as wire:
        create_orders(wire)  # a topic to long-poll
    with Wire(address) as idle, Wire(address) as active, Wire(address) as parked:
        assert answers(idle) and answers(active)
        # A Fetch parked for longer than the idle timeout: its connection is busy, not idle.
        parked.send(fetch_request("orders", 0, 0, MiB, 3 * idle_ms), correlation_id=9)
        deadline = time.monotonic() + 3 * idle_ms / 1000 + 10
        idle_closed = fetch_answered = False
        while not (idle_closed and fetch_answered):
            assert time.monotonic() < deadline, (idle_closed, fetch_answered)
            assert answers(active), "an active connection was closed"
            idle_closed = idle_closed or closed_by_peer(idle, timeout=0.2)
            fetch_answered = bool(select.select([parked.sock], [], [], 0.2)[0])
        correlation_id, response = parked.read_response(FETCH_RESPONSE)
        assert correlation_id == 9
        assert response.responses[0].partitions[0].error_code == ErrorCode.none
        assert answers(parked) and answers(active)
    assert metric(broker, "kafscale_connections_closed_total", 'reason="idle"') >= 1


def create_orders(wire: Wire) -> None:
    """Create topic "orders" (Metadata auto-creation) and wait until its partition is served."""
    wire.send(topic_metadata_request(12), correlation_id=1)
    wire.read_frame()

    def served() -> bool:
        wire.send(fetch_request("orders", 0, 0, MiB, 0), correlation_id=3)
        partition = wire.read_response(FETCH_RESPONSE)[1].responses[0].partitions[0]
        return bool(partition.error_code == ErrorCode.none)

    wait_for(served, 20, "topic orders to be served")


class Pipeliner(threading.Thread):
    """Sends ``frames`` back to back without reading anything; counts the bytes the kernel took."""

    def __init__(self, sock: socket.socket, frames: list[bytes]) -> None:
        super().__init__(daemon=True)
        self.sock = sock
        self.frames = frames
        self.sent = 0

    def run(self) -> None:
        self.sock.settimeout(None)
        try:
            for frame in self.frames:
                view = memoryview(frame)
                while view:
                    taken = self.sock.send(view)
                    self.sent += taken
                    view = view[taken:]
        except OSError:
            pass  # closed by the test or the broker


def steady(read: Callable[[], int], what: str, timeout: float = 30.0) -> int:
    """Poll ``read`` until two readings 0.5 s apart agree; that value."""
    deadline = time.monotonic() + timeout
    last = read()
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = read()
        if now == last:
            return now
        last = now
    raise AssertionError(f"{what} never settled (last {last})")


def test_pipelining_client_is_throttled_by_tcp_not_buffered(
    start_broker: Callable[..., Any],
) -> None:
    limit = 4 * MiB
    broker = start_broker(
        env={
            "KAFSCALE_CONNECTION_MAX_IN_FLIGHT_BYTES": str(limit),
            # acks=all requests wait for a write-ahead object: none is cut during the test (no
            # flush interval, object size or group commit wait is reached; the last is longer
            # than the requests' 10 s timeout, and short enough for the drain at the end).
            "KAFSCALE_FLUSH_INTERVAL_MS": "60000",
            "KAFSCALE_GROUP_COMMIT_MS": "15000",
            "KAFSCALE_OBJECT_BYTES": "512MiB",
            "KAFSCALE_SEGMENT_BYTES": "512MiB",
        },
        ready=True,
    )
    address = ("127.0.0.1", broker.port)
    batch = batches.build_batch([(None, b"x" * (MiB - 200), (), 1_700_000_000_000)])
    with Wire(address) as wire:  # create the topic and warm the frontend up
        create_orders(wire)
        wire.send(produce_request("orders", 0, batch, acks=1), correlation_id=1)
        _, response = wire.read_response(PRODUCE_V9)
        assert response.responses[0].partition_responses[0].error_code == ErrorCode.none
    baseline = frontend_rss(broker)

    frames = []
    for i in range(100):  # 100 MiB of acks=all produce requests, far more than the limit
        body = codec.encode_request(produce_request("orders", 0, batch, acks=-1), i, "t")
        frames.append(len(body).to_bytes(4, "big") + body)
    frame_size = len(frames[0])
    with Wire(address) as wire:
        pipeliner = Pipeliner(wire.sock, frames)
        pipeliner.start()
        wait_for(
            lambda: metric(broker, "kafscale_connections_throttled_total", 'limit="bytes"'),
            20,
            "the connection to be throttled",
        )
        sent = steady(lambda: pipeliner.sent, "bytes the client sent")
        held = wait_for(
            lambda: metric(broker, "kafscale_connection_held_bytes"), 10, "held bytes sampled"
        )
        growth = frontend_rss(broker) - baseline
        total = sum(len(frame) for frame in frames)
        # The rest waits in the client: what the broker read is its limit, plus one frame
        # started past it and one being received; the kernel's socket buffers hold some more.
        assert sent < total / 3, f"{sent} of {total} bytes went out"
        assert held <= limit + 2 * frame_size + 256 * 1024, held
        assert growth < 48 * MiB, f"frontend RSS grew by {growth / MiB:.1f} MiB"
        wire.sock.shutdown(socket.SHUT_RDWR)
    pipeliner.join(10)
    assert not pipeliner.is_alive()


def log_entries(broker: Any, topic: str, partition: int) -> list[tuple[str, int, int]]:
    """(kind, base offset, last offset) of each committed entry of the partition's log."""
    config = configuration.load(broker.env)
    store = open_metadata_store(config)
    try:
        found = store.get_prefix(Keys(config.s3_namespace).segments(topic, partition))
        entries = [records.decode_segment(kv.value) for kv in found]
    finally:
        store.close()
    return [("chunk" if e.is_chunk else "segment", e.base_offset, e.last_offset) for e in entries]


def test_client_that_never_reads_does_not_grow_broker_memory(
    start_broker: Callable[..., Any],
) -> None:
    idle_ms = 3000
    broker = start_broker(
        env={
            "KAFSCALE_CONNECTIONS_MAX_IDLE_MS": str(idle_ms),
            "KAFSCALE_SEGMENT_BYTES": "64MiB",
            "KAFSCALE_FLUSH_INTERVAL_MS": "3000",
            # The acks=all records commit as chunks of a few write-ahead objects, compacted a
            # second later into one segment, stored as sent (16 MiB: not compressed).
            "KAFSCALE_COMPACTION_MAX_AGE_MS": "1000",
            "KAFSCALE_COMPRESSION_CODEC": "none",
        },
        ready=True,
    )
    address = ("127.0.0.1", broker.port)
    batch = batches.build_batch([(None, b"y" * (MiB - 200), (), 1_700_000_000_000)])
    with Wire(address) as wire:  # 16 MiB in one segment: each Fetch below answers all of it
        create_orders(wire)
        for i in range(16):
            wire.send(produce_request("orders", 0, batch, acks=-1), correlation_id=i)
        for i in range(16):
            correlation_id, response = wire.read_response(PRODUCE_V9)
            assert correlation_id == i
            assert response.responses[0].partition_responses[0].error_code == ErrorCode.none
    wait_for(lambda: high_watermark(broker, "orders", 0) == 16, 30, "records committed")
    wait_for(
        lambda: log_entries(broker, "orders", 0) == [("segment", 0, 15)],
        30,
        "the records compacted into one segment",
    )
    # Restarted with empty caches: a Fetch reads the segment, not the chunks' batches the L1
    # cache kept as parts of it.
    assert broker.terminate() == 0
    broker = start_broker(env=broker.env, ready=True)
    address = ("127.0.0.1", broker.port)
    baseline = frontend_rss(broker)
    closed_idle = metric(broker, "kafscale_connections_closed_total", 'reason="idle"')

    request = codec.encode_request(fetch_request("orders", 0, 0, 32 * MiB, 0), 0, "t")
    frame = len(request).to_bytes(4, "big") + request
    with Wire(address) as wire:
        # 2,000 fetches of 16 MiB each (32 GB of responses) that the client never reads.
        wire.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        pipeliner = Pipeliner(wire.sock, [frame] * 2000)
        pipeliner.start()
        steady(lambda: pipeliner.sent, "bytes the client sent")
        fetched = steady(lambda: int(metric(broker, "kafscale_fetch_bytes_total")), "bytes fetched")
        growth = frontend_rss(broker) - baseline
        # One response is made and waits for the client (more than the socket buffers take);
        # the next Fetch is not started until it is written.
        assert 16 * MiB - 4096 <= fetched <= 16 * MiB, f"{fetched} bytes of responses made"
        assert growth < 48 * MiB, f"frontend RSS grew by {growth / MiB:.1f} MiB"
        # Nothing in progress and nothing read: closed as idle, and what it held is freed.
        # (Counted from before it opened: a connection of the readiness check may also close as
        # idle. The held bytes are sampled every second, over the connections still open.)
        wait_for(
            lambda: (
                metric(broker, "kafscale_connections_closed_total", 'reason="idle"') > closed_idle
            ),
            3 * idle_ms / 1000 + 10,
            "the connection to be closed as idle",
        )
        wait_for(
            lambda: metric(broker, "kafscale_connection_held_bytes") == 0,
            3 * idle_ms / 1000 + 10,
            "held bytes freed",
        )
    pipeliner.join(10)
    with Wire(address) as wire:
        assert answers(wire)
