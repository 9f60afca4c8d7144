/* Decode attention over hq-e8-2b pages on the CPU, fused (HQ_E8_2B.md §4.1-§4.3): the formulas of
 * hq_reference.hq_paged_decode_attention in one call per layer instead of ~45 torch operators.
 *
 * Per sequence b, KV head h, query head i of its group (g = Hq / Hkv), with τ the softmax scale:
 *   q_s   = τ·H·(s_K ⊙ q)/√d                         the query rotated once (fast Walsh-Hadamard transform)
 *   cq    = α·½·τ²·‖q‖²/d                             α = vc, the variance correction's strength (1 in §4.1)
 *   z_t   = (ŝ_t/4)·(q_s·w_t) + q_s·μ_K[page(t)]      compressed key t, w_t = 4·c_t (int8, exact: E8P coordinates
 *           − cq·resid_t²                              are multiples of 1/4, §1.1), positions [S, n_enc·pt); μ_K the
 *                                                      page key centre (kvq/page_center.py: k̂_t = μ_K + ŝ_t·c_t),
 *                                                      decoded from the page's "center" bytes, one dot a page
 *   z_t   = q_s·u_t                                   exact key t: ring slot (positions [lo, ctx)) or sink (< S)
 *   õ     = Σ_t p_t·((ŝ_t/4)·w_t or u_t), p = softmax(z)
 *   o     = s_V ⊙ H·õ/√d
 * Work is split into tasks of (row, KV head, CHUNK compressed tokens) plus one task per (row, KV head) for the ring
 * and the sinks; each task keeps its own softmax partials (max, sum, weighted values) and the partials are merged
 * in task order, so the result does not depend on the thread count (flash-decoding's split-K).
 * Threads: OpenMP, the same libgomp (soname libgomp.so.1) torch has already loaded, so the calling thread's team
 * and thread count are torch's.
 */
#ifdef __AVX2__
#include <immintrin.h>
#endif
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../fwht_cpu.h"
#include "softmax_cpu.h"

#define MAX_G 16
#define MAX_D 256
#define CHUNK 256

static float half_to_float(uint16_t h) {
#if defined(__F16C__) && defined(__AVX2__)
    return _cvtsh_ss(h);                            /* exact, one instruction */
#else
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else {                                    /* subnormal: normalise */
            exp = 127 - 15 + 1;
            while (!(man & 0x400u)) { man <<= 1; exp--; }
            bits = sign | (exp << 23) | ((man & 0x3ffu) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
#endif
}

/* float8 e4m3fn (sign 1, exponent 4 bits bias 7, mantissa 3 bits; subnormals at exponent 0; 0x7f / 0xff NaN, no
 * infinities), exactly. */
static float e4m3_to_float(uint8_t v) {
    const uint32_t sign = (uint32_t)(v & 0x80u) << 24, exp = (v >> 3) & 0xfu, man = v & 0x7u;
    if ((v & 0x7fu) == 0x7fu) return NAN;
    if (exp == 0) return (sign ? -1.0f : 1.0f) * (float)man * (1.0f / 512);      /* man/8 · 2^(1−7) */
    uint32_t bits = sign | ((exp + 127 - 7) << 23) | (man << 20);
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Σ a·b over d (a multiple of 8) floats, in 8 lanes summed at the end (vectorises without reassociation). */
static inline float dot(const float *a, const float *b, int d) {
    float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int e = 0; e < d; e += 8)
        for (int k = 0; k < 8; k++) s[k] += a[e + k] * b[e + k];
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

typedef int8_t v8b __attribute__((vector_size(8)));

/* 4·c of one code as 8 floats: one 8-byte word of the table, sign-extended and converted. */
static inline v8f word8(const int64_t *words, int16_t code) {
#ifdef __AVX2__
    __m128i b = _mm_loadl_epi64((const __m128i *)&words[(int32_t)code + 32768]);
    return (v8f)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
#else
    v8b w;
    memcpy(&w, &words[(int32_t)code + 32768], 8);
    return __builtin_convertvector(w, v8f);
#endif
}

typedef struct {
    int b, h, kind;          /* kind 0: compressed tokens [t0, t1) (positions); 1: the ring and the sinks */
    int t0, t1;
} task_t;

typedef struct {
    /* pool of one layer */
    const int16_t *codes;    /* [P, pt, 2, Hkv, d/8] */
    const float *scale;      /* [P, pt, 2, Hkv] */
    const uint16_t *resid;   /* [P, pt, 2, Hkv] (float16 bits) */
    const uint8_t *center;   /* [P, pt, Hkv, 4]: μ_K of (page, head) in the page's 4·pt bytes of that head */
    int center_size;         /* bytes a centre value: 4 float32, 2 float16, 1 float8 e4m3fn; 0 no centre */
    const int64_t *words;    /* [65536] 8 × int8 = 4·c of code (int16 + 32768) */
    const int64_t *pages;    /* [B, W] page table */
    int64_t page_stride;     /* W */
    int pt, hkv, g, d;
    /* exact parts: ring [B, R, Hkv, d], sinks [B, S, Hkv, d] float32, strides in floats */
    const float *ring_k, *ring_v, *sink_k, *sink_v;
    int64_t rs_b, rs_r, rs_h, ss_b, ss_s, ss_h;
    int ring, n_sinks, wp;
    const int64_t *ctx;      /* [B] context lengths */
    const int64_t *row_slot; /* [B] the index of row b's ring and sinks in ring_k / sink_k (NULL: b) */
    const float *qs;         /* [B, Hkv, g, d] rotated, τ-scaled queries */
    const float *cq;         /* [B, Hkv, g] */
} args_t;

/* μ_K of (page, KV head h) decoded from its strided "center" bytes (byte b at ((page·pt + b/4)·Hkv + h)·4 + b%4,
 * little-endian values of center_size bytes) into mu [d]. */
static void page_center(const args_t *a, int64_t page, int h, int d, float *mu) {
    const int64_t step = (int64_t)a->hkv * 4;           /* bytes from one token's 4 bytes of head h to the next */
    const uint8_t *base = a->center + page * a->pt * step + (int64_t)h * 4;
    if (a->center_size == 4) {                          /* float32: value e is token e's 4 bytes */
        for (int e = 0; e < d; e++) memcpy(&mu[e], base + e * step, 4);
    } else if (a->center_size == 2) {                   /* float16: values 2t, 2t + 1 in token t */
        for (int e = 0; e < d; e++) {
            uint16_t v;
            memcpy(&v, base + (e >> 1) * step + 2 * (e & 1), 2);
            mu[e] = half_to_float(v);
        }
    } else {                                            /* float8 e4m3fn: values 4t .. 4t + 3 in token t */
        for (int e = 0; e < d; e++) mu[e] = e4m3_to_float(base[(e >> 2) * step + (e & 3)]);
    }
}

/* The compressed tokens [t0, t1) of one (row, KV head): scores, their softmax partials and the weighted values.
 * Inlined with constant g and nb = d/8 for the common geometries (the loops unroll, the accumulators stay in
 * registers), generic otherwise. */
static inline __attribute__((always_inline)) void compressed(const args_t *a, const task_t *tk, float *m_out,
                                                            float *l_out, float *acc, const int g, const int nb) {
    const int d = 8 * nb, hkv = a->hkv, pt = a->pt;
    const float *qs = a->qs + ((int64_t)tk->b * hkv + tk->h) * g * d;
    const float *cq = a->cq + ((int64_t)tk->b * hkv + tk->h) * g;
    float z[MAX_G][CHUNK];
    float mx[MAX_G];
    for (int i = 0; i < g; i++) mx[i] = -INFINITY;
    const int n = tk->t1 - tk->t0;
    const int64_t *pages = a->pages + (int64_t)tk->b * a->page_stride;
    v8f qv[MAX_G * MAX_D / 8];                        /* the group's queries as 8-lane vectors */
    for (int i = 0; i < g * nb; i++) memcpy(&qv[i], qs + 8 * i, 32);
    float qmu[MAX_G];                                 /* q_s·μ_K of the current page, per row of the group */
    const int64_t step = 2 * (int64_t)hkv;            /* records from one token to the next in a page */
    for (int t = 0; t < n;) {
        const int pos = tk->t0 + t, off = pos % pt, len = pt - off < n - t ? pt - off : n - t;
        const int64_t page = pages[pos / pt];
        if (a->center_size) {                         /* a new page: its centre's dot with each row, once */
            float mu[MAX_D];
            page_center(a, page, tk->h, d, mu);
            for (int i = 0; i < g; i++) {
                v8f s = (v8f){0, 0, 0, 0, 0, 0, 0, 0};
                for (int j = 0; j < nb; j++) {
                    v8f mv;
                    memcpy(&mv, mu + 8 * j, 32);
                    s += qv[i * nb + j] * mv;
                }
                qmu[i] = hsum(s);
            }
        } else {
            for (int i = 0; i < g; i++) qmu[i] = 0.f;
        }
        const int64_t rec0 = ((page * pt + off) * 2) * hkv + tk->h;   /* kind 0 (keys) */
        for (int u = 0; u < len; u++, t++) {
            const int64_t rec = rec0 + u * step;
            const int16_t *c = a->codes + rec * nb;
            v8f s8[MAX_G];
            for (int i = 0; i < g; i++) s8[i] = (v8f){0, 0, 0, 0, 0, 0, 0, 0};
            for (int j = 0; j < nb; j++) {
                v8f xv = word8(a->words, c[j]);
                for (int i = 0; i < g; i++) s8[i] += qv[i * nb + j] * xv;
            }
            float s4 = a->scale[rec] * 0.25f, r = half_to_float(a->resid[rec]), r2 = r * r;
            for (int i = 0; i < g; i++) {
                float zz = s4 * hsum(s8[i]) + qmu[i] - cq[i] * r2;
                z[i][t] = zz;
                if (zz > mx[i]) mx[i] = zz;
            }
        }
    }
    task_softmax(&z[0][0], CHUNK, g, n, mx, m_out, l_out);
    v8f ov[MAX_G * MAX_D / 8];
    for (int i = 0; i < g * nb; i++) ov[i] = (v8f){0, 0, 0, 0, 0, 0, 0, 0};
    for (int t = 0; t < n;) {
        const int pos = tk->t0 + t, off = pos % pt, len = pt - off < n - t ? pt - off : n - t;
        const int64_t rec0 = ((pages[pos / pt] * pt + off) * 2 + 1) * hkv + tk->h;   /* kind 1 (values) */
        for (int u = 0; u < len; u++, t++) {
            const int64_t rec = rec0 + u * step;
            const int16_t *c = a->codes + rec * nb;
            float s4 = a->scale[rec] * 0.25f;
            v8f pw[MAX_G];
            for (int i = 0; i < g; i++) { float p = z[i][t] * s4; pw[i] = (v8f){p, p, p, p, p, p, p, p}; }
            for (int j = 0; j < nb; j++) {
                v8f xv = word8(a->words, c[j]);
                for (int i = 0; i < g; i++) ov[i * nb + j] += pw[i] * xv;
            }
        }
    }
    for (int i = 0; i < g * nb; i++) memcpy(acc + 8 * i, &ov[i], 32);
}

#define GEOMETRY(G, NB) case (G) * 1000 + (NB): compressed(a, tk, m_out, l_out, acc, G, NB); return;

/* partials of one task: m[g], l[g], acc[g][d] */
static void run_task(const args_t *a, const task_t *tk, float *m_out, float *l_out, float *acc) {
    const int g = a->g, d = a->d, nb = d / 8, hkv = a->hkv, pt = a->pt;
    if (tk->kind == 0) {
        switch (g * 1000 + nb) {
            GEOMETRY(1, 8) GEOMETRY(2, 8) GEOMETRY(3, 8) GEOMETRY(4, 8) GEOMETRY(6, 8) GEOMETRY(8, 8)
            GEOMETRY(1, 16) GEOMETRY(2, 16) GEOMETRY(4, 16)
            GEOMETRY(1, 32) GEOMETRY(2, 32) GEOMETRY(3, 32) GEOMETRY(4, 32) GEOMETRY(6, 32) GEOMETRY(8, 32)
            default: compressed(a, tk, m_out, l_out, acc, g, nb); return;
        }
    }
    /* ring positions [lo, ctx) and sinks [0, min(S, ctx)) */
    const float *qs = a->qs + ((int64_t)tk->b * hkv + tk->h) * g * d;
    float mx[MAX_G];
    memset(acc, 0, sizeof(float) * g * d);
    for (int i = 0; i < g; i++) mx[i] = -INFINITY;
    const int ctx = (int)a->ctx[tk->b], pos = ctx - 1;
    const int64_t rb = a->row_slot ? a->row_slot[tk->b] : tk->b;
    int n_enc = pos / pt - a->wp;
    if (n_enc < 0) n_enc = 0;
    int lo = n_enc * pt > a->n_sinks ? n_enc * pt : a->n_sinks;
    if (lo < ctx - a->ring) lo = ctx - a->ring;
    const int ns = ctx < a->n_sinks ? ctx : a->n_sinks;
    const int n = (ctx > lo ? ctx - lo : 0) + ns;
    float *zz = malloc(sizeof(float) * (size_t)g * (size_t)(n > 0 ? n : 1));
    for (int t = 0; t < n; t++) {
        const float *k;
        if (t < ns) k = a->sink_k + rb * a->ss_b + t * a->ss_s + tk->h * a->ss_h;
        else k = a->ring_k + rb * a->rs_b + ((lo + t - ns) % a->ring) * a->rs_r + tk->h * a->rs_h;
        for (int i = 0; i < g; i++) {
            float s = dot(qs + i * d, k, d);
            zz[i * n + t] = s;
            if (s > mx[i]) mx[i] = s;
        }
    }
    for (int i = 0; i < g; i++) {
        float l = 0.f;
        for (int t = 0; t < n; t++) zz[i * n + t] = exp_neg(zz[i * n + t] - mx[i]);
        for (int t = 0; t < n; t++) l += zz[i * n + t];
        l_out[i] = l;
        m_out[i] = mx[i];
    }
    for (int t = 0; t < n; t++) {
        const float *v;
        if (t < ns) v = a->sink_v + rb * a->ss_b + t * a->ss_s + tk->h * a->ss_h;
        else v = a->ring_v + rb * a->rs_b + ((lo + t - ns) % a->ring) * a->rs_r + tk->h * a->rs_h;
        for (int i = 0; i < g; i++) {
            float p = zz[i * n + t];
            float *o = acc + i * d;
            for (int e = 0; e < d; e++) o[e] += p * v[e];
        }
    }
    free(zz);
}

/* Returns 0, or -1 for a geometry outside the compiled limits (g > MAX_G, d > MAX_D or not a power of two ≥ 8) or a
 * centre that does not fit its page (center_size not 0, 1, 2 or 4, or d·center_size > 4·pt). center: the layer's
 * "center" buffer [P, pt, Hkv, 4] (unused when center_size is 0). row_slot [B] (or NULL: b): the index of row b's
 * ring and sinks, in units of rs_b and ss_b (a state slot, when the fused decode step reads the window buffers in
 * place). center_v [B, Hkv, d] or NULL. */
static int hq_decode_rows(const float *q, const float *signs, float tau, float vc, int bsz, int hq, int hkv, int d,
                          int pt, int wp, int ring, int n_sinks, const int64_t *ctx, const int64_t *pages,
                          int64_t page_stride, const int16_t *codes, const float *scale, const uint16_t *resid,
                          const uint8_t *center, int center_size, const int64_t *words,
                          const float *ring_k, const float *ring_v, int64_t rs_b, int64_t rs_r, int64_t rs_h,
                          const float *sink_k, const float *sink_v, int64_t ss_b, int64_t ss_s, int64_t ss_h,
                          const float *center_v, const int64_t *row_slot, float *out) {
    const int g = hq / hkv;
    if (g > MAX_G || d > MAX_D || d < 8 || (d & (d - 1)) || g * hkv != hq) return -1;
    if (center_size != 0 && (center == NULL || (center_size != 1 && center_size != 2 && center_size != 4)
                             || d * center_size > 4 * pt)) return -1;
    const float inv = 1.0f / sqrtf((float)d);
    float *qs = malloc(sizeof(float) * (size_t)bsz * hq * d);
    float *cq = malloc(sizeof(float) * (size_t)bsz * hq);
    for (int r = 0; r < bsz * hq; r++) {
        const int h = (r % hq) / g;
        const float *src = q + (int64_t)r * d, *sk = signs + (int64_t)h * d;
        float *dst = qs + (int64_t)r * d, n2 = 0.f;
        for (int e = 0; e < d; e++) { dst[e] = src[e] * sk[e]; n2 += src[e] * src[e]; }
        fwht_stages(dst, d);
        for (int e = 0; e < d; e++) dst[e] *= tau * inv;
        cq[r] = 0.5f * vc * tau * tau * n2 / (float)d;
    }
    /* tasks */
    int ntask = 0, cap = 0;
    task_t *tasks = NULL;
    for (int b = 0; b < bsz; b++) {
        int pos = (int)ctx[b] - 1, n_enc = pos / pt - wp;
        if (n_enc < 0) n_enc = 0;
        int t_end = n_enc * pt, t_beg = n_sinks;
        int nch = t_end > t_beg ? (t_end - t_beg + CHUNK - 1) / CHUNK : 0;
        for (int h = 0; h < hkv; h++) {
            if (ntask + nch + 1 > cap) {
                cap = 2 * (ntask + nch + 1);
                tasks = realloc(tasks, sizeof(task_t) * (size_t)cap);
            }
            for (int c = 0; c < nch; c++) {
                int t0 = t_beg + c * CHUNK, t1 = t0 + CHUNK < t_end ? t0 + CHUNK : t_end;
                tasks[ntask++] = (task_t){b, h, 0, t0, t1};
            }
            tasks[ntask++] = (task_t){b, h, 1, 0, 0};
        }
    }
    float *part = malloc(sizeof(float) * (size_t)ntask * g * (d + 2));
    args_t a = {codes, scale, resid, center, center_size, words, pages, page_stride, pt, hkv, g, d, ring_k, ring_v,
                sink_k, sink_v, rs_b, rs_r, rs_h, ss_b, ss_s, ss_h, ring, n_sinks, wp, ctx, row_slot, qs, cq};
    #pragma omp parallel for schedule(dynamic, 1) if (ntask > 1)
    for (int i = 0; i < ntask; i++) {
        float *p = part + (int64_t)i * g * (d + 2);
        run_task(&a, &tasks[i], p, p + g, p + 2 * g);
    }
    /* merge the partials of each (row, KV head) in task order; un-rotate */
    int i0 = 0;
    while (i0 < ntask) {
        int b = tasks[i0].b, h = tasks[i0].h, i1 = i0;
        while (i1 < ntask && tasks[i1].b == b && tasks[i1].h == h) i1++;
        for (int i = 0; i < g; i++) {
            float *o = out + ((int64_t)b * hq + h * g + i) * d;
            float L = merge_partials(part, i0, i1, g, d, i, o);
            const float *sv = signs + ((int64_t)hkv + h) * d;
            float f = inv / L;
            if (center_v) {            /* + L·μ_V before the un-rotation: o/L + μ_V, the centre added back */
                const float *mu = center_v + ((int64_t)b * hkv + h) * d;
                for (int e = 0; e < d; e++) o[e] += L * mu[e];
            }
            fwht_stages(o, d);
            for (int e = 0; e < d; e++) o[e] *= f * sv[e];
        }
        i0 = i1;
    }
    free(part);
    free(tasks);
    free(qs);
    free(cq);
    return 0;
}

/* hq_decode_rows with row b's ring and sinks at index b (the exported entry point of hq_cpu.py). */
int hq_decode(const float *q, const float *signs, float tau, float vc, int bsz, int hq, int hkv, int d, int pt,
              int wp, int ring, int n_sinks, const int64_t *ctx, const int64_t *pages, int64_t page_stride,
              const int16_t *codes, const float *scale, const uint16_t *resid, const uint8_t *center,
              int center_size, const int64_t *words,
              const float *ring_k, const float *ring_v, int64_t rs_b, int64_t rs_r, int64_t rs_h,
              const float *sink_k, const float *sink_v, int64_t ss_b, int64_t ss_s, int64_t ss_h,
              const float *center_v, float *out) {
    return hq_decode_rows(q, signs, tau, vc, bsz, hq, hkv, d, pt, wp, ring, n_sinks, ctx, pages, page_stride, codes,
                          scale, resid, center, center_size, words, ring_k, ring_v, rs_b, rs_r, rs_h, sink_k, sink_v,
                          ss_b, ss_s, ss_h, center_v, NULL, out);
}
