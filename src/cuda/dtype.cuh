/* dtype.cuh — the element conversions every fusedloss CUDA kernel uses (fp32 arithmetic on
 * fp32 / fp16 / bf16 storage; round to nearest even on the way back). Internal, not installed.
 * SPDX-License-Identifier: MIT
 */
#ifndef FL_CUDA_DTYPE_CUH
#define FL_CUDA_DTYPE_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
    return __float2bfloat16_rn(x);
}

#endif /* FL_CUDA_DTYPE_CUH */
