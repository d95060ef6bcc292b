"""What a request handler may use: the broker's identity, the metadata view, the API table.

Handlers never touch sockets; they get a ``RequestContext`` and a decoded request and return a
response (or None when the protocol sends none).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from kafscale.config import Config
from kafscale.frontend.log_dirs import LogDir
from kafscale.ipc import messages
from kafscale.ipc.messages import TopicResult, TopicSpec
from kafscale.ipc.rpc import Reply
from kafscale.metadata.view import Snapshot
from kafscale.protocol.codec import RequestHeader
from kafscale.protocol.sasl import Authentication

ANONYMOUS = "User:ANONYMOUS"

Handle = Callable[["RequestContext", Any], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class Encoded:
    """A response a handler encoded itself, as the whole frame in pieces (size prefix, header,
    body), so record bytes reach the socket without being copied (Fetch)."""

    chunks: list[bytes | memoryview]


@dataclass(frozen=True)
class Api:
    """One entry of the dispatch table: an implemented API and the versions we serve."""

    key: int
    name: str
    min_version: int
    max_version: int
    handle: Handle

    def supports(self, version: int) -> bool:
        return self.min_version <= version <= self.max_version


class Coordinator(Protocol):
    """Topic administration through the coordinator (``kafscale.frontend.coordinator``)."""

    async def create_topics(
        self, specs: Sequence[TopicSpec], validate_only: bool = False
    ) -> list[TopicResult]: ...

    async def delete_topics(
        self, names: Sequence[str], topic_ids: Sequence[str]
    ) -> list[TopicResult]: ...

    async def allocate_producer_id(self) -> int: ...

    async def call(self, request: messages.Message, timeout: float = ...) -> messages.Message:
        """Any request the coordinator serves; raises RpcError when it cannot be reached."""
        ...

    async def caught_up(self, revision: int) -> None:
        """Wait until the view holds ``revision``."""
        ...


class Shards(Protocol):
    """The write path to the shard processes (``kafscale.frontend.shards``)."""

    def owner(self, topic_id: str, partition: int) -> int: ...

    async def append(
        self,
        shard: int,
        request: messages.Append,
        records: Sequence[bytes | memoryview],
        timeout: float,
    ) -> messages.Appended: ...

    async def fetch(self, shard: int, request: messages.Fetch, timeout: float) -> Reply: ...

    async def release(self, shard: int, fetch_id: int) -> None: ...

    async def list_offsets(
        self, shard: int, request: messages.ListOffsets, timeout: float
    ) -> messages.OffsetsListed: ...


class LogDirs(Protocol):
    """What DescribeLogDirs reports (``kafscale.frontend.log_dirs.StoredLogDirs``); blocking."""

    def log_dir(self) -> LogDir: ...

    def sizes(self, topics: Iterable[str] | None) -> dict[tuple[str, int], int]: ...


class View(Protocol):
    """The metadata a handler reads: ``kafscale.metadata.view.MetadataView`` in the broker."""

    @property
    def snapshot(self) -> Snapshot: ...


@dataclass(frozen=True)
class Broker:
    config: Config
    view: View
    apis: dict[int, Api]
    coordinator: Coordinator
    shards: Shards
    log_dirs: LogDirs | None = None  # None (unit tests): DescribeLogDirs lists no dirs

    @property
    def node_id(self) -> int:
        return self.config.broker_id


@dataclass(slots=True)
class Session:
    """What a connection knows of its client: the listener it came in on and its
    authentication (a state machine the connection and the SASL handlers feed)."""

    listener: str = "PLAINTEXT"
    auth: Authentication = field(default_factory=lambda: Authentication(False, {}))

    @property
    def principal(self) -> str:
        """Who the client is: its SASL user, its TLS certificate's subject, or anonymous."""
        return self.auth.principal or ANONYMOUS


@dataclass(frozen=True)
class RequestContext:
    broker: Broker
    header: RequestHeader
    peer: str
    session: Session = field(default_factory=Session)

    @property
    def version(self) -> int:
        return self.header.api_version
