"""qwen38build.kernels.kernels: per-arch nvcc builds, cubin SM, compile errors, the pthfa wheel."""

from __future__ import annotations

import base64
import hashlib
import shutil
import zipfile
from pathlib import Path

import pytest

from qwen38build.errors import KernelBuildError
from qwen38build.kernels.kernels import (
    arch_gencode,
    compile_arch,
    cubin_sm,
    nvcc_version,
    write_pthfa_wheel,
)

ROOT = Path(__file__).resolve().parents[1]
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")

SRC = """#include "tiny.cuh"
extern "C" __global__ void scale2(float* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = twice(x[i]);
}
"""
HDR = "#pragma once\n__device__ inline float twice(float v) { return 2.f * v; }\n"


def _tree(base: Path) -> list[Path]:
    base.mkdir(parents=True)
    (base / "tiny.cu").write_text(SRC)
    (base / "tiny.cuh").write_text(HDR)
    return [base / "tiny.cu", base / "tiny.cuh"]


def test_arch_gencode() -> None:
    assert arch_gencode("9.0") == (90, "arch=compute_90,code=sm_90")
    assert arch_gencode("12.0")[0] == 120
    with pytest.raises(KernelBuildError, match="not canonical"):
        arch_gencode("sm_90")


def test_cubin_sm_rejects_non_elf(tmp_path: Path) -> None:
    p = tmp_path / "x.cubin"
    p.write_bytes(b"not an elf file at all, just some bytes" * 2)
    with pytest.raises(KernelBuildError, match="not an ELF"):
        cubin_sm(p)


def test_cubin_sm_reads_e_flags(tmp_path: Path) -> None:
    hdr = bytearray(64)
    hdr[:5] = b"\x7fELF\x02"
    hdr[48:52] = (0x06005A04).to_bytes(4, "little")
    p = tmp_path / "fake.cubin"
    p.write_bytes(bytes(hdr))
    assert cubin_sm(p) == 90


@needs_nvcc
def test_nvcc_version() -> None:
    assert "Cuda compilation tools" in nvcc_version()


@needs_nvcc
@pytest.mark.parametrize("arch,sm", [("8.0", 80), ("9.0", 90)])
def test_compile_sm_in_e_flags(tmp_path: Path, arch: str, sm: int) -> None:
    outs = compile_arch(_tree(tmp_path / "src"), arch, tmp_path / "out", ptx=True)
    assert [p.name for p in outs] == [f"sm_{sm}.cubin", f"compute_{sm}.ptx"]
    assert cubin_sm(outs[0]) == sm
    assert ".target sm_" + str(sm) in outs[1].read_text()


@needs_nvcc
def test_compile_deterministic_across_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                           ) -> None:
    """The same sources compiled twice, from other folders, another working directory and
    another environment (temp dir, locale, time zone, a stray CUDA variable): the cubin and
    the PTX are the same bytes."""
    a = compile_arch(_tree(tmp_path / "one" / "deep" / "src"), "9.0", tmp_path / "oa", ptx=True)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tmp2").mkdir()
    for name, value in (("TMPDIR", str(tmp_path / "tmp2")), ("LANG", "de_DE.UTF-8"),
                        ("TZ", "Asia/Tokyo"), ("CUDA_HOME", "/nonexistent"),
                        ("NVCC_APPEND_FLAGS", "-lineinfo")):
        monkeypatch.setenv(name, value)
    b = compile_arch(_tree(tmp_path / "two" / "src"), "9.0", tmp_path / "ob", ptx=True)
    assert [p.name for p in a] == [p.name for p in b] and len(a) == 2
    for x, y in zip(a, b, strict=True):
        assert x.read_bytes() == y.read_bytes(), x.name


@needs_nvcc
def test_compile_error_names_arch_file_line(tmp_path: Path) -> None:
    srcs = _tree(tmp_path / "src")
    lines = SRC.splitlines()
    lines.insert(3, "  undefined_thing(i);")  # becomes line 4
    srcs[0].write_text("\n".join(lines) + "\n")
    with pytest.raises(KernelBuildError) as ei:
        compile_arch(srcs, "8.0", tmp_path / "out")
    msg = str(ei.value)
    assert "arch 8.0" in msg
    assert str(srcs[0]) + ":4" in msg
    assert "undefined_thing" in msg


@needs_nvcc
def test_compile_error_in_header(tmp_path: Path) -> None:
    srcs = _tree(tmp_path / "src")
    srcs[1].write_text("#pragma once\n__device__ inline float twice(float v) { return v +; }\n")
    with pytest.raises(KernelBuildError, match=r"arch 9\.0 at .*tiny\.cuh:2"):
        compile_arch(srcs, "9.0", tmp_path / "out")


def test_compile_missing_source(tmp_path: Path) -> None:
    with pytest.raises(KernelBuildError, match="does not exist"):
        compile_arch([tmp_path / "nope.cu"], "9.0", tmp_path / "out")


def _wheel(tmp: Path, out: str) -> Path:
    cub = tmp / "cubs"
    cub.mkdir(exist_ok=True)
    (cub / "sm_90.cubin").write_bytes(b"\x7fELF-fake-90")
    (cub / "sm_80.cubin").write_bytes(b"\x7fELF-fake-80")
    return write_pthfa_wheel(ROOT / "pthfa" / "python" / "pthfa",
                             [cub / "sm_90.cubin", cub / "sm_80.cubin"], tmp / out, "v0.1.0")


def test_wheel_deterministic_and_record(tmp_path: Path) -> None:
    a = _wheel(tmp_path, "a")
    b = _wheel(tmp_path, "b")
    assert a.name == "pthfa-0.1.0-py3-none-linux_x86_64.whl"
    assert a.read_bytes() == b.read_bytes()
    with zipfile.ZipFile(a) as zf:
        names = zf.namelist()
        assert names[-1] == "pthfa-0.1.0.dist-info/RECORD"
        assert names[:-1] == sorted(names[:-1])
        assert "pthfa/__init__.py" in names and "pthfa/cubins/sm_90.cubin" in names
        assert not any("__pycache__" in n for n in names)
        for info in zf.infolist():
            assert info.date_time == (1980, 1, 1, 0, 0, 0)
            assert (info.external_attr >> 16) & 0o777 == 0o644
        record = zf.read("pthfa-0.1.0.dist-info/RECORD").decode().splitlines()
        listed = set()
        for line in record:
            name, digest, size = line.rsplit(",", 2)
            listed.add(name)
            if name.endswith("RECORD"):
                assert digest == "" and size == ""
                continue
            data = zf.read(name)
            want = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            assert digest == "sha256=" + want.decode()
            assert int(size) == len(data)
        assert listed == set(names)
        assert "Version: 0.1.0" in zf.read("pthfa-0.1.0.dist-info/METADATA").decode()
        assert "Tag: py3-none-linux_x86_64" in zf.read("pthfa-0.1.0.dist-info/WHEEL").decode()


def test_wheel_bad_version(tmp_path: Path) -> None:
    with pytest.raises(KernelBuildError, match="not a version"):
        write_pthfa_wheel(ROOT / "pthfa" / "python" / "pthfa", [], tmp_path, "banana")


def test_pthfa_manifest_is_current() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("pthfa_manifest", ROOT / "pthfa" / "manifest.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.check() == [], "pthfa/MANIFEST is stale: run python3 pthfa/manifest.py"
    pin = (ROOT / "pthfa" / "PIN").read_text().strip()
    assert pin.startswith("v")


@needs_nvcc
@pytest.mark.slow
def test_pthfa_sources_compile_for_sm90(tmp_path: Path) -> None:
    srcs = sorted((ROOT / "pthfa" / "csrc").iterdir())
    (cubin,) = compile_arch(srcs, "9.0", tmp_path)
    assert cubin_sm(cubin) == 90
    assert b"pthfa_decode_part_bf16_d128_g4" in cubin.read_bytes()
