/* Products against a Q8_0 GGUF table (the LM head), exact in fp32: w[n][k] = d[n][k/32]·q[n][k], q int8, d the file's
 * fp16 value held in fp32 (ignisd.model.quant.GroupQuant's form, row-major as the file stores it).
 *
 *   q8_mm:          y[t][n] = Σ_g d[n][g]·Σ_{k in g} q[n][k]·x[t][k]   few rows (decode's logits)
 *   q8_dequant:     out[j][k] = d[n0+j][k/32]·q[n0+j][k] for rows [n0, n1)   (exact: d·q has at most 19 significant
 *                   bits), the tile a many-row product runs an fp32 GEMM over
 *
 * Work: OpenMP over output rows; activation rows in pairs (each weight converted once for two rows), an odd last row
 * alone, both summing in the same order, so a row's result does not depend on its batch or the thread count.
 * Threads: the libgomp torch has loaded (cbuild), so torch's thread count.
 */
#include <stdint.h>

#ifdef __AVX2__
#include <immintrin.h>

static inline float hsum8(__m256 v) {
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    a = _mm_add_ss(a, _mm_movehdup_ps(a));
    return _mm_cvtss_f32(a);
}

/* 8 int8 codes at p as fp32 */
#define W8(p) _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p))))

static float row1(const int8_t *q, const float *d, const float *x, int groups) {
    __m256 tot = _mm256_setzero_ps();
    for (int g = 0; g < groups; g++) {
        const int8_t *p = q + g * 32;
        const float *xp = x + g * 32;
        __m256 a0 = _mm256_mul_ps(W8(p), _mm256_loadu_ps(xp));
        __m256 a1 = _mm256_mul_ps(W8(p + 8), _mm256_loadu_ps(xp + 8));
        a0 = _mm256_fmadd_ps(W8(p + 16), _mm256_loadu_ps(xp + 16), a0);
        a1 = _mm256_fmadd_ps(W8(p + 24), _mm256_loadu_ps(xp + 24), a1);
        tot = _mm256_fmadd_ps(_mm256_add_ps(a0, a1), _mm256_set1_ps(d[g]), tot);
    }
    return hsum8(tot);
}

static void row2(const int8_t *q, const float *d, const float *x, const float *x1, int groups, float *y0, float *y1) {
    __m256 t0 = _mm256_setzero_ps(), t1 = _mm256_setzero_ps();
    for (int g = 0; g < groups; g++) {
        const int8_t *p = q + g * 32;
        const float *xp = x + g * 32, *xq = x1 + g * 32;
        __m256 w0 = W8(p), w1 = W8(p + 8), w2 = W8(p + 16), w3 = W8(p + 24);
        __m256 a0 = _mm256_mul_ps(w0, _mm256_loadu_ps(xp));
        __m256 a1 = _mm256_mul_ps(w1, _mm256_loadu_ps(xp + 8));
        __m256 b0 = _mm256_mul_ps(w0, _mm256_loadu_ps(xq));
        __m256 b1 = _mm256_mul_ps(w1, _mm256_loadu_ps(xq + 8));
        a0 = _mm256_fmadd_ps(w2, _mm256_loadu_ps(xp + 16), a0);
        a1 = _mm256_fmadd_ps(w3, _mm256_loadu_ps(xp + 24), a1);
        b0 = _mm256_fmadd_ps(w2, _mm256_loadu_ps(xq + 16), b0);
        b1 = _mm256_fmadd_ps(w3, _mm256_loadu_ps(xq + 24), b1);
        __m256 dd = _mm256_set1_ps(d[g]);
        t0 = _mm256_fmadd_ps(_mm256_add_ps(a0, a1), dd, t0);
        t1 = _mm256_fmadd_ps(_mm256_add_ps(b0, b1), dd, t1);
    }
    *y0 = hsum8(t0);
    *y1 = hsum8(t1);
}
#endif

/* y [T][N] fp32 = x [T][K] fp32 @ w [N][K]ᵀ, w = d·q (q int8 [N][K], d fp32 [N][K/32], both row-major). Returns 0, or
 * -1 when this build has no AVX2 path or K is not a multiple of 32 or T, N < 1. */
int q8_mm(const float *x, const int8_t *q, const float *d, float *y, int T, int N, int K) {
#ifdef __AVX2__
    if (T < 1 || N < 1 || K < 32 || K % 32) return -1;
    int groups = K / 32;
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const int8_t *qn = q + (int64_t)n * K;
        const float *dn = d + (int64_t)n * groups;
        int t = 0;
        for (; t + 2 <= T; t += 2)
            row2(qn, dn, x + (int64_t)t * K, x + (int64_t)(t + 1) * K, groups, y + (int64_t)t * N + n,
                 y + (int64_t)(t + 1) * N + n);
        if (t < T) y[(int64_t)t * N + n] = row1(qn, dn, x + (int64_t)t * K, groups);
    }
    return 0;
#else
    (void)x; (void)q; (void)d; (void)y; (void)T; (void)N; (void)K;
    return -1;
#endif
}

/* out [n1 − n0][K] fp32 = rows [n0, n1) of w = d·q (exact). Returns 0, or -1 (no AVX2 path, K not a multiple of 32,
 * or not 0 <= n0 < n1 <= N). */
int q8_dequant(const int8_t *q, const float *d, float *out, int N, int K, int n0, int n1) {
#ifdef __AVX2__
    if (K < 32 || K % 32 || n0 < 0 || n1 <= n0 || n1 > N) return -1;
    int groups = K / 32;
    #pragma omp parallel for schedule(static)
    for (int n = n0; n < n1; n++) {
        const int8_t *qn = q + (int64_t)n * K;
        float *o = out + (int64_t)(n - n0) * K;
        for (int g = 0; g < groups; g++) {
            __m256 dd = _mm256_set1_ps(d[(int64_t)n * groups + g]);
            for (int i = 0; i < 32; i += 8) _mm256_storeu_ps(o + g * 32 + i, _mm256_mul_ps(W8(qn + g * 32 + i), dd));
        }
    }
    return 0;
#else
    (void)q; (void)d; (void)out; (void)N; (void)K; (void)n0; (void)n1;
    return -1;
#endif
}
