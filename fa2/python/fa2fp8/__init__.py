"""fa2fp8: FlashAttention-2's split-KV paged decode over an fp8 (e4m3) KV cache, by ctypes.

The kernels live in one shared library per CUDA arch, built by ``fa2/build.py``:
``libfa2fp8_smXY.so`` (fp8 K/V, the tree patched with ``fa2/fp8-kv.diff``) and, for
comparison, ``libfa2stock_smXY.so`` (the unpatched tree's bf16 K/V path). They export a C ABI
taking raw device pointers (no torch C++ ABI), so this module passes ``data_ptr()``s and
torch's current stream. The folder is the ``directory`` argument, else ``$FA2FP8_LIB_DIR``,
else this package's ``lib/``.

torch is imported on the first ``paged_decode`` only; ``find_library`` and the argument
rules need nothing but the standard library.
"""

from __future__ import annotations

import ctypes
import math
import os
import threading
from pathlib import Path
from typing import Any

__all__ = ["ABI_VERSION", "descale_strides", "find_library", "lib_dir", "load", "paged_decode"]

ABI_VERSION = 2
KINDS = {"fp8": "libfa2fp8", "stock": "libfa2stock"}
HEAD_DIMS = (64, 128, 256)


def lib_dir(directory: str | os.PathLike[str] | None = None) -> Path:
    """Where the libraries are: ``directory``, else $FA2FP8_LIB_DIR, else the package's lib/."""
    if directory is not None:
        return Path(directory)
    env = os.environ.get("FA2FP8_LIB_DIR")
    return Path(env) if env else Path(__file__).resolve().parent / "lib"


def find_library(kind: str, major: int, minor: int,
                 directory: str | os.PathLike[str] | None = None) -> Path:
    """The library of KIND ("fp8" or "stock") for compute capability major.minor.

    The exact ``smXY`` build first; else the newest build of the same major with a lower minor
    (SASS runs on later minors of its major: an sm_80 build serves 8.6 and 8.9); never another
    major nor a higher minor. FileNotFoundError says what was looked for and what is there.
    """
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r}: one of {sorted(KINDS)}")
    d = lib_dir(directory)
    stem = KINDS[kind]
    for m in range(minor, -1, -1):
        p = d / f"{stem}_sm{major}{m}.so"
        if p.is_file():
            return p
    have = sorted(p.name for p in d.glob("libfa2*.so")) if d.is_dir() else []
    raise FileNotFoundError(
        f"no {stem} library for compute capability {major}.{minor} in {d} (looked for "
        f"{stem}_sm{major}{minor}.so down to {stem}_sm{major}0.so; found {have}); build it with "
        f"`python3 fa2/build.py ... --arch {major}.{minor}{' --stock' if kind == 'stock' else ''}`"
    )


def descale_strides(shape: tuple[int, ...], stride: tuple[int, ...], batch: int,
                    num_kv_heads: int) -> tuple[int, int]:
    """(batch stride, KV-head stride) of a float32 descale tensor, in elements.

    One value (any shape of numel 1, as vLLM's k_scale / v_scale): per tensor, (0, 0).
    [num_kv_heads]: per KV head, (0, stride). [batch, num_kv_heads] (FA3's q/k/v_descale
    layout): per sequence and KV head. Anything else is a ValueError.
    """
    numel = math.prod(shape)
    if numel == 1:
        return 0, 0
    if len(shape) == 1 and shape[0] == num_kv_heads:
        return 0, stride[0]
    if len(shape) == 2 and shape == (batch, num_kv_heads):
        return stride[0], stride[1]
    raise ValueError(f"descale of shape {list(shape)}: expected one value, [num_kv_heads="
                     f"{num_kv_heads}] or [batch={batch}, num_kv_heads={num_kv_heads}]")


class _Lib:
    """One loaded library with its functions typed."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.dll = ctypes.CDLL(str(path))
        i64, i32, vp, f32 = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p, ctypes.c_float
        for name in ("fa2fp8_abi_version", "fa2fp8_is_stock", "fa2fp8_dtypes"):
            getattr(self.dll, name).restype = i32
            getattr(self.dll, name).argtypes = []
        version = int(self.dll.fa2fp8_abi_version())
        if version != ABI_VERSION:
            raise RuntimeError(f"{path}: ABI version {version}, this module speaks {ABI_VERSION}")
        self.is_stock = bool(self.dll.fa2fp8_is_stock())
        self.dtypes = int(self.dll.fa2fp8_dtypes())
        self.num_splits = self.dll.fa2fp8_num_splits
        self.num_splits.restype = i32
        self.num_splits.argtypes = [i32] * 5
        self.decode = self.dll.fa2fp8_paged_decode
        self.decode.restype = i32
        self.decode.argtypes = [
            vp, i64, i64,                 # q, batch / head strides
            vp, i64, i64, i64,            # k cache, block / row / head strides
            vp, i64, i64, i64,            # v cache
            vp, i64, i32,                 # block table, its batch stride, block size
            vp, i32,                      # seq lens, max seq len
            vp, i64, i64,                 # out, batch / head strides
            vp, vp, vp, vp,               # softmax lse, o accum, lse accum, split counters
            vp, i64, i64,                 # k descale, batch / head strides
            vp, i64, i64,                 # v descale
            i32, i32, i32, i32,           # batch, heads, kv heads, head dim
            i32, i32, f32, i32, vp,       # is bf16, kv fp8, softmax scale, num splits, stream
        ]


_LIBS: dict[tuple[str, int, int, str], _Lib] = {}
_LOCK = threading.Lock()


def load(kind: str, major: int, minor: int,
         directory: str | os.PathLike[str] | None = None) -> _Lib:
    """The library of KIND for capability major.minor, loaded once per (kind, arch, folder)."""
    key = (kind, major, minor, str(lib_dir(directory)))
    with _LOCK:
        lib = _LIBS.get(key)
        if lib is None:
            lib = _Lib(find_library(kind, major, minor, directory))
            _LIBS[key] = lib
        return lib


_COUNTERS: dict[tuple[int, int], list[Any]] = {}
_COUNTERS_MIN = 1 << 16


def _split_counters(device: Any, stream: int, n: int) -> Any:
    """This module's zeroed int32 split counters for (device, stream), at least n of them.

    The kernel leaves them zero, so one buffer serves every later call on the stream (calls on
    one stream never overlap; two streams get two buffers). A buffer is never freed once made:
    a CUDA graph that captured its address may replay it.
    """
    import torch

    key = (device.index if device.index is not None else torch.cuda.current_device(), stream)
    with _LOCK:
        kept = _COUNTERS.setdefault(key, [])
        if not kept or kept[-1].numel() < n:
            kept.append(torch.zeros(max(n, _COUNTERS_MIN), dtype=torch.int32, device=device))
        return kept[-1]


_ERRORS = {-1: "invalid arguments", -2: "not built into this library (head dim, dtype or KV kind)"}


def paged_decode(q: Any, k_cache: Any, v_cache: Any, block_table: Any, seq_lens: Any, *,
                 k_descale: Any = None, v_descale: Any = None,
                 softmax_scale: float | None = None, num_splits: int = 0, out: Any = None,
                 max_seq_len: int | None = None, split_counters: Any = None,
                 combine_kernel: bool = False,
                 lib_directory: str | os.PathLike[str] | None = None) -> Any:
    """Decode attention, one query token per sequence, over vLLM's flash_attn paged cache.

    q [batch, num_heads, head_dim] bf16/fp16 (head_dim 64, 128 or 256); k_cache / v_cache
    [num_blocks, block_size, num_kv_heads, head_dim]: float8_e4m3fn (or uint8 holding e4m3
    bytes) runs the fp8 library, q's dtype runs the stock one; block_table [batch, max_blocks]
    int32; seq_lens [batch] int32, each >= 1. k_descale / v_descale: float32 on q's device,
    None (1.0), one value, [num_kv_heads] or [batch, num_kv_heads]; the cache holds
    value / descale. ``max_seq_len`` is the longest of seq_lens (read from the device, one sync,
    when omitted): the splits are cut from it, and the block table holds its pages (a sequence
    longer than it is still read whole, more slowly). num_splits 0 lets the library choose. With
    several splits over an fp8 cache the decode kernel's last split of each (sequence, KV head)
    merges them, counting arrivals in ``split_counters`` (int32 on q's device, at least batch *
    num_kv_heads, zero, left zero; None: this module's own buffer for the stream; calls that may
    run at once need their own, such as two CUDA graphs captured on one stream and replayed on
    two); ``combine_kernel=True`` runs FA2's combine kernel instead, a second launch. Returns
    ``out`` [batch, num_heads, head_dim] in q's dtype, on torch's current stream.
    """
    import torch

    if q.dim() != 3 or k_cache.dim() != 4 or v_cache.dim() != 4:
        raise ValueError("q must be [batch, heads, head_dim], the caches "
                         "[blocks, block_size, kv_heads, head_dim]")
    batch, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, kd = k_cache.shape
    if tuple(v_cache.shape) != tuple(k_cache.shape) or kd != head_dim:
        raise ValueError(f"cache shapes {list(k_cache.shape)} / {list(v_cache.shape)} do not "
                         f"match q {list(q.shape)}")
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"head_dim {head_dim}: built for {HEAD_DIMS}")
    if num_heads % num_kv_heads:
        raise ValueError(f"{num_heads} query heads over {num_kv_heads} KV heads")
    if q.dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"q dtype {q.dtype}: bf16 or fp16")
    if k_cache.dtype != v_cache.dtype:
        raise ValueError("k_cache and v_cache differ in dtype")
    if k_cache.dtype in (torch.float8_e4m3fn, torch.uint8):
        kind = "fp8"
    elif k_cache.dtype == q.dtype:
        kind = "stock"
    else:
        raise ValueError(f"cache dtype {k_cache.dtype}: float8_e4m3fn/uint8, or q's {q.dtype}")
    named = (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("block_table", block_table))
    for name, t in named:
        if t.device != q.device or t.stride(-1) != 1:
            raise ValueError(f"{name}: on q's device with a contiguous last dim")
    if block_table.dtype != torch.int32 or seq_lens.dtype != torch.int32:
        raise ValueError("block_table and seq_lens must be int32")
    if block_table.dim() != 2 or block_table.shape[0] != batch or tuple(seq_lens.shape) != (batch,):
        raise ValueError("block_table [batch, max_blocks], seq_lens [batch]")
    if seq_lens.device != q.device or not seq_lens.is_contiguous():
        raise ValueError("seq_lens: contiguous, on q's device")
    if out is None:
        out = torch.empty_like(q)
    elif tuple(out.shape) != tuple(q.shape) or out.dtype != q.dtype or out.stride(-1) != 1:
        raise ValueError("out: q's shape and dtype, contiguous last dim")
    scales = []
    for name, d in (("k_descale", k_descale), ("v_descale", v_descale)):
        if d is None:
            scales.append((0, 0, 0))
            continue
        if kind != "fp8":
            raise ValueError(f"{name} is for an fp8 cache")
        if d.dtype != torch.float32 or d.device != q.device:
            raise ValueError(f"{name}: float32 on q's device")
        bs, hs = descale_strides(tuple(d.shape), tuple(d.stride()) or (1,), batch, num_kv_heads)
        scales.append((d.data_ptr(), bs, hs))
    if max_seq_len is None:
        max_seq_len = int(seq_lens.max().item())
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(head_dim)
    dev = q.device
    major, minor = torch.cuda.get_device_capability(dev)
    lib = load(kind, major, minor, lib_directory)
    with torch.cuda.device(dev):
        if num_splits <= 0:
            num_splits = int(lib.num_splits(batch, num_heads, num_kv_heads, head_dim, max_seq_len))
            if num_splits < 0:
                raise RuntimeError(f"fa2fp8_num_splits: {_ERRORS.get(num_splits, num_splits)}")
        lse = torch.empty((batch, num_heads), dtype=torch.float32, device=dev)
        o_acc = lse_acc = None
        if num_splits > 1:
            o_acc = torch.empty((num_splits, batch, num_heads, head_dim), dtype=torch.float32,
                                device=dev)
            lse_acc = torch.empty((num_splits, batch, num_heads), dtype=torch.float32, device=dev)
        stream = torch.cuda.current_stream(dev).cuda_stream
        counters = None
        if kind == "fp8" and num_splits > 1 and not combine_kernel:
            if split_counters is None:
                counters = _split_counters(dev, stream, batch * num_kv_heads)
            elif (split_counters.dtype != torch.int32 or split_counters.device != dev
                  or not split_counters.is_contiguous()
                  or split_counters.numel() < batch * num_kv_heads):
                raise ValueError(f"split_counters: contiguous int32 on q's device, at least "
                                 f"batch * num_kv_heads = {batch * num_kv_heads}")
            else:
                counters = split_counters
        rc = lib.decode(
            q.data_ptr(), q.stride(0), q.stride(1),
            k_cache.data_ptr(), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            v_cache.data_ptr(), v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
            block_table.data_ptr(), block_table.stride(0), block_size,
            seq_lens.data_ptr(), max_seq_len,
            out.data_ptr(), out.stride(0), out.stride(1),
            lse.data_ptr(),
            0 if o_acc is None else o_acc.data_ptr(), 0 if lse_acc is None else lse_acc.data_ptr(),
            0 if counters is None else counters.data_ptr(),
            *scales[0], *scales[1],
            batch, num_heads, num_kv_heads, head_dim,
            int(q.dtype == torch.bfloat16), int(kind == "fp8"), float(softmax_scale), num_splits,
            stream,
        )
    if rc != 0:
        what = _ERRORS.get(rc) or f"CUDA error {rc}"
        raise RuntimeError(f"fa2fp8_paged_decode ({lib.path.name}): {what}")
    return out
