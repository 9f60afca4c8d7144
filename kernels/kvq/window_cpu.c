/* One decode row's write into its exact window on the CPU (HQ_E8_2B.md §2.1, §4.3;
 * ignisd/cache/exact_window.write_exact steps 1 and 4 for a single decode row), in one call instead of about a dozen torch operators:
 *
 *   u = H·(s_κ ⊙ x)/√d                for the row's keys (κ = 0) and values (κ = 1), every KV head
 *   u ← u − μ_κ                       when the sequence is centred (μ: its [2, Hkv, d] centre), else u as it is
 *   ring[κ, pos % R, h] ← u           and sinks[κ, pos, h] ← u when pos < S
 *
 * bit for bit what rotation.rotate and exact_window._recenter compute in float32: the sign product is exact, the
 * butterfly stages (a, b) → (a + b, a − b) run at distances 1, 2, 4, ..., d/2 in rotation.fwht's order, then one
 * multiply by the float32 1/√d and one subtraction, each rounded on its own (fp-contract off: no fused multiply-add).
 */
#include <stdint.h>

#include "../fwht_cpu.h"

#define MAX_D 1024

__attribute__((optimize("fp-contract=off")))
static void rotate_row(const float *x, const float *s, int d, float inv, const float *mu, float *u) {
    for (int e = 0; e < d; e++) u[e] = x[e] * s[e];
    fwht_stages(u, d);
    for (int e = 0; e < d; e++) u[e] = u[e] * inv;
    if (mu)
        for (int e = 0; e < d; e++) u[e] = u[e] - mu[e];
}

/* k, v: [Hkv, d] float32 (contiguous); signs: [2, Hkv, d]; mu: [2, Hkv, d] or NULL; ring: the slot's ring row
 * pos % R of kind 0, kinds `ring_ks` floats apart, heads `ring_hs` apart; sinks: likewise its sink row pos, or NULL.
 * Returns 0, or -1 for d not a power of two in [8, MAX_D]. */
int window_write_row(const float *k, const float *v, const float *signs, int hkv, int d, float inv, const float *mu,
                     float *ring, int64_t ring_ks, int64_t ring_hs, float *sinks, int64_t sink_ks, int64_t sink_hs) {
    if (d < 8 || d > MAX_D || (d & (d - 1))) return -1;
    float u[MAX_D];
    for (int kind = 0; kind < 2; kind++)
        for (int h = 0; h < hkv; h++) {
            const int64_t o = ((int64_t)kind * hkv + h) * d;
            rotate_row((kind ? v : k) + (int64_t)h * d, signs + o, d, inv, mu ? mu + o : 0, u);
            float *dst = ring + kind * ring_ks + h * ring_hs;
            for (int e = 0; e < d; e++) dst[e] = u[e];
            if (sinks) {
                float *sd = sinks + kind * sink_ks + h * sink_hs;
                for (int e = 0; e < d; e++) sd[e] = u[e];
            }
        }
    return 0;
}
