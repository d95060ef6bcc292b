"""Consumer group pages: the list (state, members, lag) and a group's detail (protocol, members
and their assignments, committed offset and lag per partition, lag over time from the brokers'
``kafscale_consumer_lag``), resetting an empty group's offsets and deleting a group.

`reset_targets` (pure) turns a reset request into the offsets to commit."""

from __future__ import annotations

import urllib.parse

from aiohttp import web
from confluent_kafka.admin import OffsetSpec

from kafscale.console import charts
from kafscale.console.model import Group, GroupOffset
from kafscale.console.web import (
    call,
    console,
    failed,
    flash,
    kafka,
    page_of,
    parse_moment,
    redirect,
    render,
)
from kafscale.kafka_admin import AdminError

RESETS = ("earliest", "latest", "timestamp", "offset")
# Kafka's states in which a group has no members: its offsets may be changed from outside.
EMPTY_STATES = ("EMPTY", "DEAD", "UNKNOWN")


def reset_targets(
    offsets: tuple[GroupOffset, ...],
    how: str,
    topic: str = "",
    offset: int = 0,
    by_time: dict[tuple[str, int], int] | None = None,
) -> dict[tuple[str, int], int]:
    """The offsets to commit: for every partition the group has (of ``topic`` only, if given),
    its log start (earliest), its high watermark (latest), the first offset at or after a time
    (the high watermark when there is none), or a given offset clamped into [start, end]."""
    targets: dict[tuple[str, int], int] = {}
    for row in offsets:
        if topic and row.topic != topic:
            continue
        if row.start < 0 or row.end < 0:
            continue
        if how == "earliest":
            target = row.start
        elif how == "latest":
            target = row.end
        elif how == "timestamp":
            found = (by_time or {}).get((row.topic, row.partition), -1)
            target = row.end if found < 0 else found
        else:
            target = offset
        targets[(row.topic, row.partition)] = min(max(target, row.start), row.end)
    return targets


def quoted(group_id: str) -> str:
    return urllib.parse.quote(group_id, safe="")


async def group_list(request: web.Request) -> web.StreamResponse:
    listings = await call(kafka(request).groups)
    query = request.query.get("q", "").strip().lower()
    shown, number, pages = page_of([g for g in listings if query in g.group_id.lower()], request)
    metrics = console(request).metrics
    lags = {g.group_id: metrics.latest_lag(g.group_id) for g in shown} if metrics else {}
    return render(
        request,
        "groups.html",
        groups=shown,
        lags=lags,
        query=request.query.get("q", ""),
        page=number,
        pages=pages,
        total=len(listings),
        quoted=quoted,
    )


async def group_detail(request: web.Request) -> web.StreamResponse:
    group_id = request.match_info["group"]
    try:
        group: Group = await call(kafka(request).group, group_id)
    except AdminError as exc:
        raise failed(request, exc, "/groups") from None
    metrics = console(request).metrics
    chart = None
    if metrics is not None:
        chart = charts.line_chart(
            {"lag": metrics.lag(group_id)}, title=f"Lag of {group_id}", unit="records"
        )
    topics = sorted({o.topic for o in group.offsets})
    return render(
        request,
        "group.html",
        group=group,
        chart=chart,
        topics=topics,
        empty=group.state.upper() in EMPTY_STATES,
        quoted=quoted,
    )


async def group_reset(request: web.Request) -> web.StreamResponse:
    group_id = request.match_info["group"]
    here = f"/groups/{quoted(group_id)}"
    form = await request.post()
    how = str(form.get("how", ""))
    if how not in RESETS:
        raise web.HTTPBadRequest(text=f"how: {how!r} is not one of {', '.join(RESETS)}")
    topic = str(form.get("topic", ""))
    access = kafka(request)
    try:
        group = await call(access.group, group_id)
        if group.state.upper() not in EMPTY_STATES:
            flash(
                request,
                "error",
                f"Group {group_id} is {group.state} with {len(group.members)} member(s): stop its "
                "consumers first (offsets of an active group cannot be reset).",
            )
            raise redirect(here)
        by_time: dict[tuple[str, int], int] = {}
        offset = 0
        if how == "timestamp":
            moment = parse_moment(str(form.get("timestamp", "")))
            spec = OffsetSpec.for_timestamp(moment)
            partitions = [(o.topic, o.partition) for o in group.offsets]
            by_time = await call(access.offsets, partitions, spec)
        elif how == "offset":
            try:
                offset = int(str(form.get("offset", "")))
            except ValueError:
                raise web.HTTPBadRequest(text="offset: not a whole number") from None
        targets = reset_targets(group.offsets, how, topic, offset, by_time)
        if not targets:
            flash(request, "error", "The group has no committed offsets to reset.")
            raise redirect(here)
        await call(access.reset_offsets, group_id, targets)
    except AdminError as exc:
        raise failed(request, exc, here) from None
    flash(request, "ok", f"Offsets of {group_id} reset to {how} on {len(targets)} partition(s).")
    raise redirect(here)


async def group_delete(request: web.Request) -> web.StreamResponse:
    group_id = request.match_info["group"]
    try:
        await call(kafka(request).delete_group, group_id)
    except AdminError as exc:
        raise failed(request, exc, f"/groups/{quoted(group_id)}") from None
    flash(request, "ok", f"Group {group_id} deleted.")
    raise redirect("/groups")


def register(router: web.UrlDispatcher) -> None:
    router.add_get("/groups", group_list)
    router.add_get("/groups/{group}", group_detail)
    router.add_post("/groups/{group}/reset", group_reset)
    router.add_post("/groups/{group}/delete", group_delete)
