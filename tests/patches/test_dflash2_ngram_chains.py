"""dflash2-ngram-chains: with VLLM_DFLASH2_CHAIN=1 (and the lookup on) a single greedy
request that keeps repeating its context is drafted by the suffix lookup alone: a chain
starts after a normal step whose lookup matched CHAIN_MINMATCH tokens, proposes all K
positions as point masses without running the draft model (its context K/V is still
stored), verifies K wide, and ends at the first rejected token; the step right after a
chain drafts normally.

Runs vLLM's DFlash2Speculator from the patched tree on CPU (propose, the chain decision
and the chain step) with the base DFlashSpeculator.propose replaced by a recorder, the new
dflash2/chains.py state machine, and the real envs.py; the harness (stand-in base, the
Python n-gram scan) is test_dflash2_lookup_drafting's."""

from __future__ import annotations

import inspect
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from ._helpers import load_envs, load_with_auto_stubs, make_module, stub_modules
from .test_dflash2_lookup_drafting import (
    MAX_REQS,
    SPEC,
    _Event,
    _request_states,
    _set_env,
    _speculator_modules,
    _vllm_config,
)

pytestmark = pytest.mark.e2e
torch = pytest.importorskip("torch")

PERIOD = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26]
K = 15


def _chains_module(tree: Path) -> Any:
    return load_with_auto_stubs(tree / "v1/worker/gpu/spec_decode/dflash2/chains.py",
                                package=f"{SPEC}.dflash2")


def test_patched_state_machine(patched_vllm: Path) -> None:
    chains = _chains_module(patched_vllm)

    def run(steps: list[tuple[bool, bool, bool]]) -> list[bool]:
        state = chains.ChainState()
        out = []
        for eligible, evidence, missed in steps:
            state = chains.chain_step(state, eligible, evidence, missed)
            out.append(state.prev_chain)
        return out

    e = (True, True, False)  # eligible, evidence, no miss
    quiet = (True, False, False)
    miss = (True, True, True)
    # Entry only after a normal step with evidence.
    assert run([quiet, quiet, e]) == [False, False, True]
    # Stays while no miss (evidence no longer needed), exits on the first miss.
    assert run([e, quiet, quiet, miss, quiet]) == [True, True, True, False, False]
    # No re-entry on the step right after a chain step.
    state = chains.ChainState(active=False, prev_chain=True)
    assert not chains.chain_step(state, True, True, False).prev_chain
    # Exit, then a normal step with evidence, then re-entry.
    assert run([e, miss, e]) == [True, False, True]
    # Leaves when the batch grows (ineligible), even without a miss.
    assert run([e, e, (False, True, False), e]) == [True, True, False, True]


def _modules(tree: Path) -> tuple[Any, Any, Any]:
    return _speculator_modules(tree, {f"{SPEC}.dflash2.chains": _chains_module(tree)})


class _Recorder:
    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []


def _build(tree: Path, monkeypatch: pytest.MonkeyPatch, greedy: bool = True,
           history: list[int] | None = None, **env: str) -> tuple[Any, _Recorder]:
    _set_env(monkeypatch, **{"LOOKUP": "1", "LOOKUP_NMIN": "3", "LOOKUP_NSTRONG": "3",
                              "LOOKUP_NMIN_TAIL": "3", "LOOKUP_LONGMIN": "3",
                              "LOOKUP_ADAPTIVE": "0", **env})
    for name in ("CHAIN", "CHAIN_MINMATCH", "CHAIN_GREEDY_ONLY", "CHAIN_LOG_SEC"):
        if name not in env:
            monkeypatch.delenv(f"VLLM_DFLASH2_{name}", raising=False)
    _, dflash, dflash2 = _modules(tree)
    monkeypatch.setattr(torch.cuda, "Event", _Event)
    recorder = _Recorder()

    def base_propose(self: Any, input_batch: Any, *args: Any, **kwargs: Any) -> Any:
        recorder.calls.append(kwargs)
        self.draft_tokens[:input_batch.num_reqs] = 99  # the drafter's walk
        return self.draft_tokens[:input_batch.num_reqs]

    monkeypatch.setattr(dflash.DFlashSpeculator, "propose", base_propose)
    qwen3_dflash = make_module("vllm.model_executor.models.qwen3_dflash",
                               dflash_has_any_non_causal=lambda cfg: False)
    config = _vllm_config(k=K, block_size=8)
    config.speculative_config.uses_dynamic_speculative_decoding = lambda: False
    states = _request_states([history if history is not None else PERIOD * 3])
    with stub_modules({"vllm.model_executor.models.qwen3_dflash": qwen3_dflash}):
        spec = dflash2.DFlash2Speculator(config, torch.device("cpu"), states)
    spec.set_sampling_states(SimpleNamespace(temperature=SimpleNamespace(
        np=np.array([0.0 if greedy else 0.7] * MAX_REQS, dtype=np.float32))))
    spec.dp_size = 1
    spec.pcp_manager = None
    # The chain step's input preparation (the base's own methods, which launch the
    # Triton input kernel and the drafter's K/V precompute) is recorded here.
    spec.prepared = []
    spec._stage_hidden_states = lambda *a: spec.prepared.append("hidden")
    spec._prepare_query_inputs = lambda *a: spec.prepared.append("query")
    spec._precompute_context_kv = lambda s, e, *a: spec.prepared.append(("kv", s, e))
    return spec, recorder


def _batch(num_reqs: int = 1) -> Any:
    return SimpleNamespace(num_reqs=num_reqs, num_tokens=num_reqs * (K + 1),
                           idx_mapping=torch.arange(num_reqs),
                           idx_mapping_np=np.arange(num_reqs),
                           req_ids=[f"r{i}" for i in range(num_reqs)],
                           seq_lens_cpu_upper_bound=np.array([48] * num_reqs))


def _propose(spec: Any, rejected: int = 0, num_reqs: int = 1, **kwargs: Any) -> list[int]:
    out = spec.propose(_batch(num_reqs), {}, {}, torch.zeros(1), None,
                       torch.tensor([K + 1 - rejected] * num_reqs, dtype=torch.int32),
                       torch.tensor([rejected] * num_reqs, dtype=torch.int32),
                       torch.zeros(MAX_REQS, dtype=torch.int64),
                       torch.zeros(MAX_REQS, dtype=torch.int64),
                       torch.zeros(MAX_REQS), torch.zeros(MAX_REQS, dtype=torch.int64),
                       **kwargs)
    return [int(t) for t in out[0]]


def _check_chain_run(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec, recorder = _build(tree, monkeypatch, CHAIN="1", CHAIN_MINMATCH="6")
    continuation = (PERIOD * 2)[:K]
    assert spec.chains and spec.next_num_draft_tokens() is None
    _propose(spec)  # normal step: the drafter runs, the lookup leaves evidence
    assert len(recorder.calls) == 1
    tokens = _propose(spec)  # entry: the lookup proposes all K, no drafter
    assert len(recorder.calls) == 1 and tokens == continuation
    assert spec.prepared == ["hidden", "query", ("kv", 0, K + 1)]
    assert spec.next_num_draft_tokens() == K
    # Every chain position is a point mass on its token.
    logits = spec.draft_logits[0]
    for pos, tok in enumerate(continuation):
        assert logits[pos, tok] == 0 and int(torch.isfinite(logits[pos]).sum()) == 1
    _propose(spec, rejected=2)  # chain; the verdict on the entry proposal is queued
    assert len(recorder.calls) == 1
    _propose(spec)  # the miss is read: exit, the drafter runs
    assert len(recorder.calls) == 2 and spec.next_num_draft_tokens() is None
    _propose(spec)  # a normal step with evidence came before: re-entry
    assert len(recorder.calls) == 2 and spec.next_num_draft_tokens() == K
    _propose(spec, num_reqs=2)  # the batch grows: leave
    assert len(recorder.calls) == 3 and spec.next_num_draft_tokens() is None
    assert spec.chain_stats == {"chain_steps": 3, "draft_steps": 3, "entries": 2}


def test_patched_chain_run(patched_vllm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _check_chain_run(patched_vllm, monkeypatch)


def test_pristine_lacks_chains(pristine_vllm: Path) -> None:
    assert not (pristine_vllm / "v1/worker/gpu/spec_decode/dflash2/chains.py").exists()


def test_patched_chain_gates(patched_vllm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Greedy only (the default): a sampled request never chains ...
    spec, recorder = _build(patched_vllm, monkeypatch, greedy=False, CHAIN="1")
    for _ in range(4):
        _propose(spec)
    assert len(recorder.calls) == 4
    # ... unless CHAIN_GREEDY_ONLY=0.
    spec, recorder = _build(patched_vllm, monkeypatch, greedy=False, CHAIN="1",
                            CHAIN_GREEDY_ONLY="0")
    _propose(spec)
    _propose(spec)
    assert len(recorder.calls) == 1
    # A match shorter than MINMATCH is no evidence (the longest repeat here is 5 tokens).
    repeat = [31, 32, 33, 34, 35]
    history = [50, *repeat, *range(40, 56), 60, *repeat]
    spec, recorder = _build(patched_vllm, monkeypatch, CHAIN="1", CHAIN_MINMATCH="6",
                            history=history)
    _propose(spec)
    _propose(spec)
    assert len(recorder.calls) == 2
    spec, recorder = _build(patched_vllm, monkeypatch, CHAIN="1", CHAIN_MINMATCH="5",
                            history=history)
    _propose(spec)
    _propose(spec)
    assert len(recorder.calls) == 1
    # MINMATCH beyond what the lookup reports (NMAX) is refused.
    with pytest.raises(ValueError, match="VLLM_DFLASH2_CHAIN_MINMATCH"):
        _build(patched_vllm, monkeypatch, CHAIN="1", CHAIN_MINMATCH="13")
    # Chains off: every step drafts.
    spec, recorder = _build(patched_vllm, monkeypatch)
    _propose(spec)
    _propose(spec)
    assert len(recorder.calls) == 2 and not spec.chains


def test_patched_chain_needs_lookup(patched_vllm: Path, monkeypatch: pytest.MonkeyPatch,
                                    caplog: pytest.LogCaptureFixture) -> None:
    spec, _ = _build(patched_vllm, monkeypatch, CHAIN="1")
    assert spec.chains
    with caplog.at_level("WARNING"):
        spec, _ = _build(patched_vllm, monkeypatch, CHAIN="1", LOOKUP="0")
    assert not spec.chains
    assert any("VLLM_DFLASH2_CHAIN needs VLLM_DFLASH2_LOOKUP=1" in r.getMessage()
               for r in caplog.records)


def test_patched_propose_signature(patched_vllm: Path,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The override has the base's signature and forwards dp_sync_state and
    num_speculative_tokens unchanged (the runner passes both by keyword)."""
    spec, recorder = _build(patched_vllm, monkeypatch, CHAIN="1")
    _, dflash, dflash2 = _modules(patched_vllm)
    assert (inspect.signature(dflash2.DFlash2Speculator.propose)
            == inspect.signature(dflash.DFlashSpeculator.propose))
    sync = object()
    _propose(spec, num_reqs=2, dp_sync_state=sync, num_speculative_tokens=7)
    assert recorder.calls[-1]["dp_sync_state"] is sync
    assert recorder.calls[-1]["num_speculative_tokens"] == 7


def test_patched_knobs_registered(patched_vllm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    envs = load_envs(patched_vllm)
    for name in ("CHAIN", "CHAIN_MINMATCH", "CHAIN_GREEDY_ONLY"):
        monkeypatch.delenv(f"VLLM_DFLASH2_{name}", raising=False)
    assert (envs.VLLM_DFLASH2_CHAIN, envs.VLLM_DFLASH2_CHAIN_MINMATCH,
            envs.VLLM_DFLASH2_CHAIN_GREEDY_ONLY) == (False, 8, True)
    source = (patched_vllm / "v1/worker/gpu/model_runner.py").read_text()
    assert "self.speculator.set_sampling_states(self.sampler.sampling_states)" in source
