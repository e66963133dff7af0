/**
 * @file colibri_quant.h
 * @brief Quantised weight formats and their matrix-vector kernels (portable reference C).
 *
 * One definition per format. Every format stores a weight matrix output-channel-major
 * (w[out][in], the transpose of the fp32 seed layout) so each output is a dot product over
 * contiguous memory. colibri/quant/formats.py mirrors each format as a numpy dtype; a test reads
 * the sizes and offsets below back from a compiled object so the two cannot drift.
 *
 *  - fp16: IEEE binary16 bits (uint16_t), converted exactly to fp32, computed in fp32.
 *  - int8: int8_t q[out][in] with one fp32 scale per output channel (symmetric, q in -127..127).
 *  - int4: colibri_block_q4_32 blocks of 32 weights along the input dimension, one fp16 scale
 *          per block (the 4.5-bit-per-weight layout of ggml's q4_0): w = d * (nibble - 8).
 *  - q4k:  colibri_block_q4k super-blocks of 8 sub-blocks of 32 weights along the input, a 6-bit
 *          scale sc_j and a 6-bit minimum m_j each, one fp16 super-scale d and super-minimum
 *          dmin (144 bytes, 4.5 bits per weight): w = d sc_j q - dmin m_j, q in 0..15. A
 *          matrix's rows' sub-blocks, in row-major order, fill one stream of super-blocks
 *          (COLIBRI_Q4K_BYTES), so rows of any width pay 4.5 bits. int8 activations only
 *          (colibri/quant/formats.py's q4k section).
 *  - q5k:  the same with 5-bit codes, q in 0..31 (colibri_block_q5k, 176 bytes, 5.5 bits per
 *          weight); the q4k x q8 order below with the 5-bit codes.
 *
 * The kernels assume nothing of how scales and codes were chosen (docs/format.md section 6): an
 * int4 d may be negative (so a block's largest weight can use the -8 level) or 0, an int8 scale
 * any finite value; colibri generate picks them by a reconstruction-error search, and with
 * --calib by the expert's routed tokens (weighted search, a w3 / w2 channel fold, and error
 * compensation that may store codes other than the nearest ones).
 *
 * Activations are fp32 (the *_f32 kernels) or int8 quantised at run time in blocks of
 * COLIBRI_QK8 = 32 values along the row, one fp32 scale per block (colibri_quantize_row_q8 + the
 * *_q8 kernels, integer dot products with int32 accumulators per block). A per-block scale keeps
 * one large activation from flattening the rest of the row to a few levels (llama.cpp's q8_0
 * activations make the same choice); the int4 weight blocks line up with the activation blocks.
 *
 * Arithmetic order is part of the contract (the numpy reference mirrors it bit for bit; every
 * board compiles with -ffp-contract=off, so there is no fused multiply-add):
 *  - f16/q8 x f32:  acc = 0; for i: acc += w(o,i) * x[i]            ; y = acc       (f16)
 *                                                                     ; y = acc * s[o] (q8)
 *  - q4 x f32:      acc = 0; for each block b: { bs = 0; for j: bs += (float)(q-8) * x[i] ;
 *                                                acc += bs * d_b }     ; y = acc
 *  - q8 x q8:       acc = 0; for each block b: acc += (float)isum_b * sx[b] ; y = acc * s[o]
 *  - q4 x q8:       acc = 0; for each block b: acc += (float)isum_b * (d_b * sx[b]) ; y = acc
 *  - q4k x q8:      acc = 0; for each sub-block b (of super-block s): { acc += (float)(sc_b *
 *                   isum_b) * (d_s * sx[b]) ; acc -= (float)(m_b * xsum_b) * (dmin_s * sx[b]) }
 *                   ; y = acc   (xsum_b = sum over the block's i of xq[i], int32)
 * where isum_b = sum over the block's i of q(o,i) * xq[i] (int32), and the row quantiser, per
 * block b of 32 values (the last may be shorter), is amax = max|x|, sx[b] = amax / 127,
 * inv = 127 / amax (one division per block), xq = round(x * inv) half away from zero, in 16.16
 * fixed point without libm (all zero, sx[b] 0, when amax is NaN or below 2^-120).
 */
#ifndef COLIBRI_QUANT_H
#define COLIBRI_QUANT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Weights per int4 block. */
#define COLIBRI_QK4 32

/** Activations per scale of the int8 activation quantiser (equal to COLIBRI_QK4). */
#define COLIBRI_QK8 32

/** Scales of a quantised activation row of n values (the last block may be partial). */
#define COLIBRI_Q8_BLOCKS(n) (((size_t)(n) + (COLIBRI_QK8 - 1u)) / COLIBRI_QK8)

/** Bytes of a quantised activation row of n values: its COLIBRI_Q8_BLOCKS(n) fp32 block scales,
 *  then the n int8 codes. Generated kernels with int8 activations keep one such row (n =
 *  max(d_model, d_ff)) in their scratch: colibri.h colibri_model_t.kernel_scratch_bytes. */
#define COLIBRI_Q8_ROW_BYTES(n) (4u * COLIBRI_Q8_BLOCKS(n) + (size_t)(n))

/** Largest |q| of int8 weights and activations (symmetric: -127..127). */
#define COLIBRI_Q8_MAX 127

/** Weight storage schemes (colibri/quant/formats.py SCHEMES, same order). */
typedef enum {
    COLIBRI_QUANT_F32 = 0,
    COLIBRI_QUANT_F16 = 1,
    COLIBRI_QUANT_Q8 = 2,
    COLIBRI_QUANT_Q4 = 3,
    COLIBRI_QUANT_Q4K = 4,
    COLIBRI_QUANT_Q5K = 5
} colibri_quant_scheme;

/** 32 int4 weights with one fp16 scale: 18 bytes, 4.5 bits per weight. Nibble j (j < 16) of
 *  the block is the low half of qs[j]; nibble j + 16 is the high half of qs[j]. */
typedef struct {
    uint16_t d; /**< scale, IEEE binary16 bits: any finite value, negative included */
    uint8_t qs[COLIBRI_QK4 / 2]; /**< nibbles, value = nibble - 8 */
} colibri_block_q4_32;

_Static_assert(sizeof(colibri_block_q4_32) == 18, "colibri_block_q4_32 must be 18 bytes");
_Static_assert(COLIBRI_QK8 == COLIBRI_QK4, "activation blocks line up with int4 weight blocks");
_Static_assert(offsetof(colibri_block_q4_32, qs) == 2, "colibri_block_q4_32.qs at offset 2");

/** Blocks of one row of n_in inputs (the last block is zero-padded). */
#define COLIBRI_Q4_BLOCKS(n_in) (((size_t)(n_in) + (COLIBRI_QK4 - 1u)) / COLIBRI_QK4)

/** Weights per q4k super-block (8 sub-blocks of COLIBRI_QK8). */
#define COLIBRI_QK_K 256

/** 256 weights in 8 sub-blocks of 32: 144 bytes, 4.5 bits per weight. scales[j] (j < 8) holds
 *  the low 4 bits of sc_j (low nibble) and m_j (high nibble); scales[8 + j / 2] their high 2
 *  bits, sc_j's at bit 4 * (j % 2), m_j's at bit 4 * (j % 2) + 2. Code i of sub-block j is the
 *  low nibble of qs[16 j + i] (i < 16) or the high nibble of qs[16 j + i - 16]. */
typedef struct {
    uint16_t d;                   /**< super-scale, IEEE binary16 bits */
    uint16_t dmin;                /**< super-minimum, IEEE binary16 bits */
    uint8_t scales[12];           /**< the 8 sc_j and 8 m_j, 6 bits each */
    uint8_t qs[COLIBRI_QK_K / 2]; /**< codes 0..15, two per byte */
} colibri_block_q4k;

_Static_assert(sizeof(colibri_block_q4k) == 144, "colibri_block_q4k must be 144 bytes");
_Static_assert(offsetof(colibri_block_q4k, scales) == 4, "colibri_block_q4k.scales at offset 4");
_Static_assert(offsetof(colibri_block_q4k, qs) == 16, "colibri_block_q4k.qs at offset 16");
_Static_assert(COLIBRI_QK_K == 8 * COLIBRI_QK8, "q4k sub-blocks line up with activation blocks");

/** Sub-blocks of COLIBRI_QK8 weights per q4k / q5k row of n_in (the last one zero-padded). */
#define COLIBRI_KQ_SUBS(n_in) (((size_t)(n_in) + (COLIBRI_QK8 - 1u)) / COLIBRI_QK8)

/** Rows whose sub-blocks fill whole super-blocks: 8 / gcd(COLIBRI_KQ_SUBS(n_in), 8), 1 when a
 *  row is whole super-blocks. A row r starts a super-block when r is a multiple of it. */
#define COLIBRI_KQ_GROUP_ROWS(n_in)                                                                \
    ((COLIBRI_KQ_SUBS(n_in) % 8u == 0u)   ? 1u                                                     \
     : (COLIBRI_KQ_SUBS(n_in) % 4u == 0u) ? 2u                                                     \
     : (COLIBRI_KQ_SUBS(n_in) % 2u == 0u) ? 4u                                                     \
                                          : 8u)

/** Stored bytes of the first s sub-blocks of a q4k / q5k stream: whole super-blocks of sb bytes,
 *  then the last one cut after its last used sub-block (its 16-byte head and sub bytes per
 *  sub-block). */
#define COLIBRI_KQ_STREAM_BYTES(s, sb, sub)                                                        \
    ((size_t)(s) / 8u * (size_t)(sb) +                                                             \
     (((size_t)(s) % 8u) != 0u ? 16u + (size_t)(sub) * ((size_t)(s) % 8u) : 0u))

/** Stored bytes of the first n_rows rows of a q4k matrix of n_in inputs. A matrix is one
 *  stream of super-blocks that runs across its rows: row r's sub-block c is the stream's
 *  sub-block k = r * COLIBRI_KQ_SUBS(n_in) + c (super-block k / 8, slot k % 8), and the stream
 *  ends after its last used sub-block. So every shape costs 4.5 bits per stored weight (rows'
 *  zero-padded tails and the one cut super-block aside). With n_rows a multiple of
 *  COLIBRI_KQ_GROUP_ROWS(n_in), also the byte where row n_rows starts (row splits). */
#define COLIBRI_Q4K_BYTES(n_rows, n_in)                                                            \
    COLIBRI_KQ_STREAM_BYTES((size_t)(n_rows)*COLIBRI_KQ_SUBS(n_in), sizeof(colibri_block_q4k), 16u)

/** q4k with 5-bit codes: 176 bytes, 5.5 bits per weight. Sub-block j is qs[20 j .. 20 j + 20):
 *  16 bytes of low nibbles as in colibri_block_q4k, then 4 bytes whose bit k (a little-endian
 *  32-bit word) is bit 4 of code k. */
typedef struct {
    uint16_t d;         /**< super-scale, IEEE binary16 bits */
    uint16_t dmin;      /**< super-minimum, IEEE binary16 bits */
    uint8_t scales[12]; /**< the 8 sc_j and 8 m_j, 6 bits each */
    uint8_t qs[8 * 20]; /**< per sub-block: 16 bytes of nibbles, 4 of fifth bits */
} colibri_block_q5k;

_Static_assert(sizeof(colibri_block_q5k) == 176, "colibri_block_q5k must be 176 bytes");
_Static_assert(offsetof(colibri_block_q5k, qs) == 16, "colibri_block_q5k.qs at offset 16");

/** Stored bytes of the first n_rows rows of a q5k matrix (as COLIBRI_Q4K_BYTES, 20 bytes per
 *  sub-block). */
#define COLIBRI_Q5K_BYTES(n_rows, n_in)                                                            \
    COLIBRI_KQ_STREAM_BYTES((size_t)(n_rows)*COLIBRI_KQ_SUBS(n_in), sizeof(colibri_block_q5k), 20u)

/** @brief Exact conversion of IEEE binary16 bits to fp32 (normals, subnormals, inf, NaN). */
float colibri_f16_to_f32(uint16_t h);

/** @brief y[o] = sum_i (float)w[o][i] * x[i], w fp16 [n_out][n_in]. */
void colibri_matvec_f16_f32(const uint16_t *w, const float *x, float *y, int32_t n_out,
                            int32_t n_in);

/** @brief y[o] = (sum_i (float)q[o][i] * x[i]) * scale[o], q int8 [n_out][n_in]. */
void colibri_matvec_q8_f32(const int8_t *q, const float *scale, const float *x, float *y,
                           int32_t n_out, int32_t n_in);

/** @brief y[o] = sum_b d_b * sum_j (q - 8) * x, w [n_out][COLIBRI_Q4_BLOCKS(n_in)] blocks. */
void colibri_matvec_q4_f32(const colibri_block_q4_32 *w, const float *x, float *y, int32_t n_out,
                           int32_t n_in);

/**
 * @brief Quantise one row of n activations to int8, symmetric, one scale per block of
 *        COLIBRI_QK8 values: x[i] ~ sx[i / COLIBRI_QK8] * xq[i]; a block of zeros has scale 0.
 * @param sx COLIBRI_Q8_BLOCKS(n) scales out
 */
void colibri_quantize_row_q8(const float *x, int8_t *xq, float *sx, int32_t n);

/** @brief Integer dot product of two int8 vectors, int32 accumulator. */
int32_t colibri_dot_q8(const int8_t *a, const int8_t *b, int32_t n);

/** @brief Integer dot product of one int4 block (n <= 32 weights used) with int8 xq[n]. */
int32_t colibri_dot_q4_q8(const colibri_block_q4_32 *blk, const int8_t *xq, int32_t n);

/** @brief y[o] = (sum_b (float)dot(q[o]_b, xq_b) * sx[b]) * scale[o], blocks of COLIBRI_QK8. */
void colibri_matvec_q8_q8(const int8_t *q, const float *scale, const int8_t *xq, const float *sx,
                          float *y, int32_t n_out, int32_t n_in);

/** @brief y[o] = sum_b (float)dot(block_b, xq_b) * (d_b * sx[b]). */
void colibri_matvec_q4_q8(const colibri_block_q4_32 *w, const int8_t *xq, const float *sx, float *y,
                          int32_t n_out, int32_t n_in);

/** @brief y[o] = sum_b (float)(sc_b * isum_b) * (d * sx[b]) - (float)(m_b * xsum_b) *
 *         (dmin * sx[b]) over a row's sub-blocks in order (the q4k x q8 order above), w the
 *         COLIBRI_Q4K_BYTES(n_out, n_in) bytes of n_out rows, its first row starting a
 *         super-block (row 0 or a multiple of COLIBRI_KQ_GROUP_ROWS(n_in)); no alignment
 *         needed. Portable C on every board. */
void colibri_matvec_q4k_q8(const void *w, const int8_t *xq, const float *sx, float *y,
                           int32_t n_out, int32_t n_in);

/** @brief Row `row` of a q4k (bits 4) or q5k (bits 5) matrix w of n_in inputs dequantised into
 *         x[n_in]: x = (float)q * (d * (float)sc_j) - dmin * (float)m_j per sub-block j, each
 *         product in fp32 (the embedding rows of --dense-quant q4k / q5k). */
void colibri_dequantize_row_kq(const void *w, int32_t row, int32_t n_in, int32_t bits, float *x);

/** @brief colibri_matvec_q4k_q8 with 5-bit codes: w the COLIBRI_Q5K_BYTES(n_out, n_in) bytes. */
void colibri_matvec_q5k_q8(const void *w, const int8_t *xq, const float *sx, float *y,
                           int32_t n_out, int32_t n_in);

/*
 * Block-scaled int8 (the dense matrices of --dense-quant int8): q int8 [n_out][n_in] as above,
 * scale fp32 [n_out][COLIBRI_Q8_BLOCKS(n_in)], one per block of COLIBRI_QK8 inputs (the last
 * block may be shorter): w[o][i] ~ q[o][i] * scale[o][i / COLIBRI_QK8].
 */

/** @brief y[o] = sum_b (float)dot(q[o]_b, xq_b) * (scale[o][b] * sx[b]), blocks in order. */
void colibri_matvec_q8b_q8(const int8_t *q, const float *scale, const int8_t *xq, const float *sx,
                           float *y, int32_t n_out, int32_t n_in);

/** @brief y[o] = sum_b (sum_{i in b} (float)q[o][i] * x[i]) * scale[o][b], sums in order. */
void colibri_matvec_q8b_f32(const int8_t *q, const float *scale, const float *x, float *y,
                            int32_t n_out, int32_t n_in);

/** @brief y[o] = sum_i w[o][i] * x[i] (fp32 weights, acc += w * x in i order): the matrix
 *         product of colibri_linear_f32 without its bias. */
void colibri_matvec_f32(const float *w, const float *x, float *y, int32_t n_out, int32_t n_in);

/** @brief h[j] = colibri_silu(h[j]) * g[j] for j < n (SwiGLU's mix), the bits of the scalar
 *         colibri_math.h functions on every kernel path. */
void colibri_silu_mul_f32(float *h, const float *g, size_t n);

/** @brief x[j] = colibri_expf(x[j] - m) for j < n (the attention's softmax numerators), the
 *         bits of the scalar colibri_math.h function on every kernel path. */
void colibri_exp_shift_f32(float *x, size_t n, float m);

/** @brief y[i] = y[i] + a * x[i] for i < n (a multiply, then an add: no FMA). */
void colibri_axpy_f32(float *y, float a, const float *x, int32_t n);

/** @brief The attention's weighted sum of values: out[i] = 0, then for t = 0 .. n - 1 in order
 *         out[i] = out[i] + (w[t] / sum) * v[t * stride + i], for i < d (one colibri_axpy_f32
 *         per row, the same bits; on x86 the d sums stay in registers across the rows). */
void colibri_wsum_f32(float *out, const float *w, float sum, const float *v, size_t stride,
                      int32_t n, int32_t d);

/** @brief The first index of the largest of x[0..n) (n >= 1), or -1 when one is NaN or
 *         infinite (greedy sampling's argmax and its finiteness check in one pass). */
int32_t colibri_argmax_f32(const float *x, int32_t n);

/*
 * Multi-token kernels (batched prefill, tokens grouped by expert): n_tok activation rows at once,
 * the weights read once per group of tokens (rows are taken in chunks of a few KB that stay in
 * cache while every token passes over them; on x86-64 with AVX2 or VNNI the int8 x int8 and
 * int4 x int8 kernels also keep tiles of 4 tokens in registers, so each weight block is
 * loaded and unpacked once per tile). Row t: y[t * ldy + o] == what the matvec of the
 * same name writes to y[o] for row t, bit for bit. Activation rows are contiguous: x + t * n_in
 * (fp32), xq + t * n_in (codes), sx + t * COLIBRI_Q8_BLOCKS(n_in) (scales). A caller splitting
 * rows (threads) passes q + o0 * n_in, scale + o0 (per-channel) or scale + o0 * blocks (q8b),
 * w + o0 * COLIBRI_Q4_BLOCKS(n_in) (int4) or w + COLIBRI_Q4K_BYTES(o0, n_in) bytes (q4k / q5k,
 * o0 a multiple of COLIBRI_KQ_GROUP_ROWS(n_in)), y + o0 and n_out = o1 - o0.
 */
void colibri_matmul_q8_q8(const int8_t *q, const float *scale, const int8_t *xq, const float *sx,
                          float *y, int32_t ldy, int32_t n_out, int32_t n_in, int32_t n_tok);
void colibri_matmul_q8b_q8(const int8_t *q, const float *scale, const int8_t *xq, const float *sx,
                           float *y, int32_t ldy, int32_t n_out, int32_t n_in, int32_t n_tok);
void colibri_matmul_q4_q8(const colibri_block_q4_32 *w, const int8_t *xq, const float *sx, float *y,
                          int32_t ldy, int32_t n_out, int32_t n_in, int32_t n_tok);
void colibri_matmul_q5k_q8(const void *w, const int8_t *xq, const float *sx, float *y, int32_t ldy,
                           int32_t n_out, int32_t n_in, int32_t n_tok);
void colibri_matmul_q4k_q8(const void *w, const int8_t *xq, const float *sx, float *y, int32_t ldy,
                           int32_t n_out, int32_t n_in, int32_t n_tok);
void colibri_matmul_f16_f32(const uint16_t *w, const float *x, float *y, int32_t ldy, int32_t n_out,
                            int32_t n_in, int32_t n_tok);
void colibri_matmul_q8_f32(const int8_t *q, const float *scale, const float *x, float *y,
                           int32_t ldy, int32_t n_out, int32_t n_in, int32_t n_tok);
void colibri_matmul_q4_f32(const colibri_block_q4_32 *w, const float *x, float *y, int32_t ldy,
                           int32_t n_out, int32_t n_in, int32_t n_tok);
void colibri_matmul_q8b_f32(const int8_t *q, const float *scale, const float *x, float *y,
                            int32_t ldy, int32_t n_out, int32_t n_in, int32_t n_tok);
/** @brief The fp32 one: row t == colibri_linear_f32(x + t * n_in, w, b, y + t * ldy, n_in,
 *         n_out), i.e. colibri_matvec_f32 then + b[o] when b is not NULL (b + o0 when split). */
void colibri_matmul_f32(const float *w, const float *b, const float *x, float *y, int32_t ldy,
                        int32_t n_out, int32_t n_in, int32_t n_tok);

/*
 * Kernel paths chosen at run time (x86-64: by CPUID on first use, runtime_c/arch/x86_64).
 * Every path returns the same bits (integer sums are order-free; the fp32 / fp16 matvecs keep
 * each row's documented order, vectorised across rows). Other boards have one path (level 0,
 * chosen at compile time) and ignore the setter.
 */
enum {
    COLIBRI_KERNEL_BASE = 0,     /**< kernels_q.c as the board's flags compile it (x86-64: SSE2) */
    COLIBRI_KERNEL_AVX2 = 1,     /**< x86: AVX2 + F16C */
    COLIBRI_KERNEL_AVX_VNNI = 2, /**< x86: AVX2 + AVX-VNNI (VEX VPDPBUSD) */
    COLIBRI_KERNEL_AVX512_VNNI = 3 /**< x86: AVX-512 F/BW/VL + VNNI (EVEX VPDPBUSD) */
};

/** @brief The kernel level in use; the first call picks the best the CPU has, or the one named
 *         by the environment variable COLIBRI_X86_LEVEL (base|sse2|portable, avx2, avxvnni,
 *         avx512vnni; a level the CPU lacks falls back to the best it has below). */
int32_t colibri_kernel_level(void);

/** @brief Force a level (for tests and benchmarks): returns the level set, the highest the CPU
 *         supports at or below `level` (always 0 off x86-64). Not meant to race with kernels
 *         running on other threads. */
int32_t colibri_kernel_set_level(int32_t level);

/** @brief Name of a level ("base", "avx2", "avxvnni", "avx512vnni"). */
const char *colibri_kernel_level_name(int32_t level);

/*
 * Portable reference twins (kernels_q_ref.c; ggml's _ref suffix): plain C, no ISA paths, the
 * operations in the order documented above. Each optimised kernel above returns exactly what its
 * twin returns, on every board and kernel level (tests/platform/refkernels.c); the twins are for
 * tests and for checking a port, not for speed.
 */
float colibri_f16_to_f32_ref(uint16_t h);
void colibri_quantize_row_q8_ref(const float *x, int8_t *xq, float *sx, int32_t n);
int32_t colibri_dot_q8_ref(const int8_t *a, const int8_t *b, int32_t n);
int32_t colibri_dot_q4_q8_ref(const colibri_block_q4_32 *blk, const int8_t *xq, int32_t n);
void colibri_matvec_f32_ref(const float *w, const float *x, float *y, int32_t n_out, int32_t n_in);
void colibri_matvec_f16_f32_ref(const uint16_t *w, const float *x, float *y, int32_t n_out,
                                int32_t n_in);
void colibri_matvec_q4_f32_ref(const colibri_block_q4_32 *w, const float *x, float *y,
                               int32_t n_out, int32_t n_in);
void colibri_matvec_q8_q8_ref(const int8_t *q, const float *scale, const int8_t *xq,
                              const float *sx, float *y, int32_t n_out, int32_t n_in);
void colibri_matvec_q8b_q8_ref(const int8_t *q, const float *scale, const int8_t *xq,
                               const float *sx, float *y, int32_t n_out, int32_t n_in);
void colibri_matvec_q4_q8_ref(const colibri_block_q4_32 *w, const int8_t *xq, const float *sx,
                              float *y, int32_t n_out, int32_t n_in);
void colibri_matmul_q8_q8_ref(const int8_t *q, const float *scale, const int8_t *xq,
                              const float *sx, float *y, int32_t ldy, int32_t n_out, int32_t n_in,
                              int32_t n_tok);
void colibri_matmul_q8b_q8_ref(const int8_t *q, const float *scale, const int8_t *xq,
                               const float *sx, float *y, int32_t ldy, int32_t n_out, int32_t n_in,
                               int32_t n_tok);
void colibri_matmul_q4_q8_ref(const colibri_block_q4_32 *w, const int8_t *xq, const float *sx,
                              float *y, int32_t ldy, int32_t n_out, int32_t n_in, int32_t n_tok);
void colibri_silu_mul_f32_ref(float *h, const float *g, size_t n);
void colibri_exp_shift_f32_ref(float *x, size_t n, float m);
void colibri_axpy_f32_ref(float *y, float a, const float *x, int32_t n);
void colibri_wsum_f32_ref(float *out, const float *w, float sum, const float *v, size_t stride,
                          int32_t n, int32_t d);
int32_t colibri_argmax_f32_ref(const float *x, int32_t n);

#ifdef __cplusplus
}
#endif

#endif /* COLIBRI_QUANT_H */
