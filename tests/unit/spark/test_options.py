from __future__ import annotations

import pytest

from kafscale.spark import options as opts
from kafscale.spark.options import EARLIEST, LATEST, OptionError


def parse(**given: str) -> opts.ReadOptions:
    return opts.parse({"dataDir": "/data", "subscribe": "t", **given})


def test_defaults_read_every_committed_record() -> None:
    read = parse()
    assert read.storage == opts.Storage(data_dir="/data")
    assert read.selection == opts.Selection(topics=("t",))
    assert read.starting == opts.Bound("offset", EARLIEST, {})
    assert read.ending == opts.Bound("offset", LATEST, {})
    assert read.fail_on_data_loss and read.include_headers
    assert read.start_timestamp_strategy == "error"


def test_names_are_case_insensitive_as_in_spark() -> None:
    read = opts.parse(
        {"BUCKET": "b", "Endpoint": "http://s3:9000", "SUBSCRIBE": "a, b", "etcdendpoints": "x:1"}
    )
    assert read.storage.bucket == "b" and read.storage.endpoint == "http://s3:9000"
    assert read.storage.etcd_endpoints == ("x:1",)
    assert read.selection.topics == ("a", "b")


def test_offsets_as_the_kafka_source_spells_them() -> None:
    read = parse(
        startingOffsets='{"t": {"0": 23, "1": -2}}', endingOffsets='{"t": {"0": 50, "1": -1}}'
    )
    assert read.starting == opts.Bound("offset", EARLIEST, {"t": {0: 23, 1: EARLIEST}})
    assert read.ending == opts.Bound("offset", LATEST, {"t": {0: 50, 1: LATEST}})


def test_a_global_timestamp_wins_over_per_partition_ones_and_offsets() -> None:
    read = parse(
        startingTimestamp="1000",
        startingOffsetsByTimestamp='{"t": {"0": 5}}',
        startingOffsets="earliest",
        endingOffsetsByTimestamp='{"t": {"0": 9000}}',
    )
    assert read.starting == opts.Bound("timestamp", 1000, {})
    assert read.ending == opts.Bound("timestamp", LATEST, {"t": {0: 9000}})


@pytest.mark.parametrize(
    ("given", "complaint"),
    [
        ({"dataDir": "/d", "bucket": "b", "subscribe": "t"}, "exactly one of them"),
        ({"subscribe": "t"}, "exactly one of them"),
        ({"dataDir": "/d"}, "exactly one of 'subscribe'"),
        ({"dataDir": "/d", "subscribe": "t", "assign": '{"t": [0]}'}, "given: \\['subscribe'"),
        ({"dataDir": "/d", "subscribe": " , "}, "no topic named"),
        ({"dataDir": "/d", "subscribePattern": "("}, "not a regular expression"),
        ({"dataDir": "/d", "assign": '{"t": [-1]}'}, "list of partition numbers"),
        ({"dataDir": "/d", "assign": "[0]"}, "expected a JSON object"),
        ({"dataDir": "/d", "subscribe": "t", "startingOffsets": "latest"}, "not allowed for a"),
        ({"dataDir": "/d", "subscribe": "t", "endingOffsets": "earliest"}, "not allowed for a"),
        ({"dataDir": "/d", "subscribe": "t", "startingOffsets": '{"t": {"0": -1}}'}, "not allowed"),
        ({"dataDir": "/d", "subscribe": "t", "startingOffsets": '{"t": {"0": -3}}'}, "use -2"),
        ({"dataDir": "/d", "subscribe": "t", "startingOffsets": '{"t": {"x": 1}}'}, "partition"),
        ({"dataDir": "/d", "subscribe": "t", "startingOffsets": '{"t": {"0": "1"}}'}, "integer"),
        ({"dataDir": "/d", "subscribe": "t", "startingOffsets": "{"}, "not JSON"),
        ({"dataDir": "/d", "subscribe": "t", "startingTimestamp": "soon"}, "milliseconds"),
        ({"dataDir": "/d", "subscribe": "t", "endingTimestamp": "-5"}, "negative"),
        ({"dataDir": "/d", "subscribe": "t", "failOnDataLoss": "yes"}, "true or false"),
        ({"dataDir": "/d", "subscribe": "t", "splitBytes": "0"}, "positive number"),
        (
            {"dataDir": "/d", "subscribe": "t", "startingOffsetsByTimestampStrategy": "x"},
            "error, latest",
        ),
    ],
)
def test_a_malformed_option_is_named_in_the_error(given: dict[str, str], complaint: str) -> None:
    with pytest.raises(OptionError, match=complaint):
        opts.parse(given)
