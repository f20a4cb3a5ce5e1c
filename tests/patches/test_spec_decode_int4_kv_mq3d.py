"""spec-decode-int4-kv-mq3d: with VLLM_INT4_MQ_3D a multi-query (verify) batch over the int4
per-token-head cache takes the packed kernel's 3D split-KV path when every sequence has at most
16 query tokens and every token has a scratch row; the decision is a pure function
(packed_attn_3d_refusals) and decode batches decide as before.

Runs vLLM's real packed_attn_3d_refusals and _launch_packed_attn (v1/attention/ops/
int4_per_token_head.py) on CPU, the Triton launches replaced by recorders. reduce_segments'
zero-length guard, the 3D-vs-2D numerics and the speed: tests/gpu/
test_spec_decode_int4_kv_mq3d_gpu.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ._helpers import assert_pristine_lacks, envs_stubs_active, load_envs
from ._int4_launch import module_functions, refusals_fn, run_launcher

pytestmark = pytest.mark.e2e
torch = pytest.importorskip("torch")


def _args(**over: Any) -> dict[str, Any]:
    args: dict[str, Any] = dict(
        seq_threshold_3D=8, num_par_softmax_segments=16, scratch_rows=(128, 128, 128),
        num_tokens=64, num_seqs=8, max_seqlen_q=8, batch_invariant=False, mq_3d=True)
    args.update(over)
    return args


def test_patched_use_3d_predicate(patched_vllm: Path) -> None:
    refusals = refusals_fn(patched_vllm)
    assert refusals(**_args()) == []                                  # eligible: 3D
    assert "mq_3d_off" in refusals(**_args(mq_3d=False))              # flag off: 2D
    assert refusals(**_args(mq_3d=False, max_seqlen_q=1, num_tokens=8)) == []  # decode as before
    assert "q_above_cap" in refusals(**_args(max_seqlen_q=17, num_tokens=17))
    assert refusals(**_args(max_seqlen_q=16, num_tokens=128)) == []   # the cap itself is in
    assert "q_token_capacity_failed" in refusals(**_args(num_tokens=129))
    assert "q_token_capacity_failed" in refusals(**_args(num_tokens=100, scratch_rows=(128, 64, 128)))
    assert "num_seqs_threshold" in refusals(**_args(num_seqs=9))
    assert "batch_invariant" in refusals(**_args(batch_invariant=True))
    assert "scratch_absent" in refusals(**_args(scratch_rows=None))
    assert "no_threshold" in refusals(**_args(seq_threshold_3D=None))
    assert "no_segments" in refusals(**_args(num_par_softmax_segments=None))


def _check_launch(tree: Path) -> None:
    on = {"VLLM_INT4_MQ_3D": "1"}
    got = run_launcher(tree, num_seqs=4, q_len=8, rows=64, env=on)
    assert got["IS_3D"] is True, "a 4 x 8 verify batch with 64 scratch rows stays on 2D"
    assert got["grid"][2] == 16 and got["segments"] == 16 and got["reduced"]


def test_patched_launcher_takes_3d_for_verify(patched_vllm: Path) -> None:
    _check_launch(patched_vllm)
    on = {"VLLM_INT4_MQ_3D": "1"}
    # knob off, or tokens past the scratch rows, or q above 16: 2D as before
    assert run_launcher(patched_vllm, num_seqs=4, q_len=8, rows=64)["IS_3D"] is False
    assert run_launcher(patched_vllm, num_seqs=4, q_len=8, rows=31, env=on)["IS_3D"] is False
    assert run_launcher(patched_vllm, num_seqs=1, q_len=17, rows=64, env=on)["IS_3D"] is False
    # decode: 3D within the threshold, 2D past it, with or without the knob
    assert run_launcher(patched_vllm, num_seqs=8, q_len=1, rows=8)["IS_3D"] is True
    assert run_launcher(patched_vllm, num_seqs=9, q_len=1, rows=9)["IS_3D"] is False


def test_pristine_refuses_3d_for_multi_query(pristine_vllm: Path) -> None:
    assert "packed_attn_3d_refusals" not in module_functions(pristine_vllm)
    assert_pristine_lacks(lambda: _check_launch(pristine_vllm))


def _check_debug_runtime_only(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    envs = load_envs(tree)
    for name in ("VLLM_INT4_MQ_3D", "VLLM_INT4_MQ_3D_DEBUG"):
        monkeypatch.delenv(name, raising=False)
    with envs_stubs_active(envs):
        base = envs.compile_factors()
        monkeypatch.setenv("VLLM_INT4_MQ_3D_DEBUG", "1")
        assert envs.compile_factors() == base, "the decision log changes the compile key"
        monkeypatch.delenv("VLLM_INT4_MQ_3D_DEBUG")
        # the path switch selects kernels: it stays in the key
        monkeypatch.setenv("VLLM_INT4_MQ_3D", "1")
        assert envs.compile_factors() != base
        monkeypatch.delenv("VLLM_INT4_MQ_3D")


def test_patched_debug_knob_runtime_only(patched_vllm: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    _check_debug_runtime_only(patched_vllm, monkeypatch)


def test_pristine_series_keys_the_debug_knob(pristine_vllm: Path,
                                             monkeypatch: pytest.MonkeyPatch,
                                             tmp_path: Path) -> None:
    """The series cut before this patch registers the knob (speed-knobs-envs) in the key."""
    from ._helpers import tree_before

    before = tree_before(pristine_vllm, tmp_path, "spec-decode-int4-kv-mq3d")
    assert_pristine_lacks(lambda: _check_debug_runtime_only(before, monkeypatch))
