"""Write a patched wheel without recompressing it.

Untouched members are copied as the raw bytes of the pristine file (local header and
compressed data, in runs, with ``copy_file_range``): nothing is decompressed or
recompressed, and memory stays flat whatever the wheel's size. Changed and new members are
written STORED (zlib's output differs between versions; stored bytes do not), with the
pristine member's own timestamp and mode, so the same inputs give the same bytes anywhere.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import itertools
import os
import struct
import zipfile
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from qwen38build.errors import InputError

_LOCAL = struct.Struct("<IHHHHHIIIHH")
_CENTRAL = struct.Struct("<IHHHHHHIIIHHHHHII")
_END = struct.Struct("<IHHHHIIH")
_ZIP64_LIMIT = 0xFFFFFFFF
DEFAULT_MODE = 0o100644


_OPEN: dict[tuple[str, int, int], zipfile.ZipFile] = {}


def open_wheel(path: Path) -> zipfile.ZipFile:
    """A read-only ZipFile for ``path``, shared within the process.

    Reading a 5,000-member central directory costs about 0.1 s; the lint, the patch step
    and the wheel step all read the same pristine wheel in one build. Keyed by size and
    mtime, so a changed file is read afresh. Callers must not close it.
    """
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    z = _OPEN.get(key)
    if z is None:
        z = _OPEN[key] = zipfile.ZipFile(path)
    return z


def record_hash(data: bytes) -> str:
    """The RECORD spelling of a sha256: ``sha256=<urlsafe b64, no padding>``."""
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def safe_member(name: str) -> str:
    """Refuse a member name that would be written outside the wheel's directory."""
    p = PurePosixPath(name)
    if not name or p.is_absolute() or ".." in p.parts or "\\" in name or name.startswith("/"):
        raise InputError(f"wheel member {name!r} would be written outside its directory.")
    return name


@dataclass(frozen=True)
class _Member:
    name: str
    info: zipfile.ZipInfo | None  # None: a new member
    data: bytes | None  # None: copy the pristine bytes raw


class PatchedWheel:
    """A plan for one output wheel: the pristine file plus replaced, added, deleted members."""

    def __init__(self, pristine: Path, dist_info: str, new_dist_info: str) -> None:
        self.pristine = pristine
        self.dist_info = dist_info  # e.g. "vllm-0.32.0.dist-info"
        self.new_dist_info = new_dist_info
        self._zip = open_wheel(pristine)
        self.infos = {i.filename: i for i in self._zip.infolist()}
        for info in self.infos.values():
            safe_member(info.filename)
            if info.header_offset >= _ZIP64_LIMIT or info.compress_size >= _ZIP64_LIMIT:
                raise InputError(f"{pristine}: member {info.filename} needs ZIP64; not supported.")

    def read(self, name: str) -> bytes:
        return self._zip.read(name)

    def write(
        self,
        out: Path,
        *,
        replace: Mapping[str, bytes],
        delete: set[str],
        dist_info_files: Mapping[str, bytes],
    ) -> dict[str, tuple[str, int]]:
        """Write the wheel to ``out``; returns its RECORD as ``{member: (hash, size)}``.

        ``replace`` maps existing or new member names to their content; ``dist_info_files``
        replaces files of the dist-info (by base name) under the new dist-info name.
        """
        for name in (*replace, *delete):
            safe_member(name)
        record_name = f"{self.dist_info}/RECORD"
        pristine_record = _read_record(self.read(record_name))
        members: list[_Member] = []
        meta_time = self.infos[f"{self.dist_info}/METADATA"]
        dist_members: list[_Member] = []
        for name, info in self.infos.items():
            if name in delete or name == record_name:
                continue
            if name.startswith(self.dist_info + "/"):
                base = name[len(self.dist_info) + 1 :]
                new_name = f"{self.new_dist_info}/{base}"
                data = dist_info_files.get(base)
                if data is None:
                    data = self.read(name)  # renamed: the local header names it anew
                dist_members.append(_Member(new_name, info, data))
            else:
                members.append(_Member(name, info, replace.get(name)))
        for name in sorted(set(replace) - set(self.infos)):
            members.append(_Member(name, None, replace[name]))
        members.extend(dist_members)

        record: dict[str, str] = {}
        sizes: dict[str, int] = {}
        for m in members:
            if m.data is None:
                h, size = pristine_record[m.name]
                record[m.name], sizes[m.name] = h, size
            else:
                record[m.name], sizes[m.name] = record_hash(m.data), len(m.data)
        new_record = f"{self.new_dist_info}/RECORD"
        lines = io.StringIO()
        writer = csv.writer(lines, lineterminator="\n")
        for name in sorted(record):
            writer.writerow([name, record[name], sizes[name]])
        writer.writerow([new_record, "", ""])
        members.append(_Member(new_record, meta_time, lines.getvalue().encode()))
        self._emit(out, members, meta_time)
        return {name: (record[name], sizes[name]) for name in record}

    def _emit(self, out: Path, members: list[_Member], default: zipfile.ZipInfo) -> None:
        ordered = sorted(self.infos.values(), key=lambda i: i.header_offset)
        end_of = {a.filename: b.header_offset for a, b in itertools.pairwise(ordered)}
        if ordered:
            end_of[ordered[-1].filename] = self._zip.start_dir
        central: list[bytes] = []
        with self.pristine.open("rb") as src, out.open("wb") as dst:
            run: list[int] = []  # [start, end) of the pending raw run in the pristine file

            def flush() -> None:
                if run:
                    _copy_range(src, dst, run[0], run[1] - run[0])
                    run.clear()

            for m in members:
                offset = dst.tell() + (run[1] - run[0] if run else 0)
                if m.data is None and m.info is not None:
                    start, end = m.info.header_offset, end_of[m.name]
                    if run and run[1] == start:
                        run[1] = end
                    else:
                        flush()
                        offset = dst.tell()
                        run.extend((start, end))
                    central.append(_central_raw(m.info, offset))
                    continue
                flush()
                offset = dst.tell()
                info = m.info or default
                mode = (info.external_attr >> 16) if m.info is not None else DEFAULT_MODE
                assert m.data is not None
                dst.write(_local_stored(m.name, m.data, info.date_time))
                dst.write(m.data)
                central.append(_central_stored(m.name, m.data, info.date_time, mode, offset))
            flush()
            cd_start = dst.tell()
            for rec in central:
                dst.write(rec)
            cd_size = dst.tell() - cd_start
            if len(central) > 0xFFFF or cd_start >= _ZIP64_LIMIT:
                raise InputError(f"{out}: the patched wheel would need ZIP64; not supported.")
            dst.write(_END.pack(0x06054B50, 0, 0, len(central), len(central), cd_size,
                                cd_start, 0))
            dst.flush()  # the store fsyncs every output when it seals the entry


def _copy_range(src: io.BufferedReader, dst: io.BufferedWriter, start: int, length: int) -> None:
    dst.flush()
    sfd, dfd = src.fileno(), dst.fileno()
    done = 0
    try:
        while done < length:
            n = os.copy_file_range(sfd, dfd, length - done, start + done)
            if n == 0:
                break
            done += n
    except OSError:
        pass  # not supported here (another filesystem, an old kernel): copy by hand
    if done < length:
        src.seek(start + done)
        remaining = length - done
        os.lseek(dfd, 0, os.SEEK_END)
        while remaining:
            chunk = src.read(min(remaining, 1 << 20))
            if not chunk:
                raise InputError(f"{src.name}: truncated while copying member bytes.")
            os.write(dfd, chunk)
            remaining -= len(chunk)
    dst.seek(0, os.SEEK_END)


def _dos(date_time: tuple[int, int, int, int, int, int]) -> tuple[int, int]:
    y, mo, d, h, mi, s = date_time
    return (h << 11) | (mi << 5) | (s // 2), ((max(y, 1980) - 1980) << 9) | (mo << 5) | d


def _flags(name: str) -> int:
    return 0x800 if not name.isascii() else 0


def _local_stored(name: str, data: bytes, date_time: tuple[int, int, int, int, int, int]) -> bytes:
    t, d = _dos(date_time)
    raw = name.encode()
    crc = zlib.crc32(data)
    return _LOCAL.pack(0x04034B50, 10, _flags(name), 0, t, d, crc, len(data), len(data),
                       len(raw), 0) + raw


def _central_stored(
    name: str, data: bytes, date_time: tuple[int, int, int, int, int, int], mode: int,
    offset: int,
) -> bytes:
    t, d = _dos(date_time)
    raw = name.encode()
    crc = zlib.crc32(data)
    return _CENTRAL.pack(0x02014B50, (3 << 8) | 20, 10, _flags(name), 0, t, d, crc, len(data),
                         len(data), len(raw), 0, 0, 0, 0, (mode & 0xFFFF) << 16, offset) + raw


def _central_raw(info: zipfile.ZipInfo, offset: int) -> bytes:
    t, d = _dos(info.date_time)
    raw = info.filename.encode()
    return _CENTRAL.pack(
        0x02014B50, (info.create_system << 8) | info.create_version, info.extract_version,
        info.flag_bits, info.compress_type, t, d, info.CRC, info.compress_size,
        info.file_size, len(raw), 0, 0, 0, info.internal_attr, info.external_attr, offset,
    ) + raw


def _read_record(data: bytes) -> dict[str, tuple[str, int]]:
    out: dict[str, tuple[str, int]] = {}
    for row in csv.reader(io.StringIO(data.decode())):
        if len(row) >= 3 and row[1]:
            out[row[0]] = (row[1], int(row[2]))
    return out


def read_record(wheel: Path, dist_info: str) -> dict[str, tuple[str, int]]:
    """A wheel's RECORD: member → (record hash, size); RECORD's own line left out."""
    return _read_record(open_wheel(wheel).read(f"{dist_info}/RECORD"))


def extract(wheel: Path, dest: Path, members: Iterable[str] | None = None) -> list[str]:
    """Extract all members of ``wheel`` (or the named ones) below ``dest``; return the names
    of the files written.

    Every name passes :func:`safe_member` before anything is written; an existing file is
    never overwritten (two sources of one path are an error, not a silent choice). Modes are
    not restored: the caller decides which members may run.
    """
    import shutil

    written: list[str] = []
    with zipfile.ZipFile(wheel) as z:
        infos = z.infolist()
        if members is not None:
            wanted = set(members)
            infos = [i for i in infos if i.filename in wanted]
            missing = wanted - {i.filename for i in infos}
            if missing:
                raise InputError(f"{wheel.name}: no member {sorted(missing)[0]!r}.")
        for info in infos:
            safe_member(info.filename)
        for info in infos:
            target = dest / info.filename
            if info.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                with z.open(info) as src, target.open("xb") as out:
                    shutil.copyfileobj(src, out, 1 << 20)
            except FileExistsError:
                raise InputError(
                    f"{wheel.name}: member {info.filename!r} would overwrite a file already "
                    f"extracted into {dest}."
                ) from None
            written.append(info.filename)
    return written
