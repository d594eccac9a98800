/* vp_nccl.cu — fl_vp_cross_entropy_nccl (header section 8): the vocab-parallel steps with the
 * all-gather of step 2 done by NCCL on the caller's stream, for callers whose tensor-parallel
 * group is an ncclComm_t.
 *
 * Host code only: step 1 (fl_vp_ce_local_stats_cuda) into the workspace, ncclAllGather of the
 * [N][4] fp32 stats (16 N bytes per rank, rank order = the communicator's ranks), step 3
 * (fl_vp_ce_combine_cuda) into loss / lse, and with dlogits step 4 (fl_vp_ce_backward_cuda) with
 * the upstream gradient given up front (the fused mode of section 5). All on one stream, no host
 * sync, no allocation; capturable in a CUDA graph as far as NCCL's all-gather is (NCCL >= 2.9).
 *
 * NCCL is not a link dependency: the three functions used are resolved on first use with dlopen
 * (the process's libnccl.so.2 when one is loaded, e.g. PyTorch's; else the library named by
 * FUSEDLOSS_NCCL_LIBRARY, else libnccl.so.2 from the loader's path). Without it the entry returns
 * FL_ERR_UNSUPPORTED naming what it looked for.
 */
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>  // types and constants only
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "../internal.h"

typedef ncclResult_t (*ag_fn)(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);
typedef ncclResult_t (*ar_fn)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t);
typedef ncclResult_t (*count_fn)(const ncclComm_t, int*);
typedef const char* (*err_fn)(ncclResult_t);

static struct {
    ag_fn all_gather;
    ar_fn all_reduce;
    count_fn count;
    err_fn error_string;
    char where[256];
} g_nccl;
static pthread_once_t g_nccl_once = PTHREAD_ONCE_INIT;

static void nccl_load(void) {
    void* h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_NOLOAD);  // already in the process (torch)
    const char* env = getenv("FUSEDLOSS_NCCL_LIBRARY");
    if (!h && env && *env) h = dlopen(env, RTLD_NOW | RTLD_LOCAL);
    if (!h) h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!h) h = dlopen("libnccl.so", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(g_nccl.where, sizeof g_nccl.where, "libnccl.so.2 not found (%s)", dlerror());
        return;
    }
    g_nccl.all_gather = (ag_fn)dlsym(h, "ncclAllGather");
    g_nccl.all_reduce = (ar_fn)dlsym(h, "ncclAllReduce");
    g_nccl.count = (count_fn)dlsym(h, "ncclCommCount");
    g_nccl.error_string = (err_fn)dlsym(h, "ncclGetErrorString");
    if (!g_nccl.all_gather || !g_nccl.all_reduce || !g_nccl.count || !g_nccl.error_string) {
        g_nccl.all_gather = NULL;
        snprintf(g_nccl.where, sizeof g_nccl.where, "libnccl lacks ncclAllGather / ncclAllReduce / ncclCommCount");
    }
}

static size_t align256(size_t x) { return (x + 255u) & ~(size_t)255u; }

// Workspace: [CE workspace of the larger of steps 1/4 and 3][stats N x 16][gathered k N x 16][lse N x 4]
static fl_status nccl_ws_layout(const char* fn, int64_t N, int64_t V_local, int64_t V, fl_dtype dtype, int k,
                                const fl_ce_options* opts, size_t* ce, size_t* total) {
    size_t a = 0, b = 0;
    FL_CHECK(fl_cross_entropy_workspace_size(&a, N, V_local, dtype, opts));
    FL_CHECK(fl_cross_entropy_workspace_size(&b, N, V, FL_DTYPE_F16, opts));
    if (k < 1) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: k (%d) < 1 (the number of ranks)", fn, k);
    const size_t n = (size_t)(N > 0 ? N : 0);
    if (n > SIZE_MAX / 64u / (size_t)k)
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: N (%lld) too large", fn, (long long)N);
    *ce = align256(a > b ? a : b);
    *total = *ce + align256(16u * n) + align256(16u * n * (size_t)k) + align256(4u * n);
    return FL_OK;
}

extern "C" {

fl_status fl_vp_cross_entropy_nccl_workspace_size(size_t* bytes, int64_t N, int64_t V_local, int64_t V,
                                                  fl_dtype dtype, int k, const fl_ce_options* opts) {
    static const char* fn = "fl_vp_cross_entropy_nccl_workspace_size";
    fl__clear_error();
    if (!bytes) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: bytes is NULL", fn);
    if (N < 0 || V_local < 1 || V < V_local)
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: need N >= 0, 1 <= V_local <= V (got %lld, %lld, %lld)", fn,
                        (long long)N, (long long)V_local, (long long)V);
    size_t ce = 0;
    return nccl_ws_layout(fn, N, V_local, V, dtype, k, opts, &ce, bytes);
}

fl_status fl_vp_cross_entropy_nccl(float* loss, float* lse, void* dlogits, const void* logits, const void* targets,
                                   const float* grad_loss, float grad_scale, int64_t N, int64_t V_local, int64_t ld,
                                   int64_t vocab_start, int64_t V, fl_dtype dtype, fl_index_dtype index_dtype,
                                   const fl_ce_options* opts, void* nccl_comm, void* workspace,
                                   size_t workspace_bytes, fl_stream stream) {
    static const char* fn = "fl_vp_cross_entropy_nccl";
    fl__clear_error();
    if (!nccl_comm) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: nccl_comm is NULL", fn);
    pthread_once(&g_nccl_once, nccl_load);
    if (!g_nccl.all_gather) return fl__fail(FL_ERR_UNSUPPORTED, "%s: NCCL unavailable: %s", fn, g_nccl.where);
    int k = 0;
    ncclResult_t r = g_nccl.count((ncclComm_t)nccl_comm, &k);
    if (r != ncclSuccess)
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: ncclCommCount failed: %s", fn, g_nccl.error_string(r));
    if (N < 0 || V_local < 1 || V < V_local)
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: need N >= 0, 1 <= V_local <= V (got %lld, %lld, %lld)", fn,
                        (long long)N, (long long)V_local, (long long)V);
    size_t ce = 0, need = 0;
    FL_CHECK(nccl_ws_layout(fn, N, V_local, V, dtype, k, opts, &ce, &need));
    FL_CHECK(fl__check_workspace(fn, 1, workspace, workspace_bytes, need, NULL));
    if (!loss) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: loss is NULL", fn);
    char* w = (char*)workspace;
    const size_t n = (size_t)N;
    float* stats = (float*)(w + ce);
    float* gathered = (float*)(w + ce + align256(16u * n));
    float* lse_ws = (float*)(w + ce + align256(16u * n) + align256(16u * n * (size_t)k));
    float* lse_out = lse ? lse : lse_ws;
    // each step validates its own arguments (messages name the step); a failure before the
    // all-gather returns on this rank only: the caller's other ranks must not be left waiting,
    // so the checks that depend on the arguments alone are the same on every rank
    FL_CHECK(fl_vp_ce_local_stats_cuda(stats, logits, targets, N, V_local, ld, vocab_start, V, dtype, index_dtype,
                                       opts, workspace, ce, stream));
    if (N > 0) {
        r = g_nccl.all_gather(stats, gathered, 4u * n, ncclFloat32, (ncclComm_t)nccl_comm, (cudaStream_t)stream);
        if (r != ncclSuccess) return fl__fail(FL_ERR_CUDA, "%s: ncclAllGather failed: %s", fn, g_nccl.error_string(r));
    }
    FL_CHECK(fl_vp_ce_combine_cuda(loss, lse_out, gathered, k, targets, N, V, index_dtype, opts, workspace, ce,
                                   stream));
    if (dlogits)
        FL_CHECK(fl_vp_ce_backward_cuda(dlogits, logits, targets, lse_out, grad_loss, grad_scale, N, V_local, ld,
                                        vocab_start, V, dtype, index_dtype, opts, workspace, ce, stream));
    return FL_OK;
}

// ---- the linear variant: the chunk loop of linear_cross_entropy.cu with NCCL's collectives ----

static fl_status nccl_all_gather(const fl__vp_coll* c, const float* send, float* recv, size_t count, fl_stream s) {
    ncclResult_t r = g_nccl.all_gather(send, recv, count, ncclFloat32, (ncclComm_t)c->comm, (cudaStream_t)s);
    if (r != ncclSuccess)
        return fl__fail(FL_ERR_CUDA, "fl_vp_linear_cross_entropy_nccl: ncclAllGather failed: %s", g_nccl.error_string(r));
    return FL_OK;
}

static fl_status nccl_all_reduce_sum(const fl__vp_coll* c, float* buf, size_t count, fl_stream s) {
    ncclResult_t r = g_nccl.all_reduce(buf, buf, count, ncclFloat32, ncclSum, (ncclComm_t)c->comm, (cudaStream_t)s);
    if (r != ncclSuccess)
        return fl__fail(FL_ERR_CUDA, "fl_vp_linear_cross_entropy_nccl: ncclAllReduce failed: %s", g_nccl.error_string(r));
    return FL_OK;
}

fl_status fl_vp_linear_cross_entropy_nccl(fl_lce_context* ctx, float* loss, float* lse, void* dhidden, void* dweight,
                                          void* dbias, const void* hidden, int64_t ld_hidden, const void* weight,
                                          int64_t ld_weight, const void* bias, const void* targets,
                                          const float* grad_loss, float grad_scale, int64_t N, int64_t H,
                                          int64_t V_local, int64_t vocab_start, int64_t V, fl_dtype dtype,
                                          fl_dtype wgrad_dtype, fl_index_dtype index_dtype,
                                          const fl_ce_options* ce_opts, const fl_lce_options* lce_opts,
                                          void* nccl_comm, void* workspace, size_t workspace_bytes, fl_stream stream) {
    static const char* fn = "fl_vp_linear_cross_entropy_nccl";
    fl__clear_error();
    if (!nccl_comm) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: nccl_comm is NULL", fn);
    pthread_once(&g_nccl_once, nccl_load);
    if (!g_nccl.all_gather) return fl__fail(FL_ERR_UNSUPPORTED, "%s: NCCL unavailable: %s", fn, g_nccl.where);
    fl__vp_coll c;
    c.k = 0;
    ncclResult_t r = g_nccl.count((ncclComm_t)nccl_comm, &c.k);
    if (r != ncclSuccess)
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: ncclCommCount failed: %s", fn, g_nccl.error_string(r));
    c.comm = nccl_comm;
    c.all_gather = nccl_all_gather;
    c.all_reduce_sum = nccl_all_reduce_sum;
    // every argument is validated before the first collective (the same checks on every rank)
    return fl__vp_lce_cuda(fn, 2, ctx, &c, NULL, loss, lse, dhidden, dweight, dbias, hidden, ld_hidden, weight,
                           ld_weight, bias, targets, grad_loss, grad_scale, N, H, V_local, vocab_start, V, dtype,
                           wgrad_dtype, index_dtype, ce_opts, lce_opts, workspace, workspace_bytes, stream);
}

}  // extern "C"
