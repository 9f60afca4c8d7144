/* A whole llama decode step's layers in one call: for each layer, over T decode rows (T <= 8),
 *
 *   h = RMSNorm(x; w_in)                      x [T][H] fp32, the residual stream (updated in place)
 *   q, k, v = split(h @ W_qkvᵀ)               W_qkv [(Hq + 2·Hkv)·d][H] int4 (int4_cpu.c's operands)
 *   q, k = RoPE(q), RoPE(k)                   rotate-half: x·cos + roll(x, d/2)·sin_rot (layers.apply_rope)
 *   K[slot_t], V[slot_t] = k_t, v_t           the layer's fp32 pages [slots][Hkv][d] (KVStore.write)
 *   a = attention(q; K, V)                    dense_cpu.c's decode attention, scale 1/sqrt(d)
 *   x += a @ W_oᵀ
 *   h = RMSNorm(x; w_post)
 *   x += (silu(g) ⊙ u) @ W_downᵀ,  [g | u] = h @ W_gate_upᵀ     (SwiGLU, Shazeer 2020)
 *
 * by the same C functions the per-operator path calls (rms_cpu.c, int4_cpu.c, dense_cpu.c, included here so they
 * are one library), with RoPE, the page writes, SiLU and the residual adds written out in C. What it saves is the
 * glue: ~13 torch operators and 6 ctypes calls a layer (about 150 µs a layer of a 1-lane SmolLM2 step on this
 * project's EPYC). Same products and sums as that path; RoPE and SiLU may differ from torch's in the last bit (a
 * contracted FMA, expf), so a row's logits agree with the per-operator path to fp32 rounding, not bit for bit.
 */
#include "../norm/rms_cpu.c"
#include "../linear/int4_cpu.c"
#include "../attention/dense_cpu.c"

/* One layer's operands (pointers into the model's and the KV store's tensors). */
typedef struct {
    const float *w_in, *w_post;                         /* RMSNorm weights [H] */
    const uint8_t *qkv, *o, *gate_up, *down;            /* int4 codes, torch's CPU layout */
    const uint16_t *qkv_dm, *o_dm, *gate_up_dm, *down_dm;   /* fp16 d, m [K/32][2][N] */
    float *k_pages, *v_pages;                           /* fp32 [slots][Hkv][d] */
} layer_t;

static inline float silu(float g) { return g / (1.0f + expf(-g)); }

/* rotate-half RoPE of one head vector src [d] into dst [d] (dst != src): cos, sin_rot [d] of its position */
static inline void rope(const float *src, float *dst, const float *cos, const float *sin_rot, int d) {
    int half = d / 2;
    for (int i = 0; i < d; i++) dst[i] = src[i] * cos[i] + src[i < half ? i + half : i - half] * sin_rot[i];
}

/* Run `n_layers` layers over x [T][H] in place. Geometry: H hidden, hq / hkv heads of d dims, inter the MLP width,
 * eps the RMSNorm epsilon. cos, sin_rot [T][d] (Rotary.tables). slots [T]: the rows' pool slots (page·pt + offset),
 * ctx [T] their context lengths after this token, pages [T][page_stride] their page tables, pt tokens a page.
 * Returns 0, or -1 when a kernel refuses the geometry (nothing is guaranteed about x then) or memory runs out. */
int llama_decode(const layer_t *layers, int n_layers, float *x, int T, int H, int hq, int hkv, int d, int inter,
                 float eps, const float *cos, const float *sin_rot, const int64_t *slots, const int64_t *ctx,
                 const int64_t *pages, int64_t page_stride, int pt) {
    const int qd = hq * d, kvd = hkv * d, nqkv = qd + 2 * kvd;
    float *h = malloc(sizeof(float) * (size_t)T * H), *qkv = malloc(sizeof(float) * (size_t)T * nqkv);
    float *q = malloc(sizeof(float) * (size_t)T * qd), *att = malloc(sizeof(float) * (size_t)T * qd);
    float *y = malloc(sizeof(float) * (size_t)T * H), *gu = malloc(sizeof(float) * (size_t)T * 2 * inter);
    int rc = (h && qkv && q && att && y && gu) ? 0 : -1;
    const float scale = 1.0f / sqrtf((float)d);
    for (int l = 0; l < n_layers && rc == 0; l++) {
        const layer_t *w = layers + l;
        rc |= rms_norm(x, w->w_in, h, T, H, eps);
        rc |= int4_mm(h, w->qkv, w->qkv_dm, qkv, T, nqkv, H);
        if (rc) break;
        for (int t = 0; t < T; t++) {
            const float *row = qkv + (int64_t)t * nqkv, *c = cos + (int64_t)t * d, *s = sin_rot + (int64_t)t * d;
            float *kdst = w->k_pages + slots[t] * kvd, *vdst = w->v_pages + slots[t] * kvd;
            for (int i = 0; i < hq; i++) rope(row + i * d, q + (int64_t)t * qd + i * d, c, s, d);
            for (int i = 0; i < hkv; i++) rope(row + qd + i * d, kdst + i * d, c, s, d);
            memcpy(vdst, row + qd + kvd, sizeof(float) * kvd);
        }
        rc |= dense_decode(q, scale, T, hq, hkv, d, pt, ctx, pages, page_stride, w->k_pages, w->v_pages, 0, att);
        rc |= int4_mm(att, w->o, w->o_dm, y, T, H, qd);
        if (rc) break;
        for (int64_t i = 0; i < (int64_t)T * H; i++) x[i] += y[i];
        rc |= rms_norm(x, w->w_post, h, T, H, eps);
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
    free(h); free(qkv); free(q); free(att); free(y); free(gu);
    return rc ? -1 : 0;
}
