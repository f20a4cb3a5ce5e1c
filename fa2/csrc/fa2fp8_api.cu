// fa2fp8: a C ABI over FlashAttention-2's split-KV paged decode (vllm-project/flash-attention),
// for callers that hold raw device pointers (ctypes; no torch C++ ABI). Written for qwen38build.
//
// Built two ways from one description (fa2/build.toml):
//   - against the tree patched with fa2/fp8-kv.diff: K/V come from an fp8 e4m3 paged cache
//     (kv_fp8 = 1), through run_mha_fwd_splitkv_fp8kv_dispatch;
//   - with FA2FP8_STOCK, against the unpatched tree: K/V in the query's dtype (kv_fp8 = 0),
//     through the tree's own run_mha_fwd_splitkv_dispatch, the path vLLM's flash_attn backend
//     decodes with. The speed comparison runs both.
//
// Layouts (strides in elements of each tensor's own type):
//   q, out      [batch, num_heads, head_dim], one query token per sequence (decode)
//   k/v cache   [num_blocks, block_size, num_kv_heads, head_dim] (vLLM's flash_attn layout)
//   block_table [batch, max_blocks_per_seq] int32; seq_lens [batch] int32
//   softmax_lse [batch, num_heads] float32
//   o_accum     [num_splits, batch, num_heads, head_dim] float32 and
//   lse_accum   [num_splits, batch, num_heads] float32, when num_splits > 1
//   split_counters [batch, num_kv_heads] int32, zero, or NULL (fp8 build, num_splits > 1: with
//               them the decode kernel's last split of each (sequence, KV head) merges the
//               splits, which saves the combine kernel's launch; the kernel leaves them zero)
// The GQA group of a KV head rides in FA2's seqlen_q (its "seqlenq_ngroups_swapped" form): one
// CTA reads each K/V tile once for all num_heads / num_kv_heads queries of the group.

#include <cstdint>
#include <cstring>

#include <cuda_runtime.h>
#include <cutlass/numeric_types.h>

#include "namespace_config.h"
#include "flash.h"

#define FA2FP8_ABI_VERSION 2
// The build hides every symbol (-fvisibility=hidden) but these.
#define FA2FP8_EXPORT __attribute__((visibility("default")))

// Error codes besides cudaError_t values (which are >= 0).
#define FA2FP8_EINVAL (-1)       // arguments out of range
#define FA2FP8_EUNSUPPORTED (-2)  // head dim / dtype / kv kind not built into this library

namespace {

// kBlockN of the split-KV tiles for a head dim, as run_mha_fwd_splitkv_dispatch picks them for
// num_splits > 1, and run_mha_fwd_splitkv_fp8kv_dispatch for every num_splits: the diff's
// fp8kv_block_n (flash.h).
int block_n(int head_dim) {
#if defined(FA2FP8_STOCK)
    return head_dim <= 64 ? 256 : (head_dim <= 128 ? 128 : 64);
#else
    return FLASH_NAMESPACE::fp8kv_block_n(head_dim);
#endif
}

// How many pieces to split each sequence's KV into. One CTA per (sequence, KV head) leaves
// most SMs idle at small batch; splitting multiplies the CTAs, at the cost of a combine pass
// and of each split's partial result. A split count s is only worth it when every split gets
// work (the kernel gives each ceil(n_blocks / s) tiles, so fewer than s splits may be busy);
// among those, take the fewest whose last wave fills at least 85% of the best filling any
// reaches, and 1 when the CTAs already fill the machine's slots. min_blocks: the fewest
// tiles a split should get (fewer splits rather than splits too short to pay for their
// start and their share of the combine).
int choose_splits(int ctas, int num_sms, int n_blocks, int min_blocks = 1) {
    const int slots = num_sms * 2;  // two 128-thread CTAs of these tiles fit an SM
    if (ctas <= 0 || n_blocks <= 1 || ctas * 10 >= slots * 8) { return 1; }
    int max_splits = n_blocks < 128 ? n_blocks : 128;
    if (min_blocks > 1 && n_blocks / min_blocks < max_splits) {
        max_splits = n_blocks / min_blocks > 1 ? n_blocks / min_blocks : 1;
    }
    auto busy = [&](int s) { const int per = (n_blocks + s - 1) / s; return (n_blocks + per - 1) / per; };
    auto fill = [&](int s) {
        const long total = long(ctas) * s;
        const long waves = (total + slots - 1) / slots;
        return double(total) / double(waves * slots);
    };
    double best = 0.0;
    for (int s = 1; s <= max_splits; ++s) {
        if (busy(s) == s && fill(s) > best) { best = fill(s); }
    }
    for (int s = 1; s <= max_splits; ++s) {
        if (busy(s) == s && fill(s) >= 0.85 * best) { return s; }
    }
    return 1;
}

bool built_head_dim(int head_dim) { return head_dim == 64 || head_dim == 128 || head_dim == 256; }

template <typename T>
int dispatch(FLASH_NAMESPACE::Flash_fwd_params &params, cudaStream_t stream) {
    switch (params.d) {
#ifdef FA2FP8_STOCK
        case 64: FLASH_NAMESPACE::run_mha_fwd_splitkv_dispatch<T, 64, false>(params, stream); break;
        case 128: FLASH_NAMESPACE::run_mha_fwd_splitkv_dispatch<T, 128, false>(params, stream); break;
        case 256: FLASH_NAMESPACE::run_mha_fwd_splitkv_dispatch<T, 256, false>(params, stream); break;
#else
        case 64: FLASH_NAMESPACE::run_mha_fwd_splitkv_fp8kv_dispatch<T, 64, false>(params, stream); break;
        case 128: FLASH_NAMESPACE::run_mha_fwd_splitkv_fp8kv_dispatch<T, 128, false>(params, stream); break;
        case 256: FLASH_NAMESPACE::run_mha_fwd_splitkv_fp8kv_dispatch<T, 256, false>(params, stream); break;
#endif
        default: return FA2FP8_EUNSUPPORTED;
    }
    return int(cudaGetLastError());
}

}  // namespace

extern "C" {

FA2FP8_EXPORT int fa2fp8_abi_version(void) { return FA2FP8_ABI_VERSION; }

// 1: this library is the stock build (K/V in the query's dtype); 0: the fp8-KV build.
FA2FP8_EXPORT int fa2fp8_is_stock(void) {
#ifdef FA2FP8_STOCK
    return 1;
#else
    return 0;
#endif
}

// Which query dtypes this build holds: bit 0 fp16, bit 1 bf16. The stock build, there to be
// compared with, holds bf16 only (half its compile time).
FA2FP8_EXPORT int fa2fp8_dtypes(void) {
#ifdef FA2FP8_STOCK
    return 2;
#else
    return 3;
#endif
}

// The num_splits fa2fp8_paged_decode uses for num_splits = 0, or < 0 on error; the caller
// sizes o_accum / lse_accum with it.
FA2FP8_EXPORT int fa2fp8_num_splits(int batch, int num_heads, int num_kv_heads, int head_dim, int max_seq_len) {
    if (batch <= 0 || num_kv_heads <= 0 || num_heads % num_kv_heads != 0 || max_seq_len <= 0) {
        return FA2FP8_EINVAL;
    }
    if (!built_head_dim(head_dim)) { return FA2FP8_EUNSUPPORTED; }
    int device = 0, num_sms = 0;
    if (cudaGetDevice(&device) != cudaSuccess) { return FA2FP8_EINVAL; }
    if (cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
        return FA2FP8_EINVAL;
    }
    const int ngroups = num_heads / num_kv_heads;
    const int m_blocks = (ngroups + 63) / 64;
    const int bn = block_n(head_dim);
    const int n_blocks = (max_seq_len + bn - 1) / bn;
#if defined(FA2FP8_STOCK)
    const int min_blocks = 1;
#else
    // The fp8 decode kernel, measured on the H200 with its in-kernel merge (bench/fa2_splits.py,
    // fa2/results/2026-12-01-h200-merge.md): at batch 1 the best split counts were 8 at 1k
    // (2 blocks a split), 16 at 2k, 4k and 8k (2, 4 and 8 blocks) and 32 at 32k (16 blocks);
    // at 512, 8 splits of 1 block (7.0 us) beat 4 of 2 (7.4) by little. So a sixteenth of the
    // sequence's blocks a split, within 2 and 16.
    const int min_blocks = n_blocks / 16 < 2 ? 2 : (n_blocks / 16 > 16 ? 16 : n_blocks / 16);
#endif
    return choose_splits(batch * num_kv_heads * m_blocks, num_sms, n_blocks, min_blocks);
}

FA2FP8_EXPORT int fa2fp8_paged_decode(
    const void *q, int64_t q_batch_stride, int64_t q_head_stride,
    const void *k_cache, int64_t k_block_stride, int64_t k_row_stride, int64_t k_head_stride,
    const void *v_cache, int64_t v_block_stride, int64_t v_row_stride, int64_t v_head_stride,
    const int32_t *block_table, int64_t block_table_batch_stride, int block_size,
    const int32_t *seq_lens, int max_seq_len,
    void *out, int64_t o_batch_stride, int64_t o_head_stride,
    float *softmax_lse, float *o_accum, float *lse_accum, int32_t *split_counters,
    const float *k_descale, int64_t k_descale_batch_stride, int64_t k_descale_head_stride,
    const float *v_descale, int64_t v_descale_batch_stride, int64_t v_descale_head_stride,
    int batch, int num_heads, int num_kv_heads, int head_dim,
    int is_bf16, int kv_fp8, float softmax_scale, int num_splits, cudaStream_t stream) {
    (void)cudaGetLastError();  // a stale error of someone else's must not read as ours
#ifdef FA2FP8_STOCK
    if (kv_fp8) { return FA2FP8_EUNSUPPORTED; }
    if (!(fa2fp8_dtypes() & (is_bf16 ? 2 : 1))) { return FA2FP8_EUNSUPPORTED; }
#else
    if (!kv_fp8) { return FA2FP8_EUNSUPPORTED; }
#endif
    if (!built_head_dim(head_dim)) { return FA2FP8_EUNSUPPORTED; }
    if (q == nullptr || k_cache == nullptr || v_cache == nullptr || out == nullptr ||
        block_table == nullptr || seq_lens == nullptr || softmax_lse == nullptr) {
        return FA2FP8_EINVAL;
    }
    if (batch <= 0 || num_kv_heads <= 0 || num_heads % num_kv_heads != 0 || max_seq_len <= 0) {
        return FA2FP8_EINVAL;
    }
    // Each thread's K/V load covers consecutive rows of one page: 2 to 16 by tile, a power of 2.
    if (block_size <= 0 || block_size % 16 != 0) { return FA2FP8_EINVAL; }
    if (num_splits <= 0) {
        num_splits = fa2fp8_num_splits(batch, num_heads, num_kv_heads, head_dim, max_seq_len);
        if (num_splits < 0) { return num_splits; }
    }
    if (num_splits > 128) { return FA2FP8_EINVAL; }
    if (num_splits > 1 && (o_accum == nullptr || lse_accum == nullptr)) { return FA2FP8_EINVAL; }

    const int ngroups = num_heads / num_kv_heads;
    FLASH_NAMESPACE::Flash_fwd_params params;
    std::memset(&params, 0, sizeof(params));
    params.is_bf16 = is_bf16 != 0;
    params.q_ptr = const_cast<void *>(q);
    params.k_ptr = const_cast<void *>(k_cache);
    params.v_ptr = const_cast<void *>(v_cache);
    params.o_ptr = out;
    // The group g of KV head hk is query head hk * ngroups + g: the group is FA2's row.
    params.q_batch_stride = q_batch_stride;
    params.q_row_stride = q_head_stride;
    params.q_head_stride = q_head_stride * ngroups;
    params.o_batch_stride = o_batch_stride;
    params.o_row_stride = o_head_stride;
    params.o_head_stride = o_head_stride * ngroups;
    params.k_batch_stride = k_block_stride;
    params.k_row_stride = k_row_stride;
    params.k_head_stride = k_head_stride;
    params.v_batch_stride = v_block_stride;
    params.v_row_stride = v_row_stride;
    params.v_head_stride = v_head_stride;
    params.h = num_kv_heads;
    params.h_k = num_kv_heads;
    params.h_h_k_ratio = 1;
    params.b = batch;
    params.seqlen_q = ngroups;
    params.seqlen_q_rounded = ((ngroups + 127) / 128) * 128;
    params.seqlen_k = max_seq_len;
    params.seqlen_k_rounded = ((max_seq_len + 127) / 128) * 128;
    params.d = head_dim;
    params.d_rounded = head_dim;
    params.total_q = batch * ngroups;
    params.scale_softmax = softmax_scale;
    params.scale_softmax_log2 = softmax_scale * 1.4426950408889634f;  // log2(e)
    params.seqused_k = const_cast<int *>(seq_lens);
    params.is_seqlens_k_cumulative = true;
    params.block_table = const_cast<int *>(block_table);
    params.block_table_batch_stride = block_table_batch_stride;
    params.page_block_size = block_size;
    params.p_dropout = 1.f;  // the probability of keeping: no dropout
    params.p_dropout_in_uint8_t = 255;
    params.rp_dropout = 1.f;
    params.scale_softmax_rp_dropout = softmax_scale;
    params.window_size_left = -1;
    params.window_size_right = -1;
    params.softcap = 0.f;
    params.is_causal = false;  // one query row per sequence: causal and non-causal agree
    params.num_splits = num_splits;
    params.softmax_lse_ptr = softmax_lse;
    params.softmax_lseaccum_ptr = lse_accum;
    params.oaccum_ptr = o_accum;
    params.unpadded_lse = false;
    params.seqlenq_ngroups_swapped = true;
#ifndef FA2FP8_STOCK
    params.k_descale_ptr = k_descale;
    params.v_descale_ptr = v_descale;
    params.k_descale_batch_stride = k_descale_batch_stride;
    params.k_descale_head_stride = k_descale_head_stride;
    params.v_descale_batch_stride = v_descale_batch_stride;
    params.v_descale_head_stride = v_descale_head_stride;
    params.fp8kv_split_counters = num_splits > 1 ? split_counters : nullptr;
#else
    (void)split_counters;
    (void)k_descale; (void)k_descale_batch_stride; (void)k_descale_head_stride;
    (void)v_descale; (void)v_descale_batch_stride; (void)v_descale_head_stride;
#endif
#ifdef FA2FP8_STOCK
    return dispatch<cutlass::bfloat16_t>(params, stream);
#else
    return is_bf16 ? dispatch<cutlass::bfloat16_t>(params, stream)
                   : dispatch<cutlass::half_t>(params, stream);
#endif
}

}  // extern "C"
