/* Decode attention over dense (fp32 or bf16) KV pages on the CPU, in one call per layer: the formula of
 * reference.paged_decode_attention (softmax(scale · q·K) · V over each sequence's context, the g = Hq / Hkv query
 * heads of a KV head reading its keys and values once) with the pages read in place through the page table: no
 * gather copy, no mask, no upcast copy of bf16 pages.
 *
 * Work is split into tasks of (row, KV head, CHUNK tokens); each task keeps its own softmax partials (max, sum,
 * weighted values) and the partials of a (row, KV head) are merged in task order, so the result does not depend on
 * the thread count or on the other rows of the batch (flash-decoding's split-K). Threads: OpenMP on the libgomp torch
 * has loaded (cbuild), so torch's thread count.
 */
#ifdef __AVX2__
#include <immintrin.h>
#endif
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "softmax_cpu.h"

#define MAX_G 16
#define MAX_D 256
#define CHUNK 256

typedef struct {
    int b, h, t0, t1;
} task_t;

typedef struct {
    const void *k, *v;       /* [P, pt, Hkv, d], fp32 or bf16 (as uint16) */
    int bf16;
    const int64_t *pages;    /* [B, W] page table */
    int64_t page_stride;     /* W */
    int pt, hkv, g, d;
    const float *qs;         /* [B, Hkv, g, d] scaled queries */
} args_t;

/* 8 values of a K or V row from element index e as floats */
static inline v8f load8(const void *base, int bf16, int64_t e) {
    v8f r;
    if (bf16) {
        const uint16_t *p = (const uint16_t *)base + e;
#ifdef __AVX2__
        __m256i w = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16);
        memcpy(&r, &w, 32);
#else
        for (int i = 0; i < 8; i++) {
            uint32_t bits = (uint32_t)p[i] << 16;
            memcpy((float *)&r + i, &bits, 4);
        }
#endif
    } else {
        memcpy(&r, (const float *)base + e, 32);
    }
    return r;
}

/* partials of one task: m[g], l[g], acc[g][d] (un-normalised weighted values) */
static inline __attribute__((always_inline)) void run(const args_t *a, const task_t *tk, float *m_out, float *l_out,
                                                     float *acc, const int g, const int nb) {
    const int d = 8 * nb, hkv = a->hkv, pt = a->pt;
    const int64_t *pages = a->pages + (int64_t)tk->b * a->page_stride;
    const float *qs = a->qs + ((int64_t)tk->b * hkv + tk->h) * g * d;
    v8f qv[MAX_G * MAX_D / 8];
    for (int i = 0; i < g * nb; i++) memcpy(&qv[i], qs + 8 * i, 32);
    float z[MAX_G][CHUNK], mx[MAX_G];
    for (int i = 0; i < g; i++) mx[i] = -INFINITY;
    const int n = tk->t1 - tk->t0;
    for (int t = 0; t < n; t++) {
        int pos = tk->t0 + t;
        int64_t e = ((pages[pos / pt] * pt + pos % pt) * hkv + tk->h) * d;
        v8f s8[MAX_G];
        for (int i = 0; i < g; i++) s8[i] = (v8f){0, 0, 0, 0, 0, 0, 0, 0};
        for (int j = 0; j < nb; j++) {
            v8f kv = load8(a->k, a->bf16, e + 8 * j);
            for (int i = 0; i < g; i++) s8[i] += qv[i * nb + j] * kv;
        }
        for (int i = 0; i < g; i++) {
            float zz = hsum(s8[i]);
            z[i][t] = zz;
            if (zz > mx[i]) mx[i] = zz;
        }
    }
    task_softmax(&z[0][0], CHUNK, g, n, mx, m_out, l_out);
    v8f ov[MAX_G * MAX_D / 8];
    for (int i = 0; i < g * nb; i++) ov[i] = (v8f){0, 0, 0, 0, 0, 0, 0, 0};
    for (int t = 0; t < n; t++) {
        int pos = tk->t0 + t;
        int64_t e = ((pages[pos / pt] * pt + pos % pt) * hkv + tk->h) * d;
        v8f pw[MAX_G];
        for (int i = 0; i < g; i++) { float p = z[i][t]; pw[i] = (v8f){p, p, p, p, p, p, p, p}; }
        for (int j = 0; j < nb; j++) {
            v8f vv = load8(a->v, a->bf16, e + 8 * j);
            for (int i = 0; i < g; i++) ov[i * nb + j] += pw[i] * vv;
        }
    }
    for (int i = 0; i < g * nb; i++) memcpy(acc + 8 * i, &ov[i], 32);
}

#define GEOMETRY(G, NB) case (G) * 1000 + (NB): run(a, tk, m_out, l_out, acc, G, NB); return;

static void run_task(const args_t *a, const task_t *tk, float *m_out, float *l_out, float *acc) {
    switch (a->g * 1000 + a->d / 8) {
        GEOMETRY(3, 8)    /* SmolLM2: 9 query heads on 3 KV heads, d 64 */
        GEOMETRY(1, 8)
        GEOMETRY(2, 8)
        GEOMETRY(4, 8)
        GEOMETRY(1, 16)
        GEOMETRY(2, 16)
        GEOMETRY(4, 16)
        GEOMETRY(8, 16)
        default: run(a, tk, m_out, l_out, acc, a->g, a->d / 8); return;
    }
}

/* out [B, Hq, d] fp32 = decode attention of q [B, Hq, d] fp32 (the query of row b at position ctx[b] − 1) over k, v
 * [P, pt, Hkv, d] (bf16 != 0: bf16 as uint16, else fp32) through pages [B, W] (W = page_stride), with softmax scale
 * `scale`. Returns 0, or -1 for a geometry outside the compiled limits (g > MAX_G, d > MAX_D or not a multiple of 8,
 * Hq not a multiple of Hkv, a context length < 1) or a failed allocation. */
int dense_decode(const float *q, float scale, int bsz, int hq, int hkv, int d, int pt, const int64_t *ctx,
                 const int64_t *pages, int64_t page_stride, const void *k, const void *v, int bf16, float *out) {
    const int g = hkv > 0 ? hq / hkv : 0;
    if (g < 1 || g > MAX_G || g * hkv != hq || d < 8 || d > MAX_D || d % 8 || pt < 1) return -1;
    for (int b = 0; b < bsz; b++)
        if (ctx[b] < 1 || ctx[b] > page_stride * pt) return -1;
    float *qs = malloc(sizeof(float) * (size_t)bsz * hq * d);
    int ntask = 0;
    for (int b = 0; b < bsz; b++) ntask += hkv * (int)((ctx[b] + CHUNK - 1) / CHUNK);
    task_t *tasks = malloc(sizeof(task_t) * (size_t)ntask);
    float *part = malloc(sizeof(float) * (size_t)ntask * g * (d + 2));
    if (!qs || !tasks || !part) {
        free(qs); free(tasks); free(part);
        return -1;
    }
    for (int64_t i = 0; i < (int64_t)bsz * hq * d; i++) qs[i] = q[i] * scale;
    int n = 0;
    for (int b = 0; b < bsz; b++)
        for (int h = 0; h < hkv; h++)
            for (int t0 = 0; t0 < ctx[b]; t0 += CHUNK)
                tasks[n++] = (task_t){b, h, t0, t0 + CHUNK < ctx[b] ? t0 + CHUNK : (int)ctx[b]};
    args_t a = {k, v, bf16, pages, page_stride, pt, hkv, g, d, qs};
    #pragma omp parallel for schedule(dynamic, 1) if (ntask > 1)
    for (int i = 0; i < ntask; i++) {
        float *p = part + (int64_t)i * g * (d + 2);
        run_task(&a, &tasks[i], p, p + g, p + 2 * g);
    }
    /* merge the partials of each (row, KV head) in task order */
    int i0 = 0;
    while (i0 < ntask) {
        int b = tasks[i0].b, h = tasks[i0].h, i1 = i0;
        while (i1 < ntask && tasks[i1].b == b && tasks[i1].h == h) i1++;
        for (int i = 0; i < g; i++) {
            float *o = out + ((int64_t)b * hq + h * g + i) * d;
            float f = 1.0f / merge_partials(part, i0, i1, g, d, i, o);
            for (int e = 0; e < d; e++) o[e] *= f;
        }
        i0 = i1;
    }
    free(part);
    free(tasks);
    free(qs);
    return 0;
}
