"""A shard worker: owns a fixed subset of partitions and their shared-memory append buffers.

Partition assignment, validation and offset assignment arrive with the write path. Today a shard
boots, removes buffers a previous incarnation of the same shard left in /dev/shm (they are not
recovered yet: before the write path exists nothing acknowledged can be in them) and answers
pings.
"""

from __future__ import annotations

import logging

from kafscale.ipc import messages
from kafscale.ipc.rpc import RpcServer, serve_until
from kafscale.shards.buffer import sweep_shard_segments
from kafscale.supervisor.child import ChildContext

log = logging.getLogger(__name__)


def run(ctx: ChildContext) -> None:
    stale = sweep_shard_segments(ctx.run_id, ctx.index)
    if stale:
        log.warning("removed buffers of a previous incarnation", extra={"segments": stale})
    server = RpcServer(ctx.zmq_context, ctx.address())
    ctx.ready()
    try:
        serve_until(ctx.stopping, server, {messages.Ping: lambda _: ctx.pong()})
    finally:
        server.close()
