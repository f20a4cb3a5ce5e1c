"""The PTHFA_* environment knobs, read once."""

from __future__ import annotations

import os


class Knobs:
    """The environment knobs, read once (at the first call) rather than on every launch:
    ``PTHFA_IMPL``, ``PTHFA_PART_SIZE``, ``PTHFA_VALIDATE``, ``PTHFA_LAUNCH``. A program that
    changes them later calls :func:`reload_env`."""

    __slots__ = ("impl", "launch", "part_size", "validate")

    def __init__(self) -> None:
        self.impl = os.environ.get("PTHFA_IMPL", "")
        self.part_size = os.environ.get("PTHFA_PART_SIZE", "")
        self.validate = os.environ.get("PTHFA_VALIDATE", "") == "always"
        self.launch = os.environ.get("PTHFA_LAUNCH", "")


_KNOBS: list[Knobs] = []


def knobs() -> Knobs:
    if not _KNOBS:
        _KNOBS.append(Knobs())
    return _KNOBS[0]
