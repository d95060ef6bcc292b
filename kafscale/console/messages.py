"""The message browser: read a partition (or all) from an offset, a timestamp, the beginning or
the end; show keys and values as text, pretty JSON or hex, with headers and timestamps; filter by
key or by a substring anywhere in the record; produce a test record.

`plan_ranges` (pure) decides which offsets to read; the read itself is `KafkaAccess.browse`."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web
from confluent_kafka.admin import OffsetSpec

from kafscale.console.kafka import MAX_MESSAGES, MAX_SCAN
from kafscale.console.model import Message
from kafscale.console.topics import quoted
from kafscale.console.web import call, failed, flash, kafka, parse_moment, redirect, render
from kafscale.kafka_admin import AdminError

STARTS = ("end", "beginning", "offset", "timestamp")
FORMATS = ("text", "json", "hex")


@dataclass(frozen=True)
class Shown:
    """A record as the page shows it."""

    message: Message
    key: str
    value: str
    headers: tuple[tuple[str, str], ...]
    value_format: str  # what the value was shown as (json falls back to text)


def plan_ranges(
    start: str,
    marks: dict[int, tuple[int, int]],
    limit: int,
    offset: int = 0,
    by_time: dict[int, int] | None = None,
    filtered: bool = False,
    scan: int = MAX_SCAN,
) -> dict[int, tuple[int, int]]:
    """partition -> [from, to) to read, given each partition's (log start, high watermark).
    Unfiltered, each partition's range holds at most ``limit`` records; filtered, it runs to the
    high watermark (the read stops at the scan limit), and from the end it starts that
    partition's share of ``scan`` records back."""
    ranges: dict[int, tuple[int, int]] = {}
    back = max(limit, scan // max(1, len(marks))) if filtered else limit
    for partition, (low, high) in marks.items():
        if low < 0 or high < 0:
            continue
        if start == "end":
            first = max(low, high - back)
        elif start == "beginning":
            first = low
        elif start == "offset":
            first = min(max(offset, low), high)
        else:
            found = (by_time or {}).get(partition, -1)
            first = high if found < 0 else min(max(found, low), high)
        last = high if filtered or start == "end" else min(high, first + limit)
        ranges[partition] = (first, last)
    return ranges


def _text(data: bytes | None) -> str:
    return "null" if data is None else data.decode("utf-8", errors="replace")


def _hex(data: bytes | None) -> str:
    return "null" if data is None else data.hex(" ")


def show(message: Message, fmt: str) -> Shown:
    if fmt == "hex":
        key, value, used = _hex(message.key), _hex(message.value), "hex"
    else:
        key, value, used = _text(message.key), _text(message.value), "text"
        if fmt == "json" and message.value is not None:
            try:
                value = json.dumps(json.loads(message.value), indent=2, ensure_ascii=False)
                used = "json"
            except (ValueError, RecursionError):
                pass
    render_header = _hex if fmt == "hex" else _text
    headers = tuple((k, render_header(v)) for k, v in message.headers)
    return Shown(message, key, value, headers, used)


def matcher(key: str, contains: str) -> Callable[[Message], bool] | None:
    if not key and not contains:
        return None
    wanted_key = key.encode()
    needle = contains.encode()

    def match(message: Message) -> bool:
        if wanted_key and (message.key is None or wanted_key not in message.key):
            return False
        if needle:
            fields = [message.key or b"", message.value or b""]
            fields.extend(v or b"" for _, v in message.headers)
            fields.extend(k.encode() for k, _ in message.headers)
            return any(needle in data for data in fields)
        return True

    return match


def _int(text: str, name: str, default: int) -> int:
    if not text.strip():
        return default
    try:
        return int(text)
    except ValueError:
        raise web.HTTPBadRequest(text=f"{name}: {text!r} is not a whole number") from None


async def browse(request: web.Request) -> web.StreamResponse:
    name = request.match_info["name"]
    query = request.query
    access = kafka(request)
    try:
        topic = await call(access.topic, name)
    except AdminError as exc:
        raise failed(request, exc, "/topics") from None
    start = query.get("start", "end") if query.get("start") in STARTS else "end"
    fmt = query.get("format", "text") if query.get("format") in FORMATS else "text"
    limit = min(MAX_MESSAGES, max(1, _int(query.get("limit", ""), "limit", 50)))
    chosen = query.get("partition", "all")
    partitions = [p for p, _ in topic.partitions]
    if chosen != "all":
        wanted = _int(chosen, "partition", 0)
        if wanted not in partitions:
            raise web.HTTPBadRequest(text=f"partition: {name} has no partition {wanted}")
        partitions = [wanted]
    key, contains = query.get("key", ""), query.get("contains", "")
    match = matcher(key, contains)
    marks = await call(access.watermarks, [(name, p) for p in partitions])
    by_partition = {p: marks[(name, p)] for p in partitions}
    by_time: dict[int, int] = {}
    if start == "timestamp":
        moment = parse_moment(query.get("timestamp", "") or "0")
        found = await call(
            access.offsets,
            [(name, p) for p in partitions],
            OffsetSpec.for_timestamp(moment),
        )
        by_time = {p: o for (_, p), o in found.items()}
    ranges = plan_ranges(
        start,
        by_partition,
        limit,
        _int(query.get("offset", ""), "offset", 0),
        by_time,
        filtered=match is not None,
    )
    result = await call(access.browse, name, ranges, limit * len(ranges) or 1, match)
    records = list(result.messages)
    records = records[-limit:] if start == "end" else records[:limit]
    return render(
        request,
        "messages.html",
        name=name,
        partitions=[p for p, _ in topic.partitions],
        chosen=chosen,
        start=start,
        fmt=fmt,
        limit=limit,
        query=query,
        shown=[show(m, fmt) for m in records],
        result=result,
        marks=by_partition,
        quoted=quoted,
    )


def _headers(text: str) -> list[tuple[str, bytes]]:
    headers = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        name, sep, value = line.partition(":")
        if not sep or not name.strip():
            raise web.HTTPBadRequest(text=f"headers, line {number}: {line!r} is not name: value")
        headers.append((name.strip(), value.strip().encode()))
    return headers


async def produce(request: web.Request) -> web.StreamResponse:
    name = request.match_info["name"]
    form = await request.post()
    here = f"/topics/{quoted(name)}/messages"
    key_text = str(form.get("key", ""))
    partition_text = str(form.get("partition", "")).strip()
    partition = _int(partition_text, "partition", -1) if partition_text else None
    try:
        where = await call(
            kafka(request).produce,
            name,
            key_text.encode() if key_text else None,
            str(form.get("value", "")).encode(),
            _headers(str(form.get("headers", ""))),
            partition,
        )
    except AdminError as exc:
        raise failed(request, exc, here) from None
    flash(request, "ok", f"Produced to partition {where[0]} at offset {where[1]}.")
    raise redirect(f"{here}?partition={where[0]}&start=end")


def register(router: web.UrlDispatcher) -> None:
    router.add_get("/topics/{name}/messages", browse)
    router.add_post("/topics/{name}/produce", produce)
