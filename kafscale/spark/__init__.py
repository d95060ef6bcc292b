"""Spark reads topics straight from their segments: ``spark.read.format("kafscale")``.

    from kafscale.spark import register
    register(spark)
    df = (spark.read.format("kafscale")
          .option("dataDir", "./data")            # or bucket/endpoint/... and etcdEndpoints
          .option("subscribe", "events")
          .load())

Rows have the schema of Spark's Kafka source (key, value, topic, partition, offset, timestamp,
timestampType, headers). Only committed records are read, in parallel, one Spark task per segment
or slice of a large one; the brokers are not involved. Options: ``kafscale.spark.options``.
Needs the ``spark`` extra (``pip install 'kafscale[spark]'``): pyspark 4 and pyarrow.
"""

from __future__ import annotations

from typing import Any


def register(spark: Any) -> None:
    """Register the ``kafscale`` data source with a SparkSession."""
    from kafscale.spark.source import register as _register

    _register(spark)


__all__ = ["register"]
