"""spec-decode-scratch-token-units: TRITON_ATTN's 3D scratch is sized in query tokens (every
batch the 3D policy admits fits it, and one reaches it), the capacity and the per-sequence cap
travel to the int4 launcher, and a capacity failure on admitted work is recorded as a breach.

Runs vLLM's real TritonAttentionMetadataBuilder (v1/attention/backends/triton_attn.py, the
engine stubbed, a fake config, CPU tensors) and the real packed_attn_3d_refusals /
_launch_packed_attn (int4_per_token_head.py). The q = 9 batch taking 3D and the builder's
bytes on a GPU: tests/gpu/test_spec_decode_scratch_token_units_gpu.py."""

from __future__ import annotations

import itertools
import logging
from pathlib import Path
from typing import Any

import pytest

from . import _triton_builder as tb
from ._helpers import assert_pristine_lacks
from ._int4_launch import refusals_fn, run_launcher

pytestmark = pytest.mark.e2e
torch = pytest.importorskip("torch")

CAPTURE_SETS = [None, [1, 2, 4, 8], [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64], [1, 256]]


def _rows(b: Any) -> tuple[int, int, int]:
    return (b.softmax_segm_output.shape[0], b.softmax_segm_max.shape[0],
            b.softmax_segm_expsum.shape[0])


def _check_capacity(tree: Path) -> None:
    mod = tb.load(tree)
    checked = 0
    for seqs, budget, hkv, sizes in itertools.product(
            (1, 2, 4, 8, 32, 256), (256, 2048, 8192), (1, 2, 4, 8), CAPTURE_SETS):
        cfg = tb.fake_config(hq=2 * hkv, hkv=hkv, d=32, max_num_seqs=seqs,
                             max_num_batched_tokens=budget, capture_sizes=sizes)
        # a fresh pool per config (spec-decode-scratch-within-budget shares sets)
        getattr(mod, "_MQ3D_SCRATCH_POOL", {}).clear()
        b = tb.builder(mod, cfg)
        rows = _rows(b)
        assert len(set(rows)) == 1, rows
        # the largest batch the 3D policy admits: at most threshold (and max_num_seqs)
        # sequences of at most 16 query tokens, within the token budget
        admitted = min(budget, min(seqs, b.seq_threshold_3D) * 16)
        assert admitted <= rows[0], (seqs, budget, hkv, sizes, b.seq_threshold_3D, rows)
        assert rows[0] == admitted, "the capacity is minimal: an admitted batch reaches it"
        checked += 1
    assert checked == 6 * 3 * 4 * len(CAPTURE_SETS)


def test_patched_capacity_property(patched_vllm: Path) -> None:
    _check_capacity(patched_vllm)


def test_pristine_sizes_in_sequences(pristine_vllm: Path) -> None:
    assert_pristine_lacks(lambda: _check_capacity(pristine_vllm))


def test_patched_builder_declares_its_rows(patched_vllm: Path) -> None:
    mod = tb.load(patched_vllm)
    cfg = tb.fake_config(max_num_seqs=8, capture_sizes=[1, 2, 4, 8])
    b = tb.builder(mod, cfg)
    assert b.seq_threshold_3D == 8 and b.max_query_len_3d == mod.MAX_QUERY_LEN_3D == 16
    assert b.scratch_token_capacity_3d == 128 == _rows(b)[0]
    assert mod.scratch_row_bytes_3d(16, 128) == 4 * (16 * 16 * 128 + 2 * 16 * 16)
    # the declared rows reach the launcher's predicate; a shrunk buffer refuses 3D
    refusals = refusals_fn(patched_vllm)
    args: dict[str, Any] = dict(
        seq_threshold_3D=b.seq_threshold_3D, num_par_softmax_segments=16, num_tokens=72,
        num_seqs=8, max_seqlen_q=9, batch_invariant=False, mq_3d=True,
        max_query_len_3d=b.max_query_len_3d,
        scratch_token_capacity_3d=b.scratch_token_capacity_3d)
    assert refusals(scratch_rows=_rows(b), **args) == []
    shrunk = (_rows(b)[0], _rows(b)[1] - 1, _rows(b)[2])
    assert "buffers_disagree" in refusals(scratch_rows=shrunk, **args)
    assert "q_above_cap" in refusals(scratch_rows=_rows(b), **{**args, "max_query_len_3d": 8})


def test_patched_launcher_takes_the_passed_cap(patched_vllm: Path) -> None:
    on = {"VLLM_INT4_MQ_3D": "1"}
    base = run_launcher(patched_vllm, num_seqs=1, q_len=12, rows=64, env=on)
    assert base["IS_3D"] is True
    capped = run_launcher(patched_vllm, num_seqs=1, q_len=12, rows=64, env=on,
                          extra={"max_query_len_3d": 8, "scratch_token_capacity_3d": 64})
    assert capped["IS_3D"] is False
    wrong = run_launcher(patched_vllm, num_seqs=1, q_len=12, rows=64, env=on,
                         extra={"scratch_token_capacity_3d": 32})
    assert wrong["IS_3D"] is False  # buffers of other rows than declared


def test_patched_breach_record(patched_vllm: Path, caplog: Any) -> None:
    refusals = refusals_fn(patched_vllm)
    state = refusals.__globals__["mq3d_breach_state"]
    assert state() == {"count": 0, "degraded": False, "first": None}
    args: dict[str, Any] = dict(
        seq_threshold_3D=8, num_par_softmax_segments=16, scratch_rows=(8, 8, 8),
        num_tokens=9, num_seqs=1, max_seqlen_q=9, batch_invariant=False, mq_3d=True)
    with caplog.at_level(logging.DEBUG):
        for n in range(1, 6):
            assert refusals(**args) == ["q_token_capacity_failed"]
            assert state()["count"] == n and state()["degraded"] is True
        # refused for another reason too: policy said no, not a breach
        assert "mq_3d_off" in refusals(**{**args, "mq_3d": False})
    assert state()["count"] == 5
    assert "tokens 9, rows 8" in state()["first"]
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "does not fit" in errors[0].getMessage()
