"""Per-partition append buffers in POSIX shared memory (Linux /dev/shm).

A shard owns one buffer per open segment of a partition and is its only writer (one thread); the
flusher attaches by name and reads committed bytes in place. This module owns the layout, the
publication protocol and the segment names. Data is opaque.

Protocol, one writer and many reader processes:

- ``append`` copies the bytes past ``committed`` and only THEN publishes the new ``committed``.
  Bytes below ``committed`` never change within a generation.
- Header fields readers need together are published under a sequence lock: the writer makes
  ``seq`` odd, stores the fields, makes it even; ``snapshot()`` retries until it reads the same
  even ``seq`` before and after.
- ``reset(base_offset)`` bumps ``generation`` (zeroing ``committed``) before any old byte is
  overwritten, so positions mean something only within one generation. ``read()`` copies, then
  re-reads the generation: unchanged means the copy is intact, else it returns None. ``view()``
  is zero-copy and cannot be checked afterwards: the caller holds a lease (the owner resets only
  after the flusher released the buffer, arranged over IPC) and ``is_current(generation)`` after
  use says whether the lease was honoured.

Memory model: header words are 8-byte aligned and each is stored or loaded by one ``struct`` call;
on a little-endian host ``"<Q"`` uses CPython's native packer, a fixed 8-byte memcpy compiled to
one store/load, so no word is torn. x86-64 is TSO: other cores see our stores in program order and
loads are not reordered with loads; the interpreter issues each step as a separate C call in
program order, and the GIL (per process) orders nothing across processes. So "data, then
committed" (writer) and "seq, header, seq, data, generation" (reader) are enough. arm64 may make
stores visible out of order and pure Python cannot emit a fence: there neither ordering is
guaranteed, only made unlikely by the thousands of instructions between the stores, so on arm64
check the CRC32C each record batch carries before serving it (a small C fence helper would fix it).

Lifecycle: segments are files in ``SHM_DIR`` mapped with ``mmap`` (``_Segment``), not
``multiprocessing.shared_memory.SharedMemory``: Python 3.11's resource tracker registers every
SharedMemory, attach included, and unlinks it when the registering process tree exits (a reader's
exit would destroy a shard's buffer), and registering and unregistering each cost a round trip to
the tracker process (with a buffer per partition per flush cycle, ~12% of the flusher's upload
threads). The owner unlinks on ``destroy()``, readers only ``close()``, the supervisor sweeps a
run's leftovers when the broker stops. A SIGKILLed shard's
segments stay, so its successor (same run, same shard index) re-adopts them: ``shard_segments``
lists them, ``attach(name, writable=True)`` takes one over (repairing a seqlock its predecessor
left odd, see ``interrupted``), and the header says whose buffer it is (``owner()``: topic, topic
id, partition, written at create before the magic) and how it was sealed (``sealed_ms``, ``codec``,
so a re-flush builds the same segment bytes). ``kafscale.shards.adoption`` decides what of it to
keep; ``truncate`` drops a tail that did not verify.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
import time
import weakref
from dataclasses import dataclass

# The names live in their own module; imported here too, where callers have always found them.
from kafscale.ipc.shm_names import SHM_DIR as SHM_DIR
from kafscale.ipc.shm_names import run_prefix as run_prefix
from kafscale.ipc.shm_names import segment_name as segment_name
from kafscale.ipc.shm_names import shard_segments as shard_segments
from kafscale.ipc.shm_names import sweep_segments as sweep_segments
from kafscale.ipc.shm_names import unlink_segment as unlink_segment

MAGIC = b"KSBF"
VERSION = 2  # 2: the owner's identity, sealed_ms and codec in the header
TOPIC_BYTES = 256  # room for a topic name (Kafka allows 249 characters)
TOPIC_ID_BYTES = 48  # room for a topic id's text form (a UUID takes 36)

_HEADER_FIELDS: tuple[tuple[str, str], ...] = (
    ("magic", "4s"),  # b"KSBF": we refuse to attach to anything else in /dev/shm
    ("version", "I"),  # layout version of this header
    ("capacity", "Q"),  # bytes in the data region that follows the header
    ("seq", "Q"),  # seqlock: odd while the writer changes the fields below
    ("generation", "Q"),  # bumped by reset(); positions are meaningful within one generation
    ("committed", "Q"),  # bytes of data that are complete and visible to readers
    ("base_offset", "q"),  # Kafka offset of the first batch in the buffer
    ("sealed", "Q"),  # 1 once seal() ran: no more appends in this generation
    ("batch_count", "Q"),  # appends since the last reset
    ("record_count", "Q"),  # records in those appends, as the writer reported them
    ("sealed_ms", "q"),  # when seal() ran (0 before): the segment's created time in S3
    ("codec", "Q"),  # the codec the flusher applies, as of create, then as of seal
    # The owner's identity: written at create, before the magic, never changed afterwards.
    ("partition", "q"),
    ("topic_created_ms", "q"),  # tells a topic from an earlier one of the same name
    ("topic_id", f"{TOPIC_ID_BYTES}s"),  # text, NUL-padded
    ("topic_length", "Q"),  # bytes of the topic name below
    ("topic", f"{TOPIC_BYTES}s"),  # UTF-8, NUL-padded
)
HEADER = struct.Struct("<" + "".join(fmt for _, fmt in _HEADER_FIELDS))
_AT = {name: i for i, (name, _) in enumerate(_HEADER_FIELDS)}  # index in HEADER.unpack()
# The fields up to the identity, the ones the writer changes: what snapshot() unpacks.
_LIVE = struct.Struct("<" + "".join(fmt for _, fmt in _HEADER_FIELDS[: _AT["partition"]]))
_OFFSET = {
    name: struct.calcsize("<" + "".join(fmt for _, fmt in _HEADER_FIELDS[:i]))
    for i, (name, _) in enumerate(_HEADER_FIELDS)
}
_WORD = {name: struct.Struct("<" + fmt) for name, fmt in _HEADER_FIELDS if fmt in ("Q", "q")}
assert all(_OFFSET[name] % 8 == 0 for name in _WORD), "header words must be 8-byte aligned"
DATA_START = -(-HEADER.size // 64) * 64  # the data region starts at the next cache line

_EMPTY = {"committed": 0, "sealed": 0, "batch_count": 0, "record_count": 0, "sealed_ms": 0}


class PartitionBufferError(Exception):
    """Base of this module's errors."""


class BufferFull(PartitionBufferError):
    """The append does not fit: seal this buffer and roll to a new one."""


class BufferSealed(PartitionBufferError):
    """The buffer was sealed; appends go to the next buffer."""


class BufferFormatError(PartitionBufferError):
    """The named segment is not a KafScale partition buffer of this layout."""


class StaleBufferError(PartitionBufferError):
    """The buffer was reset since the caller read its positions."""


@dataclass(frozen=True, slots=True)
class BufferState:
    """A consistent snapshot of the header fields readers need, in header order."""

    generation: int
    committed: int
    base_offset: int
    sealed: bool
    batch_count: int
    record_count: int
    sealed_ms: int
    codec: int


@dataclass(frozen=True, slots=True)
class BufferOwner:
    """Whose buffer it is: the partition of one incarnation of a topic."""

    topic: str
    topic_id: str
    partition: int
    topic_created_ms: int = 0

    def encode(self) -> tuple[int, int, bytes, int, bytes]:
        """The header's identity fields, in header order; ValueError if they do not fit."""
        topic, topic_id = self.topic.encode(), self.topic_id.encode()
        if not 0 < len(topic) <= TOPIC_BYTES or not 0 < len(topic_id) <= TOPIC_ID_BYTES:
            raise ValueError(f"topic {self.topic!r} or topic id {self.topic_id!r} does not fit")
        if self.partition < 0:
            raise ValueError(f"partition must be >= 0, got {self.partition}")
        return self.partition, self.topic_created_ms, topic_id, len(topic), topic


NO_OWNER = (0, 0, b"", 0, b"")  # a buffer nobody claims (tests); adoption discards it


class _Segment:
    """One shared-memory segment, mapped: ``buf`` (the whole of it), ``size``, ``name``."""

    def __init__(self, name: str, create: bool, size: int) -> None:
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(os.path.join(SHM_DIR, name), flags, 0o600)  # FileExistsError/NotFound
        try:
            if create:
                os.ftruncate(fd, size)
            else:
                size = os.fstat(fd).st_size
            self._mmap: mmap.mmap | None = mmap.mmap(fd, size)  # ValueError if empty
        finally:
            os.close(fd)
        self.name, self.size = name, size
        self.buf: memoryview | None = memoryview(self._mmap)

    def close(self) -> None:
        """Unmap; BufferError while a view of ``buf`` is still alive (try again after)."""
        if self.buf is not None:
            self.buf.release()
            self.buf = None
        if self._mmap is not None:
            self._mmap.close()
            self._mmap = None


def _open(name: str, create: bool, size: int = 0) -> _Segment:
    """Open (or create, sized) a segment whose lifecycle is ours alone."""
    if not name or "/" in name:
        raise ValueError(f"invalid segment name {name!r}")
    try:
        return _Segment(name, create, size)
    except ValueError as exc:  # mmap refuses an empty file
        raise BufferFormatError(f"segment {name!r} is empty: not a KafScale buffer") from exc


class PartitionBuffer:
    """One append buffer: the owner appends, seals and resets; readers snapshot and read."""

    _seq: int
    _committed: int
    _batches: int
    _records: int

    def __init__(self, shm: _Segment, writable: bool) -> None:
        """Use create() or attach(): this wraps an already validated segment."""
        assert shm.buf is not None
        self._shm: _Segment | None = shm
        self.name, self.writable = shm.name, writable
        self._mem = shm.buf if writable else shm.buf.toreadonly()
        fields = _LIVE.unpack_from(self._mem)
        self.capacity: int = fields[_AT["capacity"]]
        self._data = self._mem[DATA_START : DATA_START + self.capacity]
        self._ro = self._data.toreadonly()
        self._exported: list[weakref.ref[memoryview]] = []
        # The writer's own copy of what it publishes; it is the only one changing the header.
        self._seq = fields[_AT["seq"]]
        self._committed = fields[_AT["committed"]]
        self._batches = fields[_AT["batch_count"]]
        self._records = fields[_AT["record_count"]]
        self._sealed = bool(fields[_AT["sealed"]])
        # An owner that died between the two seq stores left it odd; readers would wait forever.
        # The header may then be half-updated: the new owner must verify what it adopts (batch
        # framing and CRCs) and must not trust ``sealed``: a seal that never finished was never
        # followed by a flush.
        self.interrupted = writable and bool(self._seq & 1)
        if self.interrupted:
            self._seq += 1
            _WORD["seq"].pack_into(self._mem, _OFFSET["seq"], self._seq)

    @classmethod
    def create(
        cls,
        name: str,
        capacity: int,
        base_offset: int = 0,
        *,
        owner: BufferOwner | None = None,
        codec: int = 0,
        generation: int = 0,
    ) -> PartitionBuffer:
        """Create a new segment (FileExistsError if the name is taken) and own it, starting at
        ``generation``: a name a dead predecessor used may come back, and a reader still holding
        the old buffer's generation must not take the new one's bytes for it."""
        if capacity <= 0:
            raise ValueError(f"capacity must be positive, got {capacity}")
        identity = owner.encode() if owner is not None else NO_OWNER
        shm = _open(name, create=True, size=DATA_START + capacity)
        assert shm.buf is not None
        # Magic goes in last: a reader racing the creation sees "not a buffer", never half a
        # header, and a successor adopting it never finds a buffer without its owner.
        live = (bytes(4), VERSION, capacity, 0, generation, 0, base_offset, 0, 0, 0, 0, codec)
        HEADER.pack_into(shm.buf, 0, *live, *identity)
        shm.buf[0:4] = MAGIC
        return cls(shm, writable=True)

    @classmethod
    def attach(cls, name: str, writable: bool = False) -> PartitionBuffer:
        """Attach to an existing segment; writable=True re-adopts it as owner after a restart.

        The caller guarantees the previous owner is dead: this module does no fencing.
        """
        shm = _open(name, create=False)
        try:
            _validate(shm)
        except BaseException:
            shm.close()
            raise
        return cls(shm, writable)

    def owner(self) -> BufferOwner:
        """The identity written at create; BufferFormatError if there is none or it is garbled."""
        fields = HEADER.unpack_from(self._mem)
        partition, created, topic_id, length, topic = fields[_AT["partition"] :]
        if not 0 < length <= TOPIC_BYTES or partition < 0 or not topic_id.rstrip(b"\0"):
            raise BufferFormatError(f"{self.name}: no owner in the header")
        try:
            return BufferOwner(
                topic[:length].decode(), topic_id.rstrip(b"\0").decode(), partition, created
            )
        except UnicodeDecodeError as exc:
            raise BufferFormatError(f"{self.name}: the owner does not decode: {exc}") from None

    # -- writer: the owning shard -----------------------------------------------------------

    def append(self, data: bytes | bytearray | memoryview, *, records: int = 0) -> int:
        """Copy data in, then publish it; return its start. `records` feeds record_count."""
        self._require_writer()
        if self._sealed:
            raise BufferSealed(f"{self.name} is sealed")
        src = memoryview(data).cast("B")
        start = self._committed
        end = start + src.nbytes
        if end > self.capacity:
            raise BufferFull(f"{self.name}: {src.nbytes} bytes do not fit at {start}")
        self._data[start:end] = src  # the bytes first ...
        self._committed = end
        self._batches += 1
        self._records += records
        # ... then the position that makes them visible
        self._publish(committed=end, batch_count=self._batches, record_count=self._records)
        return start

    def seal(self, *, sealed_ms: int | None = None, codec: int | None = None) -> None:
        """Refuse further appends in this generation; record when, and the codec to flush with
        (both go into the segment, so a successor re-flushing it builds the same bytes)."""
        self._require_writer()
        self._sealed = True
        fields = {"sealed": 1}
        if sealed_ms is not None:
            fields["sealed_ms"] = sealed_ms
        if codec is not None:
            fields["codec"] = codec
        self._publish(**fields)

    def truncate(self, committed: int, batch_count: int, record_count: int) -> None:
        """Owner only, on adoption: shrink ``committed`` to the prefix that verified. No byte
        changes, so readers of the kept prefix are unaffected."""
        self._require_writer()
        if not 0 <= committed <= min(self._committed, self.capacity):
            raise ValueError(f"{self.name}: cannot truncate {self._committed} to {committed}")
        self._committed, self._batches, self._records = committed, batch_count, record_count
        self._publish(committed=committed, batch_count=batch_count, record_count=record_count)

    def reset(self, base_offset: int) -> None:
        """Start a new, empty generation at base_offset (after the flusher released the buffer)."""
        self._require_writer()
        self._committed = self._batches = self._records = 0
        self._sealed = False
        self._publish(generation=self.generation + 1, base_offset=base_offset, **_EMPTY)

    def _publish(self, **fields: int) -> None:
        mem, seq = self._mem, _WORD["seq"]
        self._seq += 1
        seq.pack_into(mem, _OFFSET["seq"], self._seq)  # odd: readers retry
        for name, value in fields.items():
            _WORD[name].pack_into(mem, _OFFSET[name], value)
        self._seq += 1
        seq.pack_into(mem, _OFFSET["seq"], self._seq)

    def _require_writer(self) -> None:
        if not self.writable:
            raise PermissionError(f"{self.name} is attached read-only")

    # -- readers: flusher, frontends (and the owner) ----------------------------------------

    def snapshot(self, timeout: float = 1.0) -> BufferState:
        """Read the header consistently; TimeoutError if the writer stays mid-update (crashed)."""
        mem, seq, seq_at = self._mem, _WORD["seq"], _OFFSET["seq"]
        spins, deadline = 0, 0.0
        while True:
            before = seq.unpack_from(mem, seq_at)[0]
            if not before & 1:
                fields = _LIVE.unpack_from(mem)
                if seq.unpack_from(mem, seq_at)[0] == before:
                    gen, committed, base, sealed, batches, records, sealed_ms, codec = fields[
                        _AT["generation"] :
                    ]
                    return BufferState(
                        gen, committed, base, bool(sealed), batches, records, sealed_ms, codec
                    )
            spins += 1
            if spins > 100:  # the writer was descheduled mid-update, or died there
                now = time.monotonic()
                deadline = deadline or now + timeout
                if now > deadline:
                    raise TimeoutError(f"{self.name}: writer stuck mid-update (seq {before})")
                time.sleep(0)

    @property
    def generation(self) -> int:
        return int(_WORD["generation"].unpack_from(self._mem, _OFFSET["generation"])[0])

    def is_current(self, generation: int) -> bool:
        """Whether no reset happened since `generation`: bytes read under it were intact."""
        return self.generation == generation

    def read(self, start: int, end: int, generation: int | None = None) -> bytes | None:
        """Copy committed bytes [start, end); None if the buffer was (or gets) reset meanwhile."""
        state = self.snapshot()
        if generation is not None and generation != state.generation:
            return None
        _check_range(start, end, state.committed)
        with self._ro[start:end] as src:
            data = bytes(src)
        return data if self.is_current(state.generation) else None

    def view(self, start: int, end: int, generation: int) -> memoryview:
        """Zero-copy read-only view of committed bytes [start, end) of `generation`.

        Valid only while the caller holds a lease on the buffer; release() it when done (close()
        releases those still open). StaleBufferError if the buffer is past `generation` already.
        """
        state = self.snapshot()
        if generation != state.generation:
            raise StaleBufferError(f"{self.name}: generation {generation} is gone")
        _check_range(start, end, state.committed)
        view = self._ro[start:end]
        if len(self._exported) >= 64:
            self._exported = [ref for ref in self._exported if ref() is not None]
        self._exported.append(weakref.ref(view))
        return view

    # -- lifecycle --------------------------------------------------------------------------

    def close(self) -> None:
        """Unmap this process's mapping; the segment itself stays. Idempotent.

        Views handed out by view() are released first. BufferError if the caller still holds a
        slice of one or an export (e.g. a pending send): release it and call close() again.
        """
        if self._shm is None:
            return
        for ref in self._exported:
            view = ref()
            if view is not None:
                with contextlib.suppress(BufferError):  # exported onwards: shm.close() says so
                    view.release()
        self._exported.clear()
        for view in (self._ro, self._data, self._mem):
            view.release()
        try:
            self._shm.close()
        except BufferError as exc:
            raise BufferError(f"{self.name}: a view of it is still alive; release it") from exc
        self._shm = None

    def destroy(self) -> None:
        """Owner only: unlink the segment, then close. Readers keep their mapping until close."""
        self._require_writer()
        with contextlib.suppress(FileNotFoundError):  # swept already
            os.unlink(os.path.join(SHM_DIR, self.name))
        self.close()

    def __enter__(self) -> PartitionBuffer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _validate(shm: _Segment) -> None:
    buf, name = shm.buf, shm.name
    assert buf is not None
    magic = bytes(buf[:4])
    if magic != MAGIC or shm.size < DATA_START:
        raise BufferFormatError(f"segment {name!r} is not a KafScale buffer (starts {magic!r})")
    _, version, capacity = _LIVE.unpack_from(buf)[:3]
    if version != VERSION:
        raise BufferFormatError(f"segment {name!r} has layout version {version}, not {VERSION}")
    if DATA_START + capacity > shm.size:
        raise BufferFormatError(f"segment {name!r} claims {capacity} bytes in {shm.size}")


def _check_range(start: int, end: int, committed: int) -> None:
    if not 0 <= start <= end <= committed:
        raise ValueError(f"range [{start}, {end}) is outside committed data [0, {committed})")
