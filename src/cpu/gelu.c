/* gelu.c — CPU reference backend of GeLU (+ bias) forward and backward (+ dbias): the
 * executable specification of include/fusedloss.h section 7.
 *
 * Element math is fp32, operation for operation what src/cuda/gelu.cu computes (and what nvcc
 * makes of PyTorch's ActivationGeluKernel.cu): the fused multiply-adds are explicit fmaf()
 * calls and nothing else is contracted (the library is compiled as ISO C11, whose default is
 * -ffp-contract=off), so CPU and CUDA differ only in the last bits of tanhf / erff / expf
 * (C library here, libdevice there). dbias is accumulated in double.
 *
 * Threads (OpenMP when available): rows for y / dx; for dbias the rows are cut into
 * fl__gelu_cpu_blocks(N) fixed blocks, each summed by one thread in row order into its own
 * double partial (the workspace), and the partials are then added in block order, so the
 * result does not depend on the thread count.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../internal.h"
#include "dtype.h"

static float ld_elem(const void* base, fl_dtype dt, int64_t i) { return fl__load_f32(base, dt, i); }
static void st_elem(void* base, fl_dtype dt, int64_t i, float v) { fl__store_f32(base, dt, i, v); }

/* ---------------------------------------------------------------------------------------- */
/* the element math (fp32; constants are PyTorch's opmath constants, bit for bit)            */

static const float kB = 0x1.988454p-1f;   /* float(sqrt(2) * 2/sqrt(pi) * 0.5) = 0.797884583f */
static const float kK = 0x1.6e4e26p-5f;   /* 0.044715f */
static const float k3K = 0x1.12ba9cp-3f;  /* 3.0f * 0.044715f (rounded in float, as nvcc folds it) */
static const float kA = 0x1.6a09e6p-1f;   /* float(M_SQRT1_2) */
static const float kC = 0x1.988454p-2f;   /* float(2/sqrt(pi) * M_SQRT1_2 * 0.5) = 0.398942292f */

/* y = gelu(u) */
static float gelu_f(float u, fl_gelu_approx a) {
    if (a == FL_GELU_TANH) {
        float u3 = (u * u) * u;
        float t = tanhf(kB * fmaf(kK, u3, u));
        return (0.5f * u) * (1.0f + t);
    }
    return (u * 0.5f) * (1.0f + erff(u * kA));
}

/* dy * gelu'(u) */
static float gelu_df(float u, float dy, fl_gelu_approx a) {
    if (a == FL_GELU_TANH) {
        float u2 = u * u;
        float u3 = u * u2;
        float t = tanhf(kB * fmaf(kK, u3, u));
        float id = kB * fmaf(k3K, u2, 1.0f);          /* d inner / du */
        float rd = id * ((0.5f * u) * fmaf(-t, t, 1.0f));
        return dy * fmaf(1.0f + t, 0.5f, rd);
    }
    float pdf = expf((u * -0.5f) * u) * kC;
    return dy * fmaf(1.0f + erff(u * kA), 0.5f, u * pdf);
}

/* u = x (+ b): no "+ 0" without a bias, which would turn gelu(-0) = -0 into +0 */
static float add_bias(float x, const void* bias, fl_dtype bdt, int64_t j) {
    return bias ? x + ld_elem(bias, bdt, j) : x;
}

/* ---------------------------------------------------------------------------------------- */
/* entry points                                                                               */

fl_status fl_gelu_forward_cpu(void* y, const void* x, const void* bias, int64_t N, int64_t F,
                              int64_t ld_y, int64_t ld_x, fl_dtype dtype, fl_dtype bias_dtype,
                              fl_gelu_approx approx) {
    static const char* fn = "fl_gelu_forward_cpu";
    fl__clear_error();
    FL_CHECK(fl__gelu_validate(fn, 0, 0, y, NULL, NULL, x, bias, N, F, ld_y, ld_x, ld_x, dtype, bias_dtype,
                               approx, NULL, 0));
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (N * F > 32768)
#endif
    for (int64_t i = 0; i < N; i++) {
        const int64_t ox = i * ld_x, oy = i * ld_y;   /* 64-bit: N*ld may exceed 2^31 */
        for (int64_t j = 0; j < F; j++) {
            /* u in fp32, not rounded to dtype (see the header); in place: read before write */
            float u = add_bias(ld_elem(x, dtype, ox + j), bias, bias_dtype, j);
            st_elem(y, dtype, oy + j, gelu_f(u, approx));
        }
    }
    return FL_OK;
}

fl_status fl_gelu_backward_cpu(void* dx, void* dbias, const void* dy, const void* x, const void* bias,
                               int64_t N, int64_t F, int64_t ld_dx, int64_t ld_dy, int64_t ld_x,
                               fl_dtype dtype, fl_dtype bias_dtype, fl_gelu_approx approx,
                               void* workspace, size_t workspace_bytes) {
    static const char* fn = "fl_gelu_backward_cpu";
    fl__clear_error();
    FL_CHECK(fl__gelu_validate(fn, 1, 0, dx, dbias, dy, x, bias, N, F, ld_dx, ld_dy, ld_x, dtype,
                               bias_dtype, approx, workspace, workspace_bytes));
    if (!dbias) {
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (N * F > 32768)
#endif
        for (int64_t i = 0; i < N; i++) {
            for (int64_t j = 0; j < F; j++) {
                float u = add_bias(ld_elem(x, dtype, i * ld_x + j), bias, bias_dtype, j);
                float g = ld_elem(dy, dtype, i * ld_dy + j);
                st_elem(dx, dtype, i * ld_dx + j, gelu_df(u, g, approx));
            }
        }
        return FL_OK;
    }
    /* dbias: block b sums rows [b*rb, min((b+1)*rb, N)) in row order into part[b][F] */
    const int64_t nb = fl__gelu_cpu_blocks(N);
    const int64_t rb = nb ? (N + nb - 1) / nb : 0;
    double* part = (double*)((char*)workspace + 256);
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (N * F > 32768)
#endif
    for (int64_t b = 0; b < nb; b++) {
        double* acc = part + b * F;
        for (int64_t j = 0; j < F; j++) acc[j] = 0.0;
        const int64_t i1 = (b + 1) * rb < N ? (b + 1) * rb : N;
        for (int64_t i = b * rb; i < i1; i++) {
            for (int64_t j = 0; j < F; j++) {
                float u = ld_elem(x, dtype, i * ld_x + j) + ld_elem(bias, bias_dtype, j);
                float g = ld_elem(dy, dtype, i * ld_dy + j);
                float du = gelu_df(u, g, approx);
                acc[j] += (double)du;   /* the unrounded fp32 du, as the CUDA kernel sums it */
                st_elem(dx, dtype, i * ld_dx + j, du);
            }
        }
    }
    for (int64_t j = 0; j < F; j++) {
        double s = 0.0;
        for (int64_t b = 0; b < nb; b++) s += part[b * F + j];   /* fixed block order */
        st_elem(dbias, bias_dtype, j, (float)s);
    }
    return FL_OK;
}
