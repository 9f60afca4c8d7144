/* Helpers the CPU attention kernels share (hq_cpu.c, dense_cpu.c): a branch-free e^x for the softmax weights, an
 * 8-lane float vector and its sum in a fixed order, and the merge of split-K softmax partials. */
#pragma once

#include <math.h>
#include <stdint.h>
#include <string.h>

/* e^x for x <= 0 (x clamped at −87: e^−87 ≈ 1.6e-38 stands for 0), branch-free so that loops over it vectorise:
 * x·log2(e) = n + f with n = rint, |f| <= ½; 2^f by its degree-7 Taylor polynomial in f·ln 2 (truncation error
 * (½ ln 2)^8 / 8! ≈ 4e-10, below float rounding); 2^n from the exponent bits. */
static inline float exp_neg(float x) {
    x = x < -87.0f ? -87.0f : x;
    float t = x * 1.4426950408889634f;
    float n = (t + 12582912.0f) - 12582912.0f;          /* round to nearest: 1.5·2^23 */
    float y = (t - n) * 0.6931471805599453f;
    float p = 1.0f + y * (1.0f + y * (0.5f + y * (1.0f / 6 + y * (1.0f / 24 + y * (1.0f / 120 + y * (1.0f / 720
              + y * (1.0f / 5040)))))));
    int32_t bits = ((int32_t)n + 127) << 23;
    float s;
    memcpy(&s, &bits, 4);
    return p * s;
}

typedef float v8f __attribute__((vector_size(32)));

/* the 8 lanes summed pairwise in a fixed order */
static inline float hsum(v8f v) {
    return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
}

/* Merge the split-K partials of tasks [i0, i1) of one (row, KV head), each g·(d + 2) floats (m[g], l[g], acc[g][d]:
 * a task's score maximum, its Σ e^(z − m) and its Σ e^(z − m)·v), for query row i of the group, in task order:
 * o[d] = Σ_k e^(m_k − M)·acc_k (un-normalised); returns L = Σ_k e^(m_k − M)·l_k, M the largest m_k. */
static inline float merge_partials(const float *part, int i0, int i1, int g, int d, int i, float *o) {
    float M = -INFINITY, L = 0.f;
    for (int k = i0; k < i1; k++) {
        float mk = part[(int64_t)k * g * (d + 2) + i];
        if (mk > M) M = mk;
    }
    memset(o, 0, sizeof(float) * d);
    for (int k = i0; k < i1; k++) {
        const float *p = part + (int64_t)k * g * (d + 2);
        float w = exp_neg(p[i] - M);
        L += w * p[g + i];
        const float *acc = p + 2 * g + i * d;
        for (int e = 0; e < d; e++) o[e] += w * acc[e];
    }
    return L;
}

/* One task's softmax partials over its n scores per query row, in place: z[i·stride + t] ← e^(z − mx[i]) for the g
 * rows; m_out[i] = mx[i] (the row's score maximum), l_out[i] = Σ_t e^(z − mx[i]). */
static inline void task_softmax(float *z, int stride, int g, int n, const float *mx, float *m_out, float *l_out) {
    for (int i = 0; i < g; i++) {
        float l = 0.f, *zi = z + (int64_t)i * stride;
        for (int t = 0; t < n; t++) zi[t] = exp_neg(zi[t] - mx[i]);
        for (int t = 0; t < n; t++) l += zi[t];
        l_out[i] = l;
        m_out[i] = mx[i];
    }
}
