"""Operator commands the supervisor carries out for its children (served on the metrics port).

``POST /flush``: every shard seals its open buffers and answers once all of it is committed to
S3 and the metadata store -- an explicit flush, e.g. before maintenance.
"""

from __future__ import annotations

import concurrent.futures
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
