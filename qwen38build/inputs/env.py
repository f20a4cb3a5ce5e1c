"""What the tool reads from the process environment beyond the recipe, each in one place."""

from __future__ import annotations

import os
from pathlib import Path

#: Folders holding fixed-output inputs already (a mirror of wheels): searched by file name,
#: every file checked against the lock's sha256 while copied.
ENV_SOURCES = "QWEN38BUILD_SOURCES"


def source_dirs() -> list[Path]:
    """The folders of ``$QWEN38BUILD_SOURCES`` (``os.pathsep``-separated), in order."""
    return [Path(d) for d in os.environ.get(ENV_SOURCES, "").split(os.pathsep) if d]
