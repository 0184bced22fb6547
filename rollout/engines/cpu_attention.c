/* Attention over the slot KV cache for the transformers engine (rollout/engines/cpu_attention.py).
 *
 * q, out: [n, KVH * G, D] contiguous (query head j reads K/V head j / G); k_cache, v_cache: [slots,
 * KVH, positions, D] with positions and D contiguous (s_slot, s_head: the slot and head strides, in
 * elements). Scores, softmax and the weighted sum are in float32. D and G are compile-time constants
 * (-DD=.. -DG=..), so the loops over D vectorise and unroll.
 *
 * decode_attention_*: one token a row; row r attends positions [0, pos[r]] of slot r. A work item is
 *   a (row, K/V head) pair: its G query heads read the head's K and V once, only up to the row's own
 *   length, with the query heads and accumulators in registers.
 * prefill_attention_*: n packed tokens; token i attends positions [0, pos[i]] of slot slot[i] (its
 *   own K/V already written). Runs of up to QB tokens of one slot at consecutive positions attend
 *   together (each K and V row is loaded once for all of them), causally: no mask, no padding.
 *   Decode keeps its own function: run through this one (blocks of one token, accumulators in
 *   memory), a decode step's attention took 1.3-1.5x longer (microbenchmark, batch 8).
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
    int NAME(const T* q, const T* k_cache, const T* v_cache, T* out, const int64_t* pos, int64_t n,   \
             int64_t kvh, int64_t s_slot, int64_t s_head, float scale) {                              \
        int failed = 0;                                                                               \
        _Pragma("omp parallel for schedule(static)")                                                  \
        for (int64_t item = 0; item < n * kvh; item++) {                                              \
            const int64_t r = item / kvh, h = item % kvh, len = pos[r] + 1;                           \
            const T* K = k_cache + r * s_slot + h * s_head;                                           \
            const T* V = v_cache + r * s_slot + h * s_head;                                           \
            const T* qr = q + (r * kvh + h) * G * D;                                                  \
            float qf[G][D], acc[G][D], total[G], row[D];                                              \
            float* s = malloc(sizeof(float) * G * len);                                               \
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

#ifndef QB
#define QB 16 /* tokens of one row that attend together: they share each K and V row's load */
#endif

#define ATTENTION(NAME, T, LOAD, STORE)                                                               \
    int NAME(const T* q, const T* k_cache, const T* v_cache, T* out, const int64_t* slot,             \
             const int64_t* pos, int64_t n, int64_t kvh, int64_t s_slot, int64_t s_head, float scale) { \
        int64_t* first = malloc(sizeof(int64_t) * (n + 1));                                           \
        if (!first) return 1;                                                                         \
        int64_t blocks = 0;                                                                           \
        for (int64_t i = 0; i < n; i++) /* blocks: up to QB tokens of a slot at consecutive positions */ \
            if (!i || slot[i] != slot[i - 1] || pos[i] != pos[i - 1] + 1 || i - first[blocks - 1] == QB) \
                first[blocks++] = i;                                                                  \
        first[blocks] = n;                                                                            \
        int failed = 0;                                                                               \
        _Pragma("omp parallel for schedule(dynamic)")                                                 \
        for (int64_t item = 0; item < blocks * kvh; item++) {                                         \
            const int64_t b = item / kvh, h = item % kvh, t0 = first[b], nt = first[b + 1] - t0;      \
            const int64_t p0 = pos[t0], len = p0 + nt;                                                \
            const T* K = k_cache + slot[t0] * s_slot + h * s_head;                                    \
            const T* V = v_cache + slot[t0] * s_slot + h * s_head;                                    \
            float total[QB * G], row[D];                                                              \
            float* qf = malloc(sizeof(float) * (2 * QB * G * D + QB * G * len));                      \
            if (!qf) { failed = 1; continue; }                                                        \
            float *acc = qf + QB * G * D, *s = acc + QB * G * D;                                      \
            for (int64_t t = 0; t < nt; t++)                                                          \
                for (int i = 0; i < G * D; i++) {                                                     \
                    qf[t * G * D + i] = LOAD(q[((t0 + t) * kvh + h) * G * D + i]) * scale;            \
                    acc[t * G * D + i] = 0;                                                           \
                }                                                                                     \
            for (int64_t l = 0; l < len; l++) { /* scores; token t attends positions 0..p0 + t */     \
                PREFETCH(K, V, l);                                                                    \
                for (int d = 0; d < D; d++) row[d] = LOAD(K[l * D + d]);                              \
                for (int64_t t = l > p0 ? l - p0 : 0; t < nt; t++)                                    \
                    for (int g = 0; g < G; g++) {                                                     \
                        const float* qg = qf + (t * G + g) * D;                                       \
                        float dot = 0;                                                                \
                        for (int d = 0; d < D; d++) dot += qg[d] * row[d];                            \
                        s[(t * G + g) * len + l] = dot;                                               \
                    }                                                                                 \
            }                                                                                         \
            for (int64_t t = 0; t < nt; t++) /* softmax, normalised at the end */                     \
                for (int g = 0; g < G; g++) {                                                         \
                    float* sg = s + (t * G + g) * len;                                                \
                    float top = sg[0], sum = 0;                                                       \
                    for (int64_t l = 1; l <= p0 + t; l++) top = sg[l] > top ? sg[l] : top;            \
                    for (int64_t l = 0; l <= p0 + t; l++) { sg[l] = expf(sg[l] - top); sum += sg[l]; }\
                    total[t * G + g] = sum;                                                           \
                }                                                                                     \
            for (int64_t l = 0; l < len; l++) { /* weighted sum of V */                               \
                for (int d = 0; d < D; d++) row[d] = LOAD(V[l * D + d]);                              \
                for (int64_t t = l > p0 ? l - p0 : 0; t < nt; t++)                                    \
                    for (int g = 0; g < G; g++) {                                                     \
                        const float p = s[(t * G + g) * len + l];                                     \
                        float* a = acc + (t * G + g) * D;                                             \
                        for (int d = 0; d < D; d++) a[d] += p * row[d];                               \
                    }                                                                                 \
            }                                                                                         \
            for (int64_t t = 0; t < nt; t++)                                                          \
                for (int g = 0; g < G; g++)                                                           \
                    for (int d = 0; d < D; d++)                                                       \
                        out[((t0 + t) * kvh + h) * G * D + g * D + d] =                               \
                            STORE(acc[(t * G + g) * D + d] / total[t * G + g]);                       \
            free(qf);                                                                                 \
        }                                                                                             \
        free(first);                                                                                  \
        return failed;                                                                                \
    }

ATTENTION(prefill_attention_bfloat16, uint16_t, bf16_load, bf16_store)
ATTENTION(prefill_attention_float32, float, f32_load, f32_store)
DECODE_ATTENTION(decode_attention_bfloat16, uint16_t, bf16_load, bf16_store)
DECODE_ATTENTION(decode_attention_float32, float, f32_load, f32_store)
