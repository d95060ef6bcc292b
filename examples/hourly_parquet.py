"""A topic's records, aggregated per hour into Parquet, read by Spark straight from the segments.

Against the embedded default (a broker started with ``kafscale serve`` in this directory keeps
its data in ``./data``)::

    .venv/bin/python examples/hourly_parquet.py --topic events

Against S3 (and etcd, for the exact high watermark)::

    .venv/bin/python examples/hourly_parquet.py --topic events --bucket my-bucket \\
        --endpoint http://minio:9000 --etcd etcd:2379 --out s3a://...  (or a local path)

Output: one row per topic, partition and hour with the record count, the bytes of keys and
values, the number of distinct keys and the offsets covered; written as Parquet under ``--out``
(replaced on every run), partitioned by day. The brokers are not involved.
"""

from __future__ import annotations

import argparse
import os
import sys

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from kafscale.spark import register


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topic", required=True, help="topic (or comma-separated topics)")
    parser.add_argument(
        "--data-dir",
        default=os.environ.get("KAFSCALE_DATA_DIR", "./data"),
        help="the embedded broker's data directory (default: $KAFSCALE_DATA_DIR or ./data)",
    )
    parser.add_argument("--bucket", help="read from this S3 bucket instead of --data-dir")
    parser.add_argument("--endpoint", default="", help="S3 endpoint URL (MinIO, ...)")
    parser.add_argument("--region", default="us-east-1")
    parser.add_argument("--namespace", default="default", help="KAFSCALE_S3_NAMESPACE")
    parser.add_argument("--etcd", default="", help="etcd endpoints, comma-separated")
    parser.add_argument("--out", default="./hourly-parquet", help="where the Parquet goes")
    parser.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    args = parser.parse_args(argv)

    # Spark's Python workers must run this interpreter, the one kafscale is installed in.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master(args.master)
        .appName("kafscale-hourly-parquet")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    register(spark)
    reader = spark.read.format("kafscale").option("subscribe", args.topic)
    if args.bucket:
        reader = reader.options(
            bucket=args.bucket,
            endpoint=args.endpoint,
            region=args.region,
            namespace=args.namespace,
            pathStyle="true" if args.endpoint else "false",
        )
        if args.etcd:
            reader = reader.option("etcdEndpoints", args.etcd)
        # credentials: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or any boto3 default source
    else:
        reader = reader.option("dataDir", args.data_dir)
    records = reader.load()

    hourly = (
        records.groupBy(
            "topic", "partition", F.date_trunc("hour", F.col("timestamp")).alias("hour")
        )
        .agg(
            F.count(F.lit(1)).alias("records"),
            F.sum(F.coalesce(F.length("key"), F.lit(0)) + F.coalesce(F.length("value"), F.lit(0)))
            .cast("long")
            .alias("bytes"),
            F.countDistinct("key").alias("distinct_keys"),
            F.min("offset").alias("first_offset"),
            F.max("offset").alias("last_offset"),
        )
        .withColumn("day", F.to_date("hour"))
        .orderBy("topic", "partition", "hour")
    )
    hourly.write.mode("overwrite").partitionBy("day").parquet(args.out)
    written = spark.read.parquet(args.out)
    total = written.agg(F.sum("records")).first()[0] or 0
    print(f"{written.count()} hourly rows, {total} records, written to {args.out}")
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
