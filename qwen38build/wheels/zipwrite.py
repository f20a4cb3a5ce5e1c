"""Zips whose bytes depend on their members alone: the wheels and archives the steps write.

Members in the order given, each dated 1980-01-01 (or a SOURCE_DATE_EPOCH-style time), mode
0o644, deflated at level 9; written beside the target and renamed into place, so a kill
leaves no half zip under the final name.
"""

from __future__ import annotations

import time
import zipfile
from pathlib import Path

_EPOCH_MIN = 315532800  # 1980-01-01T00:00:00Z, the earliest time a zip entry can hold


def zip_time(epoch: int | None) -> tuple[int, int, int, int, int, int]:
    """The members' date: 1980-01-01, or ``epoch`` (seconds, rounded down to even)."""
    if epoch is None or epoch < _EPOCH_MIN:
        return (1980, 1, 1, 0, 0, 0)
    t = time.gmtime(epoch)
    return (t.tm_year, t.tm_mon, t.tm_mday, t.tm_hour, t.tm_min, t.tm_sec - t.tm_sec % 2)


def write_zip(out: Path, files: dict[str, bytes], order: list[str] | None = None, *,
              epoch: int | None = None) -> Path:
    """Write ``files`` (member name -> bytes) to ``out`` in ``order`` (default: sorted)."""
    date_time = zip_time(epoch)
    tmp = out.with_name(out.name + ".tmp")
    with zipfile.ZipFile(tmp, "w") as zf:
        for name in sorted(files) if order is None else order:
            info = zipfile.ZipInfo(name, date_time=date_time)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.create_system = 3
            info.external_attr = (0o100644 & 0xFFFF) << 16
            zf.writestr(info, files[name], compresslevel=9)
    tmp.replace(out)
    return out
