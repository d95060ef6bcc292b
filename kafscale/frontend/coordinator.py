"""The frontend's side of topic administration: ask the coordinator, then wait for the view.

Only the coordinator writes metadata. After it answers, the frontend waits until its own watched
view holds the coordinator's writes, so a client that creates a topic and then asks for metadata
sees the topic -- and, for a creation, until its partitions have leaders (bounded), so a client
that produces at once finds them led. A coordinator that cannot be reached (restarting) yields a
retriable error for each topic instead of a hang; so does a coordinator that answers
``ErrorReply`` (it could not reach its metadata store).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from kafscale.ipc.messages import (
    AllocateProducerId,
    CreateTopics,
    DeleteTopics,
    ErrorReply,
    Message,
    ProducerIdAllocated,
    TopicResult,
    TopicResults,
    TopicSpec,
)
from kafscale.ipc.rpc import AsyncRpcClient, RpcError
from kafscale.metadata.view import MetadataView, Snapshot
from kafscale.protocol.errors import ErrorCode

log = logging.getLogger(__name__)

TIMEOUT_SECONDS = 30.0
LEADERS_SECONDS = 10.0  # how long CreateTopics waits for the new partitions' leaders


class CoordinatorFailed(RpcError):
    """The coordinator answered ``ErrorReply``: it could not serve the request (its metadata
    store is unreachable, or the request failed in it). Callers treat it as unavailable."""


class CoordinatorClient:
    def __init__(self, rpc: AsyncRpcClient, view: MetadataView) -> None:
        self.rpc = rpc
        self.view = view

    async def create_topics(
        self, specs: Sequence[TopicSpec], validate_only: bool = False
    ) -> list[TopicResult]:
        request = CreateTopics(topics=list(specs), validate_only=validate_only)
        names: list[str | None] = [spec.name for spec in specs]
        results = await self._call(request, names)
        if not validate_only:
            created = [r.name for r in results if r.error_code == 0 and r.name is not None]
            await self._led(created)
        return results

    async def _led(self, topics: list[str]) -> None:
        """Wait (bounded) until every partition of ``topics`` has a leader: the broker it is
        assigned to claims it once its own view has the topic, and a client that produces
        right after CreateTopics should find leaders, as with Kafka."""

        def led(snapshot: Snapshot) -> bool:
            for name in topics:
                record = snapshot.topics.get(name)
                if record is None:
                    continue  # deleted meanwhile: nothing to wait for
                if any((name, p) not in snapshot.leaders for p in range(record.partitions)):
                    return False
            return True

        if topics and not await asyncio.to_thread(self.view.wait_until, led, LEADERS_SECONDS):
            log.warning("new partitions have no leader yet", extra={"topics": topics})

    async def delete_topics(
        self, names: Sequence[str], topic_ids: Sequence[str]
    ) -> list[TopicResult]:
        request = DeleteTopics(names=list(names), topic_ids=list(topic_ids))
        return await self._call(request, [*names, *(None for _ in topic_ids)])

    async def call(self, request: Message, timeout: float = TIMEOUT_SECONDS) -> Message:
        """The coordinator's reply to any request it serves; raises RpcError when it cannot be
        reached in time, or answers ``ErrorReply`` (``CoordinatorFailed``)."""
        reply = await self.rpc.call(request, timeout=timeout)
        if isinstance(reply.message, ErrorReply):
            raise CoordinatorFailed(reply.message.message)
        return reply.message

    async def caught_up(self, revision: int) -> None:
        """Wait until this frontend's view holds ``revision`` (a write the coordinator made)."""
        if revision and not await asyncio.to_thread(
            self.view.wait_for_revision, revision, TIMEOUT_SECONDS
        ):
            log.warning("metadata view lags the coordinator", extra={"revision": revision})

    async def allocate_producer_id(self) -> int:
        """A new producer id, or -1 when the coordinator cannot be reached."""
        try:
            reply = await self.rpc.call(AllocateProducerId(), timeout=TIMEOUT_SECONDS)
        except RpcError as exc:
            log.warning("coordinator unavailable", extra={"error": str(exc)})
            return -1
        if not isinstance(reply.message, ProducerIdAllocated):
            log.error("unexpected reply from the coordinator", extra={"reply": repr(reply)})
            return -1
        return reply.message.producer_id

    async def _call(
        self, request: CreateTopics | DeleteTopics, names: list[str | None]
    ) -> list[TopicResult]:
        try:
            reply = await self.rpc.call(request, timeout=TIMEOUT_SECONDS)
        except RpcError as exc:
            log.warning("coordinator unavailable", extra={"error": str(exc)})
            return _unavailable(names, "the coordinator is unavailable")
        if isinstance(reply.message, ErrorReply):
            # The coordinator could not serve it (its metadata store is down): retriable too.
            log.warning("coordinator failed", extra={"error": reply.message.message})
            return _unavailable(names, "the metadata store is unavailable")
        if not isinstance(reply.message, TopicResults):
            raise RpcError(f"unexpected reply from the coordinator: {reply.message!r}")
        await self.caught_up(reply.message.revision)
        return reply.message.results


def _unavailable(names: list[str | None], why: str) -> list[TopicResult]:
    return [
        TopicResult(name=name, error_code=int(ErrorCode.request_timed_out), error_message=why)
        for name in names
    ]
