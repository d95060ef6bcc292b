"""Where each process listens: ipc:// sockets in the broker's private runtime directory.

The supervisor creates the runtime directory (mode 0700) per run; its path is short so socket
paths stay under the 107-byte limit of Unix socket names.
"""

from __future__ import annotations

import os

SUPERVISOR_NOTICES = "supervisor.sock"


def address(runtime_dir: str, role: str, index: int = 0) -> str:
    """The ROUTER endpoint of process ``role``-``index``."""
    return "ipc://" + os.path.join(runtime_dir, f"{role}-{index}.sock")


def supervisor_address(runtime_dir: str) -> str:
    """The PULL endpoint where children report Ready / BootFailed."""
    return "ipc://" + os.path.join(runtime_dir, SUPERVISOR_NOTICES)
