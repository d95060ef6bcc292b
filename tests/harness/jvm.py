"""A long-running Java program of the tests (a Kafka Streams application, a Connect worker) as a
process, its stdout and stderr in a log file."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

from tests.harness.clients import find_java


class JavaProcess:
    """``java [flags] -cp CLASSPATH MAIN ARGS...``, started at once."""

    def __init__(
        self, classpath: str, main: str, args: list[str], log: Path, flags: list[str]
    ) -> None:
        self.log = log
        self.out = log.open("w")
        self.process = subprocess.Popen(
            [find_java(), *flags, "-cp", classpath, main, *args],
            stdout=self.out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )

    def stop(self) -> None:
        """SIGTERM, and it must exit cleanly (its shutdown hooks run) within a minute."""
        self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(60)
        finally:
            self.out.close()
        assert code in (0, 128 + signal.SIGTERM, -signal.SIGTERM), self.tail()

    def kill(self) -> None:
        """SIGKILL if still running (a test's cleanup, whatever happened before)."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(30)
        self.out.close()

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-6000:]
