/* Decode attention over the slot KV cache, one query token per row (rollout/engines/cpu_attention.py).
 *
 * q, out: [n, KVH * G, D] contiguous; k_cache, v_cache: [slots, KVH, positions, D] with positions and D
 * contiguous (s_slot, s_head: the slot and head strides, in elements); row r attends positions
 * [0, lens[r]) of slot r. One work item is a (row, K/V head) pair: its G query heads read the head's
 * K and V once, each only up to the row's own length. Scores, softmax and the weighted sum are in
 * float32. D and G are compile-time constants (-DD=.. -DG=..), so the query heads and the output
 * accumulators stay in registers and the loops over D vectorise.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if !defined(D) || !defined(G)
#error "compile with -DD=<head_dim> -DG=<query heads per K/V head>"
#endif

/* The score loop prefetches K 16 positions ahead and the V row the weighted sum will read: without,
 * the loads wait on memory (a layer's K/V is not in cache), ~1.5x slower at batch 8. */
#define PREFETCH(K, V, l)                                                                             \
    for (int c = 0; c < (int)(D * sizeof(*(K))); c += 64) {                                           \
        __builtin_prefetch((const char*)((K) + ((l) + 16) * D) + c, 0, 0);                            \
        __builtin_prefetch((const char*)((V) + (l) * D) + c, 0, 0);                                   \
    }

static inline float bf16_load(uint16_t x) {
    uint32_t u = (uint32_t)x << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t bf16_store(float f) { /* round to nearest even, as torch's float -> bfloat16 */
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* NaN stays NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float f32_load(float x) { return x; }
static inline float f32_store(float x) { return x; }

#define DECODE_ATTENTION(NAME, T, LOAD, STORE)                                                        \
    int NAME(const T* q, const T* k_cache, const T* v_cache, T* out, const int64_t* lens, int64_t n,  \
             int64_t kvh, int64_t s_slot, int64_t s_head, float scale) {                              \
        int failed = 0;                                                                               \
        _Pragma("omp parallel for schedule(static)")                                                  \
        for (int64_t item = 0; item < n * kvh; item++) {                                              \
            const int64_t r = item / kvh, h = item % kvh, len = lens[r];                              \
            const T* K = k_cache + r * s_slot + h * s_head;                                           \
            const T* V = v_cache + r * s_slot + h * s_head;                                           \
            const T* qr = q + (r * kvh + h) * G * D;                                                  \
            float qf[G][D], acc[G][D], total[G], row[D];                                              \
            float* s = malloc(sizeof(float) * G * (len > 0 ? len : 1));                               \
            if (!s) { failed = 1; continue; }                                                         \
            for (int g = 0; g < G; g++)                                                               \
                for (int d = 0; d < D; d++) { qf[g][d] = LOAD(qr[g * D + d]) * scale; acc[g][d] = 0; }\
            for (int64_t l = 0; l < len; l++) { /* scores */                                          \
                PREFETCH(K, V, l);                                                                    \
                for (int d = 0; d < D; d++) row[d] = LOAD(K[l * D + d]);                              \
                for (int g = 0; g < G; g++) {                                                         \
                    float dot = 0;                                                                    \
                    for (int d = 0; d < D; d++) dot += qf[g][d] * row[d];                             \
                    s[g * len + l] = dot;                                                             \
                }                                                                                     \
            }                                                                                         \
            for (int g = 0; g < G; g++) { /* softmax, normalised at the end */                        \
                float* sg = s + g * len;                                                              \
                float top = sg[0], sum = 0;                                                           \
                for (int64_t l = 1; l < len; l++) top = sg[l] > top ? sg[l] : top;                    \
                for (int64_t l = 0; l < len; l++) { sg[l] = expf(sg[l] - top); sum += sg[l]; }        \
                total[g] = sum;                                                                       \
            }                                                                                         \
            for (int64_t l = 0; l < len; l++) { /* weighted sum of V */                               \
                for (int d = 0; d < D; d++) row[d] = LOAD(V[l * D + d]);                              \
                for (int g = 0; g < G; g++) {                                                         \
                    const float p = s[g * len + l];                                                   \
                    for (int d = 0; d < D; d++) acc[g][d] += p * row[d];                              \
                }                                                                                     \
            }                                                                                         \
            T* o = out + (r * kvh + h) * G * D;                                                       \
            for (int g = 0; g < G; g++)                                                               \
                for (int d = 0; d < D; d++) o[g * D + d] = STORE(acc[g][d] / total[g]);               \
            free(s);                                                                                  \
        }                                                                                             \
        return failed;                                                                                \
    }

DECODE_ATTENTION(decode_attention_bfloat16, uint16_t, bf16_load, bf16_store)
DECODE_ATTENTION(decode_attention_float32, float, f32_load, f32_store)
