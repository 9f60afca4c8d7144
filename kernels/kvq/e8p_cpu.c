/* Nearest E8P codeword of 8-dim chunks on the CPU (HQ_E8_2B.md §2.3): the certified search of
 * reference._nearest_block, fused per chunk, with reference.exhaustive_codes as its fallback.
 *
 * Per chunk z (float32 [8]) and shift bit t (0: y = z − 1/4, 1: y = z + 1/4): a = |y|, neg = (y < 0) bits,
 * par = popcount(neg) mod 2, s = Σ a², amin = min a. For each of the 256 abs rows G[r]:
 *   bound(t, r) = s − 2⟨a, G[r]⟩ + ‖G[r]‖² + 2·amin·[par ≠ odd(r)]       (float32)
 * is the exact distance of a matched-parity row and a lower bound for the others (a parity flip costs
 * 4·a_i·G[r][i] >= 4·amin·1/2). The candidate is the first minimum over (t, r) in (t, r) order; its exact distance
 *   D = Σ a² − 2⟨a, G[r]⟩ + ‖G[r]‖² + [par ≠ odd(r)]·4·min_i a_i·G[r][i]   (float64, a from the float32 y)
 * certifies it when it is the only (t, r) whose bound lies below D + ε, ε = 1e-5·(max_t s_t + 40) (float32
 * rounding of the bounds); otherwise the chunk is scanned exhaustively in float64 (y = z − shift in float64),
 * first minimum over (t, r). The code: (r << 8) | (t << 7) | neg bits 0..6, the cheapest coordinate (the first
 * minimum of a_i·G[r][i]) flipped when the parity is wrong. Chunks are independent: the result of a chunk does not
 * depend on the batch, nor on the thread count. */
#include <math.h>
#include <stdint.h>
#include <string.h>

typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));

typedef struct {
    float g[256][8];
    float gt[8][256];        /* G transposed: the bound loop runs across rows (vectorised, no reassociation) */
    float gn[256];
    float oddf[256];         /* odd(r) as 0/1, and its complement */
    float evenf[256];
    int odd[256];
} table_t;

static int64_t finish(const double *a, int negbits, const float *g, int odd, int r, int t) {
    int wrong = (__builtin_popcount(negbits) & 1) != odd;
    if (wrong) {
        int istar = 0;
        double best = a[0] * g[0];
        for (int i = 1; i < 8; i++) {
            double p = a[i] * g[i];
            if (p < best) { best = p; istar = i; }
        }
        negbits ^= 1 << istar;
    }
    return ((int64_t)r << 8) | ((int64_t)t << 7) | (negbits & 0x7f);
}

static int64_t exhaustive(const float *z, const table_t *tb) {
    double bestd = INFINITY, ab[8];
    int bt = 0, br = 0, bneg = 0;
    for (int t = 0; t < 2; t++) {
        double a[8], s = 0, shift = t ? -0.25 : 0.25;
        int neg = 0;
        for (int i = 0; i < 8; i++) {
            double y = (double)z[i] - shift;
            a[i] = fabs(y);
            if (y < 0) neg |= 1 << i;
            s += a[i] * a[i];
        }
        int par = __builtin_popcount(neg) & 1;
        for (int r = 0; r < 256; r++) {
            const float *g = tb->g[r];
            double dot = 0, flip = INFINITY;
            for (int i = 0; i < 8; i++) {
                double p = a[i] * g[i];
                dot += p;
                if (p < flip) flip = p;
            }
            double dist = s - 2 * dot + tb->gn[r] + (par != tb->odd[r] ? 4 * flip : 0);
            if (dist < bestd) {
                bestd = dist; bt = t; br = r; bneg = neg;
                memcpy(ab, a, sizeof ab);
            }
        }
    }
    return finish(ab, bneg, tb->g[br], tb->odd[br], br, bt);
}

static int64_t nearest(const float *z, const table_t *tb) {
    float a[2][8], s[2], amin[2];
    int neg[2], par[2];
    for (int t = 0; t < 2; t++) {
        float shift = t ? -0.25f : 0.25f;
        s[t] = 0;
        amin[t] = INFINITY;
        neg[t] = 0;
        for (int i = 0; i < 8; i++) {
            float y = z[i] - shift;
            a[t][i] = fabsf(y);
            if (y < 0) neg[t] |= 1 << i;
            s[t] += a[t][i] * a[t][i];
            if (a[t][i] < amin[t]) amin[t] = a[t][i];
        }
        par[t] = __builtin_popcount(neg[t]) & 1;
    }
    float bound[512];
    for (int t = 0; t < 2; t++) {
        const float a0 = a[t][0], a1 = a[t][1], a2 = a[t][2], a3 = a[t][3], a4 = a[t][4], a5 = a[t][5],
                    a6 = a[t][6], a7 = a[t][7], c = 2.f * amin[t], st = s[t];
        const float *wm = par[t] ? tb->evenf : tb->oddf;     /* [par ≠ odd(r)] */
        float *bt_ = bound + 256 * t;
        for (int r = 0; r < 256; r++) {
            float dot = ((a0 * tb->gt[0][r] + a1 * tb->gt[1][r]) + (a2 * tb->gt[2][r] + a3 * tb->gt[3][r])) +
                        ((a4 * tb->gt[4][r] + a5 * tb->gt[5][r]) + (a6 * tb->gt[6][r] + a7 * tb->gt[7][r]));
            bt_[r] = (st - 2.f * dot) + tb->gn[r] + c * wm[r];
        }
    }
    /* first minimum over (t, r): per lane the earliest strict minimum (vector blends), then the lowest index
       among the lanes that hold the minimum */
    v8f mv = {INFINITY, INFINITY, INFINITY, INFINITY, INFINITY, INFINITY, INFINITY, INFINITY};
    v8i mi = {0, 1, 2, 3, 4, 5, 6, 7}, idx = mi;
    const v8i step = {8, 8, 8, 8, 8, 8, 8, 8};
    for (int j = 0; j < 512; j += 8) {
        v8f b;
        memcpy(&b, bound + j, 32);
        v8i take = b < mv;                                   /* all-ones where strictly smaller */
        mv = (v8f)(((v8i)b & take) | ((v8i)mv & ~take));
        mi = (idx & take) | (mi & ~take);
        idx += step;
    }
    float best = mv[0];
    int bi = mi[0];
    for (int k = 1; k < 8; k++)
        if (mv[k] < best || (mv[k] == best && mi[k] < bi)) { best = mv[k]; bi = mi[k]; }
    const int bt = bi >> 8, br = bi & 255;
    /* the candidate's exact distance (float64, from the float32 a) */
    double ad[8], dot = 0, flip = INFINITY, sd = 0;
    const float *g = tb->g[br];
    for (int i = 0; i < 8; i++) {
        ad[i] = a[bt][i];
        double p = ad[i] * g[i];
        sd += ad[i] * ad[i];
        dot += p;
        if (p < flip) flip = p;
    }
    int wrong = par[bt] != tb->odd[br];
    double dist = sd - 2 * dot + tb->gn[br] + (wrong ? 4 * flip : 0);
    double eps = 1e-5 * ((double)(s[0] > s[1] ? s[0] : s[1]) + 40.0);
    float thr = (float)(dist + eps);
    int below = 0;
    for (int j = 0; j < 512; j++) below += bound[j] < thr;
    if (below != 1) return exhaustive(z, tb);
    return finish(ad, neg[bt], g, tb->odd[br], br, bt);
}

/* codes int64 [n] of chunks z float32 [n, 8]; g float32 [256, 8] (the abs table), odd int64 [256] (0/1). */
void e8p_nearest(const float *z, int64_t n, const float *g, const int64_t *odd, int64_t *codes) {
    table_t tb;
    for (int r = 0; r < 256; r++) {
        float gn = 0;
        for (int i = 0; i < 8; i++) {
            tb.g[r][i] = g[r * 8 + i];
            gn += g[r * 8 + i] * g[r * 8 + i];
        }
        tb.gn[r] = gn;
        tb.odd[r] = (int)odd[r];
        tb.oddf[r] = (float)odd[r];
        tb.evenf[r] = 1.f - (float)odd[r];
        for (int i = 0; i < 8; i++) tb.gt[i][r] = g[r * 8 + i];
    }
    #pragma omp parallel for schedule(static) if (n >= 4096)
    for (int64_t k = 0; k < n; k++) codes[k] = nearest(z + 8 * k, &tb);
}
