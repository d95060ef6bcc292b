"""The frontend process: the Kafka listener. Owns the client sockets and nothing else.

A ``Listener`` accepts connections on every Kafka listener (``KAFSCALE_LISTENERS``, else
``KAFSCALE_BROKER_HOST:PORT``) within the connection limits and runs one ``Connection`` per
client; handlers answer from the watched metadata view and, with the write path, from the shards
over ZeroMQ; DescribeLogDirs reads partition sizes from the metadata store on a thread. Its event
loop never blocks on S3 or etcd. On SIGTERM it stops accepting, stops reading, answers what it
has read (for at most ``DRAIN_SECONDS``) and exits.
"""

from __future__ import annotations

import asyncio
import logging
import signal

import zmq.asyncio

from kafscale.frontend.context import Broker
from kafscale.frontend.coordinator import CoordinatorClient
from kafscale.frontend.dispatch import APIS
from kafscale.frontend.listener import Listener
from kafscale.frontend.log_dirs import StoredLogDirs
from kafscale.frontend.shards import ShardClients
from kafscale.ipc import endpoints, messages
from kafscale.ipc.rpc import AsyncRpcClient, AsyncRpcServer
from kafscale.metadata import open_metadata_store
from kafscale.metadata.store import MetadataStore
from kafscale.metadata.view import MetadataView
from kafscale.supervisor.child import ChildContext

log = logging.getLogger(__name__)

DRAIN_SECONDS = 10.0


def run(ctx: ChildContext) -> None:
    store = open_metadata_store(ctx.config)
    try:
        view = MetadataView(store, ctx.config.s3_namespace)
        view.start()
        try:
            asyncio.run(_serve(ctx, view, store))
        finally:
            view.stop()
    finally:
        store.close()


async def _serve(ctx: ChildContext, view: MetadataView, store: MetadataStore) -> None:
    config = ctx.config
    zmq_context = zmq.asyncio.Context()
    coordinator = AsyncRpcClient(zmq_context, endpoints.address(ctx.runtime_dir, "coordinator"))
    shards = ShardClients(zmq_context, ctx.runtime_dir, config.shards)
    broker = Broker(
        config,
        view,
        APIS,
        CoordinatorClient(coordinator, view),
        shards,
        StoredLogDirs(config, store),
    )
    listener = Listener(broker)
    await listener.start()  # OSError naming the listener or TLS file that failed
    control = AsyncRpcServer(zmq_context, ctx.address())
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    pings = asyncio.create_task(_answer_pings(ctx, control))
    for endpoint in listener.endpoints:
        log.info(
            "listening",
            extra={
                "listener": endpoint.name,
                "protocol": endpoint.protocol.value,
                "host": endpoint.host,
                "port": endpoint.port,
            },
        )
    ctx.ready()
    try:
        await stop.wait()
    finally:
        listener.stop_accepting()
        await listener.drain(DRAIN_SECONDS)
        pings.cancel()
        control.close()
        coordinator.close()
        shards.close()
        zmq_context.term()


async def _answer_pings(ctx: ChildContext, control: AsyncRpcServer) -> None:
    while True:
        incoming = await control.recv()
        if isinstance(incoming.message, messages.Ping):
            await control.reply(incoming, ctx.pong())
        else:
            name = type(incoming.message).__name__
            await control.reply(incoming, messages.ErrorReply(message=f"unexpected {name}"))
