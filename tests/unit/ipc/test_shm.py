"""Shared-memory partition buffers: the append/publish protocol, generations, cross-process readers
and the /dev/shm lifecycle (resource tracker, destroy, SIGKILL leftovers, sweeping, re-adoption).

Every test uses its own run id, so parallel runs never share a segment name; the run fixtures sweep
the run afterwards and fail the test if anything was left behind.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import signal
import struct
import subprocess
import sys
import textwrap
import time
import uuid
import zlib
from collections.abc import Iterator
from multiprocessing.synchronize import Event
from typing import Any

import pytest

from kafscale.ipc import shm as buffer
from kafscale.ipc.shm import (
    DATA_START,
    SHM_DIR,
    VERSION,
    BufferFormatError,
    BufferFull,
    BufferOwner,
    BufferSealed,
    PartitionBuffer,
    StaleBufferError,
    run_prefix,
    segment_name,
    shard_segments,
    sweep_segments,
    unlink_segment,
)

SPAWN = mp.get_context("spawn")
CHUNK = struct.Struct("<III")  # sequence number, payload length, CRC32 of the payload


@pytest.fixture
def run_id() -> Iterator[str]:
    rid = uuid.uuid4().hex[:12]
    yield rid
    assert sweep_segments(rid) == [], "the test left segments in /dev/shm"


@pytest.fixture
def other_run_id(run_id: str) -> Iterator[str]:
    """A second run whose id extends the first: prefixes must not confuse them."""
    rid = run_id + "z"
    yield rid
    assert sweep_segments(rid) == [], "the test left segments in /dev/shm"


@pytest.fixture
def owner(run_id: str) -> Iterator[PartitionBuffer]:
    buf = PartitionBuffer.create(segment_name(run_id, 0, 0), capacity=4096, base_offset=100)
    yield buf
    buf.destroy()


def on_disk(run_id: str) -> list[str]:
    return sorted(n for n in os.listdir(SHM_DIR) if n.startswith(run_prefix(run_id)))


def chunk(seq: int) -> bytes:
    """Self-describing chunk: a reader can tell a complete one from stale or unwritten bytes."""
    payload = random.Random(seq).randbytes(1 + seq * 7919 % 300)
    return CHUNK.pack(seq, len(payload), zlib.crc32(payload)) + payload


def write_raw_segment(name: str, content: bytes) -> None:
    """A /dev/shm entry made without SharedMemory, so no resource tracker is involved."""
    fd = os.open(os.path.join(SHM_DIR, name), os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.write(fd, content)
    finally:
        os.close(fd)


# -- names ------------------------------------------------------------------------------------


def test_segment_names_share_the_run_prefix() -> None:
    assert segment_name("3fa9c2", 4, 17) == "kafscale-3fa9c2-s4-b17"
    assert segment_name("3fa9c2", 4, 17).startswith(run_prefix("3fa9c2"))
    for bad in ("", "a-b", "../x", "a" * 33):
        with pytest.raises(ValueError):
            segment_name(bad, 0, 0)
    with pytest.raises(ValueError):
        segment_name("abc", -1, 0)


# -- single process: append, view, full, seal, reset ------------------------------------------


def test_append_publishes_and_view_covers_committed_bytes(owner: PartitionBuffer) -> None:
    assert owner.append(b"hello", records=2) == 0
    assert owner.append(memoryview(b"-world"), records=3) == 5
    state = owner.snapshot()
    assert (state.committed, state.batch_count, state.record_count) == (11, 2, 5)
    assert (state.base_offset, state.sealed, state.generation) == (100, False, 0)

    reader = PartitionBuffer.attach(owner.name)
    try:
        view = reader.view(0, 11, state.generation)
        assert bytes(view) == b"hello-world"
        assert view.readonly
        with pytest.raises(TypeError):
            view[0] = 0
        assert reader.read(6, 11) == b"world"
        with pytest.raises(ValueError, match="outside committed"):
            reader.view(0, 12, state.generation)
        with pytest.raises(PermissionError):
            reader.append(b"x")
        owner.append(b"!")
        assert reader.read(0, reader.snapshot().committed) == b"hello-world!"
        view.release()
    finally:
        reader.close()


def test_buffer_full_exactly_at_the_capacity_boundary(run_id: str) -> None:
    with PartitionBuffer.create(segment_name(run_id, 0, 0), capacity=64) as buf:
        try:
            with pytest.raises(BufferFull):
                buf.append(bytes(65))
            assert buf.append(bytes(60)) == 0
            assert buf.append(b"\xff" * 4) == 60  # exactly fills the buffer
            with pytest.raises(BufferFull):
                buf.append(b"x")
            state = buf.snapshot()
            assert (state.committed, state.batch_count) == (64, 2)
            assert buf.read(60, 64) == b"\xff" * 4
        finally:
            buf.destroy()


def test_seal_rejects_appends_and_keeps_the_data(owner: PartitionBuffer) -> None:
    owner.append(b"batch")
    owner.seal()
    with pytest.raises(BufferSealed):
        owner.append(b"more")
    state = owner.snapshot()
    assert state.sealed
    assert state.committed == 5
    assert owner.read(0, 5) == b"batch"


def test_reset_bumps_generation_and_generation_checked_reads_detect_reuse(
    owner: PartitionBuffer, monkeypatch: pytest.MonkeyPatch
) -> None:
    owner.append(b"old-generation", records=1)
    owner.seal()
    reader = PartitionBuffer.attach(owner.name)
    try:
        before = reader.snapshot()
        assert reader.read(0, before.committed, before.generation) == b"old-generation"

        owner.reset(base_offset=200)
        after = reader.snapshot()
        assert after.generation == before.generation + 1
        assert (after.committed, after.base_offset, after.sealed) == (0, 200, False)
        assert (after.batch_count, after.record_count) == (0, 0)
        assert reader.read(0, before.committed, before.generation) is None
        assert not reader.is_current(before.generation)
        with pytest.raises(StaleBufferError):
            reader.view(0, before.committed, before.generation)

        owner.append(b"NEW-GENERATION")
        assert reader.read(0, 14, after.generation) == b"NEW-GENERATION"

        # A reset that lands between a reader's snapshot and its copy: the bytes copied belong to
        # the new generation, and the re-check after the copy must refuse them.
        current = reader.snapshot()
        monkeypatch.setattr(reader, "snapshot", lambda timeout=1.0: current)
        owner.reset(base_offset=300)
        owner.append(b"third-gen-data")
        assert reader.read(0, 14) is None
    finally:
        reader.close()


def test_snapshot_waits_out_an_odd_seq_and_readoption_repairs_it(owner: PartitionBuffer) -> None:
    owner.append(b"acked")
    seq_at = buffer._OFFSET["seq"]
    seq = struct.unpack_from("<Q", owner._mem, seq_at)[0]
    struct.pack_into("<Q", owner._mem, seq_at, seq + 1)  # an owner killed mid-update
    reader = PartitionBuffer.attach(owner.name)
    try:
        with pytest.raises(TimeoutError, match="mid-update"):
            reader.snapshot(timeout=0.05)
        adopted = PartitionBuffer.attach(owner.name, writable=True)
        try:
            assert adopted.interrupted
            assert reader.snapshot().committed == 5
        finally:
            adopted.close()
    finally:
        reader.close()


# -- views and close ----------------------------------------------------------------------------


def test_close_releases_handed_out_views_and_reports_foreign_ones(owner: PartitionBuffer) -> None:
    owner.append(b"0123456789")
    reader = PartitionBuffer.attach(owner.name)
    gen = reader.snapshot().generation
    forgotten = reader.view(0, 10, gen)
    sliced = reader.view(0, 10, gen)[2:4]  # a slice the buffer never saw
    with pytest.raises(BufferError, match="still alive"):
        reader.close()
    sliced.release()
    reader.close()
    reader.close()  # idempotent
    with pytest.raises(ValueError):
        bytes(forgotten)  # released by close(), not left pointing at an unmapped region


# -- another process ----------------------------------------------------------------------------


def _verify_chunks(name: str, ready: Event, progress: Any, results: Any) -> None:
    """Reader process: follow the committed position and verify every chunk under it."""
    buf = PartitionBuffer.attach(name)
    try:
        ready.set()
        generation, pos, expected, positions = -1, 0, 1, set()
        while True:
            state = buf.snapshot()
            if state.generation != generation:  # reused: the new generation starts at 0
                generation, pos = state.generation, 0
            positions.add((generation, state.committed))
            try:
                view = buf.view(pos, state.committed, generation)
            except StaleBufferError:  # reset between snapshot and view: nothing read, look again
                continue
            with view:
                off = 0
                while off < len(view):
                    seq, length, crc = CHUNK.unpack_from(view, off)
                    start, off = off + CHUNK.size, off + CHUNK.size + length
                    if seq != expected or off > len(view):
                        raise AssertionError(f"chunk {expected} expected, got {seq} at {pos}")
                    with view[start:off] as payload:
                        if zlib.crc32(payload) != crc:
                            raise AssertionError(f"chunk {seq} is torn")
                    expected += 1
            idle, pos = pos == state.committed, state.committed
            progress.value = expected - 1
            if state.sealed:
                results.put(("ok", expected - 1, len(positions)))
                return
            if idle:
                time.sleep(0)
    except BaseException as exc:
        results.put(("error", repr(exc), 0))
    finally:
        buf.close()


def _wait_for(progress: Any, at_least: int, reader: Any, results: Any) -> None:
    deadline = time.monotonic() + 60
    while progress.value < at_least:
        if not reader.is_alive():
            raise AssertionError(f"reader process ended: {results.get(timeout=10)}")
        assert time.monotonic() < deadline, f"reader stuck at chunk {progress.value}"
        time.sleep(0.001)


def test_reader_in_another_process_sees_only_complete_chunks(run_id: str) -> None:
    total, handshake_every = 4000, 400
    owner = PartitionBuffer.create(segment_name(run_id, 0, 0), capacity=1 << 20)
    ready, progress, results = SPAWN.Event(), SPAWN.Value("q", 0), SPAWN.Queue()
    reader = SPAWN.Process(target=_verify_chunks, args=(owner.name, ready, progress, results))
    reader.start()
    try:
        assert ready.wait(60)
        for seq in range(1, total + 1):
            if seq == total // 2 + 1:
                # Reuse the buffer once the reader has let go of the first generation, so the
                # second one is written over stale but valid-looking chunks, not zeros.
                _wait_for(progress, seq - 1, reader, results)
                owner.reset(base_offset=seq)
            owner.append(chunk(seq), records=1)
            if seq % handshake_every == 0:  # the reader observes many intermediate positions
                _wait_for(progress, seq, reader, results)
        owner.seal()
        outcome, verified, positions = results.get(timeout=60)
        assert outcome == "ok", verified
        assert verified == total
        assert positions >= total // handshake_every
        reader.join(30)
        assert reader.exitcode == 0
    finally:
        if reader.is_alive():
            reader.kill()
            reader.join()
        owner.destroy()


READER_SCRIPT = textwrap.dedent(
    """
    import sys
    from multiprocessing import resource_tracker
    from multiprocessing.shared_memory import SharedMemory
    from kafscale.ipc.shm import DATA_START, PartitionBuffer

    name, how = sys.argv[1], sys.argv[2]
    if how == "buffer":
        buf = PartitionBuffer.attach(name)
        print(buf.read(0, buf.snapshot().committed).decode())
        buf.close()
    else:  # a plain SharedMemory attach, the way the resource tracker bug bites
        shm = SharedMemory(name)
        print(bytes(shm.buf[DATA_START : DATA_START + 5]).decode())
        shm.close()
    # Stop this interpreter's resource tracker now and wait for it: it does its exit-time
    # unlinking here instead of racing the test after the process is gone.
    resource_tracker._resource_tracker._stop()
    """
)


def test_reader_process_exit_does_not_unlink_the_segment(run_id: str) -> None:
    kept = PartitionBuffer.create(segment_name(run_id, 0, 0), capacity=4096)
    victim = PartitionBuffer.create(segment_name(run_id, 0, 1), capacity=4096)
    try:
        for buf in (kept, victim):
            buf.append(b"acked")
            out = subprocess.run(
                [sys.executable, "-c", READER_SCRIPT, buf.name, "buffer" if buf is kept else "raw"],
                capture_output=True,
                text=True,
                timeout=60,
                check=True,
            )
            assert out.stdout.strip() == "acked"
        # The control shows the bug is real on this Python and that the check above can see it.
        assert on_disk(run_id) == [kept.name]
        with PartitionBuffer.attach(kept.name) as again:
            assert again.read(0, 5) == b"acked"
    finally:
        kept.destroy()
        victim.destroy()  # its name is gone already; the mapping still needs closing


# -- lifecycle: destroy, SIGKILL, sweep, re-adoption, foreign segments --------------------------


def test_destroy_unlinks_but_attached_readers_keep_their_mapping(owner: PartitionBuffer) -> None:
    owner.append(b"bytes")
    reader = PartitionBuffer.attach(owner.name)
    try:
        assert owner.name in os.listdir(SHM_DIR)
        owner.destroy()
        assert owner.name not in os.listdir(SHM_DIR)
        with pytest.raises(FileNotFoundError):
            PartitionBuffer.attach(owner.name)
        assert reader.read(0, 5) == b"bytes"
    finally:
        reader.close()


def _own_and_hang(names: list[str], ready: Event) -> None:
    buffers = [PartitionBuffer.create(name, capacity=4096) for name in names]
    for i, buf in enumerate(buffers):
        buf.append(f"unflushed-{i}".encode(), records=1)
    ready.set()
    signal.pause()  # until the test SIGKILLs us


def test_sigkilled_owner_leaves_segments_until_swept(run_id: str, other_run_id: str) -> None:
    names = [segment_name(run_id, 0, 0), segment_name(run_id, 1, 0), segment_name(run_id, 1, 1)]
    bystander = PartitionBuffer.create(segment_name(other_run_id, 0, 0), capacity=64)
    ready = SPAWN.Event()
    shard = SPAWN.Process(target=_own_and_hang, args=(names, ready))
    shard.start()
    try:
        assert ready.wait(60)
        assert shard.pid is not None
        os.kill(shard.pid, signal.SIGKILL)
        shard.join(30)
        assert shard.exitcode == -signal.SIGKILL
        assert on_disk(run_id) == sorted(names)

        # The restarted shard 0 re-adopts its buffer: contents and position intact.
        adopted = PartitionBuffer.attach(names[0], writable=True)
        try:
            state = adopted.snapshot()
            assert (state.committed, state.batch_count, state.record_count) == (11, 1, 1)
            assert not adopted.interrupted
            assert adopted.read(0, 11) == b"unflushed-0"
            assert adopted.append(b"+more") == 11
            assert adopted.read(0, 16) == b"unflushed-0+more"
        finally:
            adopted.destroy()

        assert sweep_segments(run_id) == sorted(names[1:])
        assert on_disk(run_id) == []
        assert on_disk(other_run_id) == [bystander.name]
    finally:
        if shard.is_alive():
            shard.kill()
            shard.join()
        bystander.destroy()


def test_shard_segments_lists_only_that_shard_with_slots(run_id: str) -> None:
    slots = ((1, 0), (1, 12), (10, 0), (2, 0), (1, 3))
    names = [segment_name(run_id, shard, slot) for shard, slot in slots]
    buffers = [PartitionBuffer.create(name, capacity=64) for name in names]
    stray = f"{run_prefix(run_id)}s1-junk"
    write_raw_segment(stray, b"x")
    try:
        assert shard_segments(run_id, 1) == sorted(
            [(names[0], 0), (names[1], 12), (names[4], 3), (stray, None)]
        )
        assert on_disk(run_id) == sorted([*names, stray])  # listing removes nothing
        assert unlink_segment(stray)
        assert not unlink_segment(stray)
    finally:
        for buf in buffers:
            buf.destroy()


@pytest.mark.parametrize(
    ("content", "error"),
    [
        (b"NOPE" + bytes(4092), "not a KafScale buffer"),
        (b"KSBF" + bytes(12), "not a KafScale buffer"),  # shorter than the header
        (b"KSBF" + struct.pack("<IQ", 99, 0) + bytes(DATA_START), "layout version 99"),
        (b"KSBF" + struct.pack("<IQ", 1, 0) + bytes(DATA_START), "layout version 1,"),
        (b"KSBF" + struct.pack("<IQ", VERSION, 1 << 20) + bytes(DATA_START), "claims 1048576"),
        (b"", "empty"),
    ],
)
def test_attach_refuses_what_is_not_a_buffer(run_id: str, content: bytes, error: str) -> None:
    name = segment_name(run_id, 0, 0)
    write_raw_segment(name, content)
    for writable in (False, True):
        with pytest.raises(BufferFormatError, match=error):
            PartitionBuffer.attach(name, writable=writable)
    assert on_disk(run_id) == [name]  # a refused attach leaves the segment alone
    assert sweep_segments(run_id) == [name]


def test_create_refuses_an_existing_name_and_attach_a_missing_one(owner: PartitionBuffer) -> None:
    with pytest.raises(FileExistsError):
        PartitionBuffer.create(owner.name, capacity=64)
    with pytest.raises(FileNotFoundError):
        PartitionBuffer.attach(owner.name + "-missing")
    assert DATA_START + owner.capacity == os.stat(os.path.join(SHM_DIR, owner.name)).st_size


# -- the header a successor adopts by: owner, seal time and codec, truncation ---------------------


def test_owner_is_in_the_header_before_the_magic(run_id: str) -> None:
    owner = BufferOwner("orders.eu", str(uuid.UUID(int=5)), 7, topic_created_ms=1_700_000_000_123)
    with PartitionBuffer.create(segment_name(run_id, 0, 1), 64, 40, owner=owner, codec=2) as buf:
        try:
            assert buf.owner() == owner
            with PartitionBuffer.attach(buf.name) as reader:
                assert reader.owner() == owner
                state = reader.snapshot()
                assert (state.base_offset, state.codec, state.sealed_ms) == (40, 2, 0)
        finally:
            buf.destroy()
    with PartitionBuffer.create(segment_name(run_id, 0, 2), capacity=64) as anonymous:
        try:
            with pytest.raises(BufferFormatError, match="no owner"):
                anonymous.owner()
        finally:
            anonymous.destroy()
    for bad in (
        BufferOwner("t" * 257, "id", 0),
        BufferOwner("", "id", 0),
        BufferOwner("t", "i" * 49, 0),
        BufferOwner("t", "id", -1),
    ):
        with pytest.raises(ValueError):
            PartitionBuffer.create(segment_name(run_id, 0, 3), capacity=64, owner=bad)
    assert on_disk(run_id) == []  # a refused identity creates nothing


def test_a_garbled_owner_is_refused(owner: PartitionBuffer) -> None:
    topic_at = buffer._OFFSET["topic"]
    length_at = buffer._OFFSET["topic_length"]
    struct.pack_into("<Q", owner._mem, length_at, 2)
    owner._mem[topic_at : topic_at + 2] = b"\xff\xfe"
    struct.pack_into("<Q", owner._mem, buffer._OFFSET["topic_id"], 0x41)  # "A"
    with pytest.raises(BufferFormatError, match="does not decode"):
        owner.owner()
    struct.pack_into("<Q", owner._mem, length_at, 1 << 40)
    with pytest.raises(BufferFormatError, match="no owner"):
        owner.owner()


def test_seal_records_time_and_codec_and_reset_clears_the_time(owner: PartitionBuffer) -> None:
    owner.append(b"batch")
    owner.seal(sealed_ms=1234, codec=3)
    state = owner.snapshot()
    assert (state.sealed, state.sealed_ms, state.codec) == (True, 1234, 3)
    with PartitionBuffer.attach(owner.name, writable=True) as successor:
        # what a successor reads back, without any knowledge of its predecessor's memory
        again = successor.snapshot()
        assert (again.sealed, again.sealed_ms, again.codec, again.committed) == (True, 1234, 3, 5)
    owner.reset(base_offset=200)
    state = owner.snapshot()
    assert (state.sealed, state.sealed_ms, state.codec) == (False, 0, 3)


def test_truncate_drops_a_tail_without_touching_the_prefix(owner: PartitionBuffer) -> None:
    owner.append(b"whole", records=1)
    owner.append(b"torn!", records=1)
    with PartitionBuffer.attach(owner.name) as reader:
        owner.truncate(5, batch_count=1, record_count=1)
        state = reader.snapshot()
        assert (state.committed, state.batch_count, state.record_count) == (5, 1, 1)
        assert reader.read(0, 5) == b"whole"
        with pytest.raises(ValueError, match="outside committed"):
            reader.read(0, 10)
        with pytest.raises(ValueError, match="cannot truncate"):
            owner.truncate(6, 1, 1)  # only ever shrinks
        with pytest.raises(PermissionError):
            reader.truncate(0, 0, 0)
    assert owner.append(b"+next") == 5  # the owner appends after the kept prefix
