"""What the compatibility drivers of other languages share (tests/compat/go, tests/compat/node):
the `admin` and `group-consume` commands, and how their clients connect (`DriverSecurity`)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tests.harness.procs import HarnessError

ENV_PREFIX = "KAFSCALE_DRIVER_"


@dataclass(frozen=True)
class DriverSecurity:
    """TLS and SASL for every client a driver makes (produce, consume, admin, group members),
    which the drivers read from KAFSCALE_DRIVER_* environment variables (the header of
    tests/compat/go/security.go and of tests/compat/node/driver.js). None is left unset, and the
    drivers refuse a setting the protocol does not use (a CA file with SASL_PLAINTEXT)."""

    protocol: str = "SASL_SSL"  # PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL
    ca_file: str | os.PathLike[str] | None = None  # PEM; None: the system's CAs
    mechanism: str | None = None  # SCRAM-SHA-512 (the drivers' default), SCRAM-SHA-256, PLAIN
    username: str | None = None
    password: str | None = None

    @classmethod
    def scram_over_tls(
        cls,
        ca_file: str | os.PathLike[str],
        username: str,
        password: str,
        mechanism: str = "SCRAM-SHA-512",
    ) -> DriverSecurity:
        return cls("SASL_SSL", ca_file, mechanism, username, password)

    def environment(self) -> dict[str, str]:
        """The variables the drivers read."""
        values = {
            "SECURITY_PROTOCOL": self.protocol,
            "CA_FILE": self.ca_file,
            "SASL_MECHANISM": self.mechanism,
            "SASL_USERNAME": self.username,
            "SASL_PASSWORD": self.password,
        }
        return {ENV_PREFIX + k: os.fspath(v) for k, v in values.items() if v is not None}


class AdminAndGroupCommands:
    """`admin` and `group-consume`, which the franz-go and kafkajs drivers take alike: a driver
    names its program (`commands`, e.g. [node, group.js]) and its `name`. With `security`, every
    command the harness builds runs with its variables (`launch`); without, as it always did."""

    name: str
    security: DriverSecurity | None = None

    def commands(self) -> list[str]:
        raise NotImplementedError

    def launch(self, argv: Sequence[str]) -> list[str]:
        """`argv`, run through env(1) with the security variables when there are any: this way
        they reach a driver however the harness starts it (subprocess.run, the streaming readers
        of roundtrip_cli, GroupConsumer), and a signal to the process reaches the driver itself
        (env execs it). Without security: `argv` unchanged."""
        if self.security is None:
            return list(argv)
        assignments = [f"{key}={value}" for key, value in self.security.environment().items()]
        return ["env", *assignments, *argv]

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
        result = subprocess.run(self.launch(argv), capture_output=True, timeout=120, check=False)
        stderr = result.stderr[-3000:].decode(errors="replace")
        if result.returncode != 0:
            raise HarnessError(f"{self.name} admin exited {result.returncode}\nstderr: {stderr}")
        described: dict[str, Any] = json.loads(result.stdout.decode().splitlines()[-1])
        return described

    def group_argv(self, options: Sequence[str]) -> list[str]:
        """The command of a consumer-group member (tests/harness/groups.py)."""
        return self.launch([*self.commands(), "group-consume", *options])
