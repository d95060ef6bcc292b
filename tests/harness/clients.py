"""Real Kafka clients outside Python: the Java probe (two kafka-clients versions) and kcat.

The probe is built by scripts/install-deps.sh (`mvn package` in tests/java); see
tests/java/pom.xml for the layout and KafscaleProbe.java for its commands. Each command prints
one JSON document on stdout, or exits non-zero with a JSON error line and a stack trace on stderr.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from tests.harness.paths import JAVA_TARGET
from tests.harness.procs import HarnessError

# Labels of the kafka-clients builds: lib-3.9 (3.9.x) and lib-4 (latest 4.x).
JAVA_CLIENT_VERSIONS = ("3.9", "4")
PROBE_MAIN = "io.kafscale.probe.KafscaleProbe"
PROBE_TIMEOUT = 90.0
# A short-lived client: start fast, stay small (two cores are shared with the broker).
JVM_FLAGS = ["-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xmx256m"]

_INSTALL_HINT = "run scripts/install-deps.sh"


class JavaProbe:
    """Runs `KafscaleProbe COMMAND ARGS...` with the jars of one kafka-clients version."""

    def __init__(self, java: str, target: Path = JAVA_TARGET) -> None:
        self.java = java
        self.target = target
        classes = target / "probe" / "classes"
        if not (classes / Path(*PROBE_MAIN.split("."))).with_suffix(".class").exists():
            raise HarnessError(f"the Java probe is not built in {classes}: {_INSTALL_HINT}")
        for label in JAVA_CLIENT_VERSIONS:
            if not list(self._lib(label).glob("kafka-clients-*.jar")):
                raise HarnessError(
                    f"kafka-clients jars missing in {self._lib(label)}: {_INSTALL_HINT}"
                )

    def _lib(self, label: str) -> Path:
        return self.target / f"lib-{label}"

    def classpath(self, version_label: str) -> str:
        if version_label not in JAVA_CLIENT_VERSIONS:
            raise ValueError(f"version_label must be one of {JAVA_CLIENT_VERSIONS}")
        return f"{self.target / 'probe' / 'classes'}{os.pathsep}{self._lib(version_label)}/*"

    def argv(self, version_label: str, *args: str) -> list[str]:
        """The command line that runs `KafscaleProbe ARGS...` (for callers that stream output)."""
        return [self.java, *JVM_FLAGS, "-cp", self.classpath(version_label), PROBE_MAIN, *args]

    def __call__(
        self, version_label: str, *args: str, timeout: float = PROBE_TIMEOUT
    ) -> subprocess.CompletedProcess[str]:
        __tracebackhide__ = True
        argv = self.argv(version_label, *args)
        try:
            return subprocess.run(
                argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
            )
        except subprocess.TimeoutExpired as exc:
            raise HarnessError(
                f"java probe {version_label} {' '.join(args)} timed out after {timeout:.0f}s\n"
                f"stdout: {_text(exc.stdout)}\nstderr: {_text(exc.stderr)}"
            ) from None

    def json(self, version_label: str, *args: str, timeout: float = PROBE_TIMEOUT) -> Any:
        """Run a command that must succeed and return its parsed JSON output."""
        __tracebackhide__ = True
        result = self(version_label, *args, timeout=timeout)
        if result.returncode != 0:
            raise HarnessError(
                f"java probe {version_label} {' '.join(args)} exited {result.returncode}\n"
                f"stdout: {result.stdout}\nstderr: {result.stderr[-4000:]}"
            )
        return json.loads(result.stdout)


def _text(data: str | bytes | None) -> str:
    if isinstance(data, bytes):
        return data.decode(errors="replace")
    return data or ""


def find_java() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and os.access(Path(java_home, "bin", "java"), os.X_OK):
        return str(Path(java_home, "bin", "java"))
    java = shutil.which("java")
    if java is None:
        raise HarnessError(f"java is not installed: {_INSTALL_HINT}")
    return java


def find_kcat() -> str:
    kcat = shutil.which("kcat") or shutil.which("kafkacat")
    if kcat is None:
        raise HarnessError(f"kcat is not installed: {_INSTALL_HINT}")
    return kcat
