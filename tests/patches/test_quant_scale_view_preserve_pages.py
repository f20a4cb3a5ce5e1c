"""quant-scale-view-preserve-pages: TritonAttentionImpl._ensure_scale_caches builds the
per-token-head scale views over a quantized KV tensor without writing a byte of it (the
pages are shared with other KV-cache groups in a hybrid model), the views alias the scale
bytes of each (block, head, slot), and they are rebuilt when the storage changes.

Runs vLLM's own method (v1/attention/backends/triton_attn.py, taken from the file) on CPU
torch, on an int8 KV tensor (4 blocks, 2 KV heads, 16 slots, head size 64: 17,408 bytes)
filled with a byte pattern. The Triton kernels that read and write the scales are not run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ._helpers import assert_pristine_lacks, extract_source, make_module, stub_modules

pytestmark = pytest.mark.e2e
torch = pytest.importorskip("torch")

BLOCKS, HEADS, SLOTS, HS = 4, 2, 16, 64
PAD = 4  # one float32 scale in int8 elements
CONTENT = 2 * (HS + PAD)  # [K(hs) | K scale | V(hs) | V scale]


def _impl_class(tree: Path) -> type:
    """TritonAttentionImpl with only what _ensure_scale_caches needs: the method and the
    class attributes it caches into, all as the file defines them."""
    path = tree / "v1/attention/backends/triton_attn.py"
    method = extract_source(path, "TritonAttentionImpl._ensure_scale_caches")
    text = path.read_text()
    head = text[text.index("class TritonAttentionImpl("):text.index("    def _ensure_scale_caches")]
    attrs = "\n".join(line for line in head.splitlines()[1:]
                      if line.startswith("    _") and ":" in line)
    src = "class TritonAttentionImpl:\n" + attrs + "\n\n" + "\n".join(
        "    " + line if line else line for line in method.splitlines()) + "\n"
    ns: dict[str, Any] = {"torch": torch}
    exec(compile(src, f"{path}:TritonAttentionImpl", "exec"), ns)
    cls: type = ns["TritonAttentionImpl"]
    return cls


def _ensure(impl: Any, kv_cache: Any) -> None:
    torch_utils = make_module("vllm.utils.torch_utils",
                              get_dtype_size=lambda d: torch.tensor([], dtype=d).element_size())
    with stub_modules({"vllm.utils.torch_utils": torch_utils}):
        impl._ensure_scale_caches(kv_cache)


def _kv_cache(nhd: bool = False) -> tuple[Any, Any]:
    """(the raw int8 buffer, the logical (blocks, heads, slots, content) tensor over it),
    HND or NHD physically; the buffer holds a byte pattern (0x11-0x1f: no byte of a
    float32 1.0 or 0.0, so any write of either shows)."""
    raw = (torch.arange(BLOCKS * HEADS * SLOTS * CONTENT, dtype=torch.int64) * 7 % 15
           + 0x11).to(torch.int8)
    if nhd:
        logical = raw.view(BLOCKS, SLOTS, HEADS, CONTENT).permute(0, 2, 1, 3)
    else:
        logical = raw.view(BLOCKS, HEADS, SLOTS, CONTENT)
    return raw, logical


def _offset(logical: Any, block: int, head: int, slot: int, byte: int) -> int:
    """Byte offset in the raw buffer of content byte ``byte`` of (block, head, slot)."""
    s = logical.stride()
    return int(block * s[0] + head * s[1] + slot * s[2] + byte)


def _check_no_write(tree: Path) -> None:
    raw, logical = _kv_cache()
    before = raw.clone()
    assert raw.numel() == 17_408
    _ensure(_impl_class(tree)(), logical)
    changed = int((raw != before).sum())
    assert changed == 0, f"{changed} of {raw.numel()} bytes changed"


def _check_aliasing(tree: Path) -> None:
    for nhd in (False, True):
        raw, logical = _kv_cache(nhd)
        impl = _impl_class(tree)()
        _ensure(impl, logical)
        k, v = impl._k_scale_cache, impl._v_scale_cache
        assert k.shape == v.shape == (BLOCKS, SLOTS, HEADS) and k.dtype == torch.float32
        for view, byte in ((k, HS), (v, 2 * HS + PAD)):
            for block, head, slot in ((0, 0, 0), (1, 1, 5), (3, 0, 15), (2, 1, 9)):
                before = raw.clone()
                view[block, slot, head] = 2.5
                diff = (raw != before).nonzero().flatten().tolist()
                start = _offset(logical, block, head, slot, byte)
                expected = list(range(start, start + 4))
                assert diff == expected, (nhd, byte, block, head, slot, diff, expected)
                got = raw[start:start + 4].view(torch.float32).item()
                assert got == 2.5
                raw.copy_(before)
                # And the view reads what is there: the bytes the buffer held.
                assert view[block, slot, head].item() == before[start:start + 4].view(
                    torch.float32).item()


def _check_rebuild(tree: Path) -> None:
    raw, logical = _kv_cache()
    impl = _impl_class(tree)()
    _ensure(impl, logical)
    k = impl._k_scale_cache
    _ensure(impl, logical)
    assert impl._k_scale_cache is k, "the same storage rebuilt its views"
    # A new storage (sleep/wake allocates one): the views follow it.
    raw2, logical2 = _kv_cache()
    _ensure(impl, logical2)
    assert impl._k_scale_cache is not k
    assert impl._k_scale_cache.untyped_storage().data_ptr() == raw2.untyped_storage().data_ptr()
    before = raw2.clone()
    impl._v_scale_cache[0, 0, 0] = 4.0
    start = _offset(logical2, 0, 0, 0, 2 * HS + PAD)
    assert (raw2 != before).nonzero().flatten().tolist() == list(range(start, start + 4))
    assert raw.untyped_storage().data_ptr() != raw2.untyped_storage().data_ptr()


def test_patched_writes_no_byte(patched_vllm: Path) -> None:
    _check_no_write(patched_vllm)


def test_patched_views_alias_scale_bytes(patched_vllm: Path) -> None:
    _check_aliasing(patched_vllm)


def test_patched_rebuilds_on_new_storage(patched_vllm: Path) -> None:
    _check_rebuild(patched_vllm)


def test_pristine_fills_shared_pages(pristine_vllm: Path) -> None:
    raw, logical = _kv_cache()
    before = raw.clone()
    _ensure(_impl_class(pristine_vllm)(), logical)
    assert int((raw != before).sum()) == 1_024
    assert_pristine_lacks(lambda: _check_no_write(pristine_vllm))
    assert_pristine_lacks(lambda: _check_rebuild(pristine_vllm))
