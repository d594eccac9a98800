/* ce_configs.h — the cross-entropy option configurations the CPU tests sweep (every option alone
 * and in combinations), shared by test_cross_entropy.c and test_linear_cross_entropy.c.
 * Header-only; include once per test program. Indices are referred to by number in the tests:
 * append new entries at the end.
 */
#ifndef FL_CE_CONFIGS_H
#define FL_CE_CONFIGS_H

#include <stdint.h>

#include "fusedloss.h"
#include "test_util.h"

typedef struct {
    const char*  name;
    fl_reduction red;
    float        eps;
    int          weights;      /* 1: random class weights in [0.2, 2] with one zero */
    int64_t      ignore_index;
    float        zeta, cap, scale;
    int          offset;       /* 1: random per-class logit offsets in [-2, 2] (opts->logit_offset) */
} cfg_t;

static const cfg_t CFGS[] = {
    {"defaults (mean)", FL_REDUCTION_MEAN, 0, 0, -100, 0, 0, 1, 0},
    {"reduction none", FL_REDUCTION_NONE, 0, 0, -100, 0, 0, 1, 0},
    {"reduction sum", FL_REDUCTION_SUM, 0, 0, -100, 0, 0, 1, 0},
    {"smoothing 0.1", FL_REDUCTION_MEAN, 0.1f, 0, -100, 0, 0, 1, 0},
    {"smoothing 0.1 none", FL_REDUCTION_NONE, 0.1f, 0, -100, 0, 0, 1, 0},
    {"smoothing 1 sum", FL_REDUCTION_SUM, 1.0f, 0, -100, 0, 0, 1, 0},
    {"weights", FL_REDUCTION_MEAN, 0, 1, -100, 0, 0, 1, 0},
    {"weights none", FL_REDUCTION_NONE, 0, 1, -100, 0, 0, 1, 0},
    {"weights sum", FL_REDUCTION_SUM, 0, 1, -100, 0, 0, 1, 0},
    {"ignore_index 2 (in range)", FL_REDUCTION_MEAN, 0, 0, 2, 0, 0, 1, 0},
    {"ignore_index -1 sum", FL_REDUCTION_SUM, 0, 0, -1, 0, 0, 1, 0},
    {"z_loss", FL_REDUCTION_MEAN, 0, 0, -100, 0.05f, 0, 1, 0},
    {"z_loss none", FL_REDUCTION_NONE, 0, 0, -100, 0.05f, 0, 1, 0},
    {"z_loss sum", FL_REDUCTION_SUM, 0, 0, -100, 0.05f, 0, 1, 0},
    {"softcap 3", FL_REDUCTION_MEAN, 0, 0, -100, 0, 3.0f, 1, 0},
    {"logit_scale 0.5", FL_REDUCTION_MEAN, 0, 0, -100, 0, 0, 0.5f, 0},
    {"logit_scale -1.5 sum", FL_REDUCTION_SUM, 0, 0, -100, 0, 0, -1.5f, 0},
    {"logit_scale 2 + softcap 2.5 none", FL_REDUCTION_NONE, 0, 0, -100, 0, 2.5f, 2.0f, 0},
    {"z_loss + softcap", FL_REDUCTION_MEAN, 0, 0, -100, 0.05f, 4.0f, 1, 0},
    {"z_loss + weights (mean: two denominators)", FL_REDUCTION_MEAN, 0, 1, -100, 0.1f, 0, 1, 0},
    {"smoothing + weights + ignore", FL_REDUCTION_MEAN, 0.2f, 1, 1, 0, 0, 1, 0},
    {"smoothing + weights + ignore none", FL_REDUCTION_NONE, 0.2f, 1, 1, 0, 0, 1, 0},
    {"smoothing + weights + ignore sum", FL_REDUCTION_SUM, 0.2f, 1, 1, 0, 0, 1, 0},
    {"everything mean", FL_REDUCTION_MEAN, 0.15f, 1, 3, 0.02f, 5.0f, 1.3f, 0},
    {"everything none", FL_REDUCTION_NONE, 0.15f, 1, 3, 0.02f, 5.0f, 1.3f, 0},
    {"everything sum", FL_REDUCTION_SUM, 0.15f, 1, 3, 0.02f, 5.0f, -0.7f, 0},
    {"smoothing + weights", FL_REDUCTION_MEAN, 0.2f, 1, -100, 0, 0, 1, 0},
    /* per-class logit offsets (version 2 options; not accepted by the vocab-parallel steps) */
    {"logit offset", FL_REDUCTION_MEAN, 0, 0, -100, 0, 0, 1, 1},
    {"logit offset none", FL_REDUCTION_NONE, 0, 0, -100, 0, 0, 1, 1},
    {"logit offset + smoothing + weights + ignore", FL_REDUCTION_MEAN, 0.1f, 1, 2, 0, 0, 1, 1},
    {"logit offset + softcap + scale + z_loss sum", FL_REDUCTION_SUM, 0, 0, -100, 0.05f, 3.0f, 1.5f, 1},
    {"logit offset + everything none", FL_REDUCTION_NONE, 0.15f, 1, 3, 0.02f, 5.0f, 1.3f, 1},
};
#define N_CFGS ((int)(sizeof CFGS / sizeof CFGS[0]))
/* The fl_ce_options of a configuration for V classes; with weights, *w gets fresh random class
 * weights in [0.2, 2] (the last one 0 when V > 2: a zero weight is valid), owned by the caller; with
 * offsets, *off gets fresh random per-class logit offsets in [-2, 2] (owned by the caller; off NULL:
 * the caller's test cannot use them, and such configurations must be skipped, see cfg_has_offset). */
static fl_ce_options cfg_options(const cfg_t* c, int64_t V, tu_rng* rng, float** w, float** off) {
    fl_ce_options o = FL_CE_OPTIONS_INIT;
    o.reduction = c->red;
    o.label_smoothing = c->eps;
    o.ignore_index = c->ignore_index;
    o.z_loss = c->zeta;
    o.softcap = c->cap;
    o.logit_scale = c->scale;
    if (c->weights) {
        *w = (float*)tu_xmalloc((size_t)V * sizeof(float));
        for (int64_t j = 0; j < V; j++) (*w)[j] = (float)tu_uniform_in(rng, 0.2, 2.0);
        if (V > 2) (*w)[V - 1] = 0.0f;
        o.weight = *w;
    }
    if (off) *off = NULL;
    if (c->offset && off) {
        *off = (float*)tu_xmalloc((size_t)V * sizeof(float));
        for (int64_t j = 0; j < V; j++) (*off)[j] = (float)tu_uniform_in(rng, -2.0, 2.0);
        o.logit_offset = *off;
    }
    return o;
}
static inline int cfg_has_offset(int c) { return CFGS[c].offset != 0; }

#define CFG_EVERYTHING_MEAN 23
#define CFG_EVERYTHING_NONE 24

#endif /* FL_CE_CONFIGS_H */
