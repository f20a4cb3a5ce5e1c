"""Tiny real inputs for the tests: a wheel (a zip with a true RECORD), a project directory
with recipe.toml, lock/ and a patch series cut with git, all made in a few lines.

One set of makers for every test module (the engine's, the workspace's and the bump's).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import importlib.util
import json
import subprocess
import zipfile
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

VERSION = "0.0.1"
PLATFORM = "manylinux_2_28_x86_64"

FILES = {
    "vllm/__init__.py": "__version__ = '0.0.1'\n",
    "vllm/envs.py": "".join(f"KNOB_{i} = {i}\n" for i in range(30)),
    "vllm/server.py": "".join(f"def route_{i}():\n    return {i}\n\n" for i in range(20)),
    "vllm/_C.abi3.so": "\x7fELF not really a library\n",
}


def record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def wheel_name(version: str) -> str:
    return f"vllm-{version}-cp38-abi3-{PLATFORM}.whl"


def make_wheel(
    dest: Path, files: dict[str, str] | dict[str, str | bytes] | None = None,
    version: str = VERSION, requires: Sequence[str] = (),
) -> Path:
    """A real wheel: ``files`` by member name (default FILES), deflated, with a dist-info
    holding METADATA (with ``requires`` as Requires-Dist), WHEEL and a true RECORD."""
    members: dict[str, bytes] = {
        n: (c.encode() if isinstance(c, str) else c) for n, c in (files or FILES).items()
    }
    di = f"vllm-{version}.dist-info"
    deps = "".join(f"Requires-Dist: {r}\n" for r in requires)
    # As a real pin's: the Pythons it supports, so the universal environment lock covers
    # this machine's interpreter (3.11 to 3.13) and uv can lock with it.
    pythons = "".join(f"Classifier: Programming Language :: Python :: 3.{m}\n"
                      for m in (11, 12, 13))
    members[f"{di}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\nRequires-Python: >=3.10\n"
        f"{pythons}{deps}\n").encode()
    members[f"{di}/WHEEL"] = b"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: cp38-abi3-linux_x86_64\n"
    record = "".join(f"{n},{record_hash(c)},{len(c)}\n" for n, c in members.items())
    members[f"{di}/RECORD"] = (record + f"{di}/RECORD,,\n").encode()
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / wheel_name(version)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, content in members.items():
            info = zipfile.ZipInfo(name, date_time=(2026, 1, 2, 3, 4, 6))
            info.external_attr = 0o100644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, content)
    return path


def git_diff(rel: str, old: str | None, new: str | None, tmp: Path) -> str:
    """A real ``git diff --no-index`` of two versions of a package file, paths ``a/<rel>``;
    None on a side is /dev/null (a new or a deleted file)."""
    tmp.mkdir(parents=True, exist_ok=True)
    sides = []
    for side, text in (("a", old), ("b", new)):
        if text is None:
            sides.append("/dev/null")
            continue
        p = tmp / side / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        sides.append(f"{side}/{rel}")
    proc = subprocess.run(
        ["git", "diff", "--no-index", "--no-color", "--no-ext-diff", "-U3", *sides],
        cwd=tmp, capture_output=True, text=True, check=False,
        env={"PATH": "/usr/bin:/bin", "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null"},
    )
    out = proc.stdout.replace(f"a/a/{rel}", f"a/{rel}").replace(f"b/b/{rel}", f"b/{rel}")
    return out.replace(f"a/b/{rel}", f"a/{rel}").replace(f"b/a/{rel}", f"b/{rel}")


def patch_text(topic: str, diff: str, *, pin: str = VERSION) -> str:
    """A patch file as the ledger wants it: prose, the five headers, the marker, the diff."""
    return (
        f"Why {topic} is right: a paragraph of prose.\n"
        "# a line that starts like a comment stays in the body\n\n"
        f"Kind: fix\nWhat: {topic} does a thing\nUpstream: none\n"
        f"Cut-against: {pin}\nRetires-when: upstream PR\n"
        f"--- exported from {'ab' * 20} ({topic}); regenerate with qwen38build export, "
        "do not edit ---\n" + diff
    )


def write_patch(
    project: Path, group: str, topic: str,
    diffs: Sequence[tuple[str, str | None, str | None]], tmp: Path, *, pin: str = VERSION,
) -> Path:
    """Write ``<group>/<topic>.patch`` from (file, old text, new text) triples, in path
    order as git writes them (so an export of an unedited topic gives the same bytes)."""
    diff = "".join(
        git_diff(rel, old, new, tmp / topic / str(i))
        for i, (rel, old, new) in enumerate(sorted(diffs, key=lambda d: d[0]))
    )
    path = project / group / f"{topic}.patch"
    path.write_text(patch_text(topic, diff, pin=pin))
    return path


RECIPE = """\
# qwen38build recipe (test): every input of the patched vLLM stack, in one place.

[vllm]
version = "{pin}"   # the pin: `bump` moves it
python_tag = "cp38"
abi_tag = "abi3"
platform_tag = "{platform}"

[series]
# Topics retired from the tree.
retired = ["old-topic"]

# The series, in apply order: the patches/ group first, then kvarn/.
[[series.groups]]
dir = "patches"
patches = [
{patches}]

[[series.groups]]
dir = "kvarn"
patches = [
{kvarn}]

[fa2]
source = "flash-attention"
cutlass = "cutlass"
diff = "fa2/fp8-kv.diff"

[sources.flash-attention]
repository = "https://example.invalid/flash-attention"
commit = "0123456789abcdef0123456789abcdef01234567"

[sources.cutlass]
repository = "https://example.invalid/cutlass"
commit = "89abcdef0123456789abcdef0123456789abcdef"

[pthfa]
tag = "v0.1.0"
path = "pthfa"

[cuda]
archs = [{archs}]

[toolchain]
python = "3.12"
torch = "2.11.0"
cuda = "13.0"

[build]
# The unit tests' projects build the patched wheel alone (no kernels, no environment lock).
outputs = ["vllm"]
"""


def make_project(
    root: Path, wheel: Path, patches: list[str], kvarn: list[str] | None = None, *,
    pin: str = VERSION, archs: Sequence[str] = ("8.6", "sm_90"),
) -> Path:
    """A project dir: recipe.toml naming the topics, lock/ pinning ``wheel``, pthfa/ with
    its PIN and an empty MANIFEST (so the ledger's rules pass)."""
    for d in ("patches", "kvarn", "pthfa", "fa2", "lock"):
        (root / d).mkdir(parents=True, exist_ok=True)
    (root / "pthfa" / "PIN").write_text("v0.1.0\n")
    (root / "pthfa" / "MANIFEST").write_text("")

    def listing(topics: list[str]) -> str:
        return "".join(f'    "{t}.patch",\n' for t in topics)

    (root / "recipe.toml").write_text(RECIPE.format(
        pin=pin, platform=PLATFORM, patches=listing(patches), kvarn=listing(kvarn or []),
        archs=", ".join(f'"{a}"' for a in archs),
    ))
    lock = {
        "format": 1,
        "sources": [{
            "name": "vllm", "version": pin, "filename": wheel.name, "python_tag": "cp38",
            "abi_tag": "abi3", "platform_tag": PLATFORM, "sha256": sha256(wheel),
            "size": wheel.stat().st_size,
        }],
    }
    (root / "lock" / "sources.json").write_text(json.dumps(lock, indent=2, sort_keys=True) + "\n")
    # A complete lock pins the CUDA toolchain too: stand-in wheels beside the vLLM one, whose
    # nvcc logs its calls to <root's parent>/nvcc.log.
    add_to_lock(root, fake_toolchain(wheel.parent, root.parent / "nvcc.log"))
    return root


# -- a stand-in CUDA toolchain (every fixture project locks one, as a real one must) ------

VERSION_TEXT = "Cuda compilation tools, release 13.0, V13.0.88"

# Logs each call to LOG, answers --version, and writes a 64-byte ELF header whose e_flags
# (offset 48, little-endian) carry SM in bits 8-15, or a PTX file for -ptx.
FAKE_NVCC = r"""#!/bin/sh
echo "$*" >> "@LOG@"
echo "CUDA_HOME=${CUDA_HOME:-} LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-} PATH=$PATH" >> "@LOG@.env"
if [ "$1" = "--version" ]; then echo "@VERSION@"; exit 0; fi
out=""; sm=""; ptx=0
while [ $# -gt 0 ]; do
  case "$1" in
    -o) out="$2"; shift ;;
    -ptx) ptx=1 ;;
    arch=compute_*) sm="${1##*code=sm_}" ;;
  esac
  shift
done
if [ "$ptx" = 1 ]; then echo "// stand-in ptx" > "$out"; exit 0; fi
{ printf '\177ELF\002\001\001'; head -c 42 /dev/zero; printf "\\$(printf %o "$sm")";
  head -c 14 /dev/zero; } > "$out"
"""


def modal_wheel(dest: Path, name: str, version: str, files: dict[str, tuple[bytes, int]]) -> Path:
    """A wheel whose members carry the given modes (as NVIDIA's do, or not)."""
    dist = f"{name.replace('-', '_')}-{version}"
    path = dest / f"{dist}-py3-none-manylinux2014_x86_64.whl"
    members = {**files, f"{dist}.dist-info/METADATA": (
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(), 0o644)}
    record = "".join(f"{n},{record_hash(d)},{len(d)}\n" for n, (d, _) in members.items())
    members[f"{dist}.dist-info/RECORD"] = ((record + f"{dist}.dist-info/RECORD,,\n").encode(),
                                           0o644)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for member, (data, mode) in members.items():
            info = zipfile.ZipInfo(member, date_time=(2025, 9, 2, 0, 0, 0))
            info.external_attr = (0o100000 | mode) << 16
            z.writestr(info, data)
    return path


def fake_toolchain(dest: Path, log: Path, version_text: str = VERSION_TEXT) -> list[Path]:
    nvcc = FAKE_NVCC.replace("@LOG@", str(log)).replace("@VERSION@", version_text).encode()
    top = "nvidia/cu13"
    stub = (b"#!/bin/sh\nexit 0\n", 0o644)  # recorded without run bits: restored by name
    dest.mkdir(parents=True, exist_ok=True)
    return [
        modal_wheel(dest, "nvidia-cuda-nvcc", "13.0.88", {
            f"{top}/bin/nvcc": (nvcc, 0o744),
            **{f"{top}/bin/{t}": stub for t in ("ptxas", "cudafe++", "fatbinary", "nvlink",
                                                 "bin2c")},
            f"{top}/bin/nvcc.profile": (b"TOP = $(_HERE_)/..\n", 0o644),
        }),
        modal_wheel(dest, "nvidia-nvvm", "13.0.88", {f"{top}/nvvm/bin/cicc": stub}),
        modal_wheel(dest, "nvidia-cuda-crt", "13.0.88", {f"{top}/include/crt/host_config.h": (
            b"#pragma once\n", 0o644)}),
        modal_wheel(dest, "nvidia-cuda-runtime", "13.0.96", {f"{top}/include/cuda_runtime.h": (
            b"#pragma once\n", 0o644)}),
        modal_wheel(dest, "nvidia-cuda-cccl", "13.0.85", {f"{top}/include/cccl/cuda/std/cstdint": (
            b"#pragma once\n", 0o644)}),
    ]


def add_to_lock(root: Path, wheels: list[Path]) -> None:
    from qwen38build.inputs import lock as lockmod

    locked = lockmod.read(root)
    for w in wheels:
        dist, version = w.name.split("-")[:2]
        name = dist.replace("_", "-")
        locked[name] = lockmod.LockedWheel(
            name=name, version=version, filename=w.name, python_tag="py3", abi_tag="none",
            platform_tag=w.name[: -len(".whl")].split("-")[4], sha256=sha256(w),
            size=w.stat().st_size,
        )
    lockmod.write(root, list(locked.values()))


KERNEL = 'extern "C" __global__ void add_one(float* x) { x[threadIdx.x] += 1.0f; }\n'


def add_pthfa_sources(root: Path) -> None:
    """One tiny kernel and the pthfa package under ``root/pthfa``, listed in its MANIFEST
    (as pthfa/manifest.py writes it), so the project's kernels plan and lint clean."""
    pthfa = root / "pthfa"
    files = {pthfa / "csrc" / "tiny.cu": KERNEL,
             pthfa / "python" / "pthfa" / "__init__.py": '"""tiny"""\n'}
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    relist_pthfa(root)


def relist_pthfa(root: Path) -> None:
    """Rewrite ``root/pthfa/MANIFEST`` for the sources there now (as pthfa/manifest.py does
    after an edit): every regular file of csrc/ and python/."""
    pthfa = root / "pthfa"
    files = sorted(p for sub in ("csrc", "python") for p in (pthfa / sub).rglob("*")
                   if p.is_file() and not p.is_symlink() and "__pycache__" not in p.parts)
    (pthfa / "MANIFEST").write_text("".join(
        f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.relative_to(pthfa).as_posix()}\n"
        for p in files))


@functools.cache
def load_noxfile() -> ModuleType:
    """The project's noxfile as a module, loaded once per test process (nox refuses a
    session registered twice)."""
    path = Path(__file__).resolve().parents[1] / "noxfile.py"
    spec = importlib.util.spec_from_file_location("q38_noxfile", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
