"""The base class of every IPC message.

Apart from ``kafscale.ipc.messages`` so that ``messages`` (which builds the tagged union of every
message and decodes it) and ``kafscale.ipc.write_path`` (whose messages are in that union) both
subclass it without importing each other.
"""

from __future__ import annotations

import msgspec


class Message(msgspec.Struct, tag=True, frozen=True):
    """Base of all IPC messages; the class name is the tag on the wire."""
