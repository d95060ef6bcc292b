"""The arbiter's own bookkeeping, without spawning anything: what it does when a respawn cannot
be spawned at all (the decisions themselves are tested in test_policy)."""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

import pytest

from kafscale import config as configuration
from kafscale.supervisor import arbiter as arbiter_module
from kafscale.supervisor.arbiter import Arbiter


def test_a_respawn_that_cannot_be_spawned_is_tried_again_not_fatal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = configuration.load({"KAFSCALE_DATA_DIR": str(tmp_path), "KAFSCALE_SHARDS": "1"})
    arbiter = Arbiter(config, "test", str(tmp_path))
    try:
        child = next(c for c in arbiter.children if c.name == "shard-0")
        child.respawn_at = time.monotonic() - 1  # died; due now

        def no_processes(*_: object) -> int:
            raise OSError(errno.EAGAIN, "Resource temporarily unavailable")

        monkeypatch.setattr(os, "posix_spawn", no_processes)
        before = time.monotonic()
        arbiter._respawn_due()  # used to raise out of run(): the broker exited
        assert not child.alive
        assert child.respawn_at is not None
        assert child.respawn_at >= before + arbiter_module.SPAWN_RETRY_S
    finally:
        arbiter._notices.close(linger=0)
        arbiter._zmq.term()
        os.close(arbiter._wakeup_r)
        os.close(arbiter._wakeup_w)
