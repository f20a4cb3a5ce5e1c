// Stands in for torch's c10/cuda/CUDAException.h, which FA2's cuda_check.h includes, in the
// fa2fp8 build: that library links no torch. The checked expression still runs; an error it
// returns stays in cudart's last-error slot, which fa2fp8_paged_decode reads and returns.
// torch's header brings <cstdio> and <cstdlib> along, which FA2's hardware_info.h uses
// (fprintf, exit) without including; so does this one.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
#define C10_CUDA_CHECK(EXPR) ((void)(EXPR))
#define C10_CUDA_KERNEL_LAUNCH_CHECK() ((void)0)
