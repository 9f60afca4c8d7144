/* A whole llama decode step's layers in one call over hq-e8-2b pages (llama_layers.h's loop, T <= 8 rows), with
 * attend = the exact-window write of each row's new key and value, then the compressed-page attention:
 *
 *   ring[κ, pos % R], sinks[κ, pos] (pos < S) ← H·(s_κ ⊙ x_κ)/√d − μ_κ      window_cpu.c (HQ_E8_2B.md §2.1, §4.3);
 *                                       μ the row's centre once pos >= c0 = (Wp + 1)·pt (centering on), else none
 *   a = hq attention(q; pages, ring, sinks) + μ_V                             hq_cpu.c (§4.1-§4.3)
 *
 * reading and writing the state store's window buffers in place (each row at its state slot). It covers the steps
 * on which no page leaves the window and no centre is fixed; the caller runs those events for every layer first
 * (ignisd.cache.exact_window.prepare_decode: they read only tokens already in the ring). The same functions as the
 * per-operator path (rms_cpu.c, int4_cpu.c, hq_cpu.c, window_cpu.c, included here so they are one library), so
 * the same arithmetic but RoPE and SiLU (llama_layers.h).
 */
#include "../norm/rms_cpu.c"
#include "../linear/int4_cpu.c"
#include "../attention/hq_cpu.c"
#undef MAX_D
#include "../kvq/window_cpu.c"
#include "llama_layers.h"

/* One attention layer's hq-e8-2b operands: its pool buffers, rotation signs and state buffers. */
typedef struct {
    const int16_t *codes;                               /* [P, pt, 2, Hkv, d/8] */
    const float *scale;                                 /* [P, pt, 2, Hkv] */
    const uint16_t *resid;                              /* [P, pt, 2, Hkv] float16 */
    const uint8_t *center;                              /* [P, pt, Hkv, 4] the page key centres */
    const float *signs;                                 /* [2, Hkv, d] */
    float *win;                                         /* kv_window[:, layer] */
    float *sinks;                                       /* kv_sinks[:, layer], or NULL (no sinks) */
    const float *mu;                                    /* kv_center[:, layer] [slots][2][Hkv][d], or NULL */
} hq_layer_t;

/* The step's format constants and state-store geometry (strides in floats). */
typedef struct {
    float tau, vc;                                      /* softmax scale; variance-correction strength α */
    int wp, ring, n_sinks, c0, center_size, center_values;
    const int64_t *words;                               /* hq_decode.word_table */
    int64_t w_slot, w_kind, w_r, w_h;                   /* kv_window strides */
    int64_t s_slot, s_kind, s_s, s_h;                   /* kv_sinks strides */
    int64_t m_slot;                                     /* kv_center slot stride ([2][Hkv][d] contiguous within) */
    const int64_t *state_slots;                         /* [T] the rows' state slots */
    const hq_layer_t *layers;
} hq_ctx_t;

static int hq_attend(const void *actx, int l, const step_t *s, const float *q, const float *k, const float *v,
                     int64_t v_stride, float *att) {
    const hq_ctx_t *c = actx;
    const hq_layer_t *kv = c->layers + l;
    const int T = s->T, hkv = s->hkv, d = s->d, kvd = hkv * d;
    const float inv = 1.0f / sqrtf((float)d);
    float *cv = NULL;                                   /* [T][Hkv][d] the rows' μ_V (zero until centred) */
    if (c->center_values && kv->mu && !(cv = calloc((size_t)T * kvd, sizeof(float)))) return -1;
    int rc = 0;
    for (int t = 0; t < T && rc == 0; t++) {
        const int64_t slot = c->state_slots[t], pos = s->ctx[t] - 1;
        const int on = kv->mu && pos >= c->c0;
        const float *mu = on ? kv->mu + slot * c->m_slot : NULL;
        float *ring = kv->win + slot * c->w_slot + (pos % c->ring) * c->w_r;
        float *sink = kv->sinks && pos < c->n_sinks ? kv->sinks + slot * c->s_slot + pos * c->s_s : NULL;
        rc |= window_write_row(k + (int64_t)t * kvd, v + (int64_t)t * v_stride, kv->signs, hkv, d, inv, mu, ring,
                               c->w_kind, c->w_h, sink, c->s_kind, c->s_h);
        if (cv && on) memcpy(cv + (int64_t)t * kvd, mu + kvd, sizeof(float) * kvd);
    }
    if (rc == 0) {
        const float *sk = kv->sinks ? kv->sinks : kv->win;  /* any valid pointer when there are no sinks */
        const int64_t sks = kv->sinks ? c->s_kind : c->w_kind;
        rc = hq_decode_rows(q, kv->signs, c->tau, c->vc, T, s->hq, hkv, d, s->pt, c->wp, c->ring, c->n_sinks, s->ctx,
                            s->pages, s->page_stride, kv->codes, kv->scale, kv->resid, kv->center, c->center_size,
                            c->words, kv->win, kv->win + c->w_kind, c->w_slot, c->w_r, c->w_h, sk, sk + sks,
                            c->s_slot, c->s_s, c->s_h, cv, c->state_slots, att);
    }
    free(cv);
    return rc;
}

/* Run `n_layers` layers over x [T][H] in place (llama_layers), c->layers [n_layers] the layers' hq-e8-2b
 * operands. Returns 0, or -1 when a kernel refuses the geometry or memory runs out. */
int llama_hq_decode(const layer_t *layers, int n_layers, float *x, const step_t *s, const hq_ctx_t *c) {
    return llama_layers(layers, n_layers, x, s, hq_attend, c);
}
