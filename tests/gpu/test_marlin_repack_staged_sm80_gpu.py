"""marlin-repack-staged-sm80 on a GPU (marker ``gpu``).

A simulated load of a ladder of Qwen3.5-27B-like layer shapes through vLLM's own
``MarlinLinearKernel.process_weights_after_loading`` (tests/patches/
test_marlin_repack_staged_sm80.py's driver, on CUDA), with ``gptq_marlin_repack`` replaced by a
copy (the real op needs vLLM's compiled ops): the peak of ``max_memory_allocated`` over the load
with ``VLLM_MARLIN_REPACK_STAGED=1`` is below the peak without, and the resident staging buffer
is reported. Not shown here: the real repack's output with and without staging."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.gpu import vllm_tree
from tests.patches import test_marlin_int8_negative_scales as neg
from tests.patches._helpers import exec_function, load_envs, load_module

pytestmark = pytest.mark.gpu
vllm_tree.require_cuda()

import torch  # noqa: E402

MIB = 1 << 20
# (K, N) of the dense layers of one decoder layer and the lm_head (int4, group 128)
LADDER = [(5120, 34816), (17408, 5120), (5120, 12288), (6144, 5120), (5120, 248320)]


def _simulated_load(tree: Path, staged: bool, monkeypatch: Any) -> tuple[int, int]:
    """(peak bytes over the load above the loaded weights, staging bytes left resident)."""
    monkeypatch.setenv("VLLM_MARLIN_REPACK_STAGED", "1" if staged else "0")
    st = load_module(tree / "scalar_type.py").scalar_types
    staging: dict[Any, Any] = {}
    namespace = {**neg._utils(tree), "torch": torch, "scalar_types": st,
                 "envs": load_envs(tree),
                 "ops": SimpleNamespace(gptq_marlin_repack=lambda q, **kw: q.clone()),
                 "permute_param_layout_": lambda x, **kw: None,
                 "BasevLLMParameter": torch.nn.Parameter,
                 "marlin_permute_scales": lambda s, **kw: s,
                 "marlin_make_empty": lambda device: torch.empty(0, dtype=torch.int,
                                                                 device=device),
                 "marlin_permute_bias": lambda b: b, "logger": logging.getLogger("t"),
                 "_repack_staging": staging}
    if "def marlin_stage_qweight(" in (tree / neg.KERNEL).read_text():
        namespace["marlin_stage_qweight"] = exec_function(
            tree / neg.KERNEL, "marlin_stage_qweight",
            {"torch": torch, "_repack_staging": staging})
    run = exec_function(tree / neg.KERNEL, "MarlinLinearKernel.process_weights_after_loading",
                        namespace)
    st_type = st.uint4b8
    layers = []
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    for k, n in LADDER:  # the loaded checkpoint: [N, K/8] packed, permuted to a strided view
        layer = torch.nn.Module()
        packed = torch.randint(-2**31, 2**31 - 1, (n, k // 8), dtype=torch.int32,
                               device="cuda")
        layer.w_q = torch.nn.Parameter(packed.t(), requires_grad=False)
        layer.w_s = torch.nn.Parameter(torch.rand(k // 128, n, device="cuda").half(),
                                       requires_grad=False)
        layers.append((layer, k, n))
        del packed  # the parameter holds the only reference, as after a real load
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    for layer, k, n in layers:
        config = SimpleNamespace(act_type=None, weight_type=st_type,
                                 partition_weight_shape=(k, n), group_size=128,
                                 zero_points=False)
        kernel = SimpleNamespace(
            config=config, w_q_name="w_q", w_s_name="w_s", w_zp_name=None,
            _transform_param=lambda layer, name, fn: fn(getattr(layer, name)))
        run(kernel, layer)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    resident = sum(b.numel() * b.element_size() for b in staging.values())
    del layers
    staging.clear()
    torch.cuda.empty_cache()
    return peak, resident


def _check(tree: Path, monkeypatch: Any) -> None:
    off, _ = _simulated_load(tree, False, monkeypatch)
    on, resident = _simulated_load(tree, True, monkeypatch)
    vllm_tree.record_line(f"  {tree.parent.name}: load peak above the weights: staged {on / MIB:.0f} MiB "
                 f"vs stock {off / MIB:.0f} MiB; staging buffer {resident / MIB:.0f} MiB")
    assert on < off, f"staged peak {on / MIB:.0f} MiB, stock {off / MIB:.0f} MiB"


def test_staging_lowers_the_load_peak(monkeypatch: pytest.MonkeyPatch) -> None:
    vllm_tree.record_line("marlin-repack-staged-sm80 (real process_weights_after_loading, repack = copy; "
                 f"layers (K, N) {LADDER}):")
    vllm_tree.fails_on_pristine(lambda tree: _check(tree, monkeypatch))
