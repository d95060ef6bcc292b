"""A read-only, watched, in-memory view of the cluster's metadata for any process.

Only the coordinator writes metadata; every other process answers from this view, which loads the
namespace once and then follows the store's watch. Snapshots are immutable and replaced whole, so
readers on any thread see a consistent state without locks. Records that do not decode are logged
and skipped rather than taking the view down.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import msgspec

from kafscale.metadata import group_configs, records
from kafscale.metadata.records import (
    AclRecord,
    BrokerRecord,
    Keys,
    LeaderRecord,
    ScramRecord,
    TopicRecord,
)
from kafscale.metadata.store import (
    EventType,
    MetadataStore,
    MetadataStoreError,
    Watch,
    WatchEvent,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Snapshot:
    revision: int = 0
    cluster_id: str | None = None
    brokers: dict[int, BrokerRecord] = field(default_factory=dict)
    topics: dict[str, TopicRecord] = field(default_factory=dict)
    # Each owned partition's owner and leader epoch (``leaders/``; absent: offline).
    leaders: dict[tuple[str, int], LeaderRecord] = field(default_factory=dict)
    # SCRAM credentials by (user, mechanism) (``users/``).
    credentials: dict[tuple[str, str], ScramRecord] = field(default_factory=dict)
    # ACL bindings by key digest (``acls/``).
    acls: dict[str, AclRecord] = field(default_factory=dict)
    # Configs set on groups, by group id (``group_configs/``).
    group_configs: dict[str, dict[str, str]] = field(default_factory=dict)

    @functools.cached_property
    def topics_by_id(self) -> dict[str, TopicRecord]:
        """Topics by id (canonical UUID text), built on first use per snapshot."""
        return {record.topic_id: record for record in self.topics.values()}


class MetadataView:
    def __init__(self, store: MetadataStore, namespace: str, prefix: str | None = None) -> None:
        """``prefix``: follow only the keys under it (say ``Keys.leaders``: a shard needs no
        more), not the whole namespace."""
        self._store = store
        self._keys = Keys(namespace)
        self._group_config_keys = group_configs.GroupConfigKeys(self._keys.root)
        self._prefix = prefix if prefix is not None else self._keys.root
        if not self._prefix.startswith(self._keys.root):
            raise ValueError(f"{self._prefix!r} is not in the namespace {self._keys.root!r}")
        self._lock = threading.Lock()  # serialises watch callbacks; readers never take it
        self._advanced = threading.Condition(self._lock)
        self.snapshot = Snapshot()
        self._listeners: list[Callable[[Snapshot], None]] = []
        self._watch: Watch | None = None
        self._stopped = threading.Event()

    def start(self) -> None:
        """Load the namespace and follow changes from the revision loaded."""
        revision = self._store.revision()
        snapshot = Snapshot(revision=revision)
        for kv in self._store.get_prefix(self._prefix):
            snapshot = self._apply(snapshot, EventType.PUT, kv.key, kv.value, kv.mod_revision)
        with self._lock:
            self.snapshot = snapshot
            self._advanced.notify_all()
        self._watch = self._store.watch_prefix(
            self._prefix, self._on_event, start_revision=revision, on_error=self._on_watch_error
        )
        for listener in self._listeners:
            listener(snapshot)

    def _on_watch_error(self, error: MetadataStoreError) -> None:
        """The watch ended (history compacted while it lagged): load afresh and watch again."""
        log.warning("metadata watch ended; reloading", extra={"error": str(error)})
        threading.Thread(target=self._reload, name="metadata-view-reload", daemon=True).start()

    def _reload(self) -> None:
        delay = 0.1
        while not self._stopped.is_set():
            try:
                self.start()
                return
            except MetadataStoreError as exc:
                log.error("cannot reload metadata; retrying", extra={"error": str(exc)})
                self._stopped.wait(delay)
                delay = min(delay * 2, 5.0)

    def wait_for_revision(self, revision: int, timeout: float) -> bool:
        """Block until the view includes ``revision`` (a write we asked for); False on timeout."""
        with self._advanced:
            return self._advanced.wait_for(lambda: self.snapshot.revision >= revision, timeout)

    def wait_until(self, holds: Callable[[Snapshot], bool], timeout: float) -> bool:
        """Block until ``holds`` is true of the view; False on timeout."""
        with self._advanced:
            return self._advanced.wait_for(lambda: holds(self.snapshot), timeout)

    def on_change(self, listener: Callable[[Snapshot], None]) -> None:
        """Call ``listener`` (on the watch thread) with every new snapshot."""
        self._listeners.append(listener)

    def stop(self) -> None:
        self._stopped.set()
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None

    def _on_event(self, event: WatchEvent) -> None:
        with self._lock:
            # Older than the loaded state: already in it. Not at the same revision: the keys
            # one transaction changes all carry its revision.
            if event.mod_revision < self.snapshot.revision:
                return
            self.snapshot = self._apply(
                self.snapshot, event.type, event.key, event.value, event.mod_revision
            )
            snapshot = self.snapshot
            self._advanced.notify_all()
        for listener in self._listeners:
            listener(snapshot)

    def _apply(
        self, snapshot: Snapshot, kind: EventType, key: str, value: bytes, revision: int
    ) -> Snapshot:
        revision = max(revision, snapshot.revision)
        keys = self._keys
        try:
            if key == keys.cluster_id:
                cluster_id = value.decode() if kind is EventType.PUT else None
                return replace(snapshot, revision=revision, cluster_id=cluster_id)
            if key.startswith(keys.brokers):
                brokers = dict(snapshot.brokers)
                node_id = int(key[len(keys.brokers) :])
                if kind is EventType.PUT:
                    brokers[node_id] = records.decode_broker(value)
                else:
                    brokers.pop(node_id, None)
                return replace(snapshot, revision=revision, brokers=brokers)
            if key.startswith(keys.leaders):
                partition = keys.parse_leader(key)
                if partition is None:
                    raise ValueError("not a leader key")
                leaders = dict(snapshot.leaders)
                if kind is EventType.PUT:
                    leaders[partition] = records.decode_leader(value)
                else:
                    leaders.pop(partition, None)
                return replace(snapshot, revision=revision, leaders=leaders)
            if key.startswith(keys.topics):
                topics = dict(snapshot.topics)
                name = key[len(keys.topics) :]
                if kind is EventType.PUT:
                    topics[name] = records.decode_topic(value)
                else:
                    topics.pop(name, None)
                return replace(snapshot, revision=revision, topics=topics)
            if key.startswith(keys.users):
                user = keys.parse_user(key)
                if user is None:
                    raise ValueError("not a credential key")
                credentials = dict(snapshot.credentials)
                if kind is EventType.PUT:
                    credentials[user] = records.decode_scram(value)
                else:
                    credentials.pop(user, None)
                return replace(snapshot, revision=revision, credentials=credentials)
            if key.startswith(keys.acls):
                acls = dict(snapshot.acls)
                digest = key[len(keys.acls) :]
                if kind is EventType.PUT:
                    acls[digest] = records.decode_acl(value)
                else:
                    acls.pop(digest, None)
                return replace(snapshot, revision=revision, acls=acls)
            if key.startswith(self._group_config_keys.prefix):
                group_id = self._group_config_keys.parse(key)
                if group_id is None:
                    raise ValueError("not a group config key")
                configs = dict(snapshot.group_configs)
                if kind is EventType.PUT:
                    configs[group_id] = group_configs.decode(value).configs
                else:
                    configs.pop(group_id, None)
                return replace(snapshot, revision=revision, group_configs=configs)
        except (ValueError, msgspec.DecodeError) as exc:
            log.error("skipping undecodable metadata record", extra={"key": key, "error": str(exc)})
        return replace(snapshot, revision=revision)
