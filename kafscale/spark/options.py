"""The reader's options, as ``spark.read.format("kafscale").option(...)`` passes them.

Names and meanings follow Spark's Kafka source wherever it has the option, so a batch job written
for ``format("kafka")`` ports by changing the format name and saying where the bucket is:

    where the data is   bucket, endpoint, region, accessKey, secretKey, pathStyle, namespace
                        (an S3 bucket), or dataDir (the embedded default's KAFSCALE_DATA_DIR)
    the metadata store  etcdEndpoints; with dataDir, its metadata.sqlite when there is one
    what to read        subscribe (or topic / topics), subscribePattern, assign
    bounds              startingOffsets, endingOffsets, startingTimestamp, endingTimestamp,
                        startingOffsetsByTimestamp, endingOffsetsByTimestamp,
                        startingOffsetsByTimestampStrategy, failOnDataLoss
    rows and splits     includeHeaders, splitBytes

Option names are case-insensitive (Spark lower-cases them); a malformed value raises
``OptionError`` naming the option.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

EARLIEST, LATEST = -2, -1  # as the Kafka source spells them in JSON offsets
DEFAULT_SPLIT_BYTES = 64 * 1024 * 1024


class OptionError(ValueError):
    """An option is missing, unknown in combination, or malformed."""


@dataclass(frozen=True, slots=True)
class Storage:
    """Where segments (and the metadata, if any) live; picklable, so executors can reopen it."""

    data_dir: str = ""
    bucket: str = ""
    endpoint: str = ""
    region: str = "us-east-1"
    access_key: str = ""
    secret_key: str = ""
    path_style: bool = False
    namespace: str = "default"
    etcd_endpoints: tuple[str, ...] = ()

    @property
    def description(self) -> str:
        if self.bucket:
            where = f" at {self.endpoint}" if self.endpoint else ""
            return f"s3://{self.bucket}/{self.namespace}{where}"
        return self.data_dir


# A bound per partition: an offset (or EARLIEST / LATEST), or a timestamp to resolve.
OffsetSpec = dict[str, dict[int, int]]  # topic -> partition -> offset


@dataclass(frozen=True, slots=True)
class Bound:
    """One end of the range to read: ``kind`` says how ``default`` and ``specific`` are meant."""

    kind: Literal["offset", "timestamp"]
    default: int  # for every partition not in ``specific``
    specific: OffsetSpec


@dataclass(frozen=True, slots=True)
class Selection:
    """Which topics (and, with ``assign``, which partitions) to read."""

    topics: tuple[str, ...] = ()
    pattern: str = ""
    assign: dict[str, tuple[int, ...]] | None = None


@dataclass(frozen=True, slots=True)
class ReadOptions:
    storage: Storage
    selection: Selection
    starting: Bound
    ending: Bound
    start_timestamp_strategy: Literal["error", "latest"] = "error"
    fail_on_data_loss: bool = True
    include_headers: bool = True
    split_bytes: int = DEFAULT_SPLIT_BYTES


def parse(raw: Mapping[str, str]) -> ReadOptions:
    options = {k.lower(): v for k, v in raw.items()}
    return ReadOptions(
        storage=_storage(options),
        selection=_selection(options),
        starting=_bound(options, "starting"),
        ending=_bound(options, "ending"),
        start_timestamp_strategy=_choice(
            options, "startingoffsetsbytimestampstrategy", ("error", "latest"), "error"
        ),
        fail_on_data_loss=_flag(options, "failondataloss", True),
        include_headers=_flag(options, "includeheaders", True),
        split_bytes=_positive(options, "splitbytes", DEFAULT_SPLIT_BYTES),
    )


def _storage(options: dict[str, str]) -> Storage:
    bucket = options.get("bucket", "").strip()
    data_dir = options.get("datadir", "").strip()
    if bool(bucket) == bool(data_dir):
        raise OptionError(
            "say where the segments are: option 'bucket' (an S3 bucket) or 'dataDir' (the "
            "embedded broker's KAFSCALE_DATA_DIR), exactly one of them"
        )
    etcd = tuple(e.strip() for e in options.get("etcdendpoints", "").split(",") if e.strip())
    return Storage(
        data_dir=data_dir,
        bucket=bucket,
        endpoint=options.get("endpoint", "").strip(),
        region=options.get("region", "").strip() or "us-east-1",
        access_key=options.get("accesskey", ""),
        secret_key=options.get("secretkey", ""),
        path_style=_flag(options, "pathstyle", False),
        namespace=options.get("namespace", "").strip() or "default",
        etcd_endpoints=etcd,
    )


def _selection(options: dict[str, str]) -> Selection:
    given = [
        k for k in ("subscribe", "topic", "topics", "subscribepattern", "assign") if k in options
    ]
    if len(given) != 1:
        raise OptionError(
            "say what to read with exactly one of 'subscribe' (comma-separated topics; 'topic' "
            f"and 'topics' are aliases), 'subscribePattern' or 'assign' (given: {given or 'none'})"
        )
    (name,) = given
    value = options[name]
    if name == "subscribepattern":
        try:
            re.compile(value)
        except re.error as exc:
            raise OptionError(
                f"subscribePattern {value!r} is not a regular expression: {exc}"
            ) from None
        return Selection(pattern=value)
    if name == "assign":
        assigned = _json_object(name, value)
        assign: dict[str, tuple[int, ...]] = {}
        for topic, partitions in assigned.items():
            if not isinstance(partitions, list) or not all(
                isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in partitions
            ):
                raise OptionError(f"assign: {topic!r} must map to a list of partition numbers")
            assign[topic] = tuple(sorted(set(partitions)))
        return Selection(topics=tuple(assign), assign=assign)
    topics = tuple(t.strip() for t in value.split(",") if t.strip())
    if not topics:
        raise OptionError(f"{name}: no topic named")
    return Selection(topics=topics)


def _bound(options: dict[str, str], end: Literal["starting", "ending"]) -> Bound:
    """Spark's precedence: a global timestamp, then timestamps per partition, then offsets."""
    timestamp = options.get(f"{end}timestamp")
    if timestamp is not None:
        return Bound("timestamp", _timestamp(f"{end}Timestamp", timestamp), {})
    by_timestamp = options.get(f"{end}offsetsbytimestamp")
    if by_timestamp is not None:
        name = f"{end}OffsetsByTimestamp"
        spec = _partition_map(name, by_timestamp)
        for topic, partitions in spec.items():
            for partition, value in partitions.items():
                if value < 0:
                    raise OptionError(f"{name}: {topic}-{partition} has negative timestamp {value}")
        return Bound("timestamp", LATEST if end == "ending" else EARLIEST, spec)
    name = f"{end}Offsets"
    default_name = "earliest" if end == "starting" else "latest"
    text = options.get(f"{end}offsets", default_name).strip()
    if text.lower() in ("earliest", "latest"):
        offset = EARLIEST if text.lower() == "earliest" else LATEST
        _check_batch_bound(name, end, offset)
        return Bound("offset", offset, {})
    spec = _partition_map(name, text)
    for partitions in spec.values():
        for offset in partitions.values():
            if offset < EARLIEST:
                raise OptionError(f"{name}: offset {offset} (use -2 for earliest, -1 for latest)")
            _check_batch_bound(name, end, offset)
    return Bound("offset", EARLIEST if end == "starting" else LATEST, spec)


def _check_batch_bound(name: str, end: str, offset: int) -> None:
    """As in Spark's Kafka source, a batch read cannot start at latest or end at earliest."""
    if end == "starting" and offset == LATEST:
        raise OptionError(f"{name}: 'latest' (-1) is not allowed for a batch read")
    if end == "ending" and offset == EARLIEST:
        raise OptionError(f"{name}: 'earliest' (-2) is not allowed for a batch read")


def _partition_map(name: str, value: str) -> OffsetSpec:
    """``{"topic": {"0": 23, "1": -2}}`` to ``{"topic": {0: 23, 1: -2}}``."""
    spec: OffsetSpec = {}
    for topic, partitions in _json_object(name, value).items():
        if not isinstance(partitions, dict):
            raise OptionError(f"{name}: {topic!r} must map partition numbers to values")
        parsed: dict[int, int] = {}
        for partition, number in partitions.items():
            if not str(partition).isdigit():
                raise OptionError(f"{name}: {partition!r} of {topic!r} is not a partition number")
            if not isinstance(number, int) or isinstance(number, bool):
                raise OptionError(f"{name}: {topic}-{partition} must be an integer, not {number!r}")
            parsed[int(partition)] = number
        spec[topic] = parsed
    return spec


def _json_object(name: str, value: str) -> dict[str, object]:
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        raise OptionError(f"{name}: not JSON ({exc}): {value!r}") from None
    if not isinstance(parsed, dict):
        raise OptionError(f"{name}: expected a JSON object, got {value!r}")
    return parsed


def _timestamp(name: str, value: str) -> int:
    try:
        timestamp = int(value.strip())
    except ValueError:
        raise OptionError(f"{name}: {value!r} is not a timestamp in milliseconds") from None
    if timestamp < 0:
        raise OptionError(f"{name}: {timestamp} is negative")
    return timestamp


def _flag(options: dict[str, str], name: str, default: bool) -> bool:
    value = options.get(name)
    if value is None:
        return default
    if value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise OptionError(f"{name}: expected true or false, got {value!r}")


def _positive(options: dict[str, str], name: str, default: int) -> int:
    value = options.get(name)
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number <= 0:
        raise OptionError(f"{name}: expected a positive number of bytes, got {value!r}")
    return number


def _choice(
    options: dict[str, str],
    name: str,
    allowed: tuple[Literal["error", "latest"], ...],
    default: str,
) -> Literal["error", "latest"]:
    value = options.get(name, default).strip().lower()
    for choice in allowed:
        if value == choice:
            return choice
    raise OptionError(f"{name}: expected one of {', '.join(allowed)}, got {value!r}")
