/* Few-row matmul against a 4-bit GGUF weight, exact in fp32 (the decode step's projections).
 *
 *   y[t][n] = Σ_k x[t][k]·w[n][k],   w[n][k] = d[g][n]·c[n][k] + m[g][n],   g = k / 32   (a Q4_0 / Q4_1 block)
 *
 * computed per group as  d·Σ_k c·x + m·Σ_k x,  with the codes c (0..15), d and m (the file's fp16 values) and the
 * activations in fp32: only fp32 rounding is left, ~3e-7 relative against a float64 product (torch's
 * _weight_int4pack_mm_for_cpu rounds the activations, its scales and its output to bf16, ~2e-3).
 *
 * The codes are read from torch's packed bytes (_convert_weight_to_int4pack_for_cpu with innerKTiles 1, as this
 * project's torch packs them, checked at load by int4_cpu.py's probe), so prefill's torch kernel and this one share
 * them: packed [N/32][K][16] bytes, byte j of (block nb, column k) holds c[32·nb + j][k] in its low nibble and
 * c[32·nb + j + 16][k] in its high nibble. d and m: fp16 [K/32][2][N] (per group, the N d's then the N m's).
 *
 * Work: OpenMP over pairs of blocks of 32 output rows; activation rows in pairs (each code converted once for two
 * rows), an odd last row against both blocks of the pair at once (eight independent accumulators). Each output
 * element is summed in the same order whatever T and the thread count, so a row's result does not depend on its
 * batch.
 * Threads: the libgomp torch has loaded (cbuild), so torch's thread count.
 */
#include <stdint.h>
#include <stdlib.h>

#ifdef __AVX2__
#include <immintrin.h>

/* pshufb controls for the 16 code bytes of (block, column k) broadcast to both 128-bit lanes: dword i of the result
 * holds byte i (BYTES_LO) or byte 8 + i (BYTES_HI) zero-extended, so (dword & 15) is row i (or 8 + i) of the block
 * and (dword >> 4) row 16 + i (or 24 + i). One in-lane shuffle per 16 codes where vpmovzxbd needs one per 8. */
#define Z 0x80
#define BYTES(b) _mm256_setr_epi8(b, Z, Z, Z, b + 1, Z, Z, Z, b + 2, Z, Z, Z, b + 3, Z, Z, Z,                  \
                                  b + 4, Z, Z, Z, b + 5, Z, Z, Z, b + 6, Z, Z, Z, b + 7, Z, Z, Z)

/* the codes of (block, column k) at p as four fp32 vectors: rows 0-7, 8-15, 16-23, 24-31 of the block */
#define CODES(p, c0, c1, c2, c3)                                                                    \
    do {                                                                                            \
        __m256i w_ = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(p)));           \
        __m256i e0_ = _mm256_shuffle_epi8(w_, sel_lo), e1_ = _mm256_shuffle_epi8(w_, sel_hi);      \
        c0 = _mm256_cvtepi32_ps(_mm256_and_si256(e0_, mask));                                       \
        c1 = _mm256_cvtepi32_ps(_mm256_and_si256(e1_, mask));                                       \
        c2 = _mm256_cvtepi32_ps(_mm256_srli_epi32(e0_, 4));                                         \
        c3 = _mm256_cvtepi32_ps(_mm256_srli_epi32(e1_, 4));                                         \
    } while (0)

#define CODE_CONSTS                                                                                 \
    const __m256i mask = _mm256_set1_epi32(15), sel_lo = BYTES(0), sel_hi = BYTES(8)

/* a[i] += (the codes at p, rows 8i..8i+7 of the block) · xk, for the four row groups */
#define ACC_CODES(a, p, xk)                                                                         \
    do {                                                                                            \
        __m256 c0_, c1_, c2_, c3_;                                                                  \
        CODES(p, c0_, c1_, c2_, c3_);                                                               \
        a[0] = _mm256_fmadd_ps(c0_, xk, a[0]); a[1] = _mm256_fmadd_ps(c1_, xk, a[1]);              \
        a[2] = _mm256_fmadd_ps(c2_, xk, a[2]); a[3] = _mm256_fmadd_ps(c3_, xk, a[3]);              \
    } while (0)

/* one group's partial sums (part[i]: rows 8i..8i+7 of Σ c·x) folded into tot: tot += d·part + m·Σx. dm: the
 * group's d of the block's first row; its m lie `n` halves further */
static inline void fold(__m256 *tot, const __m256 *part, const uint16_t *dm, int64_t n, float xsum) {
    __m256 xg = _mm256_set1_ps(xsum);
    for (int i = 0; i < 4; i++) {
        __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(dm + i * 8)));
        __m256 m = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(dm + n + i * 8)));
        tot[i] = _mm256_fmadd_ps(d, part[i], tot[i]);
        tot[i] = _mm256_fmadd_ps(m, xg, tot[i]);
    }
}

/* one activation row x [K] (group sums xs [K/32]) against one 32-row block -> y[0..31]; the same order of sums as
 * block_row2's, so a row's result does not depend on whether it was paired */
static void block_row1(const uint8_t *pk, const uint16_t *dm, int64_t n, const float *x, const float *xs,
                       float *y, int groups) {
    CODE_CONSTS;
    __m256 tot[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int g = 0; g < groups; g++) {
        __m256 a[4];
        for (int i = 0; i < 4; i++) a[i] = _mm256_setzero_ps();
        const uint8_t *p = pk + (int64_t)g * 32 * 16;
        const float *xp = x + g * 32;
        for (int k = 0; k < 32; k++) {
            __m256 xk = _mm256_broadcast_ss(xp + k);
            ACC_CODES(a, p + k * 16, xk);
        }
        fold(tot, a, dm + 2 * n * g, n, xs[g]);
    }
    for (int i = 0; i < 4; i++) _mm256_storeu_ps(y + i * 8, tot[i]);
}

/* one activation row against two neighbouring blocks (codes pk and pk + K·16, scales dm and dm + 32) -> y[0..63]:
 * eight independent accumulators where one block has four, so the FMA latency is hidden; each block's sums in
 * block_row1's order, so the result is the same as two block_row1 calls */
static void block2_row1(const uint8_t *pk, const uint16_t *dm, int64_t n, const float *x, const float *xs,
                        float *y, int groups, int k_total) {
    CODE_CONSTS;
    const uint8_t *pk1 = pk + (int64_t)k_total * 16;
    __m256 t0[4], t1[4];
    for (int i = 0; i < 4; i++) t0[i] = t1[i] = _mm256_setzero_ps();
    for (int g = 0; g < groups; g++) {
        __m256 a[4], b[4];
        for (int i = 0; i < 4; i++) a[i] = b[i] = _mm256_setzero_ps();
        const uint8_t *p = pk + (int64_t)g * 32 * 16, *q = pk1 + (int64_t)g * 32 * 16;
        const float *xp = x + g * 32;
        for (int k = 0; k < 32; k++) {
            __m256 xk = _mm256_broadcast_ss(xp + k);
            ACC_CODES(a, p + k * 16, xk);
            ACC_CODES(b, q + k * 16, xk);
        }
        fold(t0, a, dm + 2 * n * g, n, xs[g]);
        fold(t1, b, dm + 32 + 2 * n * g, n, xs[g]);
    }
    for (int i = 0; i < 4; i++) {
        _mm256_storeu_ps(y + i * 8, t0[i]);
        _mm256_storeu_ps(y + 32 + i * 8, t1[i]);
    }
}

/* two activation rows (x, x + K; their group sums xs, xs + groups) against one block -> y[0..31], y[n..n+31] */
static void block_row2(const uint8_t *pk, const uint16_t *dm, int64_t n, const float *x, const float *xs,
                       float *y, int groups, int k_total) {
    CODE_CONSTS;
    const float *x1 = x + k_total, *xs1 = xs + groups;
    __m256 t0[4], t1[4];
    for (int i = 0; i < 4; i++) t0[i] = t1[i] = _mm256_setzero_ps();
    for (int g = 0; g < groups; g++) {
        __m256 a[4], b[4], c0, c1, c2, c3;
        for (int i = 0; i < 4; i++) a[i] = b[i] = _mm256_setzero_ps();
        const uint8_t *p = pk + (int64_t)g * 32 * 16;
        const float *xp = x + g * 32, *xq = x1 + g * 32;
        for (int k = 0; k < 32; k++) {
            __m256 xk = _mm256_broadcast_ss(xp + k), xl = _mm256_broadcast_ss(xq + k);
            CODES(p + k * 16, c0, c1, c2, c3);
            a[0] = _mm256_fmadd_ps(c0, xk, a[0]); a[1] = _mm256_fmadd_ps(c1, xk, a[1]);
            a[2] = _mm256_fmadd_ps(c2, xk, a[2]); a[3] = _mm256_fmadd_ps(c3, xk, a[3]);
            b[0] = _mm256_fmadd_ps(c0, xl, b[0]); b[1] = _mm256_fmadd_ps(c1, xl, b[1]);
            b[2] = _mm256_fmadd_ps(c2, xl, b[2]); b[3] = _mm256_fmadd_ps(c3, xl, b[3]);
        }
        fold(t0, a, dm + 2 * n * g, n, xs[g]);
        fold(t1, b, dm + 2 * n * g, n, xs1[g]);
    }
    for (int i = 0; i < 4; i++) {
        _mm256_storeu_ps(y + i * 8, t0[i]);
        _mm256_storeu_ps(y + n + i * 8, t1[i]);
    }
}
#endif

/* y [T][N] fp32 = x [T][K] fp32 @ w [N][K]ᵀ, w = d·c + m per group of 32: codes in torch's CPU int4 layout (packed
 * [N/32][K][16] uint8), dm [K/32][2][N] fp16 (as uint16). Returns 0, or -1 when this build has no AVX2 path, the
 * geometry is outside it (N or K not a multiple of 32, T < 1) or a workspace cannot be allocated: the caller keeps
 * torch's kernel. */
int int4_mm(const float *x, const uint8_t *packed, const uint16_t *dm, float *y, int T, int N, int K) {
#ifdef __AVX2__
    if (T < 1 || N < 32 || N % 32 || K < 32 || K % 32) return -1;
    int groups = K / 32, blocks = N / 32;
    float *xs = malloc(sizeof(float) * (size_t)T * groups);     /* per row and group: Σ x over the group */
    if (!xs) return -1;
    for (int t = 0; t < T; t++)
        for (int g = 0; g < groups; g++) {
            const float *xp = x + (int64_t)t * K + g * 32;
            float s = 0.0f;
            for (int i = 0; i < 32; i++) s += xp[i];
            xs[t * groups + g] = s;
        }
    #pragma omp parallel for schedule(static)
    for (int u = 0; u < (blocks + 1) / 2; u++) {           /* a unit: blocks 2u and 2u + 1 (the last may be alone) */
        int nb = 2 * u, two = nb + 1 < blocks;
        const uint8_t *pk = packed + (int64_t)nb * K * 16;
        const uint16_t *d = dm + nb * 32;
        int t = 0;
        for (; t + 2 <= T; t += 2)
            for (int j = 0; j <= two; j++)
                block_row2(pk + (int64_t)j * K * 16, d + j * 32, N, x + (int64_t)t * K, xs + t * groups,
                           y + (int64_t)t * N + (nb + j) * 32, groups, K);
        if (t < T && two)
            block2_row1(pk, d, N, x + (int64_t)t * K, xs + t * groups, y + (int64_t)t * N + nb * 32, groups, K);
        else if (t < T)
            block_row1(pk, d, N, x + (int64_t)t * K, xs + t * groups, y + (int64_t)t * N + nb * 32, groups);
    }
    free(xs);
    return 0;
#else
    (void)x; (void)packed; (void)dm; (void)y; (void)T; (void)N; (void)K;
    return -1;
#endif
}

/* The transposed fp32 weight of output rows [n0, n1): out[k][j] = w[n0 + j][k] = d·c + m for k < K, j < n1 − n0
 * (row stride n1 − n0), from the same operands as int4_mm; each value is d·c + m rounded once, as
 * GroupQuant.dequantize computes it (d·c is exact in fp32), so the many-row products can run as one fp32 GEMM.
 * Returns 0, or -1 (no AVX2 path, or N, K, n0, n1 not multiples of 32 with 0 <= n0 < n1 <= N). */
int int4_dequant_t(const uint8_t *packed, const uint16_t *dm, float *out, int N, int K, int n0, int n1) {
#ifdef __AVX2__
    if (N % 32 || K % 32 || n0 % 32 || n1 % 32 || n0 < 0 || n1 <= n0 || n1 > N) return -1;
    int width = n1 - n0;
    #pragma omp parallel for schedule(static)
    for (int k = 0; k < K; k++) {
        CODE_CONSTS;
        const uint16_t *dg = dm + (int64_t)2 * N * (k / 32);
        float *o = out + (int64_t)k * width;
        for (int nb = n0 / 32; nb < n1 / 32; nb++) {
            __m256 c0, c1, c2, c3;
            CODES(packed + ((int64_t)nb * K + k) * 16, c0, c1, c2, c3);
            __m256 c[4] = {c0, c1, c2, c3};
            for (int i = 0; i < 4; i++) {
                const uint16_t *p = dg + nb * 32 + i * 8;
                __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
                __m256 m = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + N)));
                _mm256_storeu_ps(o + (nb * 32 - n0) + i * 8, _mm256_fmadd_ps(c[i], d, m));
            }
        }
    }
    return 0;
#else
    (void)packed; (void)dm; (void)out; (void)N; (void)K; (void)n0; (void)n1;
    return -1;
#endif
}
