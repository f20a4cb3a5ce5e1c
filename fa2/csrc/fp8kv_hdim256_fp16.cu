// fa2fp8: the fp8 (e4m3) K/V split-KV decode kernels, head dim 256, fp16 queries. One unit per
// (head dim, dtype) so that build.py compiles them in parallel. Needs the tree patched with
// fa2/fp8-kv.diff (run_mha_fwd_splitkv_fp8kv_dispatch).
#include "namespace_config.h"
#include "flash_fwd_launch_template.h"

namespace FLASH_NAMESPACE {

template void run_mha_fwd_splitkv_fp8kv_dispatch<cutlass::half_t, 256, false>(Flash_fwd_params &params, cudaStream_t stream);

}  // namespace FLASH_NAMESPACE
