/* stub.c — CUDA entry points of a build without CUDA: they exist (so a dynamic lookup
 * never fails) and return FL_ERR_NOT_BUILT. Compiled only when nvcc is absent. */
#include "../internal.h"

#define FL_NOT_BUILT(fn) \
    (fl__clear_error(), fl__fail(FL_ERR_NOT_BUILT, "%s: this build of fusedloss has no CUDA backend", fn))

fl_status fl_cross_entropy_forward_cuda(float* loss, float* lse, const void* logits, const void* targets,
                                        int64_t N, int64_t V, int64_t ld, fl_dtype dtype,
                                        fl_index_dtype index_dtype, const fl_ce_options* opts,
                                        void* workspace, size_t workspace_bytes, fl_stream stream) {
    (void)loss; (void)lse; (void)logits; (void)targets; (void)N; (void)V; (void)ld; (void)dtype;
    (void)index_dtype; (void)opts; (void)workspace; (void)workspace_bytes; (void)stream;
    return FL_NOT_BUILT("fl_cross_entropy_forward_cuda");
}

fl_status fl_cross_entropy_backward_cuda(void* dlogits, const void* logits, const void* targets,
                                         const float* lse, const float* grad_loss, float grad_scale,
                                         int64_t N, int64_t V, int64_t ld, fl_dtype dtype,
                                         fl_index_dtype index_dtype, const fl_ce_options* opts,
                                         void* workspace, size_t workspace_bytes, fl_stream stream) {
    (void)dlogits; (void)logits; (void)targets; (void)lse; (void)grad_loss; (void)grad_scale; (void)N;
    (void)V; (void)ld; (void)dtype; (void)index_dtype; (void)opts; (void)workspace; (void)workspace_bytes;
    (void)stream;
    return FL_NOT_BUILT("fl_cross_entropy_backward_cuda");
}

fl_status fl_cross_entropy_fused_cuda(float* loss, float* lse, void* dlogits, const void* logits,
                                      const void* targets, const float* grad_loss, float grad_scale,
                                      int64_t N, int64_t V, int64_t ld, fl_dtype dtype,
                                      fl_index_dtype index_dtype, const fl_ce_options* opts,
                                      void* workspace, size_t workspace_bytes, fl_stream stream) {
    (void)loss; (void)lse; (void)dlogits; (void)logits; (void)targets; (void)grad_loss; (void)grad_scale;
    (void)N; (void)V; (void)ld; (void)dtype; (void)index_dtype; (void)opts; (void)workspace;
    (void)workspace_bytes; (void)stream;
    return FL_NOT_BUILT("fl_cross_entropy_fused_cuda");
}

fl_status fl_scale_rows_cuda(void* x, int64_t N, int64_t V, int64_t ld, fl_dtype dtype, const float* g,
                             int per_row, fl_stream stream) {
    (void)x; (void)N; (void)V; (void)ld; (void)dtype; (void)g; (void)per_row; (void)stream;
    return FL_NOT_BUILT("fl_scale_rows_cuda");
}

fl_status fl_gelu_forward_cuda(void* y, const void* x, const void* bias, int64_t N, int64_t F, int64_t ld_y,
                               int64_t ld_x, fl_dtype dtype, fl_dtype bias_dtype, fl_gelu_approx approx,
                               fl_stream stream) {
    (void)y; (void)x; (void)bias; (void)N; (void)F; (void)ld_y; (void)ld_x; (void)dtype; (void)bias_dtype;
    (void)approx; (void)stream;
    return FL_NOT_BUILT("fl_gelu_forward_cuda");
}

fl_status fl_gelu_backward_cuda(void* dx, void* dbias, const void* dy, const void* x, const void* bias,
                                int64_t N, int64_t F, int64_t ld_dx, int64_t ld_dy, int64_t ld_x,
                                fl_dtype dtype, fl_dtype bias_dtype, fl_gelu_approx approx, void* workspace,
                                size_t workspace_bytes, fl_stream stream) {
    (void)dx; (void)dbias; (void)dy; (void)x; (void)bias; (void)N; (void)F; (void)ld_dx; (void)ld_dy; (void)ld_x;
    (void)dtype; (void)bias_dtype; (void)approx; (void)workspace; (void)workspace_bytes; (void)stream;
    return FL_NOT_BUILT("fl_gelu_backward_cuda");
}

fl_status fl_lce_context_create(fl_lce_context** ctx) {
    if (ctx) *ctx = NULL;
    return FL_NOT_BUILT("fl_lce_context_create");
}

void fl_lce_context_destroy(fl_lce_context* ctx) { (void)ctx; }

fl_status fl_lce_context_set_tuning(fl_lce_context* ctx, int on) {
    (void)ctx; (void)on;
    return FL_NOT_BUILT("fl_lce_context_set_tuning");
}

fl_status fl_linear_cross_entropy_forward_cuda(
    fl_lce_context* ctx, float* loss, float* lse, void* dhidden, void* dweight, void* dbias, const void* hidden,
    int64_t ld_hidden, const void* weight, int64_t ld_weight, const void* bias, const void* targets,
    const float* grad_loss, float grad_scale, int64_t N, int64_t H, int64_t V, fl_dtype dtype, fl_dtype wgrad_dtype,
    fl_index_dtype index_dtype, const fl_ce_options* ce_opts, const fl_lce_options* lce_opts, void* workspace,
    size_t workspace_bytes, fl_stream stream) {
    (void)ctx; (void)loss; (void)lse; (void)dhidden; (void)dweight; (void)dbias; (void)hidden; (void)ld_hidden;
    (void)weight; (void)ld_weight; (void)bias; (void)targets; (void)grad_loss; (void)grad_scale; (void)N; (void)H;
    (void)V; (void)dtype; (void)wgrad_dtype; (void)index_dtype; (void)ce_opts; (void)lce_opts; (void)workspace;
    (void)workspace_bytes; (void)stream;
    return FL_NOT_BUILT("fl_linear_cross_entropy_forward_cuda");
}

fl_status fl_linear_cross_entropy_backward_cuda(
    fl_lce_context* ctx, void* dhidden, void* dweight, void* dbias, const void* hidden, int64_t ld_hidden,
    const void* weight, int64_t ld_weight, const void* bias, const void* targets, const float* lse,
    const float* grad_loss, float grad_scale, int64_t N, int64_t H, int64_t V, fl_dtype dtype, fl_dtype wgrad_dtype,
    fl_index_dtype index_dtype, const fl_ce_options* ce_opts, const fl_lce_options* lce_opts, void* workspace,
    size_t workspace_bytes, fl_stream stream) {
    (void)ctx; (void)dhidden; (void)dweight; (void)dbias; (void)hidden; (void)ld_hidden; (void)weight;
    (void)ld_weight; (void)bias; (void)targets; (void)lse; (void)grad_loss; (void)grad_scale; (void)N; (void)H;
    (void)V; (void)dtype; (void)wgrad_dtype; (void)index_dtype; (void)ce_opts; (void)lce_opts; (void)workspace;
    (void)workspace_bytes; (void)stream;
    return FL_NOT_BUILT("fl_linear_cross_entropy_backward_cuda");
}

fl_status fl_vp_ce_local_stats_cuda(float* stats, const void* logits, const void* targets, int64_t N,
                                    int64_t V_local, int64_t ld, int64_t vocab_start, int64_t V, fl_dtype dtype,
                                    fl_index_dtype index_dtype, const fl_ce_options* opts, void* workspace,
                                    size_t workspace_bytes, fl_stream stream) {
    (void)stats; (void)logits; (void)targets; (void)N; (void)V_local; (void)ld; (void)vocab_start; (void)V;
    (void)dtype; (void)index_dtype; (void)opts; (void)workspace; (void)workspace_bytes; (void)stream;
    return FL_NOT_BUILT("fl_vp_ce_local_stats_cuda");
}

fl_status fl_vp_ce_combine_cuda(float* loss, float* lse, const float* gathered, int k, const void* targets,
                                int64_t N, int64_t V, fl_index_dtype index_dtype, const fl_ce_options* opts,
                                void* workspace, size_t workspace_bytes, fl_stream stream) {
    (void)loss; (void)lse; (void)gathered; (void)k; (void)targets; (void)N; (void)V; (void)index_dtype;
    (void)opts; (void)workspace; (void)workspace_bytes; (void)stream;
    return FL_NOT_BUILT("fl_vp_ce_combine_cuda");
}

fl_status fl_vp_ce_backward_cuda(void* dlogits, const void* logits, const void* targets, const float* lse,
                                 const float* grad_loss, float grad_scale, int64_t N, int64_t V_local, int64_t ld,
                                 int64_t vocab_start, int64_t V, fl_dtype dtype, fl_index_dtype index_dtype,
                                 const fl_ce_options* opts, void* workspace, size_t workspace_bytes,
                                 fl_stream stream) {
    (void)dlogits; (void)logits; (void)targets; (void)lse; (void)grad_loss; (void)grad_scale; (void)N;
    (void)V_local; (void)ld; (void)vocab_start; (void)V; (void)dtype; (void)index_dtype; (void)opts;
    (void)workspace; (void)workspace_bytes; (void)stream;
    return FL_NOT_BUILT("fl_vp_ce_backward_cuda");
}

fl_status fl_vp_cross_entropy_nccl_workspace_size(size_t* bytes, int64_t N, int64_t V_local, int64_t V,
                                                  fl_dtype dtype, int k, const fl_ce_options* opts) {
    (void)bytes; (void)N; (void)V_local; (void)V; (void)dtype; (void)k; (void)opts;
    return FL_NOT_BUILT("fl_vp_cross_entropy_nccl_workspace_size");
}

fl_status fl_vp_cross_entropy_nccl(float* loss, float* lse, void* dlogits, const void* logits, const void* targets,
                                   const float* grad_loss, float grad_scale, int64_t N, int64_t V_local, int64_t ld,
                                   int64_t vocab_start, int64_t V, fl_dtype dtype, fl_index_dtype index_dtype,
                                   const fl_ce_options* opts, void* nccl_comm, void* workspace,
                                   size_t workspace_bytes, fl_stream stream) {
    (void)loss; (void)lse; (void)dlogits; (void)logits; (void)targets; (void)grad_loss; (void)grad_scale; (void)N;
    (void)V_local; (void)ld; (void)vocab_start; (void)V; (void)dtype; (void)index_dtype; (void)opts;
    (void)nccl_comm; (void)workspace; (void)workspace_bytes; (void)stream;
    return FL_NOT_BUILT("fl_vp_cross_entropy_nccl");
}

fl_status fl_vp_linear_ce_local_stats_cuda(fl_lce_context* ctx, float* stats, const void* hidden, int64_t ld_hidden,
                                           const void* weight, int64_t ld_weight, const void* bias,
                                           const void* targets, int64_t N, int64_t H, int64_t V_local,
                                           int64_t vocab_start, int64_t V, fl_dtype dtype, fl_index_dtype index_dtype,
                                           const fl_ce_options* ce_opts, const fl_lce_options* lce_opts,
                                           void* workspace, size_t workspace_bytes, fl_stream stream) {
    (void)ctx; (void)stats; (void)hidden; (void)ld_hidden; (void)weight; (void)ld_weight; (void)bias; (void)targets;
    (void)N; (void)H; (void)V_local; (void)vocab_start; (void)V; (void)dtype; (void)index_dtype; (void)ce_opts;
    (void)lce_opts; (void)workspace; (void)workspace_bytes; (void)stream;
    return FL_NOT_BUILT("fl_vp_linear_ce_local_stats_cuda");
}

fl_status fl_vp_linear_ce_backward_cuda(fl_lce_context* ctx, float* dhidden_partial, void* dweight, void* dbias,
                                        const void* hidden, int64_t ld_hidden, const void* weight, int64_t ld_weight,
                                        const void* bias, const void* targets, const float* lse,
                                        const float* grad_loss, float grad_scale, int64_t N, int64_t H,
                                        int64_t V_local, int64_t vocab_start, int64_t V, fl_dtype dtype,
                                        fl_dtype wgrad_dtype, fl_index_dtype index_dtype,
                                        const fl_ce_options* ce_opts, const fl_lce_options* lce_opts,
                                        void* workspace, size_t workspace_bytes, fl_stream stream) {
    (void)ctx; (void)dhidden_partial; (void)dweight; (void)dbias; (void)hidden; (void)ld_hidden; (void)weight;
    (void)ld_weight; (void)bias; (void)targets; (void)lse; (void)grad_loss; (void)grad_scale; (void)N; (void)H;
    (void)V_local; (void)vocab_start; (void)V; (void)dtype; (void)wgrad_dtype; (void)index_dtype; (void)ce_opts;
    (void)lce_opts; (void)workspace; (void)workspace_bytes; (void)stream;
    return FL_NOT_BUILT("fl_vp_linear_ce_backward_cuda");
}

fl_status fl_vp_linear_cross_entropy_nccl(fl_lce_context* ctx, float* loss, float* lse, void* dhidden, void* dweight,
                                          void* dbias, const void* hidden, int64_t ld_hidden, const void* weight,
                                          int64_t ld_weight, const void* bias, const void* targets,
                                          const float* grad_loss, float grad_scale, int64_t N, int64_t H,
                                          int64_t V_local, int64_t vocab_start, int64_t V, fl_dtype dtype,
                                          fl_dtype wgrad_dtype, fl_index_dtype index_dtype,
                                          const fl_ce_options* ce_opts, const fl_lce_options* lce_opts,
                                          void* nccl_comm, void* workspace, size_t workspace_bytes, fl_stream stream) {
    (void)ctx; (void)loss; (void)lse; (void)dhidden; (void)dweight; (void)dbias; (void)hidden; (void)ld_hidden;
    (void)weight; (void)ld_weight; (void)bias; (void)targets; (void)grad_loss; (void)grad_scale; (void)N; (void)H;
    (void)V_local; (void)vocab_start; (void)V; (void)dtype; (void)wgrad_dtype; (void)index_dtype; (void)ce_opts;
    (void)lce_opts; (void)nccl_comm; (void)workspace; (void)workspace_bytes; (void)stream;
    return FL_NOT_BUILT("fl_vp_linear_cross_entropy_nccl");
}

/* ---- section 9: elementwise losses (sigmoid focal, BCE with logits) --------------------------- */

fl_status fl_sigmoid_focal_forward_cuda(float* loss, const void* logits, const void* targets, int64_t n,
                                        fl_dtype dtype, float alpha, float gamma, fl_reduction reduction,
                                        void* workspace, size_t workspace_bytes, fl_stream stream) {
    (void)loss; (void)logits; (void)targets; (void)n; (void)dtype; (void)alpha; (void)gamma; (void)reduction;
    (void)workspace; (void)workspace_bytes; (void)stream;
    return FL_NOT_BUILT("fl_sigmoid_focal_forward_cuda");
}

fl_status fl_sigmoid_focal_backward_cuda(void* dlogits, const void* logits, const void* targets,
                                         const float* grad_loss, float grad_scale, int64_t n, fl_dtype dtype,
                                         float alpha, float gamma, fl_reduction reduction, fl_stream stream) {
    (void)dlogits; (void)logits; (void)targets; (void)grad_loss; (void)grad_scale; (void)n; (void)dtype;
    (void)alpha; (void)gamma; (void)reduction; (void)stream;
    return FL_NOT_BUILT("fl_sigmoid_focal_backward_cuda");
}

fl_status fl_sigmoid_focal_fused_cuda(float* loss, void* dlogits, const void* logits, const void* targets,
                                      const float* grad_loss, float grad_scale, int64_t n, fl_dtype dtype,
                                      float alpha, float gamma, fl_reduction reduction, void* workspace,
                                      size_t workspace_bytes, fl_stream stream) {
    (void)loss; (void)dlogits; (void)logits; (void)targets; (void)grad_loss; (void)grad_scale; (void)n;
    (void)dtype; (void)alpha; (void)gamma; (void)reduction; (void)workspace; (void)workspace_bytes; (void)stream;
    return FL_NOT_BUILT("fl_sigmoid_focal_fused_cuda");
}

fl_status fl_bce_with_logits_forward_cuda(float* loss, const void* logits, const void* targets, const float* weight,
                                          const float* pos_weight, int64_t N, int64_t C, fl_dtype dtype,
                                          fl_reduction reduction, void* workspace, size_t workspace_bytes,
                                          fl_stream stream) {
    (void)loss; (void)logits; (void)targets; (void)weight; (void)pos_weight; (void)N; (void)C; (void)dtype;
    (void)reduction; (void)workspace; (void)workspace_bytes; (void)stream;
    return FL_NOT_BUILT("fl_bce_with_logits_forward_cuda");
}

fl_status fl_bce_with_logits_backward_cuda(void* dlogits, const void* logits, const void* targets,
                                           const float* weight, const float* pos_weight, const float* grad_loss,
                                           float grad_scale, int64_t N, int64_t C, fl_dtype dtype,
                                           fl_reduction reduction, fl_stream stream) {
    (void)dlogits; (void)logits; (void)targets; (void)weight; (void)pos_weight; (void)grad_loss; (void)grad_scale;
    (void)N; (void)C; (void)dtype; (void)reduction; (void)stream;
    return FL_NOT_BUILT("fl_bce_with_logits_backward_cuda");
}

fl_status fl_bce_with_logits_fused_cuda(float* loss, void* dlogits, const void* logits, const void* targets,
                                        const float* weight, const float* pos_weight, const float* grad_loss,
                                        float grad_scale, int64_t N, int64_t C, fl_dtype dtype,
                                        fl_reduction reduction, void* workspace, size_t workspace_bytes,
                                        fl_stream stream) {
    (void)loss; (void)dlogits; (void)logits; (void)targets; (void)weight; (void)pos_weight; (void)grad_loss;
    (void)grad_scale; (void)N; (void)C; (void)dtype; (void)reduction; (void)workspace; (void)workspace_bytes;
    (void)stream;
    return FL_NOT_BUILT("fl_bce_with_logits_fused_cuda");
}

/* ---- section 10: distillation divergences -------------------------------------------------- */

fl_status fl_distill_forward_cuda(float* loss, const void* student, int64_t ld_student, const void* teacher,
                                  int64_t ld_teacher, fl_dtype teacher_dtype, const void* labels,
                                  fl_index_dtype label_dtype, int64_t N, int64_t V, fl_dtype dtype,
                                  const fl_distill_options* opts, void* workspace, size_t workspace_bytes,
                                  fl_stream stream) {
    (void)loss; (void)student; (void)ld_student; (void)teacher; (void)ld_teacher; (void)teacher_dtype;
    (void)labels; (void)label_dtype; (void)N; (void)V; (void)dtype; (void)opts; (void)workspace;
    (void)workspace_bytes; (void)stream;
    return FL_NOT_BUILT("fl_distill_forward_cuda");
}

fl_status fl_distill_fused_cuda(float* loss, void* dstudent, const void* student, int64_t ld_student,
                                const void* teacher, int64_t ld_teacher, fl_dtype teacher_dtype, const void* labels,
                                fl_index_dtype label_dtype, const float* grad_loss, float grad_scale, int64_t N,
                                int64_t V, fl_dtype dtype, const fl_distill_options* opts, void* workspace,
                                size_t workspace_bytes, fl_stream stream) {
    (void)loss; (void)dstudent; (void)student; (void)ld_student; (void)teacher; (void)ld_teacher;
    (void)teacher_dtype; (void)labels; (void)label_dtype; (void)grad_loss; (void)grad_scale; (void)N; (void)V;
    (void)dtype; (void)opts; (void)workspace; (void)workspace_bytes; (void)stream;
    return FL_NOT_BUILT("fl_distill_fused_cuda");
}

fl_status fl_margin_ce_forward_cuda(float* loss, float* lse, const void* logits, int64_t ld, const void* targets,
                                    fl_index_dtype index_dtype, int64_t N, int64_t C, fl_dtype dtype,
                                    const fl_margin_options* opts, void* workspace, size_t workspace_bytes,
                                    fl_stream stream) {
    (void)loss; (void)lse; (void)logits; (void)ld; (void)targets; (void)index_dtype; (void)N; (void)C; (void)dtype;
    (void)opts; (void)workspace; (void)workspace_bytes; (void)stream;
    return FL_NOT_BUILT("fl_margin_ce_forward_cuda");
}

fl_status fl_margin_ce_fused_cuda(float* loss, float* lse, void* dlogits, const void* logits, int64_t ld,
                                  const void* targets, fl_index_dtype index_dtype, const float* grad_loss,
                                  float grad_scale, int64_t N, int64_t C, fl_dtype dtype, const fl_margin_options* opts,
                                  void* workspace, size_t workspace_bytes, fl_stream stream) {
    (void)loss; (void)lse; (void)dlogits; (void)logits; (void)ld; (void)targets; (void)index_dtype; (void)grad_loss;
    (void)grad_scale; (void)N; (void)C; (void)dtype; (void)opts; (void)workspace; (void)workspace_bytes; (void)stream;
    return FL_NOT_BUILT("fl_margin_ce_fused_cuda");
}

fl_status fl_softmax_focal_forward_cuda(float* loss, const void* logits, int64_t ld, const void* targets,
                                        fl_index_dtype index_dtype, int64_t N, int64_t C, int64_t d, fl_dtype dtype,
                                        const fl_focal_options* opts, void* workspace, size_t workspace_bytes,
                                        fl_stream stream) {
    (void)loss; (void)logits; (void)ld; (void)targets; (void)index_dtype; (void)N; (void)C; (void)d; (void)dtype;
    (void)opts; (void)workspace; (void)workspace_bytes; (void)stream;
    return FL_NOT_BUILT("fl_softmax_focal_forward_cuda");
}

fl_status fl_softmax_focal_fused_cuda(float* loss, void* dlogits, const void* logits, int64_t ld, const void* targets,
                                      fl_index_dtype index_dtype, const float* grad_loss, float grad_scale, int64_t N,
                                      int64_t C, int64_t d, fl_dtype dtype, const fl_focal_options* opts,
                                      void* workspace, size_t workspace_bytes, fl_stream stream) {
    (void)loss; (void)dlogits; (void)logits; (void)ld; (void)targets; (void)index_dtype; (void)grad_loss;
    (void)grad_scale; (void)N; (void)C; (void)d; (void)dtype; (void)opts; (void)workspace; (void)workspace_bytes;
    (void)stream;
    return FL_NOT_BUILT("fl_softmax_focal_fused_cuda");
}

fl_status fl_lovasz_softmax_forward_cuda(float* loss, const void* input, int64_t ld, const void* labels,
                                         fl_index_dtype index_dtype, int64_t N, int64_t C, int64_t d, fl_dtype dtype,
                                         const fl_lovasz_options* opts, void* workspace, size_t workspace_bytes,
                                         fl_stream stream) {
    (void)loss; (void)input; (void)ld; (void)labels; (void)index_dtype; (void)N; (void)C; (void)d; (void)dtype;
    (void)opts; (void)workspace; (void)workspace_bytes; (void)stream;
    return FL_NOT_BUILT("fl_lovasz_softmax_forward_cuda");
}

fl_status fl_lovasz_softmax_fused_cuda(float* loss, void* dinput, const void* input, int64_t ld, const void* labels,
                                       fl_index_dtype index_dtype, const float* grad_loss, float grad_scale,
                                       int64_t N, int64_t C, int64_t d, fl_dtype dtype,
                                       const fl_lovasz_options* opts, void* workspace, size_t workspace_bytes,
                                       fl_stream stream) {
    (void)loss; (void)dinput; (void)input; (void)ld; (void)labels; (void)index_dtype; (void)grad_loss;
    (void)grad_scale; (void)N; (void)C; (void)d; (void)dtype; (void)opts; (void)workspace; (void)workspace_bytes;
    (void)stream;
    return FL_NOT_BUILT("fl_lovasz_softmax_fused_cuda");
}

fl_status fl_taylor_ce_forward_cuda(float* loss, const void* logits, int64_t ld, const void* targets,
                                    fl_index_dtype index_dtype, int64_t N, int64_t C, fl_dtype dtype,
                                    const fl_taylor_options* opts, void* workspace, size_t workspace_bytes,
                                    fl_stream stream) {
    (void)loss; (void)logits; (void)ld; (void)targets; (void)index_dtype; (void)N; (void)C; (void)dtype; (void)opts;
    (void)workspace; (void)workspace_bytes; (void)stream;
    return FL_NOT_BUILT("fl_taylor_ce_forward_cuda");
}

fl_status fl_taylor_ce_fused_cuda(float* loss, void* dlogits, const void* logits, int64_t ld, const void* targets,
                                  fl_index_dtype index_dtype, const float* grad_loss, float grad_scale, int64_t N,
                                  int64_t C, fl_dtype dtype, const fl_taylor_options* opts, void* workspace,
                                  size_t workspace_bytes, fl_stream stream) {
    (void)loss; (void)dlogits; (void)logits; (void)ld; (void)targets; (void)index_dtype; (void)grad_loss;
    (void)grad_scale; (void)N; (void)C; (void)dtype; (void)opts; (void)workspace; (void)workspace_bytes; (void)stream;
    return FL_NOT_BUILT("fl_taylor_ce_fused_cuda");
}

fl_status fl_large_margin_ce_forward_cuda(float* loss, const void* logits, int64_t ld, const void* targets,
                                          fl_index_dtype index_dtype, int64_t N, int64_t C, fl_dtype dtype,
                                          const fl_large_margin_options* opts, void* workspace,
                                          size_t workspace_bytes, fl_stream stream) {
    (void)loss; (void)logits; (void)ld; (void)targets; (void)index_dtype; (void)N; (void)C; (void)dtype; (void)opts;
    (void)workspace; (void)workspace_bytes; (void)stream;
    return FL_NOT_BUILT("fl_large_margin_ce_forward_cuda");
}

fl_status fl_large_margin_ce_fused_cuda(float* loss, void* dlogits, const void* logits, int64_t ld,
                                        const void* targets, fl_index_dtype index_dtype, const float* grad_loss,
                                        float grad_scale, int64_t N, int64_t C, fl_dtype dtype,
                                        const fl_large_margin_options* opts, void* workspace,
                                        size_t workspace_bytes, fl_stream stream) {
    (void)loss; (void)dlogits; (void)logits; (void)ld; (void)targets; (void)index_dtype; (void)grad_loss;
    (void)grad_scale; (void)N; (void)C; (void)dtype; (void)opts; (void)workspace; (void)workspace_bytes; (void)stream;
    return FL_NOT_BUILT("fl_large_margin_ce_fused_cuda");
}
