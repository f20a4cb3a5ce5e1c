"""vLLM's real ``_launch_packed_attn`` (v1/attention/ops/int4_per_token_head.py) run on CPU
with the Triton launches replaced by recorders: what the launcher decides (2D or 3D, the grid,
the segment count) for a batch, without a GPU. Shared by the int4 mq3d rows' tests."""

from __future__ import annotations

import ast
import contextlib
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from ._helpers import exec_function, make_module, stub_modules

INT4 = "v1/attention/ops/int4_per_token_head.py"


class Launch:
    """Stands in for a ``@triton.jit`` kernel: ``kernel[grid](**kwargs)`` is recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def __getitem__(self, grid: tuple[Any, ...]) -> Any:
        def launch(**kwargs: Any) -> None:
            self.calls.append((grid, kwargs))
        return launch


def module_functions(tree: Path) -> set[str]:
    return {n.name for n in ast.parse((tree / INT4).read_text()).body
            if isinstance(n, ast.FunctionDef)}


def module_constants(tree: Path) -> dict[str, Any]:
    """The module's top-level ``NAME = <literal>`` assignments."""
    out: dict[str, Any] = {}
    for node in ast.parse((tree / INT4).read_text()).body:
        target = value = None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign):
            target, value = node.target, node.value
        if isinstance(target, ast.Name) and value is not None:
            with contextlib.suppress(ValueError):
                out[target.id] = ast.literal_eval(value)
    return out


def refusals_fn(tree: Path) -> Any:
    """The tree's ``packed_attn_3d_refusals`` (AssertionError where the tree lacks it)."""
    path = tree / INT4
    ns: dict[str, Any] = dict(module_constants(tree))
    ns["logger"] = logging.getLogger("int4_per_token_head")
    for name in sorted(module_functions(tree) & {"_record_mq3d_breach",
                                                 "mq3d_breach_state"}):
        ns[name] = exec_function(path, name, ns)
    fn = exec_function(path, "packed_attn_3d_refusals", ns)
    ns["packed_attn_3d_refusals"] = fn
    return fn


def run_launcher(tree: Path, *, num_seqs: int, q_len: int, rows: int | None,
                 threshold: int | None = 8, env: dict[str, str] | None = None,
                 extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run the tree's real ``_launch_packed_attn`` for ``num_seqs`` sequences of ``q_len``
    query tokens with scratch of ``rows`` rows (None: no scratch); returns the attention
    launch's constexprs and grid, and whether reduce_segments ran."""
    import torch

    path = tree / INT4
    attn, reduce = Launch(), Launch()
    ns: dict[str, Any] = dict(module_constants(tree))
    ns.update(torch=torch, Any=Any, _attn_packed=attn, reduce_segments=reduce,
              logger=logging.getLogger("int4_per_token_head"),
              triton=SimpleNamespace(next_power_of_2=lambda n: 1 << (int(n) - 1).bit_length()))
    if "packed_attn_3d_refusals" in module_functions(tree):
        ns["packed_attn_3d_refusals"] = refusals_fn(tree)
    launcher = exec_function(path, "_launch_packed_attn", ns)
    hq, hkv, d = 8, 2, 64
    tokens = num_seqs * q_len
    q = torch.zeros((tokens, hq, d), dtype=torch.bfloat16)
    cache = torch.zeros((4, 16, hkv, d // 2), dtype=torch.uint8)
    scale = torch.zeros((4, 16, hkv), dtype=torch.float32)
    scratch: dict[str, Any] = {"softmax_segm_output": None, "softmax_segm_max": None,
                               "softmax_segm_expsum": None}
    if rows is not None:
        scratch = {"softmax_segm_output": torch.zeros((rows, hq, 16, d)),
                   "softmax_segm_max": torch.zeros((rows, hq, 16)),
                   "softmax_segm_expsum": torch.zeros((rows, hq, 16))}

    knobs = {"VLLM_BATCH_INVARIANT": False, "VLLM_INT4_MQ_3D": False,
             "VLLM_INT4_MQ_3D_DEBUG": False}
    knobs.update({k: v == "1" for k, v in (env or {}).items()})
    envs = make_module("vllm.envs", **knobs)
    ua = make_module("vllm.v1.attention.ops.triton_unified_attention",
                     _get_tile_size=lambda *a, **k: 32)
    vllm = make_module("vllm", envs=envs)
    with stub_modules({"vllm": vllm, "vllm.envs": envs,
                       "vllm.v1.attention.ops.triton_unified_attention": ua}):
        launcher(
            q=q, k_cache=cache, v_cache=cache, out=torch.empty_like(q),
            cu_seqlens_q=torch.arange(0, tokens + 1, q_len, dtype=torch.int32),
            max_seqlen_q=q_len, seqused_k=torch.full((num_seqs,), 40, dtype=torch.int32),
            softmax_scale=0.1, window_size=(-1, -1),
            block_table=torch.zeros((num_seqs, 4), dtype=torch.int32), softcap=0.0,
            sinks=None, alibi_slopes=None, use_alibi_sqrt=False, qq_bias=None,
            output_scale=None, mm_prefix_range=None, k_scale_cache=scale, v_scale_cache=scale,
            seq_threshold_3D=threshold, num_par_softmax_segments=16,
            packing_factor=2, **scratch, **(extra or {}))
    assert len(attn.calls) == 1
    grid, kw = attn.calls[0]
    return {"IS_3D": kw["IS_3D"], "grid": grid, "segments": kw["NUM_SEGMENTS_PER_SEQ"],
            "reduced": bool(reduce.calls)}
