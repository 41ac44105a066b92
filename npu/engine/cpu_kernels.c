/* flm-serve's CPU kernels: matrix products straight from GGML block formats.
 *
 * Y[t, n] = sum_k X[t, k] * W[n, k], with W stored row by row in one of the block formats
 * below (a row is K / 32 blocks) and X, Y float32. A thread takes a range of rows, expands a
 * few rows at a time into a small float buffer (the row stays in L1) and multiplies it with
 * every row of X. Also: expanding rows to float32 (prefill multiplies those with BLAS), and
 * gathering embedding rows.
 *
 * Formats (ids are ggml's):
 *   F32 0, F16 1, BF16 30: plain values
 *   Q4_0 2: f16 d, 16 bytes of nibbles: v = d * (q - 8)
 *   Q4_1 3: f16 d, f16 m, 16 bytes of nibbles: v = d * q + m
 *   Q5_0 6: f16 d, u32 high bits, 16 bytes of nibbles: v = d * (q - 16)
 *   Q5_1 7: f16 d, f16 m, u32 high bits, 16 bytes of nibbles: v = d * q + m
 *   Q8_0 8: f16 d, 32 int8: v = d * q
 * Nibbles: byte j holds element j (low) and element j + 16 (high).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#ifdef __AVX2__
#include <immintrin.h>
#endif

enum { F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, BF16 = 30 };

static float f16_table[65536];
static int table_ready = 0;

static float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    uint32_t bits;
    if (exp == 0) {
        if (mant == 0) {
            bits = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            do { mant <<= 1; e++; } while (!(mant & 0x400));
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((mant & 0x3ff) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

void fk_init(void) {
    if (table_ready) return;
    for (uint32_t i = 0; i < 65536; i++) f16_table[i] = half_to_float((uint16_t)i);
    table_ready = 1;
}

static inline float h2f(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return f16_table[h];
}

static int blocked(int type) { return type != F32 && type != F16 && type != BF16; }

/* Bytes of one row of K values. */
int64_t fk_row_bytes(int type, int64_t K) {
    switch (type) {
    case F32: return 4 * K;
    case F16: case BF16: return 2 * K;
    case Q4_0: return K / 32 * 18;
    case Q4_1: return K / 32 * 20;
    case Q5_0: return K / 32 * 22;
    case Q5_1: return K / 32 * 24;
    case Q8_0: return K / 32 * 34;
    default: return -1;
    }
}

/* Expand one row of K values to float32. */
static void deq_row(int type, const uint8_t *src, float *dst, int64_t K) {
    int64_t nb = K / 32;
    switch (type) {
    case F32:
        memcpy(dst, src, 4 * K);
        break;
    case F16:
        for (int64_t i = 0; i < K; i++) dst[i] = h2f(src + 2 * i);
        break;
    case BF16:
        for (int64_t i = 0; i < K; i++) {
            uint32_t bits = (uint32_t)(src[2 * i] | (src[2 * i + 1] << 8)) << 16;
            memcpy(dst + i, &bits, 4);
        }
        break;
    case Q8_0:
        for (int64_t b = 0; b < nb; b++, src += 34, dst += 32) {
            const float d = h2f(src);
            const int8_t *q = (const int8_t *)(src + 2);
            for (int j = 0; j < 32; j++) dst[j] = d * (float)q[j];
        }
        break;
    case Q4_0:
        for (int64_t b = 0; b < nb; b++, src += 18, dst += 32) {
            const float d = h2f(src);
            const uint8_t *q = src + 2;
            for (int j = 0; j < 16; j++) {
                dst[j] = d * (float)((int)(q[j] & 15) - 8);
                dst[j + 16] = d * (float)((int)(q[j] >> 4) - 8);
            }
        }
        break;
    case Q4_1:
        for (int64_t b = 0; b < nb; b++, src += 20, dst += 32) {
            const float d = h2f(src), m = h2f(src + 2);
            const uint8_t *q = src + 4;
            for (int j = 0; j < 16; j++) {
                dst[j] = d * (float)(q[j] & 15) + m;
                dst[j + 16] = d * (float)(q[j] >> 4) + m;
            }
        }
        break;
    case Q5_0:
        for (int64_t b = 0; b < nb; b++, src += 22, dst += 32) {
            const float d = h2f(src);
            uint32_t qh;
            memcpy(&qh, src + 2, 4);
            const uint8_t *q = src + 6;
            for (int j = 0; j < 16; j++) {
                int lo = (q[j] & 15) | (((qh >> j) & 1) << 4);
                int hi = (q[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
                dst[j] = d * (float)(lo - 16);
                dst[j + 16] = d * (float)(hi - 16);
            }
        }
        break;
    case Q5_1:
        for (int64_t b = 0; b < nb; b++, src += 24, dst += 32) {
            const float d = h2f(src), m = h2f(src + 2);
            uint32_t qh;
            memcpy(&qh, src + 4, 4);
            const uint8_t *q = src + 8;
            for (int j = 0; j < 16; j++) {
                int lo = (q[j] & 15) | (((qh >> j) & 1) << 4);
                int hi = (q[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
                dst[j] = d * (float)lo + m;
                dst[j + 16] = d * (float)hi + m;
            }
        }
        break;
    }
}

static inline float dot(const float *a, const float *b, int64_t K) {
    int64_t k = 0;
    float s = 0.0f;
#ifdef __AVX2__
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    __m256 acc2 = _mm256_setzero_ps(), acc3 = _mm256_setzero_ps();
    for (; k + 32 <= K; k += 32) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), _mm256_loadu_ps(b + k), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k + 8), _mm256_loadu_ps(b + k + 8), acc1);
        acc2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k + 16), _mm256_loadu_ps(b + k + 16), acc2);
        acc3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k + 24), _mm256_loadu_ps(b + k + 24), acc3);
    }
    __m256 acc = _mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3));
    __m128 lo = _mm256_castps256_ps128(acc), hi = _mm256_extractf128_ps(acc, 1);
    lo = _mm_add_ps(lo, hi);
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    s = _mm_cvtss_f32(lo);
#endif
    for (; k < K; k++) s += a[k] * b[k];
    return s;
}

#ifdef __AVX2__
/* One block of 32 values as four vectors of 8 floats (types of has_loader). */
static inline void load_block(int type, const uint8_t *src, __m256 w[4]) {
    switch (type) {
    case Q8_0: {
        const __m256 d = _mm256_set1_ps(h2f(src));
        const uint8_t *q = src + 2;
        for (int i = 0; i < 4; i++) {
            __m128i b = _mm_loadl_epi64((const __m128i *)(q + 8 * i));
            w[i] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)));
        }
        return;
    }
    case Q4_0: case Q4_1: {
        const int one = type == Q4_1;
        const __m256 d = _mm256_set1_ps(h2f(src));
        const __m256 m = one ? _mm256_set1_ps(h2f(src + 2)) : _mm256_set1_ps(-8.0f * h2f(src));
        const __m128i q = _mm_loadu_si128((const __m128i *)(src + (one ? 4 : 2)));
        const __m128i mask = _mm_set1_epi8(15);
        const __m128i lo = _mm_and_si128(q, mask), hi = _mm_and_si128(_mm_srli_epi16(q, 4), mask);
        w[0] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo)), m);
        w[1] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8))), m);
        w[2] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi)), m);
        w[3] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8))), m);
        return;
    }
    case BF16:
        for (int i = 0; i < 4; i++) {
            __m128i b = _mm_loadu_si128((const __m128i *)(src + 16 * i));
            w[i] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(b), 16));
        }
        return;
#ifdef __F16C__
    case F16:
        for (int i = 0; i < 4; i++)
            w[i] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + 16 * i)));
        return;
#endif
    default:  /* not reached: callers check has_loader */
        w[0] = w[1] = w[2] = w[3] = _mm256_setzero_ps();
        return;
    }
}

static inline float hsum(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
}

#define MAX_T 8
/* out[t] = row . X[t] for t < T <= MAX_T, straight from the blocks (a type with a fast
 * loader: has_loader). */
static void row_dots(int type, const uint8_t *row, int64_t K, const float *X, int64_t T,
                     float *out, int64_t out_stride) {
    __m256 w[4];
    const int64_t bs = fk_row_bytes(type, 32);
    if (T == 1) {
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        for (int64_t b = 0; b < K / 32; b++) {
            load_block(type, row + b * bs, w);
            const float *x = X + 32 * b;
            a0 = _mm256_fmadd_ps(w[0], _mm256_loadu_ps(x), a0);
            a1 = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(x + 8), a1);
            a0 = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(x + 16), a0);
            a1 = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(x + 24), a1);
        }
        out[0] = hsum(_mm256_add_ps(a0, a1));
        return;
    }
    __m256 acc[MAX_T];
    for (int64_t t = 0; t < T; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < K / 32; b++) {
        load_block(type, row + b * bs, w);
        for (int64_t t = 0; t < T; t++) {
            const float *x = X + t * K + 32 * b;
            __m256 a = _mm256_mul_ps(w[0], _mm256_loadu_ps(x));
            a = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(x + 8), a);
            a = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(x + 16), a);
            acc[t] = _mm256_add_ps(acc[t], _mm256_fmadd_ps(w[3], _mm256_loadu_ps(x + 24), a));
        }
    }
    for (int64_t t = 0; t < T; t++) out[t * out_stride] = hsum(acc[t]);
}
#else
#define MAX_T 0
static void row_dots(int type, const uint8_t *row, int64_t K, const float *X, int64_t T,
                     float *out, int64_t out_stride) {}
#endif

#define ROWS 4

/* Types load_block expands (with AVX2; without it every type takes deq_row and dot). */
static int has_loader(int type) {
#ifndef __AVX2__
    return 0;
#endif
#ifdef __F16C__
    if (type == F16) return 1;
#endif
    return type == Q8_0 || type == Q4_0 || type == Q4_1 || type == BF16;
}

/* Y[T, N] = X[T, K] @ W[N, K].T with W in `type` (row_bytes per row). */
int fk_matmul(int type, const uint8_t *W, int64_t N, int64_t K, const float *X, int64_t T,
              float *Y, int threads) {
    const int64_t rb = fk_row_bytes(type, K);
    if (rb < 0 || (blocked(type) && K % 32) || !table_ready) return -1;
    const int direct = T <= MAX_T && K % 32 == 0 && has_loader(type);
    int failed = 0;
#pragma omp parallel num_threads(threads)
    {
        float *buf = direct ? NULL : (float *)malloc((size_t)ROWS * K * 4);
        if (!direct && !buf) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int64_t n0 = 0; n0 < N; n0 += ROWS) {
            const int64_t rows = N - n0 < ROWS ? N - n0 : ROWS;
            if (direct) {
                for (int64_t r = 0; r < rows; r++)
                    row_dots(type, W + (n0 + r) * rb, K, X, T, Y + n0 + r, N);
                continue;
            }
            if (!buf) continue;
            for (int64_t r = 0; r < rows; r++) deq_row(type, W + (n0 + r) * rb, buf + r * K, K);
            for (int64_t t = 0; t < T; t++) {
                const float *x = X + t * K;
                float *y = Y + t * N + n0;
                for (int64_t r = 0; r < rows; r++) y[r] = dot(buf + r * K, x, K);
            }
        }
        free(buf);
    }
    return failed ? -2 : 0;
}

/* OUT[r, K] = rows ids[r] of W, as float32 (embedding lookups, and prefill's weights). */
int fk_rows(int type, const uint8_t *W, int64_t K, const int64_t *ids, int64_t n, float *out,
            int threads) {
    const int64_t rb = fk_row_bytes(type, K);
    if (rb < 0 || (blocked(type) && K % 32) || !table_ready) return -1;
#pragma omp parallel for num_threads(threads) schedule(static) if (n > 64)
    for (int64_t r = 0; r < n; r++) deq_row(type, W + ids[r] * rb, out + r * K, K);
    return 0;
}

/* OUT[n, K] = rows first .. first + n of W, as float32. */
int fk_dequant(int type, const uint8_t *W, int64_t K, int64_t first, int64_t n, float *out,
               int threads) {
    const int64_t rb = fk_row_bytes(type, K);
    if (rb < 0 || (blocked(type) && K % 32) || !table_ready) return -1;
#pragma omp parallel for num_threads(threads) schedule(static) if (n > 64)
    for (int64_t r = 0; r < n; r++) deq_row(type, W + (first + r) * rb, out + r * K, K);
    return 0;
}
