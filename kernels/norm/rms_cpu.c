/* RMSNorm of fp32 rows in one call (Zhang & Sennrich 2019; transformers' LlamaRMSNorm):
 *
 *   y[t][i] = w[i] · x[t][i] / sqrt(mean_i(x[t][i]²) + eps)
 *
 * A decode step runs two per layer on a single row of a few hundred values, where torch's rms_norm costs ~40 µs of
 * operator overhead for ~1 µs of arithmetic. The mean of squares is summed in fp32 over 8 lanes (then the lanes
 * added), as torch's vectorised reduction does in spirit; results agree with torch's to ~1e-7 relative.
 * Rows run in parallel (OpenMP, torch's libgomp and thread count) only when there are many of them.
 */
#include <math.h>
#include <stdint.h>

#ifdef __AVX2__
#include <immintrin.h>
#endif

static void row(const float *x, const float *w, float *y, int h, float eps) {
    int i = 0;
    float ss = 0.0f;
#ifdef __AVX2__
    __m256 acc = _mm256_setzero_ps();
    for (; i + 8 <= h; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        acc = _mm256_fmadd_ps(v, v, acc);
    }
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    a = _mm_add_ss(a, _mm_movehdup_ps(a));
    ss = _mm_cvtss_f32(a);
#endif
    for (; i < h; i++) ss += x[i] * x[i];
    float r = 1.0f / sqrtf(ss / (float)h + eps);
    i = 0;
#ifdef __AVX2__
    __m256 rv = _mm256_set1_ps(r);
    for (; i + 8 <= h; i += 8)
        _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(w + i), _mm256_mul_ps(_mm256_loadu_ps(x + i), rv)));
#endif
    for (; i < h; i++) y[i] = w[i] * (x[i] * r);
}

/* y [T][H] = RMSNorm of x [T][H] with weight w [H] (all fp32, rows contiguous). Returns 0, or -1 for T or H < 1. */
int rms_norm(const float *x, const float *w, float *y, int T, int H, float eps) {
    if (T < 1 || H < 1) return -1;
    #pragma omp parallel for schedule(static) if (T >= 16)
    for (int t = 0; t < T; t++) row(x + (int64_t)t * H, w, y + (int64_t)t * H, H, eps);
    return 0;
}
