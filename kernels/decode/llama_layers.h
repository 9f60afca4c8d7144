/* The layer loop of a fused llama decode step, shared by llama_cpu.c (dense fp32 pages) and llama_hq_cpu.c
 * (hq-e8-2b pages and their exact window): for each layer, over T decode rows (T <= 8),
 *
 *   h = RMSNorm(x; w_in)                      x [T][H] fp32, the residual stream (updated in place)
 *   q, k, v = split(h @ W_qkvᵀ)               W_qkv [(Hq + 2·Hkv)·d][H] int4 (int4_cpu.c's operands)
 *   q, k = RoPE(q), RoPE(k)                   rotate-half: x·cos + roll(x, d/2)·sin_rot (layers.apply_rope)
 *   a = attend(layer; q, k, v)                the including file's: store k, v and attend over the context
 *   x += a @ W_oᵀ
 *   h = RMSNorm(x; w_post)
 *   x += (silu(g) ⊙ u) @ W_downᵀ,  [g | u] = h @ W_gate_upᵀ     (SwiGLU, Shazeer 2020)
 *
 * The including file includes rms_cpu.c and int4_cpu.c first. RoPE and SiLU are written out here; they may differ
 * from torch's in the last bit (a contracted FMA, expf).
 */
#ifndef IGNIS_LLAMA_LAYERS_H
#define IGNIS_LLAMA_LAYERS_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* One layer's weight operands (pointers into the model's tensors). */
typedef struct {
    const float *w_in, *w_post;                         /* RMSNorm weights [H] */
    const uint8_t *qkv, *o, *gate_up, *down;            /* int4 codes, torch's CPU layout */
    const uint16_t *qkv_dm, *o_dm, *gate_up_dm, *down_dm;   /* fp16 d, m [K/32][2][N] */
} layer_t;

/* The step's geometry and rows. */
typedef struct {
    int T, H, hq, hkv, d, inter;
    float eps;
    const float *cos, *sin_rot;                         /* [T][d] (Rotary.tables) */
    const int64_t *ctx;                                 /* [T] context lengths after this token */
    const int64_t *pages;                               /* [T][page_stride] page tables */
    int64_t page_stride;
    int pt;                                             /* tokens a page */
} step_t;

/* attend(ctx, layer, step, q [T][Hq·d], k [T][Hkv·d] (both after RoPE), v (row t at v + t·v_stride, [Hkv·d]),
 * att [T][Hq·d] out) -> 0, or -1 when the kernel refuses its operands. */
typedef int (*attend_fn)(const void *ctx, int layer, const step_t *s, const float *q, const float *k,
                         const float *v, int64_t v_stride, float *att);

static inline float silu(float g) { return g / (1.0f + expf(-g)); }

/* rotate-half RoPE of one head vector src [d] into dst [d] (dst != src): cos, sin_rot [d] of its position */
static inline void rope(const float *src, float *dst, const float *cos, const float *sin_rot, int d) {
    int half = d / 2;
    for (int i = 0; i < d; i++) dst[i] = src[i] * cos[i] + src[i < half ? i + half : i - half] * sin_rot[i];
}

/* Run `n_layers` layers over x [T][H] in place. Returns 0, or -1 when a kernel refuses the geometry (nothing is
 * guaranteed about x then) or memory runs out. */
static int llama_layers(const layer_t *layers, int n_layers, float *x, const step_t *s, attend_fn attend,
                        const void *actx) {
    const int T = s->T, H = s->H, d = s->d, inter = s->inter;
    const int qd = s->hq * d, kvd = s->hkv * d, nqkv = qd + 2 * kvd;
    float *h = malloc(sizeof(float) * (size_t)T * H), *qkv = malloc(sizeof(float) * (size_t)T * nqkv);
    float *q = malloc(sizeof(float) * (size_t)T * qd), *att = malloc(sizeof(float) * (size_t)T * qd);
    float *k = malloc(sizeof(float) * (size_t)T * kvd);
    float *y = malloc(sizeof(float) * (size_t)T * H), *gu = malloc(sizeof(float) * (size_t)T * 2 * inter);
    int rc = (h && qkv && q && att && k && y && gu) ? 0 : -1;
    for (int l = 0; l < n_layers && rc == 0; l++) {
        const layer_t *w = layers + l;
        rc |= rms_norm(x, w->w_in, h, T, H, s->eps);
        rc |= int4_mm(h, w->qkv, w->qkv_dm, qkv, T, nqkv, H);
        if (rc) break;
        for (int t = 0; t < T; t++) {
            const float *row = qkv + (int64_t)t * nqkv, *c = s->cos + (int64_t)t * d, *sr = s->sin_rot + (int64_t)t * d;
            for (int i = 0; i < s->hq; i++) rope(row + i * d, q + (int64_t)t * qd + i * d, c, sr, d);
            for (int i = 0; i < s->hkv; i++) rope(row + qd + i * d, k + (int64_t)t * kvd + i * d, c, sr, d);
        }
        rc |= attend(actx, l, s, q, k, qkv + qd + kvd, nqkv, att);
        rc |= int4_mm(att, w->o, w->o_dm, y, T, H, qd);
        if (rc) break;
        for (int64_t i = 0; i < (int64_t)T * H; i++) x[i] += y[i];
        rc |= rms_norm(x, w->w_post, h, T, H, s->eps);
        rc |= int4_mm(h, w->gate_up, w->gate_up_dm, gu, T, 2 * inter, H);
        if (rc) break;
        for (int t = 0; t < T; t++) {                   /* silu(g)·u into the row's first `inter` values */
            float *r = gu + (int64_t)t * 2 * inter, *o = gu + (int64_t)t * inter;
            for (int i = 0; i < inter; i++) o[i] = silu(r[i]) * r[inter + i];
        }
        rc |= int4_mm(gu, w->down, w->down_dm, y, T, H, inter);
        if (rc) break;
        for (int64_t i = 0; i < (int64_t)T * H; i++) x[i] += y[i];
    }
    free(h); free(qkv); free(q); free(att); free(k); free(y); free(gu);
    return rc ? -1 : 0;
}

#endif
