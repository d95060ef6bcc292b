"""A real S3-compatible server: MinIO built by scripts/install-deps.sh into .tools/bin/minio.

MinIO (not moto) because objects must outlive a server restart: it stores them in its data
directory, which `stop()`/`start()` keep. Healthy means GET /minio/health/live answers 200 and a
real S3 call (ListBuckets) succeeds, so the object layer is up, not only the HTTP listener.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from tests.harness.paths import TOOLS_BIN
from tests.harness.procs import LOOPBACK, HarnessError, free_port
from tests.harness.servers import ManagedServer, http_status

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

MINIO_BINARY = TOOLS_BIN / "minio"


def find_minio() -> Path:
    if not os.access(MINIO_BINARY, os.X_OK):
        raise HarnessError(f"MinIO is not installed at {MINIO_BINARY}: run scripts/install-deps.sh")
    return MINIO_BINARY


class MinioServer(ManagedServer):
    name = "minio"
    # Unlike any bucket name or path: the broker masks its credentials wherever they appear.
    access_key = "minio-access-7c1d"
    secret_key = "kafscale-test-secret"
    region = "us-east-1"

    def __init__(self, base_dir: Path) -> None:
        self.binary = find_minio()
        self.port = 0
        super().__init__(base_dir)

    def pick_ports(self) -> None:
        self.port = free_port()

    @property
    def endpoint_url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def argv(self) -> list[str]:
        return [
            str(self.binary),
            "server",
            f"--address={LOOPBACK}:{self.port}",
            f"--certs-dir={self.base_dir / 'certs'}",
            str(self.data_dir),
        ]

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MINIO_")}
        env.update(
            MINIO_ROOT_USER=self.access_key,
            MINIO_ROOT_PASSWORD=self.secret_key,
            MINIO_REGION=self.region,
            MINIO_BROWSER="off",  # no console: one port, nothing to collide
            MINIO_UPDATE="off",
            HOME=str(self.base_dir),  # keeps ~/.minio out of the real home
        )
        return env

    def probe(self) -> bool:
        if http_status(f"{self.endpoint_url}/minio/health/live") != 200:
            return False
        try:
            self.client().list_buckets()
        except Exception:  # botocore's errors while the object layer boots: not ready yet
            return False
        return True

    def client(self) -> S3Client:
        """A fresh boto3 S3 client for this server (path-style, few retries)."""
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name=self.region,
            config=Config(
                s3={"addressing_style": "path"},
                retries={"max_attempts": 2, "mode": "standard"},
                connect_timeout=2,
                read_timeout=10,
            ),
        )

    def create_bucket(self, name: str) -> str:
        self.client().create_bucket(Bucket=name)
        return name
