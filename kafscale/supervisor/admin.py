"""Operator commands the supervisor carries out for its children (served on the metrics port).

``POST /flush``: every shard seals its open buffers and answers once all of it is committed to
S3 and the metadata store -- an explicit flush, e.g. before maintenance.

``POST /drain``: the broker hands every partition over to the other brokers and takes no more
(docs/design/scale-out.md, section 5): what a Kubernetes preStop hook asks before the pod is
stopped, so a rolling restart costs clients only retriable errors. The broker keeps running,
owning nothing, until it is stopped. SIGTERM does the same hand-over first anyway.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import zmq

from kafscale.ipc import endpoints, messages
from kafscale.ipc.rpc import RpcClient, RpcError
from kafscale.supervisor.arbiter import Child

FLUSH_TIMEOUT_MS = 65_000


@dataclass
class FlushOutcome:
    partitions: int = 0
    problems: list[str] = field(default_factory=list)


def flush_all(runtime_dir: str, children: list[Child]) -> FlushOutcome:
    shards = [child for child in children if child.role == "shard"]
    outcome = FlushOutcome()
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        with concurrent.futures.ThreadPoolExecutor(max(1, len(shards))) as pool:
            replies = list(pool.map(lambda shard: _flush(context, runtime_dir, shard), shards))
    finally:
        context.term()
    for shard, reply in zip(shards, replies, strict=True):
        if isinstance(reply, str):
            outcome.problems.append(f"{shard.name}: {reply}")
        else:
            outcome.partitions += reply.partitions
            if reply.error:
                outcome.problems.append(f"{shard.name}: {reply.error}")
    return outcome


def _flush(
    context: zmq.Context[zmq.Socket[bytes]], runtime_dir: str, shard: Child
) -> messages.FlushedAll | str:
    client = RpcClient(context, endpoints.address(runtime_dir, shard.role, shard.index))
    try:
        reply = client.call(messages.FlushAll(), timeout_ms=FLUSH_TIMEOUT_MS).message
    except RpcError as exc:
        return str(exc)
    finally:
        client.close()
    return reply if isinstance(reply, messages.FlushedAll) else f"unexpected reply {reply!r}"


DRAIN_STEP_MS = 2_000


def handed_over(coordinator: RpcClient) -> int | None:
    """Ask the coordinator to hand everything over (the first ask starts it): how many
    partitions are left, or None if it did not answer."""
    try:
        reply = coordinator.call(messages.Drain(), timeout_ms=DRAIN_STEP_MS).message
    except RpcError:
        return None
    return reply.remaining if isinstance(reply, messages.Draining) else None


def drain(runtime_dir: str, announce: Callable[[], bool], timeout_s: float) -> int | None:
    """Mark the broker draining (``announce``), then wait up to ``timeout_s`` until the
    coordinator handed every partition over: the partitions left (0: done; None: unknown)."""
    announce()
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    coordinator = RpcClient(context, endpoints.address(runtime_dir, "coordinator"))
    left: int | None = None
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            left = handed_over(coordinator)
            if left == 0:
                return 0
            time.sleep(0.2)
        return left
    finally:
        coordinator.close()
        context.term()
