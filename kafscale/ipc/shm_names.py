"""The /dev/shm names of a broker run's partition buffers: making, listing, sweeping them.

``kafscale-{run id}-s{shard}-b{slot}``: the run id is new for every ``kafscale serve``, so runs
never meet; a shard's successor in the same run finds its predecessor's buffers by the
``s{shard}-`` prefix (``shard_segments``), and the supervisor removes whatever a run left when it
stops (``sweep_segments``). Slots only grow within one incarnation of a shard; its successor
numbers after the highest slot it finds, so a name whose buffer the predecessor destroyed may come
back (readers tell the buffers apart by their generation: ``kafscale.shards.loading``).
"""

from __future__ import annotations

import contextlib
import os
import re

SHM_DIR = "/dev/shm"

_RUN_ID = re.compile(r"[0-9A-Za-z]{1,32}")
_SLOT = re.compile(r"b(\d+)")


def run_prefix(run_id: str) -> str:
    """The prefix every segment name of one broker run starts with."""
    if not _RUN_ID.fullmatch(run_id):
        raise ValueError(f"run id must be 1-32 letters or digits, got {run_id!r}")
    return f"kafscale-{run_id}-"


def segment_name(run_id: str, shard: int, slot: int) -> str:
    if shard < 0 or slot < 0:
        raise ValueError(f"shard and slot must be >= 0, got {shard}, {slot}")
    return f"{run_prefix(run_id)}s{shard}-b{slot}"


def sweep_segments(run_id: str) -> list[str]:
    """Unlink every segment of the run from /dev/shm; return the names removed."""
    return _sweep(run_prefix(run_id))


def shard_segments(run_id: str, shard: int) -> list[tuple[str, int | None]]:
    """One shard's segments of the run in /dev/shm, as (name, slot); slot None for a name that
    does not end in a slot number (not one of ours, but in our namespace)."""
    prefix = f"{run_prefix(run_id)}s{shard}-"
    found = []
    for entry in sorted(os.listdir(SHM_DIR)):
        if entry.startswith(prefix):
            match = _SLOT.fullmatch(entry[len(prefix) :])
            found.append((entry, int(match[1]) if match else None))
    return found


def unlink_segment(name: str) -> bool:
    """Unlink a segment by name (mappings stay valid until closed); False if it was gone."""
    try:
        os.unlink(os.path.join(SHM_DIR, name))
    except FileNotFoundError:
        return False
    return True


def _sweep(prefix: str) -> list[str]:
    removed = []
    for entry in sorted(os.listdir(SHM_DIR)):
        if entry.startswith(prefix):
            with contextlib.suppress(FileNotFoundError):  # its owner destroyed it meanwhile
                os.unlink(os.path.join(SHM_DIR, entry))
                removed.append(entry)
    return removed
