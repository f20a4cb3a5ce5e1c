"""A wheel's RECORD (PEP 376/427): the one place it is hashed, read, written and updated.

A RECORD is CSV, one row per member: ``path,sha256=<urlsafe base64, no padding>,size``,
and its own row with the hash and size left empty. Written sorted, RECORD's own row last,
so the same members give the same bytes.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
from collections.abc import Mapping

from qwen38build.errors import InputError

Entries = dict[str, tuple[str, int]]  # member → (record hash, size)


def hash_of(data: bytes) -> str:
    """The RECORD spelling of ``data``'s sha256."""
    return hash_from_hex(hashlib.sha256(data).hexdigest())


def hash_from_hex(sha256_hex: str) -> str:
    """The RECORD spelling of a sha256 given in hex."""
    raw = bytes.fromhex(sha256_hex)
    return "sha256=" + base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def parse(data: bytes, where: str = "RECORD") -> Entries:
    """Every hashed row of a RECORD (its own row, hashless, left out)."""
    out: Entries = {}
    try:
        for row in csv.reader(io.StringIO(data.decode("utf-8"))):
            if len(row) >= 3 and row[1]:
                out[row[0]] = (row[1], int(row[2]))
    except (UnicodeDecodeError, ValueError, csv.Error) as exc:
        raise InputError(f"{where}: not a valid RECORD: {exc}.",
                         hint="the wheel is damaged; fetch or re-pin it") from None
    return out


def render(entries: Mapping[str, tuple[str, int]], record_name: str) -> bytes:
    """The RECORD of ``entries``, sorted, with ``record_name``'s own row last."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for name in sorted(entries):
        writer.writerow([name, *entries[name]])
    writer.writerow([record_name, "", ""])
    return out.getvalue().encode()


def update(data: bytes, updates: Mapping[str, tuple[str, int] | None]) -> bytes:
    """``data`` with the rows of ``updates`` replaced (None: removed) or added at the end,
    every other row kept as it was (an installer's RECORD keeps its own order)."""
    rows = list(csv.reader(io.StringIO(data.decode("utf-8"))))
    seen: set[str] = set()
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for row in rows:
        if row and row[0] in updates:
            seen.add(row[0])
            new = updates[row[0]]
            if new is not None:
                writer.writerow([row[0], *new])
        elif row:
            writer.writerow(row)
    for name in sorted(set(updates) - seen):
        new = updates[name]
        if new is not None:
            writer.writerow([name, *new])
    return out.getvalue().encode()
