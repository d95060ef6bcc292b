"""Where the repository's test tools live (installed by scripts/install-deps.sh)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOOLS_BIN = ROOT / ".tools" / "bin"
JAVA_DIR = ROOT / "tests" / "java"
JAVA_TARGET = JAVA_DIR / "target"
