/* zoo_test_util.h — helpers shared by the tests of the distillation, margin softmax CE and
 * softmax focal losses (tests/test_distill.c, test_margin_ce.c, test_softmax_focal.c and their
 * *_cuda.c GPU tests). Header-only (static inline / macros), on top of test_util.h (include that
 * first). The GPU helpers are compiled only where cuda_check.h was included before this header. */
#ifndef FL_TEST_ZOO_TEST_UTIL_H
#define FL_TEST_ZOO_TEST_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fusedloss.h"
#include "test_util.h"

/* ---- bad arguments (CPU) --------------------------------------------------------------------- */
/* status, a message naming the function fnname_, and no output written to the arrays L_ / D_
 * (poisoned before the call). A macro: CHECK reports the line of the caller. */
#define ZT_EXPECT(call_, want, what, fnname_, L_, D_)                                                        \
    do {                                                                                                    \
        tu_poison(L_, sizeof(L_));                                                                          \
        tu_poison(D_, sizeof(D_));                                                                          \
        fl_status s_ = (call_);                                                                             \
        CHECK_STATUS(s_, want, what);                                                                       \
        if ((want) != FL_OK) {                                                                              \
            CHECK(strstr(fl_last_error(), fnname_) != NULL, "%s: message \"%s\" does not name %s", what,    \
                  fl_last_error(), fnname_);                                                                \
            int clean_ = 1;                                                                                 \
            for (size_t k_ = 0; k_ < sizeof(L_); k_++) clean_ &= ((unsigned char*)(L_))[k_] == TU_POISON_BYTE; \
            for (size_t k_ = 0; k_ < sizeof(D_); k_++) clean_ &= ((unsigned char*)(D_))[k_] == TU_POISON_BYTE; \
            CHECK(clean_, "%s: an output was written on error", what);                                      \
        } else {                                                                                            \
            CHECK(fl_last_error()[0] == 0, "%s: last error \"%s\" after success", what, fl_last_error());   \
        }                                                                                                   \
    } while (0)

#ifdef FL_TEST_CUDA_CHECK_H
/* ---- GPU tests ------------------------------------------------------------------------------- */
/* main()'s start: parses [--small] (sets *small), and without a CUDA build or a device prints
 * SKIP. Returns -1 to go on, else main's exit status (2: usage, 0: skipped). */
static inline int zt_cuda_test_start(int argc, char** argv, const char* prog, int* small) {
    for (int a = 1; a < argc; a++) {
        if (!strcmp(argv[a], "--small")) *small = 1;
        else { printf("usage: %s [--small]\n", prog); return 2; }
    }
    if (!fl_cuda_built()) { printf("SKIP: this build of fusedloss has no CUDA backend\n"); return 0; }
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev == 0) {
        printf("SKIP: no CUDA device (%s)\n", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        return 0;
    }
    return -1;
}

/* after a call that must succeed: the context alive (else FATAL, exit 2), no pending CUDA error,
 * and the device error flag *dflag == (use_flag ? 1 : 0) */
static inline void zt_check_call_ok(const char* nm, const int32_t* dflag, int use_flag) {
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        printf("FATAL: %s killed the context: %s\n", nm, cudaGetErrorString(e));
        exit(2);
    }
    e = cudaGetLastError();
    CHECK(e == cudaSuccess, "%s: cudaGetLastError() = %s", nm, cudaGetErrorString(e));
    int32_t hf = -1;
    CK(cudaMemcpy(&hf, dflag, 4, cudaMemcpyDeviceToHost));
    CHECK(hf == (use_flag ? 1 : 0), "%s: *error_flag = %d, want %d", nm, (int)hf, use_flag ? 1 : 0);
}

/* bad arguments: how many of the first dbytes bytes of device buffer d are not 0xFF plus how many
 * of the first nl floats of device buffer l are not poison (both poisoned before the calls) */
static inline int zt_count_written(const void* d, size_t dbytes, const float* l, int nl) {
    unsigned char* hb = tu_xmalloc(dbytes);
    float* hlb = tu_xmalloc((size_t)nl * 4);
    CK(cudaMemcpy(hb, d, dbytes, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hlb, l, (size_t)nl * 4, cudaMemcpyDeviceToHost));
    int w = 0;
    for (size_t k = 0; k < dbytes; k++) w += hb[k] != 0xFF;
    for (int k = 0; k < nl; k++) w += !tu_is_poison(hlb, 4, k);
    free(hb);
    free(hlb);
    return w;
}

#if defined(_POSIX_C_SOURCE) && _POSIX_C_SOURCE >= 200112L
/* A/B of a kernel-choice knob read on every call (FUSEDLOSS_LOVASZ_SORT, FUSEDLOSS_LM_PREFETCH, ...):
 * zt_env_other sets `name` to the value of {a, b} it does not hold now (unset counts as a), saving
 * the old state; zt_env_restore puts it back. A test runs a case once as it stands and once on the
 * other path, and compares. */
typedef struct { char name[64], val[64]; int had; } zt_env_saved;
static inline const char* zt_env_other(zt_env_saved* s, const char* name, const char* a, const char* b) {
    const char* v = getenv(name);
    snprintf(s->name, sizeof s->name, "%s", name);
    s->had = v != NULL;
    snprintf(s->val, sizeof s->val, "%s", v ? v : "");
    const char* to = (v && !strcmp(v, b)) ? a : b;
    setenv(name, to, 1);
    return to;
}
static inline void zt_env_restore(const zt_env_saved* s) {
    if (s->had) setenv(s->name, s->val, 1);
    else unsetenv(s->name);
}
#endif
#endif /* FL_TEST_CUDA_CHECK_H */

#endif /* FL_TEST_ZOO_TEST_UTIL_H */
