"""pthfa's vLLM backend on a real GPU, driven through vLLM 0.32.0's own interfaces.

vLLM's compiled ops cannot load on the GPU machine (torch 2.11), so the package's ``.py`` tree
is loaded without running any ``__init__.py``: ``vllm`` and its parent packages are empty
namespace modules pointing into the tree, and only the platform, the logger, ``vllm.envs``
(read from ``os.environ``), the dtype-size and qualname helpers and the quantization keys
``backend.py`` imports are stand-ins. Real: the attention backend registry (the plugin
registers PTHFA in it), ``v1/attention/backend.py``, ``v1/kv_cache_interface.py`` (the spec
and ``create_kv_cache_views``, which lays the pages out) and the Triton
``unified_attention`` the prefill rows run.

Each case checks the backend's output against float64 attention over the dequantized cache
(read back through the backend's own views): decode batches, a mixed prefill/decode batch
(prefill rows with context, chunked), and a decode batch captured in a CUDA graph and
replayed after its contexts, block tables and queries changed in place.

Tree and loading: harness H of ``tests/gpu/vllm_tree.py`` (``$QWEN38_VLLM_TREE``, a folder
holding ``vllm/`` or a zip of its ``.py`` files; else the engine's build of the recipe's
series, extracted), with the real ``kv_cache_interface`` and attention backend modules.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import os
import sys
import types
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.find_spec("pthfa")
if _spec is None or _spec.origin is None:
    sys.path.insert(0, str(ROOT / "pthfa" / "python"))


from tests.gpu import vllm_tree  # noqa: E402

torch = vllm_tree.require_cuda()
try:
    import cupy  # noqa: F401
except ImportError:
    vllm_tree.missing("CuPy is not installed: the pthfa launcher needs it")

DEV = "cuda"
H, HQ, D = 8, 32, 128


def _module(name: str, path: Path | None = None, **attrs: Any) -> types.ModuleType:
    mod = types.ModuleType(name)
    if path is not None:
        mod.__path__ = [str(path)]
    mod.__dict__.update(attrs)
    sys.modules[name] = mod
    return mod


def _resolve(qualname: str) -> Any:
    module, _, name = qualname.rpartition(".")
    return getattr(importlib.import_module(module), name)


class _Placeholder:
    pass


@pytest.fixture(scope="module")
def vllm() -> types.SimpleNamespace:
    # harness H with these folders as namespace packages too, and the real
    # kv_cache_interface and backends/utils (the backend lays pages out with them)
    vllm_tree.install(packages=("utils", "model_executor/layers/quantization",
                                "model_executor/layers/quantization/utils"), kernels=False)
    _module("vllm.utils.torch_utils", None,
            get_dtype_size=lambda dt: torch.empty(0, dtype=dt).element_size())
    _module("vllm.utils.import_utils", None, resolve_obj_by_qualname=_resolve)
    qk = {n: _Placeholder() for n in ("kFp8Dynamic64Sym", "kFp8Dynamic128Sym",
                                       "kFp8StaticTensorSym", "kNvfp4Dynamic")}
    _module("vllm.model_executor.layers.quantization.utils.quant_utils", None, **qk)
    _module("vllm.config", None, get_current_vllm_config_or_none=lambda: None)
    _module("vllm.distributed", None)

    def no_pcp() -> Any:
        raise AssertionError("no PCP group")

    _module("vllm.distributed.parallel_state", None,
            get_dcp_world_size_and_rank=lambda *a: (1, 0), get_pcp_group=no_pcp)
    registry = importlib.import_module("vllm.v1.attention.backends.registry")
    kvi = importlib.import_module("vllm.v1.kv_cache_interface")
    backend = importlib.import_module("vllm.v1.attention.backend")
    from pthfa import vllm_plugin

    vllm_plugin.register()
    be_cls = registry.AttentionBackendEnum["PTHFA"].get_class()
    return types.SimpleNamespace(registry=registry, kvi=kvi, backend=backend, be_cls=be_cls,
                                 be=importlib.import_module("pthfa.vllm_backend"))


class Setup:
    """One layer's KV cache as vLLM makes it (spec, customize_spec, create_kv_cache_views over
    a two-layer allocation), the backend's builder and impl."""

    def __init__(self, v: types.SimpleNamespace, num_blocks: int, block_size: int = 16,
                 max_model_len: int = 8192, dtype: Any = torch.bfloat16) -> None:
        self.v = v
        self.bs = block_size
        self.dtype = dtype
        spec = v.kvi.FullAttentionSpec(block_size=block_size, num_kv_heads=H, head_size=D,
                                       dtype=torch.int8,
                                       kv_quant_mode=v.kvi.KVQuantMode.INT8_PER_TOKEN_HEAD)
        self.spec = v.be_cls.customize_spec(spec)
        page = self.spec.page_size_bytes
        assert page == block_size * H * (2 * D + 8)
        self.raw = torch.zeros(2 * num_blocks * page, dtype=torch.int8, device=DEV)
        t = v.kvi.KVCacheTensor(size=self.raw.numel(), layers=["l0", "l1"],
                                layer_stride=num_blocks * page, block_stride=page)
        self.kv_cache = v.kvi.create_kv_cache_views(self.raw, self.spec, num_blocks,
                                                    v.kvi.KVCacheLayout.LBNHC, t)[1]
        self.nb = num_blocks
        self.max_model_len = max_model_len
        cfg = types.SimpleNamespace(
            model_config=types.SimpleNamespace(max_model_len=max_model_len),
            speculative_config=None,
            parallel_config=types.SimpleNamespace(decode_context_parallel_size=1))
        self.builder = v.be_cls.get_builder_cls()(self.spec, ["l1"], cfg, torch.device(DEV))
        self.scale = D ** -0.5
        self.impl = v.be_cls.get_impl_cls()(HQ, D, self.scale, H, None, None,
                                            "int8_per_token_head")
        self.width = max_model_len // block_size
        self.gen = torch.Generator(device=DEV).manual_seed(7)
        self.free = torch.randperm(num_blocks, generator=self.gen, device=DEV).tolist()

    def rows(self, n: int, heads: int) -> Any:
        x = torch.randn((n, heads, D), generator=self.gen, device=DEV)
        mag = torch.exp(0.5 * torch.randn((n, heads, 1), generator=self.gen, device=DEV))
        return (x * mag).to(self.dtype)

    def table(self, length: int) -> list[int]:
        need = -(-length // self.bs)
        got, self.free = self.free[:need], self.free[need:]
        return [int(b) for b in got]

    def write(self, tables: list[list[int]], starts: list[int], counts: list[int]) -> None:
        """New K/V for tokens [start, start + count) of each sequence, through the impl."""
        slots = [tables[i][p // self.bs] * self.bs + p % self.bs
                 for i in range(len(tables)) for p in range(starts[i], starts[i] + counts[i])]
        n = len(slots)
        sm = torch.tensor([*slots, -1, -1], dtype=torch.int64, device=DEV)  # padded rows
        self.impl.do_kv_cache_update(None, self.rows(n + 2, H), self.rows(n + 2, H),
                                     self.kv_cache, sm)

    def common(self, tables: list[list[int]], query_lens: list[int],
               seq_lens: list[int]) -> Any:
        n = len(tables)
        qsl = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()],
                           dtype=torch.int32)
        bt = torch.zeros(n, self.width, dtype=torch.int32, device=DEV)
        for i, t in enumerate(tables):
            bt[i, : len(t)] = torch.tensor(t, dtype=torch.int32)
        return self.v.backend.CommonAttentionMetadata(
            query_start_loc=qsl.to(DEV), query_start_loc_cpu=qsl,
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=DEV), num_reqs=n,
            num_actual_tokens=int(qsl[-1]), max_query_len=max(query_lens),
            max_seq_len=max(seq_lens), block_table_tensor=bt,
            slot_mapping=torch.zeros(int(qsl[-1]), dtype=torch.int64, device=DEV))

    def reference(self, query: Any, tables: list[list[int]], query_lens: list[int],
                  seq_lens: list[int]) -> Any:
        """float64 causal attention over the dequantized cache, read through the views."""
        k, v, ks, vs = self.impl.cache_views(self.kv_cache)
        out = torch.zeros(query.shape, dtype=torch.float64, device=DEV)
        t0 = 0
        for i, tab in enumerate(tables):
            L, q = seq_lens[i], query_lens[i]
            blocks = torch.tensor(tab, device=DEV)
            kd = (k[blocks].double() * ks[blocks].double()[..., None]).reshape(-1, H, D)[:L]
            vd = (v[blocks].double() * vs[blocks].double()[..., None]).reshape(-1, H, D)[:L]
            g = HQ // H
            qq = query[t0: t0 + q].double().view(q, H, g, D)
            s = torch.einsum("qhgd,thd->hgqt", qq, kd) * self.scale
            pos = torch.arange(L - q, L, device=DEV)[:, None]
            s = s.masked_fill(torch.arange(L, device=DEV)[None, :] > pos, -math.inf)
            p = torch.softmax(s, dim=-1)
            out[t0: t0 + q] = torch.einsum("hgqt,thd->qhgd", p, vd).reshape(q, HQ, D)
            t0 += q
        return out


RESULTS: list[str] = []


def _check(what: str, got: Any, want: Any, rows: slice, tol: float = 2.0**-7) -> float:
    """Max abs error over ``rows`` against the float64 reference, at most ``tol`` times the
    reference's largest element (pthfa: two bf16 roundings, 2^-8 each; Triton's int8 path
    rounds the dequantized K and V and P to bf16 too: 2^-5 for its rows)."""
    err = float((got[rows].double() - want[rows]).abs().max())
    scale = float(want[rows].abs().max())
    RESULTS.append(f"{what}: max abs error {err:.3g} (reference max {scale:.3g})")
    assert err <= tol * max(scale, 1.0), (what, err, scale)
    return err


@pytest.fixture(scope="module", autouse=True)
def _report() -> Any:
    yield
    out = os.environ.get("PTHFA_GPU_RESULTS")
    if out and RESULTS:
        with open(out, "a") as f:
            f.write("".join(f"{line}\n" for line in RESULTS))


def test_registered_backend_and_spec(vllm: types.SimpleNamespace) -> None:
    be = vllm.be_cls
    assert be is vllm.be.PthfaBackend and be.get_name() == "PTHFA"
    s = Setup(vllm, 8)
    k, v, ks, _vs = s.impl.cache_views(s.kv_cache)
    page = s.spec.page_size_bytes
    assert k.stride(0) == page and ks.stride(0) == page // 4
    assert v.data_ptr() - k.data_ptr() == s.bs * H * D
    assert ks.data_ptr() - k.data_ptr() == 2 * s.bs * H * D
    assert k.data_ptr() - s.raw.data_ptr() == s.nb * page  # layer 1 of the allocation


@pytest.mark.parametrize("lens", [[1, 17, 300, 1000, 4097], [5000] * 12])
def test_decode_batch(vllm: types.SimpleNamespace, lens: list[int]) -> None:
    s = Setup(vllm, 4000)
    tables = [s.table(n + 1) for n in lens]
    s.write(tables, [0] * len(lens), lens)  # the contexts (as their prefills wrote them)
    s.write(tables, lens, [1] * len(lens))  # this step's token
    seq = [n + 1 for n in lens]
    meta = s.builder.build(0, s.common(tables, [1] * len(lens), seq))
    assert meta.num_decodes == len(lens) and meta.num_prefills == 0
    q = s.rows(len(lens), HQ)
    out = torch.full_like(q, float("nan"))
    s.impl.forward(None, q, None, None, s.kv_cache, meta, out)
    _check(f"decode {len(lens)} seqs, contexts {min(seq)}..{max(seq)}", out,
           s.reference(q, tables, [1] * len(lens), seq), slice(0, len(lens)))


def test_mixed_prefill_decode_batch(vllm: types.SimpleNamespace) -> None:
    """Three decodes, then a prefill with 50 tokens of context (a chunk of 37), then a
    first chunk of 130 tokens: decodes run pthfa.decode, the prefills Triton's
    unified_attention in INT8_PER_TOKEN_HEAD mode, over the same pages."""
    s = Setup(vllm, 400)
    ctx = [700, 33, 1500, 50, 0]
    qlen = [1, 1, 1, 37, 130]
    seq = [c + q for c, q in zip(ctx, qlen, strict=True)]
    tables = [s.table(n) for n in seq]
    s.write(tables, [0] * 5, ctx)
    s.write(tables, ctx, qlen)
    meta = s.builder.build(0, s.common(tables, qlen, seq))
    assert (meta.num_decodes, meta.num_prefills) == (3, 2)
    q = s.rows(sum(qlen), HQ)
    out = torch.full((sum(qlen) + 5, HQ, D), float("nan"), dtype=q.dtype, device=DEV)
    s.impl.forward(None, q, None, None, s.kv_cache, meta, out)
    want = s.reference(q, tables, qlen, seq)
    _check("mixed batch, decode rows (pthfa)", out, want, slice(0, 3))
    _check("mixed batch, prefill rows (Triton)", out, want, slice(3, sum(qlen)), 2.0**-5)
    assert bool(out[sum(qlen):].isnan().all())  # rows past the batch untouched


def test_cuda_graph_capture_and_replay(vllm: types.SimpleNamespace) -> None:
    """A decode batch of 8 captured with vLLM's capture metadata (short contexts), replayed
    after the contexts grew past what the capture saw, with new block tables and queries
    copied into the same buffers: the output matches each step's reference."""
    s = Setup(vllm, 4200, max_model_len=8192)
    n = 8
    lens0 = [3] * n
    tables = [s.table(8192) for _ in range(n)]
    s.write(tables, [0] * n, [8192 - 1] * n)
    common = s.common(tables, [1] * n, lens0)
    meta = s.builder.build_for_cudagraph_capture(common)
    assert meta.decode_max_seq_len == 8192
    q = s.rows(n, HQ)
    out = torch.zeros_like(q)
    stream = torch.cuda.Stream()  # type: ignore[no-untyped-call,unused-ignore]
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        s.impl.forward(None, q, None, None, s.kv_cache, meta, out)  # warm up off the graph
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        s.impl.forward(None, q, None, None, s.kv_cache, meta, out)
    for step, lens in enumerate(([5, 77, 1000, 4096, 8191, 1, 333, 2048],
                                 [8000, 17, 2, 600, 3000, 7000, 64, 129])):
        common.seq_lens.copy_(torch.tensor(lens, dtype=torch.int32))
        if step == 1:  # the rows of another request's blocks
            perm = list(reversed(range(n)))
            tables = [tables[i] for i in perm]
            bt = common.block_table_tensor
            bt.copy_(bt[torch.tensor(perm, device=DEV)].clone())
        q.copy_(s.rows(n, HQ))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        _check(f"graph replay {step}", out, s.reference(q, tables, [1] * n, lens),
               slice(0, n))
