"""dflash2-lookup-drafting: with VLLM_DFLASH2_LOOKUP=1 a DFlash2 drafter proposes only its
own block (block_size - 1) of the K verify positions, a suffix lookup over the request's
tokens fills and may replace positions (the fuse rule), every lookup position becomes a
point mass in the cached draft logits (exactness), and a host controller picks the next
verify width from each request's emitted count (num_sampled, no subtraction) when async
scheduling is off.

Runs vLLM's own DFlashSpeculator.__init__ and DFlash2Speculator (__init__,
_apply_lookup, _observe_flags, next_num_draft_tokens) from the patched tree on CPU, the
new dflash2/lookup.py (decode, fuse, point mass, controller) with the real envs.py, and
the runner's apply_draft_width (model_runner.py). Triton does not run here: the upstream
n-gram scan kernel the lookup launches is replaced by a Python implementation of its
contract (packed longest-n, rightmost-start score per request), which the test also uses
as the reference of spec item L5. The base DraftModelSpeculator is a stand-in holding
0.32.0's fields."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from ._helpers import (
    LooseAutoStub,
    exec_function,
    load_envs,
    load_with_auto_stubs,
    make_module,
    once_logger_module,
    stub_modules,
)

pytestmark = pytest.mark.e2e
torch = pytest.importorskip("torch")

SPEC = "vllm.v1.worker.gpu.spec_decode"
MAX_REQS = 4
MAX_LEN = 64
VOCAB = 50
TOP_K = 3


class _Kernel:
    """A Triton kernel object on CPU: launching is a no-op unless given a body."""

    def __init__(self, fn: Any = None, body: Any = None) -> None:
        self.fn = fn
        self.body = body

    def __getitem__(self, grid: Any) -> Any:
        return (lambda *a, **k: self.body(grid, *a, **k)) if self.body else (
            lambda *a, **k: None)


def _triton_utils() -> Any:
    def jit(fn: Any = None, **kwargs: Any) -> Any:
        return _Kernel(fn) if fn is not None else _Kernel

    triton = SimpleNamespace(jit=jit, cdiv=lambda a, b: -(-a // b),
                             next_power_of_2=lambda n: 1 << max(0, (n - 1).bit_length()))
    tl = LooseAutoStub("tl")
    return make_module("vllm.triton_utils", triton=triton, tl=tl, HAS_TRITON=False)


def reference_scan_score(tokens: list[int], nmin: int, nmax: int, max_len: int) -> int:
    """Spec L5 / the n-gram scan's contract: the longest suffix (nmin..nmax) of
    ``tokens`` with an earlier occurrence ending before the last token, the rightmost
    such occurrence; packed n * (max_len + 1) + start + 1, 0 for none."""
    total = len(tokens)
    for n in range(min(nmax, total - 1), nmin - 1, -1):
        suffix = tokens[total - n:]
        for start in range(total - n - 1, -1, -1):
            if tokens[start:start + n] == suffix:
                return n * (max_len + 1) + start + 1
    return 0


def _scan_body(grid: Any, token_ids: Any, stride: int, idx_mapping: Any, total_len: Any,
               num_sampled: Any, scratch: Any, scratch_stride: int, max_len: int,
               nmin: int, nmax: int, *rest: Any, **kwargs: Any) -> None:
    num_reqs = grid[0]
    scratch[:num_reqs].zero_()
    for b in range(num_reqs):
        row = int(idx_mapping[b])
        total = int(total_len[row])
        if int(num_sampled[b]) > 0 and total >= nmin:
            scratch[b, 0] = reference_scan_score(token_ids[row, :total].tolist(), nmin,
                                                 nmax, max_len)


class DraftModelSpeculator:
    """Stand-in for 0.32.0's base: the fields DFlashSpeculator and DFlash2Speculator
    read (speculator.py:106-190)."""

    def __init__(self, vllm_config: Any, device: Any) -> None:
        spec = vllm_config.speculative_config
        self.vllm_config = vllm_config
        self.device = device
        self.speculative_config = spec
        self.num_speculative_steps = spec.num_speculative_tokens
        self.draft_model_config = spec.draft_model_config
        self.max_num_reqs = MAX_REQS
        self.max_num_tokens = 256
        self.max_model_len = MAX_LEN
        self.hidden_size = 8
        self.dtype = torch.float32
        self.draft_tokens = torch.zeros(MAX_REQS, self.num_speculative_steps,
                                        dtype=torch.int64)
        self.enable_adaptive_verification = spec.enable_adaptive_verification
        self.draft_logits = None
        if spec.draft_sample_method == "probabilistic":
            self.draft_logits = torch.full((MAX_REQS, self.num_speculative_steps, VOCAB),
                                           float("-inf"))


def _lookup_module(tree: Path) -> Any:
    return load_with_auto_stubs(tree / "v1/worker/gpu/spec_decode/dflash2/lookup.py", {
        "vllm.envs": load_envs(tree),
        "vllm.config": make_module("vllm.config", VllmConfig=object),
    }, package=f"{SPEC}.dflash2")


def _speculator_modules(tree: Path,
                        extra: dict[str, Any] | None = None) -> tuple[Any, Any, Any]:
    """(lookup.py, dflash/speculator.py, dflash2/speculator.py) of ``tree``; ``extra``
    adds module overrides (later rows' modules)."""
    lookup = _lookup_module(tree)
    triton_utils = _triton_utils()
    base = make_module(f"{SPEC}.speculator", DraftModelSpeculator=DraftModelSpeculator)
    common = {
        "vllm.logger": once_logger_module(),
        "vllm.envs": load_envs(tree),
        "vllm.triton_utils": triton_utils,
        "vllm.config": make_module("vllm.config", VllmConfig=object,
                                   replace=lambda obj, **kw: obj),
        f"{SPEC}.speculator": base,
        f"{SPEC}.dflash2.lookup": lookup,
        f"{SPEC}.utils": make_module(f"{SPEC}.utils",
                                     get_parallel_drafting_token_id=lambda cfg: 0),
        "vllm.utils.platform_utils": make_module("vllm.utils.platform_utils",
                                                 is_pin_memory_available=lambda: False),
        # Shared by both speculator modules, so their annotations are the same objects.
        "vllm.v1.worker.gpu.dp_utils": LooseAutoStub("vllm.v1.worker.gpu.dp_utils"),
        "vllm.v1.worker.gpu.input_batch": LooseAutoStub("vllm.v1.worker.gpu.input_batch"),
        **(extra or {}),
    }
    dflash = load_with_auto_stubs(tree / "v1/worker/gpu/spec_decode/dflash/speculator.py",
                                  common, package=f"{SPEC}.dflash", loose=True)
    ngram = make_module(f"{SPEC}.ngram.speculator",
                        _ngram_scan_kernel=_Kernel(body=_scan_body))
    dflash2 = load_with_auto_stubs(
        tree / "v1/worker/gpu/spec_decode/dflash2/speculator.py",
        {**common, f"{SPEC}.dflash.speculator": dflash, f"{SPEC}.ngram.speculator": ngram},
        package=f"{SPEC}.dflash2", loose=True)
    return lookup, dflash, dflash2


def _vllm_config(k: int = 15, block_size: int | None = 8, probabilistic: bool = True,
                 async_scheduling: bool = False, adaptive_verification: bool = False,
                 arch: str = "DFlash2DraftModel") -> Any:
    dflash_config: dict[str, Any] = {"selector_top_k": TOP_K}
    if block_size is not None:
        dflash_config["block_size"] = block_size
    draft = SimpleNamespace(hf_config=SimpleNamespace(dflash_config=dflash_config),
                            architectures=[arch], use_mla=False)
    spec = SimpleNamespace(method="dflash", num_speculative_tokens=k,
                           draft_model_config=draft,
                           enable_adaptive_verification=adaptive_verification,
                           draft_sample_method="probabilistic" if probabilistic else "greedy")
    return SimpleNamespace(
        speculative_config=spec,
        parallel_config=SimpleNamespace(decode_context_parallel_size=1),
        scheduler_config=SimpleNamespace(async_scheduling=async_scheduling),
        # 0.33.0 stages the target's aux hidden states under FULL decode graphs: none here
        compilation_config=SimpleNamespace(
            cudagraph_mode=SimpleNamespace(decode_mode=lambda: None)),
    )


def _set_env(monkeypatch: pytest.MonkeyPatch, **values: str) -> None:
    for name in ("LOOKUP", "LOOKUP_NMIN", "LOOKUP_NMAX", "LOOKUP_NSTRONG", "LOOKUP_AGREE",
                 "LOOKUP_NMIN_TAIL", "LOOKUP_LONGMIN", "LOOKUP_CHEAP_CTX",
                 "LOOKUP_ADAPTIVE", "LOOKUP_STICKY", "GRAPH_BOTH"):
        monkeypatch.delenv(f"VLLM_DFLASH2_{name}", raising=False)
    for name, value in values.items():
        monkeypatch.setenv(f"VLLM_DFLASH2_{name}", value)


class _Event:
    def record(self) -> None:
        pass

    def query(self) -> bool:
        return True


def _speculator(tree: Path, monkeypatch: pytest.MonkeyPatch, config: Any,
                req_states: Any = None) -> Any:
    _, _, dflash2 = _speculator_modules(tree)
    monkeypatch.setattr(torch.cuda, "Event", _Event)
    qwen3_dflash = make_module("vllm.model_executor.models.qwen3_dflash",
                               dflash_has_any_non_causal=lambda cfg: False)
    with stub_modules({"vllm.model_executor.models.qwen3_dflash": qwen3_dflash}):
        return dflash2.DFlash2Speculator(config, torch.device("cpu"), req_states)


# ---- L1-L4: buffer sizes, knob off and on ---------------------------------------------


def _check_shapes_on(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _set_env(monkeypatch, LOOKUP="1")
    spec = _speculator(tree, monkeypatch, _vllm_config(k=15, block_size=8))
    assert spec.draft_block == 7
    assert spec.num_query_per_req == 8
    assert spec.sample_indices.shape == (MAX_REQS * 7,)
    assert spec.sample_idx_mapping.shape == (MAX_REQS * 7,)
    assert spec.sample_col.tolist() == list(range(7)) * MAX_REQS
    assert spec.candidate_sampler.scores.shape == (MAX_REQS, 7, TOP_K)
    assert spec.candidate_sampler.cached_candidate_ids.shape == (MAX_REQS, 15, TOP_K)
    assert spec.draft_tokens.shape == (MAX_REQS, 15)  # the verify width stays K
    assert spec._walk_tokens.shape == (MAX_REQS, 7)


def test_patched_lookup_on_buffer_sizes(patched_vllm: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    _check_shapes_on(patched_vllm, monkeypatch)


def test_pristine_lacks_lookup(pristine_vllm: Path) -> None:
    assert not (pristine_vllm / "v1/worker/gpu/spec_decode/dflash2/lookup.py").exists()
    assert "draft_block" not in (
        pristine_vllm / "v1/worker/gpu/spec_decode/dflash/speculator.py").read_text()


@pytest.mark.parametrize("case", ["knob-off", "no-block-size", "lilicorr-arch", "k-small"])
def test_patched_lookup_off_is_0_32_0(patched_vllm: Path, monkeypatch: pytest.MonkeyPatch,
                                      case: str) -> None:
    """L1: knob off (or nothing to shorten) leaves every buffer as in 0.32.0."""
    _set_env(monkeypatch, LOOKUP="0" if case == "knob-off" else "1")
    config = _vllm_config(
        k=15 if case != "k-small" else 5,
        block_size=None if case == "no-block-size" else 8,
        arch="LiLiCorrDraftModel" if case == "lilicorr-arch" else "DFlash2DraftModel")
    k = config.speculative_config.num_speculative_tokens
    spec = _speculator(patched_vllm, monkeypatch, config)
    assert spec.draft_block == k and spec.num_query_per_req == 1 + k
    assert spec.sample_indices.shape == (MAX_REQS * k,)
    assert spec.candidate_sampler.scores.shape == (MAX_REQS, k, TOP_K)
    assert spec.candidate_sampler.cached_candidate_ids.shape == (MAX_REQS, k, TOP_K)
    assert spec._walk_tokens is None and spec.next_num_draft_tokens() is None
    assert (spec.lookup is None) == (case in ("knob-off", "lilicorr-arch"))


def test_patched_knobs_validated(patched_vllm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """L2: registered knobs with their defaults; bad thresholds refused at init."""
    envs = load_envs(patched_vllm)
    _set_env(monkeypatch)
    assert (envs.VLLM_DFLASH2_LOOKUP, envs.VLLM_DFLASH2_LOOKUP_NMIN,
            envs.VLLM_DFLASH2_LOOKUP_NMAX, envs.VLLM_DFLASH2_LOOKUP_NSTRONG,
            envs.VLLM_DFLASH2_LOOKUP_AGREE, envs.VLLM_DFLASH2_LOOKUP_NMIN_TAIL,
            envs.VLLM_DFLASH2_LOOKUP_LONGMIN, envs.VLLM_DFLASH2_LOOKUP_CHEAP_CTX,
            envs.VLLM_DFLASH2_LOOKUP_ADAPTIVE, envs.VLLM_DFLASH2_LOOKUP_STICKY,
            envs.VLLM_DFLASH2_GRAPH_BOTH) == (False, 6, 12, 6, 0, 4, 6, 0, True, 3, True)
    for bad in ({"LOOKUP_NMIN": "7", "LOOKUP_NSTRONG": "6"},
                {"LOOKUP_NSTRONG": "13"},
                {"LOOKUP_NMIN_TAIL": "0"},
                {"LOOKUP_NMIN_TAIL": "13"},
                {"LOOKUP_AGREE": "-1"}):
        _set_env(monkeypatch, LOOKUP="1", **bad)
        with pytest.raises(ValueError, match="VLLM_DFLASH2_LOOKUP"):
            _speculator(patched_vllm, monkeypatch, _vllm_config())
    _set_env(monkeypatch, LOOKUP="1")
    with pytest.raises(ValueError, match="adaptive verification"):
        _speculator(patched_vllm, monkeypatch, _vllm_config(adaptive_verification=True))


def test_patched_runtime_only_knobs(patched_vllm: Path) -> None:
    """The host-side controller knobs stay out of the compile key; the others do not."""
    text = (patched_vllm / "envs.py").read_text()
    ignored = text[text.index("ignored_factors"):text.index("from vllm.config.utils import")]
    for name in ("CHEAP_CTX", "STICKY", "ADAPTIVE"):
        assert f'"VLLM_DFLASH2_LOOKUP_{name}"' in ignored
    for name in ("LOOKUP", "LOOKUP_NMAX", "LOOKUP_NMIN"):
        assert f'"VLLM_DFLASH2_{name}"' not in ignored


def test_patched_graph_lengths(patched_vllm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """L11: both target decode lengths are captured with the lookup on (the drafter's own
    manager, at 1+draft_block, gets nothing extra)."""
    lookup = _lookup_module(patched_vllm)
    _set_env(monkeypatch, LOOKUP="1")
    assert lookup.extra_decode_query_lens(_vllm_config(), 16) == [8]
    assert lookup.extra_decode_query_lens(_vllm_config(), 8) == []
    _set_env(monkeypatch, LOOKUP="1", GRAPH_BOTH="0")
    assert lookup.extra_decode_query_lens(_vllm_config(), 16) == []
    _set_env(monkeypatch, LOOKUP="0")
    assert lookup.extra_decode_query_lens(_vllm_config(), 16) == []
    source = (patched_vllm / "v1/worker/gpu/cudagraph_utils.py").read_text()
    assert "extra_decode_query_lens(self.vllm_config, self.decode_query_len)" in source


# ---- L5-L7: lookup, fuse rule, point mass ----------------------------------------------


def _config(lookup: Any, **overrides: int) -> Any:
    values = dict(nmin=6, nmax=12, nstrong=6, agree=0, nmin_tail=4, longmin=6,
                  cheap_ctx=0, adaptive=True, sticky=3, graph_both=True)
    values.update(overrides)
    return lookup.LookupConfig(**values)


def _decode(lookup: Any, history: list[int], k: int, nmin: int = 3,
            nmax: int = 12) -> tuple[list[int], int, int]:
    token_ids = torch.zeros(1, MAX_LEN, dtype=torch.int32)
    token_ids[0, :len(history)] = torch.tensor(history, dtype=torch.int32)
    score = torch.tensor([reference_scan_score(history, nmin, nmax, MAX_LEN)])
    tokens, match_len, valid = lookup.decode_lookup(
        score, torch.tensor([len(history)], dtype=torch.int32), token_ids,
        torch.tensor([0]), k, MAX_LEN)
    return tokens[0].tolist(), int(match_len[0]), int(valid[0])


def test_patched_lookup_decode(patched_vllm: Path) -> None:
    lookup = _lookup_module(patched_vllm)
    # Period-3 repetition: the match may overlap the suffix; the continuation runs on.
    hist = [5, 6, 7] * 5
    tokens, match_len, valid = _decode(lookup, hist, k=6)
    assert match_len == 12 and valid == 3  # the rightmost 12-gram ends 3 before the end
    assert tokens == [5, 6, 7, 0, 0, 0]  # placeholders past valid
    # The most recent of equal-length matches wins.
    hist = [1, 2, 3, 40, 1, 2, 3, 41, 9, 1, 2, 3]
    tokens, match_len, valid = _decode(lookup, hist, k=4)
    assert match_len == 3 and tokens[0] == 41 and valid == 4
    # No earlier occurrence: nothing valid.
    tokens, match_len, valid = _decode(lookup, [1, 2, 3, 4, 5, 6], k=4)
    assert (match_len, valid) == (0, 0) and tokens == [0, 0, 0, 0]


def _fuse(lookup: Any, drafted: list[int], looked: list[int], match_len: int, valid: int,
          draft_block: int, config: Any) -> tuple[list[int], list[bool], bool]:
    tokens, use, has_tail = lookup.fuse_lookup(
        torch.tensor([drafted]), torch.tensor([looked]), torch.tensor([match_len]),
        torch.tensor([valid]), draft_block, config)
    return tokens[0].tolist(), use[0].tolist(), bool(has_tail[0])


def test_patched_fuse_rule(patched_vllm: Path) -> None:
    lookup = _lookup_module(patched_vllm)
    drafted = [1, 2, 3, 4, 0, 0]  # draft_block 4 of K 6
    looked = [1, 2, 9, 9, 9, 9]
    cfg = _config(lookup, nmin=6, nstrong=8, agree=2, nmin_tail=4, longmin=6)
    # NSTRONG reached: head and tail from the lookup.
    tokens, use, has_tail = _fuse(lookup, drafted, looked, 8, 6, 4, cfg)
    assert tokens == looked and use == [True] * 6 and has_tail
    # Below NSTRONG, NMIN with agree 2 >= AGREE 2: taken; with AGREE 3: not taken.
    assert _fuse(lookup, drafted, looked, 6, 6, 4, cfg)[0] == looked
    tokens, use, has_tail = _fuse(lookup, drafted, looked, 6, 6, 4,
                                  _config(lookup, nmin=6, nstrong=8, agree=3))
    assert tokens == [1, 2, 3, 4, 0, 0] and use == [False] * 4 + [True] * 2
    assert not has_tail
    # Below NMIN: head kept; the tail still taken when the drafter fully agrees.
    agreeing = [1, 2, 9, 9, 0, 0]
    tokens, use, _ = _fuse(lookup, agreeing, looked, 5, 6, 4, cfg)
    assert tokens == looked and use == [False] * 4 + [True] * 2
    # ... and not when it does not (nor below NMIN_TAIL).
    assert _fuse(lookup, drafted, looked, 5, 6, 4, cfg)[0] == [1, 2, 3, 4, 0, 0]
    assert _fuse(lookup, agreeing, looked, 3, 6, 4, cfg)[0] == [1, 2, 9, 9, 0, 0]
    # valid < draft_block: positions past valid keep the drafter's tokens.
    tokens, use, has_tail = _fuse(lookup, drafted, [7, 8, 0, 0, 0, 0], 8, 2, 4, cfg)
    assert tokens == [7, 8, 3, 4, 0, 0] and use == [True, True, False, False, True, True]
    assert not has_tail
    # has_tail needs LONGMIN and valid > draft_block.
    assert not _fuse(lookup, drafted, looked, 8, 4, 4, cfg)[2]
    assert not _fuse(lookup, drafted, looked, 8, 6, 4,
                     _config(lookup, nmin=6, nstrong=8, longmin=9))[2]


def test_patched_point_mass(patched_vllm: Path) -> None:
    lookup = _lookup_module(patched_vllm)
    k = 3
    logits = torch.full((2, k, 10), float("-inf"))
    cached = torch.zeros(2, k, 2, dtype=torch.int64)
    # Request state 1 holds drafter candidates {4, 5} at every position.
    logits[1, :, 4] = 1.5
    logits[1, :, 5] = -0.5
    cached[1] = torch.tensor([4, 5])
    tokens = torch.tensor([[7, 5, 0]])
    use = torch.tensor([[True, True, False]])
    lookup.point_mass_(logits, cached, torch.tensor([1]), tokens, use)
    for pos, tok in ((0, 7), (1, 5)):
        row = logits[1, pos]
        assert row[tok] == 0 and torch.isinf(row[torch.arange(10) != tok]).all()
        assert cached[1, pos].tolist() == [tok, tok]
    assert logits[1, 2, 4] == 1.5 and logits[1, 2, 5] == -0.5  # unused row untouched
    assert cached[1, 2].tolist() == [4, 5]
    assert torch.isinf(logits[0]).all()  # other request states untouched
    # The next point mass erases the previous one (the cached-candidate invariant).
    lookup.point_mass_(logits, cached, torch.tensor([1]), torch.tensor([[8, 5, 0]]), use)
    assert logits[1, 0, 8] == 0 and logits[1, 0, 7] == float("-inf")


# ---- L9, L10, L12: width, controller, emitted count ------------------------------------


def test_patched_draft_width(patched_vllm: Path) -> None:
    apply_draft_width = exec_function(patched_vllm / "v1/worker/gpu/model_runner.py",
                                      "apply_draft_width", {"torch": torch})
    for num_spec, requested, width in ((15, None, 15), (15, 7, 7), (15, 15, 15),
                                       (5, 7, 5), (5, None, 5), (5, 3, 3)):
        drafts = torch.arange(30).view(2, 15)
        assert apply_draft_width(drafts, num_spec, requested) == width
        assert (drafts[:, width:] == -1).all()
        assert torch.equal(drafts[:, :width], torch.arange(30).view(2, 15)[:, :width])
    source = (patched_vllm / "v1/worker/gpu/model_runner.py").read_text()
    assert "self.speculator.next_num_draft_tokens()" in source


def _run(lookup: Any, steps: list[tuple[list[int] | None, list[bool] | None]],
         cfg: Any, context_len: int = 1000, draft_block: int = 7) -> list[bool]:
    state = lookup.WidthState()
    out = []
    for emitted, tails in steps:
        state = lookup.next_verify_width_state(
            state, None if emitted is None else np.array(emitted),
            None if tails is None else np.array(tails), context_len, draft_block, cfg)
        out.append(state.long)
    return out


def test_patched_width_controller(patched_vllm: Path) -> None:
    lookup = _lookup_module(patched_vllm)
    cfg = _config(lookup, sticky=0)
    q = ([8], [True])  # qualifies: tail and emitted >= 1 + draft_block
    n = ([7], [True])  # does not
    # Long only after two consecutive qualifying steps; short from the first that is not.
    assert _run(lookup, [q, n, q, q, q, n, q], cfg) == [False, False, False, True, True,
                                                         False, False]
    # Every request must qualify; flags not landed (None) do not qualify.
    both = ([8, 16], [True, True])
    one = ([8, 16], [True, False])
    assert _run(lookup, [both, both, one], cfg) == [False, True, False]
    assert _run(lookup, [q, (None, None), q], cfg) == [False, False, False]
    # STICKY extra steps only for a single request.
    sticky = _config(lookup, sticky=2)
    assert _run(lookup, [q, q, n, n, n], sticky) == [False, True, True, True, False]
    assert _run(lookup, [both, both, ([1, 1], [False, False])], sticky) == [False, True,
                                                                           False]
    # CHEAP_CTX: short contexts are always long.
    cheap = _config(lookup, cheap_ctx=2048)
    assert _run(lookup, [n, n], cheap, context_len=2048) == [True, True]
    assert _run(lookup, [n, n], cheap, context_len=2049) == [False, False]


def _request_states(history: list[list[int]]) -> Any:
    token_ids = torch.zeros(MAX_REQS, MAX_LEN, dtype=torch.int32)
    total = torch.zeros(MAX_REQS, dtype=torch.int32)
    for row, hist in enumerate(history):
        token_ids[row, :len(hist)] = torch.tensor(hist, dtype=torch.int32)
        total[row] = len(hist)
    return SimpleNamespace(all_token_ids=SimpleNamespace(gpu=token_ids),
                           total_len=SimpleNamespace(gpu=total))


def _check_emitted_count(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """L12 through the speculator: a long step (16 logits) that emitted 10 tokens, 6
    rejected, counts 10 emitted and qualifies (the old num_sampled - num_rejected gives 4
    and would not); a chunked-prefill step (0 sampled) does not."""
    _set_env(monkeypatch, LOOKUP="1", LOOKUP_NMIN="3", LOOKUP_NSTRONG="3",
             LOOKUP_NMIN_TAIL="3", LOOKUP_LONGMIN="3", LOOKUP_STICKY="0")
    period = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26]
    req_states = _request_states([[], period * 3])
    spec = _speculator(tree, monkeypatch, _vllm_config(k=15, block_size=8), req_states)
    assert spec.adaptive_width and spec.next_num_draft_tokens() == 7
    batch = SimpleNamespace(num_reqs=1, idx_mapping=torch.tensor([1]),
                            seq_lens_cpu_upper_bound=np.array([48]))
    spec.draft_tokens[0] = 99  # the drafter's walk (batch order)

    def step(num_sampled: int) -> None:
        spec._observe_flags(48)
        spec._apply_lookup(batch, torch.tensor([num_sampled], dtype=torch.int32))

    step(10)  # observes nothing yet (no earlier step)
    # The lookup continues the period over all 15 positions, as point masses.
    assert spec.draft_tokens[0].tolist() == (period * 2)[0:15]
    assert spec.draft_logits[1, 14, period[14]] == 0
    assert int(spec._emitted_host[0]) == 10
    step(10)  # observes step 1: emitted 10, but that proposal's tail flag is unknown
    step(10)  # observes step 2: tail and 10 >= 1 + 7, the first qualifying step
    assert spec.next_num_draft_tokens() == 7
    step(10)  # the second in a row: long
    assert spec.next_num_draft_tokens() == 15
    step(0)  # chunked prefill: 0 emitted does not qualify
    step(0)
    assert spec.next_num_draft_tokens() == 7


def test_patched_emitted_count(patched_vllm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _check_emitted_count(patched_vllm, monkeypatch)


def test_patched_short_match_fills_tail(patched_vllm: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The lookup searches from min(NMIN, NMIN_TAIL): with the defaults (6, 4) a 5-token
    repeat cannot replace the head, but fills the tail where the drafter fully agrees."""
    _set_env(monkeypatch, LOOKUP="1", LOOKUP_ADAPTIVE="0")
    repeat = [31, 32, 33, 34, 35]
    run = list(range(40, 56))
    history = [50, *repeat, *run, 60, *repeat]  # the 6-token suffix [60, ...] is new
    spec = _speculator(patched_vllm, monkeypatch, _vllm_config(k=15, block_size=8),
                       _request_states([history]))
    batch = SimpleNamespace(num_reqs=1, idx_mapping=torch.tensor([0]),
                            seq_lens_cpu_upper_bound=np.array([len(history)]))
    spec.draft_tokens[0, :7] = torch.tensor(run[:7])  # the drafter agrees on its block
    spec._apply_lookup(batch, torch.tensor([1], dtype=torch.int32))
    assert spec.draft_tokens[0].tolist() == run[:15]
    spec.draft_tokens[0, :7] = torch.tensor([1, 2, 3, 4, 5, 6, 7])  # it does not agree
    spec._apply_lookup(batch, torch.tensor([1], dtype=torch.int32))
    assert spec.draft_tokens[0].tolist() == [1, 2, 3, 4, 5, 6, 7] + [0] * 8


def test_patched_async_scheduling_keeps_width(patched_vllm: Path,
                                              monkeypatch: pytest.MonkeyPatch,
                                              caplog: pytest.LogCaptureFixture) -> None:
    """Option A: the adaptive width needs async scheduling off, said once at init."""
    _set_env(monkeypatch, LOOKUP="1")
    with caplog.at_level("WARNING"):
        spec = _speculator(patched_vllm, monkeypatch, _vllm_config(async_scheduling=True),
                           _request_states([]))
    assert not spec.adaptive_width and spec.next_num_draft_tokens() is None
    assert any("async scheduling off" in r.getMessage() for r in caplog.records)


def test_patched_speculator_passes_request_state(patched_vllm: Path) -> None:
    source = (patched_vllm / "v1/worker/gpu/spec_decode/__init__.py").read_text()
    assert "DFlash2Speculator(vllm_config, device, req_states)" in source

