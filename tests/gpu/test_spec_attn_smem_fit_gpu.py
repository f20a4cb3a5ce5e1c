"""spec-attn-smem-fit on a real GPU (marker ``gpu``): a genuine OutOfResources from Triton
(a KV tile seeded into the memo that cannot fit the device's shared memory per block) is
caught, the tile halves until the kernel launches, and the output matches the fp32
reference; with the default tiles the partial kernel launches with zero retries.

Records the tiles tried, the tile that launched and the compiled kernel's shared memory. On
the tree cut before the patch there is no memo: the tests fail.
"""

from __future__ import annotations

from typing import Any

import pytest

from .vllm_tree import record, require_cuda

pytestmark = pytest.mark.gpu
torch = require_cuda()

from . import vllm_tree  # noqa: E402
from .attn_ref import make_batch, max_err, reference, rel  # noqa: E402

DEV = "cuda"
LINES: list[str] = []


@pytest.fixture(scope="module")
def sda() -> Any:
    vllm_tree.install()
    return vllm_tree.load("vllm.v1.attention.ops.spec_decode_attn")


@pytest.fixture
def launches(sda: Any, monkeypatch: Any) -> Any:
    """Records (tile, outcome, compiled shared memory) of every partial-kernel launch."""
    seen: list[tuple[int, str, int | None]] = []
    real = sda._launch_partial

    def counting(grid: Any, tile: Any, plan: Any, args: Any, consts: Any) -> Any:
        try:
            kernel = real(grid, tile, plan, args, consts)
        except Exception as exc:
            seen.append((tile, type(exc).__name__, None))
            raise
        shared = getattr(getattr(kernel, "metadata", None), "shared", None)
        seen.append((tile, "launched", shared))
        return kernel

    monkeypatch.setattr(sda, "_launch_partial", counting)
    return seen


def _case(sda: Any, q_lens: Any, kv_lens: Any, hq: Any, hkv: Any, d: Any) -> Any:
    gen = torch.Generator(device=DEV).manual_seed(31)
    b = make_batch(q_lens, kv_lens, hq, hkv, d, 16, torch.bfloat16, gen)
    buf = sda.SpecDecodeAttnBuffers(len(q_lens), hq, d, max(32, *q_lens), DEV)
    out = torch.full_like(b.q, float("nan"))
    sda.spec_decode_attention(b.q, b.key_cache, b.value_cache, out, b.cu_seqlens_q,
                              b.seq_lens, b.block_table, b.max_q, d ** -0.5, buf)
    ref = reference(b, d ** -0.5)
    return out, ref


def test_genuine_out_of_resources_halves(sda: Any, launches: Any) -> None:
    # D 256 with a 128-row query tile (q 32, G 4): a 512-key tile needs
    # (128 + 2 x 512) x 256 x 2 B = 576 KB against 227 KB per block on Hopper
    limit = sda._max_shared_memory(torch.device(DEV))
    assert limit is not None
    key = (str(torch.device(DEV, torch.cuda.current_device())), 128, 256, "torch.bfloat16")
    sda._TILE_MEMO.clear()
    sda._TILE_MEMO[key] = 512
    out, ref = _case(sda, [32], [5000], 16, 4, 256)
    tried = [t for t, outcome, _ in launches]
    assert launches[0][1] == "OutOfResources", launches
    assert launches[-1][1] == "launched" and all(o == "OutOfResources"
                                                 for _, o, _ in launches[:-1])
    assert tried == [512 >> i for i in range(len(tried))]
    assert sda._TILE_MEMO[key] == tried[-1]
    assert max_err(out, ref) <= 2e-2 and rel(out, ref) <= 5e-3
    LINES.append(f"| seeded 512, D 256, BLOCK_M 128 | {limit:,} | "
                 f"{' -> '.join(map(str, tried))} | {tried[-1]} | {launches[-1][2]} | "
                 f"{max_err(out, ref):.2e} |")
    sda._TILE_MEMO.clear()


@pytest.mark.parametrize("shape", [(32, 16, 4, 256), (8, 24, 4, 256), (16, 16, 4, 128),
                                   (64, 8, 1, 128)])
def test_default_tiles_launch_without_retry(sda: Any, launches: Any, shape: Any) -> None:
    q, hq, hkv, d = shape
    sda._TILE_MEMO.clear()
    out, ref = _case(sda, [q], [3000], hq, hkv, d)
    assert [o for _, o, _ in launches] == ["launched"], launches
    assert max_err(out, ref) <= 2e-2
    limit = sda._max_shared_memory(torch.device(DEV))
    LINES.append(f"| default, q {q}, {hq}/{hkv}/{d} | {limit:,} | {launches[0][0]} | "
                 f"{launches[0][0]} | {launches[0][2]} | {max_err(out, ref):.2e} |")


def test_zz_record() -> None:
    record("spec_attn_smem_fit", [
        "Partial-kernel launches: the tiles tried (OutOfResources from Triton, then the "
        "launch), the tile that launched, the compiled kernel's shared memory (bytes), "
        "max |err| vs fp32.", "",
        "| case | device smem / block | tiles tried | launched | kernel smem | max err |",
        "|---|---|---|---|---|---|", *LINES])
