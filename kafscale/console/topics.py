"""Topic pages: the list (filter, pages, create) and a topic's detail (partitions with their
offsets and segments, configs edited and reset, partitions added, deletion confirmed by name).

Sizes, record counts and segment facts come from the storage summary (`console.storage`), read
in the background; the rest from the Kafka protocol, for the rows of the page shown only."""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass

from aiohttp import web

from kafscale.console.model import Config, TopicPartitions
from kafscale.console.storage import PartitionStorage, TopicStorage
from kafscale.console.web import (
    call,
    console,
    failed,
    flash,
    form_int,
    kafka,
    page_of,
    redirect,
    render,
)
from kafscale.kafka_admin import AdminError

TOPIC_NAME = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")
CONFIG_LINE = re.compile(r"^\s*([a-zA-Z0-9._-]+)\s*=\s*(.*?)\s*$")
SHOWN_CONFIGS = ("retention.ms", "retention.bytes", "cleanup.policy")


@dataclass(frozen=True)
class TopicRow:
    name: str
    partitions: int
    internal: bool
    storage: TopicStorage | None
    records: int  # -1: not known
    configs: dict[str, Config]


@dataclass(frozen=True)
class PartitionRow:
    partition: int
    leader: int
    log_start: int
    high_watermark: int
    storage: PartitionStorage | None


def quoted(name: str) -> str:
    return urllib.parse.quote(name, safe="")


def _parse_configs(text: str) -> dict[str, str]:
    configs: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        found = CONFIG_LINE.match(line)
        if found is None:
            raise web.HTTPBadRequest(text=f"configs, line {number}: {line!r} is not name=value")
        configs[found.group(1)] = found.group(2)
    return configs


async def topic_list(request: web.Request) -> web.StreamResponse:
    access = kafka(request)
    cluster = await call(access.cluster, None, console(request).settings.sample_seconds)
    query = request.query.get("q", "").strip()
    internal = request.query.get("internal") == "1"
    names = sorted(
        name
        for name, topic in cluster.topics.items()
        if (internal or not topic.internal) and query.lower() in name.lower()
    )
    shown, number, pages = page_of(names, request)
    storage = console(request).storage
    snapshot = storage.snapshot() if storage is not None else None
    try:
        configs = await call(access.configs, shown)
    except AdminError as exc:
        flash(request, "error", f"configs not shown: {exc}")
        configs = {}
    records: dict[str, int] = {}
    if snapshot is None:  # no storage summary: count from the offsets of the shown page
        partitions = [(n, p) for n in shown for p, _ in cluster.topics[n].partitions]
        marks = await call(access.watermarks, partitions)
        for (name, _), (start, end) in marks.items():
            if start >= 0 and end >= 0:
                records[name] = records.get(name, 0) + end - start
    rows = [
        TopicRow(
            name,
            len(cluster.topics[name].partitions),
            cluster.topics[name].internal,
            snapshot.topics.get(name) if snapshot else None,
            snapshot.topics[name].records
            if snapshot and name in snapshot.topics
            else records.get(name, -1),
            configs.get(name, {}),
        )
        for name in shown
    ]
    return render(
        request,
        "topics.html",
        rows=rows,
        query=query,
        internal=internal,
        total=len(names),
        page=number,
        pages=pages,
        snapshot=snapshot,
        shown_configs=SHOWN_CONFIGS,
        quoted=quoted,
    )


async def topic_create(request: web.Request) -> web.StreamResponse:
    form = await request.post()
    name = str(form.get("name", "")).strip()
    if not TOPIC_NAME.match(name) or name in (".", ".."):
        flash(request, "error", f"{name!r} is not a topic name (letters, digits, . _ -)")
        raise redirect("/topics")
    partitions = form_int(form, "partitions", 1, low=1)
    configs = _parse_configs(str(form.get("configs", "")))
    try:
        await call(kafka(request).create_topic, name, partitions, configs)
    except AdminError as exc:
        raise failed(request, exc, "/topics") from None
    flash(request, "ok", f"Topic {name} created with {partitions} partitions.")
    raise redirect(f"/topics/{quoted(name)}")


async def topic_detail(request: web.Request) -> web.StreamResponse:
    name = request.match_info["name"]
    access = kafka(request)
    try:
        topic: TopicPartitions = await call(access.topic, name)
    except AdminError as exc:
        raise failed(request, exc, "/topics") from None
    partitions = [(name, p) for p, _ in topic.partitions]
    marks = await call(access.watermarks, partitions)
    configs = (await call(access.configs, [name])).get(name, {})
    storage = console(request).storage
    stored = {}
    if storage is not None:
        stored = {s.partition: s for s in storage.snapshot().partitions.get(name, ())}
    rows = [
        PartitionRow(p, leader, marks[(name, p)][0], marks[(name, p)][1], stored.get(p))
        for p, leader in topic.partitions
    ]
    return render(
        request,
        "topic.html",
        name=name,
        topic=topic,
        rows=rows,
        configs=configs,
        records=sum(max(0, r.high_watermark - r.log_start) for r in rows),
        summary=storage.snapshot().topics.get(name) if storage is not None else None,
        quoted=quoted,
    )


async def topic_configs(request: web.Request) -> web.StreamResponse:
    name = request.match_info["name"]
    form = await request.post()
    here = f"/topics/{quoted(name)}"
    set_ = _parse_configs(str(form.get("set", "")))
    delete = [str(k) for k in form.getall("reset", [])]
    if not set_ and not delete:
        flash(
            request, "error", "Nothing to change: give name=value lines or pick configs to reset."
        )
        raise redirect(here)
    try:
        await call(kafka(request).alter_configs, name, set_, delete)
    except AdminError as exc:
        raise failed(request, exc, here) from None
    flash(request, "ok", f"Configs of {name} changed.")
    raise redirect(here)


async def topic_partitions(request: web.Request) -> web.StreamResponse:
    name = request.match_info["name"]
    form = await request.post()
    here = f"/topics/{quoted(name)}"
    total = form_int(form, "partitions", low=1)
    try:
        await call(kafka(request).add_partitions, name, total)
    except AdminError as exc:
        raise failed(request, exc, here) from None
    flash(request, "ok", f"{name} now has {total} partitions.")
    raise redirect(here)


async def topic_delete(request: web.Request) -> web.StreamResponse:
    name = request.match_info["name"]
    form = await request.post()
    if form.get("confirm") != name:
        flash(request, "error", f"Type the topic's name ({name}) to delete it.")
        raise redirect(f"/topics/{quoted(name)}")
    try:
        await call(kafka(request).delete_topic, name)
    except AdminError as exc:
        raise failed(request, exc, f"/topics/{quoted(name)}") from None
    storage = console(request).storage
    if storage is not None:
        await call(storage.refresh)
    flash(request, "ok", f"Topic {name} deleted.")
    raise redirect("/topics")


def register(router: web.UrlDispatcher) -> None:
    router.add_get("/topics", topic_list)
    router.add_post("/topics", topic_create)
    router.add_get("/topics/{name}", topic_detail)
    router.add_post("/topics/{name}/configs", topic_configs)
    router.add_post("/topics/{name}/partitions", topic_partitions)
    router.add_post("/topics/{name}/delete", topic_delete)
