"""The coordinator process: this broker's one writer of metadata.

It owns the cluster id, this broker's partitions (``owners``: claims, hand-overs, the fence of
every commit), the topics (creation, deletion and the removal of a deleted topic's objects),
partition commits (also the log cleaner's), producer ids, and the consumer groups with their
committed offsets; and, on the broker elected for them (``chores``), retention, the garbage
collection of write-ahead objects and of cleaned segments' predecessors, and etcd's history
compaction. Other processes of the broker never write metadata: they
read a watched view (``kafscale.metadata.view``) or ask the coordinator.

A request whose handler fails -- the metadata store or S3 unreachable, or a bug one request
triggers -- is answered with ``ErrorReply`` (``contained``); the coordinator never exits for it.
"""

from __future__ import annotations

import logging
import time

from kafscale.ipc import cleaning, log_admin, messages, write_path
from kafscale.ipc.rpc import Handler, Incoming, RpcServer, serve_until
from kafscale.metadata import open_metadata_store, topic_configs
from kafscale.metadata.records import Keys
from kafscale.metadata.store import MetadataStoreUnavailable
from kafscale.storage import open_object_store
from kafscale.storage.metered import MeteredObjectStore
from kafscale.storage.objects import ObjectStoreUnavailable
from kafscale.supervisor.child import ChildContext

from .acls import AclAdmin
from .admin import TopicAdmin
from .chores import Chores
from .cleanings import CleaningCommitter
from .commit_plan import Limits
from .compactions import CompactionCommitter
from .configs import ConfigAdmin
from .consumer_groups.model import ConsumerSettings
from .credentials import CredentialAdmin
from .garbage import GarbageCollector
from .group_model import GroupSettings
from .group_service import TICK_MS, GroupService
from .history import HistoryCompactor
from .log_start import LogStarts, ShardNotices
from .owner_state import OwnerState
from .owners import Owners
from .partitions import PartitionCommitter
from .producer_ids import ProducerIdAllocator
from .registry import ensure_cluster_id
from .retention import RetentionCleaner
from .wal_gc import WalReferences

log = logging.getLogger(__name__)

HANDOVER_TIMEOUT_MS = 30_000  # longest graceful hand-over of one partition (S3 slow or down)


def run(ctx: ChildContext) -> None:
    config = ctx.config
    store = open_metadata_store(config)
    objects = MeteredObjectStore(open_object_store(config))
    try:
        store.check()
        keys = Keys(config.s3_namespace)
        cluster_id = ensure_cluster_id(store, keys)
        # Counted on the chores broker only, from when it takes them (wal_gc: loaded on a
        # thread, then followed by a watch: other brokers commit and compact too).
        refs = WalReferences(store, objects, keys)
        admin = TopicAdmin(
            store,
            objects,
            config.s3_namespace,
            config.auto_create_partitions,
            offsets_partitions=config.offsets_topic_partitions,
        )
        admin.resume_deletions()
        admin.grow_offsets_topic()  # before the first claims, which then include its partitions
        credentials = CredentialAdmin(store, config.s3_namespace)
        if config.sasl_admin_user:
            credentials.ensure_user(config.sasl_admin_user, config.sasl_admin_password)
        limits = Limits(config.metadata_max_txn_ops, config.metadata_max_txn_bytes)
        owners = Owners(
            store,
            config.s3_namespace,
            OwnerState(
                me=config.broker_id,
                lease=ctx.lease_id,
                run_id=ctx.run_id,
                handover_timeout_ms=HANDOVER_TIMEOUT_MS,
            ),
            ctx.zmq_context,
            ctx.runtime_dir,
            config.shards,
        )
        committer = PartitionCommitter(store, config.s3_namespace, owners, limits)
        compactions = CompactionCommitter(
            store, config.s3_namespace, committer.high_watermark, owners, limits=limits
        )
        cleanings = CleaningCommitter(store, config.s3_namespace, committer.high_watermark, owners)
        producer_ids = ProducerIdAllocator(store, config.s3_namespace)
        server = RpcServer(ctx.zmq_context, ctx.address())
        notices = ShardNotices(ctx.zmq_context, ctx.runtime_dir, config.shards)
        log_starts = LogStarts(
            store, config.s3_namespace, owners, topic_configs.defaults(config), notices
        )
        groups = GroupService(
            store,
            config.s3_namespace,
            server,
            GroupSettings(
                min_session_timeout_ms=config.group_min_session_timeout_ms,
                max_session_timeout_ms=config.group_max_session_timeout_ms,
                initial_rebalance_delay_ms=config.group_initial_rebalance_delay_ms,
            ),
            committer.high_watermarks,
            owners,  # the groups of the __consumer_offsets partitions it opens
            ConsumerSettings(
                session_timeout_ms=config.group_consumer_session_timeout_ms,
                heartbeat_interval_ms=config.group_consumer_heartbeat_interval_ms,
                max_size=config.group_consumer_max_size,
                migration_policy=config.group_consumer_migration_policy,
            ),
            topics=lambda: owners.view.snapshot.topics,
            group_configs=lambda: owners.view.snapshot.group_configs,
        )
        owners.start(_now_ms())  # the first claims, before the shards and the flusher boot
        log.info("coordinating", extra={"cluster_id": cluster_id, "metadata": store.description})
        ctx.ready()

        retention = RetentionCleaner(config, store, objects, ctx.zmq_context, ctx.runtime_dir)
        history = HistoryCompactor(store, config.metadata_compaction_interval_ms)
        chores = Chores(store, keys, config.broker_id, ctx.lease_id, ctx.run_id)
        garbage = GarbageCollector(store, objects, keys)

        def on_idle() -> None:
            groups.tick()
            owners.tick(_now_ms())
            now_ms = time.monotonic_ns() // 1_000_000
            if chores.held(now_ms):
                if not refs.running:
                    refs.start()
                retention.maybe_run()
                garbage.maybe_sweep()
                refs.sweep(now_ms)
                if refs.ready:  # never compact the history the references' watch starts in
                    history.maybe_run(now_ms)
            elif refs.running:
                refs.stop()

        try:
            serve_until(
                ctx.stopping,
                server,
                contained(
                    {
                        messages.Ping: lambda _: ctx.pong(),
                        messages.CreateTopics: admin.handle_create,
                        messages.DeleteTopics: admin.handle_delete,
                        write_path.CommitSegment: committer.handle,
                        write_path.CommitObject: committer.handle_object,
                        write_path.CommitCompaction: compactions.handle,
                        write_path.CommitMerge: compactions.handle_merge,
                        cleaning.CommitCleaning: cleanings.handle,
                        write_path.PartitionSealed: owners.handle_sealed,
                        messages.Drain: owners.handle_drain,
                        messages.AllocateProducerId: producer_ids.handle,
                        log_admin.MoveLogStart: log_starts.handle,
                        **groups.handlers(),
                        **ConfigAdmin(store, config.s3_namespace, config.broker_id).handlers(),
                        **credentials.handlers(),
                        **AclAdmin(store, config.s3_namespace).handlers(),
                    }
                ),
                on_idle=on_idle,
                idle_ms=TICK_MS,
            )
        finally:
            refs.stop()
            owners.close()
            retention.close()
            notices.close()
            server.close()
    finally:
        store.close()
        objects.close()


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def contained(handlers: dict[type, Handler]) -> dict[type, Handler]:
    """The handlers, each answering ``ErrorReply`` instead of ending the coordinator when it
    raises: the callers (flusher, frontend, shards) take that as a retriable failure."""
    return {kind: _contain(handler) for kind, handler in handlers.items()}


def _contain(handler: Handler) -> Handler:
    def handle(incoming: Incoming) -> messages.Message | None:
        try:
            return handler(incoming)
        except (MetadataStoreUnavailable, ObjectStoreUnavailable) as exc:
            # An outage: the store's outage gate logged it once; every request meanwhile is
            # refused at once, and the coordinator keeps serving what needs no backend.
            return messages.ErrorReply(message=f"a backend is unavailable: {exc}")
        except Exception as exc:
            # One request must not take down the coordinator (and every group with it).
            log.exception("request failed", extra={"request": type(incoming.message).__name__})
            return messages.ErrorReply(message=f"{type(exc).__name__}: {exc}")

    return handle
