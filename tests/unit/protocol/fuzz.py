"""A mutation fuzzer over the frontend's request decoding and the record-batch validator.

    python -m tests.unit.protocol.fuzz --seed 14 --requests 60000 --batches 8000 [--rlimit-as 2GiB]

Seeds: the frames real clients sent (corpus/frames.txt, recorded by corpus/capture.py: librdkafka,
kcat, aiokafka, kafka-python, the Java client and tools), and one request of every served API
version in two variants (tests/unit/protocol/frames.py). The record batches in the clients'
Produce requests, decompressed, seed the batch fuzzer.

Mutations are byte-level but aimed where decoders break: counts and lengths set to interesting
values (0, -1, -2, 0x7FFFFFFF, 0xFFFFFFFF, 5-byte varints), bits flipped, spans deleted,
duplicated or spliced from another frame, tails cut or appended; a few change the header's API
version so a body is read under another version's schema. Batches get their CRC recomputed after
most mutations (else the CRC check would stop nearly all of them) and are sometimes compressed.

Invariants, checked for every input (a violation is printed and makes the exit status 1):
- requests: ``decode_request`` returns a request or raises a DecodeError (the family the
  connection handler catches); anything else is a failure;
- batches: ``validate.split_batches`` returns batches or a BatchError, never raises;
- memory: what one input makes the target allocate (tracemalloc, peak above the start) stays
  within ``REQUEST_MEMORY_PER_BYTE`` per byte (requests) or the policy's decompression bound
  plus a small multiple of the input (batches).
The process itself may be given an address-space limit (``--rlimit-as``): an allocation past a
bound then fails, or -- in native code that aborts on a failed allocation, as kio's reader did
-- kills the process, which the caller sees as a non-zero exit.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import random
import resource
import struct
import sys
import time
import tracemalloc
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from kio.index import load_request_schema
from kio.schema.index import api_key_map, schema_name_map
from kio.static.constants import EntityType

from kafscale.protocol import bounds, codec, legacy_produce, records, validate
from kafscale.protocol.compression import Codec
from kafscale.protocol.errors import DecodeError, MalformedRequest
from kafscale.protocol.limits import Limits
from tests.unit.protocol import frames as sample_frames

CORPUS = Path(__file__).with_name("corpus") / "frames.txt"
#: The broker's defaults, but a smaller decoded limit so the fuzzer meets it too.
LIMITS = Limits(
    max_request_bytes=100 << 20, max_decoded_request_bytes=64 << 10, max_request_elements=30_000
)
REQUEST_MEMORY_PER_BYTE = 40
REQUEST_MEMORY_SLACK = 256 << 10  # first use of a kio schema, ErrorCode and UUID caches, ...
POLICY = validate.BatchPolicy(max_batch_bytes=64 << 10, decompression_factor=16)
BATCH_MEMORY_SLACK = 4 << 20
MAX_INPUT = 64 << 10
API_VERSIONS = 18
INTERESTING_16 = [0, 1, 0x7FFF, 0x8000, 0xFFFF, 0xFFFE]
INTERESTING_32 = [0, 1, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 0xFFFFFFFE, 0x00010000]
INTERESTING_VARINTS = [b"\x00", b"\x01", b"\x7f", b"\xff\x7f", b"\xff\xff\xff\xff\x0f", b"\x80" * 5]


def load_corpus() -> list[bytes]:
    """The captured frames, then a frame of every served API version in both variants."""
    seeds = [
        bytes.fromhex(line.split()[3])
        for line in CORPUS.read_text().splitlines()
        if line and not line.startswith("#")
    ]
    for schema in sample_frames.served_schemas():
        for variant in ("small", "valued"):
            request = sample_frames.sample_request(schema, variant)  # type: ignore[arg-type]
            seeds.append(codec.encode_request(request, 7, "fuzz"))
    return seeds


def batch_seeds(corpus: list[bytes]) -> list[bytes]:
    """Uncompressed batches: the clients' batches (decompressed) and a few built here."""
    found = []
    for frame in corpus:
        api_key, version = struct.unpack_from(">hh", frame)
        if api_key != 0 or version < 3:
            continue
        _, request = codec.decode_request(frame, load_request_schema(api_key, version))
        for topic in request.topic_data:
            for partition in topic.partition_data:
                if partition.records and len(partition.records) >= records.HEADER.size:
                    found.append(_uncompressed(bytes(partition.records)))
    found.append(records.build_batch([(b"k", b"v", [("h", b"x")], 1_700_000_000_000)]))
    found.append(
        records.build_batch(
            [(None, b"v" * i, [], 1_700_000_000_000 + i) for i in range(10)],
            producer_id=7,
            producer_epoch=0,
            base_sequence=0,
        )
    )
    return found


def _uncompressed(batch: bytes) -> bytes:
    header = records.read_header(batch)
    if header.codec == Codec.NONE:
        return batch
    body = records.decompress_records(batch)
    out = bytearray(batch[: records.RECORDS_OFFSET]) + body
    fields = records.FIELD_STRUCTS
    fields["attributes"].pack_into(out, records.OFFSETS["attributes"], header.attributes & ~7)
    fields["batch_length"].pack_into(out, records.OFFSETS["batch_length"], len(out) - 12)
    fields["crc"].pack_into(out, records.OFFSETS["crc"], records.batch_crc(out))
    return bytes(out)


class Mutator:
    def __init__(self, rng: random.Random, corpus: list[bytes]) -> None:
        self.rng = rng
        self.corpus = corpus
        self._mutations: list[Callable[[bytearray], None]] = [
            self._flip,
            self._byte,
            self._int16,
            self._int32,
            self._varint,
            self._delete,
            self._duplicate,
            self._splice,
            self._truncate,
            self._append,
        ]

    def mutate(self, data: bytes, body_from: int = 0) -> bytes:
        out = bytearray(data)
        self._from = body_from
        for _ in range(self.rng.choice((1, 1, 1, 2, 2, 3, 5))):
            self.rng.choice(self._mutations)(out)
        return bytes(out[:MAX_INPUT])

    def _at(self, out: bytearray, width: int = 1) -> int:
        low = min(self._from, max(len(out) - width, 0))
        return self.rng.randint(low, max(len(out) - width, low))

    def _flip(self, out: bytearray) -> None:
        if out:
            out[self._at(out)] ^= 1 << self.rng.randrange(8)

    def _byte(self, out: bytearray) -> None:
        if out:
            out[self._at(out)] = self.rng.choice((0x00, 0x01, 0x7F, 0x80, 0xFF, 0xFE))

    def _int16(self, out: bytearray) -> None:
        if len(out) >= 2:
            struct.pack_into(">H", out, self._at(out, 2), self.rng.choice(INTERESTING_16))

    def _int32(self, out: bytearray) -> None:
        if len(out) >= 4:
            struct.pack_into(">I", out, self._at(out, 4), self.rng.choice(INTERESTING_32))

    def _varint(self, out: bytearray) -> None:
        at = self._at(out)
        out[at : at + self.rng.choice((0, 1, 1, 2))] = self.rng.choice(INTERESTING_VARINTS)

    def _delete(self, out: bytearray) -> None:
        at = self._at(out)
        del out[at : at + self.rng.choice((1, 1, 2, 4, 8, 16))]

    def _duplicate(self, out: bytearray) -> None:
        at = self._at(out)
        span = out[at : at + self.rng.choice((1, 2, 4, 16, 64))]
        out[at:at] = span * self.rng.choice((1, 1, 2, 8))

    def _splice(self, out: bytearray) -> None:
        other = self.rng.choice(self.corpus)
        at = self._at(out)
        out[at:] = other[self.rng.randint(0, len(other)) :]

    def _truncate(self, out: bytearray) -> None:
        del out[self._at(out) :]

    def _append(self, out: bytearray) -> None:
        out += self.rng.randbytes(self.rng.choice((1, 3, 16)))


def decode_request(frame: bytes) -> object:
    """What the frontend does with a frame up to its handler (``requests.process``): the API,
    then Produce v0-v2 refused by hand, then kio under the structure check."""
    api_key, version, _ = codec.peek_header(frame)
    codec.api_name(api_key)
    if api_key == 0 and 0 <= version < 3:
        return legacy_produce.refuse(frame)
    schema = codec.request_schema(api_key, version)
    if schema is None and api_key == API_VERSIONS:
        return None  # answered in v0 without reading the body (KIP-511)
    if schema is None:
        raise MalformedRequest(f"no version {version}")
    return codec.decode_request(frame, schema, LIMITS)


def check_batch(blob: bytes) -> object:
    found = validate.split_batches(blob, POLICY, 1_700_000_000_000)
    if not isinstance(found, (list, validate.BatchError)):
        raise TypeError(f"split_batches returned {type(found).__name__}")
    return found


def warm_up() -> None:
    """Compile every request schema's layout and kio reader before memory is measured."""
    for key, name in api_key_map.items():
        for version, entities in schema_name_map[name].items():
            if EntityType.request in entities:
                schema = load_request_schema(key, version)
                bounds.entity_layout(schema.__header_schema__)
                bounds.entity_layout(schema)
                codec.decode_request(
                    codec.encode_request(sample_frames.sample_request(schema), 1), schema
                )


@dataclasses.dataclass
class Summary:
    requests: int = 0
    batches: int = 0
    outcomes: Counter[str] = dataclasses.field(default_factory=Counter)
    worst_memory_per_byte: float = 0.0
    failures: list[str] = dataclasses.field(default_factory=list)

    def fail(self, what: str, data: bytes, problem: str) -> None:
        if len(self.failures) < 20:
            self.failures.append(f"{what} {problem}: {data.hex()}")


def mutated_requests(rng: random.Random, corpus: list[bytes], count: int) -> Iterator[bytes]:
    mutator = Mutator(rng, corpus)
    for _ in range(count):
        seed = rng.choice(corpus)
        frame = mutator.mutate(seed, body_from=0 if rng.random() < 0.05 else 8)
        if len(frame) >= 4 and rng.random() < 0.03:  # the body under another version
            frame = frame[:2] + struct.pack(">h", rng.randrange(-1, 20)) + frame[4:]
        yield frame


def fuzz_requests(rng: random.Random, corpus: list[bytes], count: int, summary: Summary) -> None:
    for frame in mutated_requests(rng, corpus, count):
        summary.requests += 1
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        try:
            decode_request(frame)
            summary.outcomes["decoded"] += 1
        except DecodeError as exc:
            summary.outcomes[type(exc).__name__] += 1
        except Exception as exc:  # any other exception is the finding
            summary.fail("request", frame, repr(exc))
            continue
        used = tracemalloc.get_traced_memory()[1] - before
        summary.worst_memory_per_byte = max(
            summary.worst_memory_per_byte, used / len(frame or b"x")
        )
        if used > REQUEST_MEMORY_PER_BYTE * len(frame) + REQUEST_MEMORY_SLACK:
            summary.fail("request", frame, f"allocated {used} bytes")


def fuzz_batches(rng: random.Random, seeds: list[bytes], count: int, summary: Summary) -> None:
    mutator = Mutator(rng, seeds)
    for _ in range(count):
        blob = bytearray(mutator.mutate(rng.choice(seeds), body_from=0))
        if len(blob) >= records.HEADER.size and rng.random() < 0.8:
            struct.pack_into(">I", blob, records.OFFSETS["crc"], records.batch_crc(blob))
            if rng.random() < 0.3:
                with contextlib.suppress(DecodeError, ValueError):  # a header that is no more
                    blob = bytearray(records.compress_batch(bytes(blob), rng.choice((1, 2, 3, 4))))
        summary.batches += 1
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        try:
            result = check_batch(bytes(blob))
            summary.outcomes["batch ok" if isinstance(result, list) else "batch refused"] += 1
        except Exception as exc:  # split_batches must not raise at all
            summary.fail("batch", bytes(blob), repr(exc))
            continue
        used = tracemalloc.get_traced_memory()[1] - before
        if used > 2 * POLICY.max_decompressed_bytes + 32 * len(blob) + BATCH_MEMORY_SLACK:
            summary.fail("batch", bytes(blob), f"allocated {used} bytes")


def run(seed: int, requests: int, batches: int) -> Summary:
    corpus = load_corpus()
    batch_corpus = batch_seeds(corpus)
    warm_up()
    summary = Summary()
    rng = random.Random(seed)
    tracemalloc.start()
    try:
        fuzz_requests(rng, corpus, requests, summary)
        fuzz_batches(rng, batch_corpus, batches, summary)
    finally:
        tracemalloc.stop()
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=14)
    parser.add_argument("--requests", type=int, default=60_000)
    parser.add_argument("--batches", type=int, default=8_000)
    parser.add_argument("--rlimit-as", type=int, default=0, help="address-space limit, bytes")
    args = parser.parse_args(argv)
    if args.rlimit_as:
        resource.setrlimit(resource.RLIMIT_AS, (args.rlimit_as, args.rlimit_as))
    started = time.monotonic()
    summary = run(args.seed, args.requests, args.batches)
    report: dict[str, Any] = {
        "seed": args.seed,
        "requests": summary.requests,
        "batches": summary.batches,
        "outcomes": dict(summary.outcomes.most_common()),
        "worst_memory_per_byte": round(summary.worst_memory_per_byte, 1),
        "seconds": round(time.monotonic() - started, 1),
        "failures": summary.failures,
    }
    print(json.dumps(report, indent=1))
    return 1 if summary.failures else 0


if __name__ == "__main__":
    sys.exit(main())
