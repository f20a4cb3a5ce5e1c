"""qwen3_5-mtp-draft-vocab: Qwen3.5's MTP drafter uses a vocab-truncated head when the
model directory has ``mtp_draft_vocab_ids.pt`` and the checkpoint ``mtp.draft_lm_head.*``:
full-vocabulary logits with -inf outside the draft ids, a local argmax mapped back to
target ids, the head kept under its own attribute when the runner gives the drafter the
target's lm_head, and a malformed id file refused at load.

Runs vLLM's own Qwen3_5MTP (qwen3_5_mtp.py: __init__, compute_logits, get_top_tokens,
load_weights), vLLM's real LogitsProcessor (logits_processor.py, tensor-parallel size 1),
the real envs.py, and the V2 runner's real load_eagle_model (eagle/utils.py); the decoder
layers, norms, fc and the embedding are stubbed (they need a tensor-parallel group), and
the LM heads are a one-rank stand-in for ParallelLMHead (a weight and the unquantized
apply)."""

from __future__ import annotations

import contextlib
import json
import struct
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ._helpers import (
    LooseAutoStub,
    assert_pristine_lacks,
    extract_source,
    load_envs,
    load_module,
    load_with_auto_stubs,
    make_module,
    once_logger_module,
    stub_modules,
)

pytestmark = pytest.mark.e2e
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
nn = torch.nn
F = torch.nn.functional

PACKAGE = "vllm.model_executor.models"
VOCAB = 96
HIDDEN = 16
IDS = [3, 17, 40, 41, 77, 95, 0, 60]  # D = 8, unsorted on purpose


class _Unquantized:
    def apply(self, layer: Any, x: Any, bias: Any = None) -> Any:
        return F.linear(x, layer.weight, bias)


class ParallelLMHead(nn.Module):  # type: ignore[misc,name-defined]
    """One-rank stand-in: the attributes LogitsProcessor reads from a real head."""

    def __init__(self, num_embeddings: int, embedding_dim: int, bias: bool = False,
                 params_dtype: Any = None, org_num_embeddings: Any = None,
                 padding_size: int = 64, quant_config: Any = None, prefix: str = "") -> None:
        super().__init__()
        self.num_embeddings = num_embeddings
        self.prefix = prefix
        self.quant_config = quant_config
        self.weight = nn.Parameter(torch.zeros(num_embeddings, embedding_dim),
                                   requires_grad=False)
        self.tp_size = 1
        self.quant_method = _Unquantized()
        self.shard_indices = SimpleNamespace(num_org_vocab_padding=0,
                                             org_vocab_start_index=0)

    def tie_weights(self, embed: Any) -> ParallelLMHead:
        return self


class _Layer(nn.Module):  # type: ignore[misc,name-defined]
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()


class ColumnParallelLinear(nn.Module):  # type: ignore[misc,name-defined]
    def __init__(self, in_size: int, out_size: int, **kwargs: Any) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(out_size, in_size), requires_grad=False)


class AutoWeightsLoader:
    """Strict like the real loader: a checkpoint name with no parameter is an error."""

    def __init__(self, module: Any, **kwargs: Any) -> None:
        self.module = module

    def load_weights(self, weights: Any, mapper: Any = None) -> set[str]:
        params = dict(self.module.named_parameters())
        loaded = set()
        for name, tensor in weights:
            if name not in params:
                raise ValueError(f"There is no module or parameter named {name!r}")
            params[name].data.copy_(tensor)
            loaded.add(name)
        return loaded


class PluggableLayer(nn.Module):  # type: ignore[misc,name-defined]
    @classmethod
    def register(cls, name: str) -> Any:
        return lambda c: c


def _logits_processor(tree: Path) -> Any:
    platform = SimpleNamespace(use_all_gather=lambda: True, is_cuda=lambda: False)
    mod = load_with_auto_stubs(tree / "model_executor/layers/logits_processor.py", {
        "vllm.logger": once_logger_module(),
        "vllm.envs": load_envs(tree),
        "vllm.config": make_module("vllm.config", get_current_vllm_config=lambda:
                                   SimpleNamespace(model_config=None)),
        "vllm.platforms": make_module("vllm.platforms", current_platform=platform),
        "vllm.model_executor.custom_op": make_module("vllm.model_executor.custom_op",
                                                     PluggableLayer=PluggableLayer),
    }, loose=True)
    return mod.LogitsProcessor


def _mtp_module(tree: Path) -> Any:
    def compile_decorator(*args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and isinstance(args[0], type) and not kwargs:
            return args[0]
        return lambda cls: cls

    class Mapper:
        def __or__(self, other: Any) -> Mapper:
            return self

    pp = SimpleNamespace(is_last_rank=True, is_first_rank=True, world_size=1)
    qwen3_5 = LooseAutoStub(f"{PACKAGE}.qwen3_5")
    qwen3_5.__dict__.update(Qwen3_5DecoderLayer=_Layer, Qwen3_5RMSNorm=_Layer,
                            Qwen3_5Model=type("Qwen3_5Model", (), {"hf_to_vllm_mapper":
                                                                   Mapper()}))
    interfaces = LooseAutoStub(f"{PACKAGE}.interfaces")
    interfaces.__dict__.update(
        LocalArgmaxMixin=load_module(_interfaces_mixin(tree)).LocalArgmaxMixin,
        SupportsMultiModal=type("SupportsMultiModal", (), {}),
        SupportsPP=type("SupportsPP", (), {}),
    )
    utils = LooseAutoStub(f"{PACKAGE}.utils")
    utils.__dict__.update(
        AutoWeightsLoader=AutoWeightsLoader,
        maybe_prefix=lambda prefix, name: f"{prefix}.{name}" if prefix else name,
        make_empty_intermediate_tensors_factory=lambda names, size: None,
        maybe_fuse_shared_experts=lambda weights, **kw: weights,
        PPMissingLayer=_Layer,
    )
    vpe = LooseAutoStub("vllm.model_executor.layers.vocab_parallel_embedding")
    vpe.__dict__.update(ParallelLMHead=ParallelLMHead, VocabParallelEmbedding=_Layer)
    moe_utils = LooseAutoStub("vllm.model_executor.layers.fused_moe.utils")
    moe_utils.__dict__["is_model_fused_shared_expert_compatible"] = lambda *a: False
    qwen3_next = LooseAutoStub(f"{PACKAGE}.qwen3_next")
    qwen3_next.__dict__["QwenNextMixtureOfExperts"] = type("QwenNextMixtureOfExperts",
                                                          (), {})
    overrides = {
        "vllm.logger": once_logger_module(),
        "vllm.envs": load_envs(tree),
        "vllm.compilation.decorators": make_module(
            "vllm.compilation.decorators", support_torch_compile=compile_decorator),
        "vllm.distributed": make_module("vllm.distributed", get_pp_group=lambda: pp,
                                        tensor_model_parallel_all_gather=None),
        "vllm.model_executor.layers.linear": make_module(
            "vllm.model_executor.layers.linear", ColumnParallelLinear=ColumnParallelLinear),
        "vllm.model_executor.layers.logits_processor": make_module(
            "vllm.model_executor.layers.logits_processor",
            LogitsProcessor=_logits_processor(tree)),
        "vllm.model_executor.layers.vocab_parallel_embedding": vpe,
        "vllm.model_executor.layers.fused_moe.utils": moe_utils,
        "vllm.model_executor.models.interfaces": interfaces,
        f"{PACKAGE}.qwen3_5": qwen3_5,
        f"{PACKAGE}.qwen3_next": qwen3_next,
        f"{PACKAGE}.utils": utils,
    }
    return load_with_auto_stubs(tree / "model_executor/models/qwen3_5_mtp.py", overrides,
                                package=PACKAGE, loose=True)


_MIXIN_CACHE: dict[Path, Path] = {}


def _interfaces_mixin(tree: Path) -> Path:
    """vLLM's LocalArgmaxMixin (interfaces.py), extracted into a file of its own (the
    rest of interfaces.py imports half of vLLM)."""
    if tree not in _MIXIN_CACHE:
        src = extract_source(tree / "model_executor/models/interfaces.py", "LocalArgmaxMixin")
        out = tree.parent / f"_local_argmax_{abs(hash(str(tree)))}.py"
        out.write_text("import torch\n\n" + src)
        _MIXIN_CACHE[tree] = out
    return _MIXIN_CACHE[tree]


def _write_checkpoint(model_dir: Path, ids: Any, head_rows: int | None,
                      index: bool = False) -> None:
    """A model directory: the id file, and a safetensors file holding the draft head's
    rows (and another MTP tensor)."""
    model_dir.mkdir(parents=True, exist_ok=True)
    if ids is not None:
        torch.save(ids, model_dir / "mtp_draft_vocab_ids.pt")
    tensors = {"mtp.fc.weight": [HIDDEN, 2 * HIDDEN]}
    if head_rows is not None:
        tensors["mtp.draft_lm_head.weight"] = [head_rows, HIDDEN]
    header: dict[str, Any] = {}
    offset = 0
    for name, shape in tensors.items():
        size = 4 * shape[0] * shape[1]
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset,
                                                                         offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    fname = "model-00001-of-00001.safetensors" if index else "model.safetensors"
    (model_dir / fname).write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * offset)
    if index:
        (model_dir / "model.safetensors.index.json").write_text(json.dumps(
            {"weight_map": {name: fname for name in tensors}}))


def _build(tree: Path, model_dir: Path, knob: str | None,
           monkeypatch: pytest.MonkeyPatch) -> Any:
    if knob is None:
        monkeypatch.delenv("VLLM_MTP_DRAFT_VOCAB", raising=False)
    else:
        monkeypatch.setenv("VLLM_MTP_DRAFT_VOCAB", knob)
    mod = _mtp_module(tree)
    config = SimpleNamespace(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=2,
                             mtp_num_hidden_layers=1, rms_norm_eps=1e-6,
                             tie_word_embeddings=False)
    vllm_config = SimpleNamespace(
        model_config=SimpleNamespace(hf_text_config=config, hf_config=SimpleNamespace(),
                                     model=str(model_dir)),
        quant_config=None)
    model = mod.Qwen3_5MTP(vllm_config=vllm_config, prefix="")
    gen = torch.Generator().manual_seed(0)
    model.lm_head.weight.data.copy_(torch.randn(VOCAB, HIDDEN, generator=gen))
    return model


def _draft_weight() -> Any:
    return torch.randn(len(IDS), HIDDEN, generator=torch.Generator().manual_seed(1))


def _hidden() -> Any:
    return torch.randn(5, HIDDEN, generator=torch.Generator().manual_seed(2))


def _load(model: Any, with_head: bool) -> set[str]:
    weights = [("mtp.fc.weight", torch.ones(HIDDEN, 2 * HIDDEN))]
    if with_head:
        weights.append(("mtp.draft_lm_head.weight", _draft_weight()))
    loaded: set[str] = model.load_weights(iter(weights))
    return loaded


def _check_active(tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                  knob: str | None, index: bool) -> Any:
    model_dir = tmp_path / "active"
    _write_checkpoint(model_dir, torch.tensor(IDS, dtype=torch.int32), len(IDS), index)
    model = _build(tree, model_dir, knob, monkeypatch)
    head = getattr(model.model, "draft_lm_head", None)
    assert head is not None, "no draft_lm_head: the truncated head is not built"
    assert head.num_embeddings == len(IDS) and head.prefix == "mtp.draft_lm_head"
    assert model.model.draft_vocab_ids.dtype == torch.int64
    assert "draft_vocab_ids" not in model.model.state_dict()  # persistent=False
    loaded = _load(model, with_head=True)
    assert "model.draft_lm_head.weight" in loaded, loaded
    assert torch.equal(head.weight, _draft_weight())
    h = _hidden()
    ids = torch.tensor(IDS)
    # (a) full-vocabulary logits, finite exactly at the ids, equal to h @ W_draft^T there.
    logits = model.compute_logits(h)
    assert logits.shape == (5, VOCAB)
    finite = torch.isfinite(logits)
    mask = torch.zeros(VOCAB, dtype=torch.bool)
    mask[ids] = True
    assert torch.equal(finite, mask.expand(5, VOCAB))
    assert torch.all(logits[:, ~mask] == float("-inf"))
    torch.testing.assert_close(logits[:, ids], h @ _draft_weight().T)
    # (b) the local argmax is the target id of the draft argmax, always in ids.
    top = model.get_top_tokens(h)
    assert torch.equal(top, ids[(h @ _draft_weight().T).argmax(dim=-1)])
    assert torch.equal(top, logits.argmax(dim=-1))
    assert set(top.tolist()) <= set(IDS)
    return model


def _check_inactive(tree: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch,
                    knob: str | None, with_head: bool) -> None:
    model = _build(tree, model_dir, knob, monkeypatch)
    assert getattr(model.model, "draft_lm_head", None) is None
    # (c) unchanged from 0.32.0: the full head through the real LogitsProcessor.
    h = _hidden()
    torch.testing.assert_close(model.compute_logits(h), h @ model.lm_head.weight.T)
    assert torch.equal(model.get_top_tokens(h), (h @ model.lm_head.weight.T).argmax(-1))
    # The checkpoint's draft head tensors are skipped, not an unknown-name error.
    assert _load(model, with_head=with_head) == {"model.fc.weight"}


def test_patched_active_head(patched_vllm: Path, tmp_path: Path,
                             monkeypatch: pytest.MonkeyPatch) -> None:
    _check_active(patched_vllm, tmp_path, monkeypatch, knob=None, index=False)


def test_patched_active_head_sharded_checkpoint(patched_vllm: Path, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    _check_active(patched_vllm, tmp_path, monkeypatch, knob="1", index=True)


def test_pristine_has_no_draft_head(pristine_vllm: Path, tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    assert_pristine_lacks(lambda: _check_active(pristine_vllm, tmp_path, monkeypatch,
                                                knob=None, index=False))


def test_patched_knob_off_or_file_absent(patched_vllm: Path, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    with_file = tmp_path / "with-file"
    _write_checkpoint(with_file, torch.tensor(IDS), len(IDS))
    _check_inactive(patched_vllm, with_file, monkeypatch, knob="0", with_head=True)
    no_file = tmp_path / "no-file"
    _write_checkpoint(no_file, None, len(IDS))
    _check_inactive(patched_vllm, no_file, monkeypatch, knob=None, with_head=True)
    no_head = tmp_path / "no-head"  # id file but no draft head in the checkpoint
    _write_checkpoint(no_head, torch.tensor(IDS), None)
    _check_inactive(patched_vllm, no_head, monkeypatch, knob=None, with_head=False)
    hub = tmp_path / "not-a-dir"  # a hub id: no local directory yet
    _check_inactive(patched_vllm, hub, monkeypatch, knob=None, with_head=True)


@pytest.mark.parametrize(("ids", "rows", "words"), [
    (torch.tensor([3, 17, VOCAB]), 3, "must lie in"),
    (torch.tensor([3, -1, 5]), 3, "must lie in"),
    (torch.tensor([3, 17, 17]), 3, "unique"),
    (torch.tensor([[3, 17], [4, 5]]), 2, "1-D integer"),
    (torch.tensor([3.0, 17.0]), 2, "1-D integer"),
    (torch.tensor([], dtype=torch.long), 1, "1-D integer"),
    (torch.tensor([3, 17, 40]), 4, "has 4 rows"),
])
def test_patched_bad_id_file(patched_vllm: Path, tmp_path: Path,
                             monkeypatch: pytest.MonkeyPatch, ids: Any, rows: int,
                             words: str) -> None:
    model_dir = tmp_path / "bad"
    _write_checkpoint(model_dir, ids, rows)
    with pytest.raises(ValueError, match=r"mtp_draft_vocab_ids\.pt") as err:
        _build(patched_vllm, model_dir, None, monkeypatch)
    assert words in str(err.value)


def _load_eagle_model(tree: Path, draft: Any) -> Any:
    """The V2 runner's real load_eagle_model, get_model answering with ``draft``."""
    pp = SimpleNamespace(world_size=1)
    backends = make_module("vllm.compilation.backends",
                           set_model_tag=lambda tag: contextlib.nullcontext())
    mod = load_with_auto_stubs(tree / "v1/worker/gpu/spec_decode/eagle/utils.py", {
        "vllm.distributed.parallel_state": make_module("vllm.distributed.parallel_state",
                                                       get_pp_group=lambda: pp),
        "vllm.model_executor.model_loader": make_module(
            "vllm.model_executor.model_loader", get_model=lambda **kw: draft),
        "vllm.model_executor.model_loader.utils": make_module(
            "vllm.model_executor.model_loader.utils", get_draft_load_config=lambda c:
            c.load_config),
        "vllm.v1.worker.gpu.spec_decode.utils": make_module(
            "vllm.v1.worker.gpu.spec_decode.utils", get_pp_safe_draft_load_config=lambda c: c),
        "vllm.model_executor.models.utils": make_module(
            "vllm.model_executor.models.utils",
            PPMissingLayer=type("PPMissingLayer", (nn.Module,), {})),
    }, loose=True)
    target_inner = nn.Module()
    target_inner.embed_tokens = _Layer()
    target = nn.Module()
    target.model = target_inner
    target.lm_head = ParallelLMHead(VOCAB, HIDDEN)
    target.lm_head.weight.data.copy_(torch.randn(VOCAB, HIDDEN,
                                                 generator=torch.Generator().manual_seed(5)))
    vllm_config = SimpleNamespace(
        # draft_lm_head_quantization: 0.33.0's (None: the shared head as it is)
        speculative_config=SimpleNamespace(draft_model_config=None,
                                           apply_draft_overrides=lambda c: c,
                                           draft_lm_head_quantization=None),
        load_config=object())
    with stub_modules({"vllm.compilation.backends": backends}):
        mod.load_eagle_model(target, vllm_config)
    return target


def _check_runner_share(tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    draft = _check_active(tree, tmp_path, monkeypatch, knob=None, index=False)
    head = draft.model.draft_lm_head
    before = head.weight.clone()
    target = _load_eagle_model(tree, draft)
    # (e) the runner gave the drafter the target's lm_head; the draft head is untouched
    # and still the one the logits come from.
    assert draft.lm_head is target.lm_head
    assert draft.model.embed_tokens is target.model.embed_tokens
    assert draft.model.draft_lm_head is head and torch.equal(head.weight, before)
    h = _hidden()
    torch.testing.assert_close(draft.compute_logits(h)[:, torch.tensor(IDS)], h @ before.T)


def test_patched_runner_share_keeps_draft_head(patched_vllm: Path, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    _check_runner_share(patched_vllm, tmp_path, monkeypatch)


def test_patched_knob_registered(patched_vllm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    envs = load_envs(patched_vllm)
    monkeypatch.delenv("VLLM_MTP_DRAFT_VOCAB", raising=False)
    assert envs.VLLM_MTP_DRAFT_VOCAB is True
    monkeypatch.setenv("VLLM_MTP_DRAFT_VOCAB", "0")
    assert envs.VLLM_MTP_DRAFT_VOCAB is False
