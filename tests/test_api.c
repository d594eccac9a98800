/* test_api.c — version, status strings, thread-local last error, option defaults, and the
 * CUDA entry points of a CPU-only build (FL_ERR_NOT_BUILT), fl_scale_rows_cpu.
 *
 * Build and run (the Makefile does this in `make test`):
 *   cc -std=c11 -O2 -Iinclude tests/test_api.c build/libfusedloss.a -lm -lpthread -fopenmp \
 *      -o build/test_api && ./build/test_api
 * Ends with "N passed, M failed"; exit code 0 only when nothing failed.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "fusedloss.h"
#include "test_util.h"

static int contains(const char* hay, const char* needle) { return hay && strstr(hay, needle) != NULL; }

/* ------------------------------------------------------------------------------------------ */
static void test_version(void) {
    CHECK(fl_version_number() == FL_VERSION_NUMBER, "fl_version_number() = %u, header says %u",
          fl_version_number(), (unsigned)FL_VERSION_NUMBER);
    CHECK(FL_VERSION_NUMBER == 100, "FL_VERSION_NUMBER = %d, expected 100 for 0.1.0", FL_VERSION_NUMBER);
    const char* v = fl_version_string();
    CHECK(v != NULL, "fl_version_string() is NULL");
    CHECK(v && strncmp(v, "0.1.0", 5) == 0, "fl_version_string() = \"%s\" does not start with 0.1.0",
          v ? v : "(null)");
    CHECK(v == fl_version_string(), "fl_version_string() is not a static string");
    int cb = fl_cuda_built();
    CHECK(cb == 0 || cb == 1, "fl_cuda_built() = %d, expected 0 or 1", cb);
    printf("version \"%s\", fl_cuda_built() = %d\n", v ? v : "(null)", cb);
}

/* ------------------------------------------------------------------------------------------ */
static void test_status_strings(void) {
    const fl_status all[] = {FL_OK, FL_ERR_INVALID_ARGUMENT, FL_ERR_UNSUPPORTED, FL_ERR_OUT_OF_MEMORY,
                             FL_ERR_CUDA, FL_ERR_NOT_BUILT, FL_ERR_TARGET_OUT_OF_RANGE,
                             FL_ERR_INTERNAL, FL_ERR_INSUFFICIENT_WORKSPACE};
    const int n = (int)(sizeof all / sizeof all[0]);
    /* Values are fixed forever. */
    for (int i = 0; i < n; i++) CHECK((int)all[i] == i, "status enum value %d is %d", i, (int)all[i]);
    const char* s[16];
    for (int i = 0; i < n; i++) {
        s[i] = fl_status_string(all[i]);
        CHECK(s[i] != NULL && s[i][0] != '\0', "fl_status_string(%d) is NULL or empty", i);
        if (s[i]) printf("status %d: \"%s\"\n", i, s[i]);
    }
    const char* unk[3] = {fl_status_string((fl_status)9), fl_status_string((fl_status)-1),
                          fl_status_string((fl_status)1000)};
    for (int k = 0; k < 3; k++) {
        CHECK(unk[k] != NULL, "fl_status_string(out of range #%d) is NULL", k);
        CHECK(unk[k] && strcmp(unk[k], "unknown status") == 0,
              "fl_status_string(out of range #%d) = \"%s\", expected \"unknown status\"", k,
              unk[k] ? unk[k] : "(null)");
    }
    s[n] = unk[0];
    for (int i = 0; i <= n; i++)
        for (int j = i + 1; j <= n; j++)
            if (s[i] && s[j])
                CHECK(strcmp(s[i], s[j]) != 0, "status strings %d and %d are equal: \"%s\"", i, j, s[i]);
    CHECK(fl_status_string(FL_ERR_INVALID_ARGUMENT) == fl_status_string(FL_ERR_INVALID_ARGUMENT),
          "fl_status_string() is not a static string");
}

/* ------------------------------------------------------------------------------------------ */
static void test_options_init(void) {
    fl_ce_options o = FL_CE_OPTIONS_INIT;
    CHECK(o.struct_size == sizeof(fl_ce_options), "struct_size %zu", o.struct_size);
    CHECK(o.ignore_index == -100, "ignore_index %lld", (long long)o.ignore_index);
    CHECK(o.reduction == FL_REDUCTION_MEAN, "reduction %d", (int)o.reduction);
    CHECK(o.label_smoothing == 0.0f, "label_smoothing %g", o.label_smoothing);
    CHECK(o.weight == NULL, "weight not NULL");
    CHECK(o.z_loss == 0.0f, "z_loss %g", o.z_loss);
    CHECK(o.softcap == 0.0f, "softcap %g", o.softcap);
    CHECK(o.logit_scale == 1.0f, "logit_scale %g", o.logit_scale);
    CHECK(o.error_flag == NULL, "error_flag not NULL");
    /* PyTorch at::Reduction numbering */
    CHECK(FL_REDUCTION_NONE == 0 && FL_REDUCTION_MEAN == 1 && FL_REDUCTION_SUM == 2, "reduction numbering");
    CHECK(FL_DTYPE_F32 == 0 && FL_DTYPE_F16 == 1 && FL_DTYPE_BF16 == 2, "dtype numbering");
    CHECK(FL_INDEX_I32 == 0 && FL_INDEX_I64 == 1, "index dtype numbering");
    /* linear cross-entropy options */
    fl_lce_options l = FL_LCE_OPTIONS_INIT;
    CHECK(l.struct_size == sizeof(fl_lce_options), "lce struct_size %zu", l.struct_size);
    CHECK(l.chunk_rows == 0, "lce chunk_rows %lld", (long long)l.chunk_rows);
    CHECK(l.byte_budget == (size_t)512 << 20, "lce byte_budget %zu", l.byte_budget);
    CHECK(l.wgrad_accum == FL_LCE_ACCUM_AUTO, "lce wgrad_accum %d", (int)l.wgrad_accum);
    CHECK(l.allow_tf32 == 0, "lce allow_tf32 %d", (int)l.allow_tf32);
    CHECK(FL_LCE_ACCUM_AUTO == 0 && FL_LCE_ACCUM_FP32 == 1 && FL_LCE_ACCUM_LEAN == 2, "wgrad_accum numbering");
}

/* ------------------------------------------------------------------------------------------
 * fl_last_error(): "" after success, names the function after a failure, thread-local.
 * ---------------------------------------------------------------------------------------- */
enum { N_ = 4, V_ = 5 };
static float   g_logits[N_ * V_];
static int64_t g_targets[N_] = {0, 1, 4, 2};
static void*   g_ws;       /* workspace sized by fl_cross_entropy_workspace_size() */
static size_t  g_wsb;

static fl_status good_forward(float* loss) {
    return fl_cross_entropy_forward_cpu(loss, NULL, g_logits, g_targets, N_, V_, V_, FL_DTYPE_F32,
                                        FL_INDEX_I64, NULL, g_ws, g_wsb);
}

typedef struct {
    char before[64];    /* the new thread's message before any call */
    char after[1024];   /* its message after its own failure */
    fl_status st;
} thread_result;

static void* thread_body(void* arg) {
    thread_result* r = (thread_result*)arg;
    const char* e = fl_last_error();
    snprintf(r->before, sizeof r->before, "%s", e ? e : "(null)");
    float dl[N_ * V_];
    /* NULL lse in backward: invalid argument, recorded on this thread only. */
    r->st = fl_cross_entropy_backward_cpu(dl, g_logits, g_targets, NULL, NULL, 1.0f, N_, V_, V_,
                                          FL_DTYPE_F32, FL_INDEX_I64, NULL, g_ws, g_wsb);
    e = fl_last_error();
    snprintf(r->after, sizeof r->after, "%s", e ? e : "(null)");
    return NULL;
}

static void test_last_error(void) {
    size_t ws = 0;
    fl_status st = fl_cross_entropy_workspace_size(&ws, N_, V_, FL_DTYPE_F32, NULL);
    CHECK_STATUS(st, FL_OK, "workspace_size");
    g_wsb = ws;
    g_ws = ws ? tu_xmalloc(ws) : NULL;
    for (int i = 0; i < N_ * V_; i++) g_logits[i] = (float)(i % 7) * 0.25f - 0.5f;
    float loss = 0.0f;

    /* a failure names the function */
    st = fl_cross_entropy_forward_cpu(NULL, NULL, g_logits, g_targets, N_, V_, V_, FL_DTYPE_F32,
                                      FL_INDEX_I64, NULL, g_ws, g_wsb);
    CHECK_STATUS(st, FL_ERR_INVALID_ARGUMENT, "forward NULL loss");
    CHECK(fl_last_error() != NULL, "fl_last_error() is NULL");
    CHECK(contains(fl_last_error(), "fl_cross_entropy_forward_cpu"),
          "message after failure does not name the function: \"%s\"", fl_last_error());

    /* "" after success */
    st = good_forward(&loss);
    CHECK_STATUS(st, FL_OK, "forward");
    CHECK(fl_last_error() != NULL && fl_last_error()[0] == '\0', "after success fl_last_error() = \"%s\"",
          fl_last_error());

    st = fl_cross_entropy_workspace_size(NULL, N_, V_, FL_DTYPE_F32, NULL);
    CHECK_STATUS(st, FL_ERR_INVALID_ARGUMENT, "workspace_size(bytes = NULL)");
    CHECK(contains(fl_last_error(), "fl_cross_entropy_workspace_size"),
          "workspace_size failure message: \"%s\"", fl_last_error());
    st = fl_cross_entropy_workspace_size(&ws, N_, V_, FL_DTYPE_F32, NULL);
    CHECK_STATUS(st, FL_OK, "workspace_size");
    CHECK(fl_last_error()[0] == '\0', "after a successful workspace_size: \"%s\"", fl_last_error());

    /* thread-locality: a failure on another thread leaves this thread's message alone */
    st = fl_cross_entropy_fused_cpu(&loss, NULL, NULL, g_logits, g_targets, NULL, 1.0f, N_, V_, V_,
                                    FL_DTYPE_F32, FL_INDEX_I64, NULL, g_ws, g_wsb);
    CHECK_STATUS(st, FL_ERR_INVALID_ARGUMENT, "fused NULL dlogits");
    char mine[1024];
    snprintf(mine, sizeof mine, "%s", fl_last_error());
    CHECK(contains(mine, "fl_cross_entropy_fused_cpu"), "fused message: \"%s\"", mine);

    thread_result r;
    memset(&r, 0, sizeof r);
    pthread_t th;
    int rc = pthread_create(&th, NULL, thread_body, &r);
    CHECK(rc == 0, "pthread_create failed (%d)", rc);
    if (rc == 0) {
        pthread_join(th, NULL);
        CHECK(r.before[0] == '\0', "a new thread's fl_last_error() is \"%s\", expected \"\"", r.before);
        CHECK_STATUS(r.st, FL_ERR_INVALID_ARGUMENT, "backward NULL lse on a thread");
        CHECK(contains(r.after, "fl_cross_entropy_backward_cpu"), "thread's message: \"%s\"", r.after);
        CHECK(strcmp(fl_last_error(), mine) == 0,
              "main thread's message changed by another thread: \"%s\" (was \"%s\")", fl_last_error(), mine);
    }
    /* and a success on the main thread clears only the main thread's message */
    st = good_forward(&loss);
    CHECK(st == FL_OK && fl_last_error()[0] == '\0', "after success: \"%s\"", fl_last_error());
}

/* ------------------------------------------------------------------------------------------
 * CUDA entry points in a build without CUDA: FL_ERR_NOT_BUILT for valid arguments.
 * ---------------------------------------------------------------------------------------- */
static void test_cuda_not_built(void) {
    if (fl_cuda_built()) {
        printf("SKIP: CUDA entry points (this build has CUDA; tests/test_*_cuda.c cover them)\n");
        return;
    }
    float loss[N_], lse[N_], dl[N_ * V_], gl = 1.0f;
    fl_ce_options o = FL_CE_OPTIONS_INIT;
    fl_status st;

    st = fl_cross_entropy_forward_cuda(loss, lse, g_logits, g_targets, N_, V_, V_, FL_DTYPE_F32,
                                       FL_INDEX_I64, &o, g_ws, g_wsb, NULL);
    CHECK_STATUS(st, FL_ERR_NOT_BUILT, "fl_cross_entropy_forward_cuda");
    CHECK(contains(fl_last_error(), "fl_cross_entropy_forward_cuda"), "message: \"%s\"", fl_last_error());

    st = fl_cross_entropy_backward_cuda(dl, g_logits, g_targets, lse, &gl, 1.0f, N_, V_, V_,
                                        FL_DTYPE_F32, FL_INDEX_I64, &o, g_ws, g_wsb, NULL);
    CHECK_STATUS(st, FL_ERR_NOT_BUILT, "fl_cross_entropy_backward_cuda");
    CHECK(contains(fl_last_error(), "fl_cross_entropy_backward_cuda"), "message: \"%s\"", fl_last_error());

    st = fl_cross_entropy_fused_cuda(loss, lse, dl, g_logits, g_targets, &gl, 1.0f, N_, V_, V_,
                                     FL_DTYPE_F32, FL_INDEX_I64, &o, g_ws, g_wsb, NULL);
    CHECK_STATUS(st, FL_ERR_NOT_BUILT, "fl_cross_entropy_fused_cuda");
    CHECK(contains(fl_last_error(), "fl_cross_entropy_fused_cuda"), "message: \"%s\"", fl_last_error());

    /* NULL options too */
    st = fl_cross_entropy_fused_cuda(loss, NULL, dl, g_logits, g_targets, NULL, 1.0f, N_, V_, V_,
                                     FL_DTYPE_F32, FL_INDEX_I64, NULL, g_ws, g_wsb, NULL);
    CHECK_STATUS(st, FL_ERR_NOT_BUILT, "fl_cross_entropy_fused_cuda (opts NULL)");

    /* linear cross-entropy: the context and both passes */
    fl_lce_context* ctx = (fl_lce_context*)&o;   /* not NULL: create must reset it */
    st = fl_lce_context_create(&ctx);
    CHECK_STATUS(st, FL_ERR_NOT_BUILT, "fl_lce_context_create");
    CHECK(ctx == NULL, "fl_lce_context_create left *ctx = %p, expected NULL", (void*)ctx);
    CHECK(contains(fl_last_error(), "fl_lce_context_create"), "message: \"%s\"", fl_last_error());
    CHECK_STATUS(fl_lce_context_create(NULL), FL_ERR_NOT_BUILT, "fl_lce_context_create(NULL)");
    fl_lce_context_destroy(NULL);                 /* a no-op */
    CHECK_STATUS(fl_lce_context_set_tuning(NULL, 1), FL_ERR_NOT_BUILT, "fl_lce_context_set_tuning");
    enum { H_ = 8 };
    static float hid[N_ * H_], w[V_ * H_], dh[N_ * H_], dw[V_ * H_];
    size_t lwsb = 0;
    CHECK_STATUS(fl_linear_cross_entropy_workspace_size(&lwsb, N_, H_, V_, FL_DTYPE_F32, FL_DTYPE_F32, NULL, NULL),
                 FL_OK, "fl_linear_cross_entropy_workspace_size");
    void* lws = tu_xmalloc(lwsb);
    st = fl_linear_cross_entropy_forward_cuda(NULL, loss, lse, dh, dw, NULL, hid, H_, w, H_, NULL, g_targets, NULL,
                                              1.0f, N_, H_, V_, FL_DTYPE_F32, FL_DTYPE_F32, FL_INDEX_I64, NULL, NULL,
                                              lws, lwsb, NULL);
    CHECK_STATUS(st, FL_ERR_NOT_BUILT, "fl_linear_cross_entropy_forward_cuda");
    CHECK(contains(fl_last_error(), "fl_linear_cross_entropy_forward_cuda"), "message: \"%s\"", fl_last_error());
    st = fl_linear_cross_entropy_backward_cuda(NULL, dh, dw, NULL, hid, H_, w, H_, NULL, g_targets, lse, NULL, 1.0f,
                                               N_, H_, V_, FL_DTYPE_F32, FL_DTYPE_F32, FL_INDEX_I64, NULL, NULL, lws,
                                               lwsb, NULL);
    CHECK_STATUS(st, FL_ERR_NOT_BUILT, "fl_linear_cross_entropy_backward_cuda");
    CHECK(contains(fl_last_error(), "fl_linear_cross_entropy_backward_cuda"), "message: \"%s\"", fl_last_error());
    free(lws);
}

/* ------------------------------------------------------------------------------------------
 * fl_scale_rows_cpu: x[i, :V] *= g[per_row ? i : 0] rounded once from fp32; rows with factor 1
 * and the padding columns (ld > V) untouched bitwise; bad arguments get exact statuses.
 * ---------------------------------------------------------------------------------------- */
static void test_scale_rows(void) {
    const fl_dtype dts[3] = {FL_DTYPE_F32, FL_DTYPE_F16, FL_DTYPE_BF16};
    tu_rng r = tu_rng_seed(0x5ca1e);
    for (int d = 0; d < 3; d++) {
        for (int per_row = 0; per_row < 2; per_row++) {
            for (int one = 0; one < 2; one++) {  /* scalar factor exactly 1: nothing may change */
                const fl_dtype dt = dts[d];
                const int64_t N = 13, V = 37, ld = 41;
                const size_t es = tu_dtype_size(dt), bytes = (size_t)(N * ld) * es;
                unsigned char* x = (unsigned char*)tu_xmalloc(bytes);
                unsigned char* x0 = (unsigned char*)tu_xmalloc(bytes);
                float g[13];
                tu_poison(x, bytes);
                for (int64_t i = 0; i < N; i++)
                    for (int64_t j = 0; j < V; j++) tu_store(x, dt, i * ld + j, (float)tu_normal(&r));
                for (int i = 0; i < 13; i++) g[i] = (i % 3 == 0 || one) ? 1.0f : (float)tu_uniform_in(&r, -2.0, 2.0);
                if (!per_row && !one) g[0] = 0.37f;
                memcpy(x0, x, bytes);
                fl_status st = fl_scale_rows_cpu(x, N, V, ld, dt, g, per_row);
                CHECK_STATUS(st, FL_OK, "fl_scale_rows_cpu");
                int bad = 0;
                for (int64_t i = 0; i < N; i++) {
                    const float f = g[per_row ? i : 0];
                    for (int64_t j = 0; j < ld; j++) {
                        const int64_t k = i * ld + j;
                        if (j >= V || f == 1.0f) {  /* untouched, bitwise */
                            if (memcmp(x + k * es, x0 + k * es, es)) bad++;
                        } else {
                            const float want = tu_round_to(dt, tu_load(x0, dt, k) * f);
                            if (tu_load(x, dt, k) != want) bad++;
                        }
                    }
                }
                CHECK(bad == 0, "scale_rows %s per_row=%d one=%d: %d wrong elements", tu_dtype_name(dt), per_row,
                      one, bad);
                free(x);
                free(x0);
            }
        }
    }
    float x[8] = {0}, g = 2.0f;
    CHECK_STATUS(fl_scale_rows_cpu(NULL, 2, 4, 4, FL_DTYPE_F32, &g, 0), FL_ERR_INVALID_ARGUMENT, "x NULL");
    CHECK_STATUS(fl_scale_rows_cpu(x, 2, 4, 4, FL_DTYPE_F32, NULL, 0), FL_ERR_INVALID_ARGUMENT, "g NULL");
    CHECK_STATUS(fl_scale_rows_cpu(x, -1, 4, 4, FL_DTYPE_F32, &g, 0), FL_ERR_INVALID_ARGUMENT, "N < 0");
    CHECK_STATUS(fl_scale_rows_cpu(x, 2, 0, 4, FL_DTYPE_F32, &g, 0), FL_ERR_INVALID_ARGUMENT, "V < 1");
    CHECK_STATUS(fl_scale_rows_cpu(x, 2, 4, 3, FL_DTYPE_F32, &g, 0), FL_ERR_INVALID_ARGUMENT, "ld < V");
    CHECK_STATUS(fl_scale_rows_cpu(x, 2, 4, 4, (fl_dtype)7, &g, 0), FL_ERR_INVALID_ARGUMENT, "bad dtype");
    CHECK(contains(fl_last_error(), "fl_scale_rows_cpu"), "message names the function: \"%s\"", fl_last_error());
    CHECK_STATUS(fl_scale_rows_cpu(NULL, 0, 4, 4, FL_DTYPE_F32, NULL, 0), FL_OK, "N = 0, NULLs");
    if (!fl_cuda_built())
        CHECK_STATUS(fl_scale_rows_cuda(x, 2, 4, 4, FL_DTYPE_F32, &g, 0, NULL), FL_ERR_NOT_BUILT, "cuda stub");
}

int main(void) {
    test_scale_rows();
    test_version();
    test_status_strings();
    test_options_init();
    test_last_error();
    test_cuda_not_built();
    free(g_ws);
    return tu_finish();
}
