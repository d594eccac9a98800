/* test_util.h — helpers shared by the CPU tests (header-only, C11).
 *
 * Seeded RNG (splitmix64 seeding a xorshift64*), fp32 <-> fp16 / bf16 conversion
 * written independently of the library (round-to-nearest-even, fp16 subnormals),
 * check_close() in the |got - ref| <= atol + rtol*|ref| form with "TENSOR OK" /
 * "NOT OK" lines, a global pass/fail counter, CHECK(), and tu_finish(), which prints
 * the closing "N passed, M failed" line and returns the exit code.
 *
 * Use: #include "test_util.h" in a test's single translation unit.
 */
#ifndef FL_TEST_UTIL_H
#define FL_TEST_UTIL_H

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fusedloss.h"

/* ------------------------------------------------------------------------------------------
 * Pass / fail counters and CHECK()
 * ---------------------------------------------------------------------------------------- */
static long tu_passed = 0;
static long tu_failed = 0;
static int  tu_quiet  = 0;              /* 1: print only failures (fuzz) */
static const char* tu_context = "";     /* printed in front of failures, e.g. a fuzz case id */

static inline int tu_check(int ok, const char* file, int line, const char* fmt, ...) {
    if (ok) { tu_passed++; return 1; }
    tu_failed++;
    va_list ap;
    fprintf(stdout, "FAIL %s%s%s:%d: ", tu_context, tu_context[0] ? " " : "", file, line);
    va_start(ap, fmt);
    vfprintf(stdout, fmt, ap);
    va_end(ap);
    fputc('\n', stdout);
    return 0;
}

/* CHECK(cond, fmt, ...) : counts one check; prints the message when cond is false.
 * Returns cond (0/1) so tests can stop early on a broken precondition. */
#define CHECK(cond, ...) tu_check(!!(cond), __FILE__, __LINE__, __VA_ARGS__)

/* Exact status check, plus fl_last_error() naming the function on failure. `got` is evaluated
 * ONCE (it is usually the call under test: an in-place call evaluated twice would run on its own
 * output). */
static inline int tu_check_status(fl_status got, fl_status want, const char* what, const char* file, int line) {
    return tu_check(got == want, file, line, "%s: status %d (%s), expected %d (%s); last error: \"%s\"", what,
                    (int)got, fl_status_string(got), (int)want, fl_status_string(want), fl_last_error());
}
#define CHECK_STATUS(got, want, what) tu_check_status((got), (want), (what), __FILE__, __LINE__)

static inline int tu_finish(void) {
    printf("overall okay: %d\n", tu_failed == 0);
    printf("%ld passed, %ld failed\n", tu_passed, tu_failed);
    fflush(stdout);
    return tu_failed == 0 ? 0 : 1;
}

/* ------------------------------------------------------------------------------------------
 * RNG: splitmix64 to seed, xorshift64* to draw
 * ---------------------------------------------------------------------------------------- */
typedef struct { uint64_t s; } tu_rng;

static inline uint64_t tu_splitmix64(uint64_t* x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static inline tu_rng tu_rng_seed(uint64_t seed) {
    tu_rng r;
    uint64_t x = seed;
    r.s = tu_splitmix64(&x);
    if (r.s == 0) r.s = 0x2545F4914F6CDD1Dull; /* xorshift state must be non-zero */
    return r;
}
static inline uint64_t tu_next(tu_rng* r) {
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    return r->s * 0x2545F4914F6CDD1Dull;
}
/* uniform in [0, 1) with 53 random bits */
static inline double tu_uniform(tu_rng* r) { return (double)(tu_next(r) >> 11) * (1.0 / 9007199254740992.0); }
static inline double tu_uniform_in(tu_rng* r, double lo, double hi) { return lo + (hi - lo) * tu_uniform(r); }
/* integer in [lo, hi] (inclusive) */
static inline int64_t tu_int_in(tu_rng* r, int64_t lo, int64_t hi) {
    return lo + (int64_t)(tu_next(r) % (uint64_t)(hi - lo + 1));
}
/* standard normal (Box-Muller) */
static inline double tu_normal(tu_rng* r) {
    double u1 = tu_uniform(r), u2 = tu_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586476925 * u2);
}

/* ------------------------------------------------------------------------------------------
 * fp32 <-> fp16 / bf16, round-to-nearest-even, written independently of the library
 * ---------------------------------------------------------------------------------------- */
static inline uint32_t tu_f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float tu_bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* bf16 = top 16 bits of the fp32 pattern after rounding to nearest even; NaN stays NaN. */
static inline uint16_t tu_f32_to_bf16(float f) {
    uint32_t u = tu_f32_bits(f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x0040u); /* quiet NaN */
    uint32_t lsb = (u >> 16) & 1u;
    u += 0x7FFFu + lsb;
    return (uint16_t)(u >> 16);
}
static inline float tu_bf16_to_f32(uint16_t h) { return tu_bits_f32((uint32_t)h << 16); }

/* IEEE binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits; subnormals below 2^-14.
 * Rounds by integer arithmetic on the 24-bit significand. */
static inline uint16_t tu_f32_to_f16(float f) {
    uint32_t u = tu_f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t ex = (u >> 23) & 0xFFu;
    uint32_t man = u & 0x7FFFFFu;
    if (ex == 0xFFu) return (uint16_t)(sign | 0x7C00u | (man ? 0x0200u : 0u)); /* inf / NaN */
    if (ex == 0) return sign;                                /* fp32 zero/subnormal (< 2^-126) -> 0 */
    int e = (int)ex - 127;                                   /* value = 1.man * 2^e */
    uint32_t sig = man | 0x800000u;                          /* 24-bit significand */
    /* The fp16 result is sig * 2^(e-23) rounded to a multiple of q = 2^(max(e,-14)-10). */
    int qe = (e < -14 ? -14 : e) - 10;
    int shift = qe - (e - 23);                               /* bits of sig to drop, >= 13 */
    if (shift > 25) return sign;                             /* < half the smallest subnormal */
    uint32_t kept = sig >> shift;
    uint32_t rem = sig & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (kept & 1u))) kept++;
    /* kept is the value in units of 2^qe. For normal numbers kept in [2^10, 2^11]. */
    if (e < -14) {
        /* subnormal range: kept in [0, 2^10]; 2^10 carries into the smallest normal, which the
         * bit pattern kept (exponent field 1, mantissa 0) encodes directly. */
        return (uint16_t)(sign | kept);
    }
    int hexp = e + 15;
    if (kept == (1u << 11)) { kept >>= 1; hexp++; }
    if (hexp >= 31) return (uint16_t)(sign | 0x7C00u);       /* overflow -> inf */
    return (uint16_t)(sign | ((uint32_t)hexp << 10) | (kept & 0x3FFu));
}
static inline float tu_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t ex = (h >> 10) & 0x1Fu;
    uint32_t man = h & 0x3FFu;
    if (ex == 0x1Fu) return tu_bits_f32(sign | 0x7F800000u | (man << 13));
    if (ex == 0) {                                           /* zero / subnormal: man * 2^-24 */
        float v = (float)man * 5.9604644775390625e-08f;
        return sign ? -v : v;
    }
    return tu_bits_f32(sign | ((ex - 15 + 127) << 23) | (man << 13));
}

static inline size_t tu_dtype_size(fl_dtype dt) { return dt == FL_DTYPE_F32 ? 4 : 2; }
static inline const char* tu_dtype_name(fl_dtype dt) {
    return dt == FL_DTYPE_F32 ? "f32" : dt == FL_DTYPE_F16 ? "f16" : dt == FL_DTYPE_BF16 ? "bf16" : "?";
}

/* Round a value to what `dt` can hold (returned as float). */
static inline float tu_round_to(fl_dtype dt, float v) {
    if (dt == FL_DTYPE_F16) return tu_f16_to_f32(tu_f32_to_f16(v));
    if (dt == FL_DTYPE_BF16) return tu_bf16_to_f32(tu_f32_to_bf16(v));
    return v;
}
/* Element i of an array of `dt`, as float (exact). */
static inline float tu_load(const void* p, fl_dtype dt, int64_t i) {
    if (dt == FL_DTYPE_F32) return ((const float*)p)[i];
    if (dt == FL_DTYPE_F16) return tu_f16_to_f32(((const uint16_t*)p)[i]);
    return tu_bf16_to_f32(((const uint16_t*)p)[i]);
}
static inline void tu_store(void* p, fl_dtype dt, int64_t i, float v) {
    if (dt == FL_DTYPE_F32) ((float*)p)[i] = v;
    else if (dt == FL_DTYPE_F16) ((uint16_t*)p)[i] = tu_f32_to_f16(v);
    else ((uint16_t*)p)[i] = tu_f32_to_bf16(v);
}
/* Raw bit pattern of element i (for poison / bitwise checks). */
static inline uint32_t tu_bits(const void* p, fl_dtype dt, int64_t i) {
    if (dt == FL_DTYPE_F32) { uint32_t u; memcpy(&u, (const char*)p + 4 * i, 4); return u; }
    return ((const uint16_t*)p)[i];
}

/* Poison: every byte 0xFF (a NaN in fp32, fp16 and bf16). */
#define TU_POISON_BYTE 0xFF
static inline void tu_poison(void* p, size_t bytes) { if (p && bytes) memset(p, TU_POISON_BYTE, bytes); }
static inline int tu_is_poison(const void* p, size_t esize, int64_t i) {
    const unsigned char* b = (const unsigned char*)p + (size_t)i * esize;
    for (size_t k = 0; k < esize; k++) if (b[k] != TU_POISON_BYTE) return 0;
    return 1;
}

static inline void* tu_xmalloc(size_t bytes) {
    void* p = malloc(bytes ? bytes : 1);
    if (!p) { fprintf(stderr, "out of memory (%zu bytes)\n", bytes); exit(2); }
    return p;
}

/* ------------------------------------------------------------------------------------------
 * check_close: |got - ref| <= atol + rtol*|ref| (+ slack[i] when given); NaN matches only NaN,
 * an infinity only the same infinity. Prints the first 5 mismatches, then one summary line.
 * Counts as one check. Returns 1 if every element is close.
 * ---------------------------------------------------------------------------------------- */
static inline int check_close_ex(const char* name, const double* got, const double* ref, const double* slack,
                          int64_t n, double atol, double rtol) {
    int64_t bad = 0;
    double maxdiff = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double g = got[i], r = ref[i];
        int ok;
        double d = 0.0;
        if (isnan(r) || isnan(g)) ok = isnan(r) && isnan(g);
        else if (isinf(r) || isinf(g)) ok = (g == r);
        else {
            d = fabs(g - r);
            ok = d <= atol + rtol * fabs(r) + (slack ? slack[i] : 0.0);
            if (d > maxdiff) maxdiff = d;
        }
        if (!ok) {
            if (bad < 5)
                printf("  %s%s%s[%lld]: got %.9g, ref %.9g, diff %.3g (tol %.3g)\n", tu_context,
                       tu_context[0] ? " " : "", name, (long long)i, g, r, fabs(g - r),
                       atol + rtol * fabs(r) + (slack ? slack[i] : 0.0));
            bad++;
        }
    }
    if (bad == 0) {
        tu_passed++;
        if (!tu_quiet) printf("%-60s TENSOR OK, maxdiff = %.3g\n", name, maxdiff);
        return 1;
    }
    tu_failed++;
    printf("%s%s%-60s TENSOR NOT OK, %lld of %lld mismatches, maxdiff = %.3g\n", tu_context,
           tu_context[0] ? " " : "", name, (long long)bad, (long long)n, maxdiff);
    return 0;
}
static inline int check_close(const char* name, const double* got, const double* ref, int64_t n,
                       double atol, double rtol) {
    return check_close_ex(name, got, ref, NULL, n, atol, rtol);
}

/* Bitwise equality of two buffers; one check. */
static inline int check_bitwise(const char* name, const void* a, const void* b, size_t bytes) {
    if (bytes == 0 || memcmp(a, b, bytes) == 0) {
        tu_passed++;
        if (!tu_quiet) printf("%-60s BITWISE OK\n", name);
        return 1;
    }
    size_t i = 0;
    while (((const unsigned char*)a)[i] == ((const unsigned char*)b)[i]) i++;
    tu_failed++;
    printf("%s%s%-60s BITWISE NOT OK (first differing byte %zu of %zu)\n", tu_context,
           tu_context[0] ? " " : "", name, i, bytes);
    return 0;
}

#endif /* FL_TEST_UTIL_H */
