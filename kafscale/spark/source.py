"""The PySpark side: the ``kafscale`` data source (Spark 4's Python data source API).

The driver plans (``KafscaleReader.partitions``: catalog, bounds, slices); each executor task
reads one slice (``KafscaleReader.read``) and hands Spark Arrow record batches. Only this module
imports pyspark.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from kafscale.spark import options as opts
from kafscale.spark.catalog import open_catalog, open_objects
from kafscale.spark.plan import Slice, plan
from kafscale.spark.read import read_slice, spark_schema
from kafscale.storage import ObjectStore

_stores: dict[opts.Storage, ObjectStore] = {}  # per executor process: reuse connections


def _objects(storage: opts.Storage) -> ObjectStore:
    store = _stores.get(storage)
    if store is None:
        store = _stores[storage] = open_objects(storage)
    return store


class SlicePartition(InputPartition):
    def __init__(self, part: Slice) -> None:
        super().__init__(part)
        self.part = part


class KafscaleDataSource(DataSource):
    """``spark.read.format("kafscale")``: a topic's committed records, read from its segments."""

    @classmethod
    def name(cls) -> str:
        return "kafscale"

    def schema(self) -> str:
        return spark_schema(opts.parse(self.options).include_headers)

    def reader(self, schema: StructType) -> KafscaleReader:
        return KafscaleReader(opts.parse(self.options))


class KafscaleReader(DataSourceReader):
    def __init__(self, options: opts.ReadOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        objects = open_objects(self.options.storage)
        catalog = open_catalog(self.options.storage, objects)
        try:
            slices = plan(self.options, catalog, objects)
        finally:
            catalog.close()
            objects.close()
        return [SlicePartition(part) for part in slices]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, SlicePartition):
            return  # Spark's stand-in partition when the plan found nothing to read
        part = partition.part
        yield from read_slice(
            _objects(self.options.storage),
            part,
            self.options.include_headers,
            self.options.fail_on_data_loss,
        )


def register(spark: Any) -> None:
    """Make ``format("kafscale")`` known to this Spark session."""
    spark.dataSource.register(KafscaleDataSource)
