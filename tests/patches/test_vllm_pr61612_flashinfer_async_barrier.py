"""vllm-pr61612-flashinfer-async-barrier: under async scheduling FlashInfer's metadata builder
reads the sequence lengths with the blocking ``seq_lens.cpu()`` (the host barrier between two
steps' ``plan()`` calls), not the scheduler's host upper bound.

Runs vLLM's own ``FlashInferMetadataBuilder.build`` (v1/attention/backends/flashinfer.py, its
imports stubbed, FlashInfer included) on a one-prefill batch up to the point where the host
lengths are first used, and records which source they came from. The race the barrier
prevents is shown on a GPU (tests/gpu/test_vllm_pr61612_flashinfer_async_barrier_gpu.py)."""

from __future__ import annotations

import itertools
from contextlib import nullcontext
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ._helpers import assert_pristine_lacks, load_with_auto_stubs

pytestmark = pytest.mark.e2e
pytest.importorskip("torch")

FILE = "v1/attention/backends/flashinfer.py"


class _Reached(Exception):
    """The build used its host sequence lengths; ``source`` says which ones."""

    def __init__(self, source: str) -> None:
        super().__init__(source)
        self.source = source


class _HostLens:
    def __init__(self, source: str) -> None:
        self.source = source

    def numpy(self) -> Any:
        raise _Reached(self.source)


class _DeviceLens:
    """``seq_lens`` on the device: ``.cpu()`` is the blocking read."""

    def cpu(self) -> _HostLens:
        return _HostLens("blocking seq_lens.cpu()")


def _source(tree: Path, *, async_scheduling: bool, spec_tokens: int, bound: bool) -> str:
    mod = load_with_auto_stubs(tree / FILE, prefixes=("vllm", "flashinfer"), loose=True)
    mod.__dict__.update(
        split_decodes_and_prefills=lambda *a, **k: (0, 1, 0, 4),
        use_trtllm_attention=lambda *a, **k: False,
        FlashInferMetadata=SimpleNamespace,
        gpu_sync_allowed=nullcontext,
    )
    cls = mod.FlashInferMetadataBuilder
    builder = cls.__new__(cls)
    builder.__dict__.update(
        use_xqa=False, reorder_batch_threshold=1, use_trtllm_gen_varlen_decode=False,
        page_size=16, attention_config=SimpleNamespace(use_trtllm_attention=False),
        num_qo_heads=8, num_kv_heads=2, dcp_world_size=1, cache_dtype="auto",
        q_data_type_prefill=None, q_data_type_decode=None, has_sinks=False,
        use_trtllm_decode_attention=False, use_dcp=False, kv_cache_layout="NHD",
        global_hyperparameters=SimpleNamespace(has_same_window_lefts=True,
                                               has_same_all_params=True),
        _num_speculative_tokens=spec_tokens,
        vllm_config=SimpleNamespace(
            scheduler_config=SimpleNamespace(async_scheduling=async_scheduling)),
    )
    metadata = SimpleNamespace(
        num_reqs=1, num_actual_tokens=4, causal=True, max_seq_len=10,
        seq_lens=_DeviceLens(), block_table_tensor=None, query_start_loc=None,
        query_start_loc_cpu=None, slot_mapping=None,
        seq_lens_cpu_upper_bound=_HostLens("host upper bound") if bound else None)
    with pytest.raises(_Reached) as reached:
        builder.build(common_prefix_len=0, common_attn_metadata=metadata)
    return reached.value.source


CASES = list(itertools.product((False, True), (0, 2), (True, False)))


def _check(tree: Path) -> None:
    for async_scheduling, spec_tokens, bound in CASES:
        blocking = async_scheduling or spec_tokens > 0 or not bound
        want = "blocking seq_lens.cpu()" if blocking else "host upper bound"
        got = _source(tree, async_scheduling=async_scheduling, spec_tokens=spec_tokens,
                      bound=bound)
        assert got == want, (async_scheduling, spec_tokens, bound, got)


def test_patched_async_scheduling_keeps_the_blocking_read(patched_vllm: Path) -> None:
    _check(patched_vllm)


def test_patched_decision_function(patched_vllm: Path) -> None:
    mod = load_with_auto_stubs(patched_vllm / FILE, prefixes=("vllm", "flashinfer"), loose=True)
    usable = mod._seq_lens_upper_bound_usable
    table = {case: usable(case[1], case[2], case[0]) for case in CASES}
    assert [case for case, ok in table.items() if ok] == [(False, 0, True)]


def test_pristine_takes_the_upper_bound_under_async(pristine_vllm: Path) -> None:
    # sync scheduling without spec tokens: the shortcut, before and after the patch
    assert _source(pristine_vllm, async_scheduling=False, spec_tokens=0,
                   bound=True) == "host upper bound"
    assert_pristine_lacks(lambda: _check(pristine_vllm))
