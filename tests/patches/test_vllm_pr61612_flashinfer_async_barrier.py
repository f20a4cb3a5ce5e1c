"""vllm-pr61612-flashinfer-async-barrier: under async scheduling FlashInfer's metadata builder
reads the sequence lengths with the blocking ``seq_lens.cpu()`` (the host barrier between two
steps' ``plan()`` calls), not the scheduler's host upper bound.

Runs vLLM's own ``FlashInferMetadataBuilder.build`` (tests/patches/_flashinfer_build.py) and
records which source the host lengths came from. The race the barrier prevents, with the same
real ``build()`` on a GPU: tests/gpu/test_vllm_pr61612_flashinfer_async_barrier_gpu.py."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from . import _flashinfer_build as fb
from ._helpers import assert_pristine_lacks

pytestmark = pytest.mark.e2e
pytest.importorskip("torch")

CASES = list(itertools.product((False, True), (0, 2), (True, False)))


def _source(tree: Path, *, async_scheduling: bool, spec_tokens: int, bound: bool) -> str:
    return fb.host_seq_lens(fb.load(tree), async_scheduling=async_scheduling,
                            spec_tokens=spec_tokens, bound=bound)[0]


def _check(tree: Path) -> None:
    for async_scheduling, spec_tokens, bound in CASES:
        blocking = async_scheduling or spec_tokens > 0 or not bound
        got = _source(tree, async_scheduling=async_scheduling, spec_tokens=spec_tokens,
                      bound=bound)
        assert got == (fb.BLOCKING if blocking else fb.BOUND), (
            async_scheduling, spec_tokens, bound, got)


def test_patched_async_scheduling_keeps_the_blocking_read(patched_vllm: Path) -> None:
    _check(patched_vllm)


def test_patched_decision_function(patched_vllm: Path) -> None:
    usable = fb.load(patched_vllm)._seq_lens_upper_bound_usable
    table = {case: usable(case[1], case[2], case[0]) for case in CASES}
    assert [case for case, ok in table.items() if ok] == [(False, 0, True)]


def test_pristine_takes_the_upper_bound_under_async(pristine_vllm: Path) -> None:
    # sync scheduling without spec tokens: the shortcut, before and after the patch
    assert _source(pristine_vllm, async_scheduling=False, spec_tokens=0, bound=True) == fb.BOUND
    assert_pristine_lacks(lambda: _check(pristine_vllm))
