"""Kernel builds: compile CUDA sources per arch with nvcc, and pack the pthfa wheel.

A library module: no printing. A failed compile raises :class:`KernelBuildError` naming the
arch, the file and the line of nvcc's first error.

The compiler is an explicit :class:`Nvcc`: the locked toolchain's (the default of every
build) or, only when the user asks, the system's. Either runs with a scrubbed environment:
``LC_ALL=C``, ``TZ=UTC``, ``PATH`` = the compiler's own folder then ``/usr/bin:/bin`` (the
host compiler), ``HOME`` and ``TMPDIR`` inside the temporary directory, and nothing else
(no ``CUDA_HOME``: nvcc finds its headers and back ends beside itself, by nvcc.profile).

Determinism: every compile runs in a fresh temporary directory holding copies of the sources
(so no absolute path of the caller's tree reaches nvcc), with fixed flags. Several sources
are compiled as one unit through a generated file that includes each, in the order given, so
one cubin per arch holds every kernel.
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path

from qwen38build.errors import KernelBuildError
from qwen38build.proc import BASE_PATH, environment, run
from qwen38build.wheels import record
from qwen38build.wheels.zipwrite import write_zip

__all__ = [
    "BASE_PATH",
    "NVCC_ENV",
    "NVCC_FLAGS",
    "Nvcc",
    "arch_gencode",
    "compile_arch",
    "cubin_sm",
    "nvcc_version",
    "write_kernel_wheel",
    "write_pthfa_wheel",
]

#: Flags every compile gets, besides the target and the output kind.
NVCC_FLAGS: tuple[str, ...] = ("-O3", "-std=c++17", "--restrict")

_ARCH_RE = re.compile(r"^(\d{1,2})\.(\d)$")
# nvcc front end ("file(12): error: ..."), host compiler ("file:12:3: error: ..."),
# ptxas ("ptxas ... error   : ..., line 12; ...").
_FRONT_ERR = re.compile(r"^(?P<file>[^\s:()][^:()]*)\((?P<line>\d+)\): (?:catastrophic )?error")
_HOST_ERR = re.compile(r"^(?P<file>[^\s:][^:]*):(?P<line>\d+):(?:\d+:)? (?:fatal )?error")
_PTXAS_ERR = re.compile(r"ptxas.*error\s*:.*?(?:line (?P<line>\d+))?")
_UNIT = "__pthfa_unit__.cu"


#: Where the host compiler and the shell tools nvcc calls are found; nothing else is searched.
#: The variable that asks for the system nvcc instead of the locked toolchain's.
NVCC_ENV = "QWEN38BUILD_NVCC"


@dataclass(frozen=True)
class Nvcc:
    """One nvcc and the ``PATH`` it runs with: its own folder first, then :data:`BASE_PATH`."""

    exe: Path
    system: bool = False

    @classmethod
    def find_system(cls) -> Nvcc:
        """The ``nvcc`` on the caller's ``PATH``; used only when the user asked for it."""
        found = shutil.which("nvcc")
        if found is None:  # a request this machine cannot meet: bad input, before any work
            from qwen38build.errors import UsageError

            raise UsageError(
                "the system nvcc was asked for (--system-nvcc or QWEN38BUILD_NVCC=system), "
                "but no nvcc is on PATH.",
                hint="drop the request to compile with the locked toolchain, or put nvcc on PATH",
            )
        return cls(Path(found), system=True)

    def env(self, tmp: Path | None = None) -> dict[str, str]:
        """nvcc's whole environment: its folder then the host compiler's on PATH, and
        HOME and TMPDIR inside ``tmp`` (so no temporary name outside it reaches the PTX)."""
        declared = {"LANG": "C", **({"HOME": str(tmp), "TMPDIR": str(tmp)} if tmp else {})}
        return environment(path=f"{self.exe.parent}{os.pathsep}{BASE_PATH}", declared=declared)


def system_nvcc_requested(flag: bool) -> bool:
    """Whether the user asked for the system nvcc: the flag, or ``QWEN38BUILD_NVCC=system``."""
    value = os.environ.get(NVCC_ENV, "")
    if value not in ("", "system", "toolchain"):
        from qwen38build.errors import UsageError

        raise UsageError(f"{NVCC_ENV}={value!r} is not a choice: use 'system' or 'toolchain'.")
    return flag or value == "system"


def nvcc_version(nvcc: Nvcc | None = None) -> str:
    """The full text ``nvcc --version`` prints (the system nvcc's is part of its digest)."""
    nvcc = nvcc or Nvcc.find_system()
    proc = run([nvcc.exe, "--version"], what="nvcc", env=nvcc.env())
    if not proc.ok:
        raise KernelBuildError(
            f"{nvcc.exe} --version exited {proc.returncode}: {proc.stderr.strip()}"
        )
    return proc.stdout


def arch_gencode(arch: str) -> tuple[int, str]:
    """Canonical arch ("9.0") -> (90, "arch=compute_90,code=sm_90")."""
    m = _ARCH_RE.match(arch)
    if not m:
        raise KernelBuildError(
            f"CUDA arch {arch!r} is not canonical: expected MAJOR.MINOR such as '9.0'"
        )
    sm = int(m.group(1)) * 10 + int(m.group(2))
    return sm, f"arch=compute_{sm},code=sm_{sm}"


def _first_error(stderr: str, names: dict[str, str]) -> tuple[str, int | None, str]:
    """(file, line, the error line) of nvcc's first error; file mapped back to the source."""
    for raw in stderr.splitlines():
        line = raw.strip()
        for rx in (_FRONT_ERR, _HOST_ERR):
            m = rx.match(line)
            if m:
                fname = Path(m.group("file")).name
                return names.get(fname, fname), int(m.group("line")), line
        if line.startswith("ptxas") and "error" in line:
            pm = _PTXAS_ERR.search(line)
            ln = int(pm.group("line")) if pm and pm.group("line") else None
            return "<ptxas>", ln, line
    first = next((s.strip() for s in stderr.splitlines() if s.strip()), "(no output)")
    return "<unknown>", None, first


def _run_nvcc(
    nvcc: Nvcc, cmd: list[str], cwd: Path, arch: str, names: dict[str, str]
) -> None:
    proc = run(cmd, what="nvcc", cwd=cwd, env=nvcc.env(cwd.parent))
    if not proc.ok:
        fname, line, text = _first_error(proc.stderr + proc.stdout, names)
        where = f"{fname}:{line}" if line is not None else fname
        raise KernelBuildError(
            f"nvcc failed for arch {arch} at {where}: {text}",
            hint="the full nvcc output:\n" + (proc.stderr + proc.stdout).strip(),
        )


def compile_arch(
    sources: list[Path],
    arch: str,
    out_dir: Path,
    *,
    nvcc: Nvcc | None = None,
    ptx: bool = False,
) -> list[Path]:
    """Compile ``sources`` (.cu, plus headers they include) into ``out_dir/sm_XY.cubin``.

    Headers (anything not ending in ``.cu``) are copied beside the sources but not compiled
    directly. With ``ptx=True`` also writes ``out_dir/compute_XY.ptx`` (for the newest arch, so
    later GPUs can JIT it). Returns the written paths, cubin first. ``nvcc`` defaults to
    the system's (for direct callers; the build's steps always pass one).
    """
    sm, gencode = arch_gencode(arch)
    if not sources:
        raise KernelBuildError(f"arch {arch}: no sources to compile")
    names: dict[str, str] = {}
    for src in sources:
        if not src.is_file():
            raise KernelBuildError(f"arch {arch}: source {src} does not exist")
        if src.name in names or src.name == _UNIT:
            raise KernelBuildError(f"arch {arch}: two sources share the file name {src.name!r}")
        names[src.name] = str(src)
    units = [s.name for s in sources if s.suffix == ".cu"]
    if not units:
        raise KernelBuildError(f"arch {arch}: no .cu file among the sources")
    out_dir.mkdir(parents=True, exist_ok=True)
    nvcc = nvcc or Nvcc.find_system()
    with tempfile.TemporaryDirectory(prefix="qwen38build-nvcc-") as tmp:
        work = Path(tmp) / "src"
        work.mkdir()
        for src in sources:
            shutil.copyfile(src, work / src.name)
        (work / _UNIT).write_text("".join(f'#include "{u}"\n' for u in units))
        base = [str(nvcc.exe), *NVCC_FLAGS]
        cubin = f"sm_{sm}.cubin"
        _run_nvcc(
            nvcc, [*base, "-cubin", "-gencode", gencode, "-o", cubin, _UNIT], work, arch, names
        )
        outs = [out_dir / cubin]
        shutil.copyfile(work / cubin, outs[0])
        if ptx:
            ptx_name = f"compute_{sm}.ptx"
            ptx_cmd = [*base, "-ptx", f"-arch=compute_{sm}", "-o", ptx_name, _UNIT]
            _run_nvcc(nvcc, ptx_cmd, work, arch, names)
            outs.append(out_dir / ptx_name)
            shutil.copyfile(work / ptx_name, outs[1])
    got = cubin_sm(outs[0])
    if got != sm:
        raise KernelBuildError(f"arch {arch}: nvcc wrote a cubin for sm_{got}, not sm_{sm}")
    return outs


def cubin_sm(path: Path) -> int:
    """The SM version (e.g. 90) a cubin was built for, from bits 8-15 of its ELF e_flags."""
    data = path.read_bytes()[:64]
    if len(data) < 52 or data[:4] != b"\x7fELF":
        raise KernelBuildError(f"{path} is not an ELF file (no cubin)")
    if data[4] == 2:  # ELFCLASS64
        (flags,) = struct.unpack_from("<I", data, 48)
    elif data[4] == 1:
        (flags,) = struct.unpack_from("<I", data, 36)
    else:
        raise KernelBuildError(f"{path}: unknown ELF class {data[4]}")
    return int((flags >> 8) & 0xFF)


# ---------------------------------------------------------------------------------------------
# wheel


def _wheel_version(version: str) -> str:
    v = version[1:] if version[:1] in ("v", "V") else version
    if not re.fullmatch(r"[0-9]+(\.[0-9]+)*([A-Za-z0-9.+]*)", v):
        raise KernelBuildError(f"pthfa version {version!r} is not a version (e.g. v0.1.0)")
    return v


def write_pthfa_wheel(
    package_dir: Path,
    cubins: list[Path],
    out_dir: Path,
    version: str,
    *,
    epoch: int | None = None,
    tag: str = "py3-none-linux_x86_64",
    entry_points: bytes | None = None,
) -> Path:
    """pthfa's wheel: the package ``pthfa/python/pthfa`` and the cubins under ``cubins/``;
    ``entry_points`` becomes the dist-info's (pthfa's vLLM plugin registration)."""
    return write_kernel_wheel(
        "pthfa", package_dir, cubins, out_dir, version, epoch=epoch, tag=tag,
        entry_points=entry_points, subdir="cubins",
        summary="int8 per-token-head paged KV cache attention kernels (cubins + launcher)")


def write_kernel_wheel(
    dist_name: str,
    package_dir: Path,
    binaries: list[Path],
    out_dir: Path,
    version: str,
    *,
    summary: str,
    subdir: str,
    epoch: int | None = None,
    tag: str = "py3-none-linux_x86_64",
    entry_points: bytes | None = None,
) -> Path:
    """Write ``<dist_name>-<version>-<tag>.whl`` into ``out_dir``; same inputs, same bytes.

    ``package_dir`` is the Python package: its files go under ``<dist_name>/``
    (``__pycache__``, ``*.pyc`` and any ``<subdir>/`` already there left out); the
    ``binaries`` (cubins, PTX, shared libraries) under ``<dist_name>/<subdir>/`` by file
    name. Members are sorted, dated 1980-01-01 (or ``epoch``, e.g. SOURCE_DATE_EPOCH),
    mode 0o644, deflated.
    """
    ver = _wheel_version(version)
    if not (package_dir / "__init__.py").is_file():
        raise KernelBuildError(f"{package_dir} is not a Python package (no __init__.py)")
    files: dict[str, bytes] = {}
    for path in sorted(package_dir.rglob("*")):
        rel = path.relative_to(package_dir)
        if not path.is_file() or "__pycache__" in rel.parts or path.suffix == ".pyc":
            continue
        if rel.parts[0] == subdir:
            continue
        files[f"{dist_name}/{rel.as_posix()}"] = path.read_bytes()
    seen: set[str] = set()
    for binary in binaries:
        if binary.name in seen:
            raise KernelBuildError(f"two {subdir} share the file name {binary.name!r}")
        seen.add(binary.name)
        files[f"{dist_name}/{subdir}/{binary.name}"] = binary.read_bytes()
    dist = f"{dist_name}-{ver}.dist-info"
    files[f"{dist}/METADATA"] = (
        "Metadata-Version: 2.1\n"
        f"Name: {dist_name}\n"
        f"Version: {ver}\n"
        f"Summary: {summary}\n"
        "Requires-Python: >=3.10\n"
    ).encode()
    files[f"{dist}/WHEEL"] = (
        "Wheel-Version: 1.0\n"
        "Generator: qwen38build.kernels.kernels\n"
        "Root-Is-Purelib: false\n"
        f"Tag: {tag}\n"
    ).encode()
    if entry_points is not None:
        files[f"{dist}/entry_points.txt"] = entry_points
    record_name = f"{dist}/RECORD"
    files[record_name] = record.render(
        {name: (record.hash_of(data), len(data)) for name, data in files.items()}, record_name)

    out_dir.mkdir(parents=True, exist_ok=True)
    # RECORD last, as the wheel spec recommends; everything else sorted.
    order = [*sorted(n for n in files if n != record_name), record_name]
    return write_zip(out_dir / f"{dist_name}-{ver}-{tag}.whl", files, order, epoch=epoch)
