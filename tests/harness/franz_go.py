"""franz-go (github.com/twmb/franz-go/pkg/kgo) as a round-trip client, through the small Go driver
in tests/compat/go (built into .tools/bin/kafscale-franz-go by tests/compat/go/install.sh).

The driver speaks JSON lines with base64 bytes (see tests/compat/go/main.go). It produces with
kgo's defaults (acks=all, idempotent) and a manual partitioner; it consumes by direct partition
assignment (no group), its start offsets resolved with kadm ListOffsets (start, end, or the first
offset at or after a timestamp: a partition without one starts at its end) before it says ready.
`FranzGo(security=DriverSecurity(...))` connects every one of its clients with TLS and SASL
(tests/harness/drivers.py); without, in plaintext.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from pathlib import Path

from tests.harness.drivers import AdminAndGroupCommands, DriverSecurity
from tests.harness.paths import TOOLS_BIN
from tests.harness.procs import HarnessError
from tests.harness.roundtrip import (
    Ack,
    Consumed,
    OnReady,
    Record,
    Start,
    _compression,
    _missing_acks,
)
from tests.harness.roundtrip_cli import _b64, stream_consumed

DRIVER = TOOLS_BIN / "kafscale-franz-go"


def find_franz_go() -> Path:
    if not DRIVER.is_file():
        raise HarnessError(f"{DRIVER} is missing: run tests/compat/go/install.sh")
    return DRIVER


class FranzGo(AdminAndGroupCommands):
    name = "franz-go"

    def __init__(self, path: Path | None = None, security: DriverSecurity | None = None) -> None:
        self.path = str(path or find_franz_go())
        self.security = security

    def produce(
        self, bootstrap: str, topic: str, records: Sequence[Record], codec: str
    ) -> list[Ack]:
        _compression(codec)
        lines = "".join(
            json.dumps(
                {
                    "partition": r.partition,
                    "key_b64": _b64(r.key),
                    "value_b64": _b64(r.value),
                    "headers": [[name, _b64(value)] for name, value in r.headers],
                    "timestamp": r.timestamp,
                }
            )
            + "\n"
            for r in records
        )
        argv = [self.path, "produce", "--bootstrap", bootstrap, "--topic", topic, "--codec", codec]
        try:
            result = subprocess.run(
                self.launch(argv),
                input=lines.encode(),
                capture_output=True,
                timeout=120,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise HarnessError(f"franz-go produce to {topic} took over 120s") from exc
        if result.returncode != 0:
            raise HarnessError(
                f"franz-go produce exited {result.returncode}\n"
                f"stderr: {result.stderr[-3000:].decode(errors='replace')}"
            )
        acks: list[Ack | None] = [
            Ack(a["partition"], a["offset"]) for a in map(json.loads, result.stdout.splitlines())
        ]
        acks += [None] * (len(records) - len(acks))
        return _missing_acks(self.name, acks)

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
        argv = [
            self.path, "consume",
            "--bootstrap", bootstrap,
            "--topics", ",".join(topics),
            "--partitions", ",".join(map(str, partitions)),
            "--start", str(start),
            "--count", str(count),
            "--timeout-ms", str(int(timeout * 1000)),
        ]  # fmt: skip
        # The driver stops by itself at the deadline; the margin covers listing offsets.
        return stream_consumed(
            self.launch(argv),
            f"franz-go consume {','.join(topics)} from {start}",
            timeout + 30,
            on_ready,
        )

    def commands(self) -> list[str]:
        return [self.path]
