"""gdn-ba-pad-small-m on a GPU (marker ``gpu``).

vLLM's own ``gdn_ba_linear_small_m`` (model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py)
forced on an H200, where the layer's gate keeps it off (sm90 shows no small-M cliff): for the
27B's in_proj_ba ([M, 5120] x [5120, 96], bf16, padded to 5 rows) the padded and stock products
agree to one bf16 ulp of the output magnitude for M = 1..8 (cuBLAS may pick another kernel, so
not bit for bit), and the time per M of both is reported. Not shown here: the speed-up on
sm86/sm89/sm120, where the cliff is reported (no such GPU here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.gpu import vllm_tree
from tests.patches import test_gdn_ba_pad_small_m as cpu
from tests.patches._helpers import exec_function

pytestmark = pytest.mark.gpu
vllm_tree.require_cuda()

import torch  # noqa: E402
import triton.testing  # noqa: E402


def _check(tree: Path) -> None:
    op = exec_function(tree / cpu.FILE, "gdn_ba_linear_small_m", {"torch": torch})
    rows = exec_function(tree / cpu.FILE, "gdn_ba_pad_rows", {})(96, 5120)
    assert rows == 5
    gen = torch.Generator(device="cuda").manual_seed(0)
    w = torch.randn(96, 5120, generator=gen, device="cuda").to(torch.bfloat16) * 0.02
    line = []
    for m in range(1, 9):
        x = torch.randn(m, 5120, generator=gen, device="cuda").to(torch.bfloat16)
        out = op(x, w, rows)
        ref = torch.nn.functional.linear(x, w)
        ulp = ref.abs().max().float() * 2.0**-7  # one bf16 ulp at the output's magnitude
        diff = (out.float() - ref.float()).abs().max()
        assert out.shape == ref.shape and float(diff) <= float(ulp), (m, float(diff), float(ulp))
        stock_us = triton.testing.do_bench(
            lambda x=x: torch.nn.functional.linear(x, w)) * 1e3
        op_us = triton.testing.do_bench(lambda x=x: op(x, w, rows)) * 1e3
        line.append(f"M={m}: stock {stock_us:.2f} us, padded op {op_us:.2f} us, "
                    f"max|diff| {float(diff):.3g}")
    vllm_tree.record_line("  " + "; ".join(line))


def test_padded_matches_stock_and_timing() -> None:
    vllm_tree.record_line("gdn-ba-pad-small-m (op forced on the H200; bf16 [M,5120]x[5120,96]):")
    vllm_tree.fails_on_pristine(_check)


def test_gate_is_off_on_this_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    _, patched = vllm_tree.trees()
    cap = torch.cuda.get_device_capability()
    rows = cpu._gate(patched, capability=cap, monkeypatch=monkeypatch)
    vllm_tree.record_line(f"gdn-ba-pad-small-m gate on sm{cap[0]}{cap[1]}: pad_rows={rows}")
    if cap in ((8, 6), (8, 9), (12, 0)):
        assert rows == 5
    else:
        assert rows == 0
