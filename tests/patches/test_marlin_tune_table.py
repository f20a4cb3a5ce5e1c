"""marlin-tune-table: with VLLM_MARLIN_TUNE_DIR set, the marlin_gemm custom op runs the
GEMM of the tunable extension built in that directory; unset (the default), vLLM's own
kernel. Runs vLLM's own _marlin_gemm (marlin_utils.py) on CPU torch, the knob read
through vLLM's own envs.py. The kernels stand in as CPU ops registered with
torch.library: _C::marlin_gemm (vLLM's) and, imported from the directory as the built
extension would be, _marlin_tune::marlin_gemm.

An extension whose op has another schema than vLLM's (size_m and size_n swapped: the
positional call gives a transposed (32, 3) result) is refused with one message naming both
schemas, and one that registers nothing with one message naming the module."""

from __future__ import annotations

import functools
import importlib.machinery
import importlib.util
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ._helpers import assert_pristine_lacks, exec_function, load_envs

pytestmark = pytest.mark.e2e
torch = pytest.importorskip("torch")

SCHEMA = ("(Tensor a, Tensor? c, Tensor b_q_weight, Tensor? b_bias, Tensor b_scales, "
          "Tensor? a_scales, Tensor? global_scale, Tensor? b_zeros, Tensor? workspace, "
          "int b_q_type_id, int size_m, int size_n, int size_k, bool use_atomic_add, "
          "bool use_fp32_reduce, bool is_zp_float) -> Tensor")

# The tunable extension as its built module would behave: registers its op on import.
EXTENSION = f'''
import torch

if not hasattr(torch.ops._marlin_tune, "marlin_gemm"):
    _lib = torch.library.Library("_marlin_tune", "DEF")
    _lib.define("marlin_gemm{SCHEMA}")

    def _gemm(a, c, b_q_weight, b_bias, b_scales, a_scales, global_scale, b_zeros,
              workspace, b_q_type_id, size_m, size_n, size_k, use_atomic_add,
              use_fp32_reduce, is_zp_float):
        return torch.full((size_m, size_n), 7.0, dtype=a.dtype)

    _lib.impl("marlin_gemm", _gemm, "CPU")
'''

# An extension built against another signature: size_n before size_m.
SWAPPED = EXTENSION.replace("int size_m, int size_n", "int size_n, int size_m").replace(
    "size_m, size_n, size_k, use_atomic_add", "size_n, size_m, size_k, use_atomic_add")
# An extension whose import registers nothing.
EMPTY = "import torch\n"

_LIBS: list[Any] = []


def _forget_extension() -> None:
    """Drop an extension a previous check imported, and what it registered (a process
    imports one; the checks import several)."""
    module = sys.modules.pop("marlin_tune", None)
    lib = getattr(module, "_lib", None)
    if lib is not None:
        lib._destroy()


def _register_vllm_kernel() -> None:
    """vLLM's own kernel, as a CPU stand-in answering zeros."""
    if hasattr(torch.ops._C, "marlin_gemm"):
        return
    lib = torch.library.Library("_C", "FRAGMENT")
    lib.define(f"marlin_gemm{SCHEMA}")

    def gemm(a: Any, *args: Any) -> Any:
        size_m, size_n = args[9], args[10]
        return torch.zeros((size_m, size_n), dtype=a.dtype)

    lib.impl("marlin_gemm", gemm, "CPU")
    _LIBS.append(lib)


def _gemm(tree: Path) -> Callable[[], Any]:
    """vLLM's _marlin_gemm with the kernel choice the tree makes."""
    path = tree / "model_executor/layers/quantization/utils/marlin_utils.py"
    ns: dict[str, Any] = {
        "torch": torch, "envs": load_envs(tree), "os": os, "sys": sys, "functools": functools,
        "importlib": importlib, "Callable": Callable,
        "logger": logging.getLogger("test.marlin_tune"),
        "get_marlin_workspace": lambda device: None,
    }
    src = path.read_text()
    if "MARLIN_TUNE_MODULE = " in src:
        ns["MARLIN_TUNE_MODULE"] = "marlin_tune"
        ns["load_marlin_tune_extension"] = exec_function(path, "load_marlin_tune_extension",
                                                         ns)
        ns["_marlin_gemm_op"] = exec_function(path, "_marlin_gemm_op", ns)
    marlin_gemm = exec_function(path, "_marlin_gemm", ns)
    a = torch.ones((3, 64), dtype=torch.float16)
    weight = torch.zeros((4, 128), dtype=torch.int32)
    scales = torch.ones((1, 32), dtype=torch.float16)

    def run() -> Any:
        return marlin_gemm(a, weight, None, scales, None, None, None, None, 0,
                           size_m=3, size_n=32, size_k=64)

    return run


def _tune_dir(tmp_path: Path, source: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    _forget_extension()
    tune_dir = tmp_path / f"marlin-tune-{abs(hash(source))}"
    tune_dir.mkdir(exist_ok=True)
    (tune_dir / "marlin_tune.py").write_text(source)
    monkeypatch.setenv("VLLM_MARLIN_TUNE_DIR", str(tune_dir))
    return tune_dir


def _check(tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _register_vllm_kernel()
    monkeypatch.delenv("VLLM_MARLIN_TUNE_DIR", raising=False)
    assert torch.equal(_gemm(tree)(), torch.zeros((3, 32), dtype=torch.float16))
    _tune_dir(tmp_path, EXTENSION, monkeypatch)
    out = _gemm(tree)()
    assert torch.equal(out, torch.full((3, 32), 7.0, dtype=torch.float16)), out


def _check_schema(tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _register_vllm_kernel()
    _tune_dir(tmp_path, SWAPPED, monkeypatch)
    with pytest.raises(ValueError, match="VLLM_MARLIN_TUNE_DIR") as exc:
        _gemm(tree)()
    # Both schemas are in the message, so the mismatch can be read off it.
    message = str(exc.value)
    assert "int size_n, int size_m" in message and "int size_m, int size_n" in message
    _tune_dir(tmp_path, EMPTY, monkeypatch)
    with pytest.raises(ValueError, match=r"registered no torch\.ops\._marlin_tune\.marlin_gemm"):
        _gemm(tree)()
    _forget_extension()


def _check_errors(tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for missing, what in ((tmp_path / "nope", "is not a directory"),
                          (tmp_path, "holds no marlin_tune extension")):
        monkeypatch.setenv("VLLM_MARLIN_TUNE_DIR", str(missing))
        with pytest.raises(ValueError, match=what) as exc:
            _gemm(tree)()
        assert "VLLM_MARLIN_TUNE_DIR" in str(exc.value)


def test_patched_runs_tuned_extension(patched_vllm: Path, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    _check(patched_vllm, tmp_path, monkeypatch)


def test_patched_names_a_bad_tune_dir(patched_vllm: Path, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    _register_vllm_kernel()
    _check_errors(patched_vllm, tmp_path, monkeypatch)


def test_patched_refuses_a_foreign_schema(patched_vllm: Path, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    _check_schema(patched_vllm, tmp_path, monkeypatch)


def test_pristine_ignores_tune_dir(pristine_vllm: Path, tmp_path: Path,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    assert_pristine_lacks(lambda: _check(pristine_vllm, tmp_path, monkeypatch))
