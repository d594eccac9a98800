/* cuda_check.h — CK(expr): a CUDA runtime call that must succeed, else the test program prints
 * the call, where, and the error, and exits with status 2 (a broken context cannot be tested
 * further). Shared by the GPU tests written since the vocab-parallel steps. Header-only. */
#ifndef FL_TEST_CUDA_CHECK_H
#define FL_TEST_CUDA_CHECK_H

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define CK(x)                                                                                  \
    do {                                                                                       \
        cudaError_t e_ = (x);                                                                  \
        if (e_ != cudaSuccess) {                                                               \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(2);                                                                           \
        }                                                                                      \
    } while (0)

#endif /* FL_TEST_CUDA_CHECK_H */
