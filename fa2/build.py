#!/usr/bin/env python3
"""Compile the fa2fp8 library for one CUDA arch: the one compile implementation.

    python3 fa2/build.py --tree PATCHED_FA2_ROOT --cutlass CUTLASS_ROOT --ours fa2 \\
        --nvcc PATH/TO/nvcc --arch 9.0 --out DIR [-j N] [--stock] [--dry-run]

Reads fa2/build.toml (the units, flags and link of each variant), compiles every unit of the
variant for `-gencode arch=compute_XY,code=sm_XY` in parallel, prints each unit's seconds and
links DIR/libfa2fp8_smXY.so (DIR/libfa2stock_smXY.so with --stock). DIR also gets
`<library>.json`: the commands, each unit's seconds and the library's sha256.

Deterministic output: every command runs in one work folder where `tree`, `cutlass` and `ours`
are links to the three roots, with paths relative to it; no -g or -lineinfo; nvcc's random
names seeded per unit (-frandom-seed); the unit's path as cudafe++ and cicc see it pinned to
the relative one (-Xcudafe --orig_src_path_name: nvcc hands them the absolute path, which
goes into the module id in every internal-linkage device symbol's name, such as CuTe's and
libcu++'s function objects, so a build in another folder gave other cubins); the link strips
the symbol table (the static initialisers' names carry a temporary file's process id). Two
builds in two folders give the same bytes (tests/test_fa2_build.py builds a unit twice with
the real nvcc where there is one).

Standard library only (Python 3.11+, tomllib), so that the build engine can run it as a
builder with nothing but the interpreter and the locked nvcc.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOTS = ("tree", "cutlass", "ours")
HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Unit:
    source: str          # relative to the work folder, e.g. "tree/csrc/flash_attn/src/x.cu"
    obj: str             # relative to the work folder, e.g. "obj/tree__csrc__..__x.o"
    argv: tuple[str, ...]


def arch_digits(arch: str) -> str:
    """'9.0' -> '90', '8.6' -> '86'; refuses what nvcc's -gencode would not take."""
    m = re.fullmatch(r"(\d+)\.(\d+)([af]?)", arch.strip())
    if not m:
        raise ValueError(f"arch {arch!r}: expected MAJOR.MINOR, e.g. 9.0")
    return f"{m.group(1)}{m.group(2)}{m.group(3)}"


def rooted(path: str) -> str:
    """'tree:csrc/x.cu' -> 'tree/csrc/x.cu' (relative to the work folder)."""
    root, sep, rest = path.partition(":")
    if not sep or root not in ROOTS or not rest or rest.startswith("/") or ".." in rest.split("/"):
        raise ValueError(f"{path!r}: expected ROOT:relative/path with ROOT one of {ROOTS}")
    return f"{root}/{rest}"


def load_spec(path: Path) -> dict:
    spec = tomllib.loads(path.read_text())
    for key in ("compile", "link", "variants"):
        if key not in spec:
            raise ValueError(f"{path}: no [{key}]")
    return spec


def library_name(spec: dict, variant: str, arch: str) -> str:
    return str(spec["variants"][variant]["library"]).format(arch=arch_digits(arch))


def unit_commands(spec: dict, variant: str, arch: str, nvcc: str,
                  extra: tuple[str, ...] = ()) -> list[Unit]:
    """The compile command of every unit of VARIANT, relative to the work folder (EXTRA: more
    nvcc flags after the spec's, e.g. --ptxas-options=-v for the register counts)."""
    if variant not in spec["variants"]:
        raise ValueError(f"no variant {variant!r} (have {sorted(spec['variants'])})")
    comp = spec["compile"]
    var = spec["variants"][variant]
    digits = arch_digits(arch)
    defines = [*comp.get("defines", []), *var.get("defines", [])]
    common = [
        *comp.get("flags", []),
        "-gencode", f"arch=compute_{digits},code=sm_{digits}",
        *(f"-D{d}" for d in defines),
        *(f"-I{rooted(i)}" for i in comp.get("include", [])),
        *extra,
    ]
    units = []
    seen = set()
    for entry in var["units"]:
        src = rooted(entry)
        if src in seen:
            raise ValueError(f"variant {variant}: unit {entry} listed twice")
        seen.add(src)
        obj = "obj/" + src.replace("/", "__").removesuffix(".cu") + ".o"
        argv = (nvcc, "-c", *common, f"-frandom-seed={src}",
                "-Xcudafe", f"--orig_src_path_name={src}", src, "-o", obj)
        units.append(Unit(src, obj, argv))
    return units


def link_command(spec: dict, variant: str, arch: str, nvcc: str,
                 units: list[Unit]) -> tuple[str, ...]:
    lib = library_name(spec, variant, arch)
    return (nvcc, *spec["link"].get("flags", []), "-Xlinker", f"-soname={lib}",
            *(u.obj for u in units), "-o", lib)


def prepare_work(work: Path, roots: dict[str, Path]) -> None:
    """A fresh work folder with the three root links and an obj/ folder."""
    if work.exists():
        shutil.rmtree(work)
    (work / "obj").mkdir(parents=True)
    for name in ROOTS:
        target = roots[name].resolve()
        if not target.is_dir():
            raise FileNotFoundError(f"--{name} {roots[name]}: not a folder")
        (work / name).symlink_to(target, target_is_directory=True)


def run_unit(unit: Unit, work: Path) -> tuple[Unit, float, subprocess.CompletedProcess[str]]:
    t0 = time.monotonic()
    proc = subprocess.run(unit.argv, cwd=work, capture_output=True, text=True, check=False)
    return unit, time.monotonic() - t0, proc


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tree", required=True, type=Path,
                    help="FA2 source root (patched; unpatched with --stock)")
    ap.add_argument("--cutlass", required=True, type=Path, help="CUTLASS root (holds include/)")
    ap.add_argument("--ours", type=Path, default=HERE, help="this fa2/ folder (build.toml, csrc/)")
    ap.add_argument("--nvcc", default="nvcc")
    ap.add_argument("--arch", required=True, help="CUDA arch as MAJOR.MINOR, e.g. 9.0")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--stock", action="store_true",
                    help="the stock bf16 library over the unpatched tree")
    ap.add_argument("--spec", type=Path, default=None,
                    help="build description (default OURS/build.toml)")
    ap.add_argument("--nvcc-flag", action="append", default=[],
                    help="one more nvcc flag for every unit (repeatable)")
    ap.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    spec_path = args.spec or (args.ours / "build.toml")
    spec = load_spec(spec_path)
    variant = "stock" if args.stock else "fp8"
    units = unit_commands(spec, variant, args.arch, args.nvcc, tuple(args.nvcc_flag))
    link = link_command(spec, variant, args.arch, args.nvcc, units)
    lib = library_name(spec, variant, args.arch)
    if args.dry_run:
        for u in units:
            print(" ".join(u.argv))
        print(" ".join(link))
        return 0

    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    work = out / f".work-{variant}-sm{arch_digits(args.arch)}"
    prepare_work(work, {"tree": args.tree, "cutlass": args.cutlass, "ours": args.ours})
    jobs = max(1, args.jobs)
    print(f"fa2 build: {variant}, sm_{arch_digits(args.arch)}, {len(units)} units, -j{jobs}",
          flush=True)
    t0 = time.monotonic()
    seconds: dict[str, float] = {}
    failed = []
    log = []  # each unit's compiler output (warnings; ptxas -v counts when asked)
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        for unit, secs, proc in pool.map(lambda u: run_unit(u, work), units):
            seconds[unit.source] = round(secs, 1)
            status = "ok" if proc.returncode == 0 else f"FAILED (rc {proc.returncode})"
            print(f"  {secs:7.1f} s  {unit.source}  {status}", flush=True)
            log.append(f"==> {unit.source} ({status})\n{proc.stdout}{proc.stderr}")
            if proc.returncode != 0:
                failed.append(unit)
                sys.stderr.write(proc.stdout + proc.stderr)
    (out / f"{lib}.log").write_text("\n".join(log))
    if failed:
        print(f"fa2 build: {len(failed)} unit(s) failed", file=sys.stderr)
        return 1
    t_link = time.monotonic()
    proc = subprocess.run(link, cwd=work, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout + proc.stderr)
        print("fa2 build: link failed", file=sys.stderr)
        return 1
    link_secs = time.monotonic() - t_link
    shutil.move(str(work / lib), str(out / lib))
    shutil.rmtree(work)
    wall = time.monotonic() - t0
    digest = sha256(out / lib)
    summary = {
        "library": lib,
        "variant": variant,
        "arch": args.arch,
        "jobs": jobs,
        "unit_seconds": seconds,
        "link_seconds": round(link_secs, 1),
        "wall_seconds": round(wall, 1),
        "sha256": digest,
        "commands": [list(u.argv[1:]) for u in units] + [list(link[1:])],
    }
    (out / f"{lib}.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"  {link_secs:7.1f} s  link")
    total = sum(seconds.values())
    print(f"fa2 build: {out / lib} in {wall:.1f} s wall (sum of units {total:.1f} s), "
          f"sha256 {digest}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
