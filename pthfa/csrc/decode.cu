// pthfa: paged decode attention over the int8 per-token-head KV cache (flash-decoding).
//
// Kernel 1 (pthfa_decode_part_*): one CTA of 128 threads per (partition, kv head, sequence).
// It handles all G = num_heads / num_kv_heads query heads sharing that kv head, so each K/V
// byte is read once. A partition is part_size consecutive tokens of the sequence (a multiple
// of block_size). The CTA first requests all of the partition's K rows, then all its V rows,
// into shared memory with cp.async (16 bytes each), so a whole partition is in flight; then
// each token row is read from shared memory by LPT = head_dim / 16 lanes, 16 bytes a lane.
//   phase 1: scores s[t][h] = (q_h . k_t) * k_scale_t * sm_scale * log2(e), into shared memory
//   phase 2: per head m = max s, p = exp2(s - m), l = sum p          (fp32)
//   phase 3: acc[h][:] = sum_t p[t][h] * v_scale_t * v_t[:]          (fp32)
// and writes (m, l) and acc per partition to fp32 scratch.
// Kernel 2 (pthfa_decode_reduce_*): one CTA of head_dim threads per (head, sequence) merges the
// partitions: out = sum_p 2^(m_p - M) acc_p / sum_p 2^(m_p - M) l_p.
#include "pthfa_common.cuh"

namespace pthfa {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;

__device__ __forceinline__ void cp_async16(void* smem_dst, const void* gmem_src) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(gmem_src));
}
__device__ __forceinline__ void cp_async4(void* smem_dst, const void* gmem_src) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(d), "l"(gmem_src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Shared memory (floats unless noted), all offsets multiples of 16 bytes:
//   bt_s  [bt_cap] int        block ids of the partition
//   ks_s  [part_size]         K scales;  vs_s [part_size] V scales
//   sc    [part_size][G]                   scores, then probabilities
//   kv_s  [2][part_size][D] int8           the partition's K rows, then its V rows; at the end
//         (at least kWarps*G*D floats)     the cross-warp sum of the P.V accumulators
// Every K and V byte of the partition is requested at once with cp.async (K first, then V),
// so the loads of a whole partition are in flight while the CTA waits for K.
template <typename T, int D, int G>
__device__ __forceinline__ void decode_part_impl(
    const T* __restrict__ q, const int8_t* __restrict__ k_cache,
    const int8_t* __restrict__ v_cache, const float* __restrict__ k_scale,
    const float* __restrict__ v_scale, const int* __restrict__ block_tables, int bt_stride,
    const int* __restrict__ seq_lens, float* __restrict__ part_ml, float* __restrict__ part_acc,
    int num_kv_heads, int block_shift, int part_size, int max_parts, float scale_log2) {
  constexpr int LPT = D / 16;      // lanes per token row (16 bytes each)
  constexpr int TPW = 32 / LPT;    // token rows per warp per step
  constexpr int TPI = kWarps * TPW;
  constexpr int LPT_SHIFT = LPT == 4 ? 2 : (LPT == 8 ? 3 : 4);
  extern __shared__ __align__(16) float smem[];

  const int part = blockIdx.x;
  const int kvh = blockIdx.y;
  const int seq = blockIdx.z;
  const int seq_len = seq_lens[seq];
  const int t0 = part * part_size;
  if (t0 >= seq_len) return;
  const int n = min(part_size, seq_len - t0);
  const int block_mask = (1 << block_shift) - 1;
  const int nblk = (n + block_mask) >> block_shift;
  const int bt_cap = ((part_size >> block_shift) + 3) & ~3;
  const int sc_size = part_size * G;
  int* bt_s = reinterpret_cast<int*>(smem);
  float* ks_s = smem + bt_cap;
  float* vs_s = ks_s + part_size;
  float* sc = vs_s + part_size;
  int8_t* k_s = reinterpret_cast<int8_t*>(sc + sc_size);
  int8_t* v_s = k_s + part_size * D;

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int tg = lane / LPT;
  const int sl = lane % LPT;
  const int H = num_kv_heads * G;

  const int* bt = block_tables + (long long)seq * bt_stride + (t0 >> block_shift);
  for (int i = tid; i < nblk; i += kThreads) bt_s[i] = bt[i];
  __syncthreads();

  // ---- issue every load of the partition
  for (int c = tid; c < n * LPT; c += kThreads) {
    const int tl = c >> LPT_SHIFT;
    const int ch = c & (LPT - 1);
    const long long slot = ((long long)bt_s[tl >> block_shift] << block_shift) | ((t0 + tl) & block_mask);
    cp_async16(k_s + tl * D + ch * 16, k_cache + (slot * num_kv_heads + kvh) * D + ch * 16);
  }
  for (int tl = tid; tl < n; tl += kThreads) {
    const long long slot = ((long long)bt_s[tl >> block_shift] << block_shift) | ((t0 + tl) & block_mask);
    cp_async4(ks_s + tl, k_scale + slot * num_kv_heads + kvh);
  }
  cp_async_commit();
  for (int c = tid; c < n * LPT; c += kThreads) {
    const int tl = c >> LPT_SHIFT;
    const int ch = c & (LPT - 1);
    const long long slot = ((long long)bt_s[tl >> block_shift] << block_shift) | ((t0 + tl) & block_mask);
    cp_async16(v_s + tl * D + ch * 16, v_cache + (slot * num_kv_heads + kvh) * D + ch * 16);
  }
  for (int tl = tid; tl < n; tl += kThreads) {
    const long long slot = ((long long)bt_s[tl >> block_shift] << block_shift) | ((t0 + tl) & block_mask);
    cp_async4(vs_s + tl, v_scale + slot * num_kv_heads + kvh);
  }
  cp_async_commit();

  float qr[G][16];
  {
    const T* qp = q + ((long long)seq * H + (long long)kvh * G) * D + sl * 16;
#pragma unroll
    for (int h = 0; h < G; ++h) {
#pragma unroll
      for (int j = 0; j < 16; ++j) qr[h][j] = Conv<T>::to_float(qp[h * D + j]) * scale_log2;
    }
  }
  cp_async_wait<1>();
  __syncthreads();

  // ---- phase 1: scores
#pragma unroll 2
  for (int base = 0; base < n; base += TPI) {
    const int tl = base + warp * TPW + tg;
    const bool ok = tl < n;
    const int4 kv = ok ? *reinterpret_cast<const int4*>(k_s + tl * D + sl * 16)
                       : make_int4(0, 0, 0, 0);
    float kf[16];
    s8x16_to_f32(kv, kf);
    float s[G];
#pragma unroll
    for (int h = 0; h < G; ++h) {
      float a = 0.f;
#pragma unroll
      for (int j = 0; j < 16; ++j) a = fmaf(qr[h][j], kf[j], a);
      s[h] = a;
    }
#pragma unroll
    for (int o = LPT / 2; o > 0; o >>= 1) {
#pragma unroll
      for (int h = 0; h < G; ++h) s[h] += __shfl_xor_sync(0xffffffffu, s[h], o);
    }
    if (sl == 0 && ok) {
      const float ksc = ks_s[tl];
#pragma unroll
      for (int h = 0; h < G; ++h) sc[tl * G + h] = s[h] * ksc;
    }
  }
  __syncthreads();

  // ---- phase 2: softmax statistics per head
  for (int h = warp; h < G; h += kWarps) {
    float m = -INFINITY;
    for (int i = lane; i < n; i += 32) m = fmaxf(m, sc[i * G + h]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    float l = 0.f;
    for (int i = lane; i < n; i += 32) {
      const float p = exp2f(sc[i * G + h] - m);
      sc[i * G + h] = p;
      l += p;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) l += __shfl_xor_sync(0xffffffffu, l, o);
    if (lane == 0) {
      float* ml = part_ml + (((long long)seq * H + kvh * G + h) * max_parts + part) * 2;
      ml[0] = m;
      ml[1] = l;
    }
  }
  cp_async_wait<0>();
  __syncthreads();

  // ---- phase 3: probabilities times V
  float acc[G][16];
#pragma unroll
  for (int h = 0; h < G; ++h) {
#pragma unroll
    for (int j = 0; j < 16; ++j) acc[h][j] = 0.f;
  }
#pragma unroll 2
  for (int base = 0; base < n; base += TPI) {
    const int tl = base + warp * TPW + tg;
    if (tl < n) {
      const int4 vv = *reinterpret_cast<const int4*>(v_s + tl * D + sl * 16);
      const float vsc = vs_s[tl];
      float w[G];
#pragma unroll
      for (int h = 0; h < G; ++h) w[h] = sc[tl * G + h] * vsc;
      float vf[16];
      s8x16_to_f32(vv, vf);
#pragma unroll
      for (int h = 0; h < G; ++h) {
#pragma unroll
        for (int j = 0; j < 16; ++j) acc[h][j] = fmaf(w[h], vf[j], acc[h][j]);
      }
    }
  }
  // reduce over the token groups of the warp (lanes with the same sl)
#pragma unroll
  for (int o = LPT; o < 32; o <<= 1) {
#pragma unroll
    for (int h = 0; h < G; ++h) {
#pragma unroll
      for (int j = 0; j < 16; ++j) acc[h][j] += __shfl_xor_sync(0xffffffffu, acc[h][j], o);
    }
  }
  __syncthreads();  // done with the K/V rows: reuse them for the cross-warp sum
  float* red = reinterpret_cast<float*>(k_s);
  if (tg == 0) {
#pragma unroll
    for (int h = 0; h < G; ++h) {
#pragma unroll
      for (int j = 0; j < 16; ++j) red[(warp * G + h) * D + sl * 16 + j] = acc[h][j];
    }
  }
  __syncthreads();
  for (int i = tid; i < G * D; i += kThreads) {
    float a = red[i];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) a += red[w * G * D + i];
    const int h = i / D;
    const int d = i % D;
    part_acc[(((long long)seq * H + kvh * G + h) * max_parts + part) * D + d] = a;
  }
}

template <typename T, int D>
__device__ __forceinline__ void decode_reduce_impl(const float* __restrict__ part_ml,
                                                   const float* __restrict__ part_acc,
                                                   const int* __restrict__ seq_lens,
                                                   T* __restrict__ out, int num_heads,
                                                   int part_size, int max_parts) {
  const int h = blockIdx.x;
  const int seq = blockIdx.y;
  const int d = threadIdx.x;
  const int len = seq_lens[seq];
  const int np = len > 0 ? (len + part_size - 1) / part_size : 0;
  T* o = out + ((long long)seq * num_heads + h) * D + d;
  if (np == 0) {
    *o = Conv<T>::from_float(0.f);
    return;
  }
  const long long base = ((long long)seq * num_heads + h) * max_parts;
  float M = -INFINITY;
  for (int p = 0; p < np; ++p) M = fmaxf(M, part_ml[(base + p) * 2]);
  float L = 0.f;
  float a = 0.f;
  for (int p = 0; p < np; ++p) {
    const float w = exp2f(part_ml[(base + p) * 2] - M);
    L = fmaf(w, part_ml[(base + p) * 2 + 1], L);
    a = fmaf(w, part_acc[(base + p) * D + d], a);
  }
  *o = Conv<T>::from_float(a / L);
}

}  // namespace pthfa

#define PTHFA_PART(TN, T, D, G)                                                                  \
  extern "C" __global__ void __launch_bounds__(pthfa::kThreads)                                 \
      pthfa_decode_part_##TN##_d##D##_g##G(                                                      \
          const T* __restrict__ q, const int8_t* __restrict__ k_cache,                           \
          const int8_t* __restrict__ v_cache, const float* __restrict__ k_scale,                 \
          const float* __restrict__ v_scale, const int* __restrict__ block_tables,               \
          int bt_stride, const int* __restrict__ seq_lens, float* __restrict__ part_ml,          \
          float* __restrict__ part_acc, int num_kv_heads, int block_shift, int part_size,        \
          int max_parts, float scale_log2) {                                                     \
    pthfa::decode_part_impl<T, D, G>(q, k_cache, v_cache, k_scale, v_scale, block_tables,    \
                                        bt_stride, seq_lens, part_ml, part_acc, num_kv_heads,   \
                                        block_shift, part_size, max_parts, scale_log2);          \
  }

#define PTHFA_REDUCE(TN, T, D)                                                                   \
  extern "C" __global__ void __launch_bounds__(D) pthfa_decode_reduce_##TN##_d##D(              \
      const float* __restrict__ part_ml, const float* __restrict__ part_acc,                     \
      const int* __restrict__ seq_lens, T* __restrict__ out, int num_heads, int part_size,       \
      int max_parts) {                                                                           \
    pthfa::decode_reduce_impl<T, D>(part_ml, part_acc, seq_lens, out, num_heads, part_size,      \
                                    max_parts);                                                  \
  }

#define PTHFA_ALL_G(TN, T, D) \
  PTHFA_PART(TN, T, D, 1)     \
  PTHFA_PART(TN, T, D, 2)     \
  PTHFA_PART(TN, T, D, 4)     \
  PTHFA_PART(TN, T, D, 8)     \
  PTHFA_REDUCE(TN, T, D)

PTHFA_ALL_G(bf16, __nv_bfloat16, 64)
PTHFA_ALL_G(bf16, __nv_bfloat16, 128)
PTHFA_ALL_G(bf16, __nv_bfloat16, 256)
PTHFA_ALL_G(fp16, __half, 64)
PTHFA_ALL_G(fp16, __half, 128)
PTHFA_ALL_G(fp16, __half, 256)
