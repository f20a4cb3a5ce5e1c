// pthfa: quantize new K and V rows into the paged int8 cache.
//
// key/value: [num_tokens, num_kv_heads, head_dim] bf16 or fp16; the last dimension must be
// contiguous, the token and head strides are arguments (a view of a fused qkv works).
// slot_mapping: [num_tokens] int64, slot = block * block_size + offset; a negative slot skips
// the token (vLLM's padding). The caches' blocks are kv_bstride bytes (K, V) and sc_bstride
// floats (scales) apart; inside a block, [block_size, num_kv_heads, head_dim] is contiguous.
// One warp quantizes one (token, head) row of K or of V.
#include "pthfa_common.cuh"

namespace pthfa {

template <typename T, int D>
__device__ __forceinline__ void quantize_impl(
    const T* __restrict__ key, const T* __restrict__ value, int8_t* __restrict__ k_cache,
    int8_t* __restrict__ v_cache, float* __restrict__ k_scale, float* __restrict__ v_scale,
    const int64_t* __restrict__ slot_mapping, int num_tokens, int num_kv_heads,
    long long k_stride_tok, long long k_stride_head, long long v_stride_tok,
    long long v_stride_head, int block_shift, long long kv_bstride, long long sc_bstride) {
  constexpr int EPL = D / 32;
  const int lane = threadIdx.x & 31;
  const long long warp = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const long long rows = (long long)num_tokens * num_kv_heads;
  if (warp >= 2 * rows) return;
  const bool is_v = warp >= rows;
  const long long row = is_v ? warp - rows : warp;
  const int tok = (int)(row / num_kv_heads);
  const int head = (int)(row % num_kv_heads);
  const long long slot = slot_mapping[tok];
  if (slot < 0) return;

  const T* src = is_v ? value + tok * v_stride_tok + head * v_stride_head
                      : key + tok * k_stride_tok + head * k_stride_head;
  float x[EPL];
  float amax = 0.f;
#pragma unroll
  for (int j = 0; j < EPL; ++j) {
    x[j] = Conv<T>::to_float(src[lane + 32 * j]);
    amax = fmaxf(amax, fabsf(x[j]));
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float scale = amax / 127.f;
  const float inv = amax > 0.f ? 127.f / amax : 0.f;

  const long long blk = slot >> block_shift;
  const long long in = (slot & ((1LL << block_shift) - 1)) * num_kv_heads + head;
  int8_t* dst = (is_v ? v_cache : k_cache) + blk * kv_bstride + in * D;
#pragma unroll
  for (int j = 0; j < EPL; ++j) {
    float q = rintf(x[j] * inv);
    q = fminf(fmaxf(q, -127.f), 127.f);
    dst[lane + 32 * j] = (int8_t)(int)q;
  }
  if (lane == 0) (is_v ? v_scale : k_scale)[blk * sc_bstride + in] = scale;
}

}  // namespace pthfa

#define PTHFA_QUANT(TN, T, D)                                                                   \
  extern "C" __global__ void __launch_bounds__(128) pthfa_quantize_##TN##_d##D(                 \
      const T* __restrict__ key, const T* __restrict__ value, int8_t* __restrict__ k_cache,     \
      int8_t* __restrict__ v_cache, float* __restrict__ k_scale, float* __restrict__ v_scale,   \
      const int64_t* __restrict__ slot_mapping, int num_tokens, int num_kv_heads,               \
      long long k_stride_tok, long long k_stride_head, long long v_stride_tok,                  \
      long long v_stride_head, int block_shift, long long kv_bstride, long long sc_bstride) {   \
    pthfa::quantize_impl<T, D>(key, value, k_cache, v_cache, k_scale, v_scale, slot_mapping,    \
                               num_tokens, num_kv_heads, k_stride_tok, k_stride_head,           \
                               v_stride_tok, v_stride_head, block_shift, kv_bstride,            \
                               sc_bstride);                                                     \
  }

PTHFA_QUANT(bf16, __nv_bfloat16, 64)
PTHFA_QUANT(bf16, __nv_bfloat16, 128)
PTHFA_QUANT(bf16, __nv_bfloat16, 256)
PTHFA_QUANT(fp16, __half, 64)
PTHFA_QUANT(fp16, __half, 128)
PTHFA_QUANT(fp16, __half, 256)
