/* The fast Walsh–Hadamard butterflies shared by the CPU kernels (HQ_E8_2B.md §2.1): stages (a, b) → (a + b, a − b)
 * at distances 1, 2, 4, ..., d/2, in ignis_kernels.kvq.rotation.fwht's order, unscaled, in place on x float32 [d]
 * (d a power of two). Additions only, so the result is the same bits whatever the caller's fp-contract setting.
 * cbuild keys a kernel's build on the headers it includes, so editing this file rebuilds every kernel using it. */
#ifndef IGNIS_FWHT_CPU_H
#define IGNIS_FWHT_CPU_H

static inline void fwht_stages(float *x, int d) {
    for (int len = 1; len < d; len <<= 1)
        for (int i = 0; i < d; i += len << 1)
            for (int j = i; j < i + len; j++) {
                float a = x[j], b = x[j + len];
                x[j] = a + b;
                x[j + len] = a - b;
            }
}

#endif
