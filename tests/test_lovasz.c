/* test_lovasz.c — CPU backend of the Lovasz-softmax loss (include/fusedloss.h section 13) against
 * an independent long-double reference written from the header's formulas: the rank of each pixel
 * in its class's order is counted directly (O(P^2): #{j: e_j > e_i, or e_j == e_i and j < i}, the
 * header's tie order), J before / after the pixel from the counts of fg / bg pixels ranked at or
 * before it, no sort at all. The reference gradient is checked by central finite differences of the
 * reference loss (w.r.t. the probabilities, and w.r.t. the logits through the softmax), and on a
 * small case the reference and the library are compared with Berman's lovasz_grad written
 * literally (stable sort, cumsum, jaccard[1:] -= jaccard[:-1]). Grid: classes PRESENT / ALL,
 * per_image 0 / 1, from_logits 0 / 1, N = 0, 1, 2, 3, C = 1, 2, 19, d = 1, 7, 64, 300, ld > C*d
 * (padding NaN: neither read nor written), int32 / int64 labels, ignored pixels (their inputs NaN:
 * never read), every pixel ignored, an image without valid pixels (per_image), an absent class,
 * fp32 / fp16 / bf16 (the inputs rounded to the dtype), grad_loss NULL / given, grad_scale != 1,
 * loss NULL, in place, outputs poisoned before every call. Ties (equal errors): the loss is checked
 * against the reference and against the same pixels permuted. The size query, the labels check and
 * every bad argument's status and message (outputs untouched on error).
 *
 * Build / run: make test (this is build/test_lovasz). Prints "N passed, M failed".
 * SPDX-License-Identifier: MIT
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fusedloss.h"
#include "test_util.h"
#include "zoo_test_util.h"

typedef long double LD;

/* loss: fp32 output of a double computation; dinput: 1 ulp of the dtype plus a subnormal step and
 * the double error of J differences (1e-13 |w|) */
static const double RTOL_LOSS = 3e-7, ATOL_LOSS = 1e-7;
static const double RTOL_DX[3] = {1.1920928955078125e-7, 9.765625e-4, 7.8125e-3};
static const double ATOL_DX[3] = {1.5e-45, 5.97e-8, 9.2e-41};
static const LD FD_H = 1e-8L;

/* ---- reference ---------------------------------------------------------------------------- */
/* prob [P][C] (pixel-major), lab [P] (-1: ignored). Returns the loss; dp (or NULL): w * dloss/dp
 * with w = g, the upstream gradient (already including 1/K and 1/N). */
static LD ref_loss(const LD* prob, const int64_t* lab, int64_t N, int64_t C, int64_t d, int all, int per_image,
                   LD g, LD* dp) {
    const int64_t P = N * d, nsets = per_image ? N : (N > 0), len = per_image ? d : P;
    if (dp) for (int64_t k = 0; k < P * C; k++) dp[k] = 0;
    LD total = 0;
    for (int64_t s = 0; s < nsets; s++) {
        const int64_t i0 = s * len, i1 = i0 + len;
        int64_t V = 0, K = 0;
        for (int64_t i = i0; i < i1; i++) V += lab[i] >= 0;
        if (V == 0) continue;
        for (int64_t c = 0; c < C; c++) {
            int64_t G = 0;
            for (int64_t i = i0; i < i1; i++) G += lab[i] == c;
            K += all || G > 0;
        }
        const LD w = g / (LD)K / (per_image ? (LD)N : 1);
        LD sl = 0;
        for (int64_t c = 0; c < C; c++) {
            int64_t G = 0;
            for (int64_t i = i0; i < i1; i++) G += lab[i] == c;
            if (!all && G == 0) continue;
            for (int64_t i = i0; i < i1; i++) {
                if (lab[i] < 0) continue;
                const int fi = lab[i] == c;
                const LD ei = fabsl((LD)fi - prob[i * C + c]);
                int64_t nfg = 0, nbg = 0;   /* pixels ranked at or before i */
                for (int64_t j = i0; j < i1; j++) {
                    if (lab[j] < 0) continue;
                    const LD ej = fabsl((LD)(lab[j] == c) - prob[j * C + c]);
                    if (ej > ei || (ej == ei && j <= i)) { if (lab[j] == c) nfg++; else nbg++; }
                }
                const LD Jat = 1 - ((LD)G - nfg) / ((LD)G + nbg);
                const int64_t pfg = nfg - fi, pbg = nbg - !fi;
                const LD Jbefore = (pfg + pbg == 0) ? 0 : 1 - ((LD)G - pfg) / ((LD)G + pbg);
                const LD D = Jat - Jbefore;
                sl += ei * D;
                if (dp) dp[i * C + c] = w * D * (fi ? -1 : 1);
            }
        }
        total += sl / (LD)K;
    }
    return per_image && N > 0 ? total / (LD)N : total;
}

static void softmax_ld(const LD* x, LD* p, int64_t P, int64_t C, const int64_t* lab) {
    for (int64_t i = 0; i < P; i++) {
        if (lab[i] < 0) { for (int64_t c = 0; c < C; c++) p[i * C + c] = 0.25L; continue; }
        LD m = -INFINITY, s = 0;
        for (int64_t c = 0; c < C; c++) if (x[i * C + c] > m) m = x[i * C + c];
        for (int64_t c = 0; c < C; c++) s += expl(x[i * C + c] - m);
        for (int64_t c = 0; c < C; c++) p[i * C + c] = expl(x[i * C + c] - m) / s;
    }
}

/* loss of input values v [P][C] (probabilities or logits); dv (or NULL): gradient w.r.t. v */
static LD ref_full(const LD* v, const int64_t* lab, int64_t N, int64_t C, int64_t d, int all, int per_image,
                   int logits, LD g, LD* dv) {
    const int64_t P = N * d;
    if (!logits) return ref_loss(v, lab, N, C, d, all, per_image, g, dv);
    LD* p = tu_xmalloc((size_t)(P * C + 1) * sizeof(LD));
    softmax_ld(v, p, P, C, lab);
    LD* dp = dv ? tu_xmalloc((size_t)(P * C + 1) * sizeof(LD)) : NULL;
    const LD l = ref_loss(p, lab, N, C, d, all, per_image, g, dp);
    if (dv)
        for (int64_t i = 0; i < P; i++) {
            LD s = 0;
            for (int64_t c = 0; c < C; c++) s += p[i * C + c] * dp[i * C + c];
            for (int64_t c = 0; c < C; c++) dv[i * C + c] = lab[i] < 0 ? 0 : p[i * C + c] * (dp[i * C + c] - s);
        }
    free(p);
    free(dp);
    return l;
}

/* ---- one configuration ------------------------------------------------------------------- */
typedef struct {
    int64_t N, C, d, pad;
    fl_dtype dt;
    int all, per_image, logits;
    int tgt32;
    double ign_frac;
    int all_ignored, empty_image, absent;
    int gl;
    float gscale;
} cfg_t;

static void run_cfg(const cfg_t* c, uint64_t seed) {
    const int64_t N = c->N, C = c->C, d = c->d, Cd = C * d, ld = Cd + c->pad, P = N * d;
    const size_t es = tu_dtype_size(c->dt), xbytes = (size_t)(N * ld) * es + 8;
    const int di = c->dt == FL_DTYPE_F32 ? 0 : c->dt == FL_DTYPE_F16 ? 1 : 2;
    tu_rng r = tu_rng_seed(seed);
    char name[300];
    snprintf(name, sizeof name, "%s per_image=%d logits=%d N=%lld C=%lld d=%lld ld=%lld %s i%d ign=%g%s%s%s gl=%d gs=%g",
             c->all ? "all" : "present", c->per_image, c->logits, (long long)N, (long long)C, (long long)d,
             (long long)ld, tu_dtype_name(c->dt), c->tgt32 ? 32 : 64, c->ign_frac, c->all_ignored ? " allign" : "",
             c->empty_image ? " empty-img" : "", c->absent ? " absent" : "", c->gl, c->gscale);

    void* x = tu_xmalloc(xbytes);
    tu_poison(x, xbytes);   /* NaN: padding and ignored pixels */
    int64_t* lab = tu_xmalloc((size_t)P * 8 + 8);     /* -1: ignored (reference) */
    int64_t* t64 = tu_xmalloc((size_t)P * 8 + 8);
    int32_t* t32 = tu_xmalloc((size_t)P * 4 + 4);
    LD* v = tu_xmalloc((size_t)(P * C + 1) * sizeof(LD));
    const int64_t ncls = c->absent && C > 1 ? C - 1 : C;   /* absent: class C-1 never a label */
    for (int64_t i = 0; i < P; i++) {
        int ig = c->all_ignored || tu_uniform(&r) < c->ign_frac || (c->empty_image && i / d == 0);
        lab[i] = ig ? -1 : tu_int_in(&r, 0, ncls - 1);
        t64[i] = ig ? -100 : lab[i];
        t32[i] = (int32_t)t64[i];
        for (int64_t k = 0; k < C; k++) {
            v[i * C + k] = 0;
            if (ig) continue;
            const float val = c->logits ? (float)(2.0 * tu_normal(&r)) : (float)tu_uniform(&r);
            const int64_t e = (i / d) * ld + k * d + i % d;
            tu_store(x, c->dt, e, val);
            v[i * C + k] = tu_load(x, c->dt, e);
        }
    }
    const void* labels = c->tgt32 ? (const void*)t32 : (const void*)t64;
    const fl_index_dtype it = c->tgt32 ? FL_INDEX_I32 : FL_INDEX_I64;
    const float glv = -1.25f;
    const LD g = (LD)c->gscale * (c->gl ? (LD)glv : 1);

    fl_lovasz_options o = FL_LOVASZ_OPTIONS_INIT;
    o.classes = c->all ? FL_LOVASZ_ALL : FL_LOVASZ_PRESENT;
    o.per_image = c->per_image;
    o.from_logits = c->logits;
    size_t wsb = 0;
    CHECK_STATUS(fl_lovasz_softmax_workspace_size(&wsb, N, C, d, c->dt, &o), FL_OK, "workspace size");
    char* ws = tu_xmalloc(wsb + 1);
    tu_poison(ws, wsb + 1);
    void* wsu = ws + 1;   /* deliberately misaligned: a CPU workspace need not be aligned */
    char* ws2 = tu_xmalloc(wsb);

    LD* dv = tu_xmalloc((size_t)(P * C + 1) * sizeof(LD));
    const LD lref = ref_full(v, lab, N, C, d, c->all, c->per_image, c->logits, g, dv);

    /* finite differences of the reference (fp32 only: coarser dtypes make ties likely) */
    if (c->dt == FL_DTYPE_F32 && P * C <= 4000) {
        int64_t bad = 0, n = 0;
        for (int64_t i = 0; i < P && n < 24; i += 1 + P / 8) {
            if (lab[i] < 0) continue;
            for (int64_t k = 0; k < C && k < 4; k++, n++) {
                const LD v0 = v[i * C + k];
                v[i * C + k] = v0 + FD_H;
                const LD lp = ref_full(v, lab, N, C, d, c->all, c->per_image, c->logits, g, NULL);
                v[i * C + k] = v0 - FD_H;
                const LD lm = ref_full(v, lab, N, C, d, c->all, c->per_image, c->logits, g, NULL);
                v[i * C + k] = v0;
                const LD fd = g * (lp - lm) / (2 * FD_H);   /* dv is scaled by g */
                if (!(fabsl(fd - dv[i * C + k]) <= 1e-6L * fabsl(fd) + 1e-9L * fabsl(g))) {
                    if (bad < 3) printf("  %s: fd pixel %lld class %lld: ref %.12Lg fd %.12Lg\n", name, (long long)i,
                                        (long long)k, dv[i * C + k], fd);
                    bad++;
                }
            }
        }
        CHECK(bad == 0, "%s: %lld of %lld finite differences disagree with the reference gradient", name,
              (long long)bad, (long long)n);
    }

    float L[2], L2[2];
    void* dx = tu_xmalloc(xbytes);
    void* dx2 = tu_xmalloc(xbytes);
    void* xin = tu_xmalloc(xbytes);
    char nm[400];
    double got, want = (double)lref;

    tu_poison(L, sizeof L);
    fl_status st = fl_lovasz_softmax_forward_cpu(L, x, ld, labels, it, N, C, d, c->dt, &o, wsu, wsb);
    snprintf(nm, sizeof nm, "%s forward", name);
    if (CHECK_STATUS(st, FL_OK, nm)) {
        got = L[0];
        snprintf(nm, sizeof nm, "%s forward loss", name);
        check_close(nm, &got, &want, 1, ATOL_LOSS, RTOL_LOSS);
        CHECK(tu_is_poison(L, 4, 1), "%s: loss[1] written", name);
    }

    tu_poison(L2, sizeof L2);
    tu_poison(dx, xbytes);
    st = fl_lovasz_softmax_fused_cpu(L2, dx, x, ld, labels, it, c->gl ? &glv : NULL, c->gscale, N, C, d, c->dt, &o,
                                     ws2, wsb);
    snprintf(nm, sizeof nm, "%s fused", name);
    if (CHECK_STATUS(st, FL_OK, nm)) {
        CHECK(memcmp(L, L2, 4) == 0, "%s: fused loss %.9g != forward loss %.9g", name, L2[0], L[0]);
        const int64_t ne = P * C + 1;
        double* gd = tu_xmalloc((size_t)ne * 8);
        double* rd = tu_xmalloc((size_t)ne * 8);
        double* sl = tu_xmalloc((size_t)ne * 8);
        int64_t padbad = 0, ignbad = 0;
        for (int64_t i = 0; i < P; i++)
            for (int64_t k = 0; k < C; k++) {
                const int64_t e = (i / d) * ld + k * d + i % d;
                gd[i * C + k] = tu_load(dx, c->dt, e);
                rd[i * C + k] = (double)dv[i * C + k];
                sl[i * C + k] = 1e-12 * (double)fabsl(g);
                if (lab[i] < 0 && tu_bits(dx, c->dt, e) != 0) ignbad++;   /* +0 exactly */
            }
        for (int64_t n = 0; n < N; n++)
            for (int64_t j = Cd; j < ld; j++) padbad += !tu_is_poison(dx, es, n * ld + j);
        snprintf(nm, sizeof nm, "%s dinput", name);
        check_close_ex(nm, gd, rd, sl, P * C, ATOL_DX[di], RTOL_DX[di]);
        CHECK(padbad == 0 && ignbad == 0, "%s: padding written (%lld) / ignored pixels not +0 (%lld)", name,
              (long long)padbad, (long long)ignbad);
        CHECK(tu_is_poison(dx, 1, (int64_t)(xbytes - 8)), "%s: dinput written past its end", name);
        free(gd); free(rd); free(sl);

        /* loss NULL: the same gradient; in place: the same bits */
        tu_poison(dx2, xbytes);
        st = fl_lovasz_softmax_fused_cpu(NULL, dx2, x, ld, labels, it, c->gl ? &glv : NULL, c->gscale, N, C, d,
                                         c->dt, &o, wsu, wsb);
        CHECK(st == FL_OK && memcmp(dx, dx2, xbytes) == 0, "%s: fused with loss NULL differs (%d)", name, (int)st);
        memcpy(xin, x, xbytes);
        tu_poison(L2, sizeof L2);
        st = fl_lovasz_softmax_fused_cpu(L2, xin, xin, ld, labels, it, c->gl ? &glv : NULL, c->gscale, N, C, d,
                                         c->dt, &o, ws2, wsb);
        int ipbad = 0;   /* in place: the C*d elements equal dx, padding keeps the input's NaN bytes */
        for (int64_t n = 0; n < N; n++)
            ipbad |= memcmp((char*)xin + (size_t)(n * ld) * es, (char*)dx + (size_t)(n * ld) * es, (size_t)Cd * es) != 0;
        CHECK(st == FL_OK && !ipbad && memcmp(L, L2, 4) == 0, "%s: in place differs (%d)", name, (int)st);
    }
    free(x); free(lab); free(t64); free(t32); free(v); free(dv); free(ws); free(ws2); free(dx); free(dx2); free(xin);
}

/* ---- Berman's lovasz_softmax_flat, literally --------------------------------------------- */
static LD berman_flat(const LD* prob, const int64_t* lab, int64_t P, int64_t C, int all) {
    LD* err = tu_xmalloc((size_t)P * sizeof(LD));
    LD* fg = tu_xmalloc((size_t)P * sizeof(LD));
    LD* jac = tu_xmalloc((size_t)P * sizeof(LD));
    int64_t* perm = tu_xmalloc((size_t)P * 8);
    LD sum = 0;
    int64_t cnt = 0;
    for (int64_t c = 0; c < C; c++) {
        int64_t n = 0;
        LD fsum = 0;
        for (int64_t i = 0; i < P; i++) {
            if (lab[i] < 0) continue;
            fg[n] = lab[i] == c;
            err[n] = fabsl(fg[n] - prob[i * C + c]);
            fsum += fg[n];
            perm[n] = n;
            n++;
        }
        if (!all && fsum == 0) continue;   /* classes == 'present' */
        /* torch.sort(errors, 0, descending=True), made stable (insertion sort) */
        for (int64_t a = 1; a < n; a++) {
            const int64_t t = perm[a];
            int64_t b = a - 1;
            while (b >= 0 && err[perm[b]] < err[t]) { perm[b + 1] = perm[b]; b--; }
            perm[b + 1] = t;
        }
        /* lovasz_grad(fg_sorted) */
        LD gts = fsum, cf = 0, cb = 0;
        for (int64_t k = 0; k < n; k++) {
            cf += fg[perm[k]];
            cb += 1 - fg[perm[k]];
            const LD intersection = gts - cf, uni = gts + cb;
            jac[k] = 1 - intersection / uni;
        }
        for (int64_t k = n - 1; k >= 1; k--) jac[k] = jac[k] - jac[k - 1];
        LD dot = 0;
        for (int64_t k = 0; k < n; k++) dot += err[perm[k]] * jac[k];
        sum += dot;
        cnt++;
    }
    free(err); free(fg); free(jac); free(perm);
    return cnt ? sum / cnt : 0;
}

static void test_berman(void) {
    tu_rng r = tu_rng_seed(77);
    const int64_t P = 12, C = 3;
    float X[36];
    int64_t t[12], lab[12];
    LD pv[36];
    for (int64_t i = 0; i < P; i++) {
        t[i] = i == 5 ? -100 : tu_int_in(&r, 0, 1);   /* class 2 absent */
        lab[i] = t[i] == -100 ? -1 : t[i];
    }
    for (int64_t i = 0; i < P; i++)
        for (int64_t c = 0; c < C; c++) {
            X[c * P + i] = (float)tu_uniform(&r);   /* N = 1, d = P: element (0, c, i) at c * P + i */
            pv[i * C + c] = X[c * P + i];
        }
    for (int all = 0; all < 2; all++) {
        fl_lovasz_options o = FL_LOVASZ_OPTIONS_INIT;
        o.classes = all ? FL_LOVASZ_ALL : FL_LOVASZ_PRESENT;
        size_t wsb;
        fl_lovasz_softmax_workspace_size(&wsb, 1, C, P, FL_DTYPE_F32, &o);
        void* ws = tu_xmalloc(wsb);
        float L = -1;
        fl_status st = fl_lovasz_softmax_forward_cpu(&L, X, C * P, t, FL_INDEX_I64, 1, C, P, FL_DTYPE_F32, &o, ws, wsb);
        const double b = (double)berman_flat(pv, lab, P, C, all);
        const double rr = (double)ref_loss(pv, lab, 1, C, P, all, 0, 1, NULL);
        CHECK(st == FL_OK && fabs(L - b) <= 1e-7 + 3e-7 * fabs(b) && fabs(rr - b) <= 1e-15,
              "berman literal (all=%d): lib %.9g berman %.12g ref %.12g", all, L, b, rr);
        free(ws);
    }
}

/* ---- ties: equal errors; the loss does not depend on the order ---------------------------- */
static void test_ties(void) {
    const int64_t P = 16, C = 2;
    float X[32], Y[32], D[32];
    int64_t t[16], tp[16], lab[16], labp[16];
    LD pv[32], pvp[32], dv[32];
    for (int64_t i = 0; i < P; i++) {
        t[i] = (i * 7) % 3 == 0 ? 1 : 0;
        const float p1 = (i % 4 == 0) ? 0.5f : (i % 4 == 1) ? 0.25f : (i % 4 == 2) ? 0.75f : 0.5f;
        X[0 * P + i] = 1.0f - p1;
        X[1 * P + i] = p1;
        const int64_t j = P - 1 - i;   /* reversed pixel order */
        tp[j] = t[i];
        Y[0 * P + j] = 1.0f - p1;
        Y[1 * P + j] = p1;
    }
    for (int64_t i = 0; i < P; i++) {
        lab[i] = t[i]; labp[i] = tp[i];
        for (int64_t c = 0; c < C; c++) { pv[i * C + c] = X[c * P + i]; pvp[i * C + c] = Y[c * P + i]; }
    }
    for (int pi = 0; pi < 2; pi++)
        for (int all = 0; all < 2; all++) {
            fl_lovasz_options o = FL_LOVASZ_OPTIONS_INIT;
            o.classes = all;
            o.per_image = pi;
            const int64_t N = pi ? 2 : 1, d = pi ? 8 : 16;   /* per_image: two images of 8 pixels */
            if (pi) continue;   /* reversal mixes the images; the flat case is the interesting one */
            size_t wsb;
            fl_lovasz_softmax_workspace_size(&wsb, N, C, d, FL_DTYPE_F32, &o);
            void* ws = tu_xmalloc(wsb);
            float L1 = -1, L2 = -2;
            fl_status s1 = fl_lovasz_softmax_fused_cpu(&L1, D, X, C * d, t, FL_INDEX_I64, NULL, 1.0f, N, C, d,
                                                       FL_DTYPE_F32, &o, ws, wsb);
            fl_status s2 = fl_lovasz_softmax_forward_cpu(&L2, Y, C * d, tp, FL_INDEX_I64, N, C, d, FL_DTYPE_F32, &o,
                                                         ws, wsb);
            const LD r1 = ref_loss(pv, lab, N, C, d, all, 0, 1, dv);
            const LD r2 = ref_loss(pvp, labp, N, C, d, all, 0, 1, NULL);
            const double b = (double)berman_flat(pv, lab, P, C, all);
            CHECK(s1 == FL_OK && s2 == FL_OK && fabsl(r1 - r2) <= 1e-15L && fabs((double)r1 - b) <= 1e-15 &&
                  fabs(L1 - (double)r1) <= 1e-7 && fabs(L2 - (double)r1) <= 1e-7,
                  "ties (all=%d): lib %.9g / permuted %.9g, ref %.12Lg / permuted %.12Lg, berman %.12g", all, L1, L2,
                  r1, r2, b);
            double gd[32], rd[32];
            for (int64_t i = 0; i < P; i++)
                for (int64_t c = 0; c < C; c++) { gd[i * C + c] = D[c * P + i]; rd[i * C + c] = (double)dv[i * C + c]; }
            check_close(all ? "ties gradient (all, header tie order)" : "ties gradient (present, header tie order)",
                        gd, rd, 32, 1e-15, 1.2e-7);
            free(ws);
        }
}

/* ---- edge cases ----------------------------------------------------------------------------- */
static void test_edges(void) {
    /* N = 0: loss 0, NULL arrays fine */
    size_t wsb;
    fl_lovasz_options o = FL_LOVASZ_OPTIONS_INIT;
    CHECK_STATUS(fl_lovasz_softmax_workspace_size(&wsb, 0, 3, 5, FL_DTYPE_F32, &o), FL_OK, "size N=0");
    CHECK(wsb == 64 + 24, "size N=0: %zu", wsb);
    void* ws = tu_xmalloc(4096);
    float L = -1;
    CHECK_STATUS(fl_lovasz_softmax_forward_cpu(&L, NULL, 15, NULL, FL_INDEX_I64, 0, 3, 5, FL_DTYPE_F32, &o, ws, wsb),
                 FL_OK, "N = 0 forward");
    CHECK(L == 0.0f, "N = 0 loss %g", L);
    L = -1;
    CHECK_STATUS(fl_lovasz_softmax_fused_cpu(&L, NULL, NULL, 15, NULL, FL_INDEX_I64, NULL, 1.0f, 0, 3, 5,
                                             FL_DTYPE_F32, &o, ws, wsb), FL_OK, "N = 0 fused");
    CHECK(L == 0.0f, "N = 0 fused loss %g", L);
    /* closed form: one pixel, C = 2, label 0, p = (0.3, 0.7): class 0 e = 0.7 D = 1; class 1 absent
     * (PRESENT: loss 0.7; ALL: (0.7 + 0.7) / 2) */
    float X[2] = {0.3f, 0.7f}, DX[2];
    int64_t t[1] = {0};
    for (int all = 0; all < 2; all++) {
        o.classes = all;
        fl_lovasz_softmax_workspace_size(&wsb, 1, 2, 1, FL_DTYPE_F32, &o);
        CHECK_STATUS(fl_lovasz_softmax_fused_cpu(&L, DX, X, 2, t, FL_INDEX_I64, NULL, 1.0f, 1, 2, 1, FL_DTYPE_F32,
                                                 &o, ws, wsb), FL_OK, "closed form");
        CHECK(fabsf(L - 0.7f) < 1e-7f && DX[0] == (all ? -0.5f : -1.0f) && DX[1] == (all ? 0.5f : 0.0f),
              "closed form all=%d: loss %g d (%g, %g)", all, L, DX[0], DX[1]);
    }
    /* the workspace formula */
    o = (fl_lovasz_options)FL_LOVASZ_OPTIONS_INIT;
    CHECK(fl_lovasz_softmax_workspace_size(&wsb, 3, 19, 7, FL_DTYPE_BF16, NULL) == FL_OK &&
          wsb == 64 + 16 * 21 + 8 * 19, "size probabilities: %zu", wsb);
    o.from_logits = 1;
    CHECK(fl_lovasz_softmax_workspace_size(&wsb, 3, 19, 7, FL_DTYPE_BF16, &o) == FL_OK &&
          wsb == 64 + 16 * 21 + 8 * 19 + 8 * 21 + 8 * 21 * 19, "size logits: %zu", wsb);
    free(ws);
}

/* ---- bad arguments ------------------------------------------------------------------------- */
static void test_errors(void) {
    /* N = 2, C = 4, d = 8, ld = 32 */
    float X[64], L[2], D[64], G[2] = {1.0f, 1.0f};
    int64_t tg[16];
    for (int k = 0; k < 64; k++) X[k] = (float)((k * 37) % 64) / 64.0f;
    for (int k = 0; k < 16; k++) tg[k] = k % 4;
    tg[2] = -100;
    size_t wsb;
    fl_lovasz_options o = FL_LOVASZ_OPTIONS_INIT, ob;
    o.from_logits = 1;
    fl_lovasz_softmax_workspace_size(&wsb, 2, 4, 8, FL_DTYPE_F32, &o);
    char* ws = tu_xmalloc(wsb + 512);
    const fl_dtype F = FL_DTYPE_F32;
    const fl_index_dtype I = FL_INDEX_I64;
    const char* fnname = "fl_lovasz_softmax_forward_cpu";
#define EXPECT(call_, want, what) ZT_EXPECT(call_, want, what, fnname, L, D)
#define FWD(loss_, x_, ld_, t_, it_, N_, C_, d_, dt_, o_, ws_, wsb_) \
    fl_lovasz_softmax_forward_cpu(loss_, x_, ld_, t_, it_, N_, C_, d_, dt_, o_, ws_, wsb_)
    EXPECT(FWD(L, X, 32, tg, I, 2, 4, 8, F, &o, ws, wsb), FL_OK, "valid forward");
    EXPECT(FWD(L, X, 32, tg, I, -1, 4, 8, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "N < 0");
    EXPECT(FWD(L, X, 32, tg, I, 2, 0, 8, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "C < 1");
    EXPECT(FWD(L, X, 32, tg, I, 2, 4, 0, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "d < 1");
    EXPECT(FWD(L, X, 31, tg, I, 2, 4, 8, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "ld < C*d");
    CHECK(strstr(fl_last_error(), "ld (31)") != NULL, "ld message: %s", fl_last_error());
    EXPECT(FWD(L, X, INT64_MAX, tg, I, 2, INT64_MAX / 2, 4, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "C*d overflows");
    CHECK(strstr(fl_last_error(), "C*d") != NULL, "C*d message: %s", fl_last_error());
    EXPECT(FWD(L, X, INT64_MAX / 4, tg, I, 2, 4, 8, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "N*ld overflow");
    /* bf16, N = 2^22, C = 2^20, d = 2^20 - 1: the extent fits, 8 P C (gp) does not fit in 64 bits */
    EXPECT(FWD(L, X, ((int64_t)1 << 40) - ((int64_t)1 << 20), tg, I, (int64_t)1 << 22, (int64_t)1 << 20,
               ((int64_t)1 << 20) - 1, FL_DTYPE_BF16, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "workspace overflow");
    CHECK(strstr(fl_last_error(), "overflows") != NULL, "ws overflow message: %s", fl_last_error());
    EXPECT(FWD(NULL, X, 32, tg, I, 2, 4, 8, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "loss NULL");
    EXPECT(FWD(L, NULL, 32, tg, I, 2, 4, 8, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "input NULL");
    CHECK(strstr(fl_last_error(), "input") != NULL, "input message: %s", fl_last_error());
    EXPECT(FWD(L, X, 32, NULL, I, 2, 4, 8, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "labels NULL");
    EXPECT(FWD(L, X, 32, tg, I, 2, 4, 8, (fl_dtype)7, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "dtype 7");
    EXPECT(FWD(L, X, 32, tg, (fl_index_dtype)5, 2, 4, 8, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "index_dtype 5");
    EXPECT(FWD(L, (char*)X + 2, 32, tg, I, 1, 4, 8, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "input misaligned");
    EXPECT(FWD(L, X, 32, (char*)tg + 4, I, 1, 4, 8, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "labels misaligned");
    EXPECT(FWD((float*)((char*)L + 1), X, 32, tg, I, 2, 4, 8, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT,
           "loss misaligned");
    ob = o; ob.struct_size = 8;
    EXPECT(FWD(L, X, 32, tg, I, 2, 4, 8, F, &ob, ws, wsb), FL_ERR_INVALID_ARGUMENT, "struct_size");
    CHECK(strstr(fl_last_error(), "FL_LOVASZ_OPTIONS_INIT") != NULL, "struct_size message: %s", fl_last_error());
    ob = o; ob.classes = (fl_lovasz_classes)2;
    EXPECT(FWD(L, X, 32, tg, I, 2, 4, 8, F, &ob, ws, wsb), FL_ERR_INVALID_ARGUMENT, "classes 2");
    CHECK(strstr(fl_last_error(), "classes") != NULL, "classes message: %s", fl_last_error());
    EXPECT(FWD(L, X, 32, tg, I, 2, 4, 8, F, &o, ws, wsb - 1), FL_ERR_INSUFFICIENT_WORKSPACE, "workspace short");
    EXPECT(FWD(L, X, 32, tg, I, 2, 4, 8, F, &o, NULL, wsb), FL_ERR_INVALID_ARGUMENT, "workspace NULL");
    EXPECT(FWD(L, X, 32, tg, I, 2, 4, 8, F, NULL, ws, wsb), FL_OK, "opts NULL (probabilities)");
    EXPECT(FWD(L, X, 32, tg, I, 2, 4, 8, F, &o, X, wsb), FL_ERR_INVALID_ARGUMENT, "workspace overlaps input");
    EXPECT(FWD((float*)ws, X, 32, tg, I, 2, 4, 8, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "loss overlaps workspace");
    EXPECT(FWD(X + 3, X, 32, tg, I, 2, 4, 8, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "loss overlaps input");
    EXPECT(FWD(L, X, 32, tg, I, 0, 4, 8, F, &o, ws, 64 + 32), FL_OK, "N = 0");
    /* out-of-range labels: the first bad pixel named, nothing written */
    int64_t tb[16];
    memcpy(tb, tg, sizeof tb);
    tb[9] = 4; tb[12] = -3;
    EXPECT(FWD(L, X, 32, tb, I, 2, 4, 8, F, &o, ws, wsb), FL_ERR_TARGET_OUT_OF_RANGE, "label 4");
    CHECK(strstr(fl_last_error(), "labels[9] = 4") != NULL && strstr(fl_last_error(), "n = 1, k = 1"),
          "label message: %s", fl_last_error());
    ob = o; ob.ignore_index = 4;
    EXPECT(FWD(L, X, 32, tb, I, 2, 4, 8, F, &ob, ws, wsb), FL_ERR_TARGET_OUT_OF_RANGE, "label -3");
    CHECK(strstr(fl_last_error(), "labels[2] = -100") != NULL, "label message: %s", fl_last_error());

    fnname = "fl_lovasz_softmax_fused_cpu";
#define FUS(loss_, dx_, x_, gl_, gs_, N_, o_, ws_, wsb_) \
    fl_lovasz_softmax_fused_cpu(loss_, dx_, x_, 32, tg, I, gl_, gs_, N_, 4, 8, F, o_, ws_, wsb_)
    EXPECT(FUS(L, D, X, G, 2.0f, 2, &o, ws, wsb), FL_OK, "valid fused");
    EXPECT(FUS(NULL, D, X, NULL, 1.0f, 2, &o, ws, wsb), FL_OK, "fused loss NULL");
    EXPECT(FUS(L, NULL, X, NULL, 1.0f, 2, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "dinput NULL");
    CHECK(strstr(fl_last_error(), "dinput is NULL") != NULL, "dinput message: %s", fl_last_error());
    EXPECT(FUS(L, NULL, NULL, NULL, 1.0f, 0, &o, ws, wsb), FL_OK, "dinput NULL N = 0");
    const float bad[3] = {NAN, INFINITY, -INFINITY};
    for (int k = 0; k < 3; k++) {
        EXPECT(FUS(L, D, X, NULL, bad[k], 2, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "grad_scale not finite");
        CHECK(strstr(fl_last_error(), "grad_scale") != NULL, "grad_scale message: %s", fl_last_error());
    }
    EXPECT(FUS(L, (char*)D + 2, X, NULL, 1.0f, 1, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "dinput misaligned");
    EXPECT(FUS(L, D, X, (const float*)((const char*)G + 1), 1.0f, 2, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT,
           "grad_loss misaligned");
    EXPECT(FUS(L, D + 1, D, NULL, 1.0f, 2, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "dinput partially overlaps input");
    CHECK(strstr(fl_last_error(), "partially overlaps") != NULL, "overlap message: %s", fl_last_error());
    EXPECT(FUS(L, D, X, D + 5, 1.0f, 2, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "dinput overlaps grad_loss");
    EXPECT(FUS(D + 7, D, X, NULL, 1.0f, 2, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "dinput overlaps loss");
    EXPECT(FUS(L, ws, X, NULL, 1.0f, 2, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "dinput overlaps workspace");
    {   /* dinput overlapping the labels */
        float* big = tu_xmalloc(512);
        tu_poison(L, sizeof L);
        fl_status st = fl_lovasz_softmax_fused_cpu(L, big, X, 32, big + 16, I, NULL, 1.0f, 2, 4, 8, F, &o, ws, wsb);
        CHECK(st == FL_ERR_INVALID_ARGUMENT && strstr(fl_last_error(), "labels"), "dinput overlaps labels: %d %s",
              (int)st, fl_last_error());
        free(big);
    }
    int64_t tb2[16];
    memcpy(tb2, tg, sizeof tb2);
    tb2[15] = 1000;
    tu_poison(L, sizeof L); tu_poison(D, sizeof D);
    fl_status st = fl_lovasz_softmax_fused_cpu(L, D, X, 32, tb2, I, NULL, 1.0f, 2, 4, 8, F, &o, ws, wsb);
    int clean = 1;
    for (int k = 0; k < 64; k++) clean &= tu_is_poison(D, 4, k);
    CHECK(st == FL_ERR_TARGET_OUT_OF_RANGE && clean && tu_is_poison(L, 4, 0) &&
          strstr(fl_last_error(), "fl_lovasz_softmax_fused_cpu") && strstr(fl_last_error(), "labels[15]"),
          "fused bad label: %d %s", (int)st, fl_last_error());
    /* size query */
    size_t b;
    CHECK(fl_lovasz_softmax_workspace_size(NULL, 1, 1, 1, F, NULL) == FL_ERR_INVALID_ARGUMENT, "size bytes NULL");
    CHECK(fl_lovasz_softmax_workspace_size(&b, -1, 1, 1, F, NULL) == FL_ERR_INVALID_ARGUMENT, "size N < 0");
    CHECK(fl_lovasz_softmax_workspace_size(&b, 1, 0, 1, F, NULL) == FL_ERR_INVALID_ARGUMENT, "size C < 1");
    CHECK(fl_lovasz_softmax_workspace_size(&b, 1, 1, 0, F, NULL) == FL_ERR_INVALID_ARGUMENT, "size d < 1");
    CHECK(fl_lovasz_softmax_workspace_size(&b, 1, 1, 1, (fl_dtype)9, NULL) == FL_ERR_INVALID_ARGUMENT, "size dtype");
    CHECK(fl_lovasz_softmax_workspace_size(&b, 1, 1, 1, F, &ob) == FL_OK, "size ok");
    ob.struct_size = 3;
    CHECK(fl_lovasz_softmax_workspace_size(&b, 1, 1, 1, F, &ob) == FL_ERR_INVALID_ARGUMENT &&
          strstr(fl_last_error(), "fl_lovasz_softmax_workspace_size"), "size struct_size: %s", fl_last_error());
    CHECK(fl_lovasz_softmax_workspace_size(&b, INT64_MAX / 2, 4, 4, F, &o) == FL_ERR_INVALID_ARGUMENT, "size overflow");
    CHECK(fl_lovasz_softmax_workspace_size(&b, (int64_t)1 << 30, (int64_t)1 << 30, 1 << 4, F, &o) ==
          FL_ERR_INVALID_ARGUMENT, "size overflow (logits gp)");
    free(ws);
#undef EXPECT
}

int main(void) {
    test_edges();
    test_berman();
    test_ties();
    const fl_dtype dts[3] = {FL_DTYPE_F32, FL_DTYPE_F16, FL_DTYPE_BF16};
    const float gss[3] = {1.0f, 0.7f, -1.5f};
    static const int64_t shapes[][3] = {   /* N, C, d */
        {1, 1, 1}, {3, 2, 1}, {2, 19, 1}, {1, 2, 7}, {3, 19, 7}, {2, 2, 64}, {3, 19, 64}, {1, 1, 64},
        {2, 2, 300}, {3, 19, 300}, {0, 19, 7}, {1, 19, 7},
    };
    const int nshapes = (int)(sizeof shapes / sizeof shapes[0]);
    uint64_t seed = 1;
    int k = 0;
    tu_quiet = 1;
    for (int mode = 0; mode < 8; mode++)   /* all x per_image x logits */
        for (int s = 0; s < nshapes; s++, k++) {
            cfg_t c;
            memset(&c, 0, sizeof c);
            c.N = shapes[s][0]; c.C = shapes[s][1]; c.d = shapes[s][2];
            c.all = mode & 1; c.per_image = (mode >> 1) & 1; c.logits = (mode >> 2) & 1;
            c.dt = dts[k % 3];
            c.pad = k % 4 == 1 ? 5 : k % 4 == 3 ? c.d + 3 : 0;
            c.tgt32 = (k / 3) % 2;
            c.ign_frac = k % 5 < 3 ? 0.25 : 0.0;
            c.empty_image = c.N > 1 && k % 7 < 3;
            c.absent = k % 3 == 1;
            c.gl = (k / 2) % 2;
            c.gscale = gss[(k / 5) % 3];
            run_cfg(&c, seed++);
            if (s == 4) { c.all_ignored = 1; c.gl = 1; run_cfg(&c, seed++); }
        }
    tu_quiet = 0;
    test_errors();
    return tu_finish();
}
