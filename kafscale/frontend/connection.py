"""One client connection: read frames, process them concurrently, reply in request order.

Kafka lets a client pipeline requests on a connection but requires the responses in request
order. Each frame becomes a task as soon as it is read; a writer awaits the tasks in arrival order
and writes each response. At most ``MAX_IN_FLIGHT`` requests are in progress per connection; past
that the reader stops reading (TCP back-pressure) instead of buffering without bound.

A decode error (bad frame length, garbage, unknown API key) ends the connection after the
responses to the requests before it are written, with one log line saying why. Nothing that
happens on one connection affects another.

A client that goes away (EOF or reset) will read no more responses. Its parked fetches are
cancelled at once rather than waiting out their max wait (which would also hold up a shutdown);
every other request still runs to its end, as in Kafka: an acks=0 produce from a client that
closed right after sending must still land.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from kafscale import metrics
from kafscale.frontend import requests
from kafscale.frontend.context import Broker
from kafscale.protocol import codec
from kafscale.protocol.errors import DecodeError
from kafscale.protocol.framing import FrameDecoder

log = logging.getLogger(__name__)

MAX_IN_FLIGHT = 64
ABANDONABLE = {1}  # API keys safe to cut short when the client is gone: Fetch
READ_CHUNK = 256 * 1024
JOIN_BELOW = 16 * 1024


class Connection:
    def __init__(
        self, broker: Broker, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.broker = broker
        self.reader = reader
        self.writer = writer
        peer = writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self._in_flight: asyncio.Queue[asyncio.Task[requests.Response | None] | None] = (
            asyncio.Queue(MAX_IN_FLIGHT)
        )
        self._closing = asyncio.Event()
        self._peer_gone = False
        self._abandonable: set[asyncio.Task[requests.Response | None]] = set()
        self._waiting_to_read: asyncio.Task[None] | None = None

    async def serve(self) -> None:
        metrics.CONNECTIONS.inc()
        writer_task = asyncio.create_task(self._write_responses())
        try:
            await self._read_requests()
            if self._peer_gone:
                self._abandon()
        finally:
            await self._in_flight.put(None)
            await writer_task
            self.writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await self.writer.wait_closed()
            metrics.CONNECTIONS.dec()

    def close(self) -> None:
        """Stop reading; requests already read are still answered."""
        if self._closing.is_set():
            return
        self._closing.set()
        if self._waiting_to_read is not None:
            # Interrupt the read in progress (and only that: the task is not cancelled while
            # it queues a request it has read).
            self._waiting_to_read.cancel()

    async def _read(self) -> bytes | None:
        """The next bytes from the client; None once `close()` interrupted the wait."""
        self._waiting_to_read = asyncio.current_task()
        try:
            return await self.reader.read(READ_CHUNK)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if self._closing.is_set() and task is not None and task.uncancel() == 0:
                return None
            raise
        finally:
            self._waiting_to_read = None

    async def _read_requests(self) -> None:
        decoder = FrameDecoder(self.broker.config.max_request_bytes)
        try:
            while not self._closing.is_set():
                data = await self._read()
                if data is None:
                    return
                if not data:
                    self._peer_gone = True
                    return
                metrics.BYTES_IN.inc(len(data))
                for frame in decoder.feed(data):
                    task = asyncio.create_task(self._process(frame))
                    if _api_key(frame) in ABANDONABLE:
                        self._abandonable.add(task)
                        task.add_done_callback(self._abandonable.discard)
                    await self._in_flight.put(task)
        except DecodeError as exc:
            self._reject(exc)
        except (ConnectionError, OSError):
            self._peer_gone = True

    def _abandon(self) -> None:
        """Cancel the requests nobody will read the answer to (see the module docstring)."""
        for task in list(self._abandonable):
            if task.cancel():
                metrics.REQUESTS_ABANDONED.labels("Fetch").inc()

    async def _process(self, frame: bytes) -> requests.Response | None:
        started = time.perf_counter()
        api = _api_label(frame)
        try:
            return await requests.process(self.broker, frame, self.peer)
        finally:
            metrics.REQUESTS.labels(api).inc()
            metrics.REQUEST_SECONDS.labels(api).observe(time.perf_counter() - started)

    async def _write_responses(self) -> None:
        """Write responses in request order; after a fatal error, cancel whatever follows."""
        failed = False
        while (task := await self._in_flight.get()) is not None:
            if failed:
                task.cancel()
                continue
            try:
                await asyncio.wait((task,))
                if task.cancelled():  # abandoned: its client is gone
                    continue
                response = task.result()
                if response is not None and not self.writer.is_closing():
                    if isinstance(response, bytes):
                        self.writer.write(response)
                        metrics.BYTES_OUT.inc(len(response))
                    else:
                        metrics.BYTES_OUT.inc(_write_pieces(self.writer, response))
                    await self.writer.drain()
            except DecodeError as exc:
                self._reject(exc)
                failed = True
            except (ConnectionError, OSError):
                self.close()
                failed = True
            except Exception:
                log.exception("request failed; closing the connection", extra={"peer": self.peer})
                metrics.REQUEST_ERRORS.labels("internal").inc()
                self.close()
                failed = True

    def _reject(self, exc: DecodeError) -> None:
        if not self._closing.is_set():
            log.warning(
                "closing connection: %s",
                exc,
                extra={"peer": self.peer, "reason": type(exc).__name__},
            )
            metrics.REQUEST_ERRORS.labels(type(exc).__name__).inc()
        self.close()


def _write_pieces(writer: asyncio.StreamWriter, pieces: list[bytes | memoryview]) -> int:
    """Write a response given in pieces: small pieces joined (one send, not many tiny ones),
    large ones (record batches) handed over as they are, so the kernel takes them straight from
    the cache instead of after a copy (Python 3.11's ``writelines`` joins everything first)."""
    small: list[bytes | memoryview] = []
    total = 0
    for piece in pieces:
        total += len(piece)
        if len(piece) < JOIN_BELOW:
            small.append(piece)
            continue
        if small:
            writer.write(b"".join(small))
            small = []
        writer.write(piece)
    if small:
        writer.write(b"".join(small))
    return total


def _api_key(frame: bytes) -> int:
    try:
        return codec.peek_header(frame)[0]
    except DecodeError:
        return -1


def _api_label(frame: bytes) -> str:
    try:
        return codec.api_name(codec.peek_header(frame)[0])
    except DecodeError:
        return "unknown"
