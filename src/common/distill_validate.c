/* distill_validate.c — argument checks shared by the CPU and CUDA backends of the distillation
 * divergences (include/fusedloss.h section 10: forward KL, reverse KL, generalised JSD on raw
 * logits), the workspace layout (src/internal.h, fl__distill_workspace_bytes) and the public size
 * query fl_distill_workspace_size().
 *
 * Every message names the public function and the offending value (NCCL ArgsCheck style).
 * Nothing here dereferences a caller pointer except *opts.
 * SPDX-License-Identifier: MIT
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../internal.h"

static size_t align256(size_t x) { return (x + 255u) & ~(size_t)255u; }

static int64_t distill_chunks(int64_t V) { return V > 0 ? (V + FL__DISTILL_CHUNK - 1) / FL__DISTILL_CHUNK : 1; }

/* 1 when 256 + align256(4N) + align256(8N) + align256(32 N chunks) does not fit in a size_t
 * (N >= 0, V >= 1): the per-row bytes (12 + 32 chunks) times N, plus 4 x 255 bytes of rounding */
static int distill_ws_overflows(int64_t N, int64_t V) {
    if (N <= 0) return 0;
    const uint64_t per_row = 12u + 32u * (uint64_t)distill_chunks(V);   /* chunks < 2^51: no overflow */
    return (uint64_t)N > ((uint64_t)SIZE_MAX - 1024u) / per_row;
}

size_t fl__distill_workspace_bytes(int64_t N, int64_t V) {
    const size_t n = (size_t)(N > 0 ? N : 0);
    if (distill_ws_overflows(N, V)) return SIZE_MAX;   /* saturate: no workspace can be that large */
    const size_t chunks = (size_t)distill_chunks(V);
    /* header | fp32 per-row losses | two int32 counters per row | 8 fp32 per (row, chunk) */
    return 256u + align256(4u * n) + align256(8u * n) + align256(32u * n * chunks);
}

static int known_dtype(fl_dtype dt) { return fl__dtype_size(dt) != 0; }

fl_status fl_distill_workspace_size(size_t* bytes, int64_t N, int64_t V, fl_dtype dtype,
                                    const fl_distill_options* opts) {
    static const char* fn = "fl_distill_workspace_size";
    fl__clear_error();
    if (!bytes) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: bytes is NULL", fn);
    if (N < 0) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: N (%lld) < 0", fn, (long long)N);
    if (V < 1) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: V (%lld) < 1", fn, (long long)V);
    if (!known_dtype(dtype)) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: unknown dtype (%d)", fn, (int)dtype);
    if (opts && opts->struct_size != sizeof(fl_distill_options))
        return fl__fail(FL_ERR_INVALID_ARGUMENT,
                        "%s: opts->struct_size (%zu) != sizeof(fl_distill_options) (%zu); initialise with "
                        "FL_DISTILL_OPTIONS_INIT", fn, opts->struct_size, sizeof(fl_distill_options));
    if (distill_ws_overflows(N, V))
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: workspace for N (%lld) x V (%lld) overflows size_t", fn,
                        (long long)N, (long long)V);
    *bytes = fl__distill_workspace_bytes(N, V);
    return FL_OK;
}

static int finitef_(float v) { return v == v && v - v == 0.0f; }

/* N rows of stride ld elements of esize bytes addressable in 64 bits (every byte range below) */
static fl_status check_extent(const char* fn, const char* ld_name, int64_t N, int64_t ld, size_t esize) {
    if (N > 0 && (uint64_t)ld > (uint64_t)INT64_MAX / (uint64_t)N / esize)
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: N*%s (%lld*%lld) overflows", fn, ld_name, (long long)N,
                        (long long)ld);
    return FL_OK;
}

fl_status fl__distill_validate(const char* fn, fl__pass pass, int is_cuda, const float* loss, const void* dstudent,
                               const void* student, int64_t ld_student, const void* teacher, int64_t ld_teacher,
                               fl_dtype teacher_dtype, const void* labels, fl_index_dtype label_dtype,
                               const float* grad_loss, float grad_scale, int64_t N, int64_t V, fl_dtype dtype,
                               const fl_distill_options* opts, const void* workspace, size_t workspace_bytes,
                               fl__distill_params* p) {
    static const fl_distill_options defaults = FL_DISTILL_OPTIONS_INIT;
    const int fused = pass == FL__PASS_FUSED;
    memset(p, 0, sizeof(*p));

    /* sizes first: every byte-range computation below depends on them */
    if (N < 0) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: N (%lld) < 0", fn, (long long)N);
    if (V < 1) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: V (%lld) < 1", fn, (long long)V);
    if (ld_student < V)
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: ld_student (%lld) < V (%lld)", fn, (long long)ld_student,
                        (long long)V);
    if (ld_teacher < V)
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: ld_teacher (%lld) < V (%lld)", fn, (long long)ld_teacher,
                        (long long)V);

    /* dtypes and 64-bit extents */
    const size_t es = fl__dtype_size(dtype), tes = fl__dtype_size(teacher_dtype);
    if (es == 0) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: unknown dtype (%d)", fn, (int)dtype);
    if (tes == 0)
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: unknown teacher_dtype (%d)", fn, (int)teacher_dtype);
    const size_t is = labels ? fl__index_size(label_dtype) : 0;
    if (labels && is == 0)
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: unknown label_dtype (%d)", fn, (int)label_dtype);
    FL_CHECK(check_extent(fn, "ld_student", N, ld_student, es));
    FL_CHECK(check_extent(fn, "ld_teacher", N, ld_teacher, tes));
    if (distill_ws_overflows(N, V))
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: workspace for N (%lld) x V (%lld) overflows size_t", fn,
                        (long long)N, (long long)V);

    /* options (NULL = FL_DISTILL_OPTIONS_INIT) */
    const fl_distill_options* o = opts ? opts : &defaults;
    if (o->struct_size != sizeof(fl_distill_options))
        return fl__fail(FL_ERR_INVALID_ARGUMENT,
                        "%s: opts->struct_size (%zu) != sizeof(fl_distill_options) (%zu); initialise with "
                        "FL_DISTILL_OPTIONS_INIT", fn, o->struct_size, sizeof(fl_distill_options));
    if (!finitef_(o->temperature) || !(o->temperature > 0.0f))
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: opts->temperature (%g) must be finite and > 0", fn,
                        (double)o->temperature);
    if (o->t2_scale && !finitef_(o->temperature * o->temperature))
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: opts->temperature (%g) squared overflows fp32 (t2_scale)", fn,
                        (double)o->temperature);
    if (!(o->beta >= 0.0f && o->beta <= 1.0f))   /* NaN fails too */
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: opts->beta (%g) not in [0, 1]", fn, (double)o->beta);
    if (o->reduction != FL_REDUCTION_NONE && o->reduction != FL_REDUCTION_MEAN && o->reduction != FL_REDUCTION_SUM &&
        o->reduction != FL_REDUCTION_BATCHMEAN)
        return fl__fail(FL_ERR_INVALID_ARGUMENT,
                        "%s: unknown opts->reduction (%d); use FL_REDUCTION_NONE (0), FL_REDUCTION_MEAN (1), "
                        "FL_REDUCTION_SUM (2) or FL_REDUCTION_BATCHMEAN (3)", fn, (int)o->reduction);
    if (fused && !finitef_(grad_scale))
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: grad_scale (%g) must be finite", fn, (double)grad_scale);

    /* required pointers */
    if (!fused && !loss) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: loss is NULL", fn);
    if (N > 0 && !student) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: student is NULL", fn);
    if (N > 0 && !teacher) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: teacher is NULL", fn);
    if (fused && N > 0 && !dstudent) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: dstudent is NULL", fn);
    if (!fused) { dstudent = NULL; grad_loss = NULL; }   /* not used by the forward */

    /* every pointer aligned to its element size (both backends: the CPU dereferences them) */
    {
        const void* ps[6] = {student, teacher, dstudent, labels, loss, grad_loss};
        const char* names[6] = {"student", "teacher", "dstudent", "labels", "loss", "grad_loss"};
        const size_t al[6] = {es, tes, es, is ? is : 1u, 4u, 4u};
        for (int k = 0; k < 6; k++)
            if (ps[k] && ((uintptr_t)ps[k] % al[k]))
                return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: %s (%p) is not aligned to its element size (%zu)",
                                fn, names[k], ps[k], al[k]);
    }

    /* CUDA-only limit: the teacher is read as the student's dtype or as fp32 */
    if (is_cuda && teacher_dtype != dtype && teacher_dtype != FL_DTYPE_F32)
        return fl__fail(FL_ERR_UNSUPPORTED,
                        "%s: teacher_dtype (%d) must be the student's dtype (%d) or FL_DTYPE_F32 (%d) on CUDA", fn,
                        (int)teacher_dtype, (int)dtype, (int)FL_DTYPE_F32);

    /* workspace */
    const size_t need = fl__distill_workspace_bytes(N, V);
    FL_CHECK(fl__check_workspace(fn, is_cuda, workspace, workspace_bytes, need, "fl_distill_workspace_size()"));

    /* aliasing: dstudent == student (in place) is the only overlap allowed */
    const size_t nred = o->reduction == FL_REDUCTION_NONE ? (size_t)N : 1u;
    const size_t s_bytes = N > 0 ? ((size_t)(N - 1) * (size_t)ld_student + (size_t)V) * es : 0;
    const size_t t_bytes = N > 0 ? ((size_t)(N - 1) * (size_t)ld_teacher + (size_t)V) * tes : 0;
    const fl__range r_s = fl__mkrange(student, s_bytes);
    const fl__range r_t = fl__mkrange(teacher, t_bytes);
    const fl__range r_lab = fl__mkrange(labels, (size_t)N * is);
    const fl__range r_ds = fl__mkrange(dstudent, s_bytes);
    const fl__range r_l = fl__mkrange(loss, nred * 4u);
    const fl__range r_g = fl__mkrange(grad_loss, nred * 4u);
    const fl__range r_ws = fl__mkrange(workspace, need);
    if (dstudent && dstudent != student && fl__overlap(r_ds, r_s))
        return fl__fail(FL_ERR_INVALID_ARGUMENT,
                        "%s: dstudent (%p) partially overlaps student (%p); only dstudent == student (in place) is "
                        "allowed", fn, dstudent, student);
    if (fl__overlap(r_ds, r_t) || fl__overlap(r_ds, r_lab) || fl__overlap(r_ds, r_l) || fl__overlap(r_ds, r_g) ||
        fl__overlap(r_ds, r_ws))
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: dstudent (%p) overlaps another argument", fn, dstudent);
    if (fl__overlap(r_l, r_s) || fl__overlap(r_l, r_t) || fl__overlap(r_l, r_lab) || fl__overlap(r_l, r_g) ||
        fl__overlap(r_l, r_ws))
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: loss (%p) overlaps another argument", fn, (const void*)loss);
    if (fl__overlap(r_ws, r_s) || fl__overlap(r_ws, r_t) || fl__overlap(r_ws, r_lab) || fl__overlap(r_ws, r_g))
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: workspace (%p) overlaps another argument", fn, workspace);

    /* resolved parameters */
    p->N = N;
    p->V = V;
    p->ld_s = ld_student;
    p->ld_t = ld_teacher;
    p->dtype = dtype;
    p->teacher_dtype = teacher_dtype;
    p->label_dtype = label_dtype;
    p->labels = labels;
    p->ignore_index = o->ignore_index;
    p->temperature = o->temperature;
    p->beta = o->beta;
    p->mode = o->beta == 0.0f ? FL__DISTILL_FKL : o->beta == 1.0f ? FL__DISTILL_RKL : FL__DISTILL_JSD;
    p->loss_scale = o->t2_scale ? o->temperature * o->temperature : 1.0f;
    p->reduction = o->reduction;
    p->chunks = distill_chunks(V);
    return FL_OK;
}
