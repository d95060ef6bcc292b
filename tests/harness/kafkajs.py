"""kafkajs (npm) as a round-trip client: the `Client` protocol of tests/harness/roundtrip.py,
run through `node tests/compat/node/driver.js` (installed by tests/compat/node/install.sh).

kafkajs's limits (see driver.js): a record's headers are an object, so produce refuses records
that repeat a header name apart from its other occurrences or use integer-like header names
(ValueError). kafkajs consumes only through a consumer group: the driver joins a fresh group it
never commits to, seeks to the offsets it resolved with the admin client, and then says "ready".
The codecs: gzip built in, snappy from kafkajs-snappy, lz4 from kafkajs-lz4, zstd from
@bokuweb/zstd-wasm (WebAssembly; @kafkajs/zstd's native cppzst does not build on Node 20).
`KafkaJs(security=DriverSecurity(...))` connects every one of its clients with TLS and SASL
(tests/harness/drivers.py); without, in plaintext.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Sequence
from typing import Any

from tests.harness.drivers import AdminAndGroupCommands, DriverSecurity
from tests.harness.paths import ROOT
from tests.harness.procs import HarnessError
from tests.harness.roundtrip import Ack, Consumed, OnReady, Record, Start, _compression
from tests.harness.roundtrip_cli import _java_record, _stream, consumed_from_json

NODE_DIR = ROOT / "tests" / "compat" / "node"
GROUP_DRIVER = NODE_DIR / "group.js"
DRIVER = NODE_DIR / "driver.js"
INTEGER_LIKE_MAX = 2**32 - 2  # JavaScript orders such property names first


def find_node() -> str:
    node = shutil.which("node")
    if node is None:
        raise HarnessError("node is not on PATH: install Node.js 20+")
    if not (NODE_DIR / "node_modules" / "kafkajs" / "package.json").is_file():
        raise HarnessError(
            f"kafkajs is not installed in {NODE_DIR / 'node_modules'}: "
            "run tests/compat/node/install.sh"
        )
    return node


def _check_headers(record: Record) -> None:
    seen: list[str] = []
    for name, _ in record.headers:
        if name.isdigit() and str(int(name)) == name and int(name) <= INTEGER_LIKE_MAX:
            raise ValueError(f"kafkajs reorders integer-like header names ({name!r})")
        if name in seen and seen[-1] != name:
            raise ValueError(f"kafkajs groups a repeated header name ({name!r})")
        seen.append(name)


class KafkaJs(AdminAndGroupCommands):
    name = "kafkajs"

    def __init__(self, node: str | None = None, security: DriverSecurity | None = None) -> None:
        self.node = node or find_node()
        self.security = security

    def produce(
        self, bootstrap: str, topic: str, records: Sequence[Record], codec: str
    ) -> list[Ack]:
        _compression(codec)
        for record in records:
            _check_headers(record)
        command = {
            "op": "produce",
            "bootstrap": bootstrap,
            "topic": topic,
            "codec": codec,
            "records": [_java_record(r) for r in records],
        }
        result = subprocess.run(
            self.launch([self.node, str(DRIVER)]),
            input=json.dumps(command).encode(),
            capture_output=True,
            timeout=180,
            check=False,
        )
        stderr = result.stderr[-3000:].decode(errors="replace")
        if result.returncode == 2:
            raise ValueError(f"kafkajs refused: {stderr}")
        if result.returncode != 0:
            raise HarnessError(f"kafkajs produce exited {result.returncode}\nstderr: {stderr}")
        lines = result.stdout.decode().splitlines()
        acknowledged = json.loads(lines[-1])["acknowledged"] if lines else None
        if acknowledged is None or len(acknowledged) != len(records):
            raise HarnessError(f"kafkajs produce printed {lines[-1:]!r}\nstderr: {stderr}")
        if any(a is None for a in acknowledged):
            raise HarnessError("kafkajs: a record was never acknowledged")
        return [Ack(a["partition"], a["offset"]) for a in acknowledged]

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
        command: dict[str, Any] = {
            "op": "consume",
            "bootstrap": bootstrap,
            "topics": list(topics),
            "partitions": list(partitions),
            "start": start,
            "count": count,
            "timeout_ms": int(timeout * 1000),
        }
        received: list[Consumed] = []
        done: list[int] = []

        def on_line(line: bytes) -> bool:
            fields = json.loads(line)
            if "ready" in fields:
                return True
            if "done" in fields:
                done.append(fields["received"])
                return False
            received.append(consumed_from_json(fields))
            return False

        # The driver stops by itself at the deadline; the extra time covers the group's join.
        _stream(
            self.launch([self.node, str(DRIVER), json.dumps(command)]),
            what=f"kafkajs consume {','.join(topics)} from {start}",
            timeout=timeout + 60,
            on_line=on_line,
            on_ready=on_ready if on_ready is not None else lambda: None,
        )
        if not done:
            raise HarnessError(f"kafkajs consume never finished (got {len(received)} records)")
        return received

    def commands(self) -> list[str]:
        return [self.node, str(GROUP_DRIVER)]
