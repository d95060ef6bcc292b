"""The round-trip clients driven as subprocesses: kcat and the Java clients (through the
kafka-clients probe), the JSON-lines plumbing the franz-go and kafkajs drivers share with them,
and `all_clients`, the six clients of tests/integration/test_roundtrip.py. The `Client` protocol
and the record types are in tests/harness/roundtrip.py.

kcat's limits (what it cannot express is refused with ValueError, never dropped silently):
- `kcat -P` reads delimited messages from stdin (`-D`, key split at `-K`): keys and values may be
  any bytes, but it sets the same headers (`-H`) on every message of a run and cannot set a
  timestamp (the producer stamps the time of sending). So kcat takes records whose headers are
  the same within a partition (one run per partition) and whose timestamp is None; and a null
  key with an empty value cannot be written (kcat skips empty input messages).
- `kcat -C` reads one topic per run, all of its partitions; `-J` output is binary-safe: yajl
  escapes control bytes and copies the others, so the JSON text decoded with surrogateescape
  gives back the exact bytes.
"""

from __future__ import annotations

import base64
import json
import os
import queue
import re
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from tests.harness.clients import JavaProbe
from tests.harness.procs import HarnessError
from tests.harness.roundtrip import (
    MAX_REQUEST_BYTES,
    Ack,
    AioKafka,
    Client,
    ConfluentKafka,
    Consumed,
    KafkaPython,
    OnReady,
    Record,
    Start,
    _compression,
    _missing_acks,
)


def _stream(
    argv: Sequence[str],
    *,
    what: str,
    timeout: float,
    on_line: Callable[[bytes], bool],
    on_error_line: Callable[[bytes], bool] = lambda line: False,
    on_ready: OnReady | None,
) -> None:
    """Run `argv`, feeding stdout lines to `on_line` and stderr lines to `on_error_line`; either
    returns True when the process says its positions are fixed, and then `on_ready` runs. Ends
    when the process exits (it is killed after `timeout`); raises if it failed or never got
    ready."""
    proc = subprocess.Popen(
        list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    lines: queue.Queue[tuple[str, bytes]] = queue.Queue()

    def pump(name: str, stream: Any) -> None:
        for line in iter(stream.readline, b""):
            lines.put((name, line))
        lines.put((name, b""))

    pumps = [
        threading.Thread(target=pump, args=(name, stream), daemon=True)
        for name, stream in (("out", proc.stdout), ("err", proc.stderr))
    ]
    for thread in pumps:
        thread.start()
    errors: list[bytes] = []
    open_streams, ready = 2, on_ready is None
    deadline = time.monotonic() + timeout
    try:
        while open_streams:
            try:
                name, line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if not line:
                open_streams -= 1
                continue
            if name == "err":
                errors.append(line)
            signalled = on_line(line) if name == "out" else on_error_line(line)
            if signalled and not ready and on_ready is not None:
                ready = True
                on_ready()
    finally:
        if proc.poll() is None:
            proc.kill()
        code = proc.wait()
        for thread in pumps:
            thread.join(5)
    stderr = b"".join(errors[-40:]).decode(errors="replace")
    if code != 0 and not (code == -9 and open_streams):
        raise HarnessError(f"{what} exited {code}\nstderr: {stderr}")
    if not ready:
        raise HarnessError(f"{what} never fixed its positions within {timeout:.0f}s\n{stderr}")


def _bytes(text: str | None) -> bytes | None:
    # kcat -J: yajl escapes bytes below 0x20 and copies the rest, so this inverts it exactly.
    return None if text is None else text.encode("utf-8", "surrogateescape")


class Kcat:
    name = "kcat"

    def __init__(self, path: str) -> None:
        self.path = path

    def produce(
        self, bootstrap: str, topic: str, records: Sequence[Record], codec: str
    ) -> list[Ack]:
        _compression(codec)
        acks: list[Ack | None] = [None] * len(records)
        by_partition: dict[int, list[int]] = {}
        for index, record in enumerate(records):
            by_partition.setdefault(record.partition, []).append(index)
        for partition, indexes in by_partition.items():
            run = [records[i] for i in indexes]
            offsets = self._produce_run(bootstrap, topic, run, codec)
            for ack_index, offset in zip(indexes, offsets, strict=True):
                acks[ack_index] = Ack(partition, offset)
        return _missing_acks(self.name, acks)

    def _produce_run(
        self, bootstrap: str, topic: str, run: Sequence[Record], codec: str
    ) -> list[int]:
        headers = run[0].headers
        for record in run:
            if record.headers != headers:
                raise ValueError("kcat -P sets the same headers on every message of a run")
            if record.timestamp is not None:
                raise ValueError("kcat -P cannot set a record's timestamp")
            if record.key is None and not record.value:
                raise ValueError("kcat -P cannot send a null key with an empty value")
        delimiter, key_delimiter = _delimiters(run)
        framed = b"".join(
            (record.value if record.key is None else record.key + key_delimiter + record.value)
            + delimiter
            for record in run
        )
        argv: list[str | bytes] = [
            self.path, "-P", "-b", bootstrap, "-t", topic, "-p", str(run[0].partition),
            "-D", _escape(delimiter), "-K", _escape(key_delimiter), "-z", codec,
            "-X", "enable.idempotence=true", "-X", f"message.max.bytes={MAX_REQUEST_BYTES}",
            "-v", "-v", "-v",  # verbosity 3 prints each delivery report with its offset
        ]  # fmt: skip
        for name, value in headers:
            if "=" in name or b"\0" in value:
                raise ValueError(f"kcat -H cannot carry header {name!r}={value!r}")
            argv += ["-H", name.encode() + b"=" + value]
        result = subprocess.run(argv, input=framed, capture_output=True, timeout=120)
        offsets = [
            int(offset)
            for offset in re.findall(
                rb"Message delivered to partition \d+ \(offset (-?\d+)\)", result.stderr
            )
        ]
        if result.returncode != 0 or len(offsets) != len(run):
            raise HarnessError(
                f"kcat -P exited {result.returncode} with {len(offsets)} of {len(run)} "
                f"deliveries\nstderr: {result.stderr[-3000:].decode(errors='replace')}"
            )
        return offsets

    def consume(
        self,
        bootstrap: str,
        topics: Sequence[str],
        partitions: Sequence[int],
        start: Start,
        count: int,
        timeout: float,
        on_ready: OnReady | None = None,
    ) -> list[Consumed]:
        if len(topics) != 1:
            raise ValueError("kcat -C reads one topic per run")
        [topic] = topics
        offset = {"earliest": "beginning", "latest": "end"}.get(str(start), f"s@{start}")
        argv = [self.path, "-C", "-b", bootstrap, "-t", topic, "-o", offset, "-J", "-u"]
        argv += ["-c", str(count)]
        received: list[Consumed] = []
        at_end: set[int] = set()

        def on_line(line: bytes) -> bool:
            envelope = json.loads(line.decode("utf-8", "surrogateescape"))
            flat = envelope.get("headers", [])
            received.append(
                Consumed(
                    topic=envelope["topic"],
                    partition=envelope["partition"],
                    offset=envelope["offset"],
                    key=_bytes(envelope["key"]),
                    value=_bytes(envelope["payload"]),
                    headers=tuple(zip(flat[::2], map(_bytes, flat[1::2]), strict=True)),
                    timestamp=envelope["ts"],
                )
            )
            return False

        def on_error_line(line: bytes) -> bool:
            # "% Reached end of topic T [P] at offset N": P's position is fixed (and caught up).
            if found := re.match(rb"% Reached end of topic .* \[(\d+)\] at offset", line):
                at_end.add(int(found[1]))
            return at_end >= set(partitions)

        _stream(
            argv,
            what=f"kcat -C -t {topic} -o {offset}",
            timeout=timeout,
            on_line=on_line,
            on_error_line=on_error_line,
            on_ready=on_ready,
        )
        return [r for r in received if r.partition in partitions]


def _escape(delimiter: bytes) -> str:
    return "".join(f"\\x{byte:02x}" for byte in delimiter)


def _delimiters(run: Sequence[Record]) -> tuple[bytes, bytes]:
    """A message delimiter found in no key or value, and a key delimiter found in no key (nor in
    the value of a record without key, where kcat would split the value)."""
    for _ in range(100):
        delimiter, key_delimiter = os.urandom(8), os.urandom(8)
        if b"\0" in delimiter + key_delimiter:  # passed as C strings
            continue
        if any(delimiter in (r.key or b"") or delimiter in r.value for r in run):
            continue
        if any(key_delimiter in (r.key if r.key is not None else r.value) for r in run):
            continue
        return delimiter, key_delimiter
    raise HarnessError("no delimiter absent from the records after 100 attempts")


# --- Java kafka-clients (the probe) ---------------------------------------------------------------


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


def _unb64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


class JavaClients:
    """kafka-clients 3.9 or 4.x through KafscaleProbe's produce-records and consume commands."""

    def __init__(self, probe: JavaProbe, version_label: str) -> None:
        self.probe = probe
        self.version_label = version_label
        self.name = f"java-{version_label}"

    def produce(
        self, bootstrap: str, topic: str, records: Sequence[Record], codec: str
    ) -> list[Ack]:
        _compression(codec)
        with tempfile.TemporaryDirectory(prefix="kafscale-records-") as tmp:
            path = Path(tmp) / "records.jsonl"
            path.write_text("".join(json.dumps(_java_record(r)) + "\n" for r in records))
            output = self.probe.json(
                self.version_label,
                "produce-records",
                "--bootstrap", bootstrap,
                "--topic", topic,
                "--input", str(path),
                "--timeout-ms", "60000",
                "--config", f"compression.type={codec}",
                "--config", f"max.request.size={MAX_REQUEST_BYTES}",
                "--config", "linger.ms=5",
                timeout=180,
            )  # fmt: skip
        return [Ack(a["partition"], a["offset"]) for a in output["acknowledged"]]

    def consume(
        self,
        bootstrap: str,
        topics: Sequence[str],
        partitions: Sequence[int],
        start: Start,
        count: int,
        timeout: float,
        on_ready: OnReady | None = None,
    ) -> list[Consumed]:
        argv = self.probe.argv(
            self.version_label,
            "consume",
            "--bootstrap", bootstrap,
            "--topics", ",".join(topics),
            "--partitions", ",".join(map(str, partitions)),
            "--start", str(start),
            "--count", str(count),
            "--timeout-ms", str(int(timeout * 1000)),
        )  # fmt: skip
        # The probe stops by itself at the deadline; the extra time covers the JVM's start.
        return stream_consumed(
            argv, f"{self.name} consume {','.join(topics)} from {start}", timeout + 30, on_ready
        )


def consumed_from_json(fields: dict[str, Any]) -> Consumed:
    """A record as the Java probe and the franz-go and kafkajs drivers print it (base64 bytes)."""
    return Consumed(
        topic=fields["topic"],
        partition=fields["partition"],
        offset=fields["offset"],
        key=_unb64(fields["key_b64"]),
        value=_unb64(fields["value_b64"]),
        headers=tuple((name, _unb64(value)) for name, value in fields["headers"]),
        timestamp=fields["timestamp"],
    )


def stream_consumed(
    argv: list[str], what: str, timeout: float, on_ready: OnReady | None
) -> list[Consumed]:
    """Run a consuming driver that prints {"ready": ...}, then records, then {"done": ...}."""
    received: list[Consumed] = []

    def on_line(line: bytes) -> bool:
        fields = json.loads(line)
        if "ready" in fields or "done" in fields:
            return "ready" in fields
        received.append(consumed_from_json(fields))
        return False

    _stream(
        argv,
        what=what,
        timeout=timeout,
        on_line=on_line,
        on_ready=on_ready if on_ready is not None else lambda: None,
    )
    return received


def _java_record(record: Record) -> dict[str, Any]:
    return {
        "partition": record.partition,
        "key_b64": _b64(record.key),
        "value_b64": _b64(record.value),
        "headers": [[name, _b64(value)] for name, value in record.headers],
        "timestamp": record.timestamp,
    }


def all_clients(kcat: str, probe: JavaProbe) -> dict[str, Client]:
    """The six clients by name."""
    clients: Iterable[Client] = (
        Kcat(kcat),
        ConfluentKafka(),
        AioKafka(),
        KafkaPython(),
        JavaClients(probe, "3.9"),
        JavaClients(probe, "4"),
    )
    return {client.name: client for client in clients}
