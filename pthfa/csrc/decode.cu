// pthfa: paged decode attention over the int8 per-token-head KV cache (flash-decoding).
//
// Kernel 1 (pthfa_decode_part_*): one CTA of 128 threads per (partition, kv head, sequence).
// It handles all G = num_heads / num_kv_heads query heads sharing that kv head, so each K/V
// byte is read once. A partition is part_size consecutive tokens of the sequence (a multiple
// of block_size). Each token row of K (head_dim int8 bytes) is read by LPT = head_dim / 16
// lanes with one 16-byte load each; U tokens per lane are in flight before the first use.
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

template <typename T, int D, int G, int U>
__device__ __forceinline__ void decode_part_impl(
    const T* __restrict__ q, const int8_t* __restrict__ k_cache,
    const int8_t* __restrict__ v_cache, const float* __restrict__ k_scale,
    const float* __restrict__ v_scale, const int* __restrict__ block_tables, int bt_stride,
    const int* __restrict__ seq_lens, float* __restrict__ part_ml, float* __restrict__ part_acc,
    int num_kv_heads, int block_shift, int part_size, int max_parts, float scale_log2) {
  constexpr int LPT = D / 16;      // lanes per token row
  constexpr int TPW = 32 / LPT;    // token rows per warp per step
  constexpr int TPI = kWarps * TPW;
  extern __shared__ float smem[];

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
  int* bt_s = reinterpret_cast<int*>(smem);
  float* sc = smem + bt_cap;  // [part_size][G] scores, then probabilities; later [kWarps][G][D]

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int tg = lane / LPT;
  const int sl = lane % LPT;
  const int H = num_kv_heads * G;

  const int* bt = block_tables + (long long)seq * bt_stride + (t0 >> block_shift);
  for (int i = tid; i < nblk; i += kThreads) bt_s[i] = bt[i];

  float qr[G][16];
  {
    const T* qp = q + ((long long)seq * H + (long long)kvh * G) * D + sl * 16;
#pragma unroll
    for (int h = 0; h < G; ++h) {
#pragma unroll
      for (int j = 0; j < 16; ++j) qr[h][j] = Conv<T>::to_float(qp[h * D + j]) * scale_log2;
    }
  }
  __syncthreads();

  const long long row_stride = (long long)num_kv_heads;  // rows of D bytes per slot

  // ---- phase 1: scores
  for (int base = 0; base < n; base += TPI * U) {
    int4 kv[U];
    float ks[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int tl = base + u * TPI + warp * TPW + tg;
      if (tl < n) {
        const int t = t0 + tl;
        const long long slot = ((long long)bt_s[tl >> block_shift] << block_shift) | (t & block_mask);
        const long long srow = slot * row_stride + kvh;
        kv[u] = ldg_stream(reinterpret_cast<const int4*>(k_cache + srow * D + sl * 16));
        ks[u] = __ldg(k_scale + srow);
      } else {
        kv[u] = make_int4(0, 0, 0, 0);
        ks[u] = 0.f;
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      float kf[16];
      s8x16_to_f32(kv[u], kf);
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
      const int tl = base + u * TPI + warp * TPW + tg;
      if (sl == 0 && tl < n) {
#pragma unroll
        for (int h = 0; h < G; ++h) sc[tl * G + h] = s[h] * ks[u];
      }
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
  __syncthreads();

  // ---- phase 3: probabilities times V
  float acc[G][16];
#pragma unroll
  for (int h = 0; h < G; ++h) {
#pragma unroll
    for (int j = 0; j < 16; ++j) acc[h][j] = 0.f;
  }
  for (int base = 0; base < n; base += TPI * U) {
    int4 vv[U];
    float vs[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int tl = base + u * TPI + warp * TPW + tg;
      if (tl < n) {
        const int t = t0 + tl;
        const long long slot = ((long long)bt_s[tl >> block_shift] << block_shift) | (t & block_mask);
        const long long srow = slot * row_stride + kvh;
        vv[u] = ldg_stream(reinterpret_cast<const int4*>(v_cache + srow * D + sl * 16));
        vs[u] = __ldg(v_scale + srow);
      } else {
        vv[u] = make_int4(0, 0, 0, 0);
        vs[u] = 0.f;
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int tl = base + u * TPI + warp * TPW + tg;
      float w[G];
#pragma unroll
      for (int h = 0; h < G; ++h) w[h] = tl < n ? sc[tl * G + h] * vs[u] : 0.f;
      float vf[16];
      s8x16_to_f32(vv[u], vf);
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
  __syncthreads();  // done with sc: reuse it for the cross-warp sum
  float* red = sc;
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
    pthfa::decode_part_impl<T, D, G, 4>(q, k_cache, v_cache, k_scale, v_scale, block_tables,    \
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
