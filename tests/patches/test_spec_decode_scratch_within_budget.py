"""spec-decode-scratch-within-budget: TRITON_ATTN's 3D scratch is acquired from a pool keyed
by (device, geometry): the Impl allocates it at model load (inside the memory profile), the
metadata builders adopt it; an exclusive (DBO) builder gets its own set, a larger plan
allocates with a WARNING, an Impl without a current config allocates nothing.

Runs vLLM's real triton_attn.py (the engine stubbed, fake configs, CPU tensors). The memory
accounting inside the real memory_profiling on a GPU:
tests/gpu/test_spec_decode_scratch_within_budget_gpu.py."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from . import _triton_builder as tb
from ._helpers import assert_pristine_lacks

pytestmark = pytest.mark.e2e
torch = pytest.importorskip("torch")


def _check_pool(tree: Path, caplog: Any) -> None:
    mod = tb.load(tree)
    assert hasattr(mod, "acquire_mq3d_scratch"), "no 3D scratch pool"
    cfg = tb.fake_config(max_num_seqs=8, capture_sizes=[1, 2, 4, 8])
    plan = mod.mq3d_scratch_plan(cfg)
    assert (plan.num_heads_q, plan.num_heads_kv, plan.headdim_padded) == (16, 4, 128)
    assert plan.capacity == 128 and plan.nbytes == 128 * plan.row_bytes
    with caplog.at_level(logging.INFO):
        first = mod.acquire_mq3d_scratch(plan, "cpu", origin="model load")
        assert first.adopters == 0 and first.max.shape[0] == 128
        b1, b2 = tb.builder(mod, cfg), tb.builder(mod, cfg)
    # two builders of one geometry: one allocation, two adopters, no WARNING
    assert b1.softmax_segm_output is first.output is b2.softmax_segm_output
    assert b1.softmax_segm_max is first.max and b2.softmax_segm_expsum is first.expsum
    assert first.adopters == 2
    assert not tb.records(caplog, logging.WARNING)
    # exclusive (micro-batching): the second one allocates its own
    ub = tb.fake_config(max_num_seqs=8, capture_sizes=[1, 2, 4, 8], ubatching=True)
    mod._MQ3D_SCRATCH_POOL.clear()
    mod.acquire_mq3d_scratch(plan, "cpu", origin="model load")
    e1, e2 = tb.builder(mod, ub), tb.builder(mod, ub)
    assert e1.softmax_segm_max is not e2.softmax_segm_max
    # a smaller plan adopts a larger pooled set and declares its capacity
    mod._MQ3D_SCRATCH_POOL.clear()
    big = mod.mq3d_scratch_plan(tb.fake_config(max_num_seqs=64, capture_sizes=[1, 2, 4, 8]))
    mod.acquire_mq3d_scratch(big, "cpu", origin="model load")
    small = tb.builder(mod, tb.fake_config(max_num_seqs=2, capture_sizes=[1, 2, 4, 8]))
    assert small.scratch_token_capacity_3d == big.capacity == 128
    assert small.softmax_segm_max.shape[0] == 128
    # a larger plan than the pool: allocates, with a WARNING (outside the budget)
    caplog.clear()
    with caplog.at_level(logging.INFO):
        larger = tb.builder(mod, tb.fake_config(max_num_seqs=32, max_num_batched_tokens=4096,
                                                capture_sizes=[1, 2, 4, 8, 16, 32]))
    assert larger.scratch_token_capacity_3d == 32 * 16
    warns = tb.records(caplog, logging.WARNING)
    assert len(warns) == 1 and "outside the KV cache budget" in warns[0].getMessage()
    # the device index is in the key
    keys = list(mod._MQ3D_SCRATCH_POOL)
    assert all(k[0] == "cpu" and k[1] is None for k in keys)
    meta = mod.Mq3dScratch(plan, torch.device("meta", 0), "model load")
    mod._MQ3D_SCRATCH_POOL[("meta", 0, 16, 16, 128)] = meta
    other = mod.acquire_mq3d_scratch(plan, torch.device("meta", 1), origin="model load")
    assert other is not meta and ("meta", 1, 16, 16, 128) in mod._MQ3D_SCRATCH_POOL


def test_patched_pool(patched_vllm: Path, caplog: Any) -> None:
    _check_pool(patched_vllm, caplog)


def test_pristine_has_no_pool(pristine_vllm: Path, caplog: Any) -> None:
    assert_pristine_lacks(lambda: _check_pool(pristine_vllm, caplog))


def test_patched_impl_acquires_at_model_load(patched_vllm: Path) -> None:
    cfg = tb.fake_config(max_num_seqs=8, capture_sizes=[1, 2, 4, 8])
    # no current config: nothing allocated
    mod = tb.load(patched_vllm, cuda=True, current_config=None)
    tb.impl(mod)
    assert mod._MQ3D_SCRATCH_POOL == {}
    # a current config on a CUDA-alike platform: the model-load set, pooled (device cuda:0)
    mod = tb.load(patched_vllm, cuda=True, current_config=cfg)
    calls: list[Any] = []
    real = mod.acquire_mq3d_scratch
    mod.__dict__["acquire_mq3d_scratch"] = lambda plan, device, origin, exclusive=False: \
        calls.append((plan, device, origin))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.cuda, "current_device", lambda: 0)
        tb.impl(mod)
    mod.__dict__["acquire_mq3d_scratch"] = real
    assert len(calls) == 1
    plan, device, origin = calls[0]
    assert origin == "model load" and str(device) == "cuda:0"
    assert plan == mod.mq3d_scratch_plan(cfg) and plan.capacity == 128
    # 64 segments are off: the builder's scratch is the pooled 16-segment set
    b = tb.builder(mod, cfg)
    assert b.max_seqs_64_segments == 0 and b.num_par_softmax_segments == 16
