"""ReaderThreads: completions come back through the eventfd, and a job still running when the
threads are closed ends unheard — it never writes to the closed eventfd's number, which the
process may already have given to another file."""

from __future__ import annotations

import contextlib
import logging
import os
import threading

import pytest

from kafscale.shards.threads import ReaderThreads


def test_a_completed_job_wakes_the_loop_and_its_callback_runs_there() -> None:
    threads = ReaderThreads(1, "test")
    heard: list[tuple[object, BaseException | None]] = []
    threads.submit(lambda x: x * 2, (21,), lambda r, e: heard.append((r, e)))
    threads.submit(lambda: 1 / 0, (), lambda r, e: heard.append((r, e)))
    try:
        # the callbacks wait for the loop, however long the jobs took
        threads._pool.shutdown(wait=True)
        assert heard == []
        threads.on_completions()
        assert heard[0] == (42, None)
        assert heard[1][0] is None and isinstance(heard[1][1], ZeroDivisionError)
    finally:
        threads.close()


def test_a_job_running_at_close_does_not_write_to_a_reused_descriptor(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    threads = ReaderThreads(1, "test")
    release = threading.Event()

    def job() -> int:
        release.wait(10)
        return 1

    threads.submit(job, (), lambda r, e: None)
    old = threads.wakeup_fd
    threads.close()
    reused = os.eventfd(0, os.EFD_NONBLOCK)
    try:
        assert reused == old  # the lowest free number: the situation this test is about
        release.set()
        threads._pool.shutdown(wait=True)
        with pytest.raises(BlockingIOError):
            os.eventfd_read(reused)  # nothing was written to the other file
        assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
    finally:
        with contextlib.suppress(OSError):
            os.close(reused)
