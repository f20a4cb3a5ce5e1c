"""Write a patched wheel without recompressing it.

Untouched members are copied as the raw bytes of the pristine file (local header and
compressed data, in runs, with ``copy_file_range``): nothing is decompressed or
recompressed, and memory stays flat whatever the wheel's size. Changed and new members are
written STORED (zlib's output differs between versions; stored bytes do not), with the
pristine member's own timestamp and mode, so the same inputs give the same bytes anywhere.
"""

from __future__ import annotations

import io
import itertools
import os
import stat
import struct
import zipfile
import zlib
from collections.abc import Iterable, Mapping
from pathlib import Path, PurePosixPath

from qwen38build.errors import InputError
from qwen38build.wheels import record

_LOCAL = struct.Struct("<IHHHHHIIIHH")
_CENTRAL = struct.Struct("<IHHHHHHIIIHHHHHII")
_END = struct.Struct("<IHHHHIIH")
_ZIP64_LIMIT = 0xFFFFFFFF
DEFAULT_MODE = 0o100644


_OPEN: dict[tuple[str, int, int], zipfile.ZipFile] = {}
_CHECKED: dict[int, dict[str, zipfile.ZipInfo]] = {}


def open_wheel(path: Path) -> zipfile.ZipFile:
    """A read-only ZipFile for ``path``, shared within the process, every member checked.

    Reading a 5,000-member central directory costs about 0.1 s; the lint, the patch step
    and the wheel step all read the same pristine wheel in one build. Keyed by size and
    mtime, so a changed file is read afresh. Callers must not close it. A file that is not
    a zip, or any member that fails :func:`safe_member`, is refused here, once, naming it.
    """
    try:
        st = path.stat()
        key = (os.path.realpath(path), st.st_size, st.st_mtime_ns)
        z = _OPEN.get(key)
        if z is None:
            z = zipfile.ZipFile(path)
            _CHECKED[id(z)] = _check_members(path, z)
            _OPEN[key] = z
    except zipfile.BadZipFile as exc:
        raise InputError(f"{path}: not a wheel (a zip file): {exc}.",
                         hint="re-pin it with `qwen38build lock`, or fetch it again") from None
    except OSError as exc:
        from qwen38build.errors import from_os_error

        raise from_os_error(exc, "opening a wheel") from None
    return z


def check_wheel(path: Path) -> None:
    """Refuse a file that is not a wheel we can trust to unpack, before it is stored.

    A zip whose every member passes :func:`safe_member`, with one ``*.dist-info/RECORD``
    at its top that parses. Not cached: the file is about to move into the store.
    """
    try:
        with zipfile.ZipFile(path) as z:
            infos = _check_members(path, z)
            records = [n for n in infos if n.count("/") == 1 and n.endswith(".dist-info/RECORD")]
            if len(records) != 1:
                raise InputError(
                    f"{path.name}: has {len(records)} */*.dist-info/RECORD members, not one.",
                    hint="this is not a wheel to build from; check the lock's pin")
            record.parse(z.read(records[0]), f"{path.name}:{records[0]}")
    except (zipfile.BadZipFile, EOFError, zlib.error) as exc:
        raise InputError(f"{path.name}: not a wheel (a zip file): {exc}.",
                         hint="check the lock's pin; the file is damaged or not a wheel",
                         ) from None


def member_infos(wheel: Path) -> dict[str, zipfile.ZipInfo]:
    """Every member of ``wheel`` by name, each past :func:`safe_member`."""
    z = open_wheel(wheel)
    return _CHECKED[id(z)]


def read(wheel: Path, name: str) -> bytes:
    """The bytes of member ``name`` (checked by name, CRC checked by zipfile)."""
    z = open_wheel(wheel)
    info = _CHECKED[id(z)].get(name)
    if info is None:
        raise InputError(f"{wheel}: has no member {name!r}.")
    try:
        return z.read(info)
    except (zipfile.BadZipFile, OSError, EOFError, zlib.error) as exc:
        raise InputError(f"{wheel}:{name}: the member cannot be read: {exc}.",
                         hint="fetch the wheel again (it is damaged)") from None


def extract(wheel: Path, dest: Path, members: Iterable[str] | None = None) -> list[str]:
    """Write the members named (all, if None) of ``wheel`` below ``dest``; return the
    member names written, in wheel order.

    Every member passes :func:`safe_member`; the file is opened without following links
    and must land below ``dest`` (resolved), so nothing is ever written outside it. Names
    in ``members`` that the wheel lacks are skipped (compare the result). Modes are 0644,
    or 0755 where the member is executable, whatever the umask.
    """
    infos = member_infos(wheel)
    wanted = None if members is None else set(members)
    top = os.path.realpath(dest)
    written: list[str] = []
    for name, info in infos.items():
        if (wanted is not None and name not in wanted) or name.endswith("/"):
            continue
        rel = safe_member(name, info)
        target = os.path.join(top, *rel.parts)
        parent = os.path.dirname(target)
        os.makedirs(parent, exist_ok=True)
        real_parent = os.path.realpath(parent)
        if os.path.commonpath([top, real_parent]) != top:
            raise InputError(f"{wheel}: member {name!r} would be written outside {dest}.",
                             hint="this wheel is not safe to unpack; re-pin it")
        mode = 0o755 if (info.external_attr >> 16) & 0o111 else 0o644
        data = read(wheel, name)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(target, mode)
        written.append(name)
    return written


def safe_member(name: str, info: zipfile.ZipInfo | None = None) -> PurePosixPath:
    """The member ``name`` as a relative path that stays inside its directory, or
    InputError: no absolute path, drive, ``..``, backslash, NUL or control character, and
    (given its ``info``) no symbolic link or device by the member's Unix mode."""
    p = PurePosixPath(name)
    bad = (
        not name or p.is_absolute() or name.startswith("/") or ".." in p.parts
        or "\\" in name or "\0" in name or not name.isprintable()
        or (len(name) > 1 and name[1] == ":") or not p.parts
    )
    if bad:
        raise InputError(f"wheel member {name!r} would be written outside its directory.",
                         hint="this wheel is not safe to unpack; re-pin it")
    if info is not None:
        kind = stat.S_IFMT(info.external_attr >> 16)
        if kind not in (0, stat.S_IFREG, stat.S_IFDIR):
            raise InputError(
                f"wheel member {name!r} is not a regular file (mode {kind:o}); a link or a "
                "device in a wheel is refused.", hint="this wheel is not safe to unpack")
    return p


def _check_members(path: Path, z: zipfile.ZipFile) -> dict[str, zipfile.ZipInfo]:
    """Every member past :func:`safe_member`, and no two that land on one file."""
    out: dict[str, zipfile.ZipInfo] = {}
    landed: dict[PurePosixPath, str] = {}
    for info in z.infolist():
        try:
            rel = safe_member(info.filename, info)
        except InputError as exc:
            raise InputError(f"{path}: {exc.message}", hint=exc.hint) from None
        other = landed.get(rel)
        if other is not None or info.filename in out:
            raise InputError(
                f"{path}: members {other or info.filename!r} and {info.filename!r} are one "
                "file; a wheel names each file once.", hint="this wheel is damaged; re-pin it")
        landed[rel] = info.filename
        out[info.filename] = info
    return out


class _Member:
    """One member of the output wheel. A plain class, not a dataclass: verify imports
    this module for :func:`safe_member`, and dataclasses (inspect) would double its cost."""

    __slots__ = ("data", "info", "name")

    def __init__(self, name: str, info: zipfile.ZipInfo | None, data: bytes | None) -> None:
        self.name = name
        self.info = info  # None: a new member
        self.data = data  # None: copy the pristine bytes raw


class PatchedWheel:
    """A plan for one output wheel: the pristine file plus replaced, added, deleted members."""

    def __init__(self, pristine: Path, dist_info: str, new_dist_info: str) -> None:
        self.pristine = pristine
        self.dist_info = dist_info  # e.g. "vllm-0.32.0.dist-info"
        self.new_dist_info = new_dist_info
        self._zip = open_wheel(pristine)
        self.infos = dict(member_infos(pristine))
        for info in self.infos.values():
            if info.header_offset >= _ZIP64_LIMIT or info.compress_size >= _ZIP64_LIMIT:
                raise InputError(f"{pristine}: member {info.filename} needs ZIP64; not supported.")

    def read(self, name: str) -> bytes:
        return read(self.pristine, name)

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
        pristine_record = record.parse(self.read(record_name), f"{self.pristine}:{record_name}")
        members: list[_Member] = []
        if f"{self.dist_info}/METADATA" not in self.infos:
            raise InputError(f"{self.pristine}: no {self.dist_info}/METADATA member.",
                             hint="the wheel is damaged; fetch or re-pin it")
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

        rows: record.Entries = {}
        for m in members:
            if m.data is None:
                if m.name not in pristine_record:
                    raise InputError(f"{self.pristine}: member {m.name} is not in its RECORD.",
                                     hint="the wheel is damaged; fetch or re-pin it")
                rows[m.name] = pristine_record[m.name]
            else:
                rows[m.name] = (record.hash_of(m.data), len(m.data))
        new_record = f"{self.new_dist_info}/RECORD"
        members.append(_Member(new_record, meta_time, record.render(rows, new_record)))
        self._emit(out, members, meta_time)
        return rows

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


def read_record(wheel: Path, dist_info: str) -> dict[str, tuple[str, int]]:
    """A wheel's RECORD: member → (record hash, size); RECORD's own line left out."""
    name = f"{dist_info}/RECORD"
    return record.parse(read(wheel, name), f"{wheel}:{name}")
