/**
 * @file router.c
 * @brief Top-k routing with a softmax over every expert, in blocks of ROUTE_BLOCK logits: per
 *        block, an insertion top-k in the caller's output row that skips four logits at a time
 *        when none of them can enter it, then the block's softmax sum exp(l - M) with the max M
 *        known (the best kept logit), rescaled when a later block raises M. exp is a short
 *        polynomial (colibri_expf, no libm call), four lanes at a time (SSE2 / Neon / Helium
 *        vectors on boards that have them; elsewhere four unrolled scalar lanes of a branch-free
 *        colibri_expf for x <= 0, the same bits). No allocation; memory does not depend on the
 *        number of experts. COLIBRI_ROUTE_SCALAR forces the scalar lanes (to test them).
 */
#include "colibri.h"
#include "colibri_internal.h"
#include "colibri_math.h"
#include "colibri_quant.h"
#include "kernels_x86.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Logits per block. colibri_route computes this many on the stack at a time and
 * colibri_route_gate walks its rows in the same blocks, so both return the same bits; a row of
 * at most ROUTE_BLOCK experts is a plain two-pass softmax. */
#define ROUTE_BLOCK 64

#if defined(__GNUC__) && !defined(COLIBRI_ROUTE_SCALAR) && defined(__ARM_FEATURE_MVE) &&           \
    (__ARM_FEATURE_MVE & 2)
/* Helium (MVE with floating point): route_exp_sum and the selection's skip test are written
 * with arm_mve.h, the exp's constants as scalar operands (vmul / vadd Qd, Qn, Rm), the x < MIN
 * lanes zeroed by a predicate (GCC's vector-extension code for MVE broadcast every constant and
 * compared the lanes one at a time). The same IEEE operations in the same order. */
#define ROUTE_MVE 1
#include <arm_mve.h>
#elif defined(__GNUC__) && !defined(COLIBRI_ROUTE_SCALAR) &&                                       \
    (defined(__SSE2__) || defined(__aarch64__))
/* Four fp32 lanes (GCC / clang vector extensions): the same IEEE operations as the scalar
 * route_exp, so both give the same bits. */
#define ROUTE_SIMD 1
typedef float route_v4f __attribute__((vector_size(16)));
typedef int32_t route_v4i __attribute__((vector_size(16)));
typedef uint32_t route_v4u __attribute__((vector_size(16)));
#endif

/* exp is colibri_expf (colibri_math.h): the same bits on every board and in the numpy mirror.
 * The softmax only takes exp of l - M <= 0. */

/* colibri_expf's operations up to the power of two, in the same order (so the same bits), for
 * T float or route_v4f: declares t = x * log2(e) + ROUND (n in its low bits) and y = 2^-n *
 * exp(x) (the polynomial of r = x - n ln 2). p3, p4, p5 and one are COLIBRI_EXP_P3, P4, P5 and
 * 1.0f, or copies of them that the scalar lanes hold in registers. */
#define ROUTE_EXP_POLY(T, x, t, y, p3, p4, p5, one)                                                \
    const T route_x = (x);                                                                         \
    const T t = route_x * COLIBRI_EXP_LOG2E + COLIBRI_EXP_ROUND;                                   \
    const T route_n = t - COLIBRI_EXP_ROUND;                                                       \
    const T route_r = (route_x - route_n * COLIBRI_EXP_LN2_HI) - route_n * COLIBRI_EXP_LN2_LO;     \
    const T route_z = route_r * route_r;                                                           \
    T route_p = route_r * COLIBRI_EXP_P0 + COLIBRI_EXP_P1;                                         \
    route_p = route_p * route_r + COLIBRI_EXP_P2;                                                  \
    route_p = route_p * route_r + (p3);                                                            \
    route_p = route_p * route_r + (p4);                                                            \
    route_p = route_p * route_r + (p5);                                                            \
    const T y = (route_p * route_z + route_r) + (one)

#if !defined(ROUTE_SIMD) && !defined(ROUTE_MVE)
/* exp(l - m) of one scalar lane, m the best logit so far: colibri_expf of x = l - m <= 0 (or
 * NaN), where its n = 128 and +inf branches never run, by the same IEEE operations in the same
 * order (the same bits). Its x < COLIBRI_EXP_MIN -> 0 case is rare (l about 87 below the max)
 * and is tested on t's bits, already in an integer register for the scale: x < MIN makes
 * n = t - ROUND <= -126, i.e. bits(t) <= ROUND_BITS - 126 as signed integers (t below 2^23, 0 or
 * negative included, x = -inf too), so only those lanes compare x itself (no float compare and
 * FPSCR transfer per lane). A lane below MIN gives 0 and sets *bad when l is -inf. p3, p4, p5 and
 * one are COLIBRI_EXP_P3, P4, P5 and 1.0f, passed in so that the caller can hold them in
 * registers. */
static inline float route_lane(float l, float m, float p3, float p4, float p5, float one,
                               uint32_t *bad)
{
    const float x = l - m;
    ROUTE_EXP_POLY(float, x, t, y, p3, p4, p5, one);
    uint32_t bits;
    memcpy(&bits, &t, sizeof bits);
    if (__builtin_expect((int32_t)bits <= (int32_t)(COLIBRI_EXP_ROUND_BITS - 126u), 0) &&
        x < COLIBRI_EXP_MIN) {
        *bad |= (uint32_t)!isfinite(l);
        return 0.0f;
    }
    /* (bits + (127 - ROUND_BITS)) << 23, as one shift and one add (mod 2^32 the same) */
    bits = (bits << 23) + ((127u - COLIBRI_EXP_ROUND_BITS) << 23);
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return y * scale;
}

/* FPv5 (Cortex-M7's fpv5-d16, Armv8-M mainline FPUs): VMAXNM, which fmaxf compiles to. */
#if defined(__GNUC__) && defined(__ARM_FP) &&                                                      \
    ((defined(__ARM_ARCH_7EM__) && (__ARM_FP & 8)) || defined(__ARM_ARCH_8M_MAIN__))
#define ROUTE_MAXNM 1
#endif

/* GCC re-creates some of the exp constants in every lane of the unrolled loop (a VLDR or VMOV
 * each) rather than keep them in registers; an empty asm that "changes" a copy makes it a value
 * to keep (ARM FPUs only: "t" is a single-precision VFP register). */
#if defined(__GNUC__) && defined(__arm__) && defined(__ARM_FP) && (__ARM_FP & 4)
#define ROUTE_IN_REG(v) __asm__("" : "+t"(v))
#else
#define ROUTE_IN_REG(v) ((void)(v))
#endif
#endif

#if defined(ROUTE_SIMD)
/* colibri_expf on four lanes, for x <= 0 (where its n = 128 and +inf branches never run):
 * the same IEEE operations in the same order, so the same bits. */
static inline route_v4f route_exp4(route_v4f x)
{
    const route_v4i below = x < COLIBRI_EXP_MIN;
    ROUTE_EXP_POLY(route_v4f, x, t, y, COLIBRI_EXP_P3, COLIBRI_EXP_P4, COLIBRI_EXP_P5, 1.0f);
    const route_v4u bits = ((route_v4u)t + (127u - COLIBRI_EXP_ROUND_BITS)) << 23;
    const route_v4i e = (route_v4i)(y * (route_v4f)bits);
    return (route_v4f)(e & ~below);
}
#endif

#if defined(ROUTE_MVE)
/* colibri_expf(v - m) on four lanes for v <= m (where its n = 128 and +inf branches never run),
 * the x < COLIBRI_EXP_MIN lanes 0: the same IEEE operations in the same order, so the same bits. */
static inline float32x4_t route_exp4_mve(float32x4_t v, float m, float32x4_t zero)
{
    const float32x4_t x = vsubq_n_f32(v, m);
    return vpselq_f32(zero, colibri_expf4_common(x), vcmpltq_n_f32(x, COLIBRI_EXP_MIN));
}

/*
 * Sum of exp(l[i] - m) over a block, in four lanes (lane i % 4, i ascending) added as
 * (s0 + s1) + (s2 + s3); the last 1..3 logits are one tail-predicated vector (its lanes past n
 * neither loaded nor added). *finite is cleared when some l[i] is NaN or infinite.
 */
static float route_exp_sum(const float *l, int32_t n, float m, int *finite)
{
    int32_t i = 0;
    const float32x4_t zero = vdupq_n_f32(0.0f);
    float32x4_t vs = zero;
    float32x4_t vc = zero; /* NaN in a lane iff some l[i] * 0 is: l[i] NaN or infinite */
    for (; i + 4 <= n; i += 4) {
        const float32x4_t v = vld1q_f32(l + i);
        vc = vaddq_f32(vc, vmulq_n_f32(v, 0.0f));
        vs = vaddq_f32(vs, route_exp4_mve(v, m, zero));
    }
    if (i < n) {
        const mve_pred16_t live = vctp32q((uint32_t)(n - i));
        const float32x4_t v = vldrwq_z_f32(l + i, live); /* 0 past n */
        vc = vaddq_f32(vc, vmulq_n_f32(v, 0.0f));
        vs = vaddq_m_f32(vs, vs, route_exp4_mve(v, m, zero), live);
    }
    const float chk = ((vgetq_lane_f32(vc, 0) + vgetq_lane_f32(vc, 1)) + vgetq_lane_f32(vc, 2)) +
                      vgetq_lane_f32(vc, 3);
    *finite = (chk == 0.0f);
    return (vgetq_lane_f32(vs, 0) + vgetq_lane_f32(vs, 1)) +
           (vgetq_lane_f32(vs, 2) + vgetq_lane_f32(vs, 3));
}
#elif defined(ROUTE_SIMD)
/*
 * Sum of exp(l[i] - m) over a block, in four lanes (lane i % 4, i ascending) added as
 * (s0 + s1) + (s2 + s3). *finite is cleared when some l[i] is NaN or infinite.
 */
static float route_exp_sum(const float *l, int32_t n, float m, int *finite)
{
    float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    float chk = 0.0f; /* NaN iff some l[i] * 0 is: l[i] NaN or infinite */
    int32_t i = 0;
    route_v4f vs = {0.0f, 0.0f, 0.0f, 0.0f};
    route_v4f vc = vs;
    for (; i + 4 <= n; i += 4) {
        route_v4f v;
        memcpy(&v, l + i, sizeof v);
        vc += v * 0.0f;
        vs += route_exp4(v - m);
    }
    for (int32_t j = 0; j < 4; j++) {
        s[j] = vs[j];
        chk += vc[j];
    }
    for (; i < n; i++) {
        chk += l[i] * 0.0f;
        s[i & 3] += colibri_expf(l[i] - m);
    }
    *finite = (chk == 0.0f);
    return (s[0] + s[1]) + (s[2] + s[3]);
}
#else
/*
 * Sum of exp(l[i] - m) over a block, in four lanes (lane i % 4, i ascending) added as
 * (s0 + s1) + (s2 + s3). *finite is cleared when some l[i] is NaN or infinite, found without a
 * test per logit: m is the best logit so far (every l[i] <= m unless one is NaN), so a NaN or
 * +inf l[i] (or m = +inf, then l[i] - m = NaN for that logit) makes its exp NaN and so the sum,
 * which no finite logits can do (each exp is in [0, 1]); a -inf l[i] gives x = -inf < MIN,
 * checked in route_lane's rare branch. x < MIN from finite l and m (l - m overflowing to -inf
 * included) is 0 and finite, as before.
 */
static float route_exp_sum(const float *l, int32_t n, float m, int *finite)
{
    float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    uint32_t bad = 0;
    int32_t i = 0;
    float p3 = COLIBRI_EXP_P3;
    float p4 = COLIBRI_EXP_P4;
    float p5 = COLIBRI_EXP_P5;
    float one = 1.0f;
    ROUTE_IN_REG(p3);
    ROUTE_IN_REG(p4);
    ROUTE_IN_REG(p5);
    ROUTE_IN_REG(one);
    for (; i + 4 <= n; i += 4) {
        s[0] += route_lane(l[i], m, p3, p4, p5, one, &bad);
        s[1] += route_lane(l[i + 1], m, p3, p4, p5, one, &bad);
        s[2] += route_lane(l[i + 2], m, p3, p4, p5, one, &bad);
        s[3] += route_lane(l[i + 3], m, p3, p4, p5, one, &bad);
    }
    for (; i < n; i++) {
        s[i & 3] += route_lane(l[i], m, COLIBRI_EXP_P3, COLIBRI_EXP_P4, COLIBRI_EXP_P5, 1.0f, &bad);
    }
    const float sum = (s[0] + s[1]) + (s[2] + s[3]);
    *finite = (bad == 0u) && !isnan(sum);
    return sum;
}
#endif

/** Per-token routing state: the softmax so far and the k-sized sorted selection. */
typedef struct {
    float max;      /* M: the best logit so far (vals[0]) */
    float sum;      /* S: sum of exp(l - M) over the experts so far */
    int32_t n_kept; /* entries of ids/vals filled so far (<= k) */
    int32_t k;
    int32_t *ids; /* caller's expert_ids row */
    float *vals;  /* caller's gates row, holds logits until finished */
} route_state;

static void route_begin(route_state *st, int32_t k, int32_t *ids, float *vals)
{
    st->max = 0.0f;
    st->sum = 0.0f;
    st->n_kept = 0;
    st->k = k;
    st->ids = ids;
    st->vals = vals;
}

/* Put the logit of an expert at pos (a free slot, or k - 1 when it beats the k-th kept) and
 * move it up past every strictly smaller one. Experts arrive in ascending index order, so a
 * later expert with an equal logit never overtakes an earlier one: ties resolve to the lower
 * index. */
static inline void route_insert(const route_state *st, int32_t pos, int32_t expert, float logit)
{
    while (pos > 0 && st->vals[pos - 1] < logit) {
        st->vals[pos] = st->vals[pos - 1];
        st->ids[pos] = st->ids[pos - 1];
        pos--;
    }
    st->vals[pos] = logit;
    st->ids[pos] = expert;
}

/* A logit x of expert e strictly above the k-th kept (*thr) enters the selection. K = 2 (a
 * constant where inlined): the kept logits and ids are the locals *v0, *d0, *v1, *d1, and x
 * moves above the first only when strictly greater (as route_insert's shift: ties stay with the
 * lower index); otherwise (K = 0, any k) route_insert into the caller's rows. */
static inline __attribute__((always_inline)) void route_take(const route_state *st, int32_t K,
                                                             float *thr, float *v0, int32_t *d0,
                                                             float *v1, int32_t *d1, int32_t e,
                                                             float x)
{
    if (K == 2) {
        if (x > *v0) {
            *v1 = *v0;
            *d1 = *d0;
            *v0 = x;
            *d0 = e;
        } else {
            *v1 = x;
            *d1 = e;
        }
        *thr = *v1;
    } else {
        route_insert(st, st->k - 1, e, x);
        *thr = st->vals[st->k - 1];
    }
}

/* Top-k over l[i..n) (experts e0 + i..) once k are kept: a logit enters only when it is strictly
 * above the k-th (thr). A group of logits none of which can enter is skipped by one test (the
 * test only gates the skip: each logit of a group that passes is still tested alone, in index
 * order, so a test that passes more groups than needed gives the same result):
 *   Helium: eight logits, vmaxnm of two vectors compared with thr (vmaxnm ignores a NaN, which
 *           never enters);
 *   vector boards (SSE2 / Neon): four logits, their max compared with thr;
 *   FPv5 (Cortex-M7): four logits, their vmaxnm (fmaxf: a NaN ignored) compared with thr;
 *   other scalar boards: while thr >= +0, four logits as signed integers against thr's bits (for
 *           thr >= 0, l > thr implies bits(l) > bits(thr); a NaN may pass), which needs no
 *           float compare (none on soft-float cores, and no FPSCR transfer on the others);
 *           before that, their max as floats (both tests in one loop, so that the logits of a
 *           group that passes are tried by one copy of the code).
 * The last 1..7 logits (Helium) or 1..3 (others) are tried one by one.
 * K: 2 keeps the selection in registers (route_take), 0 any k (k = 1 too: a logit that enters
 * is route_insert at the first slot, which moves nothing: two stores and thr reloaded). */
static inline __attribute__((always_inline)) void
route_select_rest(route_state *st, const float *l, int32_t e0, int32_t i, int32_t n, int32_t K)
{
    float thr = st->vals[st->k - 1];
    float v0 = (K == 2) ? st->vals[0] : 0.0f;
    int32_t d0 = (K == 2) ? st->ids[0] : 0;
    float v1 = (K == 2) ? st->vals[1] : 0.0f;
    int32_t d1 = (K == 2) ? st->ids[1] : 0;
#define ROUTE_TRY(j)                                                                               \
    do {                                                                                           \
        if (l[j] > thr) {                                                                          \
            route_take(st, K, &thr, &v0, &d0, &v1, &d1, e0 + (j), l[j]);                           \
        }                                                                                          \
    } while (0)
#if defined(ROUTE_MVE)
    for (; i + 8 <= n; i += 8) {
        const float32x4_t a = vmaxnmq_f32(vld1q_f32(l + i), vld1q_f32(l + i + 4));
        if (vcmpgtq_n_f32(a, thr) != 0) {
            for (int32_t j = i; j < i + 8; j++) {
                ROUTE_TRY(j);
            }
        }
    }
#elif defined(ROUTE_MAXNM)
    for (; i + 4 <= n; i += 4) {
        const float a =
            __builtin_fmaxf(__builtin_fmaxf(l[i], l[i + 1]), __builtin_fmaxf(l[i + 2], l[i + 3]));
        if (a > thr) {
            for (int32_t j = i; j < i + 4; j++) {
                ROUTE_TRY(j);
            }
        }
    }
#elif !defined(ROUTE_SIMD)
    int32_t tb; /* thr's bits: >= 0 iff thr >= +0 (or a NaN with the sign clear) */
    memcpy(&tb, &thr, sizeof tb);
    for (; i + 4 <= n; i += 4) {
        int pass;
        if (tb < 0) {
            const float a = (l[i] > l[i + 1]) ? l[i] : l[i + 1];
            const float b = (l[i + 2] > l[i + 3]) ? l[i + 2] : l[i + 3];
            pass = ((a > b) ? a : b) > thr;
        } else { /* thr never decreases: tb stays >= 0 */
            int32_t b0;
            int32_t b1;
            int32_t b2;
            int32_t b3;
            memcpy(&b0, l + i, sizeof b0);
            memcpy(&b1, l + i + 1, sizeof b1);
            memcpy(&b2, l + i + 2, sizeof b2);
            memcpy(&b3, l + i + 3, sizeof b3);
            pass = b0 > tb || b1 > tb || b2 > tb || b3 > tb;
        }
        if (pass) {
            for (int32_t j = i; j < i + 4; j++) {
                ROUTE_TRY(j);
            }
            memcpy(&tb, &thr, sizeof tb);
        }
    }
#else
    for (; i + 4 <= n; i += 4) {
        const float a = (l[i] > l[i + 1]) ? l[i] : l[i + 1];
        const float b = (l[i + 2] > l[i + 3]) ? l[i + 2] : l[i + 3];
        if (((a > b) ? a : b) > thr) {
            for (int32_t j = i; j < i + 4; j++) {
                ROUTE_TRY(j);
            }
        }
    }
#endif
    for (; i < n; i++) {
        ROUTE_TRY(i);
    }
#undef ROUTE_TRY
    if (K == 2) {
        st->vals[0] = v0;
        st->ids[0] = d0;
        st->vals[1] = v1;
        st->ids[1] = d1;
    }
}

/* Top-k over the logits l[0..n) of experts e0.. : the first k kept by insertion, the rest by
 * route_select_rest (its k = 2 copy for the common MoE top-k, its any-k copy otherwise). One
 * out-of-line copy, shared by route_block and colibri_topk_f32: a call per block of ROUTE_BLOCK
 * logits costs a few instructions, a second inlined copy over a kilobyte of flash. */
static __attribute__((noinline)) void route_select(route_state *st, const float *l, int32_t e0,
                                                   int32_t n)
{
    const int32_t k = st->k;
    int32_t i = 0;
    for (; i < n && st->n_kept < k; i++) {
        route_insert(st, st->n_kept, e0 + i, l[i]);
        st->n_kept++;
    }
    if (i == n) {
        return;
    }
    if (k == 2) {
        route_select_rest(st, l, e0, i, n, 2);
    } else {
        route_select_rest(st, l, e0, i, n, 0);
    }
}

void colibri_topk_f32(const float *x, int32_t n, int32_t k, int32_t *ids, float *vals)
{
    route_state st;
    route_begin(&st, k, ids, vals);
#if defined(COLIBRI_X86_DISPATCH)
    /* A vocabulary (the sampler's top-k): once k are kept, groups of 32 whose values are all at
     * or below the k-th kept are skipped by one AVX2 test each (none of them could enter), the
     * others selected as before: the same ids and values. 32,000 logits, k 40: the draw
     * counted 200,730 instructions, 4.9 a logit for the selection. */
    const colibri_x86_kernels_t *kx = colibri_x86_kernels();
    if (kx->first_above_f32 != NULL && n >= 256 && k >= 1 && k < n) {
        int32_t i = k;
        route_select(&st, x, 0, i);
        while (i < n) {
            i += kx->first_above_f32(x + i, n - i, st.vals[k - 1]);
            const int32_t m = n - i < 32 ? n - i : 32;
            route_select(&st, x + i, i, m); /* none past the end: m = 0 selects nothing */
            i += m;
        }
        return;
    }
#endif
    route_select(&st, x, 0, n);
}

/* One block of logits l[0..n) of experts e0..: the selection, then S rescaled to the new max
 * and the block's exp(l - M) added. Returns 0 when a logit is NaN or infinite. */
static int route_block(route_state *st, const float *l, int32_t e0, int32_t n)
{
    route_select(st, l, e0, n);
    const float m = st->vals[0];
    if (st->sum > 0.0f && m > st->max) {
        st->sum *= colibri_expf(st->max - m);
    }
    st->max = m;
    int finite;
    st->sum += route_exp_sum(l, n, m, &finite);
    return finite;
}

/* Turn the kept logits into softmax probabilities; returns the log-sum-exp. The best kept logit
 * is the max M, and colibri_expf(M - M) = colibri_expf(+0) is exactly 1 (t = ROUND, r = 0, y = 1,
 * scale 2^0), so its gate is 1 / S without the exp. */
static float route_finish(const route_state *st)
{
    st->vals[0] = 1.0f / st->sum;
    for (int32_t j = 1; j < st->k; j++) {
        st->vals[j] = colibri_expf(st->vals[j] - st->max) / st->sum;
    }
    return st->max + logf(st->sum);
}

static colibri_status check_topk(int32_t num_experts, int32_t top_k)
{
    if (top_k <= 0 || top_k > num_experts || top_k > COLIBRI_MAX_TOP_K) {
        return COLIBRI_ERR_TOPK;
    }
    return COLIBRI_OK;
}

colibri_status colibri_route_gate(const float *gate_logits, int32_t batch_seq_len,
                                  int32_t num_experts, int32_t top_k, int32_t *expert_ids,
                                  float *gates, float *route_temp)
{
    if (gate_logits == NULL || expert_ids == NULL || gates == NULL || batch_seq_len < 0 ||
        num_experts <= 0) {
        return COLIBRI_ERR_ARG;
    }
    colibri_status st = check_topk(num_experts, top_k);
    if (st != COLIBRI_OK) {
        return st;
    }
    for (int32_t t = 0; t < batch_seq_len; t++) {
        const float *row = gate_logits + (size_t)t * (size_t)num_experts;
        route_state rs;
        route_begin(&rs, top_k, expert_ids + (size_t)t * (size_t)top_k,
                    gates + (size_t)t * (size_t)top_k);
        for (int32_t e0 = 0; e0 < num_experts; e0 += ROUTE_BLOCK) {
            const int32_t n = (num_experts - e0 < ROUTE_BLOCK) ? num_experts - e0 : ROUTE_BLOCK;
            if (!route_block(&rs, row + e0, e0, n)) {
                return COLIBRI_ERR_NAN;
            }
        }
        float lse = route_finish(&rs);
        if (route_temp != NULL) {
            route_temp[t] = lse;
        }
    }
    return COLIBRI_OK;
}

int colibri_router_weights_ok(const colibri_model_t *model)
{
    switch (model->router_scheme) {
    case COLIBRI_QUANT_F32:
        return model->router_w != NULL;
    case COLIBRI_QUANT_F16:
        return model->router_wq != NULL;
    case COLIBRI_QUANT_Q8:
        return model->router_wq != NULL && model->router_scale != NULL;
    default:
        return 0;
    }
}

/* out[j] = x . Wg[e0 + j] for j < R (R <= 4, a constant where inlined), each accumulated in
 * fp32 in index order; quantised weights are dequantised to fp32 first (fp16 exactly; int8 as
 * (float)q * scale[e]), which colibri/reference/moe.py mirrors. The R rows' sums are
 * independent chains run side by side (each in its own order, so the same bits as one row at a
 * time): a chain's adds wait for each other, R chains overlap, and x[i] is loaded once for R
 * rows. The chains are four named scalars (the rows past R never computed): an array of sums
 * indexed by the row stays in memory on GCC 12 (a load and a store per multiply-add). */
#define ROUTER_DOT_ROWS(W)                                                                         \
    do {                                                                                           \
        for (size_t i = 0; i < d; i++) {                                                           \
            const float xi = x[i];                                                                 \
            a0 += xi * W(0, i);                                                                    \
            if (R > 1) {                                                                           \
                a1 += xi * W(1, i);                                                                \
            }                                                                                      \
            if (R > 2) {                                                                           \
                a2 += xi * W(2, i);                                                                \
            }                                                                                      \
            if (R > 3) {                                                                           \
                a3 += xi * W(3, i);                                                                \
            }                                                                                      \
        }                                                                                          \
    } while (0)
#define ROUTER_W_F16(j, i) colibri_f16_to_f32(wq[(size_t)(j)*d + (i)])
#define ROUTER_W_Q8(j, i) ((float)wq8[(size_t)(j)*d + (i)] * s[j])
#define ROUTER_W_F32(j, i) wg[(size_t)(j)*d + (i)]

static inline __attribute__((always_inline)) void router_dots(const colibri_model_t *model,
                                                              int32_t e0, const float *x, size_t d,
                                                              float *out, const int32_t R)
{
    float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
    if (model->router_scheme == COLIBRI_QUANT_F16) {
        const uint16_t *wq = (const uint16_t *)model->router_wq + (size_t)e0 * d;
        ROUTER_DOT_ROWS(ROUTER_W_F16);
    } else if (model->router_scheme == COLIBRI_QUANT_Q8) {
        const int8_t *wq8 = (const int8_t *)model->router_wq + (size_t)e0 * d;
        const float *s = model->router_scale + e0;
        ROUTER_DOT_ROWS(ROUTER_W_Q8);
    } else {
        const float *wg = model->router_w + (size_t)e0 * d;
        ROUTER_DOT_ROWS(ROUTER_W_F32);
    }
    out[0] = a0;
    if (R > 1) {
        out[1] = a1;
    }
    if (R > 2) {
        out[2] = a2;
    }
    if (R > 3) {
        out[3] = a3;
    }
}

#if defined(__ARM_FEATURE_MVE) && (__ARM_FEATURE_MVE & 2) && !defined(COLIBRI_ROUTE_SCALAR)
#include <arm_mve.h>
/* router_dots of four fp32 rows on Helium: the rows' sums are the four lanes, row j's weight of
 * input i fetched by one gather load (offsets 0, d, 2d, 3d from Wg[e0] + i), then lane by lane
 * the same multiply and add in the same order (GCC 12's own vectorisation of the four chains
 * moves each weight through the stack: 3.5 instructions a multiply-add). Four inputs a loop, the
 * gathers at immediate offsets from one vector of addresses: 5.25 instructions an input, was 7.
 * (Helium flushes subnormal products and sums, scalar VFP does not: so did these rows before.)
 * The last 1..3 rows take the VFP path below. */
#define ROUTER_GATHER4 1
static inline __attribute__((always_inline)) void router_dots4_f32(const float *wg, const float *x,
                                                                   size_t d, float *out)
{
    /* lane j: the address of Wg[e0 + j][i] */
    uint32x4_t addr = vaddq_n_u32(vmulq_n_u32(vidupq_n_u32(0u, 1), (uint32_t)(d * sizeof(float))),
                                  (uint32_t)(uintptr_t)wg);
    float32x4_t acc = vdupq_n_f32(0.0f);
    size_t i = 0;
    for (; i + 4 <= d; i += 4) {
        const float32x4_t w0 = vldrwq_gather_base_f32(addr, 0);
        const float32x4_t w1 = vldrwq_gather_base_f32(addr, 4);
        const float32x4_t w2 = vldrwq_gather_base_f32(addr, 8);
        const float32x4_t w3 = vldrwq_gather_base_f32(addr, 12);
        addr = vaddq_n_u32(addr, 16u);
        acc = vaddq_f32(acc, vmulq_n_f32(w0, x[i]));
        acc = vaddq_f32(acc, vmulq_n_f32(w1, x[i + 1]));
        acc = vaddq_f32(acc, vmulq_n_f32(w2, x[i + 2]));
        acc = vaddq_f32(acc, vmulq_n_f32(w3, x[i + 3]));
    }
    for (; i < d; i++) {
        acc = vaddq_f32(acc, vmulq_n_f32(vldrwq_gather_base_f32(addr, 0), x[i]));
        addr = vaddq_n_u32(addr, 4u);
    }
    vst1q_f32(out, acc);
}
#endif

#if defined(__GNUC__) && defined(__arm__) && defined(__ARM_FP) && (__ARM_FP & 4) &&                \
    defined(__ARM_ARCH_PROFILE) && __ARM_ARCH_PROFILE == 'M' && !defined(COLIBRI_ROUTE_SCALAR)
/* router_dots of fp32 rows on a Cortex-M VFP (M4, M7; on Helium the last 1..3 rows after the
 * gathers: 2.5-2.75 instructions a multiply-add instead of 5): four inputs at a time,
 * x[i..i+3] and each row's four weights fetched by one VLDMIA each (GCC issues one VLDR a
 * float: 3.75 instructions a multiply-add for four rows, 2.4 here), then per row the same VMUL and
 * VADD in index order (no fused multiply-add), so the same bits as router_dots; the last d % 4
 * inputs continue each chain in C. s0-s3 hold x, s4-s19 the weights; the sums are operands ("t":
 * any VFP register GCC keeps apart from the clobbered ones). */
#define ROUTER_VLDM 1
#define RV_MA(a, w, xs) "vmul.f32 " w ", " xs ", " w "\n\tvadd.f32 %[" a "], %[" a "], " w "\n\t"
#define RV_ROW4(a, ws, w0, w1, w2, w3)                                                             \
    "vldmia %[" ws "]!, {" w0 "-" w3 "}\n\t" RV_MA(a, w0, "s0") RV_MA(a, w1, "s1")                 \
        RV_MA(a, w2, "s2") RV_MA(a, w3, "s3")
#define RV_X "vldmia %[x]!, {s0-s3}\n\t"
#define RV_CLOBBER4 "s0", "s1", "s2", "s3", "s4", "s5", "s6", "s7"

static inline __attribute__((always_inline)) void
router_dots_vfp(const float *w0, const float *x, size_t d, float *out, const int32_t R)
{
    /* the rows past R stay at w0 (no pointer past the weights) */
    const float *w1 = (R > 1) ? w0 + d : w0, *w2 = (R > 2) ? w0 + 2 * d : w0;
    const float *w3 = (R > 3) ? w0 + 3 * d : w0;
    float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
    const float *xe = x + (d & ~(size_t)3);
    while (x != xe) {
        if (R == 4) {
            __asm__(RV_X RV_ROW4("a0", "w0", "s4", "s5", "s6", "s7")
                        RV_ROW4("a1", "w1", "s8", "s9", "s10", "s11")
                            RV_ROW4("a2", "w2", "s12", "s13", "s14", "s15")
                                RV_ROW4("a3", "w3", "s16", "s17", "s18", "s19")
                    : [a0] "+t"(a0), [a1] "+t"(a1), [a2] "+t"(a2), [a3] "+t"(a3), [x] "+r"(x),
                      [w0] "+r"(w0), [w1] "+r"(w1), [w2] "+r"(w2), [w3] "+r"(w3)
                    :
                    : RV_CLOBBER4, "s8", "s9", "s10", "s11", "s12", "s13", "s14", "s15", "s16",
                      "s17", "s18", "s19", "memory");
        } else if (R == 2) {
            __asm__(RV_X RV_ROW4("a0", "w0", "s4", "s5", "s6", "s7")
                        RV_ROW4("a1", "w1", "s8", "s9", "s10", "s11")
                    : [a0] "+t"(a0), [a1] "+t"(a1), [x] "+r"(x), [w0] "+r"(w0), [w1] "+r"(w1)
                    :
                    : RV_CLOBBER4, "s8", "s9", "s10", "s11", "memory");
        } else {
            __asm__(RV_X RV_ROW4("a0", "w0", "s4", "s5", "s6", "s7")
                    : [a0] "+t"(a0), [x] "+r"(x), [w0] "+r"(w0)
                    :
                    : RV_CLOBBER4, "memory");
        }
    }
    for (size_t i = 0; i < (d & 3); i++) {
        a0 += x[i] * w0[i];
        if (R > 1) {
            a1 += x[i] * w1[i];
        }
        if (R > 2) {
            a2 += x[i] * w2[i];
        }
        if (R > 3) {
            a3 += x[i] * w3[i];
        }
    }
    out[0] = a0;
    if (R > 1) {
        out[1] = a1;
    }
    if (R > 3) {
        out[2] = a2;
        out[3] = a3;
    }
}
#undef RV_MA
#undef RV_ROW4
#undef RV_X
#undef RV_CLOBBER4
#endif

/* logits[j] = x . Wg[e0 + j] for j < n: four rows at a time, then the last 1..3 together. */
static void router_logits(const colibri_model_t *model, int32_t e0, int32_t n, const float *x,
                          size_t d, float *logits)
{
    int32_t j = 0;
#if defined(ROUTER_GATHER4)
    if (model->router_scheme == COLIBRI_QUANT_F32) {
        for (; j + 4 <= n; j += 4) {
            router_dots4_f32(model->router_w + (size_t)(e0 + j) * d, x, d, logits + j);
        }
    }
#endif
#if defined(ROUTER_VLDM)
    if (model->router_scheme == COLIBRI_QUANT_F32) {
        const float *wg = model->router_w + (size_t)e0 * d;
#if !defined(ROUTER_GATHER4)
        for (; j + 4 <= n; j += 4) {
            router_dots_vfp(wg + (size_t)j * d, x, d, logits + j, 4);
        }
#endif
        if (n - j >= 2) {
            router_dots_vfp(wg + (size_t)j * d, x, d, logits + j, 2);
            j += 2;
        }
        if (n - j == 1) {
            router_dots_vfp(wg + (size_t)j * d, x, d, logits + j, 1);
            j += 1;
        }
    }
#endif
    for (; j + 4 <= n; j += 4) {
        router_dots(model, e0 + j, x, d, logits + j, 4);
    }
    switch (n - j) {
    case 3:
        router_dots(model, e0 + j, x, d, logits + j, 3);
        break;
    case 2:
        router_dots(model, e0 + j, x, d, logits + j, 2);
        break;
    case 1:
        router_dots(model, e0 + j, x, d, logits + j, 1);
        break;
    default:
        break;
    }
}

/* 1 when every x[i] (i < d) is finite: x[i] * 0 is a zero for a finite x[i], NaN for an
 * infinity or a NaN, and a sum of zeros is a zero (four sums, no branch per value). */
static int router_row_finite(const float *x, size_t d)
{
    float c0 = 0.0f, c1 = 0.0f, c2 = 0.0f, c3 = 0.0f;
    size_t i = 0;
    for (; i + 4 <= d; i += 4) {
        c0 += x[i] * 0.0f;
        c1 += x[i + 1] * 0.0f;
        c2 += x[i + 2] * 0.0f;
        c3 += x[i + 3] * 0.0f;
    }
    for (; i < d; i++) {
        c0 += x[i] * 0.0f;
    }
    return ((c0 + c1) + (c2 + c3)) == 0.0f;
}

colibri_status colibri_route(const colibri_model_t *model, const float *input,
                             int32_t batch_seq_len, int32_t top_k, int32_t *expert_ids,
                             float *gates, float *route_temp)
{
    if (model == NULL || input == NULL || expert_ids == NULL || gates == NULL ||
        batch_seq_len < 0 || !colibri_router_weights_ok(model)) {
        return COLIBRI_ERR_ARG;
    }
    colibri_status st = check_topk(model->n_experts, top_k);
    if (st != COLIBRI_OK) {
        return st;
    }
    const int32_t n_exp = model->n_experts;
    const size_t d = (size_t)model->d_model;
    const float *bias = (model->flags & COLIBRI_FLAG_ROUTER_BIAS) ? model->router_b : NULL;

    for (int32_t t = 0; t < batch_seq_len; t++) {
        const float *x = input + (size_t)t * d;
        if (!router_row_finite(x, d)) {
            return COLIBRI_ERR_NAN;
        }
        int32_t *ids = expert_ids + (size_t)t * (size_t)top_k;
        float *g = gates + (size_t)t * (size_t)top_k;
        route_state rs;
        route_begin(&rs, top_k, ids, g);
        for (int32_t e0 = 0; e0 < n_exp; e0 += ROUTE_BLOCK) {
            const int32_t n = (n_exp - e0 < ROUTE_BLOCK) ? n_exp - e0 : ROUTE_BLOCK;
            float logits[ROUTE_BLOCK];
            router_logits(model, e0, n, x, d, logits);
            if (bias != NULL) {
                for (int32_t j = 0; j < n; j++) {
                    logits[j] = logits[j] + bias[e0 + j];
                }
            }
            if (!route_block(&rs, logits, e0, n)) {
                return COLIBRI_ERR_NAN;
            }
        }
        float lse = route_finish(&rs);
        if (route_temp != NULL) {
            route_temp[t] = lse;
        }
        if (model->flags & COLIBRI_FLAG_NORM_TOPK) {
            float total = 0.0f;
            for (int32_t j = 0; j < top_k; j++) {
                total += g[j];
            }
            for (int32_t j = 0; j < top_k; j++) {
                g[j] /= total;
            }
        }
    }
    return COLIBRI_OK;
}
