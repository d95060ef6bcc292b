"""What the console shows, as the Kafka protocol describes it: plain frozen dataclasses that
`console.kafka` fills and the pages render (no I/O here)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Broker:
    node_id: int
    host: str
    port: int


@dataclass(frozen=True)
class TopicPartitions:
    name: str
    partitions: tuple[tuple[int, int], ...]  # (partition, leader id; -1: none)
    internal: bool = False


@dataclass(frozen=True)
class Cluster:
    cluster_id: str
    controller: int
    brokers: tuple[Broker, ...]
    topics: dict[str, TopicPartitions]


@dataclass(frozen=True)
class Config:
    name: str
    value: str | None
    source: str  # DYNAMIC_TOPIC_CONFIG, DEFAULT_CONFIG, ...
    default: bool
    read_only: bool
    sensitive: bool


@dataclass(frozen=True)
class Member:
    member_id: str
    client_id: str
    host: str
    instance_id: str | None
    assignment: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class GroupListing:
    group_id: str
    state: str
    simple: bool


@dataclass(frozen=True)
class GroupOffset:
    topic: str
    partition: int
    committed: int  # -1: none
    end: int  # the high watermark; -1: not known
    start: int  # the log start offset; -1: not known

    @property
    def lag(self) -> int | None:
        if self.committed < 0 or self.end < 0:
            return None
        return max(0, self.end - self.committed)


@dataclass(frozen=True)
class Group:
    group_id: str
    state: str
    protocol: str
    simple: bool
    coordinator: int
    members: tuple[Member, ...]
    offsets: tuple[GroupOffset, ...]

    @property
    def total_lag(self) -> int:
        return sum(o.lag or 0 for o in self.offsets)


@dataclass(frozen=True)
class Message:
    partition: int
    offset: int
    timestamp: int  # ms; -1: none
    timestamp_type: str
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


@dataclass(frozen=True)
class Browse:
    messages: tuple[Message, ...]
    scanned: int
    ranges: dict[int, tuple[int, int]] = field(default_factory=dict)  # partition -> [from, to)
    truncated: bool = False  # stopped at the time limit before every range was read
