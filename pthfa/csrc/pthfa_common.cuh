// pthfa: int8 per-token-head KV cache, shared helpers.
//
// Cache layout (vLLM's): cache[num_blocks, block_size, num_kv_heads, head_dim] int8,
// scale[num_blocks, block_size, num_kv_heads] fp32. One symmetric scale per token per head:
// scale = absmax / 127, q = round(x / scale) clamped to [-127, 127], x ~= q * scale.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace pthfa {

template <typename T>
struct Conv;

template <>
struct Conv<__nv_bfloat16> {
  static __device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
  static __device__ __forceinline__ __nv_bfloat16 from_float(float x) {
    return __float2bfloat16_rn(x);
  }
};

template <>
struct Conv<__half> {
  static __device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
  static __device__ __forceinline__ __half from_float(float x) { return __float2half_rn(x); }
};

// Four signed int8 packed in a word -> four exact floats, without I2F: put (b ^ 0x80) in the
// low mantissa byte of 2^23 and subtract 2^23 + 128.
__device__ __forceinline__ void s8x4_to_f32(uint32_t w, float* f) {
  const uint32_t u = w ^ 0x80808080u;
  f[0] = __int_as_float(__byte_perm(u, 0x4B000000u, 0x7440)) - 8388736.0f;
  f[1] = __int_as_float(__byte_perm(u, 0x4B000000u, 0x7441)) - 8388736.0f;
  f[2] = __int_as_float(__byte_perm(u, 0x4B000000u, 0x7442)) - 8388736.0f;
  f[3] = __int_as_float(__byte_perm(u, 0x4B000000u, 0x7443)) - 8388736.0f;
}

__device__ __forceinline__ void s8x16_to_f32(const int4& v, float* f) {
  s8x4_to_f32(static_cast<uint32_t>(v.x), f + 0);
  s8x4_to_f32(static_cast<uint32_t>(v.y), f + 4);
  s8x4_to_f32(static_cast<uint32_t>(v.z), f + 8);
  s8x4_to_f32(static_cast<uint32_t>(v.w), f + 12);
}

__device__ __forceinline__ int4 ldg_stream(const int4* p) {
  int4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.s32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}

}  // namespace pthfa
