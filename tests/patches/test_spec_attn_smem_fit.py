"""spec-attn-smem-fit: the split-KV verify kernel's launch halves its KV tile while Triton
reports OutOfResources, memoises the tile that launched, and seeds the first tile from the
device's shared memory.

Runs vLLM's real spec_decode_attention (v1/attention/ops/spec_decode_attn.py) on CPU tensors
with the two Triton kernels replaced by recording fakes: the partial kernel's fake raises the
OutOfResources Triton raises at load for tiles above a limit. The genuine exception on a GPU:
tests/gpu/test_spec_attn_smem_fit_gpu.py."""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import pytest

from .test_spec_decode_attn import OutOfResources, load_ops

pytestmark = pytest.mark.e2e
torch = pytest.importorskip("torch")


class _FakeKernel:
    """`kernel[grid](*args, **constexprs)`; raises OutOfResources for TILE > limit."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.tiles: list[int] = []

    def __getitem__(self, grid: tuple[int, ...]) -> Any:
        def launch(*args: Any, **kw: Any) -> str:
            if "TILE" in kw:
                self.tiles.append(kw["TILE"])
                if self.limit is None or kw["TILE"] > self.limit:
                    raise OutOfResources(f"shared memory at TILE {kw['TILE']}")
            return "compiled"
        return launch


def _run(sda: types.ModuleType, d: int = 128) -> None:
    hq, hkv, page, nb = 8, 2, 16, 4
    q = torch.zeros((8, hq, d), dtype=torch.bfloat16)
    kv = torch.zeros((nb, hkv, page, 2 * d), dtype=torch.bfloat16)
    k, v = kv.transpose(1, 2).split(d, dim=-1)
    buf = sda.SpecDecodeAttnBuffers(1, hq, d, 16, "cpu")
    sda.spec_decode_attention(
        q, k, v, torch.empty_like(q), torch.tensor([0, 8], dtype=torch.int32),
        torch.tensor([40], dtype=torch.int32), torch.tensor([[1, 2, 3]], dtype=torch.int32),
        8, 0.1, buf)


@pytest.fixture
def sda(patched_vllm: Path) -> types.ModuleType:
    mod = load_ops(patched_vllm)
    mod.__dict__["_spec_attn_combine"] = _FakeKernel(None)  # never given TILE: never raises
    return mod


def test_patched_halves_until_it_fits_and_memoises(sda: types.ModuleType) -> None:
    fake = _FakeKernel(limit=16)
    sda.__dict__["_spec_attn_partial"] = fake
    sda._TILE_MEMO.clear()
    _run(sda)
    assert fake.tiles == [64, 32, 16]
    assert list(sda._TILE_MEMO.values()) == [16]
    (key,) = sda._TILE_MEMO
    assert key == ("cpu", 32, 128, "torch.bfloat16")
    fake.tiles.clear()
    _run(sda)  # the memoised tile first: one launch
    assert fake.tiles == [16]


def test_patched_error_propagates_below_the_floor(sda: types.ModuleType) -> None:
    fake = _FakeKernel(limit=None)  # nothing fits
    sda.__dict__["_spec_attn_partial"] = fake
    sda._TILE_MEMO.clear()
    with pytest.raises(OutOfResources):
        _run(sda)
    assert fake.tiles == [64, 32, 16]
    assert sda._TILE_MEMO == {}


def test_patched_default_tile_launches_once(sda: types.ModuleType) -> None:
    fake = _FakeKernel(limit=64)
    sda.__dict__["_spec_attn_partial"] = fake
    sda._TILE_MEMO.clear()
    _run(sda)
    assert fake.tiles == [64]


def test_patched_first_tile_from_shared_memory(sda: types.ModuleType) -> None:
    sda._TILE_MEMO.clear()
    first = sda.first_kv_tile
    key = ("cuda:0", 128, 256, "torch.bfloat16")
    # Turing: 64 KB per block; D 256 with a 128-row query tile
    assert sda.smem_estimate(128, 256, 32, 2) == 98304
    assert first(key, 128, 256, 256, 2, 65536) == 16
    assert first(key, 32, 256, 256, 2, 65536) == 32  # (32 + 2x32) x 256 x 2 = 48 KB
    assert first(key, 128, 256, 256, 2, 232448) == 32  # Hopper: the row's default
    assert first(key, 128, 128, 128, 2, None) == 64  # unknown limit: the default
    sda._TILE_MEMO[key] = 64  # a tile that launched before wins
    assert first(key, 128, 256, 256, 2, 65536) == 64
    sda._TILE_MEMO.clear()
