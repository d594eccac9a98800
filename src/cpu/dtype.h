/* dtype.h — fp16 / bf16 <-> fp32 conversions of the CPU backends, in portable C (no _Float16 /
 * __bf16 extensions), round to nearest even as __float2half_rn / __float2bfloat16_rn, NaN kept
 * quiet. Header-only (static inline), shared by cross_entropy.c and gelu.c (src/cuda/common.cuh
 * is the CUDA side's counterpart).
 */
#ifndef FL_CPU_DTYPE_H
#define FL_CPU_DTYPE_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "fusedloss.h"

static inline float fl__f32_from_bits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t fl__bits_from_f32(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

static inline float fl__half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0) {                      /* zero or subnormal: man * 2^-24 (exact) */
        float f = (float)man * 5.9604644775390625e-8f;
        return sign ? -f : f;
    }
    if (exp == 31) return fl__f32_from_bits(sign | 0x7f800000u | (man << 13)); /* inf / nan */
    return fl__f32_from_bits(sign | ((exp + 112u) << 23) | (man << 13));
}

static inline uint16_t fl__float_to_half(float f) {
    uint32_t u = fl__bits_from_f32(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a >= 0x7f800000u) return (uint16_t)(sign | 0x7c00u | (a > 0x7f800000u ? 0x200u : 0u));
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);        /* rounds to >= 65520: inf */
    if (a < 0x38800000u) {                                           /* below 2^-14: subnormal */
        float v = fl__f32_from_bits(a) * 16777216.0f;                /* exact: value * 2^24 < 1024 */
        uint32_t q = (uint32_t)v;
        float rem = v - (float)q;                                    /* exact */
        if (rem > 0.5f || (rem == 0.5f && (q & 1u))) q++;            /* nearest even */
        return (uint16_t)(sign | q);
    }
    uint32_t e = (a >> 23) - 112u, m = a & 0x7fffffu;
    uint32_t h = (e << 10) | (m >> 13);
    uint32_t r = m & 0x1fffu;
    if (r > 0x1000u || (r == 0x1000u && (h & 1u))) h++;              /* a carry bumps the exponent: right */
    return (uint16_t)(sign | h);
}

static inline float fl__bf16_to_float(uint16_t b) { return fl__f32_from_bits((uint32_t)b << 16); }

static inline uint16_t fl__float_to_bf16(float f) {
    uint32_t u = fl__bits_from_f32(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet nan */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* element i of an array of dtype, as float (exact) */
static inline float fl__load_f32(const void* base, fl_dtype dt, int64_t i) {
    switch (dt) {
        case FL_DTYPE_F32: return ((const float*)base)[i];
        case FL_DTYPE_F16: return fl__half_to_float(((const uint16_t*)base)[i]);
        case FL_DTYPE_BF16: return fl__bf16_to_float(((const uint16_t*)base)[i]);
    }
    return NAN;
}

/* element i of an array of dtype = v rounded to dtype */
static inline void fl__store_f32(void* base, fl_dtype dt, int64_t i, float v) {
    switch (dt) {
        case FL_DTYPE_F32: ((float*)base)[i] = v; break;
        case FL_DTYPE_F16: ((uint16_t*)base)[i] = fl__float_to_half(v); break;
        case FL_DTYPE_BF16: ((uint16_t*)base)[i] = fl__float_to_bf16(v); break;
    }
}

#endif /* FL_CPU_DTYPE_H */
