"""``kafscale metadata backup`` and ``kafscale metadata restore``: `kafscale.metadata.backup` with
the broker's own settings (KAFSCALE_ETCD_*, KAFSCALE_S3_*, KAFSCALE_S3_NAMESPACE) and a bucket
for the backups (default the cluster's). The operator's snapshot CronJob runs ``backup``, the
brokers' restore init container ``restore``.

Backups are named ``{prefix}{namespace}-{UTC time to the millisecond}.json.gz``
(``...-20261128T100000.123Z.json.gz``: names sort by time); ``--keep N`` then deletes all but
the newest N of the namespace under the prefix -- only names of exactly that form, so another
cluster's backups under the same prefix are never touched, even when its namespace begins with
this one's (``prod`` and ``prod-eu``).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import re
import sys
import time
from collections.abc import Iterable

from kafscale import config as configuration

log = logging.getLogger("kafscale.metadata.backup")

# The time part of a backup's name (UTC, to the millisecond).
STAMP = re.compile(r"\d{8}T\d{6}\.\d{3}Z\.json\.gz")


def backup_key(prefix: str, namespace: str, taken_ms: int) -> str:
    """The object key of a backup of ``namespace`` taken at ``taken_ms``."""
    seconds = time.strftime("%Y%m%dT%H%M%S", time.gmtime(taken_ms / 1000))
    return f"{prefix}{namespace}-{seconds}.{taken_ms % 1000:03d}Z.json.gz"


def stale_backups(keys: Iterable[str], prefix: str, namespace: str, keep: int) -> list[str]:
    """The backups of ``namespace`` directly under ``prefix`` beyond the newest ``keep``."""
    own = sorted(
        key
        for key in keys
        if key.startswith(prefix + namespace + "-")
        and STAMP.fullmatch(key[len(prefix) + len(namespace) + 1 :])
    )
    return own[:-keep] if keep > 0 else []


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    metadata = commands.add_parser(
        "metadata",
        help="back up or restore the cluster's metadata (etcd) to or from S3",
        description="Logical backups of the cluster namespace's metadata, in S3. Settings as "
        "for kafscale serve (KAFSCALE_ETCD_ENDPOINTS, KAFSCALE_S3_*, KAFSCALE_S3_NAMESPACE).",
    )
    actions = metadata.add_subparsers(dest="metadata_command", required=True)
    save = actions.add_parser("backup", help="write a backup of the namespace's metadata")
    save.add_argument("--bucket", default="", help="bucket [default: KAFSCALE_S3_BUCKET]")
    save.add_argument("--prefix", default="metadata-backups/", help="key prefix [%(default)s]")
    save.add_argument(
        "--keep", type=int, default=0, help="keep only the newest N backups (0: all) [%(default)s]"
    )
    load = actions.add_parser(
        "restore",
        help="restore a backup into a namespace that has no metadata (once; safe to run on "
        "every broker at once)",
    )
    load.add_argument("--bucket", default="", help="bucket [default: KAFSCALE_S3_BUCKET]")
    load.add_argument("--key", required=True, help="the backup's object key")


def main(args: argparse.Namespace) -> int:
    # Imported here, not with the parser: every `kafscale` command builds the parser (the
    # preStop `kafscale drain` too), and these bring boto3 and grpc.
    from kafscale.metadata import MetadataStoreError, open_metadata_store
    from kafscale.metadata.backup import BackupError, backup, restore
    from kafscale.storage import open_object_store
    from kafscale.storage.objects import ObjectStoreError

    try:
        config = configuration.load(os.environ)
    except configuration.ConfigError as exc:
        print(f"kafscale metadata: {exc}", file=sys.stderr)
        return 2
    if not config.etcd_endpoints:
        print("kafscale metadata: KAFSCALE_ETCD_ENDPOINTS is not set", file=sys.stderr)
        return 2
    # The broker's own object store, in the backups' bucket when it is another.
    objects = open_object_store(
        dataclasses.replace(config, s3_bucket=args.bucket or config.s3_bucket)
    )
    store = open_metadata_store(config)
    try:
        if args.metadata_command == "backup":
            data, header = backup(store, config.s3_namespace)
            key = backup_key(args.prefix, config.s3_namespace, header.taken_ms)
            if not objects.put_if_absent(key, data):
                print(f"kafscale metadata backup: {key} exists already", file=sys.stderr)
                return 1
            print(f"backed up {header.keys} keys of {config.s3_namespace} to {key}")
            if args.keep > 0:
                listed = (info.key for info in objects.list(args.prefix))
                stale = stale_backups(listed, args.prefix, config.s3_namespace, args.keep)
                if stale:
                    objects.delete_many(stale)
                    print(f"deleted {len(stale)} older backups")
            return 0
        outcome = restore(
            store,
            objects.get(args.key),
            config.s3_namespace,
            config.metadata_max_txn_ops,
            max_txn_bytes=config.metadata_max_txn_bytes,
        )
        print(f"{args.key}: {outcome}")
        return 0
    except (BackupError, MetadataStoreError, ObjectStoreError) as exc:
        print(f"kafscale metadata {args.metadata_command}: {exc}", file=sys.stderr)
        return 1
    finally:
        store.close()
        objects.close()
