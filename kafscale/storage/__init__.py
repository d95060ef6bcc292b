"""Object storage: the interface (``objects``) and its two backends, chosen by configuration.

``open_object_store`` returns S3 when ``KAFSCALE_S3_BUCKET`` is set, else the embedded directory
``{KAFSCALE_DATA_DIR}/segments``. It never falls back from one to the other. The namespace prefix
(``KAFSCALE_S3_NAMESPACE``) is not applied here: callers build full keys.

The S3 backend (boto3, a quarter of a second to import) is imported when first used: every
process of a broker imports this package, and on the embedded backend none of them needs it.
"""

from __future__ import annotations

import os

from kafscale.config import Config
from kafscale.storage.local import LocalObjectStore
from kafscale.storage.objects import (
    ObjectInfo,
    ObjectNotFound,
    ObjectStore,
    ObjectStoreError,
    ObjectStoreUnavailable,
)

__all__ = [
    "LocalObjectStore",
    "ObjectInfo",
    "ObjectNotFound",
    "ObjectStore",
    "ObjectStoreError",
    "ObjectStoreUnavailable",
    "open_object_store",
]


def open_object_store(config: Config) -> ObjectStore:
    """The configured object store (not yet checked: call ``check()`` to verify it answers)."""
    if config.uses_s3:
        from kafscale.storage.s3 import S3ObjectStore

        return S3ObjectStore(
            bucket=config.s3_bucket,
            region=config.s3_region,
            endpoint_url=config.s3_endpoint or None,
            path_style=config.s3_path_style,
            access_key=config.s3_access_key or None,
            secret_key=config.s3_secret_key or None,
            timeout=config.s3_timeout_ms / 1000,
            ca_file=config.s3_ca_file or None,
        )
    return LocalObjectStore(os.path.join(config.data_dir, "segments"))
