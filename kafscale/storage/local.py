"""The embedded object store: objects as files under one directory, in the S3 key layout.

A key ``ns/topic/0/segment-00000000000000000000.kfs`` is the file of that relative path under
``root``. Invariants:

- Keys are relative, '/'-separated, with no empty, '.' or '..' component and no component
  starting with ``TEMP_PREFIX`` (reserved for partial writes): a key never names a file outside
  ``root``.
- ``put_if_absent`` never overwrites and readers never see a partial object: the data is written to
  a temp file in the final directory and fsynced, then hard-linked to its final name (``link`` fails
  if the name exists, atomically, even between processes), then the temp name is removed and the
  directory fsynced.
- ``list`` skips temp files and returns keys in code-point order (S3's UTF-8 byte order).

One difference from S3 remains: a key cannot also be the prefix directory of another key
(``a`` and ``a/b``); storing one when the other exists raises ``ObjectStoreError``. KafScale's key
layout never does this.
"""

from __future__ import annotations

import contextlib
import errno
import os
import uuid
from collections.abc import Sequence

from kafscale.storage.objects import (
    ObjectInfo,
    ObjectNotFound,
    ObjectStoreError,
    ObjectStoreUnavailable,
)

TEMP_PREFIX = ".kafscale-tmp-"


def _components(key: str) -> list[str]:
    """The path components of ``key``; ValueError if it is not a valid relative object key."""
    if not key or key.startswith("/") or "\\" in key or "\0" in key:
        raise ValueError(f"invalid object key {key!r}: must be a non-empty relative key")
    parts = key.split("/")
    for part in parts:
        if part in ("", ".", ".."):
            raise ValueError(f"invalid object key {key!r}: empty, '.' or '..' component")
        if part.startswith(TEMP_PREFIX):
            raise ValueError(f"invalid object key {key!r}: {TEMP_PREFIX!r} is reserved")
    return parts


def _fsync_directory(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _raise_unless_missing(exc: OSError) -> None:
    """os.walk error handler: a missing directory lists nothing; anything else is a failure."""
    if not isinstance(exc, FileNotFoundError | NotADirectoryError):
        raise exc


class LocalObjectStore:
    """Objects stored as files under ``root`` (created on first write or ``check``)."""

    def __init__(self, root: str) -> None:
        self._root = os.path.abspath(root)

    @property
    def root(self) -> str:
        return self._root

    @property
    def description(self) -> str:
        return f"directory {self._root}"

    def _path(self, key: str) -> str:
        return os.path.join(self._root, *_components(key))

    def _unavailable(self, action: str, exc: OSError) -> ObjectStoreUnavailable:
        return ObjectStoreUnavailable(f"object directory {self._root}: cannot {action}: {exc}")

    def _ensure_directory(self, directory: str) -> None:
        """Create ``directory`` and missing parents, fsyncing each parent that gained an entry."""
        if os.path.isdir(directory):
            return
        parent = os.path.dirname(directory)
        if parent != directory:
            self._ensure_directory(parent)
        try:
            os.mkdir(directory)
        except FileExistsError:
            if not os.path.isdir(directory):
                raise ObjectStoreError(
                    f"{directory} is an object, so it cannot also be a key prefix"
                ) from None
            return
        _fsync_directory(parent)

    def put_if_absent(self, key: str, data: bytes | memoryview) -> bool:
        final = self._path(key)
        directory = os.path.dirname(final)
        temp = os.path.join(directory, f"{TEMP_PREFIX}{uuid.uuid4().hex}")
        try:
            self._ensure_directory(directory)
            if os.path.lexists(final):
                return self._existing_is_object(final)
            with open(temp, "xb") as file:
                file.write(data)
                file.flush()
                os.fsync(file.fileno())
            try:
                os.link(temp, final)
            except FileExistsError:
                return self._existing_is_object(final)
            os.unlink(temp)
            _fsync_directory(directory)  # persists the new name and the temp name's removal
            return True
        except OSError as exc:
            raise self._unavailable(f"store {key!r}", exc) from exc
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp)

    @staticmethod
    def _existing_is_object(path: str) -> bool:
        """False for an existing object; a directory in the way is a key-layout conflict."""
        if os.path.isdir(path):
            raise ObjectStoreError(f"{path} is a key prefix, so it cannot also be an object")
        return False

    def get(self, key: str, start: int = 0, length: int | None = None) -> bytes:
        if start < 0 or (length is not None and length < 0):
            raise ValueError(f"invalid range start={start} length={length}")
        path = self._path(key)
        try:
            with open(path, "rb") as file:
                file.seek(start)
                return file.read() if length is None else file.read(length)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise ObjectNotFound(f"{key!r} not found in {self.description}") from None
        except OSError as exc:
            raise self._unavailable(f"read {key!r}", exc) from exc

    def size(self, key: str) -> int:
        path = self._path(key)
        try:
            if os.path.isdir(path):
                raise FileNotFoundError(errno.ENOENT, "is a key prefix", path)
            return os.stat(path).st_size
        except (FileNotFoundError, NotADirectoryError):
            raise ObjectNotFound(f"{key!r} not found in {self.description}") from None
        except OSError as exc:
            raise self._unavailable(f"stat {key!r}", exc) from exc

    def list(self, prefix: str) -> list[ObjectInfo]:
        # String-prefix semantics as in S3: walk only the deepest directory the prefix fixes,
        # then filter by the full prefix ("t/0" lists both "t/0/..." and "t/01/...").
        directory_part = prefix.rpartition("/")[0]
        start = self._path(directory_part) if directory_part else self._root
        found: list[ObjectInfo] = []
        try:
            for dirpath, dirnames, filenames in os.walk(start, onerror=_raise_unless_missing):
                dirnames[:] = [name for name in dirnames if not name.startswith(TEMP_PREFIX)]
                relative = os.path.relpath(dirpath, self._root)
                base = "" if relative == "." else relative.replace(os.sep, "/") + "/"
                for name in filenames:
                    key = base + name
                    if name.startswith(TEMP_PREFIX) or not key.startswith(prefix):
                        continue
                    with contextlib.suppress(FileNotFoundError):  # deleted while listing
                        found.append(ObjectInfo(key, os.stat(os.path.join(dirpath, name)).st_size))
        except OSError as exc:
            raise self._unavailable(f"list {prefix!r}", exc) from exc
        found.sort(key=lambda info: info.key)
        return found

    def delete(self, key: str) -> None:
        path = self._path(key)
        try:
            if os.path.isdir(path):
                return  # a key prefix, not an object: nothing to delete
            os.unlink(path)
        except (FileNotFoundError, NotADirectoryError):
            return
        except OSError as exc:
            raise self._unavailable(f"delete {key!r}", exc) from exc
        # Empty parent directories are left in place: removing them would race a concurrent put
        # that has just created the directory and is about to write its temp file there.
        with contextlib.suppress(OSError):
            _fsync_directory(os.path.dirname(path))

    def delete_many(self, keys: Sequence[str]) -> None:
        for key in keys:
            self.delete(key)

    def check(self) -> None:
        probe = os.path.join(self._root, f"{TEMP_PREFIX}check-{uuid.uuid4().hex}")
        try:
            os.makedirs(self._root, exist_ok=True)
            with open(probe, "xb") as file:
                file.write(b"ok")
        except OSError as exc:
            raise ObjectStoreUnavailable(
                f"object directory {self._root} is not usable (must exist or be creatable, "
                f"and be writable): {exc}"
            ) from exc
        finally:
            with contextlib.suppress(OSError):
                os.unlink(probe)

    def close(self) -> None:
        pass
