"""The read path's reader threads: blocking object-store (and metadata) reads run on a small
pool, and their completions come back to the shard's loop, never touching its state from a
worker thread.

A job's ``done(result, error)`` callback is queued when the job ends and an eventfd is written;
the shard polls ``wakeup_fd`` beside its sockets and calls ``on_completions``, which runs the
callbacks on the loop in completion order.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")
Done = Callable[[Any, BaseException | None], None]


class ReaderThreads:
    def __init__(self, workers: int, label: str) -> None:
        self._pool = concurrent.futures.ThreadPoolExecutor(workers, f"read-{label}")
        self._done: queue.SimpleQueue[tuple[concurrent.futures.Future[Any], Done]]
        self._done = queue.SimpleQueue()
        self.wakeup_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        # A job still running at close() completes later on its worker: it must not write to
        # the closed eventfd, whose number the process may already have given to another file.
        self._open = True
        self._open_lock = threading.Lock()

    def submit(self, job: Callable[..., T], args: tuple[Any, ...], done: Done) -> None:
        """Run ``job(*args)`` on a worker; ``done(result or None, error or None)`` on the loop."""

        def complete(future: concurrent.futures.Future[T]) -> None:
            with self._open_lock:
                if not self._open:
                    return
                self._done.put((future, done))
                os.eventfd_write(self.wakeup_fd, 1)

        self._pool.submit(job, *args).add_done_callback(complete)

    def on_completions(self) -> None:
        """Run the callbacks of the jobs that ended (call when ``wakeup_fd`` is readable)."""
        with contextlib.suppress(BlockingIOError):
            os.eventfd_read(self.wakeup_fd)
        while True:
            try:
                future, done = self._done.get_nowait()
            except queue.Empty:
                return
            error = future.exception()
            done(None if error else future.result(), error)

    def close(self) -> None:
        """Stop taking jobs; queued ones are cancelled, running ones end unheard."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        with self._open_lock:
            self._open = False
            os.close(self.wakeup_fd)
