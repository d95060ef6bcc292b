"""The data directory's lock: ``flock`` on ``{data_dir}/broker.lock``, released by the OS.

Held by the supervisor whenever the data directory holds state (SQLite metadata or local
segments), so two brokers never share one. Invariants:

- The lock is an exclusive, non-blocking ``flock`` on an open file description. The OS drops it
  when the last process holding that description exits, however it exits: no stale lock
  survives a crash (``kafscale.supervisor.ownership`` relies on this to take over a dead broker's
  SQLite ``owner`` key at once).
- The fd is inheritable, so every child the supervisor spawns holds the lock too: children still
  draining after their supervisor was SIGKILLed keep the directory locked until the last exits.
- The file holds the holder's description (JSON), written right after the lock is taken and
  emptied before a clean release; a refused broker reads it to name the holder. The holder may
  not have written it yet when another reads, so the reader retries briefly.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time

LOCK_FILE = "broker.lock"
DESCRIPTION_WAIT_S = 1.0
MAX_DESCRIPTION_BYTES = 64 * 1024


class DataDirLockError(OSError):
    """The lock file cannot be created or locked (permissions, a missing mount)."""


class DataDirLock:
    def __init__(self, data_dir: str) -> None:
        self.data_dir = data_dir
        self.path = os.path.join(data_dir, LOCK_FILE)
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, description: bytes) -> bytes | None:
        """Take the lock and write ``description`` into the file: None. If another process holds
        it, return its description (b"" if it wrote none). Raises ``DataDirLockError``."""
        if self._fd is not None:
            raise RuntimeError(f"{self.path} is already held by this process")
        try:
            os.makedirs(self.data_dir, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise DataDirLockError(exc.errno, f"cannot open {self.path}: {exc.strerror}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                return _read_description(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            os.close(fd)
            raise DataDirLockError(exc.errno, f"cannot lock {self.path}: {exc.strerror}") from exc
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, description + b"\n", 0)
            os.fsync(fd)
            os.set_inheritable(fd, True)
        except OSError as exc:
            os.close(fd)  # drops the lock
            raise DataDirLockError(exc.errno, f"cannot write {self.path}: {exc.strerror}") from exc
        self._fd = fd
        return None

    def release(self) -> None:
        """Empty the description and drop the lock. Idempotent."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        with contextlib.suppress(OSError):  # the lock goes with the fd whatever happens here
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _read_description(fd: int) -> bytes:
    deadline = time.monotonic() + DESCRIPTION_WAIT_S
    while True:
        text = os.pread(fd, MAX_DESCRIPTION_BYTES, 0).strip()
        if text.endswith(b"}") or time.monotonic() > deadline:  # complete JSON, or give up
            return text
        time.sleep(0.05)
