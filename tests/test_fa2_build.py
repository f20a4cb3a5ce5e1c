"""fa2/build.py's commands and runs (with a stand-in nvcc), and fa2fp8's library choice.

No GPU, nvcc or torch: build.py is driven with a small Python program in nvcc's place that
checks what it is given and writes the files asked of it. One test runs the real nvcc where
there is one on PATH: two builds of a small unit in two folders give the same library.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import stat
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
FA2 = ROOT / "fa2"
sys.path.insert(0, str(FA2 / "python"))

import fa2fp8  # noqa: E402


def _build_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fa2_build", FA2 / "build.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["fa2_build"] = mod
    spec.loader.exec_module(mod)
    return mod


B = _build_module()
SPEC = B.load_spec(FA2 / "build.toml")


def test_unit_commands_are_relative_and_per_arch() -> None:
    units = B.unit_commands(SPEC, "fp8", "8.6", "/opt/cuda/bin/nvcc")
    assert units[0].source == "ours/csrc/fa2fp8_api.cu"
    assert len(units) == 7 and len({u.obj for u in units}) == 7
    for u in units:
        argv = list(u.argv)
        assert argv[0] == "/opt/cuda/bin/nvcc"
        # every path after the compiler is relative to the work folder
        assert not [a for a in argv[1:] if a.startswith("/") or "/tmp" in a], argv
        i = argv.index("-gencode")
        assert argv[i + 1] == "arch=compute_86,code=sm_86"
        assert argv.count("-gencode") == 1
        assert "-g" not in argv and "-lineinfo" not in argv and "-G" not in argv
        assert f"-frandom-seed={u.source}" in argv
        i = argv.index(f"--orig_src_path_name={u.source}")  # the module id: no absolute path
        assert argv[i - 1] == "-Xcudafe"
        assert argv[-3:] == [u.source, "-o", u.obj]
        for d in ("DROPOUT", "ALIBI", "SOFTCAP", "LOCAL", "UNEVEN_K"):
            assert f"-DFLASHATTENTION_DISABLE_{d}" in argv
        assert "-DFA2FP8_STOCK" not in argv
        incs = [a for a in argv if a.startswith("-I")]
        assert incs == ["-Iours/csrc/notorch", "-Itree/csrc/flash_attn/src", "-Icutlass/include"]


def test_extra_flags_follow_the_spec_flags() -> None:
    for u in B.unit_commands(SPEC, "fp8", "9.0", "nvcc", ("--ptxas-options=-v",)):
        argv = list(u.argv)
        assert argv.index("--ptxas-options=-v") < argv.index(f"-frandom-seed={u.source}")
        assert argv.index("--ptxas-options=-v") > argv.index("-Icutlass/include")


def test_stock_variant_builds_the_tree_units_with_the_define() -> None:
    units = B.unit_commands(SPEC, "stock", "9.0", "nvcc")
    assert all("-DFA2FP8_STOCK" in u.argv for u in units)
    srcs = [u.source for u in units]
    assert srcs[0] == "ours/csrc/fa2fp8_api.cu"
    assert all(s.startswith("tree/csrc/flash_attn/src/flash_fwd_split_") for s in srcs[1:])
    assert not any("fp16" in s for s in srcs)
    assert B.library_name(SPEC, "stock", "9.0") == "libfa2stock_sm90.so"
    assert B.library_name(SPEC, "fp8", "8.0") == "libfa2fp8_sm80.so"


def test_our_units_exist() -> None:
    for variant in ("fp8", "stock"):
        for u in B.unit_commands(SPEC, variant, "9.0", "nvcc"):
            if u.source.startswith("ours/"):
                assert (FA2 / u.source.removeprefix("ours/")).is_file(), u.source


def test_link_strips_and_names() -> None:
    units = B.unit_commands(SPEC, "fp8", "8.9", "nvcc")
    cmd = list(B.link_command(SPEC, "fp8", "8.9", "nvcc", units))
    assert cmd[:6] == ["nvcc", "-shared", "-cudart", "static", "-Xlinker", "--strip-all"]
    assert "-soname=libfa2fp8_sm89.so" in cmd
    assert cmd[-2:] == ["-o", "libfa2fp8_sm89.so"]
    assert [a for a in cmd if a.endswith(".o")] == [u.obj for u in units]


@pytest.mark.parametrize("arch,digits", [("8.0", "80"), ("8.6", "86"), ("9.0", "90"), ("10.0", "100"), ("9.0a", "90a")])
def test_arch_digits(arch: str, digits: str) -> None:
    assert B.arch_digits(arch) == digits


@pytest.mark.parametrize("arch", ["90", "sm_90", "9", "9.0.1", ""])
def test_arch_digits_refuses(arch: str) -> None:
    with pytest.raises(ValueError):
        B.arch_digits(arch)


@pytest.mark.parametrize("path", ["/abs/x.cu", "tree:/abs.cu", "tree:../x.cu", "other:x.cu", "x.cu", "ours:"])
def test_rooted_refuses(path: str) -> None:
    with pytest.raises(ValueError):
        B.rooted(path)


FAKE_NVCC = r'''#!{python}
import os, sys
argv = sys.argv[1:]
log = os.environ["FAKE_NVCC_LOG"]
with open(log, "a") as f:
    f.write(os.getcwd() + " " + " ".join(argv) + "\n")
out = argv[argv.index("-o") + 1]
assert not os.path.isabs(out), out
if "-c" in argv:
    src = argv[argv.index("-o") - 1]
    assert not os.path.isabs(src) and os.path.isfile(src), src   # found through the links
    for a in argv:
        if a.startswith("-I"):
            assert os.path.isdir(a[2:]), a
    if os.environ.get("FAKE_NVCC_FAIL", "-") in src:
        print("error: made to fail", file=sys.stderr)
        sys.exit(2)
    data = open(src, "rb").read()
else:
    data = b"".join(open(o, "rb").read() for o in argv if o.endswith(".o"))
with open(out, "wb") as f:
    f.write(b"fake:" + data)
'''


def _roots(tmp: Path) -> tuple[Path, Path, Path]:
    tree = tmp / "fa2tree"
    (tree / "csrc/flash_attn/src").mkdir(parents=True)
    for u in B.unit_commands(SPEC, "stock", "9.0", "nvcc"):
        if u.source.startswith("tree/"):
            (tree / u.source.removeprefix("tree/")).write_text(f"// {u.source}\n")
    cutlass = tmp / "cutlass"
    (cutlass / "include").mkdir(parents=True)
    nvcc = tmp / "bin" / "nvcc"
    nvcc.parent.mkdir()
    nvcc.write_text(FAKE_NVCC.replace("{python}", sys.executable))
    nvcc.chmod(nvcc.stat().st_mode | stat.S_IXUSR)
    return tree, cutlass, nvcc


def _run(tmp: Path, out: Path, *extra: str) -> int:
    tree, cutlass, nvcc = _roots(tmp) if not (tmp / "bin").exists() else (tmp / "fa2tree", tmp / "cutlass", tmp / "bin" / "nvcc")
    return int(B.main(["--tree", str(tree), "--cutlass", str(cutlass), "--ours", str(FA2),
                       "--nvcc", str(nvcc), "--arch", "9.0", "--out", str(out), "-j", "3", *extra]))


def test_build_runs_units_in_a_work_folder_and_links(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "nvcc.log"
    monkeypatch.setenv("FAKE_NVCC_LOG", str(log))
    out = tmp_path / "out"
    assert _run(tmp_path, out, "--stock") == 0
    lib = out / "libfa2stock_sm90.so"
    assert lib.read_bytes().startswith(b"fake:fake:")
    summary = json.loads((out / "libfa2stock_sm90.so.json").read_text())
    assert set(summary["unit_seconds"]) == {u.source for u in B.unit_commands(SPEC, "stock", "9.0", "nvcc")}
    assert summary["jobs"] == 3 and len(summary["sha256"]) == 64
    calls = log.read_text().splitlines()
    assert len(calls) == 8  # 7 units and the link
    assert len({c.split(" ")[0] for c in calls}) == 1  # all from one work folder
    assert not (out / ".work-stock-sm90").exists()  # removed after the link
    printed = capsys.readouterr().out
    assert "s  tree/csrc/flash_attn/src/flash_fwd_split_hdim128_bf16_sm80.cu  ok" in printed
    # The same build from another folder gives the same library bytes (relative paths only).
    out2 = tmp_path / "elsewhere" / "out"
    assert _run(tmp_path, out2, "--stock") == 0
    assert (out2 / lib.name).read_bytes() == lib.read_bytes()


TINY_SPEC = """
[compile]
flags = ["-O3", "-std=c++17", "-Xcompiler", "-fPIC"]
include = ["ours:csrc"]
[link]
flags = ["-shared", "-cudart", "static", "-Xlinker", "--strip-all"]
[variants.fp8]
library = "libtiny_sm{arch}.so"
units = ["ours:csrc/tiny.cu"]
"""

# An internal-linkage device symbol: its name carries nvcc's module id, which nvcc derives
# from the unit's path as cudafe++ is given it (absolute, unless build.py pins it).
TINY_UNIT = """
namespace { __device__ int hidden_count; }
__global__ void tiny(int *x) { x[threadIdx.x] = hidden_count + 1; }
"""


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc on PATH")
def test_real_nvcc_gives_the_same_library_in_two_folders(tmp_path: Path) -> None:
    nvcc = shutil.which("nvcc")
    assert nvcc is not None
    libs = []
    for where in ("a", "b/deeper/still"):
        ours = tmp_path / where / "ours"
        (ours / "csrc").mkdir(parents=True)
        (ours / "csrc" / "tiny.cu").write_text(TINY_UNIT)
        (ours / "build.toml").write_text(TINY_SPEC)
        (tmp_path / where / "empty").mkdir()
        out = tmp_path / where / "out"
        assert B.main(["--tree", str(tmp_path / where / "empty"), "--cutlass",
                       str(tmp_path / where / "empty"), "--ours", str(ours), "--nvcc", nvcc,
                       "--arch", "9.0", "--out", str(out), "-j", "1"]) == 0
        libs.append((out / "libtiny_sm90.so").read_bytes())
    assert libs[0][:4] == b"\x7fELF"
    assert libs[0] == libs[1], "the library's bytes depend on the folder it was built in"


def test_build_fails_when_a_unit_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_NVCC_LOG", str(tmp_path / "nvcc.log"))
    monkeypatch.setenv("FAKE_NVCC_FAIL", "fp8kv_hdim256_fp16")
    out = tmp_path / "out"
    assert _run(tmp_path, out) == 1
    assert not (out / "libfa2fp8_sm90.so").exists()


def test_dry_run_prints_commands(capsys: pytest.CaptureFixture[str]) -> None:
    assert B.main(["--tree", "t", "--cutlass", "c", "--arch", "8.0", "--out", "o", "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 8
    assert all("arch=compute_80,code=sm_80" in ln for ln in lines[:7])
    assert lines[-1].endswith("-o libfa2fp8_sm80.so")


# ---- the loader's choice of library ----

def _touch(d: Path, *names: str) -> None:
    d.mkdir(parents=True, exist_ok=True)
    for n in names:
        (d / n).write_bytes(b"")


def test_find_library_exact_then_lower_minor(tmp_path: Path) -> None:
    _touch(tmp_path, "libfa2fp8_sm80.so", "libfa2fp8_sm86.so", "libfa2fp8_sm90.so", "libfa2stock_sm80.so")
    assert fa2fp8.find_library("fp8", 8, 6, tmp_path).name == "libfa2fp8_sm86.so"
    assert fa2fp8.find_library("fp8", 8, 9, tmp_path).name == "libfa2fp8_sm86.so"
    assert fa2fp8.find_library("fp8", 9, 0, tmp_path).name == "libfa2fp8_sm90.so"
    assert fa2fp8.find_library("stock", 8, 9, tmp_path).name == "libfa2stock_sm80.so"


def test_find_library_never_higher_minor_or_other_major(tmp_path: Path) -> None:
    _touch(tmp_path, "libfa2fp8_sm86.so", "libfa2fp8_sm90.so")
    with pytest.raises(FileNotFoundError, match=r"libfa2fp8_sm80\.so.*found"):
        fa2fp8.find_library("fp8", 8, 0, tmp_path)
    with pytest.raises(FileNotFoundError):
        fa2fp8.find_library("fp8", 10, 0, tmp_path)
    with pytest.raises(FileNotFoundError, match="--stock"):
        fa2fp8.find_library("stock", 9, 0, tmp_path)
    with pytest.raises(ValueError):
        fa2fp8.find_library("int8", 9, 0, tmp_path)


def test_lib_dir_argument_then_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _touch(tmp_path / "env", "libfa2fp8_sm90.so")
    monkeypatch.setenv("FA2FP8_LIB_DIR", str(tmp_path / "env"))
    assert fa2fp8.find_library("fp8", 9, 0).parent == tmp_path / "env"
    assert fa2fp8.lib_dir(tmp_path / "arg") == tmp_path / "arg"
    monkeypatch.delenv("FA2FP8_LIB_DIR")
    assert fa2fp8.lib_dir() == FA2 / "python" / "fa2fp8" / "lib"
    assert os.path.isabs(fa2fp8.lib_dir())


@pytest.mark.parametrize("shape,stride,want", [
    ((), (), (0, 0)), ((1,), (1,), (0, 0)), ((8,), (1,), (0, 1)), ((8,), (2,), (0, 2)),
    ((4, 8), (8, 1), (8, 1)), ((4, 8), (1, 4), (1, 4)),
])
def test_descale_strides(shape: tuple[int, ...], stride: tuple[int, ...], want: tuple[int, int]) -> None:
    assert fa2fp8.descale_strides(shape, stride, 4, 8) == want


@pytest.mark.parametrize("shape", [(32,), (4,), (8, 4), (4, 8, 1), (2, 8)])
def test_descale_strides_refuses(shape: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match="descale of shape"):
        fa2fp8.descale_strides(shape, (1,) * len(shape), 4, 8)
