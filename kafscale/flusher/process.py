"""The flusher process: turns sealed partition buffers into ``.kfs``/``.index`` objects in S3.

It boots by reaching the object store (a configured S3 that cannot be reached is a boot failure,
never a silent fallback) and then serves requests from the shards. Sealing, segment building and
commits arrive with the write path; today it proves the object store and answers pings.
"""

from __future__ import annotations

import logging

from kafscale.ipc import messages
from kafscale.ipc.rpc import RpcServer, serve_until
from kafscale.storage import open_object_store
from kafscale.supervisor.child import ChildContext

log = logging.getLogger(__name__)


def run(ctx: ChildContext) -> None:
    objects = open_object_store(ctx.config)
    try:
        objects.check()
        server = RpcServer(ctx.zmq_context, ctx.address())
        log.info("flusher up", extra={"objects": objects.description})
        ctx.ready()
        try:
            serve_until(ctx.stopping, server, {messages.Ping: lambda _: ctx.pong()})
        finally:
            server.close()
    finally:
        objects.close()
