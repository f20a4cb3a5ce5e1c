"""pthfa-backend-select, and the pthfa wheel's vLLM backend it selects.

On vLLM 0.32.0's real Python (CPU torch, no GPU): the plugin entry point that
``pthfa/entry_points.txt`` declares is loaded by vLLM's own ``load_general_plugins`` and
registers ``AttentionBackendEnum.PTHFA``; the backend's KV cache spec goes through vLLM's
``FullAttentionSpec`` and ``customize_attention_spec``, its page is allocated and viewed by
vLLM's ``create_kv_cache_views`` and split by the backend into K, V and their scales (every
byte of the page exactly once); the metadata builder splits a reordered batch into decodes
and prefills. The patch's behaviour: with ``PTH_FA=1`` the CUDA platform's
``get_valid_backends`` puts PTHFA first and vLLM's validation keeps it for the layers it can
run (and drops it for the others); without PTH_FA nothing changes. The kernels themselves
need a GPU: tests/gpu/test_pthfa_vllm_backend_gpu.py."""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any, NamedTuple

import pytest

from ._helpers import (
    OnceLogger,
    assert_pristine_lacks,
    exec_function,
    load_envs,
    load_kv_cache_interface,
    load_module,
    load_with_auto_stubs,
    make_module,
    stub_modules,
    tree_before,
)

torch = pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]
PTHFA_PY = REPO / "pthfa" / "python"
H, D, BS = 8, 128, 16


def _logger_module() -> ModuleType:
    return make_module("vllm.logger",
                       init_logger=lambda name: OnceLogger(logging.getLogger(name), {}))


def _resolve(qualname: str) -> Any:
    module, _, name = qualname.rpartition(".")
    return getattr(importlib.import_module(module), name)


class Vllm:
    """vLLM's real registry, KV cache spec classes and backend interfaces, loaded from a
    tree into one set of modules; :meth:`active` puts them in sys.modules (with the package
    parents and the few lazily imported helpers as stand-ins) and imports pthfa's backend
    and plugin against them."""

    def __init__(self, tree: Path) -> None:
        self.tree = tree
        logger = _logger_module()
        self.kvi = load_kv_cache_interface(tree)
        self.registry = load_module(tree / "v1/attention/backends/registry.py", {
            "vllm.logger": logger,
            "vllm.utils.import_utils": make_module("vllm.utils.import_utils",
                                                   resolve_obj_by_qualname=_resolve)})
        self.backend = load_with_auto_stubs(tree / "v1/attention/backend.py", {
            "vllm.logger": logger, "vllm.v1.kv_cache_interface": self.kvi}, loose=True)
        self.modules: dict[str, ModuleType] = {
            "vllm.logger": logger,
            "vllm.v1.kv_cache_interface": self.kvi,
            "vllm.v1.attention.backend": self.backend,
            "vllm.v1.attention.backends.registry": self.registry,
            # what AttentionImplBase.__new__ imports when an impl is made
            "vllm.config": make_module("vllm.config",
                                       get_current_vllm_config_or_none=lambda: None),
            "vllm.distributed.parallel_state": make_module(
                "vllm.distributed.parallel_state",
                get_dcp_world_size_and_rank=lambda *a: (1, 0),
                get_pcp_group=self._no_pcp),
        }
        for name in list(self.modules):
            parts = name.split(".")
            for i in range(1, len(parts)):
                parent = ".".join(parts[:i])
                if parent not in self.modules:
                    pkg = make_module(parent)
                    pkg.__path__ = []
                    self.modules[parent] = pkg

    @staticmethod
    def _no_pcp() -> Any:
        raise AssertionError("no PCP group")

    @contextmanager
    def active(self) -> Iterator[SimpleNamespace]:
        names = ("pthfa.vllm_backend", "pthfa.vllm_plugin")
        saved = {n: sys.modules.pop(n, None) for n in names}
        sys.path.insert(0, str(PTHFA_PY))
        try:
            with stub_modules(self.modules):
                be = importlib.import_module("pthfa.vllm_backend")
                plugin = importlib.import_module("pthfa.vllm_plugin")
                yield SimpleNamespace(be=be, plugin=plugin)
        finally:
            sys.path.remove(str(PTHFA_PY))
            for n, m in saved.items():
                sys.modules.pop(n, None)
                if m is not None:
                    sys.modules[n] = m


@pytest.fixture()
def vllm(patched_vllm: Path) -> Iterator[tuple[Vllm, SimpleNamespace]]:
    v = Vllm(patched_vllm)
    with v.active() as ns:
        yield v, ns


def _dist_with_entry_points(tmp: Path) -> Path:
    """A distribution whose metadata carries pthfa/entry_points.txt, as the pthfa wheel's
    dist-info must."""
    info = tmp / "site" / "pthfa-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: pthfa\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_bytes((REPO / "pthfa" / "entry_points.txt").read_bytes())
    return info.parent


def test_entry_point_registers_the_backend(vllm: tuple[Vllm, SimpleNamespace],
                                           tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's load_general_plugins finds the entry point in the distribution's metadata and
    its call registers PTHFA; the enum resolves to pthfa's backend class; loading again
    changes nothing."""
    v, ns = vllm
    enum = v.registry.AttentionBackendEnum
    assert "PTHFA" not in enum.__members__
    site = _dist_with_entry_points(tmp_path)
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    envs = make_module("vllm.envs", VLLM_PLUGINS=None)
    plugins = load_module(v.tree / "plugins/__init__.py", {"vllm.envs": envs,
                                                           "vllm": v.modules["vllm"]})
    with stub_modules({"vllm.envs": envs}):
        plugins.load_general_plugins()
        assert enum["PTHFA"].get_class() is ns.be.PthfaBackend
        assert enum["PTHFA"].get_path() == ns.plugin.BACKEND_PATH
        setattr(plugins, "plugins_loaded", False)  # noqa: B010 (a module global)
        plugins.load_general_plugins()  # a second load (another process's, a test's)
    assert ns.be.PthfaBackend.get_name() == "PTHFA"
    assert list(enum.__members__).count("PTHFA") == 1


def _spec(v: Vllm, ns: SimpleNamespace, block_size: int = BS) -> Any:
    """The spec the Attention layer makes for an int8_per_token_head layer, then the
    backend's customization as the worker applies it (worker/utils.py)."""
    spec = v.kvi.FullAttentionSpec(block_size=block_size, num_kv_heads=H, head_size=D,
                                   dtype=torch.int8,
                                   kv_quant_mode=v.kvi.KVQuantMode.INT8_PER_TOKEN_HEAD)
    from dataclasses import replace

    customize = exec_function(v.tree / "v1/worker/utils.py", "customize_attention_spec",
                              {"replace": replace, "MultipleOf": v.backend.MultipleOf,
                               "AttentionBackend": object, "AttentionSpec": object})
    return customize(ns.be.PthfaBackend, spec)


def test_spec_and_page(vllm: tuple[Vllm, SimpleNamespace]) -> None:
    """The page holds int8 K and V and fp32 per-token-head scales: block_size * kv_heads *
    (2 * head_size + 8) bytes, one head slot; power-of-two kernel blocks, so vLLM aligns
    block strides to whole 512-token kernel blocks."""
    v, ns = vllm
    spec = _spec(v, ns)
    assert spec.page_size_bytes == BS * H * (2 * D + 8) == 33792
    assert spec.num_heads == 1 and spec.num_kv_heads == H
    assert spec.block_stride_alignment == v.backend.MultipleOf(512)
    assert spec.copy_with_new_block_size(64).page_size_bytes == 4 * spec.page_size_bytes
    be = ns.be.PthfaBackend
    assert be.get_supported_kernel_block_sizes() == [16, 32, 64, 128, 256, 512]
    assert be.supports_kv_cache_dtype("int8_per_token_head")
    assert not be.supports_kv_cache_dtype("auto")
    # a spec of another KV cache dtype is left as it is
    plain = v.kvi.FullAttentionSpec(block_size=BS, num_kv_heads=H, head_size=D,
                                    dtype=torch.bfloat16)
    assert be.customize_spec(plain) == plain


def test_page_views_cover_the_page(vllm: tuple[Vllm, SimpleNamespace]) -> None:
    """vLLM's create_kv_cache_views lays two layers' pages out (layer-compact LBNHC, the
    default on CUDA); the backend's views of a layer (K, V, K scales, V scales, blocks a
    page apart) touch every byte of that layer's pages exactly once, and nothing else."""
    v, ns = vllm
    spec = _spec(v, ns)
    nb, layers = 5, 2
    raw = torch.zeros(layers * nb * spec.page_size_bytes, dtype=torch.int8)
    tensor = v.kvi.KVCacheTensor(size=raw.numel(), layers=["l0", "l1"],
                                 layer_stride=nb * spec.page_size_bytes,
                                 block_stride=spec.page_size_bytes)
    views = v.kvi.create_kv_cache_views(raw, spec, nb, v.kvi.KVCacheLayout.LBNHC, tensor)
    assert views[1].shape == (nb, 1, BS, H * (2 * D + 8)) and views[1].dtype == torch.int8
    impl = ns.be.PthfaImpl(32, D, D ** -0.5, H, None, None, "int8_per_token_head")
    k, v_, ks, vs = impl.cache_views(views[1])
    assert k.shape == v_.shape == (nb, BS, H, D) and ks.shape == vs.shape == (nb, BS, H)
    assert ks.dtype == torch.float32
    k.fill_(1)
    v_.fill_(2)
    ks.fill_(3.0)  # bytes 00 00 40 40: neither 1 nor 2
    vs.fill_(-5.0)
    layer0 = raw[: nb * spec.page_size_bytes]
    assert int(layer0.count_nonzero()) == 0  # the other layer is untouched
    pages = raw[nb * spec.page_size_bytes:].view(nb, spec.page_size_bytes)
    kv = BS * H * D
    assert bool((pages[:, :kv] == 1).all()) and bool((pages[:, kv: 2 * kv] == 2).all())
    scales = pages[:, 2 * kv:].contiguous().view(torch.float32)
    assert scales.shape == (nb, 2 * BS * H)
    assert bool((scales[:, : BS * H] == 3.0).all()) and bool((scales[:, BS * H:] == -5.0).all())
    assert impl.cache_views(views[1])[0] is k  # cached per cache tensor


def test_impl_refuses_what_pthfa_cannot_run(vllm: tuple[Vllm, SimpleNamespace]) -> None:
    _v, ns = vllm
    impl = ns.be.PthfaImpl
    with pytest.raises(NotImplementedError, match="kv_cache_dtype 'auto'"):
        impl(32, D, 0.1, H, None, None, "auto")
    with pytest.raises(NotImplementedError, match="sliding window"):
        impl(32, D, 0.1, H, None, 4096, "int8_per_token_head")
    with pytest.raises(NotImplementedError, match="48 query heads over 3 KV heads"):
        impl(48, D, 0.1, 3, None, None, "int8_per_token_head")


def _common(v: Vllm, query_lens: list[int], seq_lens: list[int]) -> Any:
    qsl = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32)
    n = len(query_lens)
    return v.backend.CommonAttentionMetadata(
        query_start_loc=qsl, query_start_loc_cpu=qsl.clone(),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32), num_reqs=n,
        num_actual_tokens=int(qsl[-1]), max_query_len=max(query_lens),
        max_seq_len=max(seq_lens), block_table_tensor=torch.zeros(n, 8, dtype=torch.int32),
        slot_mapping=torch.zeros(int(qsl[-1]), dtype=torch.int64))


def test_metadata_builder(vllm: tuple[Vllm, SimpleNamespace]) -> None:
    """Decodes first (the builder asks vLLM to reorder with threshold 1), then prefills;
    graphs for pure decode batches, captured for max_model_len."""
    v, ns = vllm
    cfg = SimpleNamespace(model_config=SimpleNamespace(max_model_len=4096),
                          speculative_config=None,
                          parallel_config=SimpleNamespace(decode_context_parallel_size=1))
    b = ns.be.PthfaMetadataBuilder(_spec(v, ns), ["l0"], cfg, torch.device("cpu"))
    assert b.reorder_batch_threshold == 1
    cg = v.backend.AttentionCGSupport
    assert b.get_cudagraph_support(cfg, b.kv_cache_spec) == cg.UNIFORM_SINGLE_TOKEN_DECODE
    m = b.build(0, _common(v, [1, 1, 1, 5, 3], [40, 7, 100, 5, 60]))
    assert (m.num_decodes, m.num_decode_tokens, m.num_prefills) == (3, 3, 2)
    assert m.prefill_query_start_loc.tolist() == [0, 5, 8]
    assert m.decode_max_seq_len == 100 and m.prefill_max_query_len == 5
    d = b.build(0, _common(v, [1, 1], [9, 12]))
    assert (d.num_decodes, d.num_prefills, d.prefill_query_start_loc) == (2, 0, None)
    g = b.build_for_cudagraph_capture(_common(v, [1, 1], [1, 1]))
    assert g.decode_max_seq_len == 4096
    # a decode after a prefill (not reordered) goes with the prefills
    m = b.build(0, _common(v, [1, 4, 1], [4, 9, 9]))
    assert (m.num_decodes, m.num_prefills) == (1, 2)
    assert m.prefill_query_start_loc.tolist() == [0, 4, 5]
    # a row without a token ahead of a prefill: every row goes to the prefill path
    m = b.build(0, _common(v, [1, 0, 4], [4, 0, 9]))
    assert (m.num_decodes, m.num_decode_tokens, m.num_prefills) == (0, 0, 3)
    assert m.prefill_query_start_loc.tolist() == [0, 1, 1, 5]


class _OtherBackend:
    """The platform's next choice, taking any configuration."""

    @classmethod
    def validate_configuration(cls, **kwargs: Any) -> list[str]:
        return []


def _selection(v: Vllm, tree: Path) -> tuple[Any, Any]:
    """vLLM's get_valid_backends of ``tree``'s platforms/cuda.py, with its AttentionSelectorConfig
    (v1/attention/selector.py) and the real registry and envs; the platform's own order is
    one backend (TRITON_ATTN) taking anything."""
    enum = v.registry.AttentionBackendEnum
    envs = load_envs(tree)
    ns: dict[str, Any] = {
        "envs": envs, "AttentionBackendEnum": enum,
        "logger": OnceLogger(logging.getLogger("cuda"), {}),
        "_get_backend_priorities": lambda **kw: [enum.TRITON_ATTN],
        "_get_attn_backend_class":
            lambda b: b.get_class() if b.name == "PTHFA" else _OtherBackend,
        "NamedTuple": NamedTuple, "AttentionBackend": object, "torch": torch,
        "CacheDType": str, "AttentionType": v.backend.AttentionType,
        "DeviceCapability": object, "AttentionSelectorConfig": object,
    }
    ns["_BackendCandidate"] = exec_function(tree / "platforms/cuda.py", "_BackendCandidate",
                                            ns)
    fn = exec_function(tree / "platforms/cuda.py", "CudaPlatformBase.get_valid_backends", ns)
    fn = getattr(fn, "__func__", fn)
    config = exec_function(tree / "v1/attention/selector.py", "AttentionSelectorConfig", ns)
    return fn, config


def _valid(fn: Any, config: Any, **over: Any) -> tuple[list[str], dict[str, list[str]]]:
    args = {"head_size": D, "dtype": torch.bfloat16, "kv_cache_dtype": "int8_per_token_head",
            "block_size": None, **over}
    valid, invalid = fn(None, device_capability=SimpleNamespace(major=9, minor=0),
                        attn_selector_config=config(**args), num_heads=32)
    return ([c.backend.name for c in sorted(valid, key=lambda c: c.priority)],
            {b.name: reasons for b, (_p, reasons) in invalid.items()})


def _check_selection(v: Vllm, ns: SimpleNamespace, tree: Path,
                     monkeypatch: pytest.MonkeyPatch) -> None:
    ns.plugin.register()
    fn, config = _selection(v, tree)
    monkeypatch.setenv("PTH_FA", "1")
    assert _valid(fn, config)[0] == ["PTHFA", "TRITON_ATTN"]
    # a layer pthfa cannot run keeps the platform's order, with vLLM's reasons
    names, invalid = _valid(fn, config, head_size=80)
    assert names == ["TRITON_ATTN"] and invalid["PTHFA"] == ["head_size not supported"]
    names, invalid = _valid(fn, config, kv_cache_dtype="auto", has_sliding_window=True)
    assert names == ["TRITON_ATTN"]
    assert invalid["PTHFA"] == ["kv_cache_dtype not supported", "sliding window not supported"]
    assert _valid(fn, config, use_mla=True)[0] == ["TRITON_ATTN"]
    monkeypatch.setenv("PTH_FA", "0")
    assert _valid(fn, config)[0] == ["TRITON_ATTN"]


def test_patched_pth_fa_selects_pthfa_first(vllm: tuple[Vllm, SimpleNamespace],
                                    patched_vllm: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    v, ns = vllm
    _check_selection(v, ns, patched_vllm, monkeypatch)
    envs = load_envs(patched_vllm)
    monkeypatch.setenv("PTH_FA", "1")
    assert envs.PTH_FA is True and "PTH_FA" in envs.environment_variables


def test_pristine_platform_ignores_pth_fa(vllm: tuple[Vllm, SimpleNamespace],
                                          pristine_vllm: Path, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    v, ns = vllm
    before = tree_before(pristine_vllm, tmp_path, "pthfa-backend-select")
    assert_pristine_lacks(lambda: _check_selection(v, ns, before, monkeypatch))
