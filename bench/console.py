"""The console's server time with many topics (issue 19: every page under a second of server
time with 1,000 topics and 10,000 partitions).

Starts a broker against etcd and MinIO, creates ``--topics`` topics of ``--partitions``
partitions each, produces one record to every partition (so every partition has a committed
segment for the storage summary to read), starts `kafscale console` on the broker's metadata
store and /metrics, logs in, and requests each page ``--repeat`` times. It reports, per page,
the median and the largest server time from the ``Server-Timing`` header the console puts on
every answer (the handler's time, not the network's), the wall time seen by the client, and the
page's size; and the storage summary's refresh time from the console's log.

    .venv/bin/python -m bench.console                 # 1,000 topics x 10 partitions
    .venv/bin/python -m bench.console --topics 100    # quicker

Run it on an otherwise idle machine: it measures, it does not assert.
"""

from __future__ import annotations

import argparse
import http.cookiejar
import re
import statistics
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

from tests.harness.broker import BrokerFactory
from tests.harness.console import PASSWORD, USERNAME, ConsoleProcess
from tests.harness.etcd import EtcdServer
from tests.harness.minio import MinioServer

SERVER_TIMING = re.compile(r"app;dur=([0-9.]+)")


def create_topics(bootstrap: str, topics: int, partitions: int) -> list[str]:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    names = [f"bench-topic-{i:04d}" for i in range(topics)]
    for start in range(0, topics, 100):
        batch = [NewTopic(n, partitions) for n in names[start : start + 100]]
        for future in admin.create_topics(batch, request_timeout=120).values():
            future.result()
    return names


def produce_everywhere(bootstrap: str, names: list[str], partitions: int) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "acks": "all"})
    for name in names:
        for partition in range(partitions):
            producer.produce(name, value=b'{"bench": true}', key=b"k", partition=partition)
        producer.poll(0)
    if producer.flush(300) != 0:
        raise RuntimeError("records left unacknowledged")


def consume_a_group(bootstrap: str, name: str) -> None:
    from confluent_kafka import Consumer

    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "bench-group", "auto.offset.reset": "earliest"}
    )
    consumer.subscribe([name])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            consumer.commit(message=message, asynchronous=False)
            break
    consumer.close()


class Session:
    def __init__(self, base: str) -> None:
        self.base = base
        self.opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar())
        )

    def log_in(self) -> None:
        data = urllib.parse.urlencode({"username": USERNAME, "password": PASSWORD}).encode()
        with self.opener.open(f"{self.base}/login", data=data, timeout=60) as answer:
            if "/login" in answer.url:
                raise RuntimeError("the login was refused")

    def get(self, path: str) -> tuple[float, float, int]:
        """(server ms, wall ms, bytes) of one GET."""
        request = urllib.request.Request(f"{self.base}{path}", headers={"Accept": "text/html"})
        started = time.perf_counter()
        with self.opener.open(request, timeout=120) as answer:
            body = answer.read()
            timing = SERVER_TIMING.search(answer.headers.get("Server-Timing", ""))
        wall = (time.perf_counter() - started) * 1000
        if timing is None:
            raise RuntimeError(f"{path}: no Server-Timing header")
        return float(timing.group(1)), wall, len(body)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--topics", type=int, default=1000)
    parser.add_argument("--partitions", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="kafscale-bench-console-"))
    etcd, minio = EtcdServer(work / "etcd"), MinioServer(work / "minio")
    etcd.start_first()
    minio.start_first()
    factory = BrokerFactory(work / "brokers", "bench-console", etcd=lambda: etcd, s3=lambda: minio)
    console = None
    try:
        broker = factory(backends="real", ready=True)
        started = time.monotonic()
        names = create_topics(broker.bootstrap, args.topics, args.partitions)
        print(
            f"created {len(names)} topics x {args.partitions} partitions "
            f"in {time.monotonic() - started:.0f} s",
            file=sys.stderr,
        )
        started = time.monotonic()
        produce_everywhere(broker.bootstrap, names, args.partitions)
        consume_a_group(broker.bootstrap, names[0])
        print(f"produced to every partition in {time.monotonic() - started:.0f} s", file=sys.stderr)
        console = ConsoleProcess(
            work / "console",
            broker.env,
            broker.bootstrap,
            metrics_url=f"http://127.0.0.1:{broker.metrics_port}/metrics",
            env={"KAFSCALE_LOG_LEVEL": "info", "KAFSCALE_CONSOLE_SAMPLE_SECONDS": "5"},
        )
        console.start_first()
        session = Session(console.url)
        session.log_in()
        time.sleep(12)  # two storage summaries and metrics samples
        first = names[0]
        pages = {
            "overview": "/",
            "topics": "/topics",
            "topics, last page": f"/topics?page={-(-args.topics // 100)}",
            "topics, filtered": "/topics?q=bench-topic-09",
            "topic": f"/topics/{first}",
            "messages, end, all partitions": f"/topics/{first}/messages",
            "messages, filtered": f"/topics/{first}/messages?start=beginning&contains=bench",
            "groups": "/groups",
            "group": "/groups/bench-group",
            "users and ACLs": "/security",
        }
        print(
            f"| page ({args.topics:,} topics, {args.topics * args.partitions:,} partitions) "
            "| server ms, median | server ms, max | wall ms, median | KiB |"
        )
        print("|---|---|---|---|---|")
        for label, path in pages.items():
            runs = [session.get(path) for _ in range(args.repeat)]
            server = [r[0] for r in runs]
            wall = [r[1] for r in runs]
            print(
                f"| {label} | {statistics.median(server):.0f} | {max(server):.0f} | "
                f"{statistics.median(wall):.0f} | {runs[-1][2] / 1024:.0f} |"
            )
        refreshes = re.findall(r'"storage summary[^"]*"[^\n]*?"ms": ?([0-9.]+)', console.log_text())
        if refreshes:
            print(f"\nstorage summary refresh: {refreshes[-1]} ms")
    finally:
        if console is not None:
            console.stop()
        factory.close()
        minio.close()
        etcd.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
