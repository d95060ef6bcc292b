"""What every KafScale program does first, before it imports the libraries its work needs.

``without_hypothesis``: kio's phantom types register a hypothesis strategy for each type as they
are defined, whenever hypothesis can be imported. Where it is installed (the test environment)
that costs every process importing kio 0.2 s, and about 4 s of CPU more when the process's
working directory holds no hypothesis charmap cache (``.hypothesis/unicode_data``) -- as for
every broker the test harness starts in a fresh directory: its coordinator booted in 30-40 s on
a loaded 2-core CI machine. No KafScale program uses hypothesis, so they hide it. Never call it
in a process that runs tests.
"""

from __future__ import annotations

import sys


def without_hypothesis() -> None:
    """Make ``import hypothesis`` fail in this process (unless it is imported already)."""
    sys.modules.setdefault("hypothesis", None)  # type: ignore[arg-type]
