"""spec-sampler-prewarm is retired: vLLM 0.32.0's V2 ``warmup_kernels`` already drives the
rejection sampler at boot. With speculative decoding on, ``_warmup_kernels`` runs decode steps
whose ``SchedulerOutput`` carries draft tokens for every request, through the worker's own
``execute_model`` / ``sample_tokens``, so ``RejectionSampler.__call__`` (and its Triton kernels)
runs before the first request; the row's dummy rejection-sampler run would repeat it.

Runs vLLM's own ``warmup_kernels`` / ``_warmup_kernels`` (v1/worker/gpu/warmup.py, its imports
stubbed by recorders) with a fake runner (3 speculative steps, decode query length 4) and a
recording ``worker_execute_model``, on the pristine tree and through the series. The boot with a
cold Triton cache (zero in-request compiles of ``rejection_sampler_utils``) needs vLLM's compiled
ops and was not run here."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ._helpers import load_with_auto_stubs

pytestmark = pytest.mark.e2e
pytest.importorskip("torch")


class _Output(SimpleNamespace):
    @classmethod
    def make_empty(cls) -> _Output:
        return cls(scheduled_new_reqs=[], scheduled_cached_reqs=None, num_scheduled_tokens={},
                   scheduled_spec_decode_tokens={}, finished_req_ids=set(),
                   total_num_scheduled_tokens=0, num_spec_tokens_to_schedule=0)


class _SamplingParams:
    """vLLM's SamplingParams as the warmup builds them: the sampler warmup's, and (0.33.0,
    with a drafter) a greedy pass's."""

    @staticmethod
    def for_sampler_warmup() -> str:
        return "warmup-params"

    def __new__(cls, **kwargs: Any) -> Any:
        return f"params{sorted(kwargs.items())}"


def _warmup(tree: Path, *, adaptive: bool = False) -> tuple[list[_Output], list[bool]]:
    """The scheduler outputs the warm-up hands to execute_model, and whether adaptive
    verification was on at each call."""
    mod = load_with_auto_stubs(tree / "v1/worker/gpu/warmup.py", loose=True)
    mod.__dict__.update(
        SchedulerOutput=_Output, CachedRequestData=_Output,
        NewRequestData=SimpleNamespace(from_request=lambda req, **kw: req),
        Request=lambda *a, **kw: a[0],
        SamplingParams=_SamplingParams,
        GrammarOutput=SimpleNamespace,
        _warmup_block_counter=lambda runner: (lambda n, spec: -(-n // 16)),
        torch=SimpleNamespace(accelerator=SimpleNamespace(synchronize=lambda: None)),
    )
    sampler = SimpleNamespace(enable_adaptive_verification=adaptive)
    runner = SimpleNamespace(
        vllm_config=SimpleNamespace(is_mm_encoder_only=False), num_speculative_steps=3,
        decode_query_len=4, is_pooling_model=False, is_encoder_decoder=False,
        kv_cache_config=SimpleNamespace(kv_cache_groups=[SimpleNamespace(kv_cache_spec=None)],
                                        num_blocks=4096),
        model_state=SimpleNamespace(), scheduler_config=SimpleNamespace(
            max_num_seqs=4, max_num_batched_tokens=8192),
        block_tables=None, kv_block_zeroer=None, is_last_pp_rank=True,
        model_config=SimpleNamespace(get_vocab_size=lambda: 1024),
        kv_connector=SimpleNamespace(set_disabled=lambda flag: None),
        adaptive_verification=object() if adaptive else None, rejection_sampler=sampler,
        speculative_config=object())  # 0.33.0 warms a greedy pass too with a drafter
    outputs: list[_Output] = []
    adaptive_on: list[bool] = []

    def execute(out: _Output) -> None:
        outputs.append(out)
        adaptive_on.append(sampler.enable_adaptive_verification)

    mod.warmup_kernels(runner, execute, lambda grammar: None)
    assert sampler.enable_adaptive_verification is adaptive  # restored
    return outputs, adaptive_on


def _check(tree: Path) -> None:
    outputs, _ = _warmup(tree)
    decodes = [o for o in outputs if o.scheduled_cached_reqs is not None]
    assert decodes
    every = [o for o in decodes
             if set(o.scheduled_spec_decode_tokens) == set(o.scheduled_cached_reqs.req_ids)
             and len(o.scheduled_cached_reqs.req_ids) == 4]
    assert every, "no decode step drafts for every request"
    for o in every:
        assert all(len(t) == 3 for t in o.scheduled_spec_decode_tokens.values())
        assert all(n == 4 for n in o.num_scheduled_tokens.values())
    # and mixed steps: some requests with drafts, some without
    assert any(o.scheduled_spec_decode_tokens
               and set(o.scheduled_spec_decode_tokens) != set(o.scheduled_cached_reqs.req_ids)
               for o in decodes)


def test_pristine_warmup_drives_the_rejection_sampler(pristine_vllm: Path) -> None:
    _check(pristine_vllm)


def test_patched_warmup_drives_the_rejection_sampler(patched_vllm: Path) -> None:
    _check(patched_vllm)


def test_pristine_warmup_runs_without_adaptive_verification(pristine_vllm: Path) -> None:
    # the residual gap the retirement note names: adaptive verification's variants
    # are not warmed here
    _, adaptive_on = _warmup(pristine_vllm, adaptive=True)
    assert adaptive_on and not any(adaptive_on)
