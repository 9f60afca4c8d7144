/* A whole llama decode step's layers in one call over dense fp32 KV pages (llama_layers.h's loop, T <= 8 rows),
 * with attend = write k, v at the rows' pool slots, then dense_cpu.c's decode attention (scale 1/sqrt(d)):
 *
 *   K[slot_t], V[slot_t] = k_t, v_t           the layer's fp32 pages [slots][Hkv][d] (KVStore.write)
 *   a = attention(q; K, V)
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
#include "llama_layers.h"

/* One layer's pages. */
typedef struct {
    float *k_pages, *v_pages;                           /* fp32 [slots][Hkv][d] */
} dense_layer_t;

typedef struct {
    const dense_layer_t *layers;
    const int64_t *slots;                               /* [T] the rows' pool slots (page·pt + offset) */
} dense_ctx_t;

static int dense_attend(const void *actx, int l, const step_t *s, const float *q, const float *k, const float *v,
                        int64_t v_stride, float *att) {
    const dense_ctx_t *c = actx;
    const dense_layer_t *kv = c->layers + l;
    const int kvd = s->hkv * s->d;
    for (int t = 0; t < s->T; t++) {
        memcpy(kv->k_pages + c->slots[t] * kvd, k + (int64_t)t * kvd, sizeof(float) * kvd);
        memcpy(kv->v_pages + c->slots[t] * kvd, v + (int64_t)t * v_stride, sizeof(float) * kvd);
    }
    return dense_decode(q, 1.0f / sqrtf((float)s->d), s->T, s->hq, s->hkv, s->d, s->pt, s->ctx, s->pages,
                        s->page_stride, kv->k_pages, kv->v_pages, 0, att);
}

/* Run `n_layers` layers over x [T][H] in place (llama_layers): kv [n_layers] the layers' pages, slots [T] the rows'
 * pool slots. Returns 0, or -1 when a kernel refuses the geometry or memory runs out. */
int llama_decode(const layer_t *layers, const dense_layer_t *kv, int n_layers, float *x, const step_t *s,
                 const int64_t *slots) {
    dense_ctx_t c = {kv, slots};
    return llama_layers(layers, n_layers, x, s, dense_attend, &c);
}
