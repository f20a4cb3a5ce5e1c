"""pthfa as a vLLM attention backend (vLLM 0.32.0's v1 interfaces).

Registered by the ``vllm.general_plugins`` entry point of the pthfa wheel
(:func:`pthfa.vllm_plugin.register`) as ``AttentionBackendEnum.PTHFA``; with ``PTH_FA=1`` the
CUDA platform tries it first for every decoder layer (the series' ``pthfa-backend-select``
row), and ``--attention-backend PTHFA`` selects it by name.

KV cache: ``--kv-cache-dtype int8_per_token_head``. One layer's page of a kernel block of
``n`` tokens holds, in this order::

    K        [n, num_kv_heads, head_size]  int8
    V        [n, num_kv_heads, head_size]  int8
    K scales [n, num_kv_heads]             fp32 (absmax / 127 of each token's head row)
    V scales [n, num_kv_heads]             fp32

The spec says so to vLLM as one head slot of ``num_kv_heads * (2 * head_size + 8)`` bytes per
token (:meth:`PthfaBackend.customize_spec`), so vLLM allocates, splits and moves whole pages
and never looks inside them. The kernels read the four parts as views whose blocks are a page
apart (``pthfa.decode`` and ``pthfa.quantize_kv`` take block-strided caches).

Forward: the batch is reordered so decodes (one query token) come first; they run
``pthfa.decode``, the prefill rows vLLM's Triton ``unified_attention`` in its
``INT8_PER_TOKEN_HEAD`` mode over the same views. CUDA graphs: pure decode batches
(``UNIFORM_SINGLE_TOKEN_DECODE``); a captured decode covers ``max_model_len``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar

import torch
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionCGSupport,
    AttentionImpl,
    AttentionLayer,
    AttentionMetadataBuilder,
    AttentionType,
    CommonAttentionMetadata,
    MultipleOf,
)
from vllm.v1.kv_cache_interface import AttentionSpec, KVQuantMode

from . import _ops

NAME = "PTHFA"
KV_CACHE_DTYPE = "int8_per_token_head"
HEAD_SIZES = (64, 128, 256)
GQA_RATIOS = (1, 2, 4, 8)
# pthfa takes power-of-two blocks; the prefill path (Triton) multiples of 16
KERNEL_BLOCK_SIZES = (16, 32, 64, 128, 256, 512)
SCALE_BYTES = 4


def page_bytes_per_token(num_kv_heads: int, head_size: int) -> int:
    """Bytes one token takes in a page: its K and V rows and their two fp32 scales."""
    return num_kv_heads * (2 * head_size + 2 * SCALE_BYTES)


class PthfaBackend(AttentionBackend):
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16]
    supported_kv_cache_dtypes: ClassVar[list[Any]] = [KV_CACHE_DTYPE]
    # the K/V write is do_kv_cache_update (pthfa.quantize_kv), called by vLLM before forward
    forward_includes_kv_cache_update: bool = False

    @staticmethod
    def get_name() -> str:
        return NAME

    @staticmethod
    def get_impl_cls() -> type[PthfaImpl]:
        return PthfaImpl

    @staticmethod
    def get_builder_cls() -> type[PthfaMetadataBuilder]:
        return PthfaMetadataBuilder

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return list(HEAD_SIZES)

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec: Any = None) -> list[int | MultipleOf]:
        return list(KERNEL_BLOCK_SIZES)

    @classmethod
    def customize_spec(cls, spec: AttentionSpec) -> AttentionSpec:
        """The page as vLLM sees it: one head slot per token holding every KV head's K and V
        rows and their fp32 scales (laid out by the backend inside each kernel block's page:
        see the module's docstring)."""
        if spec.kv_quant_mode != KVQuantMode.INT8_PER_TOKEN_HEAD:
            return spec
        if spec.head_size_v != spec.head_size:
            raise ValueError(f"{NAME} needs equal K and V head sizes, got {spec.head_size} and "
                             f"{spec.head_size_v}")
        return replace(spec, num_head_slots=1,
                       state_content_bytes=page_bytes_per_token(spec.num_kv_heads,
                                                                spec.head_size))

    @classmethod
    def supports_compute_capability(cls, capability: Any) -> bool:
        # mma.sync m16n8k16 and cp.async: sm_80 and later
        return capability.major >= 8

    @classmethod
    def supports_attn_type(cls, attn_type: str) -> bool:
        return attn_type == AttentionType.DECODER

    @classmethod
    def supports_kv_connector(cls) -> bool:
        # a page is not vLLM's per-token K|V content: a connector that moves token ranges
        # (not whole pages) would move the wrong bytes
        return False

    @classmethod
    def supports_device_cpu_query_lens_mismatch(cls) -> bool:
        # the decode/prefill split is planned from the CPU query lengths
        return False


@dataclass
class PthfaMetadata:
    num_actual_tokens: int
    max_query_len: int
    max_seq_len: int
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    slot_mapping: torch.Tensor
    # decodes first: rows [0, num_decodes) have one query token each
    num_decodes: int
    num_decode_tokens: int
    num_prefills: int
    # the longest context a decode row may have: pthfa.decode's plan (grid) is made for it
    decode_max_seq_len: int
    # the prefill rows' query_start_loc, from 0
    prefill_query_start_loc: torch.Tensor | None = None
    prefill_max_query_len: int = 0


class PthfaMetadataBuilder(AttentionMetadataBuilder[PthfaMetadata]):
    _cudagraph_support: ClassVar[AttentionCGSupport] = (
        AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE)

    def __init__(self, kv_cache_spec: Any, layer_names: list[str], vllm_config: Any,
                 device: torch.device) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self._init_reorder_batch_threshold(1)
        self.max_model_len = int(vllm_config.model_config.max_model_len)

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata,
              fast_build: bool = False) -> PthfaMetadata:
        m = common_attn_metadata
        num_reqs = m.num_reqs
        num_decodes = num_reqs
        if m.max_query_len > 1:
            qsl = m.query_start_loc_cpu[: num_reqs + 1]
            long_rows = torch.nonzero(qsl[1:] - qsl[:-1] > 1)
            num_decodes = int(long_rows[0, 0]) if long_rows.numel() else num_reqs
        num_decode_tokens = int(m.query_start_loc_cpu[num_decodes])
        meta = PthfaMetadata(
            num_actual_tokens=m.num_actual_tokens,
            max_query_len=m.max_query_len,
            max_seq_len=m.max_seq_len,
            query_start_loc=m.query_start_loc,
            seq_lens=m.seq_lens,
            block_table=m.block_table_tensor,
            slot_mapping=m.slot_mapping,
            num_decodes=num_decodes,
            num_decode_tokens=num_decode_tokens,
            num_prefills=num_reqs - num_decodes,
            decode_max_seq_len=m.max_seq_len,
        )
        if num_decodes < num_reqs:
            if num_decode_tokens != num_decodes:
                # a leading row without a token: decode rows would not line up with the
                # query's rows, so every row takes the prefill path
                num_decodes = num_decode_tokens = 0
                meta.num_decodes = meta.num_decode_tokens = 0
                meta.num_prefills = num_reqs
            meta.prefill_query_start_loc = (
                m.query_start_loc[num_decodes: num_reqs + 1] - num_decode_tokens)
            meta.prefill_max_query_len = m.max_query_len
        return meta

    def build_for_cudagraph_capture(
            self, common_attn_metadata: CommonAttentionMetadata) -> PthfaMetadata:
        meta = self.build(0, common_attn_metadata)
        # a replay reuses the captured grid whatever the contexts then are
        meta.decode_max_seq_len = self.max_model_len
        return meta


class PthfaImpl(AttentionImpl[PthfaMetadata]):
    def __init__(self, num_heads: int, head_size: int, scale: float,
                 num_kv_heads: int | None = None, alibi_slopes: list[float] | None = None,
                 sliding_window: int | None = None, kv_cache_dtype: str = "auto",
                 logits_soft_cap: float | None = None,
                 attn_type: str = AttentionType.DECODER,
                 kv_sharing_target_layer_name: str | None = None,
                 sinks: torch.Tensor | None = None, **extra: Any) -> None:
        num_kv_heads = num_kv_heads or num_heads
        unsupported = []
        if kv_cache_dtype != KV_CACHE_DTYPE:
            unsupported.append(f"kv_cache_dtype {kv_cache_dtype!r} (needs {KV_CACHE_DTYPE!r})")
        if head_size not in HEAD_SIZES:
            unsupported.append(f"head_size {head_size}")
        if num_heads % num_kv_heads or num_heads // num_kv_heads not in GQA_RATIOS:
            unsupported.append(f"{num_heads} query heads over {num_kv_heads} KV heads")
        if alibi_slopes is not None:
            unsupported.append("ALiBi")
        if sliding_window is not None:
            unsupported.append("sliding window")
        if logits_soft_cap:
            unsupported.append("logits soft cap")
        if sinks is not None:
            unsupported.append("attention sinks")
        if attn_type != AttentionType.DECODER:
            unsupported.append(f"attention type {attn_type}")
        if unsupported:
            raise NotImplementedError(f"{NAME} does not support " + ", ".join(unsupported))
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = float(scale)
        self.num_kv_heads = num_kv_heads
        self.kv_cache_dtype = kv_cache_dtype
        self.attn_type = attn_type
        self.kv_sharing_target_layer_name = kv_sharing_target_layer_name
        self._views_of: tuple[Any, tuple[torch.Tensor, ...]] | None = None

    def cache_views(self, kv_cache: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(k_cache, v_cache, k_scale, v_scale) over this layer's pages: vLLM's view
        [blocks, 1, n, content] int8 (a page per kernel block of n tokens, blocks a stride
        apart) seen as [blocks, n, kv_heads, head_size] int8 twice and [blocks, n, kv_heads]
        fp32 twice, each block a page apart."""
        key = (kv_cache.data_ptr(), tuple(kv_cache.shape), kv_cache.stride())
        got = self._views_of
        if got is not None and got[0] == key:
            return got[1]
        nb, slots, n, content = kv_cache.shape
        h, d = self.num_kv_heads, self.head_size
        if (kv_cache.dtype != torch.int8 or slots != 1
                or content != page_bytes_per_token(h, d)
                or kv_cache.stride()[2:] != (content, 1)):
            raise ValueError(f"{NAME}: the KV cache view must be [blocks, 1, tokens, "
                             f"{page_bytes_per_token(h, d)}] int8 with contiguous pages, got "
                             f"{list(kv_cache.shape)} {kv_cache.dtype} strides "
                             f"{list(kv_cache.stride())}")
        page = kv_cache.stride(0) if nb > 1 else n * content
        base = kv_cache.storage_offset()
        if page % SCALE_BYTES or base % SCALE_BYTES:
            raise ValueError(f"{NAME}: pages must start 4-byte aligned (page stride {page}, "
                             f"offset {base})")
        k = kv_cache.as_strided((nb, n, h, d), (page, h * d, d, 1), base)
        v = kv_cache.as_strided((nb, n, h, d), (page, h * d, d, 1), base + n * h * d)
        f32 = torch.empty(0, dtype=torch.float32, device=kv_cache.device)
        f32.set_(kv_cache.untyped_storage())
        s0 = (base + 2 * n * h * d) // SCALE_BYTES
        ks = f32.as_strided((nb, n, h), (page // SCALE_BYTES, h, 1), s0)
        vs = f32.as_strided((nb, n, h), (page // SCALE_BYTES, h, 1), s0 + n * h)
        views = (k, v, ks, vs)
        self._views_of = (key, views)
        return views

    def do_kv_cache_update(self, layer: AttentionLayer, key: torch.Tensor, value: torch.Tensor,
                           kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        n = slot_mapping.shape[0]
        k, v, ks, vs = self.cache_views(kv_cache)
        _ops.quantize_kv(key[:n], value[:n], k, v, ks, vs, slot_mapping)

    def forward(self, layer: AttentionLayer, query: torch.Tensor, key: torch.Tensor,
                value: torch.Tensor, kv_cache: torch.Tensor, attn_metadata: PthfaMetadata,
                output: torch.Tensor, output_scale: torch.Tensor | None = None,
                output_block_scale: torch.Tensor | None = None) -> torch.Tensor:
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError(f"{NAME} does not fuse output quantization")
        if attn_metadata is None:  # the profiling run
            return output.fill_(0)
        m = attn_metadata
        k, v, ks, vs = self.cache_views(kv_cache)
        nd = m.num_decodes
        if nd:
            _ops.decode(query[:nd], k, v, ks, vs, m.block_table[:nd], m.seq_lens[:nd],
                        max_seq_len=m.decode_max_seq_len, sm_scale=self.scale,
                        out=output[:nd])
        if m.num_prefills:
            from vllm.v1.attention.ops.triton_unified_attention import unified_attention

            t0, t1 = m.num_decode_tokens, m.num_actual_tokens
            unified_attention(
                q=query[t0:t1], k=k, v=v, out=output[t0:t1],
                cu_seqlens_q=m.prefill_query_start_loc, max_seqlen_q=m.prefill_max_query_len,
                seqused_k=m.seq_lens[nd: nd + m.num_prefills], max_seqlen_k=m.max_seq_len,
                softmax_scale=self.scale, causal=True, window_size=(-1, -1),
                block_table=m.block_table[nd: nd + m.num_prefills], softcap=0,
                q_descale=None, k_descale=None, v_descale=None,
                kv_quant_mode=KVQuantMode.INT8_PER_TOKEN_HEAD, k_scale_cache=ks,
                v_scale_cache=vs)
        return output
