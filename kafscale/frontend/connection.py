"""One client connection: read frames, process them concurrently, reply in request order.

Kafka lets a client pipeline requests on a connection but requires the responses in request
order. Each frame becomes a task as soon as it is read; a writer awaits the tasks in arrival order
and writes each response, waiting for the socket to drain before the next one.

What one connection may hold is bounded (docs/operations.md, "Connections"). A request is held
from the moment its frame is read until its response has drained to the kernel; its bytes are the
frame's, plus the response's once it is made. While a connection holds
``KAFSCALE_CONNECTION_MAX_IN_FLIGHT_REQUESTS`` requests or ``..._MAX_IN_FLIGHT_BYTES`` bytes, the
reader neither starts another request nor reads from the socket, so a client pipelining faster
than it is answered, or not reading its responses, is held back by TCP, not buffered. A request
alone is always served, whatever its size (up to ``KAFSCALE_MAX_REQUEST_BYTES``). Fetch, the one
request whose response can be large, is also served one at a time per connection (Kafka serves
every request of a connection one at a time). So one connection holds at most: the bytes limit,
plus two frames (the last one started, and the one being received), plus one read chunk, plus one
Fetch response and the (small) responses of its other requests in progress; and the socket's
write buffer holds one response at most (the writer drains after each).

Idle connections (``connections.max.idle.ms``) are found by the listener from what this class
reports to its ``IdleExpiry``: bytes received, requests started and finished, responses written.

A decode error (bad frame length, garbage, unknown API key) ends the connection after the
responses to the requests before it are written, with one log line saying why. Nothing that
happens on one connection affects another.

Authentication (docs/design/security.md, section 4) is asked in one place, before a request
starts: ``Session.auth.admit`` says whether this connection may send it now. A request it refuses
(anything but ApiVersions and the SASL requests before a SASL client authenticated, or after its
session expired) closes the connection with a log line, after the responses before it. The SASL
requests themselves run one at a time: the next frame is not looked at before the previous one's
answer changed the state, so a pipelining client cannot race the state machine; after a
SaslHandshake v0 the next frames are bare tokens (``RAW_TOKEN``), answered bare. A failed
authentication is answered, then the connection closes.

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
from dataclasses import dataclass, field

from kafscale import metrics
from kafscale.frontend import requests
from kafscale.frontend.context import Broker, Session
from kafscale.frontend.handlers import sasl_authenticate
from kafscale.frontend.limits import IdleExpiry
from kafscale.protocol import codec, sasl
from kafscale.protocol.errors import DecodeError
from kafscale.protocol.framing import FrameDecoder

log = logging.getLogger(__name__)

ABANDONABLE = {1}  # API keys safe to cut short when the client is gone: Fetch
# API keys whose response can be large (Fetch: up to the client's max_bytes): one connection has
# one of them in flight at a time, as Kafka has every request. Clients send one Fetch per broker
# at a time anyway; pipelined ones (a hostile client) would otherwise pin a response each.
ONE_AT_A_TIME = {1}
FAILED_AUTHENTICATION_DELAY_S = 0.1  # Kafka's connection.failed.authentication.delay.ms
RAW_TOKEN = -2  # not an API key: a bare SASL token after a SaslHandshake v0
SASL_STEPS = {sasl.SASL_HANDSHAKE, sasl.SASL_AUTHENTICATE, RAW_TOKEN}  # run one at a time
READ_CHUNK = 256 * 1024
JOIN_BELOW = 16 * 1024


@dataclass(eq=False, slots=True)
class _Request:
    """A request read and not yet answered."""

    held: int  # bytes it holds: its frame, and its response once made
    one_at_a_time: bool
    task: asyncio.Task[requests.Response | None] = field(init=False)
    finished: bool = False  # its task ended (or was given up)
    released: bool = False  # answered: no longer counted


class Connection:
    def __init__(
        self,
        broker: Broker,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        idle: IdleExpiry[Connection] | None = None,
        session: Session | None = None,
    ) -> None:
        self.broker = broker
        self.session = session if session is not None else Session()
        self.reader = reader
        self.writer = writer
        peer = writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self.max_requests = broker.config.connection_max_in_flight_requests
        self.max_bytes = broker.config.connection_max_in_flight_bytes
        self._idle: IdleExpiry[Connection] = idle if idle is not None else IdleExpiry(None)
        self._in_flight: asyncio.Queue[_Request | None] = asyncio.Queue()
        self._requests = 0  # read and not yet answered
        self._large_responses = 0  # of which ONE_AT_A_TIME (0 or 1)
        self._held = 0  # their bytes (see _Request.held)
        self._room = asyncio.Event()  # set when a request is answered
        self._throttled = False  # waited for room since the last read that did not
        self._decoder: FrameDecoder | None = None
        self._write_buffer_seen = 0
        self._closing = asyncio.Event()
        self._peer_gone = False
        self._abandonable: set[asyncio.Task[requests.Response | None]] = set()
        self._waiting_to_read: asyncio.Task[None] | None = None

    @property
    def held_bytes(self) -> int:
        """Bytes this connection holds: requests and responses in flight, a partial frame."""
        return self._held + (self._decoder.buffered if self._decoder is not None else 0)

    @property
    def in_flight_requests(self) -> int:
        return self._requests

    async def serve(self) -> None:
        metrics.CONNECTIONS.inc()
        self._idle.opened(self, time.monotonic())
        writer_task = asyncio.create_task(self._write_responses())
        try:
            await self._read_requests()
            if self._peer_gone:
                self._abandon()
        finally:
            self._in_flight.put_nowait(None)
            await writer_task
            self.writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await self.writer.wait_closed()
            self._idle.closed(self)
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

    def close_idle(self) -> None:
        """Close at once (connections.max.idle.ms): nothing is in progress, and a response the
        client does not read is dropped, as Kafka's idle expiry drops it."""
        log.debug("closing idle connection", extra={"peer": self.peer})
        metrics.CONNECTIONS_CLOSED.labels("idle").inc()
        self.close()
        self.writer.transport.abort()

    def write_progressed(self) -> bool:
        """Whether the client took response bytes since the last write or the last call: a
        connection whose client reads a large response slowly is not idle."""
        pending = self.writer.transport.get_write_buffer_size()
        progressed = pending < self._write_buffer_seen
        self._write_buffer_seen = pending
        return progressed

    async def _read(self) -> bytes | None:
        """The next bytes from the client, once the connection is below its in-flight limits;
        None once `close()` interrupted the wait."""
        self._waiting_to_read = asyncio.current_task()
        try:
            if self._full(False) is None:
                self._throttled = False
            else:
                await self._wait_for_room()
            return await self.reader.read(READ_CHUNK)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if self._closing.is_set() and task is not None and task.uncancel() == 0:
                return None
            raise
        finally:
            self._waiting_to_read = None

    async def _wait_for_room(self, one_at_a_time: bool = False) -> None:
        """Back-pressure: wait while this connection holds its limit of requests or bytes (a
        connection with nothing in flight always has room), or, for a ONE_AT_A_TIME request,
        while another such request is in flight."""
        limit = self._full(one_at_a_time)
        if limit is None:
            return
        if not self._throttled:  # counted once per read, not per request it holds back
            self._throttled = True
            metrics.CONNECTIONS_THROTTLED.labels(limit).inc()
        while self._full(one_at_a_time) is not None:
            self._room.clear()
            await self._room.wait()

    def _full(self, one_at_a_time: bool) -> str | None:
        """The limit that keeps another request from starting now, if any."""
        if self._requests >= self.max_requests:
            return "requests"
        if self._held >= self.max_bytes:
            return "bytes"
        if one_at_a_time and self._large_responses:
            return "one_fetch"
        return None

    async def _read_requests(self) -> None:
        decoder = FrameDecoder(self.broker.config)
        decoder.unauthenticated = not self.session.auth.authenticated
        self._decoder = decoder
        try:
            while not self._closing.is_set():
                data = await self._read()
                if data is None:
                    return
                if not data:
                    self._peer_gone = True
                    return
                self._idle.active(self, time.monotonic())
                metrics.BYTES_IN.inc(len(data))
                for frame in decoder.feed(data):
                    auth = self.session.auth
                    api_key = RAW_TOKEN if auth.raw_tokens else _api_key(frame)
                    if api_key != RAW_TOKEN:
                        admission = auth.admit(api_key, _now_ms())
                        if admission.verdict is sasl.Verdict.CLOSE:
                            self._refuse(api_key, admission.reason)
                            return
                    if self._full(api_key in ONE_AT_A_TIME) is not None:
                        await self._wait_for_room(api_key in ONE_AT_A_TIME)
                    request = self._start(frame, api_key)
                    self._in_flight.put_nowait(request)
                    if api_key in SASL_STEPS and auth.sasl:
                        await asyncio.wait((request.task,))  # the state it leaves decides
                        if auth.state is sasl.State.FAILED and not self._closing.is_set():
                            # Kafka's connection.failed.authentication.delay.ms: the answer is
                            # read before the close (a client that reads it in the same
                            # receive as the close would drop it) and a guesser is slowed.
                            await asyncio.sleep(FAILED_AUTHENTICATION_DELAY_S)
                        if self._closing.is_set() or auth.state is sasl.State.FAILED:
                            self.close()  # after the answer (a failure's) is written
                            return
                        decoder.unauthenticated = not auth.authenticated
                        decoder.raw = auth.raw_tokens
                # A bad length prefix after good frames: they are answered, then we close.
                decoder.raise_pending()
        except DecodeError as exc:
            self._reject(exc)
        except (ConnectionError, OSError):
            self._peer_gone = True

    def _start(self, frame: bytes, api_key: int) -> _Request:
        request = _Request(len(frame), api_key in ONE_AT_A_TIME)
        request.task = task = asyncio.create_task(self._process(frame, api_key, request))
        self._requests += 1
        self._large_responses += request.one_at_a_time
        self._held += request.held
        self._idle.request_started(self)
        if api_key in ABANDONABLE:
            self._abandonable.add(task)
            task.add_done_callback(self._abandonable.discard)
        return request

    def _finished(self, request: _Request, response: requests.Response | None) -> None:
        """A request ended: its response (if any) is held until written."""
        if request.finished:
            return
        request.finished = True
        self._idle.request_finished(self, time.monotonic())
        if response is not None and not request.released:
            size = len(response) if isinstance(response, bytes) else _size(response)
            request.held += size
            self._held += size

    def _release(self, request: _Request) -> None:
        self._finished(request, None)  # a task cancelled before it ran never said so
        request.released = True
        self._requests -= 1
        self._large_responses -= request.one_at_a_time
        self._held -= request.held
        self._room.set()

    def _abandon(self) -> None:
        """Cancel the requests nobody will read the answer to (see the module docstring)."""
        for task in list(self._abandonable):
            if task.cancel():
                metrics.REQUESTS_ABANDONED.labels("Fetch").inc()

    async def _process(
        self, frame: bytes, api_key: int, request: _Request
    ) -> requests.Response | None:
        started = time.perf_counter()
        api = "SaslAuthenticate" if api_key == RAW_TOKEN else _api_label(frame)
        response: requests.Response | None = None
        try:
            if api_key == RAW_TOKEN:
                response = sasl_authenticate.answer_raw(self.broker, self.session, frame, self.peer)
            else:
                response = await requests.process(self.broker, frame, self.peer, self.session)
            return response
        finally:
            self._finished(request, response)
            metrics.REQUESTS.labels(api).inc()
            metrics.REQUEST_SECONDS.labels(api).observe(time.perf_counter() - started)

    async def _write_responses(self) -> None:
        """Write responses in request order; after a fatal error, cancel whatever follows."""
        failed = False
        while (request := await self._in_flight.get()) is not None:
            task = request.task
            try:
                if failed:
                    task.cancel()
                    continue
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
                    self._write_buffer_seen = self.writer.transport.get_write_buffer_size()
                    await self.writer.drain()
                    self._idle.active(self, time.monotonic())
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
            finally:
                self._release(request)

    def _refuse(self, api_key: int, reason: str) -> None:
        """Close: authentication does not let this connection send ``api_key`` now."""
        log.warning(
            "closing connection: %s",
            reason,
            extra={
                "peer": self.peer,
                "listener": self.session.listener,
                "api_key": api_key,
                "principal": self.session.auth.principal,
            },
        )
        metrics.REQUEST_ERRORS.labels("unauthenticated").inc()
        self.close()

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


def _size(pieces: list[bytes | memoryview]) -> int:
    return sum(len(piece) for piece in pieces)


def _now_ms() -> int:
    return int(time.monotonic() * 1000)


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
