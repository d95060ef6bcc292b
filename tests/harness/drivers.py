"""What the compatibility drivers of other languages share (tests/compat/go, tests/compat/node)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from typing import Any

from tests.harness.procs import HarnessError


def run_admin(
    name: str,
    command: Sequence[str],
    bootstrap: str,
    topic: str,
    partitions: int,
    configs: dict[str, str] | None,
    group: str | None,
) -> dict[str, Any]:
    """Runs an `admin` driver command (franz-go's and kafkajs's take the same options)."""
    argv = [*command, "--bootstrap", bootstrap, "--topic", topic, "--partitions", str(partitions)]
    for key, value in (configs or {}).items():
        argv += ["--config", f"{key}={value}"]
    if group is not None:
        argv += ["--group", group]
    result = subprocess.run(argv, capture_output=True, timeout=120, check=False)
    stderr = result.stderr[-3000:].decode(errors="replace")
    if result.returncode != 0:
        raise HarnessError(f"{name} admin exited {result.returncode}\nstderr: {stderr}")
    described: dict[str, Any] = json.loads(result.stdout.decode().splitlines()[-1])
    return described
