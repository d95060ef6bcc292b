"""The frontend's side of the shards: one request/reply client per shard.

Requests carry a partition's records as a zero-copy bulk frame next to the typed header; fetch
replies bring record batches back the same way.
"""

from __future__ import annotations

from collections.abc import Sequence

import zmq.asyncio

from kafscale.ipc import endpoints, messages
from kafscale.ipc.routing import shard_for
from kafscale.ipc.rpc import AsyncRpcClient, Reply, RpcError


class ShardClients:
    def __init__(self, context: zmq.asyncio.Context, runtime_dir: str, shards: int) -> None:
        self.clients = [
            AsyncRpcClient(context, endpoints.address(runtime_dir, "shard", index))
            for index in range(shards)
        ]

    def owner(self, topic_id: str, partition: int) -> int:
        return shard_for(topic_id, partition, len(self.clients))

    async def append(
        self,
        shard: int,
        request: messages.Append,
        records: Sequence[bytes | memoryview],
        timeout: float,
    ) -> messages.Appended:
        reply = await self.clients[shard].call(request, records, timeout=timeout)
        if not isinstance(reply.message, messages.Appended):
            raise RpcError(f"shard {shard} answered {reply.message!r}")
        return reply.message

    async def fetch(self, shard: int, request: messages.Fetch, timeout: float) -> Reply:
        """The shard's ``Fetched`` and, as bulk frames, the records of each result with data."""
        reply = await self.clients[shard].call(request, timeout=timeout)
        if not isinstance(reply.message, messages.Fetched):
            raise RpcError(f"shard {shard} answered {reply.message!r}")
        return reply

    async def release(self, shard: int, fetch_id: int) -> None:
        await self.clients[shard].notify(messages.ReleaseFetch(fetch_id=fetch_id))

    async def list_offsets(
        self, shard: int, request: messages.ListOffsets, timeout: float
    ) -> messages.OffsetsListed:
        reply = await self.clients[shard].call(request, timeout=timeout)
        if not isinstance(reply.message, messages.OffsetsListed):
            raise RpcError(f"shard {shard} answered {reply.message!r}")
        return reply.message

    def close(self) -> None:
        for client in self.clients:
            client.close()
