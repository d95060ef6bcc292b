"""One contract for every object store backend, run against each: the embedded directory store and
S3 on a real S3-compatible server (the session ``s3_server`` fixture; each test gets a new bucket).
Backend-specific behaviour (key validation, temp files, unreachable endpoints) follows the contract.
"""

from __future__ import annotations

import http.server
import os
import random
import socket
import ssl
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kafscale.config import load
from kafscale.storage import (
    LocalObjectStore,
    ObjectInfo,
    ObjectNotFound,
    ObjectStore,
    ObjectStoreUnavailable,
    open_object_store,
)
from kafscale.storage.local import TEMP_PREFIX
from kafscale.storage.s3 import S3ObjectStore
from tests.harness.tls import make_pki

MiB = 1024 * 1024


def _segment_key(topic_dir: str, base_offset: int) -> str:
    return f"{topic_dir}/segment-{base_offset:020d}.kfs"


def _s3_store(s3_server: Any, bucket: str, **options: Any) -> S3ObjectStore:
    return S3ObjectStore(
        bucket=bucket,
        region=s3_server.region,
        endpoint_url=s3_server.endpoint_url,
        path_style=True,
        access_key=s3_server.access_key,
        secret_key=s3_server.secret_key,
        **options,
    )


def _new_bucket(s3_server: Any) -> str:
    name = f"kafscale-test-{uuid.uuid4().hex[:16]}"
    s3_server.create_bucket(name)
    return name


@pytest.fixture
def s3_store(s3_server: Any) -> Iterator[S3ObjectStore]:
    store = _s3_store(s3_server, _new_bucket(s3_server))
    yield store
    store.close()


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ObjectStore]:
    if request.param == "local":
        local = LocalObjectStore(str(tmp_path / "objects"))
        yield local
        local.close()
    else:
        yield request.getfixturevalue("s3_store")


# --- the contract ---------------------------------------------------------------------------------


def test_check_passes(store: ObjectStore) -> None:
    store.check()


def test_put_then_get_whole_and_ranged(store: ObjectStore) -> None:
    data = bytes(range(256)) * 4  # 1024 bytes, every position distinguishable mod 256
    assert store.put_if_absent("ns/t/0/a.kfs", data) is True

    assert store.get("ns/t/0/a.kfs") == data
    assert store.get("ns/t/0/a.kfs", start=100) == data[100:]
    assert store.get("ns/t/0/a.kfs", start=100, length=50) == data[100:150]
    assert store.get("ns/t/0/a.kfs", start=0, length=1) == data[:1]
    assert store.get("ns/t/0/a.kfs", start=1000, length=100) == data[1000:]  # runs past the end
    assert store.get("ns/t/0/a.kfs", start=1023) == data[1023:]
    assert store.get("ns/t/0/a.kfs", start=1024) == b""
    assert store.get("ns/t/0/a.kfs", start=5000) == b""
    assert store.get("ns/t/0/a.kfs", start=5000, length=10) == b""
    assert store.get("ns/t/0/a.kfs", start=10, length=0) == b""


def test_empty_object_round_trips(store: ObjectStore) -> None:
    assert store.put_if_absent("ns/empty", b"") is True
    assert store.get("ns/empty") == b""
    assert store.get("ns/empty", start=0, length=10) == b""
    assert store.size("ns/empty") == 0


def test_put_if_absent_never_overwrites(store: ObjectStore) -> None:
    assert store.put_if_absent("ns/t/0/seg", b"first") is True
    assert store.put_if_absent("ns/t/0/seg", b"second, longer") is False
    assert store.put_if_absent("ns/t/0/seg", b"first") is False
    assert store.get("ns/t/0/seg") == b"first"
    assert store.size("ns/t/0/seg") == 5


def test_concurrent_put_if_absent_has_exactly_one_winner(store: ObjectStore) -> None:
    writers = 8
    payloads = [bytes([index]) * (256 * 1024 + index) for index in range(writers)]
    results: list[bool | None] = [None] * writers
    errors: list[BaseException] = []
    barrier = threading.Barrier(writers)

    def write(index: int) -> None:
        try:
            barrier.wait()
            results[index] = store.put_if_absent("ns/t/0/contended", payloads[index])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(index,)) for index in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    assert results.count(True) == 1 and results.count(False) == writers - 1
    winner = results.index(True)
    assert store.get("ns/t/0/contended") == payloads[winner]


def test_size(store: ObjectStore) -> None:
    store.put_if_absent("ns/sized", b"x" * 12345)
    assert store.size("ns/sized") == 12345
    with pytest.raises(ObjectNotFound):
        store.size("ns/missing")


def test_get_missing_key_raises_not_found(store: ObjectStore) -> None:
    with pytest.raises(ObjectNotFound):
        store.get("ns/t/0/missing.kfs")
    with pytest.raises(ObjectNotFound):
        store.get("ns/t/0/missing.kfs", start=10, length=5)


def test_list_uses_string_prefixes_in_offset_order(store: ObjectStore) -> None:
    offsets = [0, 9, 10, 99, 100, 4096, 2**40, 2**63 - 1]
    keys = [
        _segment_key(directory, offset)
        for directory in ("ns/t/0", "ns/t/01", "ns/t/1")
        for offset in offsets
    ]
    keys.append("ns/u/0/segment-00000000000000000000.kfs")
    shuffled = list(keys)
    random.Random(7).shuffle(shuffled)
    for key in shuffled:
        assert store.put_if_absent(key, key.encode())

    partition_0 = [_segment_key("ns/t/0", offset) for offset in offsets]
    assert [info.key for info in store.list("ns/t/0/")] == partition_0
    # A prefix is a string prefix, not a directory: "ns/t/0" also matches "ns/t/01/...",
    # and '/' sorts before '1'.
    assert [info.key for info in store.list("ns/t/0")] == partition_0 + [
        _segment_key("ns/t/01", offset) for offset in offsets
    ]
    assert [info.key for info in store.list("ns/t/0/segment-0000000000000000009")] == [
        _segment_key("ns/t/0", 99)
    ]
    assert [info.key for info in store.list("ns/")] == sorted(keys)
    assert [info.key for info in store.list("")] == sorted(keys)
    assert store.list("ns/t/2/") == []
    assert store.list("other/") == []
    assert store.list("ns/t/1/")[0] == ObjectInfo(
        _segment_key("ns/t/1", 0), len(_segment_key("ns/t/1", 0))
    )


def test_delete_is_idempotent(store: ObjectStore) -> None:
    store.put_if_absent("ns/t/0/gone", b"data")
    store.put_if_absent("ns/t/0/kept", b"data")
    store.delete("ns/t/0/gone")
    with pytest.raises(ObjectNotFound):
        store.get("ns/t/0/gone")
    store.delete("ns/t/0/gone")
    store.delete("ns/never/existed")
    assert [info.key for info in store.list("ns/")] == ["ns/t/0/kept"]
    assert store.put_if_absent("ns/t/0/gone", b"again") is True
    assert store.get("ns/t/0/gone") == b"again"


def test_delete_many_removes_every_key_in_batches(
    store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Three keys per DeleteObjects request on S3 (1000 in production), so one call makes three.
    monkeypatch.setattr("kafscale.storage.s3.DELETE_BATCH", 3)
    doomed = [f"ns/t/0/{name}" for name in "abcdefg"]
    for key in [*doomed, "ns/t/1/kept"]:
        store.put_if_absent(key, b"data")
    store.delete_many([*doomed, "ns/never/existed"])
    store.delete_many([])
    assert [info.key for info in store.list("ns/")] == ["ns/t/1/kept"]


def test_memoryview_input_is_accepted(store: ObjectStore) -> None:
    buffer = bytearray(b"header|payload bytes|trailer")
    view = memoryview(buffer)[7:20]
    assert store.put_if_absent("ns/view", view) is True
    assert store.get("ns/view") == b"payload bytes"


def test_five_mib_object_round_trips(store: ObjectStore) -> None:
    data = os.urandom(5 * MiB)
    assert store.put_if_absent("ns/t/0/big.kfs", data) is True
    assert store.size("ns/t/0/big.kfs") == len(data)
    assert store.get("ns/t/0/big.kfs") == data
    middle = 5 * MiB // 2
    assert (
        store.get("ns/t/0/big.kfs", start=middle - 10, length=MiB)
        == data[middle - 10 : middle - 10 + MiB]
    )


# --- the embedded directory store -----------------------------------------------------------------


@pytest.mark.parametrize(
    "key",
    [
        "../escape",
        "a/../../escape",
        "/etc/passwd",
        "a//b",
        "a/",
        "",
        "./a",
        "a/./b",
        f"a/{TEMP_PREFIX}x",
    ],
)
def test_local_rejects_unsafe_keys(tmp_path: Path, key: str) -> None:
    store = LocalObjectStore(str(tmp_path / "objects"))
    with pytest.raises(ValueError):
        store.put_if_absent(key, b"data")
    with pytest.raises(ValueError):
        store.get(key)
    with pytest.raises(ValueError):
        store.delete(key)
    assert not (tmp_path / "escape").exists()


def test_local_leaves_no_temp_files(tmp_path: Path) -> None:
    root = tmp_path / "objects"
    store = LocalObjectStore(str(root))
    store.check()
    for index in range(5):
        assert store.put_if_absent(f"ns/t/{index % 2}/seg-{index}", b"data") is True
    assert store.put_if_absent("ns/t/0/seg-0", b"again") is False
    leftovers = [
        name for _, _, names in os.walk(root) for name in names if name.startswith(TEMP_PREFIX)
    ]
    assert leftovers == []
    assert len(store.list("")) == 5


def test_local_list_skips_partial_writes(tmp_path: Path) -> None:
    root = tmp_path / "objects"
    store = LocalObjectStore(str(root))
    store.put_if_absent("ns/t/0/seg", b"data")
    (root / "ns" / "t" / "0" / f"{TEMP_PREFIX}crashed").write_bytes(b"partial")
    assert [info.key for info in store.list("ns/")] == ["ns/t/0/seg"]


def test_local_check_names_an_unusable_directory(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_bytes(b"")
    store = LocalObjectStore(str(blocker / "objects"))
    with pytest.raises(ObjectStoreUnavailable, match=str(blocker / "objects")):
        store.check()


def test_open_object_store_follows_the_configuration(tmp_path: Path) -> None:
    local = open_object_store(load({"KAFSCALE_DATA_DIR": str(tmp_path)}))
    assert isinstance(local, LocalObjectStore)
    assert local.root == str(tmp_path / "segments")

    s3 = open_object_store(
        load(
            {
                "KAFSCALE_S3_BUCKET": "segments-bucket",
                "KAFSCALE_S3_ENDPOINT": "http://127.0.0.1:9",
                "KAFSCALE_S3_PATH_STYLE": "true",
            }
        )
    )
    assert isinstance(s3, S3ObjectStore)
    assert s3.description == "s3://segments-bucket (endpoint http://127.0.0.1:9)"
    s3.close()


# --- S3 ------------------------------------------------------------------------------------------


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_s3_unreachable_endpoint_is_unavailable() -> None:
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    store = S3ObjectStore("kafscale", "us-east-1", endpoint, True, "key", "secret", max_attempts=1)
    started = time.monotonic()
    with pytest.raises(ObjectStoreUnavailable) as raised:
        store.check()
    elapsed = time.monotonic() - started
    assert endpoint in str(raised.value), f"after {elapsed:.1f} s: {raised.value}"
    assert "'kafscale'" in str(raised.value)
    with pytest.raises(ObjectStoreUnavailable, match=endpoint):
        store.put_if_absent("ns/key", b"data")
    with pytest.raises(ObjectStoreUnavailable, match=endpoint):
        store.get("ns/key")
    with pytest.raises(ObjectStoreUnavailable, match=endpoint):
        store.list("ns/")
    store.close()


def test_s3_missing_bucket_is_unavailable(s3_server: Any) -> None:
    bucket = f"kafscale-missing-{uuid.uuid4().hex[:12]}"
    store = _s3_store(s3_server, bucket)
    with pytest.raises(ObjectStoreUnavailable, match=bucket) as raised:
        store.check()
    assert s3_server.endpoint_url in str(raised.value)
    with pytest.raises(ObjectStoreUnavailable, match=bucket):
        store.put_if_absent("ns/key", b"data")
    store.close()


def test_s3_description_names_bucket_and_endpoint(s3_store: S3ObjectStore, s3_server: Any) -> None:
    assert s3_store.description == f"s3://{s3_store.bucket} (endpoint {s3_server.endpoint_url})"


def _lose_first_put_reply(store: S3ObjectStore, before_retry: Any = None) -> None:
    """Make botocore resend a PutObject that succeeded, as if its reply had been lost."""

    def resend_once(attempts: int, response: Any, **_: Any) -> float | None:
        if attempts == 1 and response is not None and response[0].status_code == 200:
            if before_retry is not None:
                before_retry()
            return 0.0
        return None

    store._client.meta.events.register_first("needs-retry.s3.PutObject", resend_once)


def test_s3_put_whose_reply_was_lost_is_still_ours(s3_store: S3ObjectStore) -> None:
    _lose_first_put_reply(s3_store)
    # The resent request meets our own object: 412, yet the put did create it.
    assert s3_store.put_if_absent("ns/t/0/seg", b"ours") is True
    assert s3_store.get("ns/t/0/seg") == b"ours"
    # A later put meets the object on its first attempt: not ours, even with equal bytes.
    assert s3_store.put_if_absent("ns/t/0/seg", b"ours") is False


def test_s3_put_retried_into_someone_elses_object_is_not_ours(
    s3_store: S3ObjectStore, s3_server: Any
) -> None:
    rival = _s3_store(s3_server, s3_store.bucket)

    def rival_replaces_it() -> None:
        rival.delete("ns/t/0/seg")
        assert rival.put_if_absent("ns/t/0/seg", b"theirs") is True

    _lose_first_put_reply(s3_store, rival_replaces_it)
    assert s3_store.put_if_absent("ns/t/0/seg", b"ours") is False
    assert s3_store.get("ns/t/0/seg") == b"theirs"
    rival.close()


def test_s3_over_https_checks_the_endpoint_against_the_ca_file(tmp_path: Path) -> None:
    """KAFSCALE_S3_CA_FILE: an https endpoint signed by a private CA is trusted with that CA and
    refused without it (a real TLS server answering HeadBucket)."""
    pki = make_pki(tmp_path / "pki")

    class Bucket(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Bucket)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pki.server_cert, pki.server_key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    endpoint = f"https://127.0.0.1:{server.server_address[1]}"
    try:
        trusted = S3ObjectStore(
            "kafscale", "us-east-1", endpoint, True, "key", "secret", 2, 1, ca_file=str(pki.ca_file)
        )
        trusted.check()
        trusted.close()
        for ca_file in (str(pki.other_ca_file), None):
            untrusted = S3ObjectStore(
                "kafscale", "us-east-1", endpoint, True, "key", "secret", 2, 1, ca_file=ca_file
            )
            with pytest.raises(ObjectStoreUnavailable, match=r"certificate|SSL"):
                untrusted.check()
            untrusted.close()
    finally:
        server.shutdown()
        server.server_close()
