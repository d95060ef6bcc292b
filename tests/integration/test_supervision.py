"""The supervisor restarts dead children, stops cleanly, and refuses to start half-broken."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from typing import Any

import pytest

from kafscale.ipc.shm import PartitionBuffer

pytestmark = pytest.mark.integration


def roles(broker: Any) -> dict[str, int]:
    """{"shard-0": pid, ...} of the broker's live children, from their command lines."""
    found = {}
    for pid in broker.children():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as file:
                argv = file.read().split(b"\0")
        except FileNotFoundError:
            continue
        if b"kafscale.supervisor.child" in argv:
            at = argv.index(b"kafscale.supervisor.child")
            found[f"{argv[at + 1].decode()}-{argv[at + 2].decode()}"] = pid
    return found


def list_brokers(bootstrap: str) -> list[int]:
    from confluent_kafka.admin import AdminClient

    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=20)
    return sorted(metadata.brokers)


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


@pytest.mark.parametrize("victim", ["shard-1", "coordinator-0", "flusher-0", "frontend-0"])
def test_killed_child_is_restarted_and_metadata_keeps_flowing(
    start_broker: Callable[..., Any], victim: str
) -> None:
    broker = start_broker()
    broker.wait_ready()
    before = roles(broker)
    assert set(before) == {"coordinator-0", "flusher-0", "shard-0", "shard-1", "frontend-0"}
    os.kill(before[victim], signal.SIGKILL)
    assert list_brokers(broker.bootstrap) == [0]  # answered while the child is down or booting
    wait_for(
        lambda: roles(broker).get(victim, before[victim]) != before[victim],
        20,
        f"{victim} to be respawned",
    )
    broker.wait_ready()
    after = roles(broker)
    assert set(after) == set(before)
    assert {name: pid for name, pid in after.items() if name != victim} == {
        name: pid for name, pid in before.items() if name != victim
    }
    assert list_brokers(broker.bootstrap) == [0]
    assert f'"child":"{victim}"' in broker.log_text().replace(" ", "")
    assert broker.metrics_text().count("kafscale_child_restarts_total") >= 1


def test_sigterm_stops_everything_and_leaves_no_shared_memory(
    start_broker: Callable[..., Any],
) -> None:
    broker = start_broker()
    broker.wait_ready()
    children = broker.children()
    assert len(children) == 5
    run_id = re.search(r'"run_id":\s*"([0-9a-f]+)"', broker.log_text())
    assert run_id is not None
    # What a SIGKILLed shard would leave behind: a buffer segment of this run.
    stray = PartitionBuffer.create(f"kafscale-{run_id.group(1)}-s0-b99", 4096)
    stray.close()
    assert os.path.exists(f"/dev/shm/kafscale-{run_id.group(1)}-s0-b99")
    assert broker.terminate(timeout=60) == 0
    for pid in children:
        assert not os.path.exists(f"/proc/{pid}"), f"child {pid} survived"
    assert not [
        name for name in os.listdir("/dev/shm") if name.startswith(f"kafscale-{run_id.group(1)}")
    ]


def test_sigint_stops_like_sigterm(start_broker: Callable[..., Any]) -> None:
    broker = start_broker()
    broker.wait_ready()
    children = broker.children()
    os.kill(broker.pid, signal.SIGINT)
    assert broker.wait(timeout=60) == 0
    assert not [pid for pid in children if os.path.exists(f"/proc/{pid}")]


def test_child_that_cannot_boot_stops_the_broker_with_its_reason(
    start_broker: Callable[..., Any],
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        broker = start_broker(env={"KAFSCALE_BROKER_PORT": str(port)})
        code = broker.wait(timeout=60)
    assert code != 0
    log = broker.log_text()
    assert "frontend-0 failed to boot" in log
    assert f"cannot listen on 127.0.0.1:{port}" in log
    assert not [pid for pid in broker.children() if os.path.exists(f"/proc/{pid}")]


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.parametrize("backend", ["s3", "etcd"])
def test_unreachable_backend_is_a_loud_startup_failure(
    start_broker: Callable[..., Any], backend: str
) -> None:
    port = _closed_port()
    if backend == "s3":
        env = {
            "KAFSCALE_S3_ENDPOINT": f"http://127.0.0.1:{port}",
            "KAFSCALE_S3_BUCKET": "b",
            "KAFSCALE_S3_PATH_STYLE": "true",
            "KAFSCALE_S3_ACCESS_KEY": "k",
            "KAFSCALE_S3_SECRET_KEY": "s",
        }
    else:
        env = {"KAFSCALE_ETCD_ENDPOINTS": f"127.0.0.1:{port}"}
    broker = start_broker(env=env)
    try:
        code = broker.wait(timeout=15)
    except subprocess.TimeoutExpired:
        pytest.fail(f"serve still running 15 s after start with {backend} down")
    assert code != 0
    assert f"127.0.0.1:{port}" in broker.log_text()
    assert "cannot start" in broker.log_text()
