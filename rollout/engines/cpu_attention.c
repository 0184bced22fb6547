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

/* One decode work item: G query heads (qf, scaled, float32) attend positions [0, len) of one K/V head
 * (K, V: [positions, D]); their outputs go to o [G, D]. Returns nonzero when out of memory. */
#define DECODE_ITEM(NAME, T, LOAD, STORE)                                                             \
    static int NAME(float qf[G][D], const T* K, const T* V, int64_t len, T* o) {                      \
        float acc[G][D], total[G], row[D];                                                            \
        float* s = malloc(sizeof(float) * G * len);                                                   \
        if (!s) return 1;                                                                             \
        for (int g = 0; g < G; g++)                                                                   \
            for (int d = 0; d < D; d++) acc[g][d] = 0;                                                \
        for (int64_t l = 0; l < len; l++) { /* scores */                                              \
            PREFETCH(K, V, l);                                                                        \
            for (int d = 0; d < D; d++) row[d] = LOAD(K[l * D + d]);                                  \
            for (int g = 0; g < G; g++) {                                                             \
                float dot = 0;                                                                        \
                for (int d = 0; d < D; d++) dot += qf[g][d] * row[d];                                 \
                s[g * len + l] = dot;                                                                 \
            }                                                                                         \
        }                                                                                             \
        for (int g = 0; g < G; g++) { /* softmax, normalised at the end */                            \
            float* sg = s + g * len;                                                                  \
            float top = sg[0], sum = 0;                                                               \
            for (int64_t l = 1; l < len; l++) top = sg[l] > top ? sg[l] : top;                        \
            for (int64_t l = 0; l < len; l++) { sg[l] = expf(sg[l] - top); sum += sg[l]; }            \
            total[g] = sum;                                                                           \
        }                                                                                             \
        for (int64_t l = 0; l < len; l++) { /* weighted sum of V */                                   \
            for (int d = 0; d < D; d++) row[d] = LOAD(V[l * D + d]);                                  \
            for (int g = 0; g < G; g++) {                                                             \
                const float p = s[g * len + l];                                                       \
                for (int d = 0; d < D; d++) acc[g][d] += p * row[d];                                  \
            }                                                                                         \
        }                                                                                             \
        for (int g = 0; g < G; g++)                                                                   \
            for (int d = 0; d < D; d++) o[g * D + d] = STORE(acc[g][d] / total[g]);                   \
        free(s);                                                                                      \
        return 0;                                                                                     \
    }

#define DECODE_ATTENTION(NAME, ITEM, T, LOAD, STORE)                                                  \
    int NAME(const T* q, const T* k_cache, const T* v_cache, T* out, const int64_t* pos, int64_t n,   \
             int64_t kvh, int64_t s_slot, int64_t s_head, float scale) {                              \
        int failed = 0;                                                                               \
        _Pragma("omp parallel for schedule(static)")                                                  \
        for (int64_t item = 0; item < n * kvh; item++) {                                              \
            const int64_t r = item / kvh, h = item % kvh;                                             \
            const T* qr = q + (r * kvh + h) * G * D;                                                  \
            float qf[G][D];                                                                           \
            for (int g = 0; g < G; g++)                                                               \
                for (int d = 0; d < D; d++) qf[g][d] = LOAD(qr[g * D + d]) * scale;                   \
            if (ITEM(qf, k_cache + r * s_slot + h * s_head, v_cache + r * s_slot + h * s_head,        \
                     pos[r] + 1, out + (r * kvh + h) * G * D))                                        \
                failed = 1;                                                                           \
        }                                                                                             \
        return failed;                                                                                \
    }

/* HF's rotary embedding in the model's dtype, rounded as its three ops round: x * cos + roll(x, D/2) *
 * signed_sin (decoder.py ``_rope``), on a [D] head. */
#define ROPE(T, LOAD, STORE, x, c, s, out)                                                            \
    for (int d = 0; d < D; d++)                                                                       \
        out[d] = LOAD(STORE(LOAD(STORE(LOAD(x[d]) * LOAD(c[d]))) +                                    \
                            LOAD(STORE(LOAD(x[(d + D / 2) % D]) * LOAD(s[d])))));

/* decode_layer_*: the attention of a decode step from the fused q/k/v projection, one token a row:
 * qkv [n, (KVH * G + 2 * KVH) * D] (q heads, k heads, v heads), cos / signed sin [n, D]. Row r's k
 * (rotated) and v are written at position pos[r] of slot r, then its rotated q heads attend [0, pos[r]].
 * A work item (row, K/V head) writes and reads only its own head of its own slot. */
#define DECODE_LAYER(NAME, ITEM, T, LOAD, STORE)                                                      \
    int NAME(const T* qkv, const T* cos, const T* sin, T* k_cache, T* v_cache, T* out,                \
             const int64_t* pos, int64_t n, int64_t kvh, int64_t s_slot, int64_t s_head, float scale) { \
        int failed = 0;                                                                               \
        const int64_t width = (kvh * G + 2 * kvh) * D;                                                \
        _Pragma("omp parallel for schedule(static)")                                                  \
        for (int64_t item = 0; item < n * kvh; item++) {                                              \
            const int64_t r = item / kvh, h = item % kvh;                                             \
            const T *x = qkv + r * width, *c = cos + r * D, *sn = sin + r * D;                        \
            const T *k = x + (kvh * G + h) * D, *v = x + (kvh * G + kvh + h) * D;                     \
            T* K = k_cache + r * s_slot + h * s_head;                                                 \
            T* V = v_cache + r * s_slot + h * s_head;                                                 \
            float qf[G][D], kr[D];                                                                    \
            ROPE(T, LOAD, STORE, k, c, sn, kr)                                                        \
            for (int d = 0; d < D; d++) { K[pos[r] * D + d] = STORE(kr[d]); V[pos[r] * D + d] = v[d]; } \
            for (int g = 0; g < G; g++) {                                                             \
                const T* qg = x + (h * G + g) * D;                                                    \
                ROPE(T, LOAD, STORE, qg, c, sn, qf[g])                                                \
                for (int d = 0; d < D; d++) qf[g][d] *= scale;                                        \
            }                                                                                         \
            if (ITEM(qf, K, V, pos[r] + 1, out + (r * kvh + h) * G * D)) failed = 1;                  \
        }                                                                                             \
        return failed;                                                                                \
    }

/* rms_norm_*: h = w * (x * rsqrt(mean(x^2) + eps)) per row of x [n, E], rounded as HF's RMSNorm rounds
 * (the normalised row to the model's dtype, then the product); with res (not NULL), x_out = x + res
 * first (the residual add, rounded) and normalised. Rows are small (E ~ 1k): one thread. */
#define RMS_NORM(NAME, T, LOAD, STORE)                                                                \
    void NAME(const T* x, const T* res, const T* w, T* x_out, T* h, int64_t n, int64_t e, float eps) { \
        for (int64_t r = 0; r < n; r++) {                                                             \
            const T* xr = x + r * e;                                                                  \
            T *xo = x_out + r * e, *hr = h + r * e;                                                   \
            float ss = 0;                                                                             \
            for (int64_t d = 0; d < e; d++) {                                                         \
                const float v = res ? LOAD(STORE(LOAD(xr[d]) + LOAD(res[r * e + d]))) : LOAD(xr[d]);  \
                if (res) xo[d] = STORE(v);                                                            \
                ss += v * v;                                                                          \
            }                                                                                         \
            const float inv = 1.0f / sqrtf(ss / (float)e + eps);                                      \
            const T* src = res ? xo : xr;                                                             \
            for (int64_t d = 0; d < e; d++) hr[d] = STORE(LOAD(w[d]) * LOAD(STORE(LOAD(src[d]) * inv))); \
        }                                                                                             \
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

/* silu_mul_*: out = silu(gate) * up for rows of gate_up [n, 2 * m] (gate, then up), out [n, m], rounded as
 * HF's ``act_fn(gate) * up`` rounds (the activation to the model's dtype, then the product). */
#define SILU_MUL(NAME, T, LOAD, STORE)                                                                \
    void NAME(const T* gate_up, T* out, int64_t n, int64_t m) {                                       \
        for (int64_t r = 0; r < n; r++)                                                               \
            for (int64_t d = 0; d < m; d++) {                                                         \
                const float g = LOAD(gate_up[r * 2 * m + d]);                                         \
                out[r * m + d] = STORE(LOAD(STORE(g / (1.0f + expf(-g)))) * LOAD(gate_up[r * 2 * m + m + d])); \
            }                                                                                         \
    }

ATTENTION(prefill_attention_bfloat16, uint16_t, bf16_load, bf16_store)
ATTENTION(prefill_attention_float32, float, f32_load, f32_store)
DECODE_ITEM(decode_item_bfloat16, uint16_t, bf16_load, bf16_store)
DECODE_ITEM(decode_item_float32, float, f32_load, f32_store)
DECODE_ATTENTION(decode_attention_bfloat16, decode_item_bfloat16, uint16_t, bf16_load, bf16_store)
DECODE_ATTENTION(decode_attention_float32, decode_item_float32, float, f32_load, f32_store)
DECODE_LAYER(decode_layer_bfloat16, decode_item_bfloat16, uint16_t, bf16_load, bf16_store)
DECODE_LAYER(decode_layer_float32, decode_item_float32, float, f32_load, f32_store)
RMS_NORM(rms_norm_bfloat16, uint16_t, bf16_load, bf16_store)
RMS_NORM(rms_norm_float32, float, f32_load, f32_store)
SILU_MUL(silu_mul_bfloat16, uint16_t, bf16_load, bf16_store)
SILU_MUL(silu_mul_float32, float, f32_load, f32_store)
