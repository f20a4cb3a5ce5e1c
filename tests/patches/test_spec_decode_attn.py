"""spec-decode-attn: the split-KV verify attention's host half on vLLM's real Python.

Loads the patched tree's v1/attention/ops/spec_decode_attn.py with Triton stubbed (the
kernels themselves run on the GPU: tests/gpu/test_spec_decode_attn_gpu.py) and checks the
gate as a pure function, the tile plan, the query capacity and the partial buffers' sizes and
sharing; the knobs are registered in envs.py, and FLASH_ATTN's forward consults the gate
with the batch's own causal flag before its FA kernel."""

from __future__ import annotations

import ast
import types
from pathlib import Path
from typing import Any

import pytest

from ._helpers import (
    assert_pristine_lacks,
    load_envs,
    load_kv_cache_interface,
    load_module,
    make_module,
)

pytestmark = pytest.mark.e2e
torch = pytest.importorskip("torch")

OPS = "v1/attention/ops/spec_decode_attn.py"
FA = "v1/attention/backends/flash_attn.py"


class OutOfResources(Exception):
    """Stands in for triton.runtime.errors.OutOfResources."""


class _Triton(types.ModuleType):
    """Triton stand-in: @triton.jit leaves the function as it is; no driver."""

    def __init__(self) -> None:
        super().__init__("triton")
        self.jit = lambda fn: fn
        self.next_power_of_2 = lambda n: 1 << max(0, n - 1).bit_length()
        self.runtime = types.SimpleNamespace(
            errors=types.SimpleNamespace(OutOfResources=OutOfResources))


def load_ops(tree: Path, **knobs: Any) -> types.ModuleType:
    """The tree's spec_decode_attn.py, Triton stubbed, with the tree's own KVQuantMode;
    ``vllm.envs`` answers the row's knobs (``knobs`` overrides their defaults)."""
    path = tree / OPS
    assert path.exists(), f"{OPS} is not in the tree"
    import logging

    stubs = {
        "vllm.logger": make_module("vllm.logger", init_logger=logging.getLogger),
        "vllm.triton_utils": make_module("vllm.triton_utils", triton=_Triton(),
                                         tl=types.SimpleNamespace(constexpr=int)),
        "vllm.v1.kv_cache_interface": load_kv_cache_interface(tree),
        "vllm.envs": make_module("vllm.envs", **{
            "VLLM_SPEC_DECODE_ATTN": False, "VLLM_SPEC_DECODE_ATTN_QMAX": 0,
            "VLLM_SPEC_ATTN_BLOCK_M": 0, **knobs}),
    }
    stubs["vllm"] = make_module("vllm", envs=stubs["vllm.envs"])
    return load_module(path, stubs)


@pytest.fixture
def sda(patched_vllm: Path) -> types.ModuleType:
    return load_ops(patched_vllm)


def _gate_args(**over: Any) -> dict[str, Any]:
    args: dict[str, Any] = dict(
        max_query_len=8, num_reqs=4, kv_cache_quantized=False, sliding_window=[-1, -1],
        logits_soft_cap=0, alibi_slopes=None, sinks=None, has_mask=False, causal=True,
    )
    args.update(over)
    return args


def test_patched_gate_truth_table(sda: types.ModuleType) -> None:
    buf = sda.SpecDecodeAttnBuffers(max_reqs=4, num_heads=4, head_size=8, qmax=16,
                                    device="cpu")
    gate = sda.use_spec_decode_attn
    assert gate(buf, **_gate_args()) is True
    assert gate(buf, **_gate_args(sliding_window=None)) is True
    assert gate(buf, **_gate_args(max_query_len=16)) is True  # q == qmax
    excluded: dict[str, tuple[Any, dict[str, Any]]] = {
        "knob off / layer without buffers": (None, {}),
        "decode (q 1)": (buf, {"max_query_len": 1}),
        "q above qmax": (buf, {"max_query_len": 17}),
        "more requests than the buffers hold": (buf, {"num_reqs": 5}),
        "quantised KV": (buf, {"kv_cache_quantized": True}),
        "sliding window": (buf, {"sliding_window": [127, 0]}),
        "symmetric window": (buf, {"sliding_window": (63, 63)}),
        "soft cap": (buf, {"logits_soft_cap": 30.0}),
        "alibi": (buf, {"alibi_slopes": torch.ones(4)}),
        "sinks": (buf, {"sinks": torch.zeros(4)}),
        "mm / R-SWA mask": (buf, {"has_mask": True}),
        "non-causal": (buf, {"causal": False}),
        "per-sequence causal tensor": (buf, {"causal": torch.tensor([1, 0, 1],
                                                                  dtype=torch.int32)}),
        "all-causal tensor is still a tensor": (buf, {"causal": torch.ones(3, dtype=torch.int32)}),
    }
    for why, (b, over) in excluded.items():
        assert gate(b, **_gate_args(**over)) is False, why


def test_patched_tile_plan(sda: types.ModuleType) -> None:
    plan = sda.tile_plan
    # (block_m, tokens per tile, tiles, warps) for G = 6, as the spec's table
    table = {5: (32, 5, 1, 4), 8: (64, 10, 1, 4), 16: (128, 21, 1, 8), 32: (128, 21, 2, 8)}
    for q, want in table.items():
        p = plan(q, 6)
        assert (p.block_m, p.tokens_per_tile, p.num_tiles, p.num_warps) == want, q
    assert plan(64, 1) == sda.TilePlan(64, 64, 1, 4)
    assert plan(65, 1) == sda.TilePlan(128, 128, 1, 8)
    assert plan(2, 16) == sda.TilePlan(32, 2, 1, 4)
    assert plan(2, 64).block_m == 128  # at least one whole KV group
    # the override is honoured, raised to one group and a power of two
    assert plan(16, 6, 64) == sda.TilePlan(64, 10, 2, 4)
    assert plan(8, 6, 4).block_m == 8
    assert plan(8, 3, 48).block_m == 64
    # every query token of every tile is covered, none twice
    for g in (1, 2, 4, 6, 8):
        for q in range(2, 65):
            p = plan(q, g)
            assert p.tokens_per_tile * g <= p.block_m
            assert (p.num_tiles - 1) * p.tokens_per_tile < q <= p.num_tiles * p.tokens_per_tile
    assert sda.kv_tile(128, 256) == 32 and sda.kv_tile(32, 256) == 64
    assert sda.kv_tile(128, 128) == 64


def test_patched_query_capacity_and_buffers(sda: types.ModuleType) -> None:
    cap = sda.query_capacity
    assert cap(7, 6) == 10  # 1 + 7 = 8 tokens, one tile holds 10
    assert cap(3, 1) == 32  # one tile of 32 rows holds 32 tokens
    assert cap(15, 4) == 16  # 16 tokens x 4 heads = one 64-row tile
    assert cap(3, 8, qmax_override=12) == 16
    assert cap(200, 1) == sda.MAX_QUERY_LEN == 64
    assert cap(0, 4) == 8  # no speculation: q 1 -> one 32-row tile = 8 tokens

    buf = sda.SpecDecodeAttnBuffers(3, 5, 24, 7, "cpu")
    n = 3 * 5 * 7 * sda.NUM_SEGMENTS
    assert n == sda.partial_entries(3, 5, 7)
    assert tuple(buf.part_o.shape) == (n, 24) and buf.part_o.dtype == torch.float32
    assert tuple(buf.part_m.shape) == (n,) and tuple(buf.part_l.shape) == (n,)
    assert buf.nbytes == n * (24 + 2) * 4


def _config(max_num_seqs: int, capture: int | None, k: int | None) -> Any:
    ns = types.SimpleNamespace
    return ns(
        scheduler_config=ns(max_num_seqs=max_num_seqs),
        compilation_config=ns(max_cudagraph_capture_size=capture),
        speculative_config=None if k is None else ns(num_speculative_tokens=k),
    )


def test_patched_buffers_for_config_and_sharing(sda: types.ModuleType) -> None:
    assert sda.enabled() is False  # VLLM_SPEC_DECODE_ATTN off: backends allocate nothing
    sda._BUFFERS.clear()
    a = sda.buffers_for_config(_config(256, 64, 7), 24, 32, 4, "cpu")
    assert (a.max_reqs, a.qmax) == (64, sda.query_capacity(7, 6))  # capped by capture size
    b = sda.buffers_for_config(_config(256, 64, 7), 24, 32, 4, "cpu")
    assert b is a  # one set per geometry
    c = sda.buffers_for_config(_config(8, None, 3), 16, 32, 4, "cpu")
    assert c is not a and c.max_reqs == 8 and c.qmax == sda.query_capacity(3, 4)
    # a layer asking for more allocates a larger set; the earlier holder keeps its own
    d = sda.buffers_for_config(_config(256, 128, 7), 24, 32, 4, "cpu")
    assert d is not a and d.max_reqs == 128 and a.part_o.numel() > 0
    assert sda.buffers_for_config(_config(16, 16, 7), 24, 32, 4, "cpu") is d
    assert d.block_m == 0
    sda._BUFFERS.clear()


def test_patched_knobs_reach_the_buffers(patched_vllm: Path) -> None:
    """VLLM_SPEC_DECODE_ATTN_QMAX sizes the buffers; VLLM_SPEC_ATTN_BLOCK_M is kept in them
    for every launch (and gets a set of its own)."""
    sda = load_ops(patched_vllm, VLLM_SPEC_DECODE_ATTN=True, VLLM_SPEC_DECODE_ATTN_QMAX=12,
                   VLLM_SPEC_ATTN_BLOCK_M=64)
    assert sda.enabled() is True
    buf = sda.buffers_for_config(_config(4, None, 3), 8, 16, 8, "cpu")
    assert buf.qmax == sda.query_capacity(3, 1, 12, 64) == 64
    assert buf.block_m == 64 and buf.max_reqs == 4


KNOBS = {
    "VLLM_SPEC_DECODE_ATTN": (False, "1", True),
    "VLLM_SPEC_DECODE_ATTN_QMAX": (0, "12", 12),
    "VLLM_SPEC_ATTN_BLOCK_M": (0, "64", 64),
}


def _check_knobs(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    envs = load_envs(tree)
    for name, (default, raw, parsed) in KNOBS.items():
        assert name in envs.environment_variables, f"{name} not registered"
        monkeypatch.delenv(name, raising=False)
        assert getattr(envs, name) == default, name
        monkeypatch.setenv(name, raw)
        assert getattr(envs, name) == parsed, name
        monkeypatch.delenv(name)


def test_patched_knobs_registered(patched_vllm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _check_knobs(patched_vllm, monkeypatch)


def test_pristine_lacks_knobs(pristine_vllm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert_pristine_lacks(lambda: _check_knobs(pristine_vllm, monkeypatch))


def _forward_calls(tree: Path) -> list[ast.Call]:
    mod = ast.parse((tree / FA).read_text())
    impl = next(n for n in mod.body if isinstance(n, ast.ClassDef)
                and n.name == "FlashAttentionImpl")
    fwd = next(n for n in impl.body if isinstance(n, ast.FunctionDef) and n.name == "forward")
    return [n for n in ast.walk(fwd) if isinstance(n, ast.Call)]


def _check_forward(tree: Path) -> None:
    calls = _forward_calls(tree)
    names = [ast.unparse(c.func) for c in calls]
    assert "spec_decode_attn.use_spec_decode_attn" in names, "forward has no split-KV gate"
    gate = calls[names.index("spec_decode_attn.use_spec_decode_attn")]
    kw = {k.arg: ast.unparse(k.value) for k in gate.keywords}
    # the batch's own causal flag: the local `causal` is rewritten to a bool for FA4's
    # per-sequence path, which must not qualify
    assert kw["causal"] == "attn_metadata.causal"
    assert kw["max_query_len"] == "max_seqlen_q"
    run = names.index("spec_decode_attn.spec_decode_attention")
    assert gate.lineno < calls[run].lineno < calls[names.index("_FA4_DENSE_ATTENTION_KERNEL")
                                                ].lineno


def test_patched_forward_consults_gate(patched_vllm: Path) -> None:
    _check_forward(patched_vllm)


def test_pristine_forward_lacks_gate(pristine_vllm: Path) -> None:
    assert_pristine_lacks(lambda: _check_forward(pristine_vllm))
