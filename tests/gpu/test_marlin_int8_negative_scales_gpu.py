"""marlin-int8-negative-scales on a GPU (marker ``gpu``).

vLLM's own ``marlin_fold_negative_group_scales`` and ``marlin_act_int8_process_scales``
(quantization/utils/marlin_utils.py) on CUDA tensors of a 5120 x 17408 layer (group 128, about
half of the scales negative): the fold equals the CPU result bit for bit, the requantised
scales read the same as int16 and as uint16, and its load-time cost is reported. Not shown
here: the W4A8 Marlin GEMM before and after the fold (needs vLLM's compiled ops)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.gpu import vllm_tree
from tests.patches import test_marlin_int8_negative_scales as cpu

pytestmark = pytest.mark.gpu
vllm_tree.require_cuda()

import torch  # noqa: E402
import triton.testing  # noqa: E402

K, N, G = 5120, 17408, 128


def _check(tree: Path) -> None:
    u = cpu._utils(tree)
    _, packed, scales = cpu._layer(k=K, n=N, g=G, seed=5)
    q_cpu, s_cpu = u[cpu.FOLD](packed, scales, G)
    q_gpu, s_gpu = u[cpu.FOLD](packed.cuda(), scales.cuda(), G)
    assert torch.equal(q_gpu.cpu(), q_cpu) and torch.equal(s_gpu.cpu(), s_cpu)
    requant, _ = u["marlin_act_int8_process_scales"](s_gpu)
    signed = requant.view(torch.int16).to(torch.int32)
    assert torch.equal(signed, signed & 0xFFFF)
    q_dev, s_dev = packed.cuda(), scales.cuda()
    ms = triton.testing.do_bench(lambda: u[cpu.FOLD](q_dev, s_dev, G))
    vllm_tree.record_line(f"  {tree.parent.name}: fold of a {K}x{N} layer (group {G}, "
                 f"{int((scales < 0).sum())} of {scales.numel()} scales negative) on CUDA: "
                 f"{ms:.2f} ms; equals the CPU fold bit for bit")


def test_fold_on_cuda_equals_cpu() -> None:
    vllm_tree.record_line("marlin-int8-negative-scales (real helper on CUDA):")
    vllm_tree.fails_on_pristine(_check)
