"""qwen3_5-embed-uva on a GPU (marker ``gpu``).

vLLM's own ``_dequant_gather_kernel`` (quantization/compressed_tensors/
compressed_tensors_embedding.py, real Triton) gathers Qwen3.5-27B-sized rows (vocab 248,320 x
hidden 5120, 4-bit, group 128) from the packed table in device memory and, separately, from the
same table in pinned host memory read through UVA: outputs are bit for bit equal for 1, 8, 64
and 2048 ids, and the gather time of both is reported. vLLM's own
``maybe_offload_embed_tokens_uva`` (models/qwen3_5.py) then moves a device table to pinned host
memory: ``memory_allocated`` drops by the table's bytes. The view op it calls
(``get_accelerator_view_from_cpu_tensor``, a ``_C`` op) cannot load here: the pinned tensor
itself stands in for its view (Triton reads both by the same address). Not shown here: the
real view op, and an engine boot's KV tokens and decode speed."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from tests.gpu import vllm_tree
from tests.patches._helpers import exec_function, load_envs, load_with_auto_stubs, make_module

pytestmark = pytest.mark.gpu
vllm_tree.require_cuda()

import torch  # noqa: E402
import triton  # noqa: E402
import triton.testing  # noqa: E402

GATHER = "model_executor/layers/quantization/compressed_tensors/compressed_tensors_embedding.py"
VOCAB, HIDDEN, BITS, GROUP = 248320, 5120, 4, 128


def _gather_module(tree: Path) -> Any:
    return load_with_auto_stubs(tree / GATHER, {
        "vllm.triton_utils": make_module("vllm.triton_utils", tl=triton.language,
                                         triton=triton)},
        prefixes=("vllm", "compressed_tensors"), loose=True)


def _gather(mod: Any, ids: Any, packed: Any, scale: Any) -> Any:
    """The launch _dequant_gather_triton makes, with the output on the ids' device (the
    stock wrapper puts it on the table's device, which for a host table is the view's)."""
    n = ids.numel()
    out = torch.empty(n, HIDDEN, dtype=scale.dtype, device=ids.device)
    num_groups = scale.shape[1]
    block = min(triton.next_power_of_2(HIDDEN), 1024)
    mod._dequant_gather_kernel[(n, triton.cdiv(HIDDEN, block))](
        ids, packed, scale, out, HIDDEN, packed.shape[1], num_groups, NUM_BITS=BITS,
        PACK_FACTOR=32 // BITS, GROUP_SIZE=HIDDEN // num_groups, BLOCK=block)
    return out


def test_gather_from_pinned_host_memory() -> None:
    _, patched = vllm_tree.trees()
    mod = _gather_module(patched)
    gen = torch.Generator(device="cuda").manual_seed(0)
    packed = torch.randint(-2**31, 2**31 - 1, (VOCAB, HIDDEN * BITS // 32), generator=gen,
                           device="cuda", dtype=torch.int32)
    scale = (torch.rand(VOCAB, HIDDEN // GROUP, generator=gen, device="cuda") * 0.01).to(
        torch.bfloat16)
    host = torch.empty_like(packed, device="cpu", pin_memory=True).copy_(packed)
    lines = []
    for n in (1, 8, 64, 2048):
        ids = torch.randint(0, VOCAB, (n,), generator=gen, device="cuda")
        stock = mod._dequant_gather_triton(ids, packed, scale, HIDDEN, BITS)
        device = _gather(mod, ids, packed, scale)
        uva = _gather(mod, ids, host, scale)
        assert torch.equal(device, stock) and torch.equal(uva, device), n
        t_dev = triton.testing.do_bench(lambda ids=ids: _gather(mod, ids, packed, scale)) * 1e3
        t_uva = triton.testing.do_bench(lambda ids=ids: _gather(mod, ids, host, scale)) * 1e3
        lines.append(f"{n} ids: device {t_dev:.1f} us, pinned host {t_uva:.1f} us")
    vllm_tree.record_line("qwen3_5-embed-uva gather (real _dequant_gather_kernel, 248320x5120 int4 g128; "
                 "outputs bit for bit equal): " + "; ".join(lines))


def _check_memory(tree: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv("VLLM_EMBED_UVA", "1")
    source = (tree / "model_executor/models/qwen3_5.py").read_text()
    if "def maybe_offload_embed_tokens_uva(" not in source:
        raise AssertionError("maybe_offload_embed_tokens_uva is not in qwen3_5.py")
    helper = exec_function(tree / "model_executor/models/qwen3_5.py",
                           "maybe_offload_embed_tokens_uva", {
                               "torch": torch, "envs": load_envs(tree),
                               "logger": logging.getLogger("qwen3_5"),
                               "get_accelerator_view_from_cpu_tensor": lambda cpu: cpu})
    embed = torch.nn.Module()
    embed.weight_packed = torch.nn.Parameter(
        torch.ones(VOCAB, HIDDEN * BITS // 32, dtype=torch.int32, device="cuda"),
        requires_grad=False)
    table = embed.weight_packed.numel() * 4
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    helper(embed, tied=False)
    after = torch.cuda.memory_allocated()
    moved = embed.weight_packed
    vllm_tree.record_line(f"  {tree.parent.name}: memory_allocated {(after - before) / 2**20:+.0f} MiB "
                 f"for a {table / 2**20:.0f} MiB table; now pinned={moved.is_pinned()}")
    assert before - after == table and moved.is_pinned()
    assert bool((moved == 1).all())


def test_offload_frees_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    vllm_tree.record_line("qwen3_5-embed-uva (real helper; the pinned tensor stands in for its view):")
    vllm_tree.fails_on_pristine(lambda tree: _check_memory(tree, monkeypatch))
