"""The supervisor process of one broker: preflight, the store lock, the broker's membership (lease
and registration), health endpoints, the arbiter.

A configured backend that cannot be reached stops start-up with a message naming its endpoint,
within ``KAFSCALE_BOOT_TIMEOUT_MS`` -- never a silent fallback to the embedded backends.

The store lock (``kafscale.supervisor.ownership``) is taken after the preflight and before any
child boots, held for the broker's life, and released only after every child has stopped. A
broker that loses it to another broker stops at once: its children are SIGKILLed, not drained,
since a drain would write to a store that is no longer this broker's.

A broker whose lease (``kafscale.supervisor.membership``) is found expired -- it was paused, or
cut off from etcd, past the TTL -- kills its children the same way (its partitions may be other
brokers' at higher epochs by now; what they held is dropped, as a Kafka leader that lost its
leadership truncates) and then **rejoins in place**: a new lease, a new registration under the
same node id, a new set of children, which claim partitions like any broker that joins. Only
the supervisor and its store lock outlive the lease.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import logging
import os
import signal
import time
from collections.abc import Callable, Iterator
from typing import NoReturn

import zmq

from kafscale.config import Config
from kafscale.ipc import endpoints
from kafscale.ipc.rpc import RpcClient
from kafscale.metadata import open_metadata_store
from kafscale.metadata.records import BrokerRecord
from kafscale.metadata.store import MetadataStore, MetadataStoreError
from kafscale.security.tls import TlsFiles
from kafscale.storage import ObjectStore, open_object_store
from kafscale.supervisor import admin, ownership
from kafscale.supervisor.arbiter import Arbiter, StartupError
from kafscale.supervisor.health import Access, HealthChecker, HealthServer
from kafscale.supervisor.membership import BrokerIdTaken, Membership

log = logging.getLogger("kafscale.supervisor")

# The coordinator gives up a partition's seal after 30 s (S3 down) and releases it anyway.
HANDOVER_WAIT_S = 40.0
# Between tries to join again after the lease was lost, while the store does not answer.
REJOIN_RETRY_S = 1.0
REJOIN_RETRY_MAX_S = 10.0


def run_broker(config: Config, run_id: str, runtime_dir: str) -> int:
    # Until the arbiter installs its handlers, SIGTERM interrupts start-up as Ctrl-C does: the
    # backend checks and the wait for the store lock may take a while.
    signal.signal(signal.SIGTERM, _interrupt)
    failure: str | None = None
    current = _Current()
    try:
        with _backends(config) as (objects, store), _store_lock(config, store, run_id) as owned:
            owned.keep(lambda reason: current.stop(f"the store lock was lost: {reason}"))
            member: Membership | None = _join(config, store, run_id)
            while member is not None:
                failure, stop_requested = _serve(
                    config, run_id, runtime_dir, objects, store, owned, member, current
                )
                if member.lost is None or owned.lost is not None or stop_requested:
                    break
                # The lease ended under us (paused, or cut off from etcd past its TTL): every
                # child was stopped with what it held. Join again, as a restarted broker would.
                signal.signal(signal.SIGTERM, _interrupt)
                signal.signal(signal.SIGINT, signal.default_int_handler)
                log.warning("rejoining the cluster with a new broker lease", extra={"why": failure})
                current.rejoining = True
                member = _rejoin(config, store, run_id, owned)
                failure = None if member is not None else f"the store lock was lost: {owned.lost}"
    except KeyboardInterrupt:  # SIGTERM or SIGINT while no arbiter handles them
        if current.rejoining:  # it held nothing any more: a stop like any other
            log.info("stopped while rejoining the cluster")
            return 0
        log.critical("cannot start: interrupted during start-up")
        return 1
    except StartupError as exc:
        if current.rejoining and current.arbiter is not None and current.arbiter.stop_requested:
            log.info("stopped while rejoining the cluster")
            return 0
        log.critical("cannot start: %s", exc)
        return 1
    if failure:
        log.critical("stopped: %s", failure)
        return 1
    log.info("stopped")
    return 0


def _serve(
    config: Config,
    run_id: str,
    runtime_dir: str,
    objects: ObjectStore,
    store: MetadataStore,
    owned: ownership.Ownership,
    member: Membership,
    current: _Current,
) -> tuple[str | None, bool]:
    """Run the children on ``member``'s lease until a stop: why the broker stopped itself, if it
    did (the lock or the lease lost, a child that cannot boot), and whether a SIGTERM/SIGINT
    asked it to. Raises StartupError."""
    if member.node_id != config.broker_id:  # KAFSCALE_BROKER_ID=auto
        config = dataclasses.replace(config, broker_id=member.node_id)
    arbiter = Arbiter(config, run_id, runtime_dir, member.lease_id)
    current.arbiter = arbiter
    try:
        try:
            arbiter.prepare()
            if owned.lost is not None:  # lost between two sets of children
                _stop_at_once(arbiter, f"the store lock was lost: {owned.lost}")
            member.keep(lambda reason: _stop_at_once(arbiter, reason))
            _supervise(config, arbiter, objects, store, member)
        finally:
            if owned.lost is not None or member.lost is not None:
                # No drain: what the children hold can no longer be committed.
                _kill_children(arbiter)
            arbiter.shutdown()  # every child stops while the store is still ours
            member.leave()
    except StartupError:
        if member.lost is None and owned.lost is None:
            raise
        # The lock or the lease was lost while the children booted: handled as below.
    if owned.lost is not None:
        return f"the store lock was lost: {owned.lost}", arbiter.stop_requested
    return member.lost or arbiter.failure, arbiter.stop_requested


def _join(config: Config, store: MetadataStore, run_id: str) -> Membership:
    """Join the cluster (grant the broker lease, register on it). Raises StartupError."""
    primary = config.primary_listener
    broker = BrokerRecord(
        node_id=max(config.broker_id, 0),
        host=primary.advertised_host,
        port=primary.advertised_port,
        listeners={x.name: (x.advertised_host, x.advertised_port) for x in config.kafka_listeners},
        run_id=run_id,
        ready=False,  # until every child serves (set_ready)
    )
    member = Membership(
        store, config.s3_namespace, broker, config.store_lock_ttl_s, auto_id=config.broker_id < 0
    )
    try:
        member.join()
    except (BrokerIdTaken, MetadataStoreError) as exc:
        raise StartupError(str(exc)) from None
    return member


def _rejoin(
    config: Config, store: MetadataStore, run_id: str, owned: ownership.Ownership
) -> Membership | None:
    """Join again after the lease was lost, retrying while the store cannot be reached (it was
    reachable a moment ago: it said the lease is gone). None if the store lock was lost
    meanwhile. A SIGTERM during the wait stops the broker (KeyboardInterrupt)."""
    delay = REJOIN_RETRY_S
    while owned.lost is None:
        try:
            return _join(config, store, run_id)
        except StartupError as exc:
            log.warning("cannot rejoin the cluster yet; retrying", extra={"error": str(exc)})
        time.sleep(delay)
        delay = min(delay * 2, REJOIN_RETRY_MAX_S)
    return None


@contextlib.contextmanager
def _backends(config: Config) -> Iterator[tuple[ObjectStore, MetadataStore]]:
    """The configured backends, checked to answer within the boot timeout."""
    try:
        objects = open_object_store(config)
    except Exception as exc:
        raise StartupError(str(exc)) from None
    try:
        try:
            store = open_metadata_store(config)
        except Exception as exc:
            raise StartupError(str(exc)) from None
        try:
            preflight(
                {"objects": objects.check, "metadata": store.check}, config.boot_timeout_ms / 1000
            )
            yield objects, store
        finally:
            store.close()
    finally:
        objects.close()


@contextlib.contextmanager
def _store_lock(config: Config, store: MetadataStore, run_id: str) -> Iterator[ownership.Ownership]:
    """Hold the store lock for the body; StartupError, naming the holder, if another has it."""
    try:
        owned = ownership.acquire(config, store, run_id)
    except (ownership.StoreLocked, MetadataStoreError, OSError) as exc:
        raise StartupError(str(exc)) from None
    try:
        yield owned
    finally:
        owned.release()


class _Current:
    """The arbiter of the children running now, for the store lock's keeper (started once, it
    outlives a rejoin's new set of children), and whether the broker has rejoined (a SIGTERM
    then, before the new children serve, is a stop, not a failed start)."""

    def __init__(self) -> None:
        self.arbiter: Arbiter | None = None
        self.rejoining = False  # the lease was lost once: a stop now is not a failed start

    def stop(self, reason: str) -> None:
        if self.arbiter is not None:
            _stop_at_once(self.arbiter, reason)


def _interrupt(signum: int, _frame: object) -> NoReturn:
    raise KeyboardInterrupt


def _stop_at_once(arbiter: Arbiter, reason: str) -> None:
    """On a keeper's thread: make the arbiter's loop end (it checks within 500 ms)."""
    arbiter.failure = reason
    arbiter.stopping = True


def _kill_children(arbiter: Arbiter) -> None:
    for child in arbiter.children:
        if child.alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, signal.SIGKILL)


def _supervise(
    config: Config,
    arbiter: Arbiter,
    objects: ObjectStore,
    store: MetadataStore,
    member: Membership,
) -> None:
    checks: dict[str, Callable[[], None]] = {"objects": objects.check, "metadata": store.check}
    checker = HealthChecker(arbiter.runtime_dir, arbiter.children, checks)
    try:
        http = HealthServer(
            config.broker_host,
            config.metrics_port,
            checker,
            config.admin_token,
            drain=lambda: admin.drain(arbiter.runtime_dir, member.set_draining, HANDOVER_WAIT_S),
            access=Access(
                config.metrics_username, config.metrics_password, config.metrics_auth_health
            ),
            tls_files=(
                TlsFiles(config.metrics_tls_cert_file, config.metrics_tls_key_file)
                if config.metrics_tls_cert_file
                else None
            ),
        )
    except OSError as exc:
        raise StartupError(
            f"cannot listen on {config.broker_host}:{config.metrics_port} "
            f"(KAFSCALE_METRICS_PORT): {exc}"
        ) from None
    http.start()
    try:
        arbiter.boot()
        member.set_ready()
        checker.start()
        log.info(
            "broker running",
            extra={
                "listeners": ",".join(
                    f"{x.name}://{x.advertised_host}:{x.advertised_port}"
                    for x in config.kafka_listeners
                ),
                "run_id": arbiter.run_id,
                "objects": objects.description,
                "metadata": store.description,
            },
        )
        arbiter.run()
        if arbiter.failure is None:  # a requested stop (SIGTERM): hand the partitions over
            _hand_over(arbiter, member)
    finally:
        checker.stop()
        http.stop()


def _hand_over(arbiter: Arbiter, member: Membership) -> None:
    """Tell the cluster we are leaving (no partition is assigned to us any more) and have the
    coordinator hand every partition over -- each sealed, committed and released, for the
    brokers that stay to claim -- while the children keep running. Bounded by
    ``HANDOVER_WAIT_S``; a second SIGTERM cuts it short. Either way the stop goes on."""
    member.set_draining()
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    coordinator = RpcClient(context, endpoints.address(arbiter.runtime_dir, "coordinator"))
    try:
        if arbiter.supervise_while(lambda: admin.handed_over(coordinator) == 0, HANDOVER_WAIT_S):
            log.info("every partition handed over")
        else:
            log.warning("stopping before every partition was handed over")
    finally:
        coordinator.close()
        context.term()


def preflight(checks: dict[str, Callable[[], None]], timeout_s: float) -> None:
    """Run the backend checks in parallel; raise StartupError for the first that fails."""
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=len(checks))
    futures = {name: pool.submit(check) for name, check in checks.items()}
    try:
        _, pending = concurrent.futures.wait(futures.values(), timeout=timeout_s)
        for name, future in futures.items():
            if future in pending:
                raise StartupError(f"the {name} backend did not answer within {timeout_s:g} s")
            error = future.exception()
            if error is not None:
                raise StartupError(str(error))
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
