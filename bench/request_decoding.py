"""The worst requests an attacker can build, against a live broker: how long each stalls the
frontend's event loop and how much memory it makes a broker process take.

    python -m bench.request_decoding [--sizes 256KiB,1MiB,5MiB] [--env KAFSCALE_X=Y ...]

Starts an embedded broker (tests/harness), then for each case (an API version, the array in it
whose elements cost the most per byte, at each size; ``limit``: as many elements as
KAFSCALE_MAX_REQUEST_ELEMENTS lets through by default) sends one frame on its own connection
while a probe connection sends Metadata v12 requests back to back. Reported per case:

- ``answer``: from the last byte sent to the response (or the connection closed; a response
  to an ApiVersions request sent right after it, so Produce acks=0 is timed too);
- ``stall``: the longest a probe request waited meanwhile (the frontend's event loop is one
  thread: a request it decodes or handles for 2 s delays every other client 2 s);
- ``RSS``: the largest growth of the broker's RSS (summed over its processes, sampled every
  10 ms) over the case.

The frames come from tests/unit/protocol/frames.py (``worst_frames``). Pass
``--env KAFSCALE_MAX_DECODED_REQUEST_BYTES=100MiB`` to measure without the decoded-size limit.
Numbers are for one machine; compare runs made on it.
"""

from __future__ import annotations

import argparse
import socket
import struct
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from kio.index import load_request_schema

from bench.procstats import tree_pids
from kafscale.config import SETTINGS_BY_FIELD, parse_size
from kafscale.protocol import bounds, codec
from kafscale.protocol.limits import UNLIMITED
from tests.harness.broker import BrokerFactory, BrokerProcess
from tests.unit.protocol import frames

#: (API key, version, array path, variant): the costliest per byte of each kind, from
#: tests/unit/protocol/test_bounds.py's measurement over every served version.
CASES: list[tuple[int, int, tuple[str, ...], frames.Variant]] = [
    (3, 1, ("topics",), "small"),  # Metadata v1: 2 bytes per topic
    (3, 12, ("topics",), "valued"),
    (2, 10, ("topics",), "small"),  # ListOffsets: the slowest per byte decoded
    (37, 3, ("topics", "assignments"), "small"),  # CreatePartitions
    (32, 4, ("resources", "configuration_keys"), "small"),  # DescribeConfigs
    (9, 9, ("groups", "topics"), "valued"),  # OffsetFetch
    (8, 9, ("topics", "partitions"), "valued"),  # OffsetCommit
    (1, 17, ("topics", "partitions"), "valued"),  # Fetch
    (0, 11, ("topic_data", "partition_data"), "small"),  # Produce: all structure, no records
]


API_VERSIONS_CORRELATION_ID = 424242
_API_VERSIONS_FRAME = codec.encode_request(
    codec.build(
        load_request_schema(18, 3), client_software_name="bench", client_software_version="1"
    ),
    API_VERSIONS_CORRELATION_ID,
)
API_VERSIONS = struct.pack(">i", len(_API_VERSIONS_FRAME)) + _API_VERSIONS_FRAME


class Probe(threading.Thread):
    """Metadata v12 requests one after another; the longest wait since `reset()`."""

    def __init__(self, address: tuple[str, int]) -> None:
        super().__init__(daemon=True)
        request = codec.build(
            load_request_schema(3, 12),
            topics=(),
            allow_auto_topic_creation=False,
            include_topic_authorized_operations=False,
        )
        frame = codec.encode_request(request, 1)
        self._payload = struct.pack(">i", len(frame)) + frame
        self._sock = socket.create_connection(address)
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._worst = 0.0

    def run(self) -> None:
        while not self._done.is_set():
            started = time.perf_counter()
            self._sock.sendall(self._payload)
            _read_frame(self._sock)
            with self._lock:
                self._worst = max(self._worst, time.perf_counter() - started)

    def reset(self) -> float:
        with self._lock:
            worst, self._worst = self._worst, 0.0
        return worst

    def stop(self) -> None:
        self._done.set()
        self.join()
        self._sock.close()


def _read_frame(sock: socket.socket) -> bytes | None:
    head = _read_exactly(sock, 4)
    if head is None:
        return None
    return _read_exactly(sock, struct.unpack(">i", head)[0])


def _read_exactly(sock: socket.socket, size: int) -> bytes | None:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(min(size - len(data), 1 << 20))
        if not chunk:
            return None
        data += chunk
    return bytes(data)


def tree_rss(broker: BrokerProcess) -> int:
    """The sum of VmRSS over the broker's processes (bytes)."""
    total = 0
    for pid in tree_pids(broker.pid):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        total += next(
            (int(line.split()[1]) * 1024 for line in status.splitlines() if line[:6] == "VmRSS:"),
            0,
        )
    return total


class RssSampler(threading.Thread):
    """The largest tree RSS seen, sampled every 10 ms until `stop()`."""

    def __init__(self, broker: BrokerProcess) -> None:
        super().__init__(daemon=True)
        self._broker = broker
        self._done = threading.Event()
        self.peak = tree_rss(broker)

    def run(self) -> None:
        while not self._done.wait(0.01):
            self.peak = max(self.peak, tree_rss(self._broker))

    def stop(self) -> int:
        self._done.set()
        self.join()
        return self.peak


def run_case(broker: BrokerProcess, probe: Probe, frame: bytes) -> tuple[float, float, int, str]:
    before = tree_rss(broker)
    sampler = RssSampler(broker)
    sampler.start()
    with socket.create_connection(("127.0.0.1", broker.port), timeout=300) as attacker:
        probe.reset()
        # An ApiVersions request after it: answered once the case is (in order), also when the
        # case itself gets no answer (Produce acks=0).
        outcome = "closed"
        try:
            attacker.sendall(struct.pack(">i", len(frame)) + frame + API_VERSIONS)
            sent = time.perf_counter()
            while (answer := _read_frame(attacker)) is not None:
                if struct.unpack_from(">i", answer)[0] == API_VERSIONS_CORRELATION_ID:
                    outcome = "answered"
                    break
        except (ConnectionResetError, BrokenPipeError):
            sent = time.perf_counter()  # refused before the whole frame was sent
        elapsed = time.perf_counter() - sent
    time.sleep(0.2)  # a probe request in flight when the answer came
    stall = probe.reset()
    return elapsed, stall, sampler.stop() - before, outcome


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="limit,256KiB,1MiB,5MiB")
    parser.add_argument("--env", action="append", default=[], help="KAFSCALE_X=Y for the broker")
    parser.add_argument("--only", help="run the cases whose name holds this text")
    parser.add_argument("--keep", type=Path, help="keep the broker's directory (log) here")
    args = parser.parse_args()
    sizes = [0 if size == "limit" else parse_size(size) for size in args.sizes.split(",")]
    env = dict(item.split("=", 1) for item in args.env)
    element_limit = int(
        env.get("KAFSCALE_MAX_REQUEST_ELEMENTS", SETTINGS_BY_FIELD["max_request_elements"].default)
    )
    with tempfile.TemporaryDirectory() as tmp:
        work = args.keep or Path(tmp)
        factory = BrokerFactory(work, "request-decoding", _no_backend, _no_backend)
        try:
            broker = factory({"KAFSCALE_AUTO_CREATE_TOPICS": "false", **env}, ready=True)
            probe = Probe(("127.0.0.1", broker.port))
            probe.start()
            time.sleep(0.5)
            print(f"{'case':58} {'size':>8} {'answer s':>9} {'stall s':>8} {'RSS':>6}")
            for api_key, version, path, variant in CASES:
                schema = load_request_schema(api_key, version)
                if args.only and args.only not in f"{schema.__name__} v{version}":
                    continue
                for size in sizes:
                    count = _count(schema, path, size, variant, element_limit)
                    frame = frames.spliced(schema, path, count, variant)
                    answer, stall, growth, outcome = run_case(broker, probe, frame)
                    name = f"{schema.__name__} v{version} {'.'.join(path)} ({variant})"
                    print(
                        f"{name:58} {len(frame) / 2**20:7.2f}M {answer:9.3f} {stall:8.3f} "
                        f"{growth / 2**20:5.0f}M {outcome}",
                        flush=True,
                    )
            probe.stop()
        finally:
            for problem in factory.close():
                print("harness:", problem)


def _count(
    schema: Any, path: tuple[str, ...], size: int, variant: frames.Variant, element_limit: int
) -> int:
    """Elements to put in the array at ``path`` for a frame of about ``size`` bytes, or (size
    0) for exactly the broker's element limit."""
    one = frames.frame_with_elements(schema, path, 1, variant)
    if size == 0:
        others = bounds.check_request(one, schema, UNLIMITED).elements - 1
        return element_limit - others
    two = frames.frame_with_elements(schema, path, 2, variant)
    return max(1, (size - len(one)) // (len(two) - len(one)) + 1)


def _no_backend() -> Any:
    raise RuntimeError("the bench runs the embedded backends")


if __name__ == "__main__":
    main()
