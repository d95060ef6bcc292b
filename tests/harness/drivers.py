"""What the compatibility drivers of other languages share (tests/compat/go, tests/compat/node)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from typing import Any

from tests.harness.procs import HarnessError


class AdminAndGroupCommands:
    """`admin` and `group-consume`, which the franz-go and kafkajs drivers take alike: a driver
    names its program (`commands`, e.g. [node, group.js]) and its `name`."""

    name: str

    def commands(self) -> list[str]:
        raise NotImplementedError

    def admin(
        self,
        bootstrap: str,
        topic: str,
        partitions: int,
        configs: dict[str, str] | None = None,
        group: str | None = None,
    ) -> dict[str, Any]:
        """Create `topic` (twice), describe the cluster, the topic, its configs and `group`
        with the client's admin API; the driver's JSON object (tests/compat/go/admin.go)."""
        argv = [*self.commands(), "admin", "--bootstrap", bootstrap, "--topic", topic]
        argv += ["--partitions", str(partitions)]
        for key, value in (configs or {}).items():
            argv += ["--config", f"{key}={value}"]
        if group is not None:
            argv += ["--group", group]
        result = subprocess.run(argv, capture_output=True, timeout=120, check=False)
        stderr = result.stderr[-3000:].decode(errors="replace")
        if result.returncode != 0:
            raise HarnessError(f"{self.name} admin exited {result.returncode}\nstderr: {stderr}")
        described: dict[str, Any] = json.loads(result.stdout.decode().splitlines()[-1])
        return described

    def group_argv(self, options: Sequence[str]) -> list[str]:
        """The command of a consumer-group member (tests/harness/groups.py)."""
        return [*self.commands(), "group-consume", *options]
