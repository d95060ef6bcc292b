"""Kafka's own admin tools (kafka-consumer-groups.sh, kafka-topics.sh, kafka-configs.sh,
kafka-acls.sh, kafka-delete-records.sh, kafka-log-dirs.sh) run from the jars in
tests/java/target/tools-4 (scripts/install-deps.sh builds them: see tests/java/tools-4/pom.xml),
the way the shell scripts of a Kafka distribution run them:
`java -cp 'tools-4/*' MAIN_CLASS ARGS...`.

The tools log through slf4j-simple at WARN (KAFSCALE_TOOLS_LOG_LEVEL to change it), to stderr, so
stdout is only what the tool prints. They exit 1 on an error, with the message on stdout and the
stack trace on stderr, except ConsumerGroupCommand, which exits 0 when the broker refused a request
(see `failed`).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.harness.clients import JVM_FLAGS
from tests.harness.paths import JAVA_TARGET
from tests.harness.procs import HarnessError

# The main classes of Kafka 4.x's tools (bin/kafka-*.sh), by the name the scripts give them.
TOOL_MAINS = {
    "consumer-groups": "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
    "topics": "org.apache.kafka.tools.TopicCommand",
    "configs": "kafka.admin.ConfigCommand",
    "acls": "org.apache.kafka.tools.AclCommand",
    "delete-records": "org.apache.kafka.tools.DeleteRecordsCommand",
    "log-dirs": "org.apache.kafka.tools.LogDirsCommand",
}
TOOLS_TIMEOUT = 90.0

_INSTALL_HINT = "run scripts/install-deps.sh"


class KafkaTools:
    """`run(tool, *args, timeout=...) -> CompletedProcess` for tool in TOOL_MAINS."""

    def __init__(self, java: str, target: Path = JAVA_TARGET) -> None:
        self.java = java
        self.lib = target / "tools-4"
        for jar in ("kafka-tools-[0-9]*.jar", "kafka_2.13-*.jar", "slf4j-simple-*.jar"):
            if not list(self.lib.glob(jar)):
                raise HarnessError(
                    f"Kafka's tools are not built ({jar} in {self.lib}): {_INSTALL_HINT}"
                )

    @property
    def version(self) -> str:
        """The Kafka version of the tools, from the kafka-tools jar's name."""
        [jar] = self.lib.glob("kafka-tools-[0-9]*.jar")
        return jar.stem.removeprefix("kafka-tools-")

    def argv(self, tool: str, *args: str) -> list[str]:
        """The command line that runs the tool (for callers that stream its output)."""
        if tool not in TOOL_MAINS:
            raise ValueError(f"tool must be one of {sorted(TOOL_MAINS)}, not {tool!r}")
        level = os.environ.get("KAFSCALE_TOOLS_LOG_LEVEL", "warn")
        logging = [
            f"-Dorg.slf4j.simpleLogger.defaultLogLevel={level}",
            "-Dorg.slf4j.simpleLogger.logFile=System.err",
        ]
        return [self.java, *JVM_FLAGS, *logging, "-cp", f"{self.lib}/*", TOOL_MAINS[tool], *args]

    def run(
        self, tool: str, *args: str, timeout: float = TOOLS_TIMEOUT
    ) -> subprocess.CompletedProcess[str]:
        """Run the tool to its end; a tool that outlives `timeout` is killed and reported."""
        __tracebackhide__ = True
        argv = self.argv(tool, *args)
        try:
            return subprocess.run(
                argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
            )
        except subprocess.TimeoutExpired as exc:
            raise HarnessError(
                f"kafka tool {tool} {' '.join(args)} timed out after {timeout:.0f}s\n"
                f"stdout: {_decoded(exc.stdout)}\nstderr: {_decoded(exc.stderr)}"
            ) from None

    def check(self, tool: str, *args: str, timeout: float = TOOLS_TIMEOUT) -> str:
        """Run a tool that must exit 0 and return its stdout."""
        __tracebackhide__ = True
        result = self.run(tool, *args, timeout=timeout)
        if failed(tool, result):
            raise HarnessError(
                f"kafka tool {tool} {' '.join(args)} exited {result.returncode}\n"
                f"stdout: {result.stdout}\nstderr: {result.stderr[-4000:]}"
            )
        return result.stdout


def failed(tool: str, result: subprocess.CompletedProcess[str]) -> bool:
    """Whether a tool's run failed. ConsumerGroupCommand exits 0 when the broker refuses a request
    (it prints "Error: ..." on stdout and exits 1 only for bad arguments), so its stdout counts."""
    if result.returncode != 0:
        return True
    return tool == "consumer-groups" and any(
        line.startswith("Error: ") for line in result.stdout.splitlines()
    )


def _decoded(data: str | bytes | None) -> str:
    if isinstance(data, bytes):
        return data.decode(errors="replace")
    return data or ""
