"""The README's run command, as a newcomer uses it: embedded backends on localhost:9092."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.harness.paths import ROOT
from tests.harness.procs import children, still_alive, wait_until

pytestmark = pytest.mark.integration


def readyz() -> bool:
    try:
        with urllib.request.urlopen("http://127.0.0.1:9093/readyz", timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def test_readme_run_command_serves_kcat_on_9092(tmp_path: Path, kcat: str) -> None:
    readme = (ROOT / "README.md").read_text()
    assert "./scripts/serve.sh\n" in readme
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAFSCALE_")}
    log = (tmp_path / "serve.log").open("wb")
    serve = subprocess.Popen(
        [str(ROOT / "scripts" / "serve.sh")],
        cwd=tmp_path,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    try:
        wait_until(
            lambda: True if readyz() or serve.poll() is not None else None,
            timeout=120,
            what="the broker on 127.0.0.1:9092 to become ready",
        )
        assert serve.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
        tree = children(serve.pid)
        assert len(tree) == 3 + (os.cpu_count() or 1)  # coordinator, flusher, frontend, shards
        listing = subprocess.run(
            [kcat, "-L", "-J", "-b", "127.0.0.1:9092", "-m", "15"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        brokers = json.loads(listing.stdout)["brokers"]
        assert [(b["id"], b["name"]) for b in brokers] == [(0, "127.0.0.1:9092")]
        # The embedded backends live in ./data of the working directory.
        assert (tmp_path / "data" / "metadata.sqlite").exists()
        assert (tmp_path / "data" / "segments").is_dir()
        serve.send_signal(signal.SIGINT)  # Ctrl-C
        assert serve.wait(timeout=60) == 0
        assert not still_alive(tree)
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait()
        log.close()
