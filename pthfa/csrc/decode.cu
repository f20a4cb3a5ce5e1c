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
    int num_kv_heads, int block_shift, int part_size, int max_parts, float scale_log2,
    long long kv_bstride, long long sc_bstride) {
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

  // rows of D bytes per token of a block; blocks are kv_bstride bytes (K, V) and sc_bstride
  // floats (scales) apart
  const long long row_stride = (long long)num_kv_heads;

  // ---- phase 1: scores
  for (int base = 0; base < n; base += TPI * U) {
    int4 kv[U];
    float ks[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int tl = base + u * TPI + warp * TPW + tg;
      if (tl < n) {
        const int t = t0 + tl;
        const long long blk = bt_s[tl >> block_shift];
        const long long in = (long long)(t & block_mask) * row_stride + kvh;
        kv[u] = ldg_stream(
            reinterpret_cast<const int4*>(k_cache + blk * kv_bstride + in * D + sl * 16));
        ks[u] = __ldg(k_scale + blk * sc_bstride + in);
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
        const long long blk = bt_s[tl >> block_shift];
        const long long in = (long long)(t & block_mask) * row_stride + kvh;
        vv[u] = ldg_stream(
            reinterpret_cast<const int4*>(v_cache + blk * kv_bstride + in * D + sl * 16));
        vs[u] = __ldg(v_scale + blk * sc_bstride + in);
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


// ---------------------------------------------------------------------------------------------
// Tensor-core partition kernel (pthfa_decode_mma_*): same grid, scratch and reduce kernel as
// above, but QK and PV run on mma.sync.m16n8k16 (fp16 operands, fp32 accumulators), and K/V
// are read once in a single online-softmax pass (no shared-memory score buffer).
//
// Warp w of the CTA takes the 16*NS-token steps w, w+4, ... of the partition. Lane (g, t) =
// (lane / 4, lane % 4):
//   QK:  S[16 x 8 tokens] = Qpad[16 heads x 16 dims] . K^T; rows = query heads (G <= 8 real
//        rows, the other rows zero), cols = tokens. The dot product does not care about the
//        order of the dims, so the lane loads the contiguous bytes t*D/4 .. t*D/4 + D/4 - 1 of
//        its token row (b + 8j + g) and Q is loaded in the same permuted order. int8 -> fp16
//        is exact: (x ^ 0x80) goes into the low byte of 0x6400 (= 1024) and 1152 is subtracted.
//        Q is scaled by a power of two into fp16 range (exact for bf16 queries: 8-bit mantissa).
//   softmax: s = S * k_scale * sm_scale*log2(e) (fp32). The running max m tracks
//        s + log2(v_scale): P' = 2^(s + log2 v_scale - m) <= 1 is what multiplies the int8 V,
//        so the per-token V scale is folded into P without leaving fp16 range; l sums
//        2^(s - m) in fp32. The C fragment of QK is the A fragment of PV (FA2 register reuse).
//   PV:  O[16 x 8 dims] += P'[16 x 16 tokens] . V; A rows 0..7 hold fp16(P') of the head rows,
//        rows 8..15 (padding in QK) hold the rounding remainder fp16(P' - fp16(P')), so
//        O = C[g] + C[g + 8] carries P' to ~2^-22 at no extra mma. B = V needs token pairs per
//        dim: the lane loads dims g*D/8 .. g*D/8 + D/8 - 1 of tokens b + {2t, 2t+1, 8+2t, 9+2t}
//        and interleaves the bytes of two tokens with one prmt.
// The four warps' (m, l, O) merge through shared memory into one (m, l, acc) per partition.
namespace mmak {

__device__ __forceinline__ uint32_t h2_from_ob(uint32_t u, uint32_t sel) {
  // u holds offset-binary bytes (x + 128); sel moves two of them into the low bytes of two
  // halves whose high byte is 0x64: 1024 + (x + 128); minus 1152 (0x6480) gives x, exactly.
  const uint32_t h = __byte_perm(u, 0x64646464u, sel);
  uint32_t r;
  asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(h), "r"(0x64806480u));
  return r;
}

__device__ __forceinline__ void mma16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float lg2(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ uint32_t pack_h2(float lo, float hi) {
  __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

__device__ __forceinline__ float2 unpack_h2(uint32_t v) {
  return __half22float2(*reinterpret_cast<__half2*>(&v));
}

template <int W>
__device__ __forceinline__ void load_words(const int8_t* p, uint32_t (&w)[W]) {
  if constexpr (W == 2) {
    uint2 r;
    asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];"
                 : "=r"(r.x), "=r"(r.y) : "l"(p));
    w[0] = r.x;
    w[1] = r.y;
  } else {
#pragma unroll
    for (int i = 0; i < W / 4; ++i) {
      const int4 r = ldg_stream(reinterpret_cast<const int4*>(p) + i);
      w[4 * i + 0] = static_cast<uint32_t>(r.x);
      w[4 * i + 1] = static_cast<uint32_t>(r.y);
      w[4 * i + 2] = static_cast<uint32_t>(r.z);
      w[4 * i + 3] = static_cast<uint32_t>(r.w);
    }
  }
}

}  // namespace mmak

template <typename T, int D, int NS>
__device__ __forceinline__ void decode_mma_impl(
    const T* __restrict__ q, const int8_t* __restrict__ k_cache,
    const int8_t* __restrict__ v_cache, const float* __restrict__ k_scale,
    const float* __restrict__ v_scale, const int* __restrict__ block_tables, int bt_stride,
    const int* __restrict__ seq_lens, float* __restrict__ part_ml, float* __restrict__ part_acc,
    int num_kv_heads, int G, int block_shift, int part_size, int max_parts, float scale_log2,
    long long kv_bstride, long long sc_bstride) {
  using namespace mmak;
  constexpr int KW = D / 16;  // K words per lane per token = k-chunks of 16 dims
  constexpr int VW = D / 32;  // V words per lane per token
  constexpr int NT = D / 8;   // PV n-tiles
  constexpr int TPI = 16 * NS;
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
  float* red_ml = smem + bt_cap;          // [kWarps][8][2]
  float* red_acc = red_ml + kWarps * 16;  // [kWarps][G][D]

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int H = num_kv_heads * G;

  const int* bt = block_tables + (long long)seq * bt_stride + (t0 >> block_shift);
  for (int i = tid; i < nblk; i += kThreads) bt_s[i] = bt[i];

  // Q: head g (zero rows for g >= G), dims t*D/4 .. t*D/4 + D/4 - 1, scaled by 2^e into fp16.
  uint32_t qa[KW][2];
  float qscale;
  {
    float qf[D / 4];
    const bool hv = g < G;
    const T* qp = q + ((long long)seq * H + (long long)kvh * G + (hv ? g : 0)) * D + t * (D / 4);
    float amax = 0.f;
#pragma unroll
    for (int j = 0; j < D / 4; ++j) {
      qf[j] = hv ? Conv<T>::to_float(qp[j]) : 0.f;
      amax = fmaxf(amax, fabsf(qf[j]));
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    int e = 0;
    if (amax > 0.f && amax < INFINITY) {
      int ex;
      frexpf(amax, &ex);  // amax < 2^ex
      e = min(max(15 - ex, -120), 120);
    }
    const float f = ldexpf(1.f, e);
#pragma unroll
    for (int c = 0; c < KW; ++c) {
      qa[c][0] = pack_h2(qf[4 * c + 0] * f, qf[4 * c + 1] * f);
      qa[c][1] = pack_h2(qf[4 * c + 2] * f, qf[4 * c + 3] * f);
    }
    qscale = scale_log2 * ldexpf(1.f, -e);
  }
  __syncthreads();

  const long long nkvh = num_kv_heads;
  const bool fast = block_shift >= 4;
  const int last16 = (n - 1) & ~15;

  float m_run = -INFINITY;
  float l_run = 0.f;
  float acc[NT][4];
#pragma unroll
  for (int i = 0; i < NT; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;

  const int nit = (n + TPI - 1) / TPI;
  for (int it = warp; it < nit; it += kWarps) {
    const int base = it * TPI;
    uint32_t kr[NS][2][KW];
    uint32_t vr[NS][4][VW];
    float ks[NS][4], vs[NS][4];
#pragma unroll
    for (int s = 0; s < NS; ++s) {
      const int b16 = base + 16 * s;
      // byte offsets of the K rows (rk) and V rows (rv) in k_cache / v_cache, and the float
      // offsets of the V rows' tokens in the scales (sv)
      long long rk[2], rv[4], sv[4];
      if (fast) {
        const int bc = min(b16, last16);
        const long long blk = bt_s[bc >> block_shift];
        const long long in0 = (long long)((t0 + bc) & block_mask) * nkvh + kvh;
        const long long k0 = blk * kv_bstride + in0 * D;
        const long long s0 = blk * sc_bstride + in0;
        rk[0] = k0 + g * nkvh * D;
        rk[1] = k0 + (8 + g) * nkvh * D;
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const long long d = ((r >> 1) * 8 + 2 * t + (r & 1)) * nkvh;
          rv[r] = k0 + d * D;
          sv[r] = s0 + d;
        }
      } else {
        auto at = [&](int tl, long long& so) -> long long {
          const int c = min(tl, n - 1);
          const long long blk = bt_s[c >> block_shift];
          const long long in = (long long)((t0 + c) & block_mask) * nkvh + kvh;
          so = blk * sc_bstride + in;
          return blk * kv_bstride + in * D;
        };
        long long unused;
        rk[0] = at(b16 + g, unused);
        rk[1] = at(b16 + 8 + g, unused);
#pragma unroll
        for (int r = 0; r < 4; ++r) rv[r] = at(b16 + (r >> 1) * 8 + 2 * t + (r & 1), sv[r]);
      }
#pragma unroll
      for (int j = 0; j < 2; ++j) load_words<KW>(k_cache + rk[j] + t * (D / 4), kr[s][j]);
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        load_words<VW>(v_cache + rv[r] + g * (D / 8), vr[s][r]);
        ks[s][r] = __ldg(k_scale + sv[r]);
        vs[s][r] = __ldg(v_scale + sv[r]);
      }
    }

    // QK and the scores of row g: tokens b16 + 8j + 2t + e  <->  index r = 2j + e
    float sl[NS][4], sp[NS][4];
    float mx = -INFINITY;
#pragma unroll
    for (int s = 0; s < NS; ++s) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        float c[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int cc = 0; cc < KW; ++cc) {
          const uint32_t u = kr[s][j][cc] ^ 0x80808080u;
          mma16816(c, qa[cc][0], 0u, qa[cc][1], 0u, h2_from_ob(u, 0x4140), h2_from_ob(u, 0x4342));
        }
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int r = 2 * j + e;
          const bool valid = base + 16 * s + 8 * j + 2 * t + e < n;
          const float x = c[e] * (ks[s][r] * qscale);
          sl[s][r] = valid ? x : -INFINITY;
          sp[s][r] = valid ? x + lg2(fmaxf(vs[s][r], 1e-30f)) : -INFINITY;
          mx = fmaxf(mx, sp[s][r]);
        }
      }
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(m_run, mx);
    if (__any_sync(0xffffffffu, m_new > m_run)) {
      const float alpha = ex2(m_run - m_new);
      l_run *= alpha;
#pragma unroll
      for (int i = 0; i < NT; ++i) {
        acc[i][0] *= alpha;
        acc[i][1] *= alpha;
        acc[i][2] *= alpha;
        acc[i][3] *= alpha;
      }
    }
    m_run = m_new;

#pragma unroll
    for (int s = 0; s < NS; ++s) {
      uint32_t ph[2], pl[2];
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const float p0 = ex2(sp[s][2 * j] - m_new);
        const float p1 = ex2(sp[s][2 * j + 1] - m_new);
        l_run += ex2(sl[s][2 * j] - m_new) + ex2(sl[s][2 * j + 1] - m_new);
        ph[j] = pack_h2(p0, p1);
        const float2 back = unpack_h2(ph[j]);
        pl[j] = pack_h2(p0 - back.x, p1 - back.y);
      }
#pragma unroll
      for (int w = 0; w < VW; ++w) {
        const uint32_t u0 = vr[s][0][w] ^ 0x80808080u, u1 = vr[s][1][w] ^ 0x80808080u;
        const uint32_t u2 = vr[s][2][w] ^ 0x80808080u, u3 = vr[s][3][w] ^ 0x80808080u;
        const uint32_t x01 = __byte_perm(u0, u1, 0x5140), y01 = __byte_perm(u0, u1, 0x7362);
        const uint32_t x23 = __byte_perm(u2, u3, 0x5140), y23 = __byte_perm(u2, u3, 0x7362);
        mma16816(acc[4 * w + 0], ph[0], pl[0], ph[1], pl[1], h2_from_ob(x01, 0x4140),
                 h2_from_ob(x23, 0x4140));
        mma16816(acc[4 * w + 1], ph[0], pl[0], ph[1], pl[1], h2_from_ob(x01, 0x4342),
                 h2_from_ob(x23, 0x4342));
        mma16816(acc[4 * w + 2], ph[0], pl[0], ph[1], pl[1], h2_from_ob(y01, 0x4140),
                 h2_from_ob(y23, 0x4140));
        mma16816(acc[4 * w + 3], ph[0], pl[0], ph[1], pl[1], h2_from_ob(y01, 0x4342),
                 h2_from_ob(y23, 0x4342));
      }
    }
  }

  // ---- merge the four warps
  l_run += __shfl_xor_sync(0xffffffffu, l_run, 1);
  l_run += __shfl_xor_sync(0xffffffffu, l_run, 2);
  if (t == 0) {
    red_ml[(warp * 8 + g) * 2 + 0] = m_run;
    red_ml[(warp * 8 + g) * 2 + 1] = l_run;
  }
  if (g < G) {
    float* ra = red_acc + (warp * G + g) * D;
#pragma unroll
    for (int i = 0; i < NT; ++i) {
      ra[(2 * t) * (D / 8) + i] = acc[i][0] + acc[i][2];
      ra[(2 * t + 1) * (D / 8) + i] = acc[i][1] + acc[i][3];
    }
  }
  __syncthreads();
  for (int i = tid; i < G * D; i += kThreads) {
    const int h = i / D;
    const int d = i % D;
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) M = fmaxf(M, red_ml[(w * 8 + h) * 2]);
    float L = 0.f, a = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float wt = ex2(red_ml[(w * 8 + h) * 2] - M);
      L = fmaf(wt, red_ml[(w * 8 + h) * 2 + 1], L);
      a = fmaf(wt, red_acc[(w * G + h) * D + d], a);
    }
    const long long o = ((long long)seq * H + kvh * G + h) * max_parts + part;
    part_acc[o * D + d] = a;
    if (d == 0) {
      part_ml[o * 2 + 0] = M;
      part_ml[o * 2 + 1] = L;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Pipelined tensor-core partition kernel (pthfa_decode_cp<S>_*): the math of mma1 (16-token
// warp steps, same fragments, same online softmax), but each warp streams its steps through a
// private S-stage ring in shared memory with cp.async: while step i is computed, steps
// i+1 .. i+S-1 are in flight, so the warp never waits for a full DRAM round trip per step.
// A step is 16 token rows of K and V (D bytes each, rows padded to D + 16 bytes so the
// fragment reads are free of bank conflicts) plus the 16 k and v scales; the warp copies it
// coalesced (8 lanes per 128-byte row) and, after cp.async.wait_group + __syncwarp, each lane
// reads the same fragments mma1 loads from global memory. The ring is reused for the merge of
// the four warps after the loop.
namespace mmak {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void cp_async16(uint32_t s, const void* g) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(g) : "memory");
}

__device__ __forceinline__ void cp_async4(uint32_t s, const void* g) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(s), "l"(g) : "memory");
}

__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

template <int N>
__device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

}  // namespace mmak

template <int D>
struct CpLayout {
  static constexpr int RS = D + 16;                  // padded row stride in shared memory
  static constexpr int VOFF = 16 * RS;               // V rows after the 16 K rows
  static constexpr int SOFF = 32 * RS;               // 16 k scales, then 16 v scales
  static constexpr int STAGE = 32 * RS + 2 * 16 * 4;  // bytes per stage (a multiple of 16)
};

// The reduce, fused into the partition kernel (one launch instead of two): every CTA of a
// (sequence, kv head) counts itself in counters[seq * num_kv_heads + kvh] once its partial
// results are written, and the last one to arrive merges the partitions of its G query heads
// into ``out``, as decode_reduce_impl does, then sets the counter back to 0 for the next call.
// A partition past the sequence's end counts too (it has nothing to write). Orders: each CTA's
// writes, then __threadfence, then its atomicAdd; the last one's reads after a __threadfence,
// through L2 (__ldcg), since other SMs wrote them.
template <typename T, int D>
__device__ __noinline__ void fused_reduce(const float* part_ml, const float* part_acc,
                                          int seq_len, T* __restrict__ out,
                                          int* __restrict__ counters, int seq, int kvh, int G,
                                          int num_kv_heads, int part_size, int max_parts) {
  __shared__ int last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    int* c = counters + (long long)seq * num_kv_heads + kvh;
    last = atomicAdd(c, 1) == (int)gridDim.x - 1;
    if (last) *c = 0;  // every CTA of this call has arrived: nothing reads it again
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  const int np = seq_len > 0 ? (seq_len + part_size - 1) / part_size : 0;
  const int H = num_kv_heads * G;
  // four dims a thread (float4 loads of the partials), the partition loops unrolled so their
  // loads are in flight together: this CTA holds an SM slot while it merges
  for (int i = threadIdx.x; i < G * D / 4; i += blockDim.x) {
    const int h = kvh * G + (i * 4) / D;
    const int d = (i * 4) % D;
    T* o = out + ((long long)seq * H + h) * D + d;
    float4 a = make_float4(0.f, 0.f, 0.f, 0.f);
    if (np > 0) {
      const long long base = ((long long)seq * H + h) * max_parts;
      const float2* ml = reinterpret_cast<const float2*>(part_ml) + base;
      float M = -INFINITY;
#pragma unroll 4
      for (int p = 0; p < np; ++p) M = fmaxf(M, __ldcg(ml + p).x);
      float L = 0.f;
#pragma unroll 4
      for (int p = 0; p < np; ++p) {
        const float2 x = __ldcg(ml + p);
        const float w = exp2f(x.x - M);
        const float4 v = __ldcg(reinterpret_cast<const float4*>(part_acc + (base + p) * D + d));
        L = fmaf(w, x.y, L);
        a.x = fmaf(w, v.x, a.x);
        a.y = fmaf(w, v.y, a.y);
        a.z = fmaf(w, v.z, a.z);
        a.w = fmaf(w, v.w, a.w);
      }
      const float inv = 1.f / L;
      a.x *= inv;
      a.y *= inv;
      a.z *= inv;
      a.w *= inv;
    }
    o[0] = Conv<T>::from_float(a.x);
    o[1] = Conv<T>::from_float(a.y);
    o[2] = Conv<T>::from_float(a.z);
    o[3] = Conv<T>::from_float(a.w);
  }
}

// P selects a measurement probe (built only with -DPTHFA_PROBES, see bench/pthfa_roofline.py);
// 0 is the kernel itself. 1: the loads and waits only, no math; 2: no scale loads; 3: the grid
// with kv heads fastest (blockIdx.x = kv head, blockIdx.y = partition); 4: as 1 and 5: as 0,
// over a head-major cache [block, kv head, offset] (same bytes, a head's rows contiguous).
template <typename T, int D, int S, int P = 0>
__device__ __forceinline__ void decode_cp_impl(
    const T* __restrict__ q, const int8_t* __restrict__ k_cache,
    const int8_t* __restrict__ v_cache, const float* __restrict__ k_scale,
    const float* __restrict__ v_scale, const int* __restrict__ block_tables, int bt_stride,
    const int* __restrict__ seq_lens, float* __restrict__ part_ml, float* __restrict__ part_acc,
    T* __restrict__ out, int* __restrict__ counters, int num_kv_heads, int G, int block_shift,
    int part_size, int max_parts, float scale_log2, long long kv_bstride, long long sc_bstride) {
  using namespace mmak;
  using L = CpLayout<D>;
  constexpr int KW = D / 16;   // K words per lane per token = k-chunks of 16 dims
  constexpr int VW = D / 32;   // V words per lane per token
  constexpr int NT = D / 8;    // PV n-tiles
  constexpr int CPR = D / 16;  // 16-byte chunks per row
  constexpr int CPL = D / 32;  // chunks per lane per matrix per step (16 rows)
  extern __shared__ __align__(16) float smem[];

  const int part = P == 3 ? blockIdx.y : blockIdx.x;
  const int kvh = P == 3 ? blockIdx.x : blockIdx.y;
  const int seq = blockIdx.z;
  const int seq_len = seq_lens[seq];
  const int t0 = part * part_size;
  if (t0 >= seq_len) {
    if (counters != nullptr)
      fused_reduce<T, D>(part_ml, part_acc, seq_len, out, counters, seq, kvh, G, num_kv_heads,
                         part_size, max_parts);
    return;
  }
  const int n = min(part_size, seq_len - t0);
  const int block_mask = (1 << block_shift) - 1;
  const int nblk = (n + block_mask) >> block_shift;
  const int bt_cap = ((part_size >> block_shift) + 3) & ~3;
  int* bt_s = reinterpret_cast<int*>(smem);
  float* red_ml = smem + bt_cap;                                // [kWarps][8][2]
  char* ring = reinterpret_cast<char*>(red_ml + kWarps * 16);   // [kWarps][S][STAGE]
  float* red_acc = reinterpret_cast<float*>(ring);              // [kWarps][G][D], after the loop

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int H = num_kv_heads * G;

  // the query's raw values first (independent of the block table), then the table slice
  float qf[D / 4];
  {
    const bool hv = g < G;
    const T* qp = q + ((long long)seq * H + (long long)kvh * G + (hv ? g : 0)) * D + t * (D / 4);
#pragma unroll
    for (int j = 0; j < D / 4; ++j) qf[j] = hv ? Conv<T>::to_float(qp[j]) : 0.f;
  }
  const int* bt = block_tables + (long long)seq * bt_stride + (t0 >> block_shift);
  for (int i = tid; i < nblk; i += kThreads) bt_s[i] = bt[i];
  __syncthreads();

  const long long nkvh = num_kv_heads;
  const bool fast = block_shift >= 4;
  char* wring = ring + warp * (S * L::STAGE);
  const uint32_t wring_s = smem_u32(wring);

  // a row's place: [block, offset, kv head] (vLLM's layout), blocks kv_bstride bytes apart in
  // k_cache / v_cache and sc_bstride floats apart in the scales; the probes P >= 4 read the
  // head-major layout [block, kv head, offset] instead, a head's rows of a block contiguous.
  // row_of returns the row's byte offset in k_cache / v_cache and sets its scale's offset.
  constexpr bool kHeadMajor = P >= 4;
  auto row_of = [&](int tl, long long& so) -> long long {
    const int c = min(tl, n - 1);
    const long long blk = bt_s[c >> block_shift];
    const int off = (t0 + c) & block_mask;
    long long in;
    if constexpr (kHeadMajor) {
      in = ((long long)kvh << block_shift) | off;
    } else {
      in = (long long)off * nkvh + kvh;
    }
    so = blk * sc_bstride + in;
    return blk * kv_bstride + in * D;
  };
  const long long rstride = kHeadMajor ? 1 : nkvh;  // between consecutive tokens of a block
  auto issue = [&](int it, int slot) {
    const int b16 = it * 16;
    const uint32_t sb = wring_s + slot * L::STAGE;
    long long s0 = 0;
    const long long k0 = fast ? row_of(b16, s0) : 0;
#pragma unroll
    for (int k = 0; k < CPL; ++k) {
      const int c = lane + 32 * k;
      const int r = c / CPR;
      const int col = c % CPR;
      long long unused;
      const long long kr = fast ? k0 + r * rstride * D : row_of(b16 + r, unused);
      cp_async16(sb + r * L::RS + col * 16, k_cache + kr + col * 16);
      cp_async16(sb + L::VOFF + r * L::RS + col * 16, v_cache + kr + col * 16);
    }
    if constexpr (P != 2) {
      const int r = lane & 15;
      long long sr = s0 + r * rstride;
      if (!fast) row_of(b16 + r, sr);
      if (lane < 16) {
        cp_async4(sb + L::SOFF + r * 4, k_scale + sr);
      } else {
        cp_async4(sb + L::SOFF + 64 + r * 4, v_scale + sr);
      }
    }
  };

  const int nit = (n + 15) / 16;
  const int cnt = nit > warp ? (nit - warp + kWarps - 1) / kWarps : 0;
#pragma unroll
  for (int s = 0; s < S - 1; ++s) {
    if (s < cnt) issue(warp + kWarps * s, s);
    cp_commit();
  }

  // Q: head g (zero rows for g >= G), dims t*D/4 .. t*D/4 + D/4 - 1, scaled by 2^e into fp16.
  uint32_t qa[KW][2];
  float qscale;
  {
    float amax = 0.f;
#pragma unroll
    for (int j = 0; j < D / 4; ++j) amax = fmaxf(amax, fabsf(qf[j]));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    int e = 0;
    if (amax > 0.f && amax < INFINITY) {
      int ex;
      frexpf(amax, &ex);  // amax < 2^ex
      e = min(max(15 - ex, -120), 120);
    }
    const float f = ldexpf(1.f, e);
#pragma unroll
    for (int c = 0; c < KW; ++c) {
      qa[c][0] = pack_h2(qf[4 * c + 0] * f, qf[4 * c + 1] * f);
      qa[c][1] = pack_h2(qf[4 * c + 2] * f, qf[4 * c + 3] * f);
    }
    qscale = scale_log2 * ldexpf(1.f, -e);
  }

  float m_run = -INFINITY;
  float l_run = 0.f;
  float acc[NT][4];
#pragma unroll
  for (int i = 0; i < NT; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;

  int slot = 0;
  int nslot = S - 1;
  for (int i = 0; i < cnt; ++i) {
    if (i + S - 1 < cnt) issue(warp + kWarps * (i + S - 1), nslot);
    cp_commit();
    nslot = nslot + 1 == S ? 0 : nslot + 1;
    cp_wait<S - 1>();
    __syncwarp();

    const char* sb = wring + slot * L::STAGE;
    slot = slot + 1 == S ? 0 : slot + 1;
    const int base = (warp + kWarps * i) * 16;
    if constexpr (P == 1 || P == 4) {
      __syncwarp();
      continue;
    }
    float ks[4], vs[4];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const float2 a = *reinterpret_cast<const float2*>(sb + L::SOFF + (8 * j + 2 * t) * 4);
      const float2 b = *reinterpret_cast<const float2*>(sb + L::SOFF + 64 + (8 * j + 2 * t) * 4);
      ks[2 * j] = a.x;
      ks[2 * j + 1] = a.y;
      vs[2 * j] = b.x;
      vs[2 * j + 1] = b.y;
    }

    // QK and the scores of row g: tokens base + 8j + 2t + e  <->  index r = 2j + e
    float sl[4], sp[4];
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      float c[4] = {0.f, 0.f, 0.f, 0.f};
      const uint4* kp = reinterpret_cast<const uint4*>(sb + (8 * j + g) * L::RS + t * (D / 4));
#pragma unroll
      for (int c4 = 0; c4 < KW / 4; ++c4) {
        const uint4 kw = kp[c4];
        const uint32_t kk[4] = {kw.x, kw.y, kw.z, kw.w};
#pragma unroll
        for (int x = 0; x < 4; ++x) {
          const int cc = 4 * c4 + x;
          const uint32_t u = kk[x] ^ 0x80808080u;
          mma16816(c, qa[cc][0], 0u, qa[cc][1], 0u, h2_from_ob(u, 0x4140),
                   h2_from_ob(u, 0x4342));
        }
      }
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int r = 2 * j + e;
        const bool valid = base + 8 * j + 2 * t + e < n;
        const float x = c[e] * (ks[r] * qscale);
        sl[r] = valid ? x : -INFINITY;
        sp[r] = valid ? x + lg2(fmaxf(vs[r], 1e-30f)) : -INFINITY;
        mx = fmaxf(mx, sp[r]);
      }
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(m_run, mx);
    if (__any_sync(0xffffffffu, m_new > m_run)) {
      const float alpha = ex2(m_run - m_new);
      l_run *= alpha;
#pragma unroll
      for (int k = 0; k < NT; ++k) {
        acc[k][0] *= alpha;
        acc[k][1] *= alpha;
        acc[k][2] *= alpha;
        acc[k][3] *= alpha;
      }
    }
    m_run = m_new;

    uint32_t ph[2], pl[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const float p0 = ex2(sp[2 * j] - m_new);
      const float p1 = ex2(sp[2 * j + 1] - m_new);
      l_run += ex2(sl[2 * j] - m_new) + ex2(sl[2 * j + 1] - m_new);
      ph[j] = pack_h2(p0, p1);
      const float2 back = unpack_h2(ph[j]);
      pl[j] = pack_h2(p0 - back.x, p1 - back.y);
    }
    uint32_t vr[4][VW];
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const char* p = sb + L::VOFF + ((r >> 1) * 8 + 2 * t + (r & 1)) * L::RS + g * (D / 8);
      if constexpr (VW == 2) {
        const uint2 x = *reinterpret_cast<const uint2*>(p);
        vr[r][0] = x.x;
        vr[r][1] = x.y;
      } else {
#pragma unroll
        for (int w = 0; w < VW; w += 4) {
          const uint4 x = *reinterpret_cast<const uint4*>(p + 4 * w);
          vr[r][w] = x.x;
          vr[r][w + 1] = x.y;
          vr[r][w + 2] = x.z;
          vr[r][w + 3] = x.w;
        }
      }
    }
    __syncwarp();  // every lane has its fragments: the slot may be refilled
#pragma unroll
    for (int w = 0; w < VW; ++w) {
      const uint32_t u0 = vr[0][w] ^ 0x80808080u, u1 = vr[1][w] ^ 0x80808080u;
      const uint32_t u2 = vr[2][w] ^ 0x80808080u, u3 = vr[3][w] ^ 0x80808080u;
      const uint32_t x01 = __byte_perm(u0, u1, 0x5140), y01 = __byte_perm(u0, u1, 0x7362);
      const uint32_t x23 = __byte_perm(u2, u3, 0x5140), y23 = __byte_perm(u2, u3, 0x7362);
      mma16816(acc[4 * w + 0], ph[0], pl[0], ph[1], pl[1], h2_from_ob(x01, 0x4140),
               h2_from_ob(x23, 0x4140));
      mma16816(acc[4 * w + 1], ph[0], pl[0], ph[1], pl[1], h2_from_ob(x01, 0x4342),
               h2_from_ob(x23, 0x4342));
      mma16816(acc[4 * w + 2], ph[0], pl[0], ph[1], pl[1], h2_from_ob(y01, 0x4140),
               h2_from_ob(y23, 0x4140));
      mma16816(acc[4 * w + 3], ph[0], pl[0], ph[1], pl[1], h2_from_ob(y01, 0x4342),
               h2_from_ob(y23, 0x4342));
    }
  }
  cp_wait<0>();  // only empty groups can be left, but the ring is about to be reused
  __syncthreads();

  // ---- merge the four warps (red_acc overlays the ring)
  l_run += __shfl_xor_sync(0xffffffffu, l_run, 1);
  l_run += __shfl_xor_sync(0xffffffffu, l_run, 2);
  if (t == 0) {
    red_ml[(warp * 8 + g) * 2 + 0] = m_run;
    red_ml[(warp * 8 + g) * 2 + 1] = l_run;
  }
  if (g < G) {
    float* ra = red_acc + (warp * G + g) * D;
#pragma unroll
    for (int k = 0; k < NT; ++k) {
      ra[(2 * t) * (D / 8) + k] = acc[k][0] + acc[k][2];
      ra[(2 * t + 1) * (D / 8) + k] = acc[k][1] + acc[k][3];
    }
  }
  __syncthreads();
  for (int i = tid; i < G * D; i += kThreads) {
    const int h = i / D;
    const int d = i % D;
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) M = fmaxf(M, red_ml[(w * 8 + h) * 2]);
    float Ls = 0.f, a = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float wt = ex2(red_ml[(w * 8 + h) * 2] - M);
      Ls = fmaf(wt, red_ml[(w * 8 + h) * 2 + 1], Ls);
      a = fmaf(wt, red_acc[(w * G + h) * D + d], a);
    }
    const long long o = ((long long)seq * H + kvh * G + h) * max_parts + part;
    part_acc[o * D + d] = a;
    if (d == 0) {
      part_ml[o * 2 + 0] = M;
      part_ml[o * 2 + 1] = Ls;
    }
  }
  if (counters != nullptr)
    fused_reduce<T, D>(part_ml, part_acc, seq_len, out, counters, seq, kvh, G, num_kv_heads,
                       part_size, max_parts);
}

// ---------------------------------------------------------------------------------------------
// Whole-block tensor-core partition kernel (pthfa_decode_wb<S>_*): one CTA per (partition,
// sequence) for all NW = num_kv_heads KV heads, warp w computing KV head w with cp3's math
// (its G query rows, the same fragments, online softmax and P remainder). The CTA copies each
// 16-token step of every head at once: the step's K rows of all heads (16 x NW x D bytes, one
// contiguous run of the block), then the V rows, then the scales, so a block is read as a few
// contiguous runs instead of NW heads' rows 1 KiB apart. The steps go through a CTA-wide
// S-stage ring (stage = NW warp stages of cp3's layout); a warp's partition result needs no
// merge: it writes (m, l) and its accumulators straight to the scratch, and the reduce kernel
// runs as for cp3. Needs block_size >= 16 (a step inside one block).
template <typename T, int D, int S, int NW>
__device__ __forceinline__ void decode_wb_impl(
    const T* __restrict__ q, const int8_t* __restrict__ k_cache,
    const int8_t* __restrict__ v_cache, const float* __restrict__ k_scale,
    const float* __restrict__ v_scale, const int* __restrict__ block_tables, int bt_stride,
    const int* __restrict__ seq_lens, float* __restrict__ part_ml, float* __restrict__ part_acc,
    int G, int block_shift, int part_size, int max_parts, float scale_log2,
    long long kv_bstride, long long sc_bstride) {
  using namespace mmak;
  using L = CpLayout<D>;
  constexpr int KW = D / 16;
  constexpr int VW = D / 32;
  constexpr int NT = D / 8;
  constexpr int CPR = D / 16;              // 16-byte chunks per row
  constexpr int NTH = NW * 32;
  constexpr int HSTAGE = L::STAGE;         // one head's part of a stage
  constexpr int STAGE = NW * HSTAGE;
  constexpr int CHUNKS = 16 * NW * CPR;    // 16-byte chunks of K (or V) per step
  extern __shared__ __align__(16) float smem[];

  const int part = blockIdx.x;
  const int seq = blockIdx.z;
  const int seq_len = seq_lens[seq];
  const int t0 = part * part_size;
  if (t0 >= seq_len) return;
  const int n = min(part_size, seq_len - t0);
  const int block_mask = (1 << block_shift) - 1;
  const int nblk = (n + block_mask) >> block_shift;
  const int bt_cap = ((part_size >> block_shift) + 3) & ~3;
  int* bt_s = reinterpret_cast<int*>(smem);
  char* ring = reinterpret_cast<char*>(smem + bt_cap);  // [S][NW][HSTAGE]

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;  // = kv head
  const int g = lane >> 2;
  const int t = lane & 3;
  const int H = NW * G;

  float qf[D / 4];
  {
    const bool hv = g < G;
    const T* qp = q + ((long long)seq * H + (long long)warp * G + (hv ? g : 0)) * D + t * (D / 4);
#pragma unroll
    for (int j = 0; j < D / 4; ++j) qf[j] = hv ? Conv<T>::to_float(qp[j]) : 0.f;
  }
  const int* bt = block_tables + (long long)seq * bt_stride + (t0 >> block_shift);
  for (int i = tid; i < nblk; i += NTH) bt_s[i] = bt[i];
  __syncthreads();

  const uint32_t ring_s = smem_u32(ring);
  // step it: tokens t0 + 16 it .. +15, inside one block (block_size >= 16, parts multiples)
  auto issue = [&](int it, int slot) {
    const int b16 = it * 16;
    const long long blk = bt_s[b16 >> block_shift];
    const long long in0 = (long long)((t0 + b16) & block_mask) * NW;  // first row of the step
    const int8_t* kb = k_cache + blk * kv_bstride + in0 * D;
    const int8_t* vb = v_cache + blk * kv_bstride + in0 * D;
    const uint32_t sb = ring_s + slot * STAGE;
#pragma unroll
    for (int c = tid; c < CHUNKS; c += NTH) {
      const int row = c / CPR;  // token * NW + head, as in global memory
      const int col = c % CPR;
      const int r = row / NW;
      const int h = row % NW;
      const uint32_t d = sb + h * HSTAGE + r * L::RS + col * 16;
      cp_async16(d, kb + (long long)row * D + col * 16);
      cp_async16(d + L::VOFF, vb + (long long)row * D + col * 16);
    }
    const float* ksb = k_scale + blk * sc_bstride + in0;
    const float* vsb = v_scale + blk * sc_bstride + in0;
    for (int c = tid; c < 16 * NW; c += NTH) {
      const int r = c / NW;
      const int h = c % NW;
      const uint32_t d = sb + h * HSTAGE + L::SOFF + r * 4;
      cp_async4(d, ksb + c);
      cp_async4(d + 64, vsb + c);
    }
  };

  const int cnt = (n + 15) / 16;
#pragma unroll
  for (int s = 0; s < S - 1; ++s) {
    if (s < cnt) issue(s, s);
    cp_commit();
  }

  uint32_t qa[KW][2];
  float qscale;
  {
    float amax = 0.f;
#pragma unroll
    for (int j = 0; j < D / 4; ++j) amax = fmaxf(amax, fabsf(qf[j]));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    int e = 0;
    if (amax > 0.f && amax < INFINITY) {
      int ex;
      frexpf(amax, &ex);
      e = min(max(15 - ex, -120), 120);
    }
    const float f = ldexpf(1.f, e);
#pragma unroll
    for (int c = 0; c < KW; ++c) {
      qa[c][0] = pack_h2(qf[4 * c + 0] * f, qf[4 * c + 1] * f);
      qa[c][1] = pack_h2(qf[4 * c + 2] * f, qf[4 * c + 3] * f);
    }
    qscale = scale_log2 * ldexpf(1.f, -e);
  }

  float m_run = -INFINITY;
  float l_run = 0.f;
  float acc[NT][4];
#pragma unroll
  for (int i = 0; i < NT; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;

  int slot = 0;
  int nslot = S - 1;
  for (int i = 0; i < cnt; ++i) {
    __syncthreads();  // every warp is done with the slot refilled next (step i - 1's)
    if (i + S - 1 < cnt) issue(i + S - 1, nslot);
    cp_commit();
    nslot = nslot + 1 == S ? 0 : nslot + 1;
    cp_wait<S - 1>();
    __syncthreads();  // every thread's copies of step i have landed

    const char* sb = ring + slot * STAGE + warp * HSTAGE;
    slot = slot + 1 == S ? 0 : slot + 1;
    const int base = i * 16;
    float ks[4], vs[4];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const float2 a = *reinterpret_cast<const float2*>(sb + L::SOFF + (8 * j + 2 * t) * 4);
      const float2 b = *reinterpret_cast<const float2*>(sb + L::SOFF + 64 + (8 * j + 2 * t) * 4);
      ks[2 * j] = a.x;
      ks[2 * j + 1] = a.y;
      vs[2 * j] = b.x;
      vs[2 * j + 1] = b.y;
    }
    float sl[4], sp[4];
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      float c[4] = {0.f, 0.f, 0.f, 0.f};
      const uint4* kp = reinterpret_cast<const uint4*>(sb + (8 * j + g) * L::RS + t * (D / 4));
#pragma unroll
      for (int c4 = 0; c4 < KW / 4; ++c4) {
        const uint4 kw = kp[c4];
        const uint32_t kk[4] = {kw.x, kw.y, kw.z, kw.w};
#pragma unroll
        for (int x = 0; x < 4; ++x) {
          const int cc = 4 * c4 + x;
          const uint32_t u = kk[x] ^ 0x80808080u;
          mma16816(c, qa[cc][0], 0u, qa[cc][1], 0u, h2_from_ob(u, 0x4140),
                   h2_from_ob(u, 0x4342));
        }
      }
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int r = 2 * j + e;
        const bool valid = base + 8 * j + 2 * t + e < n;
        const float x = c[e] * (ks[r] * qscale);
        sl[r] = valid ? x : -INFINITY;
        sp[r] = valid ? x + lg2(fmaxf(vs[r], 1e-30f)) : -INFINITY;
        mx = fmaxf(mx, sp[r]);
      }
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(m_run, mx);
    if (__any_sync(0xffffffffu, m_new > m_run)) {
      const float alpha = ex2(m_run - m_new);
      l_run *= alpha;
#pragma unroll
      for (int k = 0; k < NT; ++k) {
        acc[k][0] *= alpha;
        acc[k][1] *= alpha;
        acc[k][2] *= alpha;
        acc[k][3] *= alpha;
      }
    }
    m_run = m_new;

    uint32_t ph[2], pl[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const float p0 = ex2(sp[2 * j] - m_new);
      const float p1 = ex2(sp[2 * j + 1] - m_new);
      l_run += ex2(sl[2 * j] - m_new) + ex2(sl[2 * j + 1] - m_new);
      ph[j] = pack_h2(p0, p1);
      const float2 back = unpack_h2(ph[j]);
      pl[j] = pack_h2(p0 - back.x, p1 - back.y);
    }
    uint32_t vr[4][VW];
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const char* p = sb + L::VOFF + ((r >> 1) * 8 + 2 * t + (r & 1)) * L::RS + g * (D / 8);
      if constexpr (VW == 2) {
        const uint2 x = *reinterpret_cast<const uint2*>(p);
        vr[r][0] = x.x;
        vr[r][1] = x.y;
      } else {
#pragma unroll
        for (int w = 0; w < VW; w += 4) {
          const uint4 x = *reinterpret_cast<const uint4*>(p + 4 * w);
          vr[r][w] = x.x;
          vr[r][w + 1] = x.y;
          vr[r][w + 2] = x.z;
          vr[r][w + 3] = x.w;
        }
      }
    }
#pragma unroll
    for (int w = 0; w < VW; ++w) {
      const uint32_t u0 = vr[0][w] ^ 0x80808080u, u1 = vr[1][w] ^ 0x80808080u;
      const uint32_t u2 = vr[2][w] ^ 0x80808080u, u3 = vr[3][w] ^ 0x80808080u;
      const uint32_t x01 = __byte_perm(u0, u1, 0x5140), y01 = __byte_perm(u0, u1, 0x7362);
      const uint32_t x23 = __byte_perm(u2, u3, 0x5140), y23 = __byte_perm(u2, u3, 0x7362);
      mma16816(acc[4 * w + 0], ph[0], pl[0], ph[1], pl[1], h2_from_ob(x01, 0x4140),
               h2_from_ob(x23, 0x4140));
      mma16816(acc[4 * w + 1], ph[0], pl[0], ph[1], pl[1], h2_from_ob(x01, 0x4342),
               h2_from_ob(x23, 0x4342));
      mma16816(acc[4 * w + 2], ph[0], pl[0], ph[1], pl[1], h2_from_ob(y01, 0x4140),
               h2_from_ob(y23, 0x4140));
      mma16816(acc[4 * w + 3], ph[0], pl[0], ph[1], pl[1], h2_from_ob(y01, 0x4342),
               h2_from_ob(y23, 0x4342));
    }
  }
  cp_wait<0>();

  // the warp's partition result for its G query rows: no merge (one warp per head)
  l_run += __shfl_xor_sync(0xffffffffu, l_run, 1);
  l_run += __shfl_xor_sync(0xffffffffu, l_run, 2);
  if (g < G) {
    const long long o = ((long long)seq * H + warp * G + g) * max_parts + part;
    float* pa = part_acc + o * D;
#pragma unroll
    for (int k = 0; k < NT; ++k) {
      pa[(2 * t) * (D / 8) + k] = acc[k][0] + acc[k][2];
      pa[(2 * t + 1) * (D / 8) + k] = acc[k][1] + acc[k][3];
    }
    if (t == 0) {
      part_ml[o * 2 + 0] = m_run;
      part_ml[o * 2 + 1] = l_run;
    }
  }
}


// ---------------------------------------------------------------------------------------------
// Split whole-block partition kernel (pthfa_decode_ws<S>_*): the whole-block access of wb
// (one CTA of 8 warps per (partition, sequence), warp w = KV head w with cp3's math, each
// 16-token step of all 8 heads copied by the CTA as contiguous runs: every warp-wide copy
// instruction moves 512 contiguous bytes of the block), made light enough for several CTAs
// per SM and paced by mbarriers instead of CTA-wide barriers:
// - the stage is the step's bytes and no more (K 16 KiB, V 16 KiB, the scales 2 x 512 B =
//   33792 B, a page's share of 16 tokens): rows are not padded but their 16-byte chunks are
//   XOR-swizzled by the row (chunk c of row r at c ^ (r & 7)), which keeps the K and V
//   fragment reads free of bank conflicts; ws3 is a ring of 3 stages (99 KiB, 2 CTAs and
//   16 warps per SM, at most 128 registers), ws6 a ring of 6 (one CTA per SM);
// - full[s]: every thread's copies of the step in slot s have landed (cp.async's own arrival
//   on an mbarrier of 256 arrivals: no wait_group, no __syncthreads); a warp waits only for
//   the step it computes;
// - empty[s]: the 8 warps have read their fragments of slot s (one arrival per warp, after
//   the V fragments are in registers, before the PV products): the refill of a slot waits
//   for the reads of it only, not for the whole step to be computed.
// The partitions are split like cp3's (many CTAs, the reduce kernel merges them); a warp
// writes its (m, l) and accumulators straight to the scratch. Needs 8 KV heads, head_dim 128
// and block_size >= 16 (a step inside one block).
// wt6 (pthfa_decode_wt6_*, sm_90, the default for large batches): the same ring of 6 stages
// filled by a ninth warp with the bulk copy engine: K and V of a step are one cp.async.bulk
// each (16 KiB, unswizzled: [token][head][D] as in memory), the producer's lanes copy the
// scales with cp.async, and full[s] expects the bulk bytes plus the 32 lanes' arrivals; the
// producer alone waits on empty[s]. ws6p: ws6 with the L2::256B prefetch hint.
namespace mmak {

__device__ __forceinline__ void mbar_init(uint32_t a, int count) {
  asm volatile("mbarrier.init.shared.b64 [%0], %1;" ::"r"(a), "r"(count) : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint32_t a) {
  asm volatile(
      "{\n"
      ".reg .b64 st;\n"
      "mbarrier.arrive.shared.b64 st, [%0];\n"
      "}" ::"r"(a)
      : "memory");
}

// the mbarrier counts one arrival of this thread once all its earlier cp.async have landed
__device__ __forceinline__ void cp_async_arrive(uint32_t a) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared.b64 [%0];" ::"r"(a) : "memory");
}

__device__ __forceinline__ bool mbar_done(uint32_t a, uint32_t parity) {
  uint32_t ok;
#if __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "mbarrier.try_wait.parity.shared.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n"
      "}"
      : "=r"(ok)
      : "r"(a), "r"(parity)
      : "memory");
#else
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "mbarrier.test_wait.parity.shared.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n"
      "}"
      : "=r"(ok)
      : "r"(a), "r"(parity)
      : "memory");
#endif
  return ok != 0;
}

// wait until the phase of the given parity has completed
__device__ __forceinline__ void mbar_wait(uint32_t a, uint32_t parity) {
  while (!mbar_done(a, parity)) {
  }
}

// cp.async of 16 bytes with the L2 prefetch hint of 256 bytes (the L2 fetches the 256-byte
// run the chunk is in: a warp's instruction covers two such runs)
__device__ __forceinline__ void cp_async16_l2(uint32_t s, const void* g) {
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;" ::"r"(s), "l"(g) : "memory");
}

#if __CUDA_ARCH__ >= 900
// one arrival that also expects tx more bytes of bulk copies before the phase can complete
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t a, uint32_t tx) {
  asm volatile(
      "{\n"
      ".reg .b64 st;\n"
      "mbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n"
      "}" ::"r"(a), "r"(tx)
      : "memory");
}

// the bulk copy engine (TMA) copies bytes (a multiple of 16) of a contiguous run into shared
// memory and counts them off the mbarrier's expected bytes
__device__ __forceinline__ void bulk_g2s(uint32_t s, const void* g, uint32_t bytes, uint32_t mbar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(s),
      "l"(g), "r"(bytes), "r"(mbar)
      : "memory");
}
#endif

}  // namespace mmak

struct WsLayout {
  static constexpr int D = 128;
  static constexpr int NW = 8;                    // KV heads = warps
  static constexpr int HB = 16 * D;               // a head's 16 rows of a step
  static constexpr int VOFF = NW * HB;            // K [head][token][D], then V
  static constexpr int SOFF = 2 * NW * HB;        // k scales [token][head], then v scales
  static constexpr int STAGE = SOFF + 2 * 16 * NW * 4;  // 33792 bytes
  static constexpr int RING = 128;                // ring offset: full[S], empty[S] before it
};

// MODE 0: the CTA's 256 threads copy with cp.async; 1: the same with the L2 256-byte prefetch
// hint; 2 (sm_90, wt): a ninth warp is the producer: the bulk copy engine moves each step's
// K and V runs (16 KiB each) into the ring unswizzled, the warp's lanes copy the scales, and
// the 8 compute warps never issue a copy or wait for a slot to empty.
template <typename T, int S, int MODE>
__device__ __forceinline__ void decode_ws_impl(
    const T* __restrict__ q, const int8_t* __restrict__ k_cache,
    const int8_t* __restrict__ v_cache, const float* __restrict__ k_scale,
    const float* __restrict__ v_scale, const int* __restrict__ block_tables, int bt_stride,
    const int* __restrict__ seq_lens, float* __restrict__ part_ml, float* __restrict__ part_acc,
    int G, int block_shift, int part_size, int max_parts, float scale_log2,
    long long kv_bstride, long long sc_bstride) {
  using namespace mmak;
  using L = WsLayout;
  constexpr int D = L::D;
  constexpr int NW = L::NW;
  constexpr int NTH = NW * 32;
  constexpr int KW = D / 16;
  constexpr int VW = D / 32;
  constexpr int NT = D / 8;
  constexpr int CPT = 16 * NW * D / 16 / NTH;  // 16-byte chunks of K (and of V) per thread
  constexpr bool TMA = MODE == 2;
  static_assert(S * 2 * 8 <= L::RING, "the mbarriers fit before the ring");
  extern __shared__ __align__(128) unsigned char wsm[];

  const int part = blockIdx.x;
  const int seq = blockIdx.z;
  const int seq_len = seq_lens[seq];
  const int t0 = part * part_size;
  if (t0 >= seq_len) return;
  const int n = min(part_size, seq_len - t0);
  const int block_mask = (1 << block_shift) - 1;
  const int nblk = (n + block_mask) >> block_shift;
  int* bt_s = reinterpret_cast<int*>(wsm + L::RING + S * L::STAGE);
  const unsigned char* ring = wsm + L::RING;
  const uint32_t full_s = smem_u32(wsm);       // full[s] at full_s + 8 s
  const uint32_t empty_s = full_s + 8 * S;     // empty[s] at empty_s + 8 s
  const uint32_t ring_s = smem_u32(ring);

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;  // = kv head
  const int g = lane >> 2;
  const int t = lane & 3;
  const int H = NW * G;

  // the query's raw 16-bit values, two a word (converted once the first steps are in flight)
  uint32_t qw[D / 8];
  {
    const bool hv = g < G && warp < NW;  // (warp NW is wt's producer)
    const uint16_t* qp = reinterpret_cast<const uint16_t*>(q) +
                         ((long long)seq * H + (long long)warp * G + (hv ? g : 0)) * D + t * (D / 4);
#pragma unroll
    for (int j = 0; j < D / 8; ++j)
      qw[j] = hv ? static_cast<uint32_t>(qp[2 * j]) | (static_cast<uint32_t>(qp[2 * j + 1]) << 16)
                 : 0u;
  }
  const int* bt = block_tables + (long long)seq * bt_stride + (t0 >> block_shift);
  for (int i = tid; i < nblk; i += blockDim.x) bt_s[i] = bt[i];
  if (tid < S) {
    // wt: the producer's expect_tx arrival and its 32 lanes' scale copies
    mbar_init(full_s + 8 * tid, TMA ? 33 : NTH);
    mbar_init(empty_s + 8 * tid, NW);
  }
  if constexpr (TMA) {
#if __CUDA_ARCH__ >= 900
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#else
    __trap();  // built for sm_90 only (the planner never picks it below)
#endif
  }
  __syncthreads();
  const int cnt = (n + 15) / 16;

  if constexpr (TMA) {
#if __CUDA_ARCH__ >= 900
    if (warp == NW) {  // the producer: step j into slot j % S once its last reads are done
      for (int j = 0; j < cnt; ++j) {
        const int sl = j % S;
        if (j >= S) mbar_wait(empty_s + 8 * sl, static_cast<uint32_t>((j / S - 1) & 1));
        const int b16 = j * 16;
        const long long blk = bt_s[b16 >> block_shift];
        const long long in0 = (long long)((t0 + b16) & block_mask) * NW;
        const uint32_t sb = ring_s + sl * L::STAGE;
        const uint32_t fb = full_s + 8 * sl;
        if (lane == 0) {
          mbar_arrive_expect_tx(fb, 2 * NW * L::HB);
          bulk_g2s(sb, k_cache + blk * kv_bstride + in0 * D, NW * L::HB, fb);
          bulk_g2s(sb + L::VOFF, v_cache + blk * kv_bstride + in0 * D, NW * L::HB, fb);
        }
#pragma unroll
        for (int k = 0; k < 8; ++k) {  // the 128 k scales, then the 128 v scales
          const int x = lane + 32 * k;
          const float* src = (x < 16 * NW ? k_scale : v_scale) + blk * sc_bstride + in0 +
                             (x & (16 * NW - 1));
          cp_async4(sb + L::SOFF + x * 4, src);
        }
        cp_async_arrive(fb);
      }
      cp_wait<0>();
      return;
    }
#endif
  }

  // step it (tokens t0 + 16 it .. + 15, inside one block) into slot: chunk c of the step's K
  // (and V) run is row c / 8 = token * 8 + head, column c % 8; thread tid copies chunks
  // tid + 256 k, so a warp's copy instruction covers 512 contiguous bytes
  auto issue = [&](int it, int slot) {
    const int b16 = it * 16;
    const long long blk = bt_s[b16 >> block_shift];
    const long long in0 = (long long)((t0 + b16) & block_mask) * NW;  // first row of the step
    const int8_t* kb = k_cache + blk * kv_bstride + in0 * D;
    const int8_t* vb = v_cache + blk * kv_bstride + in0 * D;
    const uint32_t sb = ring_s + slot * L::STAGE;
#pragma unroll
    for (int k = 0; k < CPT; ++k) {
      const int c = tid + NTH * k;
      const int row = c >> 3;
      const int col = c & 7;
      const int r = row / NW;
      const int h = row % NW;
      const uint32_t d = sb + h * L::HB + r * D + ((col ^ (r & 7)) << 4);
      if constexpr (MODE == 1) {
        cp_async16_l2(d, kb + (long long)c * 16);
        cp_async16_l2(d + L::VOFF, vb + (long long)c * 16);
      } else {
        cp_async16(d, kb + (long long)c * 16);
        cp_async16(d + L::VOFF, vb + (long long)c * 16);
      }
    }
    // the 128 k scales, then the 128 v scales, in global order [token][head]
    const float* src = (tid < 16 * NW ? k_scale : v_scale) + blk * sc_bstride + in0 +
                       (tid & (16 * NW - 1));
    cp_async4(sb + L::SOFF + tid * 4, src);
  };

  if constexpr (!TMA) {
#pragma unroll
    for (int s = 0; s < S - 1; ++s) {
      if (s < cnt) {
        issue(s, s);
        cp_async_arrive(full_s + 8 * s);
      }
    }
  }

  uint32_t qa[KW][2];
  float qscale;
  {
    float qf[D / 4];
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      const uint16_t lo = static_cast<uint16_t>(qw[j]), hi = static_cast<uint16_t>(qw[j] >> 16);
      qf[2 * j] = Conv<T>::to_float(*reinterpret_cast<const T*>(&lo));
      qf[2 * j + 1] = Conv<T>::to_float(*reinterpret_cast<const T*>(&hi));
    }
    float amax = 0.f;
#pragma unroll
    for (int j = 0; j < D / 4; ++j) amax = fmaxf(amax, fabsf(qf[j]));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    int e = 0;
    if (amax > 0.f && amax < INFINITY) {
      int ex;
      frexpf(amax, &ex);
      e = min(max(15 - ex, -120), 120);
    }
    const float f = ldexpf(1.f, e);
#pragma unroll
    for (int c = 0; c < KW; ++c) {
      qa[c][0] = pack_h2(qf[4 * c + 0] * f, qf[4 * c + 1] * f);
      qa[c][1] = pack_h2(qf[4 * c + 2] * f, qf[4 * c + 3] * f);
    }
    qscale = scale_log2 * ldexpf(1.f, -e);
  }

  float m_run = -INFINITY;
  float l_run = 0.f;
  float acc[NT][4];
#pragma unroll
  for (int i = 0; i < NT; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;

  int slot = 0;      // step i's slot: i % S
  uint32_t use = 0;  // how often that slot was filled before step i, mod 2: (i / S) & 1
  for (int i = 0; i < cnt; ++i) {
    // refill the slot step i - 1 used with step i + S - 1, once the 8 warps have read it
    if (!TMA && i + S - 1 < cnt) {
      const int ns = slot == 0 ? S - 1 : slot - 1;
      if (i > 0) mbar_wait(empty_s + 8 * ns, static_cast<uint32_t>(((i - 1) / S) & 1));
      issue(i + S - 1, ns);
      cp_async_arrive(full_s + 8 * ns);
    }
    mbar_wait(full_s + 8 * slot, use);

    const unsigned char* sb = ring + slot * L::STAGE;
    const int cur = slot;
    if (++slot == S) {
      slot = 0;
      use ^= 1u;
    }
    const int base = i * 16;
    const float* sks = reinterpret_cast<const float*>(sb + L::SOFF) + warp;
    float ks[4], vs[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int tok = (r >> 1) * 8 + 2 * t + (r & 1);
      ks[r] = sks[tok * NW];
      vs[r] = sks[16 * NW + tok * NW];
    }
    // ws: head-major and swizzled; wt: as in global memory, [token][head][D]
    const unsigned char* kh = sb + warp * (TMA ? D : L::HB);
    constexpr int KRS = TMA ? NW * D : D;  // between a head's rows
    float sl[4], sp[4];
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      float c[4] = {0.f, 0.f, 0.f, 0.f};
      const unsigned char* kr = kh + (8 * j + g) * KRS;  // row 8j + g: its swizzle is g
      uint4 kq[2];
      if constexpr (TMA) {
        // rows 1 KiB apart share their banks: odd rows read their two chunks in the other
        // order, so each load's 8-lane phase covers 8 distinct chunks
        const int odd = g & 1;
        const uint4 a = *reinterpret_cast<const uint4*>(kr + 32 * t + 16 * odd);
        const uint4 b = *reinterpret_cast<const uint4*>(kr + 32 * t + 16 * (1 - odd));
        kq[0] = odd ? b : a;
        kq[1] = odd ? a : b;
      } else {
        kq[0] = *reinterpret_cast<const uint4*>(kr + (((2 * t) ^ g) << 4));
        kq[1] = *reinterpret_cast<const uint4*>(kr + (((2 * t + 1) ^ g) << 4));
      }
#pragma unroll
      for (int c4 = 0; c4 < KW / 4; ++c4) {
        const uint4 kw = kq[c4];
        const uint32_t kk[4] = {kw.x, kw.y, kw.z, kw.w};
#pragma unroll
        for (int x = 0; x < 4; ++x) {
          const int cc = 4 * c4 + x;
          const uint32_t u = kk[x] ^ 0x80808080u;
          mma16816(c, qa[cc][0], 0u, qa[cc][1], 0u, h2_from_ob(u, 0x4140),
                   h2_from_ob(u, 0x4342));
        }
      }
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int r = 2 * j + e;
        const bool valid = base + 8 * j + 2 * t + e < n;
        const float x = c[e] * (ks[r] * qscale);
        sl[r] = valid ? x : -INFINITY;
        sp[r] = valid ? x + lg2(fmaxf(vs[r], 1e-30f)) : -INFINITY;
        mx = fmaxf(mx, sp[r]);
      }
    }
    uint32_t vr[4][VW];
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int rr = (r >> 1) * 8 + 2 * t + (r & 1);
      const uint4 x = *reinterpret_cast<const uint4*>(
          kh + L::VOFF + rr * KRS + (TMA ? g << 4 : (g ^ (rr & 7)) << 4));
      vr[r][0] = x.x;
      vr[r][1] = x.y;
      vr[r][2] = x.z;
      vr[r][3] = x.w;
    }
    __syncwarp();  // every lane has read its fragments of this slot
    if (lane == 0) mbar_arrive(empty_s + 8 * cur);

    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(m_run, mx);
    if (__any_sync(0xffffffffu, m_new > m_run)) {
      const float alpha = ex2(m_run - m_new);
      l_run *= alpha;
#pragma unroll
      for (int k = 0; k < NT; ++k) {
        acc[k][0] *= alpha;
        acc[k][1] *= alpha;
        acc[k][2] *= alpha;
        acc[k][3] *= alpha;
      }
    }
    m_run = m_new;

    uint32_t ph[2], pl[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const float p0 = ex2(sp[2 * j] - m_new);
      const float p1 = ex2(sp[2 * j + 1] - m_new);
      l_run += ex2(sl[2 * j] - m_new) + ex2(sl[2 * j + 1] - m_new);
      ph[j] = pack_h2(p0, p1);
      const float2 back = unpack_h2(ph[j]);
      pl[j] = pack_h2(p0 - back.x, p1 - back.y);
    }
#pragma unroll
    for (int w = 0; w < VW; ++w) {
      const uint32_t u0 = vr[0][w] ^ 0x80808080u, u1 = vr[1][w] ^ 0x80808080u;
      const uint32_t u2 = vr[2][w] ^ 0x80808080u, u3 = vr[3][w] ^ 0x80808080u;
      const uint32_t x01 = __byte_perm(u0, u1, 0x5140), y01 = __byte_perm(u0, u1, 0x7362);
      const uint32_t x23 = __byte_perm(u2, u3, 0x5140), y23 = __byte_perm(u2, u3, 0x7362);
      mma16816(acc[4 * w + 0], ph[0], pl[0], ph[1], pl[1], h2_from_ob(x01, 0x4140),
               h2_from_ob(x23, 0x4140));
      mma16816(acc[4 * w + 1], ph[0], pl[0], ph[1], pl[1], h2_from_ob(x01, 0x4342),
               h2_from_ob(x23, 0x4342));
      mma16816(acc[4 * w + 2], ph[0], pl[0], ph[1], pl[1], h2_from_ob(y01, 0x4140),
               h2_from_ob(y23, 0x4140));
      mma16816(acc[4 * w + 3], ph[0], pl[0], ph[1], pl[1], h2_from_ob(y01, 0x4342),
               h2_from_ob(y23, 0x4342));
    }
  }

  // the warp's partition result for its G query rows: no merge (one warp per head)
  l_run += __shfl_xor_sync(0xffffffffu, l_run, 1);
  l_run += __shfl_xor_sync(0xffffffffu, l_run, 2);
  if (g < G) {
    const long long o = ((long long)seq * H + warp * G + g) * max_parts + part;
    float* pa = part_acc + o * D;
#pragma unroll
    for (int k = 0; k < NT; ++k) {
      pa[(2 * t) * (D / 8) + k] = acc[k][0] + acc[k][2];
      pa[(2 * t + 1) * (D / 8) + k] = acc[k][1] + acc[k][3];
    }
    if (t == 0) {
      part_ml[o * 2 + 0] = m_run;
      part_ml[o * 2 + 1] = l_run;
    }
  }
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
          int max_parts, float scale_log2, long long kv_bstride, long long sc_bstride) {         \
    pthfa::decode_part_impl<T, D, G, 4>(q, k_cache, v_cache, k_scale, v_scale, block_tables,    \
                                        bt_stride, seq_lens, part_ml, part_acc, num_kv_heads,   \
                                        block_shift, part_size, max_parts, scale_log2,           \
                                        kv_bstride, sc_bstride);                                 \
  }

#define PTHFA_REDUCE(TN, T, D)                                                                   \
  extern "C" __global__ void __launch_bounds__(D) pthfa_decode_reduce_##TN##_d##D(              \
      const float* __restrict__ part_ml, const float* __restrict__ part_acc,                     \
      const int* __restrict__ seq_lens, T* __restrict__ out, int num_heads, int part_size,       \
      int max_parts) {                                                                           \
    pthfa::decode_reduce_impl<T, D>(part_ml, part_acc, seq_lens, out, num_heads, part_size,      \
                                    max_parts);                                                  \
  }


#define PTHFA_MMA(TN, T, D, NS, SUF, MINB)                                                       \
  extern "C" __global__ void __launch_bounds__(pthfa::kThreads, MINB)                           \
      pthfa_decode_mma##NS##SUF##_##TN##_d##D(                                                        \
          const T* __restrict__ q, const int8_t* __restrict__ k_cache,                           \
          const int8_t* __restrict__ v_cache, const float* __restrict__ k_scale,                 \
          const float* __restrict__ v_scale, const int* __restrict__ block_tables,               \
          int bt_stride, const int* __restrict__ seq_lens, float* __restrict__ part_ml,          \
          float* __restrict__ part_acc, int num_kv_heads, int gqa, int block_shift,             \
          int part_size, int max_parts, float scale_log2, long long kv_bstride,                 \
          long long sc_bstride) {                                                                \
    pthfa::decode_mma_impl<T, D, NS>(q, k_cache, v_cache, k_scale, v_scale, block_tables,       \
                                     bt_stride, seq_lens, part_ml, part_acc, num_kv_heads, gqa, \
                                     block_shift, part_size, max_parts, scale_log2, kv_bstride, \
                                     sc_bstride);                                                \
  }

#define PTHFA_CP(TN, T, D, S, MINB)                                                              \
  extern "C" __global__ void __launch_bounds__(pthfa::kThreads, MINB)                           \
      pthfa_decode_cp##S##_##TN##_d##D(                                                          \
          const T* __restrict__ q, const int8_t* __restrict__ k_cache,                           \
          const int8_t* __restrict__ v_cache, const float* __restrict__ k_scale,                 \
          const float* __restrict__ v_scale, const int* __restrict__ block_tables,               \
          int bt_stride, const int* __restrict__ seq_lens, float* __restrict__ part_ml,          \
          float* __restrict__ part_acc, T* __restrict__ out, int* __restrict__ counters,        \
          int num_kv_heads, int gqa, int block_shift, int part_size, int max_parts,             \
          float scale_log2, long long kv_bstride, long long sc_bstride) {                        \
    pthfa::decode_cp_impl<T, D, S>(q, k_cache, v_cache, k_scale, v_scale, block_tables,         \
                                   bt_stride, seq_lens, part_ml, part_acc, out, counters,       \
                                   num_kv_heads, gqa, block_shift, part_size, max_parts,        \
                                   scale_log2, kv_bstride, sc_bstride);                          \
  }

#define PTHFA_WB(TN, T, D, S, NW)                                                                \
  extern "C" __global__ void __launch_bounds__(NW * 32, 1)                                       \
      pthfa_decode_wb##S##_##TN##_d##D##_h##NW(                                                  \
          const T* __restrict__ q, const int8_t* __restrict__ k_cache,                           \
          const int8_t* __restrict__ v_cache, const float* __restrict__ k_scale,                 \
          const float* __restrict__ v_scale, const int* __restrict__ block_tables,               \
          int bt_stride, const int* __restrict__ seq_lens, float* __restrict__ part_ml,          \
          float* __restrict__ part_acc, int gqa, int block_shift, int part_size, int max_parts,  \
          float scale_log2, long long kv_bstride, long long sc_bstride) {                        \
    pthfa::decode_wb_impl<T, D, S, NW>(q, k_cache, v_cache, k_scale, v_scale, block_tables,     \
                                       bt_stride, seq_lens, part_ml, part_acc, gqa,              \
                                       block_shift, part_size, max_parts, scale_log2,            \
                                       kv_bstride, sc_bstride);                                  \
  }

#define PTHFA_WS(TN, T, NAME, S, MODE, NTH, MINB)                                                \
  extern "C" __global__ void __launch_bounds__(NTH, MINB)                                        \
      pthfa_decode_##NAME##_##TN##_d128_h8(                                                      \
          const T* __restrict__ q, const int8_t* __restrict__ k_cache,                           \
          const int8_t* __restrict__ v_cache, const float* __restrict__ k_scale,                 \
          const float* __restrict__ v_scale, const int* __restrict__ block_tables,               \
          int bt_stride, const int* __restrict__ seq_lens, float* __restrict__ part_ml,          \
          float* __restrict__ part_acc, int gqa, int block_shift, int part_size, int max_parts,  \
          float scale_log2, long long kv_bstride, long long sc_bstride) {                        \
    pthfa::decode_ws_impl<T, S, MODE>(q, k_cache, v_cache, k_scale, v_scale, block_tables, bt_stride, \
                                seq_lens, part_ml, part_acc, gqa, block_shift, part_size,       \
                                max_parts, scale_log2, kv_bstride, sc_bstride);                 \
  }

#define PTHFA_ALL_G(TN, T, D) \
  PTHFA_PART(TN, T, D, 1)     \
  PTHFA_PART(TN, T, D, 2)     \
  PTHFA_PART(TN, T, D, 4)     \
  PTHFA_PART(TN, T, D, 8)     \
  PTHFA_MMA(TN, T, D, 1, , 1)  \
  PTHFA_CP(TN, T, D, 3, 3)     \
  PTHFA_CP(TN, T, D, 4, 2)     \
  PTHFA_REDUCE(TN, T, D)

PTHFA_ALL_G(bf16, __nv_bfloat16, 64)
PTHFA_ALL_G(bf16, __nv_bfloat16, 128)
PTHFA_ALL_G(bf16, __nv_bfloat16, 256)
PTHFA_ALL_G(fp16, __half, 64)
PTHFA_ALL_G(fp16, __half, 128)
PTHFA_ALL_G(fp16, __half, 256)
// the whole-block kernel: 8 KV heads (one warp each), head_dim 128, 4 or 5 stages
PTHFA_WB(bf16, __nv_bfloat16, 128, 4, 8)
PTHFA_WB(fp16, __half, 128, 4, 8)
PTHFA_WB(bf16, __nv_bfloat16, 128, 5, 8)
PTHFA_WB(fp16, __half, 128, 5, 8)

// the split whole-block kernels: 8 KV heads, head_dim 128; 3 stages (2 CTAs per SM) or 6 (1);
// ws6p with the L2 prefetch hint; wt6 with the bulk copy engine and a producer warp (sm_90)
PTHFA_WS(bf16, __nv_bfloat16, ws3, 3, 0, 256, 2)
PTHFA_WS(fp16, __half, ws3, 3, 0, 256, 2)
PTHFA_WS(bf16, __nv_bfloat16, ws6, 6, 0, 256, 1)
PTHFA_WS(fp16, __half, ws6, 6, 0, 256, 1)
PTHFA_WS(bf16, __nv_bfloat16, ws6p, 6, 1, 256, 1)
PTHFA_WS(fp16, __half, ws6p, 6, 1, 256, 1)
PTHFA_WS(bf16, __nv_bfloat16, wt6, 6, 2, 288, 1)
PTHFA_WS(fp16, __half, wt6, 6, 2, 288, 1)

#ifdef PTHFA_PROBES
// Measurement probes of cp3 (bf16, head_dim 128): see decode_cp_impl's P.
#define PTHFA_PROBE(P)                                                                           \
  extern "C" __global__ void __launch_bounds__(pthfa::kThreads, 3) pthfa_probe##P##_cp3_bf16_d128( \
      const __nv_bfloat16* __restrict__ q, const int8_t* __restrict__ k_cache,                   \
      const int8_t* __restrict__ v_cache, const float* __restrict__ k_scale,                     \
      const float* __restrict__ v_scale, const int* __restrict__ block_tables, int bt_stride,   \
      const int* __restrict__ seq_lens, float* __restrict__ part_ml, float* __restrict__ part_acc, \
      int num_kv_heads, int gqa, int block_shift, int part_size, int max_parts,                  \
      float scale_log2) {                                                                        \
    pthfa::decode_cp_impl<__nv_bfloat16, 128, 3, P>(                                             \
        q, k_cache, v_cache, k_scale, v_scale, block_tables, bt_stride, seq_lens, part_ml,       \
        part_acc, nullptr, nullptr, num_kv_heads, gqa, block_shift, part_size, max_parts,        \
        scale_log2, (128LL << block_shift) * num_kv_heads,                                       \
        (1LL << block_shift) * num_kv_heads);                                                    \
  }
PTHFA_PROBE(1)
PTHFA_PROBE(2)
PTHFA_PROBE(3)
PTHFA_PROBE(4)
PTHFA_PROBE(5)

// The read ceiling: every byte of [p, p + 16 n) read once, 16 bytes per load, grid-stride.
extern "C" __global__ void pthfa_probe_read(const int4* __restrict__ p, long long n,
                                            int* __restrict__ sink) {
  int x = 0;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x) {
    const int4 v = __ldcs(p + i);
    x ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (x == 0x7fffffff) *sink = x;  // keeps the loads
}
#endif
