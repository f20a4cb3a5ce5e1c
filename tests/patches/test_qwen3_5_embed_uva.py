"""qwen3_5-embed-uva: with ``VLLM_EMBED_UVA=1`` the quantised token table of Qwen3.5 (its
``weight_packed``) moves to pinned host memory behind a UVA view at the end of
``Qwen3_5Model.load_weights`` (the MTP module's only with more than one pipeline stage); off,
dense, tied or already moved, nothing changes.

Runs vLLM's own ``maybe_offload_embed_tokens_uva`` and the two ``load_weights``
(model_executor/models/qwen3_5.py, qwen3_5_mtp.py), extracted from the files, with the pinned
copy and the view op (``_C``) replaced by recorders. vLLM's own Triton gather reading the table
from pinned host memory: tests/gpu/test_qwen3_5_embed_uva_gpu.py."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ._helpers import assert_pristine_lacks, exec_function, load_envs

pytestmark = pytest.mark.e2e
torch = pytest.importorskip("torch")

MODEL = "model_executor/models/qwen3_5.py"
MTP = "model_executor/models/qwen3_5_mtp.py"
HELPER = "maybe_offload_embed_tokens_uva"


class _Recorder:
    def __init__(self) -> None:
        self.events: list[str] = []
        self.warnings: list[str] = []

    def namespace(self, tree: Path) -> dict[str, Any]:
        def empty_like(t: Any, device: str, pin_memory: bool) -> Any:
            assert device == "cpu" and pin_memory
            self.events.append("pinned copy")
            return torch.empty_like(t, device="cpu")

        def view(cpu: Any) -> Any:
            self.events.append("uva view")
            return cpu.clone()

        fake_torch = SimpleNamespace(
            empty_like=empty_like,
            accelerator=SimpleNamespace(empty_cache=lambda: self.events.append("empty_cache")))
        log = SimpleNamespace(warning_once=lambda msg, *a: self.warnings.append(msg),
                              info=lambda *a: None)
        return {"torch": fake_torch, "envs": load_envs(tree), "logger": log,
                "get_accelerator_view_from_cpu_tensor": view}


def _offload(tree: Path, monkeypatch: Any, *, knob: str = "1", quantised: bool = True,
             tied: bool = False, times: int = 1) -> tuple[_Recorder, Any, Any]:
    monkeypatch.setenv("VLLM_EMBED_UVA", knob)
    rec = _Recorder()
    helper = exec_function(tree / MODEL, HELPER, rec.namespace(tree))
    embed = torch.nn.Module()
    table = torch.arange(64, dtype=torch.int32).reshape(16, 4)
    if quantised:
        embed.weight_packed = torch.nn.Parameter(table.clone(), requires_grad=False)
    else:
        embed.weight = torch.nn.Parameter(torch.zeros(16, 32), requires_grad=False)
    before = dict(embed.named_parameters())
    for _ in range(times):
        helper(embed, tied=tied)
    return rec, embed, before


def _check(tree: Path, monkeypatch: Any) -> None:
    rec, embed, _ = _offload(tree, monkeypatch)
    assert rec.events == ["pinned copy", "uva view", "empty_cache"], rec.events
    assert embed.weight_packed._vllm_is_uva_offloaded
    assert torch.equal(embed.weight_packed.data, torch.arange(64).reshape(16, 4).int())
    # a second call (a reload) does nothing
    rec2, _, _ = _offload(tree, monkeypatch, times=2)
    assert rec2.events.count("uva view") == 1


def test_patched_moves_the_quantised_table(patched_vllm: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    _check(patched_vllm, monkeypatch)


def test_patched_leaves_other_tables(patched_vllm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rec, embed, before = _offload(patched_vllm, monkeypatch, knob="0")
    assert not rec.events and not rec.warnings
    assert not hasattr(embed.weight_packed, "_vllm_is_uva_offloaded")
    rec, embed, before = _offload(patched_vllm, monkeypatch, quantised=False)
    assert not rec.events and len(rec.warnings) == 1  # dense: one warning, nothing moved
    assert dict(embed.named_parameters()) == before
    rec, embed, _ = _offload(patched_vllm, monkeypatch, tied=True)
    assert not rec.events


def _load_weights_calls(tree: Path, file: str, qualname: str, pp: int,
                        tied: bool) -> list[tuple[str, bool]]:
    calls: list[tuple[str, bool]] = []

    class AutoWeightsLoader:
        def __init__(self, module: Any) -> None:
            pass

        def load_weights(self, weights: Any, mapper: Any = None) -> set[str]:
            return {"embed_tokens.weight_packed"}

    load = exec_function(tree / file, qualname, {
        "AutoWeightsLoader": AutoWeightsLoader,
        "maybe_fuse_shared_experts": lambda weights, **kw: weights,
        "get_pp_group": lambda: SimpleNamespace(world_size=pp, is_first_rank=True),
        HELPER: lambda embed, tied: calls.append((embed, tied))})
    model = SimpleNamespace(
        config=SimpleNamespace(model_type="qwen3_5_text", tie_word_embeddings=tied,
                               num_experts=0),
        is_fused_shared_expert_enabled=False, hf_to_vllm_mapper=None,
        embed_tokens="embed_tokens")
    assert load(model, iter(())) == {"embed_tokens.weight_packed"}
    return calls


def _check_load_weights(tree: Path) -> None:
    model = "Qwen3_5Model.load_weights"
    assert _load_weights_calls(tree, MODEL, model, 1, False) == [("embed_tokens", False)]
    assert _load_weights_calls(tree, MODEL, model, 1, True) == [("embed_tokens", True)]
    mtp = "Qwen3_5MultiTokenPredictor.load_weights"
    assert _load_weights_calls(tree, MTP, mtp, 1, False) == []  # shares the target's
    assert _load_weights_calls(tree, MTP, mtp, 2, False) == [("embed_tokens", False)]


def test_patched_load_weights_call_the_helper(patched_vllm: Path) -> None:
    _check_load_weights(patched_vllm)


def test_pristine_keeps_the_table_on_the_device(pristine_vllm: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    assert _load_weights_calls(pristine_vllm, MODEL, "Qwen3_5Model.load_weights", 1,
                               False) == []
    assert_pristine_lacks(lambda: _check(pristine_vllm, monkeypatch))
    assert_pristine_lacks(lambda: _check_load_weights(pristine_vllm))
