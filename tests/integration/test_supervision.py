"""The supervisor restarts dead and hung children (also while another child boots), stops cleanly,
and refuses to start half-broken."""

from __future__ import annotations

import contextlib
import json
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


def log_entries(broker: Any) -> list[dict[str, Any]]:
    """The broker's JSON log lines, parsed (the harness's own lines are skipped)."""
    entries = []
    for line in broker.log_text().splitlines():
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                entries.append(json.loads(line))
    return entries


def logged(broker: Any, process: str, msg: str, pid: int | None = None) -> bool:
    return any(
        entry.get("process") == process
        and entry.get("msg") == msg
        and (pid is None or entry.get("pid") == pid)
        for entry in log_entries(broker)
    )


# (victim, held): the victim is killed while the held child is in its boot (not yet ready).
BOOT_RACES = [
    ("coordinator-0", "flusher-0"),
    ("coordinator-0", "shard-1"),
    ("coordinator-0", "frontend-0"),
    ("flusher-0", "shard-0"),
    ("flusher-0", "frontend-0"),
    ("shard-0", "frontend-0"),
    ("shard-0", "shard-1"),  # the same group: shard-0 was ready, shard-1 still boots
]


@pytest.mark.parametrize(("victim", "held"), BOOT_RACES)
def test_a_child_killed_while_another_boots_is_respawned(
    start_broker: Callable[..., Any], tmp_path: Any, victim: str, held: str
) -> None:
    hold = tmp_path / "hold"
    hold.mkdir()
    (hold / f"{held}.hold").touch()
    broker = start_broker(env={"KAFSCALE_TEST_HOLD_READY_DIR": str(hold)})
    wait_for(
        lambda: logged(broker, held, "holding ready (test knob)") and broker.running,
        60,
        f"{held} to reach its ready() and be held there",
    )
    before = roles(broker)
    wait_for(lambda: logged(broker, victim, "ready", before[victim]), 30, f"{victim} ready")
    os.kill(before[victim], signal.SIGKILL)
    wait_for(
        lambda: roles(broker).get(victim, before[victim]) != before[victim],
        30,
        f"{victim} to be respawned while {held} boots",
    )
    after = roles(broker)[victim]
    wait_for(lambda: logged(broker, victim, "ready", after), 30, f"the new {victim} ready")
    assert not logged(broker, held, "ready"), f"{held} was not held in its boot"
    (hold / f"{held}.hold").unlink()
    broker.wait_ready()
    assert set(roles(broker)) == {"coordinator-0", "flusher-0", "shard-0", "shard-1", "frontend-0"}
    assert list_brokers(broker.bootstrap) == [0]


def test_a_child_that_stops_answering_pings_is_killed_and_respawned(
    start_broker: Callable[..., Any],
) -> None:
    broker = start_broker(env={"KAFSCALE_CHILD_HANG_TIMEOUT_MS": "6000"})
    broker.wait_ready()
    before = roles(broker)
    os.kill(before["shard-0"], signal.SIGSTOP)  # alive, holds its sockets, answers nothing
    stopped_at = time.monotonic()
    wait_for(
        lambda: roles(broker).get("shard-0", before["shard-0"]) != before["shard-0"],
        60,
        "the stopped shard to be killed and respawned",
    )
    detected_after = time.monotonic() - stopped_at
    broker.wait_ready()
    entries = [
        e
        for e in log_entries(broker)
        if e.get("msg") == "child does not answer its liveness pings; killing it"
    ]
    assert len(entries) == 1, entries
    assert entries[0]["child"] == "shard-0" and entries[0]["child_pid"] == before["shard-0"]
    assert entries[0]["missed_pings"] >= 3 and entries[0]["silent_for_s"] >= 6.0
    assert 'kafscale_child_hangs_total{role="shard"} 1.0' in broker.metrics_text()
    # Only the hung child was replaced; the others kept running throughout.
    after = roles(broker)
    assert {n: p for n, p in after.items() if n != "shard-0"} == {
        n: p for n, p in before.items() if n != "shard-0"
    }
    assert list_brokers(broker.bootstrap) == [0]
    print(f"hung shard replaced {detected_after:.1f} s after SIGSTOP (timeout 6 s)")


def test_a_respawned_child_stuck_in_its_boot_is_killed_and_respawned(
    start_broker: Callable[..., Any], tmp_path: Any
) -> None:
    hold = tmp_path / "hold"
    hold.mkdir()
    broker = start_broker(
        env={"KAFSCALE_CHILD_HANG_TIMEOUT_MS": "6000", "KAFSCALE_TEST_HOLD_READY_DIR": str(hold)}
    )
    broker.wait_ready()
    (hold / "shard-1.hold").touch()  # every later shard-1 hangs in its boot
    os.kill(roles(broker)["shard-1"], signal.SIGKILL)

    def overdue() -> list[dict[str, Any]]:
        return [
            e
            for e in log_entries(broker)
            if e.get("msg") == "child did not become ready in time; killing it"
        ]

    wait_for(lambda: len(overdue()) >= 2, 90, "two boots of shard-1 to be killed as overdue")
    assert all(e["child"] == "shard-1" and e["booting_for_s"] >= 6.0 for e in overdue())
    assert broker.running  # never a reason to stop the broker
    (hold / "shard-1.hold").unlink()
    broker.wait_ready()
    assert set(roles(broker)) == {"coordinator-0", "flusher-0", "shard-0", "shard-1", "frontend-0"}


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
    assert f"cannot listen on PLAINTEXT://127.0.0.1:{port}" in log
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
