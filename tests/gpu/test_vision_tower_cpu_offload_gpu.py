"""vision-tower-cpu-offload on a GPU (marker ``gpu``).

vLLM's own ``Qwen3_VisionTransformer.__init__`` (qwen3_vl.py) builds a tower of the real
Qwen3.5 vision shapes (hidden 1152, 16 heads, MLP 4304, 27 blocks, merger to 5120, bf16) whose
blocks and merger are plain torch stand-ins of those shapes (vLLM's own layers need the
engine's parallel state), and vLLM's own ``UVAOffloader`` (offloader/uva.py) moves them in
bulk-copy mode (no ``_C`` op needed). With ``VLLM_VISION_CPU_OFFLOAD_GB=8``: the merger and the
blocks live in pinned host memory, ``memory_allocated`` drops by their bytes, a 1024-patch
forward is bit for bit the in-VRAM tower's, and its transient peak stays within the largest
wrapped module plus the activations. Beside it, the upstream route (one ``UVAOffloader``
wrap of the whole tower, as ``_mark_tower_model`` does with ``--cpu-offload-params visual``
and ``VLLM_WEIGHT_OFFLOADING_DISABLE_UVA=1``): its peak and its latency. Not shown: zero-copy
UVA mode (needs the ``_C`` view op), the real vision layers, an engine boot."""

from __future__ import annotations

import gc
import statistics
import time
from pathlib import Path
from types import MethodType
from typing import Any

import pytest

from tests.gpu import vllm_tree
from tests.patches._vision_tower import tower_class, uva_offloader, vision_config

pytestmark = pytest.mark.gpu
vllm_tree.require_cuda()

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

DEPTH, HIDDEN, MLP, HEADS, OUT = 27, 1152, 4304, 16, 5120
PATCHES = 1024
MIB = 2**20


class _Block(torch.nn.Module):  # type: ignore[misc, unused-ignore]
    """A Qwen3 vision block's weights and arithmetic in plain torch."""

    def __init__(self, dim: int, num_heads: int, mlp_hidden_dim: int, **_: Any) -> None:
        super().__init__()
        self.heads = num_heads
        self.norm1, self.norm2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)
        self.fc1 = torch.nn.Linear(dim, mlp_hidden_dim)
        self.fc2 = torch.nn.Linear(mlp_hidden_dim, dim)

    def forward(self, x: Any) -> Any:
        n, dim = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(n, 3, self.heads, -1).permute(1, 2, 0, 3)
        attn = F.scaled_dot_product_attention(q, k, v).permute(1, 0, 2).reshape(n, dim)
        x = x + self.proj(attn)
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x)), approximate="tanh"))


class _Merger(torch.nn.Module):  # type: ignore[misc, unused-ignore]
    def __init__(self, d_model: int, context_dim: int, spatial_merge_size: int = 2,
                 **_: Any) -> None:
        super().__init__()
        self.hidden = context_dim * spatial_merge_size**2
        self.norm = torch.nn.LayerNorm(context_dim)
        self.fc1 = torch.nn.Linear(self.hidden, self.hidden)
        self.fc2 = torch.nn.Linear(self.hidden, d_model)

    def forward(self, x: Any) -> Any:
        return self.fc2(F.gelu(self.fc1(self.norm(x).view(-1, self.hidden))))


def _toy_forward(tower: Any, x: Any) -> Any:
    for block in tower.blocks:
        x = block(x)
    return tower.merger(x)


def _build(tree: Path, knob: str, monkeypatch: Any) -> tuple[Any, list[Any], int]:
    """(tower, offloaders made, memory_allocated growth of the build)."""
    monkeypatch.setenv("VLLM_VISION_CPU_OFFLOAD_GB", knob)
    real = uva_offloader(tree)
    made: list[Any] = []

    class Recorded(real):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    cls = tower_class(tree, block=_Block, merger=_Merger, offloader=Recorded)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.manual_seed(0)
    dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda"):
            tower = cls(vision_config(DEPTH, HIDDEN, MLP, HEADS, OUT), prefix="visual")
    finally:
        torch.set_default_dtype(dtype)
    tower.forward = MethodType(_toy_forward, tower)
    torch.cuda.synchronize()
    return tower, made, torch.cuda.memory_allocated() - before


def _run(tower: Any, x: Any) -> tuple[Any, int, float]:
    """(output, transient peak above the allocation at the call, median ms of 10 runs)."""
    with torch.inference_mode():
        tower(x)
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = tower(x)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
        times = []
        for _ in range(10):
            t0 = time.perf_counter()
            tower(x)
            torch.cuda.synchronize()
            times.append((time.perf_counter() - t0) * 1e3)
    return out, peak, statistics.median(times)


def _bytes(module: Any) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def _input() -> Any:
    gen = torch.Generator(device="cuda").manual_seed(1)
    return torch.randn(PATCHES, HIDDEN, generator=gen, device="cuda").to(torch.bfloat16)


_FIGURES: dict[str, Any] = {}


def _check(tree: Path, monkeypatch: Any) -> None:
    x = _input()
    ref_tower, _, vram = _build(tree, "0", monkeypatch)
    ref, act_peak, ref_ms = _run(ref_tower, x)
    # the tower holds itself through its bound forward (a cycle): only the collector frees
    # it, and it must not do so while the next build is being measured (the H200 saw the
    # build "grow" by -924,667,392 bytes)
    del ref_tower
    gc.collect()
    torch.cuda.empty_cache()
    tower, made, allocated = _build(tree, "8", monkeypatch)
    wrapped = [tower.merger, *tower.blocks]
    on_host = all(p.device.type == "cpu" and p.is_pinned()
                  for m in wrapped for p in m.parameters())
    assert len(made) == 1 and on_host, "the merger and the blocks are not in pinned host memory"
    offloaded = made[0].cpu_offload_bytes
    assert offloaded == sum(_bytes(m) for m in wrapped)
    # VRAM holds the resident parameters alone (the allocator may round each block up by
    # less than 1 MiB when it does not split it; 2 MiB of slack in all), and at least the
    # offloaded bytes came off the in-VRAM tower's figure
    resident = sum(p.numel() * p.element_size() for p in tower.parameters()
                   if p.device.type == "cuda")
    assert resident <= allocated <= resident + 2 * MIB, (allocated, resident)
    assert vram - allocated >= offloaded, (vram, allocated, offloaded)
    out, peak, ms = _run(tower, x)
    assert torch.equal(out, ref), "per-block output differs from the in-VRAM tower"
    largest = max(_bytes(m) for m in wrapped)
    assert peak <= largest + act_peak + 8 * MIB, (peak, largest, act_peak)
    _FIGURES.update(vram=vram, offloaded=offloaded, allocated=allocated, act_peak=act_peak,
                    peak=peak, largest=largest, ref_ms=ref_ms, ms=ms,
                    block=_bytes(tower.blocks[0]))
    del tower
    gc.collect()
    torch.cuda.empty_cache()


def test_per_block_bulk_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    vllm_tree.record_line("vision-tower-cpu-offload (real __init__ and UVAOffloader, toy layers of the "
                 "real shapes, 1024 patches):")
    vllm_tree.fails_on_pristine(lambda tree: _check(tree, monkeypatch))
    f = _FIGURES
    vllm_tree.record_line(
        f"  per-block: {f['offloaded'] / MIB:.0f} MiB offloaded of a {f['vram'] / MIB:.0f} MiB "
        f"tower, memory_allocated {f['allocated'] / MIB:.0f} MiB; forward bit for bit equal; "
        f"transient peak {f['peak'] / MIB:.0f} MiB (largest module {f['largest'] / MIB:.0f} "
        f"MiB, a block {f['block'] / MIB:.1f} MiB, activations {f['act_peak'] / MIB:.0f} MiB); "
        f"{f['ms']:.2f} ms vs {f['ref_ms']:.2f} ms in VRAM")


def test_upstream_whole_tower_wrap(monkeypatch: pytest.MonkeyPatch) -> None:
    _, patched = vllm_tree.trees()
    x = _input()
    ref_tower, _, _ = _build(patched, "0", monkeypatch)
    ref, act_peak, _ = _run(ref_tower, x)
    del ref_tower
    gc.collect()
    torch.cuda.empty_cache()
    tower, _, _ = _build(patched, "0", monkeypatch)
    # what _mark_tower_model does with the global offloader: one wrap of `visual`
    offloader = uva_offloader(patched)(16 * 2**30, {"visual"})
    offloader.uva_offloading = False
    offloader.wrap_modules((m for m in [tower]), prefix="visual")
    assert all(p.device.type == "cpu" for p in tower.parameters())
    out, peak, ms = _run(tower, x)
    assert torch.equal(out, ref)
    assert peak >= offloader.cpu_offload_bytes  # the whole tower comes in at once
    vllm_tree.record_line(
        f"  upstream whole-tower bulk wrap: {offloader.cpu_offload_bytes / MIB:.0f} MiB "
        f"offloaded; transient peak {peak / MIB:.0f} MiB (activations {act_peak / MIB:.0f} "
        f"MiB); {ms:.2f} ms per forward")
    del tower
    gc.collect()
    torch.cuda.empty_cache()
