"""Requests per second a broker answers for ApiVersions and Metadata, pipelined on a few
connections -- the cost of the frontend's framing, dispatch and encoding.

    python bench/request_rate.py --bootstrap 127.0.0.1:9092 [--bootstrap 127.0.0.1:19092 ...]

With several bootstraps (e.g. KafScale and an Apache Kafka broker on the same machine) it prints
each rate and the ratio to the first. Numbers are for comparison on one machine, not absolutes.
"""

from __future__ import annotations

import argparse
import asyncio
import struct
import time
from typing import Any

from kio.index import load_request_schema

from kafscale.protocol import codec


def frames(api: str, count: int) -> bytes:
    request: Any
    if api == "metadata":
        request = codec.build(
            load_request_schema(3, 12),
            topics=None,
            allow_auto_topic_creation=False,
            include_topic_authorized_operations=False,
        )
    else:
        request = codec.build(
            load_request_schema(18, 3), client_software_name="bench", client_software_version="1"
        )
    out = bytearray()
    for correlation_id in range(count):
        frame = codec.encode_request(request, correlation_id)
        out += struct.pack(">i", len(frame)) + frame
    return bytes(out)


async def one_connection(host: str, port: int, payload: bytes, count: int, window: int) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    size = len(payload) // count
    sent = answered = 0
    while answered < count:
        while sent < count and sent - answered < window:
            writer.write(payload[sent * size : (sent + 1) * size])
            sent += 1
        await writer.drain()
        (length,) = struct.unpack(">i", await reader.readexactly(4))
        await reader.readexactly(length)
        answered += 1
    writer.close()


async def measure(bootstrap: str, api: str, connections: int, count: int, window: int) -> float:
    host, port = bootstrap.rsplit(":", 1)
    payload = frames(api, count)
    started = time.perf_counter()
    await asyncio.gather(
        *(one_connection(host, int(port), payload, count, window) for _ in range(connections))
    )
    return connections * count / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", action="append", required=True)
    parser.add_argument("--api", choices=["metadata", "api_versions"], default="metadata")
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--requests", type=int, default=5000, help="per connection")
    parser.add_argument("--window", type=int, default=16, help="requests in flight")
    args = parser.parse_args()
    rates = [
        asyncio.run(measure(b, args.api, args.connections, args.requests, args.window))
        for b in args.bootstrap
    ]
    for bootstrap, rate in zip(args.bootstrap, rates, strict=True):
        print(f"{bootstrap:24} {args.api:12} {rate:10.0f} req/s  ratio {rate / rates[0]:.2f}")


if __name__ == "__main__":
    main()
