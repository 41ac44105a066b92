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
 * Where the CPU has VNNI, matrices in these five integer formats are repacked once in groups
 * of 8 or 16 rows (fk_pack_many, "rows interleaved" below) and multiplied from that layout
 * (fk_matmul_packed).
 */
#define _DEFAULT_SOURCE /* madvise under -std=c11 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <omp.h>
#include <sys/mman.h>
#ifdef __AVX2__
#include <immintrin.h>
#endif

/* VNNI on 256-bit vectors (vpdpbusd: four u8 x s8 products added into each int32 lane) */
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define DPBUSD256 _mm256_dpbusd_epi32
#elif defined(__AVXVNNI__)
#define DPBUSD256 _mm256_dpbusd_avx_epi32
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

#if !(defined(__AVX2__) && defined(__F16C__))
uint16_t fc_half_soft(float f); /* cpu_convert.c: rounded to the nearest, ties to even */
#endif

/* A float's f16 bits, rounded to the nearest (ties to even). */
static inline uint16_t f2h(float x) {
#if defined(__AVX2__) && defined(__F16C__)
    return _cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT);
#else
    return fc_half_soft(x);
#endif
}

void fk_init(void) {
    if (table_ready) return;
    for (uint32_t i = 0; i < 65536; i++) f16_table[i] = half_to_float((uint16_t)i);
    table_ready = 1;
}

static inline float h2f(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
#ifdef __F16C__
    return _cvtsh_ss(h);
#else
    return f16_table[h];
#endif
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

static inline float hsum_max(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

static inline float hsum(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
}

/* e^x for 8 lanes: 2^n e^r with n = round(x / ln 2) and r = x - n ln 2 (|r| <= ln 2 / 2, ln 2
 * in two parts), e^r by its Taylor polynomial of degree 7 (relative error below 1e-7); x
 * clamped to [-87, 89]: 2^n stays a normal float below, and is 2^128 = inf above 88.7 (as
 * expf overflows). */
static inline __m256 exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(89.0f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145752f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.42860677e-6f), r);
    __m256 p = _mm256_set1_ps(1.0f / 5040);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n),
                                                         _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
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
                     float *out, int64_t out_stride) { /* not called: MAX_T 0 */
    (void)type; (void)row; (void)K; (void)X; (void)T; (void)out; (void)out_stride;
}
#endif

/* -- 8-bit activations ----------------------------------------------------------------------
 * For the integer formats (Q4_0 Q4_1 Q5_0 Q5_1 Q8_0) a few rows of X are first rounded to
 * 8 bits per block of 32 (scale dx = max|x| / 127, codes qx = round(x / dx)), as llama.cpp
 * does, so a weight block times an activation block is one integer dot product of 32 pairs:
 *   sum_j (dw * cw_j + mw) * (dx * qx_j) = dw * dx * sum_j cw_j * qx_j + mw * (dx * sum_j qx_j)
 * with cw the block's codes (0..15 for Q4, 0..31 for Q5, -128..127 for Q8_0) and mw its
 * offset (Q4_0: -8 dw, Q5_0: -16 dw, Q4_1 / Q5_1: m, Q8_0: 0). The rounding costs about
 * 0.2% of a block's largest activation per element; the reference backend keeps float32. */
/* bytes of activation codes a thread goes over per pass of its rows */
#define TOKEN_CHUNK_BYTES (128 * 1024)

typedef struct {
    int64_t K, nb;
    int8_t *q;   /* [T, K] codes */
    float *d;    /* [T, nb] scales */
    float *s;    /* [T, nb] dx * sum of the block's codes */
    int32_t *qs; /* [T, nb] sum of the block's codes (NULL: not wanted) */
    int tiled;   /* 0: token-major as above; 1: tiles of 8 tokens, [T/8][nb][8] (packed) */
} Act8;

/* Where token t's block b is in `a`, counted in blocks (its codes at 32 times that). */
static inline int64_t act_at(const Act8 *a, int64_t t, int64_t b) {
    return a->tiled ? ((t >> 3) * a->nb + b) * 8 + (t & 7) : t * a->nb + b;
}

static int is_integer(int type) {
    return type == Q4_0 || type == Q4_1 || type == Q5_0 || type == Q5_1 || type == Q8_0;
}

/* x rounded to the nearest f16 (ties to even), as a float. */
static inline float round_f16(float x) {
    const uint16_t h = f2h(x);
    return h2f((const uint8_t *)&h);
}

#ifdef __AVX2__
/* Blocks b0 .. b1 of token t, whose values start at x, rounded into `a`. */
static void quantize_blocks(const float *x0, int64_t t, int64_t b0, int64_t b1, Act8 *a) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    {
        for (int64_t b = b0; b < b1; b++) {
            const float *x = x0 + 32 * b;
            const int64_t at = act_at(a, t, b);
            __m256 v[4], m = _mm256_setzero_ps();
            for (int i = 0; i < 4; i++) {
                v[i] = _mm256_loadu_ps(x + 8 * i);
                m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[i]));
            }
            const float amax = hsum_max(m);
            /* the scale (and below the sum) rounded to f16, as llama.cpp's q8_0 / q8_1 store
             * them: the same arithmetic as the peer, so greedy output matches it */
            const float d = round_f16(amax / 127.0f);
            const __m256 inv = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
            __m256i c[4];
            for (int i = 0; i < 4; i++)
                c[i] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[i], inv),
                                                          _MM_FROUND_TO_NEAREST_INT |
                                                          _MM_FROUND_NO_EXC));
            /* sum of the codes, then pack 32 int32 to 32 int8 in order */
            __m256i sum = _mm256_add_epi32(_mm256_add_epi32(c[0], c[1]),
                                           _mm256_add_epi32(c[2], c[3]));
            __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum),
                                       _mm256_extracti128_si256(sum, 1));
            s4 = _mm_hadd_epi32(s4, s4);
            s4 = _mm_hadd_epi32(s4, s4);
            __m256i p16a = _mm256_packs_epi32(c[0], c[1]), p16b = _mm256_packs_epi32(c[2], c[3]);
            __m256i p8 = _mm256_packs_epi16(p16a, p16b);
            /* packs work within 128-bit lanes: the 4-code groups come out as c0 c1 c2 c3 of
             * the low halves, then of the high halves */
            p8 = _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256((__m256i *)(a->q + 32 * at), p8);
            a->d[at] = d;
            a->s[at] = round_f16(d * (float)_mm_cvtsi128_si32(s4));
            if (a->qs) a->qs[at] = _mm_cvtsi128_si32(s4);
        }
    }
}
#else
/* quantize_blocks in plain C: the same codes, scales and sums (x * (127 / amax) rounded to
 * the nearest integer, ties to even, as vcvtps2dq in the default rounding mode). */
static void quantize_blocks(const float *x0, int64_t t, int64_t b0, int64_t b1, Act8 *a) {
    for (int64_t b = b0; b < b1; b++) {
        const float *x = x0 + 32 * b;
        const int64_t at = act_at(a, t, b);
        float amax = 0.0f;
        for (int i = 0; i < 32; i++) amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
        const float d = round_f16(amax / 127.0f), inv = amax > 0.0f ? 127.0f / amax : 0.0f;
        int32_t sum = 0;
        for (int i = 0; i < 32; i++) {
            const int32_t c = (int32_t)nearbyintf(x[i] * inv);
            a->q[32 * at + i] = (int8_t)c;
            sum += c;
        }
        a->d[at] = d;
        a->s[at] = round_f16(d * (float)sum);
        if (a->qs) a->qs[at] = sum;
    }
}
#endif

/* Rows t0 .. t1 of X (row t at X + t * K) rounded into `a`. */
static void quantize_range(const float *X, int64_t t0, int64_t t1, int64_t K, Act8 *a) {
    for (int64_t t = t0; t < t1; t++) quantize_blocks(X + t * K, t, 0, a->nb, a);
}

static void quantize_rows(const float *X, int64_t T, int64_t K, Act8 *a) {
    quantize_range(X, 0, T, K, a);
}

static void act8_free(Act8 *a) { /* and forgets them: a second call frees nothing */
    free(a->q);
    free(a->d);
    free(a->qs);
    a->q = NULL;
    a->d = a->s = NULL;
    a->qs = NULL;
}

/* Room in `a` for Tp tokens of K values (act8_free frees it), laid out as `tiled` says, with
 * the codes' sums when `sums`. 0, or -2 when memory ran out. */
static int act8_alloc(int64_t Tp, int64_t K, int tiled, int sums, Act8 *a) {
    const int64_t nb = K / 32;
    *a = (Act8){K, nb, (int8_t *)malloc((size_t)(Tp * K)),
                (float *)malloc((size_t)(2 * Tp * nb) * sizeof(float)), NULL,
                sums ? (int32_t *)malloc((size_t)(Tp * nb) * sizeof(int32_t)) : NULL, tiled};
    if (!a->q || !a->d || (sums && !a->qs)) {
        act8_free(a);
        return -2;
    }
    a->s = a->d + Tp * nb;
    return 0;
}

/* X's rows rounded to 8 bits into a new `a` (act8_free frees it): token-major, or in tiles
 * of 8 tokens with the codes' integer sums too (`tiled`: the packed product's). 0, or -2
 * when memory ran out. */
static int act8_quantize(const float *X, int64_t T, int64_t K, int tiled, Act8 *a) {
    if (act8_alloc(tiled ? (T + 7) / 8 * 8 : T, K, tiled, tiled, a)) return -2;
    quantize_rows(X, T, K, a);
    return 0;
}

/* This thread's share [lo, hi) of `units` split evenly over the team's threads. */
static inline void thread_share(int64_t units, int64_t *lo, int64_t *hi) {
    const int nt = omp_get_num_threads(), id = omp_get_thread_num();
    const int64_t per = (units + nt - 1) / nt;
    *lo = per * id < units ? per * id : units;
    *hi = per * (id + 1) < units ? per * (id + 1) : units;
}

#ifdef __AVX2__
/* The 32 codes of an integer block, in element order, with its scale and offset. Q4 / Q5
 * codes are unsigned; Q8_0's are signed (see dot_codes). */
static inline __m256i block_codes(int type, const uint8_t *src, float *dw, float *mw) {
    const __m256i low4 = _mm256_set1_epi8(15);
    switch (type) {
    case Q8_0:
        *dw = h2f(src);
        *mw = 0.0f;
        return _mm256_loadu_si256((const __m256i *)(src + 2));
    case Q4_0: case Q4_1: {
        const int one = type == Q4_1;
        const __m128i q = _mm_loadu_si128((const __m128i *)(src + (one ? 4 : 2)));
        *dw = h2f(src);
        *mw = one ? h2f(src + 2) : -8.0f * *dw;
        return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), low4);
    }
    default: { /* Q5_0, Q5_1: the fifth bits of elements 0..31 are the bits of a u32 */
        const int one = type == Q5_1;
        uint32_t qh;
        memcpy(&qh, src + (one ? 4 : 2), 4);
        const __m128i q = _mm_loadu_si128((const __m128i *)(src + (one ? 8 : 6)));
        *dw = h2f(src);
        *mw = one ? h2f(src + 2) : -16.0f * *dw;
        __m256i lo = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), low4);
        /* byte j takes byte j / 8 of qh, then keeps bit j % 8 of it */
        __m256i spread = _mm256_shuffle_epi8(
            _mm256_set1_epi32((int)qh),
            _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                             2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
        const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
        __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
        return _mm256_or_si256(lo, _mm256_and_si256(set, _mm256_set1_epi8(16)));
    }
    }
}

/* 8 int32 partial sums of codes . qx (signed: Q8_0's codes are signed). */
static inline __m256i dot_codes(__m256i w, __m256i x, int sign) {
    if (sign) { /* both multiply unsigned by signed: move w's sign onto x */
        x = _mm256_sign_epi8(x, w);
        w = _mm256_sign_epi8(w, w);
    }
#ifdef DPBUSD256
    /* one instruction for the four products and their sum: the same integers, since the
     * pairs' sums below never reach the 16-bit saturation (|code| <= 128 * 127 * 2) */
    return DPBUSD256(_mm256_setzero_si256(), w, x);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1));
#endif
}

/* a . b for short vectors (a row's blocks): 8 lanes, then the rest one by one. */
static inline float vdot(const float *a, const float *b, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    float s = hsum(acc);
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

/* The products of one weight block and one token's block: (dw * dx) * (codes . codes). */
#define BLOCK_PRODUCT(dwx, w, x, sign) _mm256_mul_ps(_mm256_set1_ps(dwx), \
                                                     _mm256_cvtepi32_ps(dot_codes(w, x, sign)))
#define BLOCK_FMA(dwx, w, x, sign, acc) _mm256_fmadd_ps(_mm256_set1_ps(dwx), \
                                                        _mm256_cvtepi32_ps(dot_codes(w, x, sign)), acc)

/* A tile of Y: rows n0 .. n0 + RM of W times tokens t0 .. t0 + RN of `a`, the accumulators
 * in registers (RM and RN are constants after inlining: one copy per type and shape). The
 * blocks' offsets mw go to `mw` [RM, nb] on the way and meet the tokens' dx * sum(qx) in one
 * float dot product per pair at the end, not in the inner loop.
 *
 * Blocks go in pairs: the pair's two products are summed first and then added to the
 * accumulator, so the accumulator's chain of dependent additions is one per two blocks (a
 * single token's product, row_dot_int, is bound by that chain). The order of every float
 * operation is the same for any RN, and row_dot_int repeats it for RN = 1: a token's
 * output does not depend on how many tokens share the product. */
static inline __attribute__((always_inline)) void
tile_int(const int type, const int RM, const int RN, const uint8_t *W, int64_t rb,
         const Act8 *a, int64_t n0, int64_t t0, float *Y, int64_t N, float *mw) {
    const int64_t bs = fk_row_bytes(type, 32), nb = a->nb, K = a->K;
    const int sign = type == Q8_0;
    __m256 acc[4][8];
#pragma GCC unroll 4
    for (int r = 0; r < RM; r++)
#pragma GCC unroll 8
        for (int t = 0; t < RN; t++) acc[r][t] = _mm256_setzero_ps();
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2) {
        __m256i w0[4], w1[4];
        float dw0[4], dw1[4];
#pragma GCC unroll 4
        for (int r = 0; r < RM; r++) {
            w0[r] = block_codes(type, W + (n0 + r) * rb + b * bs, &dw0[r], &mw[r * nb + b]);
            w1[r] = block_codes(type, W + (n0 + r) * rb + (b + 1) * bs, &dw1[r],
                                &mw[r * nb + b + 1]);
        }
#pragma GCC unroll 8
        for (int t = 0; t < RN; t++) {
            const int8_t *q = a->q + (t0 + t) * K + 32 * b;
            const __m256i x0 = _mm256_loadu_si256((const __m256i *)q);
            const __m256i x1 = _mm256_loadu_si256((const __m256i *)(q + 32));
            const float dx0 = a->d[(t0 + t) * nb + b], dx1 = a->d[(t0 + t) * nb + b + 1];
#pragma GCC unroll 4
            for (int r = 0; r < RM; r++)
                acc[r][t] = _mm256_add_ps(acc[r][t], BLOCK_FMA(dw1[r] * dx1, w1[r], x1, sign,
                                                    BLOCK_PRODUCT(dw0[r] * dx0, w0[r], x0, sign)));
        }
    }
    if (b < nb) {
        __m256i w[4];
        float dw[4];
#pragma GCC unroll 4
        for (int r = 0; r < RM; r++)
            w[r] = block_codes(type, W + (n0 + r) * rb + b * bs, &dw[r], &mw[r * nb + b]);
#pragma GCC unroll 8
        for (int t = 0; t < RN; t++) {
            const __m256i x = _mm256_loadu_si256((const __m256i *)(a->q + (t0 + t) * K + 32 * b));
            const float dx = a->d[(t0 + t) * nb + b];
#pragma GCC unroll 4
            for (int r = 0; r < RM; r++)
                acc[r][t] = _mm256_add_ps(acc[r][t], BLOCK_PRODUCT(dw[r] * dx, w[r], x, sign));
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < RM; r++)
#pragma GCC unroll 8
        for (int t = 0; t < RN; t++)
            Y[(t0 + t) * N + n0 + r] = hsum(acc[r][t]) +
                (sign ? 0.0f : vdot(mw + r * nb, a->s + (t0 + t) * nb, nb));
}

/* One row times one token (decode): tile_int's arithmetic for RM = RN = 1, in its order.
 * `mw`: room for the row's nb offsets. */
static inline __attribute__((always_inline)) float
row_dot_int(const int type, const uint8_t *row, const Act8 *a, int64_t t, float *mw) {
    const int64_t bs = fk_row_bytes(type, 32), nb = a->nb;
    const int sign = type == Q8_0;
    const int8_t *q = a->q + t * a->K;
    const float *d = a->d + t * nb;
    __m256 acc = _mm256_setzero_ps();
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2) {
        float dw0, dw1;
        const __m256i w0 = block_codes(type, row + b * bs, &dw0, &mw[b]);
        const __m256i w1 = block_codes(type, row + (b + 1) * bs, &dw1, &mw[b + 1]);
        const __m256i x0 = _mm256_loadu_si256((const __m256i *)(q + 32 * b));
        const __m256i x1 = _mm256_loadu_si256((const __m256i *)(q + 32 * b + 32));
        acc = _mm256_add_ps(acc, BLOCK_FMA(dw1 * d[b + 1], w1, x1, sign,
                                           BLOCK_PRODUCT(dw0 * d[b], w0, x0, sign)));
    }
    if (b < nb) {
        float dw;
        const __m256i w = block_codes(type, row + b * bs, &dw, &mw[b]);
        const __m256i x = _mm256_loadu_si256((const __m256i *)(q + 32 * b));
        acc = _mm256_add_ps(acc, BLOCK_PRODUCT(dw * d[b], w, x, sign));
    }
    return hsum(acc) + (sign ? 0.0f : vdot(mw, a->s + t * nb, nb));
}

/* Rows n0 .. n1 of Y for tokens t0 .. t1, in tiles of TILE_ROWS x TILE_TOKENS (edges
 * smaller). */
#ifndef TILE_ROWS /* 1 x 8 measured best here among 4x2, 2x4, 2x6, 1x4, 1x6, 1x8 */
#define TILE_ROWS 1
#define TILE_TOKENS 8
#endif
static inline __attribute__((always_inline)) void
rows_int_as(const int type, const uint8_t *W, int64_t rb, const Act8 *a, int64_t n0,
            int64_t n1, int64_t t0, int64_t t1, float *Y, int64_t N, float *mw) {
    int64_t n = n0;
    if (t1 - t0 == 1) { /* one token: row by row */
        for (; n < n1; n++) Y[t0 * N + n] = row_dot_int(type, W + n * rb, a, t0, mw);
        return;
    }
    for (; n + TILE_ROWS <= n1; n += TILE_ROWS) {
        int64_t t = t0;
        for (; t + TILE_TOKENS <= t1; t += TILE_TOKENS)
            tile_int(type, TILE_ROWS, TILE_TOKENS, W, rb, a, n, t, Y, N, mw);
        for (; t < t1; t++) tile_int(type, TILE_ROWS, 1, W, rb, a, n, t, Y, N, mw);
    }
    for (; n < n1; n++) {
        int64_t t = t0;
        for (; t + TILE_TOKENS <= t1; t += TILE_TOKENS)
            tile_int(type, 1, TILE_TOKENS, W, rb, a, n, t, Y, N, mw);
        for (; t < t1; t++) tile_int(type, 1, 1, W, rb, a, n, t, Y, N, mw);
    }
}

static void rows_int(int type, const uint8_t *W, int64_t rb, const Act8 *a, int64_t n0,
                     int64_t n1, int64_t t0, int64_t t1, float *Y, int64_t N, float *mw) {
    switch (type) {
    case Q4_0: rows_int_as(Q4_0, W, rb, a, n0, n1, t0, t1, Y, N, mw); return;
    case Q4_1: rows_int_as(Q4_1, W, rb, a, n0, n1, t0, t1, Y, N, mw); return;
    case Q5_0: rows_int_as(Q5_0, W, rb, a, n0, n1, t0, t1, Y, N, mw); return;
    case Q5_1: rows_int_as(Q5_1, W, rb, a, n0, n1, t0, t1, Y, N, mw); return;
    default: rows_int_as(Q8_0, W, rb, a, n0, n1, t0, t1, Y, N, mw); return;
    }
}
#else
/* The products on 8-bit activations in plain C (no AVX2: other CPUs): per block the exact
 * integer sum of codes times codes, times dw * dx, the blocks added in order; then the
 * offsets' dot product with the tokens' dx * sum(qx). One row and one token at a time, so a
 * token's output does not depend on how many share the product (not the AVX2 build's bits:
 * its sums go in another order). */
static inline void block_ints(int type, const uint8_t *src, int32_t c[32], float *dw,
                              float *mw) {
    *dw = h2f(src);
    if (type == Q8_0) {
        *mw = 0.0f;
        for (int j = 0; j < 32; j++) c[j] = ((const int8_t *)(src + 2))[j];
        return;
    }
    const int one = type == Q4_1 || type == Q5_1, fifth = type == Q5_0 || type == Q5_1;
    const uint8_t *q = src + (one ? 4 : 2) + (fifth ? 4 : 0);
    uint32_t qh = 0;
    if (fifth) memcpy(&qh, src + (one ? 4 : 2), 4);
    for (int j = 0; j < 16; j++) {
        c[j] = (q[j] & 15) | (int32_t)(((qh >> j) & 1) << 4);
        c[j + 16] = (q[j] >> 4) | (int32_t)(((qh >> (j + 16)) & 1) << 4);
    }
    *mw = one ? h2f(src + 2) : (fifth ? -16.0f : -8.0f) * *dw;
}

static float row_dot_int(int type, const uint8_t *row, const Act8 *a, int64_t t) {
    const int64_t bs = fk_row_bytes(type, 32), nb = a->nb;
    float acc = 0.0f, off = 0.0f;
    int32_t c[32];
    for (int64_t b = 0; b < nb; b++) {
        float dw, mw;
        block_ints(type, row + b * bs, c, &dw, &mw);
        const int64_t at = act_at(a, t, b);
        const int8_t *q = a->q + 32 * at;
        int32_t sum = 0;
        for (int j = 0; j < 32; j++) sum += c[j] * q[j];
        acc += dw * a->d[at] * (float)sum;
        off += mw * a->s[at];
    }
    return acc + off;
}

static void rows_int(int type, const uint8_t *W, int64_t rb, const Act8 *a, int64_t n0,
                     int64_t n1, int64_t t0, int64_t t1, float *Y, int64_t N, float *mw) {
    (void)mw;
    for (int64_t t = t0; t < t1; t++)
        for (int64_t n = n0; n < n1; n++) Y[t * N + n] = row_dot_int(type, W + n * rb, a, t);
}
#endif


/* -- rows interleaved (packed) -------------------------------------------------------------
 * Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 weights are repacked once, in groups of XR rows (XR = the
 * int32 lanes of the widest vector with VNNI's vpdpbusd, four u8 x s8 products summed into
 * each lane: 16 with AVX512-VNNI, 8 with AVX-VNNI; 8 with AVX2 alone, whose vpmaddubsw and
 * vpmaddwd make the same exact sums in more steps): per block of 32 columns, the XR rows'
 * f16 scales (then Q4_1's / Q5_1's XR f16 offsets), then their codes arranged so that lane r
 * of a vector holds 4 consecutive codes of row r. A token's 4 codes broadcast to the XR
 * lanes, so one instruction adds 4 products to each of XR rows, and a block's scales apply to
 * XR rows at once.
 *   Q4, Q5: 4 vectors; byte 4r + i of vector k = byte 4k + i of row r's nibbles (low nibble:
 *       code 4k + i, high: code 16 + 4k + i); Q5 then 1 vector of fifth bits: bit j of its
 *       byte 4r + i is the fifth bit of code 4j + i of row r (the code whose nibble is in
 *       the j-th vector of nibbles taken apart: low nibbles of vectors 0-3, then high ones)
 *   Q8_0: 8 vectors; byte 4r + i of vector k = code 4k + i of row r + 128 (unsigned; AVX2
 *       without VNNI: the code as it is, signed, see packed_sums)
 * A group-block is XR blocks' bytes (Q4_0 18 XR, Q4_1 20 XR, Q5_0 22 XR, Q5_1 24 XR, Q8_0
 * 34 XR). Rows past N (the last group) are zero. Per row and token the sum is exact in
 * integers, (codes - offset) . qx, then one float multiply-add per block: the same
 * operations for any number of tokens. */
#if defined(__AVX2__) && defined(__F16C__) && defined(__AVX512VNNI__) && defined(__AVX512F__) && \
    !(defined(FK_PACK_ROWS) && FK_PACK_ROWS == 8) /* -DFK_PACK_ROWS=8: the 8-row build (tests) */
#define HAVE_PACKED 1
#define XR 16
typedef __m512i xvi;
typedef __m512 xvf;
#define X_LOADI(p) _mm512_loadu_si512((const void *)(p))
#define X_AND _mm512_and_si512
#define X_SRLI16 _mm512_srli_epi16
#define X_SLLI16 _mm512_slli_epi16
#define X_OR _mm512_or_si512
#define X_SET1_8 _mm512_set1_epi8
#define X_SET1_32 _mm512_set1_epi32
#define X_ZEROI _mm512_setzero_si512
#define X_ADDI _mm512_add_epi32
#define X_SUBI _mm512_sub_epi32
#define X_DPBUSD _mm512_dpbusd_epi32
#define X_CVT _mm512_cvtepi32_ps
#define X_FMA _mm512_fmadd_ps
#define X_MUL _mm512_mul_ps
#define X_SET1F _mm512_set1_ps
#define X_ZEROF _mm512_setzero_ps
#define X_STOREF _mm512_storeu_ps
#define X_SCALES(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
#elif defined(__AVX2__) && defined(__F16C__)
#define HAVE_PACKED 1
#define XR 8
typedef __m256i xvi;
typedef __m256 xvf;
#define X_LOADI(p) _mm256_loadu_si256((const __m256i *)(p))
#define X_AND _mm256_and_si256
#define X_SRLI16 _mm256_srli_epi16
#define X_SLLI16 _mm256_slli_epi16
#define X_OR _mm256_or_si256
#define X_SET1_8 _mm256_set1_epi8
#define X_SET1_32 _mm256_set1_epi32
#define X_ZEROI _mm256_setzero_si256
#define X_ADDI _mm256_add_epi32
#define X_SUBI _mm256_sub_epi32
#ifdef DPBUSD256
#define X_DPBUSD DPBUSD256
#endif
#define X_CVT _mm256_cvtepi32_ps
#define X_FMA _mm256_fmadd_ps
#define X_MUL _mm256_mul_ps
#define X_SET1F _mm256_set1_ps
#define X_ZEROF _mm256_setzero_ps
#define X_STOREF _mm256_storeu_ps
#define X_SCALES(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#else
#define HAVE_PACKED 0
#define XR 8
#endif

/* What packing adds to Q8_0's codes: 128 where vpdpbusd takes them unsigned; none on AVX2
 * alone (vpmaddubsw's pairs of 255 * 127 would saturate 16 bits). */
#ifdef X_DPBUSD
#define Q8_BIAS 128
#else
#define Q8_BIAS 0
#endif

/* Bytes of one group-block (XR blocks of 32 columns); -1: no packed layout for the type. */
static int64_t group_block_bytes(int type) {
    return is_integer(type) ? XR * fk_row_bytes(type, 32) : -1;
}

/* Q4_1 and Q5_1 have an offset per block after the scale; Q5_0 and Q5_1 fifth bits. */
static inline int has_min(int type) { return type == Q4_1 || type == Q5_1; }
static inline int has_fifth(int type) { return type == Q5_0 || type == Q5_1; }

/* The rows in a group of this build's packed layout (0: this build has none). */
int fk_packed_rows(void) { return HAVE_PACKED ? XR : 0; }

/* 1 when this build's packed products take VNNI's vpdpbusd (else AVX2's two steps). */
int fk_packed_vnni(void) {
#ifdef X_DPBUSD
    return 1;
#else
    return 0;
#endif
}

/* Bytes of W [N, K] packed; -1: this build or this type has no packed layout. */
int64_t fk_packed_bytes(int type, int64_t N, int64_t K) {
    const int64_t gbb = group_block_bytes(type);
    if (!HAVE_PACKED || gbb < 0 || K % 32) return -1;
    return (N + XR - 1) / XR * (K / 32) * gbb;
}

/* Block b of row n between the file's layout (`block`: its bytes) and P's: into P when
 * `pack`, else out of it (then `block` is written and P only read). */
static inline __attribute__((always_inline)) void move_block(int type, uint8_t *P, int64_t nb,
                                                             int64_t n, int64_t b,
                                                             uint8_t *block, int pack) {
    const int64_t r = n % XR, codes = (has_min(type) ? 4 : 2) * XR;
    uint8_t *g = P + ((n / XR) * nb + b) * group_block_bytes(type);
#define MOVE(in_p, in_block, len) memcpy(pack ? (in_p) : (in_block), pack ? (in_block) : (in_p), len)
    MOVE(g + 2 * r, block, 2);
    if (type == Q8_0) { /* stored + Q8_BIAS */
        for (int k = 0; k < 8; k++)
            for (int i = 0; i < 4; i++) {
                uint8_t *in_p = g + codes + 4 * XR * k + 4 * r + i, *in_block = block + 2 + 4 * k + i;
                *(pack ? in_p : in_block) = *(pack ? in_block : in_p) ^ (uint8_t)Q8_BIAS;
            }
        return;
    }
    if (has_min(type)) MOVE(g + 2 * XR + 2 * r, block + 2, 2);
    uint8_t *nib = block + (has_min(type) ? 4 : 2) + (has_fifth(type) ? 4 : 0);
    for (int k = 0; k < 4; k++) MOVE(g + codes + 4 * XR * k + 4 * r, nib + 4 * k, 4);
#undef MOVE
    if (has_fifth(type)) { /* the block's u32 of fifth bits <-> bit j of byte i: code 4j + i */
        uint8_t *h = g + codes + 16 * XR + 4 * r, *qh = block + (has_min(type) ? 4 : 2);
        uint32_t bits = 0;
        if (pack) memcpy(&bits, qh, 4);
        for (int i = 0; i < 4; i++) {
            uint8_t v = 0;
            for (int j = 0; j < 8; j++) {
                if (pack) v |= (uint8_t)(((bits >> (4 * j + i)) & 1u) << j);
                else bits |= (uint32_t)((h[i] >> j) & 1u) << (4 * j + i);
            }
            if (pack) h[i] = v;
        }
        if (!pack) memcpy(qh, &bits, 4);
    }
}

/* The first n (<= XR) rows of a group, row-major at `rows` (only read), into the group's
 * packed bytes G. */
static inline __attribute__((always_inline)) void pack_rows_as(const int type,
                                                                const uint8_t *rows, int64_t n,
                                                                int64_t K, uint8_t *G) {
    const int64_t nb = K / 32, rb = fk_row_bytes(type, K), bs = fk_row_bytes(type, 32);
    for (int64_t r = 0; r < n; r++)
        for (int64_t b = 0; b < nb; b++) move_block(type, G, nb, r, b, (uint8_t *)(rows + r * rb + b * bs), 1);
}

/* (pack_rows_as for each format: its block's moves compiled for it, constant sizes) */
static void pack_rows(int type, const uint8_t *rows, int64_t n, int64_t K, uint8_t *G) {
    switch (type) {
    case Q4_0: pack_rows_as(Q4_0, rows, n, K, G); break;
    case Q4_1: pack_rows_as(Q4_1, rows, n, K, G); break;
    case Q5_0: pack_rows_as(Q5_0, rows, n, K, G); break;
    case Q5_1: pack_rows_as(Q5_1, rows, n, K, G); break;
    case Q8_0: pack_rows_as(Q8_0, rows, n, K, G); break;
    default: break;
    }
}

/* P = W [N, K] packed (fk_packed_bytes of room), on `threads` threads. P may be W itself
 * where N is a multiple of XR (a group's packed bytes are its rows' bytes, reordered: each
 * thread copies a group's rows aside first). */
static int pack_on(int type, const uint8_t *W, int64_t N, int64_t K, uint8_t *P, int threads) {
    const int64_t total = fk_packed_bytes(type, N, K);
    if (total < 0 || (P == W && N % XR)) return -1;
    const int64_t rb = fk_row_bytes(type, K);
    const int64_t groups = (N + XR - 1) / XR, gb = K / 32 * group_block_bytes(type);
    int failed = 0;
    /* a group's rows at a time, across the cores (each group its own bytes of P); a whole
     * group's rows write every byte of it, a last partial group's missing rows are zeros */
#pragma omp parallel num_threads(threads) if (total > (1 << 20))
    {
        uint8_t *aside = P == W ? malloc((size_t)gb) : NULL;
        if (P == W && !aside) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 16)
        for (int64_t g = 0; g < groups; g++) {
            const uint8_t *rows = W + g * XR * rb;
            if (P == W) {
                if (!aside) continue;
                memcpy(aside, rows, (size_t)gb);
                rows = aside;
            } else if ((g + 1) * XR > N) {
                memset(P + g * gb, 0, (size_t)gb);
            }
            pack_rows(type, rows, N - g * XR < XR ? N - g * XR : XR, K, P + g * gb);
        }
        free(aside);
    }
    return failed ? -1 : 0;
}

/* One group's XR rows of W (row-major, `rows`) into the group's packed bytes G: the k-quant
 * conversion (cpu_convert.c) packs each group it has converted, still in cache. -1 where
 * this build or `type` has no packed layout. */
int fk_pack_group(int type, const uint8_t *rows, int64_t K, uint8_t *G) {
    if (fk_packed_bytes(type, XR, K) < 0) return -1;
    pack_rows(type, rows, XR, K, G);
    return 0;
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14; older kernels refuse it and fault pages in */
#endif

/* n matrices packed in one call on `threads` threads (a model's at load, the GIL let go the
 * whole while: the loader builds the tokenizer meanwhile, on a core left to it): job i is
 * matrix srcs[i] [rows[i], cols[i]] of types[i] packed into dsts[i] (fk_packed_bytes of
 * room), in place where dsts[i] is srcs[i]
 * (rows[i] a multiple of fk_packed_rows()). Each other destination's pages are mapped
 * first, the threads each taking a share (dsts[i] page-aligned, fresh mappings: 4 KB pages
 * made at a fault's cost, 2x a populating call's). 0, or the failing job's index + 1. */
int fk_pack_many(int n, const int *types, const uint8_t *const *srcs, const int64_t *rows,
                 const int64_t *cols, uint8_t *const *dsts, int threads) {
    if (threads < 1) threads = 1;
    const int64_t page = 4096;
    for (int i = 0; i < n; i++) {
        const int64_t total = fk_packed_bytes(types[i], rows[i], cols[i]);
        if (total < 0) return i + 1;
        const int64_t pages = srcs[i] == dsts[i] ? 0 : (total + page - 1) / page;
#pragma omp parallel num_threads(threads) if (pages > 256)
        {
            const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
            const int64_t a = pages * t / nt, b = pages * (t + 1) / nt;
            if (b > a && ((uintptr_t)dsts[i] & (uintptr_t)(page - 1)) == 0)
                (void)madvise(dsts[i] + a * page, (size_t)((b - a) * page), MADV_POPULATE_WRITE);
        }
        if (pack_on(types[i], srcs[i], rows[i], cols[i], dsts[i], threads)) return i + 1;
    }
    return 0;
}

/* W [N, K] back from P (the packing's inverse, byte for byte). */
int fk_unpack(int type, const uint8_t *P, int64_t N, int64_t K, uint8_t *W) {
    if (fk_packed_bytes(type, N, K) < 0) return -1;
    const int64_t nb = K / 32, rb = fk_row_bytes(type, K), bs = fk_row_bytes(type, 32);
    for (int64_t n = 0; n < N; n++)
        for (int64_t b = 0; b < nb; b++) move_block(type, (uint8_t *)P, nb, n, b, W + n * rb + b * bs, 0);
    return 0;
}

/* OUT[r, K] = rows ids[r] of P's N-row matrix, as float32 (a tied head's embedding lookups);
 * -2: an id outside 0 .. N - 1 (nothing written). */
int fk_packed_lookup(int type, const uint8_t *P, int64_t N, int64_t K, const int64_t *ids,
                     int64_t n, float *out) {
    if (fk_packed_bytes(type, XR, K) < 0 || !table_ready) return -1;
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= N) return -2; /* nothing written */
    const int64_t nb = K / 32;
    uint8_t block[128]; /* a block of any type (deq_row's F32 case reads 128) */
    for (int64_t i = 0; i < n; i++)
        for (int64_t b = 0; b < nb; b++) {
            move_block(type, (uint8_t *)P, nb, ids[i], b, block, 0);
            deq_row(type, block, out + i * K + 32 * b, 32);
        }
    return 0;
}

#if HAVE_PACKED
static inline xvi bcast4(const int8_t *q) {
    int32_t v;
    memcpy(&v, q, 4);
    return X_SET1_32(v);
}

/* A token's 8 int32 sums per lane (row) of a group-block's codes c[8] times its codes q:
 * lane r gets sum_k c[k]'s 4 bytes of row r . q[4k .. 4k + 4], exact. `ca`: Q8_0's codes'
 * magnitudes (AVX2 without VNNI only). */
static inline __attribute__((always_inline)) xvi
packed_sums(const int type, const xvi c[8], const xvi ca[8], const int8_t *q) {
#ifdef X_DPBUSD
    (void)type; (void)ca;
    xvi s0 = X_DPBUSD(X_ZEROI(), c[0], bcast4(q));
    xvi s1 = X_DPBUSD(X_ZEROI(), c[1], bcast4(q + 4));
    s0 = X_DPBUSD(s0, c[2], bcast4(q + 8));
    s1 = X_DPBUSD(s1, c[3], bcast4(q + 12));
    s0 = X_DPBUSD(s0, c[4], bcast4(q + 16));
    s1 = X_DPBUSD(s1, c[5], bcast4(q + 20));
    s0 = X_DPBUSD(s0, c[6], bcast4(q + 24));
    s1 = X_DPBUSD(s1, c[7], bcast4(q + 28));
    return X_ADDI(s0, s1);
#else
    /* vpmaddubsw: u8 x s8 products summed in pairs into 16 bits (saturating, so each step
     * below stays under 2^15); vpmaddwd with ones: pairs of those into 32 bits */
    const __m256i ones = _mm256_set1_epi16(1);
    if (type == Q8_0) { /* signed codes: |c| times x with c's sign, a pair <= 2 * 128 * 127 */
        __m256i s = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++)
            s = _mm256_add_epi32(s, _mm256_madd_epi16(_mm256_maddubs_epi16(
                    ca[k], _mm256_sign_epi8(bcast4(q + 4 * k), c[k])), ones));
        return s;
    }
    /* Q4 codes < 16: a pair <= 2 * 15 * 127 = 3810, eight pairs 30480; Q5 codes < 32: a
     * pair <= 7874, four pairs 31496 */
    __m256i p[2];
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        p[h] = _mm256_add_epi16(_mm256_maddubs_epi16(c[4 * h], bcast4(q + 16 * h)),
                                _mm256_maddubs_epi16(c[4 * h + 1], bcast4(q + 16 * h + 4)));
        p[h] = _mm256_add_epi16(p[h], _mm256_maddubs_epi16(c[4 * h + 2], bcast4(q + 16 * h + 8)));
        p[h] = _mm256_add_epi16(p[h], _mm256_maddubs_epi16(c[4 * h + 3], bcast4(q + 16 * h + 12)));
    }
    if (!has_fifth(type)) return _mm256_madd_epi16(_mm256_add_epi16(p[0], p[1]), ones);
    return _mm256_add_epi32(_mm256_madd_epi16(p[0], ones), _mm256_madd_epi16(p[1], ones));
#endif
}

/* Rows n0 .. n0 + XR of Y for tokens t0 .. t0 + RN (RN a constant after inlining). */
static inline __attribute__((always_inline)) void
tile_packed(const int type, const int RN, const uint8_t *G, const Act8 *a, int64_t t0,
            float *Y, int64_t ldy, int64_t N, int64_t n0) {
    const int64_t nb = a->nb, gbb = group_block_bytes(type);
    const int64_t codes = (has_min(type) ? 4 : 2) * XR;
    const int32_t offset = type == Q4_0 ? 8 : type == Q5_0 ? 16 : type == Q8_0 ? Q8_BIAS : 0;
    xvf acc[8];
#pragma GCC unroll 8
    for (int t = 0; t < RN; t++) acc[t] = X_ZEROF();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = G + b * gbb;
        const xvf dw = X_SCALES(p);
        const xvf mw = has_min(type) ? X_SCALES(p + 2 * XR) : X_ZEROF();
        xvi c[8], ca[8];
        if (type == Q8_0) {
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++) {
                c[k] = X_LOADI(p + codes + 4 * XR * k);
#ifndef X_DPBUSD
                ca[k] = _mm256_abs_epi8(c[k]);
#endif
            }
        } else {
            const xvi low4 = X_SET1_8(15);
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                const xvi v = X_LOADI(p + codes + 4 * XR * k);
                c[k] = X_AND(v, low4);
                c[k + 4] = X_AND(X_SRLI16(v, 4), low4);
            }
            if (has_fifth(type)) { /* bit j of each byte of h -> bit 4 of c[j]'s byte */
                const xvi h = X_LOADI(p + codes + 16 * XR), bit4 = X_SET1_8(16);
                c[0] = X_OR(c[0], X_AND(X_SLLI16(h, 4), bit4));
                c[1] = X_OR(c[1], X_AND(X_SLLI16(h, 3), bit4));
                c[2] = X_OR(c[2], X_AND(X_SLLI16(h, 2), bit4));
                c[3] = X_OR(c[3], X_AND(X_SLLI16(h, 1), bit4));
                c[4] = X_OR(c[4], X_AND(h, bit4));
                c[5] = X_OR(c[5], X_AND(X_SRLI16(h, 1), bit4));
                c[6] = X_OR(c[6], X_AND(X_SRLI16(h, 2), bit4));
                c[7] = X_OR(c[7], X_AND(X_SRLI16(h, 3), bit4));
            }
        }
        const int64_t at0 = act_at(a, t0, b); /* t0's block b; its tile's next tokens follow */
#pragma GCC unroll 8
        for (int t = 0; t < RN; t++) {
            const int64_t at = at0 + t;
            const int8_t *q = a->q + 32 * at;
            xvi s = packed_sums(type, c, ca, q);
            if (offset) s = X_SUBI(s, X_SET1_32(offset * a->qs[at]));
            acc[t] = X_FMA(X_CVT(s), X_MUL(dw, X_SET1F(a->d[at])), acc[t]);
            if (has_min(type)) acc[t] = X_FMA(mw, X_SET1F(a->s[at]), acc[t]);
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < RN; t++) {
        float *y = Y + (t0 + t) * ldy + n0;
        if (n0 + XR <= N) {
            X_STOREF(y, acc[t]);
        } else {
            float v[XR];
            X_STOREF(v, acc[t]);
            for (int64_t r = 0; r < N - n0; r++) y[r] = v[r];
        }
    }
}

#define TILE_OF_8 8 /* a tile: the 8 tokens of an activation tile (2, 4, 6 measured no faster) */
static inline __attribute__((always_inline)) void
groups_as(const int type, const uint8_t *P, const Act8 *a, int64_t g0, int64_t g1, int64_t t0,
          int64_t t1, float *Y, int64_t ldy, int64_t N) {
    const int64_t gb = a->nb * group_block_bytes(type);
    for (int64_t g = g0; g < g1; g++) {
        int64_t t = t0;
        for (; t + TILE_OF_8 <= t1; t += TILE_OF_8)
            tile_packed(type, TILE_OF_8, P + g * gb, a, t, Y, ldy, N, XR * g);
        /* the last few tokens (a small batch, a step's verified drafts) in tiles of 4, 2, 1:
         * a group-block's codes taken apart once for them all, not once a token */
        if (t + 4 <= t1) {
            tile_packed(type, 4, P + g * gb, a, t, Y, ldy, N, XR * g);
            t += 4;
        }
        if (t + 2 <= t1) {
            tile_packed(type, 2, P + g * gb, a, t, Y, ldy, N, XR * g);
            t += 2;
        }
        if (t < t1) tile_packed(type, 1, P + g * gb, a, t, Y, ldy, N, XR * g);
    }
}

/* groups_as for a type known at run time (each case a copy specialised for its type). */
static void groups_any(int type, const uint8_t *P, const Act8 *a, int64_t g0, int64_t g1,
                       int64_t t0, int64_t t1, float *Y, int64_t ldy, int64_t N) {
    switch (type) {
    case Q4_0: groups_as(Q4_0, P, a, g0, g1, t0, t1, Y, ldy, N); return;
    case Q4_1: groups_as(Q4_1, P, a, g0, g1, t0, t1, Y, ldy, N); return;
    case Q5_0: groups_as(Q5_0, P, a, g0, g1, t0, t1, Y, ldy, N); return;
    case Q5_1: groups_as(Q5_1, P, a, g0, g1, t0, t1, Y, ldy, N); return;
    default: groups_as(Q8_0, P, a, g0, g1, t0, t1, Y, ldy, N); return;
    }
}

/* Tokens a pass over a thread's packed rows takes: their codes stay in its L2 cache. */
static inline int64_t packed_chunk(int64_t K) {
    return (TOKEN_CHUNK_BYTES / K > 8 ? TOKEN_CHUNK_BYTES / K : 8) & ~(int64_t)7;
}
#endif

/* Y[T, N] = X[T, K] @ W[N, K].T with W packed by fk_pack_many. */
int fk_matmul_packed(int type, const uint8_t *P, int64_t N, int64_t K, const float *X,
                     int64_t T, float *Y, int threads) {
#if HAVE_PACKED
    if (fk_packed_bytes(type, N, K) < 0 || !table_ready) return -1;
    /* the activations in tiles of 8 tokens: a tile's 8 tokens of one block side by side */
    Act8 a;
    if (act8_quantize(X, T, K, 1, &a)) return -2;
#pragma omp parallel num_threads(threads)
    {
        int64_t g0, g1; /* this thread's groups of rows */
        thread_share((N + XR - 1) / XR, &g0, &g1);
        const int64_t chunk = packed_chunk(K);
        for (int64_t t0 = 0; t0 < T; t0 += chunk)
            groups_any(type, P, &a, g0, g1, t0, t0 + chunk < T ? t0 + chunk : T, Y, N, N);
    }
    act8_free(&a);
    return 0;
#else
    (void)type; (void)P; (void)N; (void)K; (void)X; (void)T; (void)Y; (void)threads;
    return -1;
#endif
}

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
    if (is_integer(type)) {
        Act8 a;
        if (act8_quantize(X, T, K, 0, &a)) return -2;
        int failed = 0;
#pragma omp parallel num_threads(threads)
        {
            /* each thread takes a range of rows (a multiple of 4), and goes over the tokens
             * in chunks whose codes stay in its L2 cache */
            int64_t q0, q1; /* this thread's quads of rows */
            thread_share((N + 3) / 4, &q0, &q1);
            const int64_t n0 = 4 * q0 < N ? 4 * q0 : N, n1 = 4 * q1 < N ? 4 * q1 : N;
            const int64_t chunk = (TOKEN_CHUNK_BYTES / K) & ~(int64_t)1;
            float *mw = (float *)malloc((size_t)(4 * a.nb) * sizeof(float));
            if (!mw) {
#pragma omp atomic write
                failed = 1;
            } else {
                for (int64_t t0 = 0; t0 < T; t0 += chunk > 2 ? chunk : 2) {
                    const int64_t t1 = t0 + (chunk > 2 ? chunk : 2) < T ? t0 + (chunk > 2 ? chunk : 2) : T;
                    rows_int(type, W, rb, &a, n0, n1, t0, t1, Y, N, mw);
                }
            }
            free(mw);
        }
        act8_free(&a);
        return failed ? -2 : 0;
    }
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

/* OUT[r, K] = rows ids[r] of W [N, K], as float32 (embedding lookups, and prefill's weights).
 * -2: an id outside 0 .. N - 1 (nothing written), as fk_packed_lookup. */
int fk_rows(int type, const uint8_t *W, int64_t N, int64_t K, const int64_t *ids, int64_t n,
            float *out, int threads) {
    const int64_t rb = fk_row_bytes(type, K);
    if (rb < 0 || (blocked(type) && K % 32) || !table_ready) return -1;
    for (int64_t r = 0; r < n; r++)
        if (ids[r] < 0 || ids[r] >= N) return -2;
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

/* -- the rest of a decode step ------------------------------------------------------------ */

/* OUT[r] = X[r] / sqrt(mean(X[r]^2) + eps) * w for rows of n values (OUT may be X). */
void fk_rms_norm(const float *X, const float *w, int64_t rows, int64_t n, float eps,
                 float *OUT) {
    for (int64_t r = 0; r < rows; r++) {
        const float *x = X + r * n;
        float *o = OUT + r * n;
        int64_t i = 0;
        float ss = 0.0f;
#ifdef __AVX2__
        __m256 acc = _mm256_setzero_ps();
        for (; i + 8 <= n; i += 8) {
            const __m256 v = _mm256_loadu_ps(x + i);
            acc = _mm256_fmadd_ps(v, v, acc);
        }
        ss = hsum(acc);
#endif
        for (; i < n; i++) ss += x[i] * x[i];
        const float inv = 1.0f / sqrtf(ss / (float)n + eps);
        for (i = 0; i < n; i++) o[i] = x[i] * inv * w[i];
    }
}

/* The KV cache's formats (`half` below): 0 float32, 1 f16, 2 Q8_0 (for each 32 values of a
 * row, an f16 scale d and 32 signed codes c: the value d * c; llama.cpp's `--cache-type-k
 * q8_0`'s blocks), a row's bytes in each. */
#define KV_F32 0
#define KV_F16 1
#define KV_Q8 2
static inline int64_t kv_row_bytes(int64_t hd, int kind) {
    return kind == KV_Q8 ? hd / 32 * 34 : hd * (kind == KV_F16 ? 2 : 4);
}

/* Value d of a cached row. */
static inline float kv_value(const uint8_t *row, int64_t d, int kind) {
    if (kind == KV_Q8) {
        const uint8_t *b = row + d / 32 * 34;
        return h2f(b) * (float)(int8_t)b[2 + d % 32];
    }
    return kind == KV_F16 ? h2f(row + 2 * d) : ((const float *)row)[d];
}

/* n values (a multiple of 32) as Q8_0 blocks: the scale the largest magnitude / 127 (as
 * f16), each code the value times 127 / that magnitude rounded to the nearest integer
 * (-127 .. 127). */
static void store_q8(uint8_t *dst, const float *src, int64_t n) {
    for (int64_t b = 0; b < n / 32; b++, src += 32, dst += 34) {
        float amax = 0.0f;
        for (int i = 0; i < 32; i++) amax = fabsf(src[i]) > amax ? fabsf(src[i]) : amax;
        const uint16_t d = f2h(amax / 127.0f);
        memcpy(dst, &d, 2);
        const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
        for (int i = 0; i < 32; i++) /* lrintf: to nearest, ties to even (a NaN: some code) */
            dst[2 + i] = (uint8_t)(int8_t)lrintf(src[i] * inv);
    }
}

static inline void store_kv(void *dst, const float *src, int64_t n, int half) {
    if (half == KV_Q8) {
        store_q8((uint8_t *)dst, src, n);
        return;
    }
    if (!half) {
        memcpy(dst, src, (size_t)n * sizeof(float));
        return;
    }
    uint16_t *d = (uint16_t *)dst;
    int64_t i = 0;
#if defined(__AVX2__) && defined(__F16C__)
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(d + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
#endif
    for (; i < n; i++) d[i] = f2h(src[i]);
}

/* The new tokens' keys and values into the paged cache: row b of QKV (q heads, then nkv key
 * heads, then nkv value heads; rows `stride` floats apart) goes to position positions[b] of
 * the sequence whose block table is the row of TABLES starting at b * tstride (tstride 0: one
 * table for every row). K, V: [blocks, nkv, bs, kv_row_bytes(hd, half)] bytes: float32, f16
 * or Q8_0 rows (`half`: KV_F32, KV_F16, KV_Q8; Q8_0: hd a multiple of 32). */
void fk_kv_write(const float *QKV, int64_t stride, int64_t B, int64_t nq, int64_t nkv,
                 int64_t hd, void *K, void *V, int64_t bs, const int64_t *tables,
                 int64_t tstride, const int64_t *positions, int half) {
    const int64_t row_bytes = kv_row_bytes(hd, half);
    for (int64_t b = 0; b < B; b++) {
        const float *k = QKV + b * stride + nq * hd, *v = k + nkv * hd;
        const int64_t block = tables[b * tstride + positions[b] / bs];
        for (int64_t h = 0; h < nkv; h++) {
            const int64_t at = ((block * nkv + h) * bs + positions[b] % bs) * row_bytes;
            store_kv((uint8_t *)K + at, k + h * hd, hd, half);
            store_kv((uint8_t *)V + at, v + h * hd, hd, half);
        }
    }
}

/* Byte offset of cached position j in a layer's cache (the block table's block j / bs, row
 * j % bs, then `head`'s offset in the block); `shift`: log2(bs) when bs is a power of two
 * (no division: a 64-bit divide per key cost more than the key's products), else -1. */
static inline int64_t kv_at(const int64_t *table, int64_t j, int64_t bs, int shift,
                            int64_t block_bytes, int64_t head, int64_t row_bytes) {
    const int64_t b = shift >= 0 ? j >> shift : j / bs, r = shift >= 0 ? j & (bs - 1) : j % bs;
    return table[b] * block_bytes + head + r * row_bytes;
}

/* kv_at's `shift` for a block size. */
static inline int kv_shift(int64_t bs) {
    return (bs & (bs - 1)) == 0 ? __builtin_ctzll((unsigned long long)bs) : -1;
}

/* Heads h0 .. h1 of OUT's row t (nq heads of hd) rounded into `qa` (the next product's
 * activations, hd a multiple of 32: a head is whole blocks), where a task has just written
 * them: no phase of its own. */
static void quantize_heads(const float *OUT, int64_t nq, int64_t hd, int64_t t, int64_t h0,
                           int64_t h1, Act8 *qa) {
    if (qa) quantize_blocks(OUT + t * nq * hd, t, h0 * hd / 32, h1 * hd / 32, qa);
}

/* In place on T rows of QKV (`stride` floats apart; nq query heads, then nkv key heads of
 * dim values): each query and key head RMS-normed by qn / kn when they are given (Qwen3's
 * per-head norms), then rotated by cos, sin [T, dim] (RoPE: x * cos + rotate_half(x) * sin,
 * rotate_half(x) = [-x[dim/2:], x[:dim/2]]). */
void fk_qk_rope(float *QKV, int64_t stride, int64_t T, int64_t nq, int64_t nkv, int64_t dim,
                const float *qn, const float *kn, float eps, const float *cos,
                const float *sin) {
    const int64_t half = dim / 2;
    for (int64_t t = 0; t < T; t++) {
        const float *c = cos + t * dim, *s = sin + t * dim;
        for (int64_t h = 0; h < nq + nkv; h++) {
            float *x = QKV + t * stride + h * dim;
            const float *w = h < nq ? qn : kn;
            if (w) fk_rms_norm(x, w, 1, dim, eps, x);
            for (int64_t i = 0; i < half; i++) {
                const float a = x[i], b = x[i + half];
                x[i] = a * c[i] - b * s[i];
                x[i + half] = b * c[i + half] + a * s[i + half];
            }
        }
    }
}

/* OUT[t] = act(gate) * up for GU[t] = [gate | up], act 0: SiLU, x / (1 + exp(-x)); act 1:
 * Gemma's tanh GELU, 0.5 x (1 + tanh(u)) with u = sqrt(2 / pi) (x + 0.044715 x^3), computed
 * as x / (1 + exp(-2u)) (the same function: 0.5 (1 + tanh u) = 1 / (1 + exp(-2u))). 8 lanes
 * at a time, the rest (a row's last I % 8) with expf; an element's arithmetic depends only
 * on its place in the row. */
void fk_gated(const float *GU, int64_t T, int64_t I, float *OUT, int act) {
    const float c2 = 1.5957691216057308f, k = 0.044715f; /* 2 sqrt(2 / pi) */
    for (int64_t t = 0; t < T; t++) {
        const float *g = GU + t * 2 * I, *u = g + I;
        float *o = OUT + t * I;
        int64_t i = 0;
#ifdef __AVX2__
        const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f),
                     nc2 = _mm256_set1_ps(-c2), vk = _mm256_set1_ps(k);
        for (; i + 8 <= I; i += 8) {
            const __m256 x = _mm256_loadu_ps(g + i);
            __m256 arg; /* the exponent: -x, or -2u */
            if (act) {
                const __m256 x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
                arg = _mm256_mul_ps(_mm256_add_ps(x, _mm256_mul_ps(vk, x3)), nc2);
            } else {
                arg = _mm256_xor_ps(x, sign);
            }
            const __m256 den = _mm256_add_ps(one, exp8(arg));
            _mm256_storeu_ps(o + i, _mm256_mul_ps(_mm256_div_ps(x, den),
                                                  _mm256_loadu_ps(u + i)));
        }
#endif
        for (; i < I; i++) {
            const float x = g[i];
            o[i] = x / (1.0f + expf(act ? (x + k * (x * x * x)) * -c2 : -x)) * u[i];
        }
    }
}

/* BERT's GELU in place, x Phi(x) = 0.5 x (1 + erf(x / sqrt 2)) over X [T, I], erf by
 * Abramowitz and Stegun 7.1.26 (|error| below 1.5e-7) as npu.engine.ops.erf computes it: 8
 * lanes at a time, a row's last I % 8 with expf; an element's arithmetic depends only on its
 * place in its row (an input's vectors do not depend on the batch). */
void fk_gelu(float *X, int64_t T, int64_t I) {
    const float p = 0.3275911f, c[5] = {1.061405429f, -1.453152027f, 1.421413741f,
                                        -0.284496736f, 0.254829592f};
    const float r2 = 0.70710678118654752f;
    for (int64_t t = 0; t < T; t++) {
        float *x = X + t * I;
        int64_t i = 0;
#ifdef __AVX2__
        const __m256 one = _mm256_set1_ps(1.0f), half = _mm256_set1_ps(0.5f),
                     sign = _mm256_set1_ps(-0.0f);
        for (; i + 8 <= I; i += 8) {
            const __m256 v = _mm256_loadu_ps(x + i), z = _mm256_mul_ps(v, _mm256_set1_ps(r2));
            const __m256 a = _mm256_andnot_ps(sign, z);
            const __m256 u = _mm256_div_ps(one, _mm256_add_ps(_mm256_mul_ps(a, _mm256_set1_ps(p)),
                                                              one));
            __m256 poly = _mm256_mul_ps(u, _mm256_set1_ps(c[0]));
            for (int k = 1; k < 5; k++)
                poly = _mm256_mul_ps(_mm256_add_ps(poly, _mm256_set1_ps(c[k])), u);
            const __m256 e = exp8(_mm256_xor_ps(_mm256_mul_ps(a, a), sign));
            const __m256 erf = _mm256_or_ps(_mm256_sub_ps(one, _mm256_mul_ps(poly, e)),
                                            _mm256_and_ps(z, sign)); /* copysign: erf >= 0 */
            _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_mul_ps(half, v), _mm256_add_ps(one, erf)));
        }
#endif
        for (; i < I; i++) {
            const float z = x[i] * r2, a = fabsf(z), u = 1.0f / (a * p + 1.0f);
            float poly = u * c[0];
            for (int k = 1; k < 5; k++)
                poly = (poly + c[k]) * u;
            const float erf = copysignf(1.0f - poly * expf(-(a * a)), z);
            x[i] = 0.5f * x[i] * (1.0f + erf);
        }
    }
}

/* -- blocked (flash-style) prompt attention ------------------------------------------------
 * The queries of a prompt piece against the cache, a block of FQ rows (each with all the
 * query heads of one key head) per task: each cached key and value is read and converted
 * once per block of rows, FK at a time, and the softmax runs online (a running maximum m,
 * a running sum l and output O, rescaled when m grows). A row's arithmetic depends only on
 * its position and the keys it sees, not on the block it is in: a key block it sees none
 * of leaves it untouched. Within float rounding of fk_attend's two-pass softmax. */
#define FQ 32 /* query rows per task, at most (16 where that leaves a thread < 4 tasks) */
#define FK 16 /* keys per step */

/* Keys (transposed: Kt[d][c]) and values (Vb[c][d]) j0 .. j0 + kn of one key head, float32. */
#if defined(__AVX2__) && defined(__F16C__)
/* r[i] = column i of the 8 x 8 matrix whose rows were r[0..7]. */
static inline void transpose8(__m256 r[8]) {
    __m256 t[8], u[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int h = 0; h < 2; h++) { /* rows 0-3, then 4-7 */
        __m256 *x = t + 4 * h, *y = u + 4 * h;
        y[0] = _mm256_shuffle_ps(x[0], x[2], _MM_SHUFFLE(1, 0, 1, 0));
        y[1] = _mm256_shuffle_ps(x[0], x[2], _MM_SHUFFLE(3, 2, 3, 2));
        y[2] = _mm256_shuffle_ps(x[1], x[3], _MM_SHUFFLE(1, 0, 1, 0));
        y[3] = _mm256_shuffle_ps(x[1], x[3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int i = 0; i < 4; i++) {
        r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
        r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
    }
}
#endif

#ifdef __AVX2__
/* Eight Q8_0 codes' values: each code times the block's scale d. */
static inline __m256 q8_values8(const uint8_t *codes, __m256 d) {
    const __m256i c = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)codes));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(c), d);
}

/* Eight values of a cached row from value i (a multiple of 8), in the cache's format. */
static inline __m256 kv_load8(const uint8_t *row, int64_t i, int half) {
    if (half == KV_Q8) {
        const uint8_t *b = row + i / 32 * 34;
        return q8_values8(b + 2 + i % 32, _mm256_set1_ps(h2f(b)));
    }
#ifdef __F16C__
    if (half) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + 2 * i)));
#endif
    return _mm256_loadu_ps((const float *)row + i);
}
#endif

#ifdef __AVX512F__
/* Sixteen values of an f16 or Q8_0 cached row from value i (a multiple of 16): lane j is
 * kv_load8's lane j of i, or j - 8 of i + 8 (the same value, the same bits). */
static inline __m512 kv_load16(const uint8_t *row, int64_t i, int half) {
    if (half == KV_Q8) {
        const uint8_t *b = row + i / 32 * 34;
        const __m512i c = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + 2 + i % 32)));
        return _mm512_mul_ps(_mm512_cvtepi32_ps(c), _mm512_set1_ps(h2f(b)));
    }
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(row + 2 * i)));
}
#endif

static void flash_load(const void *K, const void *V, const int64_t *table, int64_t hk,
                       int64_t nkv, int64_t bs, int64_t hd, int half, int64_t j0, int64_t kn,
                       float *Kt, float *Vb) {
    const int64_t row_bytes = kv_row_bytes(hd, half), block_bytes = nkv * bs * row_bytes;
    const int64_t head = hk * bs * row_bytes;
    const int shift = kv_shift(bs);
    int64_t c = 0;
#if defined(__AVX2__) && defined(__F16C__)
    if (half && hd % 8 == 0) /* 8 keys at a time: 8 x 8 values converted, turned in registers */
        for (; c + 8 <= kn; c += 8) {
            const uint8_t *k8[8];
            for (int i = 0; i < 8; i++) {
                const int64_t at = kv_at(table, j0 + c + i, bs, shift, block_bytes, head,
                                         row_bytes);
                k8[i] = (const uint8_t *)K + at;
                const uint8_t *v = (const uint8_t *)V + at;
                for (int64_t d = 0; d < hd; d += 8)
                    _mm256_storeu_ps(Vb + (c + i) * hd + d, kv_load8(v, d, half));
            }
            for (int64_t d = 0; d < hd; d += 8) {
                __m256 r[8];
                for (int i = 0; i < 8; i++) r[i] = kv_load8(k8[i], d, half);
                transpose8(r);
                for (int i = 0; i < 8; i++) _mm256_storeu_ps(Kt + (d + i) * FK + c, r[i]);
            }
        }
#endif
    for (; c < kn; c++) {
        const int64_t at = kv_at(table, j0 + c, bs, shift, block_bytes, head, row_bytes);
        const uint8_t *k = (const uint8_t *)K + at, *v = (const uint8_t *)V + at;
        float *vb = Vb + c * hd;
        int64_t d = 0;
#if defined(__AVX2__) && defined(__F16C__)
        if (half)
            for (; d + 8 <= hd; d += 8) {
                const __m256 kv8 = kv_load8(k, d, half);
                _mm256_storeu_ps(vb + d, kv_load8(v, d, half));
                float tmp[8];
                _mm256_storeu_ps(tmp, kv8);
                for (int i = 0; i < 8; i++) Kt[(d + i) * FK + c] = tmp[i];
            }
#endif
        for (; d < hd; d++) {
            Kt[d * FK + c] = kv_value(k, d, half);
            vb[d] = kv_value(v, d, half);
        }
    }
    for (int64_t c = kn; c < FK; c++) { /* a short last step: zero keys and values */
        for (int64_t d = 0; d < hd; d++) Kt[d * FK + c] = 0.0f;
        memset(Vb + c * hd, 0, (size_t)hd * sizeof(float));
    }
}

#ifndef SQ
#define SQ 6
#endif
#ifdef __AVX2__
/* flash_scores for queries i .. i + cnt - 1 (cnt <= SQ, a constant where it is inlined):
 * cnt queries x 16 keys in registers, each score summed over d in order. */
static inline __attribute__((always_inline)) void flash_scores_n(const float *const *q, int i,
                                                                 const int cnt, const float *Kt,
                                                                 int64_t hd, float scale,
                                                                 float *s) {
    __m256 a[SQ][2];
    for (int r = 0; r < cnt; r++) a[r][0] = a[r][1] = _mm256_setzero_ps();
    for (int64_t d = 0; d < hd; d++) {
        const __m256 k0 = _mm256_loadu_ps(Kt + d * FK), k1 = _mm256_loadu_ps(Kt + d * FK + 8);
        for (int r = 0; r < cnt; r++) {
            const __m256 x = _mm256_set1_ps(q[i + r][d]);
            a[r][0] = _mm256_fmadd_ps(x, k0, a[r][0]);
            a[r][1] = _mm256_fmadd_ps(x, k1, a[r][1]);
        }
    }
    const __m256 sc = _mm256_set1_ps(scale);
    for (int r = 0; r < cnt; r++) {
        _mm256_storeu_ps(s + (i + r) * FK, _mm256_mul_ps(a[r][0], sc));
        _mm256_storeu_ps(s + (i + r) * FK + 8, _mm256_mul_ps(a[r][1], sc));
    }
}
#endif

/* s[i][c] = (q_i . key c) * scale for n query vectors (each its sum over d in order, the
 * same bits however many are computed together). */
static void flash_scores(const float *const *q, int n, const float *Kt, int64_t hd, float scale,
                         float *s) {
    int i = 0;
#ifdef __AVX2__
    for (; i + SQ <= n; i += SQ) flash_scores_n(q, i, SQ, Kt, hd, scale, s);
    switch (n - i) { /* the rest together: one query alone waits on its own sums */
    case 5: flash_scores_n(q, i, 5, Kt, hd, scale, s); break;
    case 4: flash_scores_n(q, i, 4, Kt, hd, scale, s); break;
    case 3: flash_scores_n(q, i, 3, Kt, hd, scale, s); break;
    case 2: flash_scores_n(q, i, 2, Kt, hd, scale, s); break;
    case 1: flash_scores_n(q, i, 1, Kt, hd, scale, s); break;
    default: break;
    }
    i = n;
#endif
    for (; i < n; i++)
        for (int c = 0; c < FK; c++) {
            float acc = 0.0f;
            for (int64_t d = 0; d < hd; d++) acc = fmaf(q[i][d], Kt[d * FK + c], acc);
            s[i * FK + c] = acc * scale;
        }
}

/* o = o * corr + sum_c p[c] * Vb[c] over kn values. */
static inline void flash_pv(float *o, float corr, const float *p, int64_t kn, const float *Vb,
                            int64_t hd) {
    int64_t d = 0;
#ifdef __AVX2__
    const __m256 cr = _mm256_set1_ps(corr);
    for (; d + 32 <= hd; d += 32) {
        __m256 a0 = _mm256_mul_ps(_mm256_loadu_ps(o + d), cr);
        __m256 a1 = _mm256_mul_ps(_mm256_loadu_ps(o + d + 8), cr);
        __m256 a2 = _mm256_mul_ps(_mm256_loadu_ps(o + d + 16), cr);
        __m256 a3 = _mm256_mul_ps(_mm256_loadu_ps(o + d + 24), cr);
        for (int64_t c = 0; c < kn; c++) {
            const __m256 w = _mm256_set1_ps(p[c]);
            const float *v = Vb + c * hd + d;
            a0 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v), a0);
            a1 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 8), a1);
            a2 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 16), a2);
            a3 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 24), a3);
        }
        _mm256_storeu_ps(o + d, a0);
        _mm256_storeu_ps(o + d + 8, a1);
        _mm256_storeu_ps(o + d + 16, a2);
        _mm256_storeu_ps(o + d + 24, a3);
    }
    for (; d + 8 <= hd; d += 8) {
        __m256 a0 = _mm256_mul_ps(_mm256_loadu_ps(o + d), cr);
        for (int64_t c = 0; c < kn; c++)
            a0 = _mm256_fmadd_ps(_mm256_set1_ps(p[c]), _mm256_loadu_ps(Vb + c * hd + d), a0);
        _mm256_storeu_ps(o + d, a0);
    }
#endif
    for (; d < hd; d++) {
        float a = o[d] * corr;
        for (int64_t c = 0; c < kn; c++) a = fmaf(p[c], Vb[c * hd + d], a);
        o[d] = a;
    }
}

/* flash_pv for two query vectors, each value vector loaded once for both (each output's
 * arithmetic is flash_pv's, in its order). p0, p1: zero past their own counts; kn the
 * larger. */
static inline void flash_pv2(float *o0, float *o1, float corr0, float corr1, const float *p0,
                             const float *p1, int64_t kn, const float *Vb, int64_t hd) {
#ifdef __AVX2__
    if (hd % 32 == 0) {
        const __m256 c0 = _mm256_set1_ps(corr0), c1 = _mm256_set1_ps(corr1);
        for (int64_t d = 0; d < hd; d += 32) {
            __m256 a[4], b[4];
            for (int k = 0; k < 4; k++) {
                a[k] = _mm256_mul_ps(_mm256_loadu_ps(o0 + d + 8 * k), c0);
                b[k] = _mm256_mul_ps(_mm256_loadu_ps(o1 + d + 8 * k), c1);
            }
            for (int64_t c = 0; c < kn; c++) {
                const __m256 w0 = _mm256_set1_ps(p0[c]), w1 = _mm256_set1_ps(p1[c]);
                const float *v = Vb + c * hd + d;
                for (int k = 0; k < 4; k++) {
                    const __m256 x = _mm256_loadu_ps(v + 8 * k);
                    a[k] = _mm256_fmadd_ps(w0, x, a[k]);
                    b[k] = _mm256_fmadd_ps(w1, x, b[k]);
                }
            }
            for (int k = 0; k < 4; k++) {
                _mm256_storeu_ps(o0 + d + 8 * k, a[k]);
                _mm256_storeu_ps(o1 + d + 8 * k, b[k]);
            }
        }
        return;
    }
#endif
    flash_pv(o0, corr0, p0, kn, Vb, hd);
    flash_pv(o1, corr1, p1, kn, Vb, hd);
}

/* Scratch floats a thread needs for flash_task. */
static int64_t flash_scratch(int64_t group, int64_t hd) {
    const int64_t nv = FQ * group;
    return FK * hd * 2 + nv * FK + nv * hd + 2 * nv;
}

/* Rows r0 .. r1 of a prompt piece (row r at position pos + r, its query heads at
 * Q + r * q_stride) for the query heads of key head hk; OUT rows o_stride floats apart.
 * all > 0: every row sees keys 0 .. all - 1 instead (bidirectional: an encoder's input;
 * window 0). */
static void flash_task(const float *Q, int64_t q_stride, int64_t r0, int64_t r1, int64_t pos,
                       int64_t nq, int64_t nkv, int64_t hd, const void *K, const void *V,
                       int64_t bs, const int64_t *table, int64_t window, int64_t all,
                       const float *sinks, float scale, float *OUT, int64_t o_stride, int half,
                       int64_t hk, float *scratch) {
    const int64_t group = nq / nkv, nv = (r1 - r0) * group;
    if (all > 0) window = 0; /* every row sees every key */
    float *Kt = scratch, *Vb = Kt + FK * hd, *S = Vb + FK * hd, *O = S + FQ * group * FK;
    float *m = O + FQ * group * hd, *l = m + FQ * group;
    const float *qv[FQ * 64];
    const float *qp[FQ * 64];
    float cr[FQ * 64];  /* a step's corrections */
    int64_t cn[FQ * 64]; /* and each vector's count of keys */
    for (int64_t i = 0; i < nv; i++) {
        const int64_t r = r0 + i / group, h = hk * group + i % group;
        qv[i] = Q + r * q_stride + h * hd;
        const float *sink = sinks ? sinks + h : NULL;
        m[i] = sink ? *sink : -INFINITY;
        l[i] = sink ? 1.0f : 0.0f; /* the sink: a key of weight e^(sink - m), value zero */
    }
    memset(O, 0, (size_t)(nv * hd) * sizeof(float));
    /* row r sees positions lo(r) .. seen(r) */
#define SEEN(r) (all > 0 ? all - 1 : pos + (r))
    const int64_t last = SEEN(r1 - 1);
    const int64_t first = window > 0 && pos + r0 + 1 > window ? pos + r0 + 1 - window : 0;
    for (int64_t j0 = first / FK * FK; j0 <= last; j0 += FK) {
        const int64_t kn = last + 1 - j0 < FK ? last + 1 - j0 : FK;
        flash_load(K, V, table, hk, nkv, bs, hd, half, j0, kn, Kt, Vb);
        /* the rows that see any of these keys */
        int64_t a = r0, b = r1; /* rows a .. b */
        while (a < r1 && SEEN(a) < j0) a++;
        while (b > a && window > 0 && pos + b - 1 + 1 - window > j0 + kn - 1) b--;
        if (a >= b) continue;
        const int64_t i0 = (a - r0) * group, n = (b - a) * group;
        for (int64_t i = 0; i < n; i++) qp[i] = qv[i0 + i];
        flash_scores(qp, (int)n, Kt, hd, scale, S + i0 * FK);
        for (int64_t i = i0; i < i0 + n; i++) {
            const int64_t r = r0 + i / group, p = SEEN(r);
            const int64_t lo = window > 0 && p + 1 > window ? p + 1 - window : 0;
            const int64_t c0 = lo > j0 ? lo - j0 : 0, c1 = p - j0 + 1 < kn ? p - j0 + 1 : kn;
            float *s = S + i * FK;
            float top = m[i], sum = 0.0f;
#ifdef __AVX2__
            {
                __m256 s0 = _mm256_loadu_ps(s), s1 = _mm256_loadu_ps(s + 8);
                __m256 k0 = _mm256_castsi256_ps(_mm256_set1_epi32(-1)), k1 = k0;
                if (c0 > 0 || c1 < FK) { /* keys this row does not see: masked out */
                    const __m256 i0v = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
                    const __m256 i1v = _mm256_add_ps(i0v, _mm256_set1_ps(8.0f));
                    const __m256 lo_v = _mm256_set1_ps((float)c0);
                    const __m256 hi_v = _mm256_set1_ps((float)c1);
                    k0 = _mm256_and_ps(_mm256_cmp_ps(i0v, lo_v, _CMP_GE_OQ),
                                       _mm256_cmp_ps(i0v, hi_v, _CMP_LT_OQ));
                    k1 = _mm256_and_ps(_mm256_cmp_ps(i1v, lo_v, _CMP_GE_OQ),
                                       _mm256_cmp_ps(i1v, hi_v, _CMP_LT_OQ));
                    const __m256 ninf = _mm256_set1_ps(-INFINITY);
                    s0 = _mm256_blendv_ps(ninf, s0, k0);
                    s1 = _mm256_blendv_ps(ninf, s1, k1);
                }
                const float bm = hsum_max(_mm256_max_ps(s0, s1));
                top = bm > top ? bm : top;
                const __m256 t = _mm256_set1_ps(top);
                s0 = _mm256_and_ps(exp8(_mm256_sub_ps(s0, t)), k0);
                s1 = _mm256_and_ps(exp8(_mm256_sub_ps(s1, t)), k1);
                _mm256_storeu_ps(s, s0);
                _mm256_storeu_ps(s + 8, s1);
                sum = hsum(_mm256_add_ps(s0, s1));
            }
#else
            for (int64_t c = c0; c < c1; c++) top = s[c] > top ? s[c] : top;
            for (int64_t c = 0; c < FK; c++) {
                s[c] = c >= c0 && c < c1 ? expf(s[c] - top) : 0.0f;
                sum += s[c];
            }
#endif
            const float corr = expf(m[i] - top);
            l[i] = l[i] * corr + sum;
            m[i] = top;
            cr[i - i0] = corr;
            cn[i - i0] = c1;
        }
        /* the weighted values, two query vectors at a time (a row's weights past its own
         * count are zero) */
        int64_t i = 0;
        for (; i + 2 <= n; i += 2)
            flash_pv2(O + (i0 + i) * hd, O + (i0 + i + 1) * hd, cr[i], cr[i + 1],
                      S + (i0 + i) * FK, S + (i0 + i + 1) * FK,
                      cn[i] > cn[i + 1] ? cn[i] : cn[i + 1], Vb, hd);
        if (i < n) flash_pv(O + (i0 + i) * hd, cr[i], S + (i0 + i) * FK, cn[i], Vb, hd);
    }
#undef SEEN
    for (int64_t i = 0; i < nv; i++) {
        const int64_t r = r0 + i / group, h = hk * group + i % group;
        const float inv = 1.0f / l[i];
        float *o = OUT + r * o_stride + h * hd;
        for (int64_t d = 0; d < hd; d++) o[d] = O[i * hd + d] * inv;
    }
}

/* Team work (inside a parallel region, or alone): the prompt attention of the pieces
 * seg[s] = (first row, rows, position of the first row) with block tables tables[s],
 * dynamically scheduled over (piece, key head, block of FQ rows), the latest rows first
 * (all > 0: every row over keys 0 .. all - 1, flash_task's). */
static void flash_team(const float *Q, int64_t q_stride, int64_t nseg, const int64_t *seg,
                       const int64_t *const *tables, int64_t nq, int64_t nkv, int64_t hd,
                       const void *K, const void *V, int64_t bs, int64_t window, int64_t all,
                       const float *sinks, float scale, float *OUT, int64_t o_stride, int half,
                       float *scratch, Act8 *qa) {
    /* blocks of FQ rows (each key step then serves twice the rows of 16: 15% faster at 8,192
     * keys on an AVX2 EPYC), or FQ / 2 where FQ leaves a thread fewer than 4 tasks */
    int64_t fq = FQ, tasks = 0;
    for (;; fq = FQ / 2) {
        tasks = 0;
        for (int64_t s = 0; s < nseg; s++) tasks += nkv * ((seg[3 * s + 1] + fq - 1) / fq);
        if (fq == FQ / 2 || tasks >= 4 * (int64_t)omp_get_num_threads()) break;
    }
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; task++) {
        int64_t t = task, s = 0;
        for (;; s++) {
            const int64_t here = nkv * ((seg[3 * s + 1] + fq - 1) / fq);
            if (t < here) break;
            t -= here;
        }
        const int64_t nblk = (seg[3 * s + 1] + fq - 1) / fq;
        const int64_t blk = nblk - 1 - t / nkv, hk = t % nkv;
        const int64_t r0 = blk * fq, r1 = r0 + fq < seg[3 * s + 1] ? r0 + fq : seg[3 * s + 1];
        const int64_t first = seg[3 * s];
        flash_task(Q + first * q_stride, q_stride, r0, r1, seg[3 * s + 2], nq, nkv, hd, K, V,
                   bs, tables[s], window, all, sinks, scale, OUT + first * o_stride, o_stride,
                   half, hk, scratch);
        if (qa) /* OUT's rows are nq * hd wide here (fk_forward) */
            for (int64_t r = r0; r < r1; r++)
                quantize_heads(OUT, nq, hd, first + r, hk * (nq / nkv), (hk + 1) * (nq / nkv), qa);
    }
}

static int attend_piece(const float *Q, int64_t q_stride, int64_t n, int64_t nq, int64_t nkv,
                        int64_t hd, const void *K, const void *V, int64_t bs,
                        const int64_t *table, int64_t pos, int64_t window, int64_t all,
                        const float *sinks, float scale, float *OUT, int half, int threads) {
    const int64_t group = nq / nkv;
    if (group > 64 || nq % nkv) return -1;
    const int64_t seg[3] = {0, n, pos};
    const int64_t *tables[1] = {table};
    int failed = 0;
    const int many = n * (all > 0 ? all : pos + n) * nq * hd > (1 << 16);
#pragma omp parallel num_threads(threads) if (many)
    {
        float *scratch = (float *)malloc((size_t)flash_scratch(group, hd) * sizeof(float));
        if (!scratch) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp barrier
        if (!failed)
            flash_team(Q, q_stride, 1, seg, tables, nq, nkv, hd, K, V, bs, window, all, sinks,
                       scale, OUT, nq * hd, half, scratch, NULL);
        free(scratch);
    }
    return failed ? -2 : 0;
}

/* Causal attention of a prompt piece: rows 0 .. n - 1 of Q (q_stride floats apart) at
 * positions pos .. pos + n - 1 of the sequence whose blocks are `table`, its keys and values
 * up to there in the cache K, V [blocks, nkv, bs, hd] (rows in the format `half` names, as
 * fk_attend's); OUT [n, nq * hd]. -2: no memory;
 * -1: a shape it does not take (more than 64 query heads per key head). */
int fk_attend_prompt(const float *Q, int64_t q_stride, int64_t n, int64_t nq, int64_t nkv,
                     int64_t hd, const void *K, const void *V, int64_t bs,
                     const int64_t *table, int64_t pos, int64_t window, const float *sinks,
                     float scale, float *OUT, int half, int threads) {
    return attend_piece(Q, q_stride, n, nq, nkv, hd, K, V, bs, table, pos, window, 0, sinks,
                        scale, OUT, half, threads);
}

/* fk_attend_prompt's rows each over all the `keys` keys of `table` (bidirectional: an
 * encoder's input, its keys and values laid out as a cache's). -1 also for keys < 1. */
int fk_attend_all(const float *Q, int64_t q_stride, int64_t n, int64_t nq, int64_t nkv,
                  int64_t hd, const void *K, const void *V, int64_t bs, const int64_t *table,
                  int64_t keys, const float *sinks, float scale, float *OUT, int half,
                  int threads) {
    if (keys < 1) return -1;
    return attend_piece(Q, q_stride, n, nq, nkv, hd, K, V, bs, table, 0, 0, keys, sinks, scale,
                        OUT, half, threads);
}

/* -- decode attention ---------------------------------------------------------------------
 * One query token per row over its cached keys and values (dec_span: each key and value
 * row read and converted once for all the query heads of its key head; the key rows come
 * cold, a step's weights having streamed through the caches since the layer's last step,
 * so each is fetched a few keys ahead and its value row with it), in tasks of (row, key
 * head, span of positions) so that one sequence keeps every thread busy: a row seeing n keys
 * has them cut into spans of at least ATT_SPAN keys (at most ATT_SPANS of them, whole steps
 * of FK keys), each span's maximum, sum and unnormalised output kept, then merged in span
 * order. The spans depend on n alone (not on the batch or the thread count): a row's outputs
 * are the same bits alone as among others, with any number of threads.
 *
 * Memory: a block of the cache holds each key head's rows in turn (bs rows of one head,
 * then the next head's), so a task reads pieces of 2-4 KB at a block's stride, which one core
 * reads at a third of its streaming bandwidth here (10 GB/s against 28: a 4 KB page at a time
 * the prefetchers do not follow). The tasks therefore go span by span (a span's key heads
 * one after another), and while it computes each task reads the next span's blocks whole
 * into L2, each key head's task every nkv-th of them, a few cache lines per key (Sweep): in
 * order, at the streaming rate. */
#define ATT_SPAN 48
#define ATT_SPANS 16

/* How many spans row's n keys are cut into, `per` keys each (a multiple of FK). */
static inline int64_t att_spans(int64_t n, int64_t *per) {
    int64_t c = (n + ATT_SPAN - 1) / ATT_SPAN;
    c = c < 1 ? 1 : c > ATT_SPANS ? ATT_SPANS : c;
    int64_t p = ((n + c - 1) / c + FK - 1) / FK * FK;
    p = p > 0 ? p : FK;
    *per = p;
    return (n + p - 1) / p > 0 ? (n + p - 1) / p : 1;
}

/* Row b's first key (window) and span layout: keys from `lo`, spans starting at base + c * per. */
static inline int64_t att_layout(int64_t len, int64_t window, int64_t *base, int64_t *per) {
    const int64_t lo = window > 0 && len > window ? len - window : 0;
    *base = lo / FK * FK;
    return att_spans(len - *base, per);
}

/* Blocks a task reads ahead into L2 as it goes: regions reg[0 .. nreg) (a block's keys and
 * its values) of `bytes` each, `per` cache lines for each set of 8 of its keys; the next
 * line at `at` (in reg[r], which ends at `end`), NULL when all are read. */
typedef struct {
    const uint8_t *reg[8], *at, *end;
    int nreg, r;
    int64_t bytes, per;
} Sweep;

static inline void sweep_some(Sweep *sw) {
    const uint8_t *at = sw->at;
    for (int64_t lines = sw->per; at && lines > 0;) {
        /* lines left in the region, a last part line counted (a Q8_0 cache's block of an
         * odd count of 34-byte rows ends inside one: with none counted, no line was ever
         * taken and the loop never ended) */
        const int64_t room = (sw->end - at + 63) / 64, k = lines < room ? lines : room;
        for (int64_t i = 0; i < k; i++) __builtin_prefetch(at + 64 * i, 0, 1); /* to L2 */
        at += 64 * k;
        lines -= k;
        if (at >= sw->end) {
            at = ++sw->r < sw->nreg ? sw->reg[sw->r] : NULL;
            sw->end = at ? at + sw->bytes : NULL;
        }
    }
    sw->at = at;
}

#define ATT_HEADS 6 /* query heads of one key head a pass over its rows takes at most */
#ifndef ATT_AHEAD
#define ATT_AHEAD 4 /* keys ahead a score pass fetches */
#endif

#ifdef __AVX2__
/* The sums of eight vectors' lanes: lane i of the result is v[i]'s sum. */
static inline __m256 hsum8(const __m256 *v) {
    const __m256 t0 = _mm256_hadd_ps(v[0], v[1]), t1 = _mm256_hadd_ps(v[2], v[3]);
    const __m256 t2 = _mm256_hadd_ps(v[4], v[5]), t3 = _mm256_hadd_ps(v[6], v[7]);
    const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20),
                         _mm256_permute2f128_ps(u0, u1, 0x31));
}

/* Every cache line of a row (a Q8_0 row of 136 bytes starts anywhere in a line). */
static inline void prefetch_row(const uint8_t *row, int64_t bytes) {
    for (const uint8_t *p = (const uint8_t *)((uintptr_t)row & ~(uintptr_t)63); p < row + bytes;
         p += 64)
        __builtin_prefetch(p, 0, 3);
}

/* The key row of key kk of the set of 8 at i0 (past the span's end, nk keys: its last key
 * again, the score unused). The memory is slow (a step's weights stream through the caches
 * between a layer's steps): the key's value row is fetched for the value pass, and the key
 * row ATT_AHEAD on for this pass. */
static inline const uint8_t *dec_key(const uint8_t *K, const uint8_t *V, const int64_t *off,
                                     int64_t i0, int kk, int64_t nk, int64_t n,
                                     int64_t row_bytes) {
    const int64_t at = off[i0 + (kk < nk ? kk : nk - 1)];
    prefetch_row(V + at, row_bytes);
    if (i0 + kk + ATT_AHEAD < n) prefetch_row(K + off[i0 + kk + ATT_AHEAD], row_bytes);
    return K + at;
}

/* A set of 8 keys' scores from their sums (sums[h][kk]: key kk's 8 lanes for head h), of
 * which the first nk are keys: p[h * pn + kk] = the sum * scale (all lanes), top[h] their
 * lane-wise maxima. */
static inline __attribute__((always_inline)) void dec_scores_set(
        __m256 (*sums)[8], const int nh, int64_t nk, __m256 scale, float *p, int64_t pn,
        __m256 *top) {
    const __m256 lanes = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256 valid = _mm256_cmp_ps(lanes, _mm256_set1_ps((float)nk), _CMP_LT_OQ);
    for (int h = 0; h < nh; h++) {
        const __m256 x = _mm256_mul_ps(hsum8(sums[h]), scale);
        _mm256_storeu_ps(p + h * pn, x);
        top[h] = _mm256_max_ps(top[h], _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), x, valid));
    }
}

/* Scores p[h * pn + i] = (q_h . key i) * scale of nh (a constant where inlined) query heads
 * q + h * hd over the n keys at byte offsets off[i] of K, eight keys at a time: each key row
 * loaded (and converted) once for all the heads, its eight keys' sums reduced together;
 * top[h]: the heads' maxima, lane-wise (from their values on entry). Writes up to pn8 =
 * n rounded up to 8 floats a head (pn >= pn8). hd % 16 == 0. */
static inline __attribute__((always_inline)) void dec_scores_n(
        const float *q, const int nh, const uint8_t *K, const uint8_t *V, const int64_t *off,
        int64_t n, int64_t hd, int64_t row_bytes, float scale, int half, float *p, int64_t pn,
        __m256 *top, Sweep *sw) {
    const __m256 vscale = _mm256_set1_ps(scale);
    for (int64_t i0 = 0; i0 < n; i0 += 8) {
        const int64_t nk = n - i0 < 8 ? n - i0 : 8;
        __m256 sums[ATT_HEADS][8];
        if (sw) sweep_some(sw);
        for (int kk = 0; kk < 8; kk++) {
            const uint8_t *row = dec_key(K, V, off, i0, kk, nk, n, row_bytes);
            __m256 a[ATT_HEADS][2];
            for (int h = 0; h < nh; h++) a[h][0] = a[h][1] = _mm256_setzero_ps();
            if (half == KV_Q8) /* kv_load8's values, each block's scale converted once */
                for (int64_t i = 0; i < hd; i += 32) {
                    const uint8_t *b = row + i / 32 * 34;
                    const __m256 d = _mm256_set1_ps(h2f(b));
                    for (int j = 0; j < 4; j++) {
                        const __m256 k = q8_values8(b + 2 + 8 * j, d);
                        for (int h = 0; h < nh; h++)
                            a[h][j & 1] = _mm256_fmadd_ps(_mm256_loadu_ps(q + h * hd + i + 8 * j),
                                                          k, a[h][j & 1]);
                    }
                }
            else
                for (int64_t i = 0; i < hd; i += 16) {
                    const __m256 k0 = kv_load8(row, i, half), k1 = kv_load8(row, i + 8, half);
                    for (int h = 0; h < nh; h++) {
                        a[h][0] = _mm256_fmadd_ps(_mm256_loadu_ps(q + h * hd + i), k0, a[h][0]);
                        a[h][1] = _mm256_fmadd_ps(_mm256_loadu_ps(q + h * hd + i + 8), k1,
                                                  a[h][1]);
                    }
                }
            for (int h = 0; h < nh; h++) sums[h][kk] = _mm256_add_ps(a[h][0], a[h][1]);
        }
        dec_scores_set(sums, nh, nk, vscale, p + i0, pn, top);
    }
}

#ifdef __AVX512F__
/* dec_scores_n for an f16 or Q8_0 cache with AVX-512 where the queries fit in 16 registers
 * (hd 64 and nh <= 4, hd 128 and nh <= 2: dec_z): held there, a key row converted into 16
 * lanes at a time (kv_load16). The same sums as dec_scores_n's, in the same order (lane j of a
 * 16-lane sum is its first 8-lane sum's lane j, or its second's lane j - 8, added the same
 * way), the same bits. */
static inline int dec_z(int64_t hd, int nh) {
    return (hd == 64 && nh <= 4) || (hd == 128 && nh <= 2);
}

static inline __attribute__((always_inline)) void dec_scores_z(
        const float *q, const int nh, const uint8_t *K, const uint8_t *V, const int64_t *off,
        int64_t n, int64_t hd, int64_t row_bytes, float scale, int half, float *p, int64_t pn,
        __m256 *top, Sweep *sw) {
    const int nc = (int)(hd / 16);
    __m512 qz[4][8];
    for (int h = 0; h < nh; h++)
        for (int c = 0; c < nc; c++) qz[h][c] = _mm512_loadu_ps(q + h * hd + 16 * c);
    const __m256 vscale = _mm256_set1_ps(scale);
    for (int64_t i0 = 0; i0 < n; i0 += 8) {
        const int64_t nk = n - i0 < 8 ? n - i0 : 8;
        __m256 sums[4][8];
        if (sw) sweep_some(sw);
        for (int kk = 0; kk < 8; kk++) {
            const uint8_t *row = dec_key(K, V, off, i0, kk, nk, n, row_bytes);
            __m512 z[4];
            for (int h = 0; h < nh; h++) z[h] = _mm512_setzero_ps();
            for (int c = 0; c < nc; c++) {
                const __m512 k = kv_load16(row, 16 * c, half);
                for (int h = 0; h < nh; h++) z[h] = _mm512_fmadd_ps(qz[h][c], k, z[h]);
            }
            for (int h = 0; h < nh; h++)
                sums[h][kk] = _mm256_add_ps(_mm512_castps512_ps256(z[h]),
                                            _mm256_castpd_ps(_mm512_extractf64x4_pd(
                                                _mm512_castps_pd(z[h]), 1)));
        }
        dec_scores_set(sums, nh, nk, vscale, p + i0, pn, top);
    }
}
#endif

/* O[h] = sum_i w[h * pn + i] * value row i (at byte offset off[i] of V) for nh (a constant
 * where inlined) heads, each value row loaded (and converted) once for all of them, 16 of
 * its values at a time, keys in pairs on two sets of sums. */
static inline __attribute__((always_inline)) void dec_values_n(
        const float *w, int64_t pn, const int nh, const uint8_t *V, const int64_t *off,
        int64_t n, int64_t hd, int half, float *O) {
#ifdef __AVX512F__
    if (half && nh <= 3) { /* 16 lanes: a[h][0] and a[h][1] below side by side, the same sums */
        for (int64_t d = 0; d < hd; d += 16) {
            __m512 a[3], b[3];
            for (int h = 0; h < nh; h++) a[h] = b[h] = _mm512_setzero_ps();
            int64_t i = 0;
            for (; i + 2 <= n; i += 2) {
                const __m512 v = kv_load16(V + off[i], d, half);
                const __m512 u = kv_load16(V + off[i + 1], d, half);
                for (int h = 0; h < nh; h++) {
                    a[h] = _mm512_fmadd_ps(_mm512_set1_ps(w[h * pn + i]), v, a[h]);
                    b[h] = _mm512_fmadd_ps(_mm512_set1_ps(w[h * pn + i + 1]), u, b[h]);
                }
            }
            for (; i < n; i++) {
                const __m512 v = kv_load16(V + off[i], d, half);
                for (int h = 0; h < nh; h++)
                    a[h] = _mm512_fmadd_ps(_mm512_set1_ps(w[h * pn + i]), v, a[h]);
            }
            for (int h = 0; h < nh; h++)
                _mm512_storeu_ps(O + h * hd + d, _mm512_add_ps(a[h], b[h]));
        }
        return;
    }
#endif
    for (int64_t d = 0; d < hd; d += 16) {
        __m256 a[ATT_HEADS][2], b[ATT_HEADS][2];
        for (int h = 0; h < nh; h++) a[h][0] = a[h][1] = b[h][0] = b[h][1] = _mm256_setzero_ps();
        int64_t i = 0;
        if (nh <= 3)
            for (; i + 2 <= n; i += 2) {
                const uint8_t *r0 = V + off[i], *r1 = V + off[i + 1];
                const __m256 v0 = kv_load8(r0, d, half), v1 = kv_load8(r0, d + 8, half);
                const __m256 u0 = kv_load8(r1, d, half), u1 = kv_load8(r1, d + 8, half);
                for (int h = 0; h < nh; h++) {
                    const __m256 x = _mm256_set1_ps(w[h * pn + i]);
                    const __m256 y = _mm256_set1_ps(w[h * pn + i + 1]);
                    a[h][0] = _mm256_fmadd_ps(x, v0, a[h][0]);
                    a[h][1] = _mm256_fmadd_ps(x, v1, a[h][1]);
                    b[h][0] = _mm256_fmadd_ps(y, u0, b[h][0]);
                    b[h][1] = _mm256_fmadd_ps(y, u1, b[h][1]);
                }
            }
        for (; i < n; i++) {
            const uint8_t *row = V + off[i];
            const __m256 v0 = kv_load8(row, d, half), v1 = kv_load8(row, d + 8, half);
            for (int h = 0; h < nh; h++) {
                const __m256 x = _mm256_set1_ps(w[h * pn + i]);
                a[h][0] = _mm256_fmadd_ps(x, v0, a[h][0]);
                a[h][1] = _mm256_fmadd_ps(x, v1, a[h][1]);
            }
        }
        for (int h = 0; h < nh; h++) {
            _mm256_storeu_ps(O + h * hd + d, _mm256_add_ps(a[h][0], b[h][0]));
            _mm256_storeu_ps(O + h * hd + d + 8, _mm256_add_ps(a[h][1], b[h][1]));
        }
    }
}
#endif

/* One decode row's nh (<= ATT_HEADS) query heads q + h * hd, all of one key head, over the
 * n keys whose rows are at byte offsets off[i] of K and V (rows of row_bytes): each head's
 * maximum score m[h], the sum l[h] of e^(score - m) and the unnormalised output O [nh, hd];
 * sink: NULL or the heads' sinks (a key of value zero). p: nh * (n + 7) floats of scratch. */
static void dec_span(const float *q, int nh, const void *K, const void *V, const int64_t *off,
                     int64_t n, int64_t row_bytes, int64_t hd, float scale, int half,
                     const float *sink, float *p, float *O, float *m, float *l, Sweep *sw) {
    const uint8_t *Kb = (const uint8_t *)K, *Vb = (const uint8_t *)V;
    for (int h = 0; h < nh; h++) m[h] = sink ? sink[h] : -INFINITY;
#ifdef __AVX2__
    if (hd % 16 == 0) {
        const int64_t pn = (n + 7) & ~(int64_t)7; /* a head's scores: whole sets of 8 */
        __m256 top[ATT_HEADS];
        for (int h = 0; h < nh; h++) top[h] = _mm256_set1_ps(m[h]);
/* CALL(n) with n = nh as a constant (each count its own inlined code) */
#define BY_HEADS(CALL) switch (nh) { \
        case 1: CALL(1); break; \
        case 2: CALL(2); break; \
        case 3: CALL(3); break; \
        case 4: CALL(4); break; \
        case 5: CALL(5); break; \
        default: CALL(6); break; \
        }
#define DEC_SCORES(c) dec_scores_n(q, c, Kb, Vb, off, n, hd, row_bytes, scale, half, p, pn, top, sw)
#ifdef __AVX512F__
#define DEC_SCORES_Z(c) dec_scores_z(q, c, Kb, Vb, off, n, hd, row_bytes, scale, half, p, pn, \
                                     top, sw)
        if (half && dec_z(hd, nh)) {
            switch (nh) {
            case 1: DEC_SCORES_Z(1); break;
            case 2: DEC_SCORES_Z(2); break;
            case 3: DEC_SCORES_Z(3); break;
            default: DEC_SCORES_Z(4); break;
            }
        } else
#endif
        BY_HEADS(DEC_SCORES)
#undef DEC_SCORES_Z
#undef DEC_SCORES
        for (int h = 0; h < nh; h++) {
            m[h] = hsum_max(top[h]);
            float *ph = p + h * pn;
            const __m256 mx = _mm256_set1_ps(m[h]);
            __m256 acc = _mm256_setzero_ps();
            int64_t t = 0;
            for (; t + 8 <= n; t += 8) {
                const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(ph + t), mx));
                _mm256_storeu_ps(ph + t, e);
                acc = _mm256_add_ps(acc, e);
            }
            float total = hsum(acc) + (sink ? expf(sink[h] - m[h]) : 0.0f);
            for (; t < n; t++) {
                ph[t] = expf(ph[t] - m[h]);
                total += ph[t];
            }
            l[h] = total;
        }
#define DEC_VALUES(c) dec_values_n(p, pn, c, Vb, off, n, hd, half, O)
        BY_HEADS(DEC_VALUES)
#undef DEC_VALUES
#undef BY_HEADS
        return;
    }
#endif
    (void)row_bytes;
    (void)sw;
    const int64_t pn = n;
    for (int64_t i = 0; i < n; i++) {
        const uint8_t *k = Kb + off[i];
        for (int h = 0; h < nh; h++) {
            float acc = 0.0f;
            for (int64_t d = 0; d < hd; d++) acc += q[h * hd + d] * kv_value(k, d, half);
            p[h * pn + i] = acc * scale;
            m[h] = acc * scale > m[h] ? acc * scale : m[h];
        }
    }
    for (int h = 0; h < nh; h++) {
        float total = sink ? expf(sink[h] - m[h]) : 0.0f;
        for (int64_t t = 0; t < pn; t++) {
            p[h * pn + t] = expf(p[h * pn + t] - m[h]);
            total += p[h * pn + t];
        }
        l[h] = total;
    }
    memset(O, 0, (size_t)(nh * hd) * sizeof(float));
    for (int64_t i = 0; i < n; i++) {
        const uint8_t *v = Vb + off[i];
        for (int h = 0; h < nh; h++)
            for (int64_t d = 0; d < hd; d++)
                O[h * hd + d] += p[h * pn + i] * kv_value(v, d, half);
    }
}

/* Scratch floats a thread needs for a decode step's tasks (rows up to `longest` keys). A
 * task lays its scratch out by its own row's span length, which a shorter row can have
 * longer (48 keys are one span of 48, 49 two of 32): up to 768 keys a span is at most
 * ATT_SPAN (rounded up to FK), past that it grows with the keys; the longest of those. */
static int64_t att_scratch(int64_t group, int64_t hd, int64_t longest) {
    int64_t base, per;
    att_layout(longest, 0, &base, &per);
    const int64_t span = (ATT_SPAN + FK - 1) / FK * FK;
    per = per > span ? per : span;
    return 2 * (per + FK) + ATT_HEADS * (per + FK) + group * (hd + 2);
}

/* The most spans any of the B rows is cut into under `window` (more keys can make fewer
 * spans: 768 keys are 16 spans of 48, 769 are 13 of 64). */
static int64_t att_most(int64_t B, const int64_t *lengths, int64_t window) {
    int64_t most = 1, base, per;
    for (int64_t b = 0; b < B; b++) {
        const int64_t c = att_layout(lengths[b], window, &base, &per);
        most = c > most ? c : most;
    }
    return most;
}

/* Floats of a decode step's spans (the maximum, sum and output of each row's query heads by
 * span, `spans` a row-head) where some row has more than one span, else 0. */
static inline int64_t att_parts(int64_t B, int64_t nq, int64_t hd, int64_t spans) {
    return spans > 1 ? B * nq * spans * (hd + 2) : 0;
}

/* Team work (inside a parallel region, or alone): decode attention. Q: rows q_stride floats
 * apart, each nq heads of hd; OUT [B, nq * hd]. scratch: a thread's att_scratch floats;
 * part: att_parts' floats (spans: at least the most spans any row has under `window`;
 * NULL when 0); qa: NULL, or where the rows' outputs are rounded (quantize_heads). Ends at
 * a barrier. */
static void attend_team(const float *Q, int64_t q_stride, int64_t B, int64_t nq, int64_t nkv,
                        int64_t hd, const void *K, const void *V, int64_t bs,
                        const int64_t *tables, int64_t tstride, const int64_t *lengths,
                        int64_t window, const float *sinks, float scale, float *OUT, int half,
                        float *scratch, float *part, int64_t spans, Act8 *qa) {
    const int64_t group = nq / nkv, width = hd + 2;
    const int64_t row_bytes = kv_row_bytes(hd, half), block_bytes = nkv * bs * row_bytes;
    const int shift = kv_shift(bs);
    int64_t tasks = 0, base = 0, per = FK;
    for (int64_t b = 0; b < B; b++) tasks += nkv * att_layout(lengths[b], window, &base, &per);
    /* a task's row: a thread's tasks come in rising order (a shared counter hands them
     * out), so its row cursor moves on from the last (back to row 0 should one not) */
    int64_t b = 0, first = 0, n = B ? att_layout(lengths[0], window, &base, &per) : 0;
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; task++) {
        if (task < first) {
            b = first = 0;
            n = att_layout(lengths[0], window, &base, &per);
        }
        while (task >= first + nkv * n) {
            first += nkv * n;
            n = att_layout(lengths[++b], window, &base, &per);
        }
        const int64_t t = task - first, c = t / nkv, hk = t % nkv, len = lengths[b];
        const int64_t lo = window > 0 && len > window ? len - window : 0;
        const int64_t j0 = base + c * per > lo ? base + c * per : lo;
        const int64_t j1 = base + (c + 1) * per < len ? base + (c + 1) * per : len;
        /* the scratch: the keys' offsets (at its start: 8-byte aligned), outputs, maxima,
         * sums, scores */
        int64_t *off = (int64_t *)scratch;
        float *O = scratch + 2 * (per + FK), *m = O + group * hd, *l = m + group, *p = l + group;
        const int64_t *table = tables + b * tstride, head = hk * bs * row_bytes;
        for (int64_t j = j0; j < j1; j++) /* the span's rows, found once for every head set */
            off[j - j0] = kv_at(table, j, bs, shift, block_bytes, head, row_bytes);
        /* the next span's blocks, whole, read ahead: this key head's task takes every
         * nkv-th of them (at most 4), spread over its keys; not where the row before holds
         * the same block there (a shared prefix: read already, the sweep's instructions
         * would be all it added) */
        Sweep sw = {{0}, NULL, NULL, 0, 0, block_bytes, 0};
        const int64_t n0 = base + (c + 1) * per;
        const int shared = n0 < len && b > 0 && n0 < lengths[b - 1] &&
                           tables[(b - 1) * tstride + n0 / bs] == table[n0 / bs];
        if (n0 < len && j1 > j0 && !shared) {
            const int64_t n1 = n0 + per < len ? n0 + per : len;
            for (int64_t bi = n0 / bs + hk; bi <= (n1 - 1) / bs && sw.nreg < 8; bi += nkv) {
                sw.reg[sw.nreg++] = (const uint8_t *)K + table[bi] * block_bytes;
                sw.reg[sw.nreg++] = (const uint8_t *)V + table[bi] * block_bytes;
            }
            const int64_t sets = (j1 - j0 + 7) / 8;
            sw.per = (sw.nreg * ((block_bytes + 63) / 64) + sets - 1) / sets;
            sw.at = sw.nreg ? sw.reg[0] : NULL;
            sw.end = sw.at ? sw.at + block_bytes : NULL;
        }
        for (int64_t h0 = 0; h0 < group; h0 += ATT_HEADS) { /* heads in sets of ATT_HEADS */
            const int nh = (int)(group - h0 < ATT_HEADS ? group - h0 : ATT_HEADS);
            const int64_t h = hk * group + h0;
            dec_span(Q + b * q_stride + h * hd, nh, K, V, off, j1 - j0, row_bytes, hd, scale,
                     half, sinks && c == 0 ? sinks + h : NULL, p, O + h0 * hd, m + h0, l + h0,
                     sw.nreg ? &sw : NULL);
        }
        for (int64_t i = 0; i < group; i++) {
            const int64_t h = hk * group + i;
            if (n == 1) { /* the whole row: normalised */
                const float inv = 1.0f / l[i];
                for (int64_t d = 0; d < hd; d++) OUT[(b * nq + h) * hd + d] = O[i * hd + d] * inv;
            } else {
                float *q = part + ((b * nq + h) * spans + c) * width;
                q[0] = m[i];
                q[1] = l[i];
                memcpy(q + 2, O + i * hd, (size_t)hd * sizeof(float));
            }
        }
        if (n == 1) quantize_heads(OUT, nq, hd, b, hk * group, (hk + 1) * group, qa);
    }
    if (!part) return;
#pragma omp for schedule(static)
    for (int64_t t = 0; t < B * nkv; t++) { /* rows of more than one span: merged */
        const int64_t b = t / nkv, hk = t % nkv;
        const int64_t n = att_layout(lengths[b], window, &base, &per);
        if (n == 1) continue;
        for (int64_t h = hk * group; h < (hk + 1) * group; h++) {
            const float *p = part + (b * nq + h) * spans * width;
            float top = -INFINITY, sum = 0.0f;
            for (int64_t c = 0; c < n; c++) top = p[c * width] > top ? p[c * width] : top;
            float *o = OUT + (b * nq + h) * hd;
            memset(o, 0, (size_t)hd * sizeof(float));
            for (int64_t c = 0; c < n; c++) {
                const float *q = p + c * width, w = expf(q[0] - top);
                sum += q[1] * w;
                for (int64_t d = 0; d < hd; d++) o[d] += q[2 + d] * w;
            }
            const float inv = 1.0f / sum;
            for (int64_t d = 0; d < hd; d++) o[d] *= inv;
        }
        quantize_heads(OUT, nq, hd, b, hk * group, (hk + 1) * group, qa);
    }
}

/* Attention of one query token per row over cached keys and values.
 * Q: rows q_stride floats apart, each nq heads of hd; OUT: [B, nq, hd]. K, V: [blocks, nkv,
 * bs, kv_row_bytes(hd, half) bytes] (a layer's paged cache, float32, f16 or Q8_0 rows:
 * `half`, KV_F32 / KV_F16 / KV_Q8). Row b's positions are in the
 * blocks listed from TABLES + b * tstride (tstride 0: rows share one table, as a prompt's
 * tokens do, each with its own length); it sees positions 0 .. lengths[b] - 1, or only the
 * last `window` of them when window > 0. sinks: NULL or [nq] logits that join each head's
 * normalisation and are then dropped (gpt-oss). -2: no memory; -1: a shape it does not take
 * (more than 64 query heads per key head). */
int fk_attend(const float *Q, int64_t q_stride, int64_t B, int64_t nq, int64_t nkv, int64_t hd,
              const void *K, const void *V, int64_t bs, const int64_t *tables, int64_t tstride,
              const int64_t *lengths, int64_t window, const float *sinks, float scale,
              float *OUT, int half, int threads) {
    const int64_t group = nq / nkv;
    if (group > 64 || nq % nkv) return -1;
    int64_t longest = 0;
    for (int64_t b = 0; b < B; b++) longest = lengths[b] > longest ? lengths[b] : longest;
    const int64_t spans = att_most(B, lengths, window);
    const int64_t parts = att_parts(B, nq, hd, spans);
    float *part = parts ? (float *)malloc((size_t)parts * sizeof(float)) : NULL;
    int failed = parts && !part;
    const int many = B * nq * longest * hd > (1 << 15);
#pragma omp parallel num_threads(threads) if (many && !failed)
    {
        float *scratch = (float *)malloc((size_t)att_scratch(group, hd, longest) * sizeof(float));
        if (!scratch) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp barrier
        if (!failed)
            attend_team(Q, q_stride, B, nq, nkv, hd, K, V, bs, tables, tstride, lengths, window,
                        sinks, scale, OUT, half, scratch, part, spans, NULL);
        free(scratch);
    }
    free(part);
    return failed ? -2 : 0;
}

/* -- a whole forward's layers in one call ---------------------------------------------------
 * fk_forward runs every decoder layer of a step (decode: one token per sequence; or prompt
 * pieces) in one parallel region: the threads stay up across layers and go from one phase
 * to the next at a barrier (norm and rounding of the activations; the q/k/v product; q/k
 * norms, RoPE and the KV write; attention; the output product; residual, norm; gate/up;
 * SwiGLU; down; residual), each phase the same arithmetic as the kernels called one by one
 * (fk_rms_norm, fk_matmul / fk_matmul_packed, fk_qk_rope, fk_kv_write, fk_attend for decode
 * and fk_attend_prompt for prompts), so its outputs are theirs bit for bit. Integer formats
 * only (the weights' products on 8-bit activations), SwiGLU or GeGLU layers, with or without
 * norms of the attention's and the MLP's outputs (Gemma 3). */
typedef struct {
    int32_t type, packed; /* packed: in fk_pack_many's layout */
    const uint8_t *w;
    int64_t n; /* rows */
} FkPart;

typedef struct {
    int64_t nparts, n, k; /* parts side by side (their rows stacked): n rows of k columns */
    FkPart part[3];
} FkLin;

typedef struct {
    const float *norm_in, *norm_ff, *q_norm, *k_norm, *bqkv, *bo, *sinks; /* NULL: none */
    const float *norm_post_attn, *norm_post_ff; /* Gemma's norms of the two outputs, or NULL */
    int64_t window, rope;                                                 /* rope: its table */
    FkLin qkv, o, gu, down;
} FkLayer;

typedef struct {
    int64_t hidden, nq, nkv, hd, inter, bs;
    float eps, scale;
    int32_t half, act; /* half: the KV cache's format (KV_F32 / F16 / Q8); act: 0 SwiGLU,
                          1 GeGLU (gelu_tanh) */
    const float *final_norm; /* NULL, or the last layer's rows normed by it (in place) */
} FkModel;

#define LIN_ROWS 64 /* rows per unit of a prompt's dynamically scheduled product */

/* Team work: Y[T, L->n] = act @ L.T, the activations already rounded into `a` (tiled when
 * the parts are packed); ends at a barrier. Decode (T <= 8): each thread an even share of
 * each part's rows, as fk_matmul / fk_matmul_packed; prompts: units of LIN_ROWS rows x a
 * chunk of tokens, scheduled dynamically. `mw`: a thread's 4 * nb floats. */
static void lin_team(const FkLin *L, const Act8 *a, int64_t T, float *Y, float *mw) {
    int64_t c0 = 0;
    for (int64_t p = 0; p < L->nparts; p++) {
        const FkPart *P = &L->part[p];
        const int64_t N = P->n, K = L->k;
        float *Yp = Y + c0;
        c0 += N;
#if HAVE_PACKED
        if (P->packed) {
            const int64_t groups = (N + XR - 1) / XR;
            if (T <= 8) {
                int64_t g0, g1;
                thread_share(groups, &g0, &g1);
                groups_any(P->type, P->w, a, g0, g1, 0, T, Yp, L->n, N);
                continue;
            }
            const int64_t chunk = packed_chunk(K), chunks = (T + chunk - 1) / chunk;
            const int64_t per = LIN_ROWS / XR, blocks = (groups + per - 1) / per;
#pragma omp for schedule(dynamic, 1) nowait
            for (int64_t u = 0; u < chunks * blocks; u++) {
                const int64_t t0 = (u / blocks) * chunk, t1 = t0 + chunk < T ? t0 + chunk : T;
                const int64_t u0 = (u % blocks) * per, u1 = u0 + per < groups ? u0 + per : groups;
                groups_any(P->type, P->w, a, u0, u1, t0, t1, Yp, L->n, N);
            }
            continue;
        }
#endif
        const int64_t rb = fk_row_bytes(P->type, K);
        if (T <= 8) {
            int64_t q0, q1;
            thread_share((N + 3) / 4, &q0, &q1);
            const int64_t n0 = 4 * q0 < N ? 4 * q0 : N, n1 = 4 * q1 < N ? 4 * q1 : N;
            rows_int(P->type, P->w, rb, a, n0, n1, 0, T, Yp, L->n, mw);
            continue;
        }
        const int64_t chunk = (TOKEN_CHUNK_BYTES / K) & ~(int64_t)7;
        const int64_t step = chunk > 8 ? chunk : 8;
        const int64_t blocks = (N + LIN_ROWS - 1) / LIN_ROWS, chunks = (T + step - 1) / step;
#pragma omp for schedule(dynamic, 1) nowait
        for (int64_t u = 0; u < chunks * blocks; u++) {
            const int64_t t0 = (u / blocks) * step, t1 = t0 + step < T ? t0 + step : T;
            const int64_t n0 = (u % blocks) * LIN_ROWS;
            const int64_t n1 = n0 + LIN_ROWS < N ? n0 + LIN_ROWS : N;
            rows_int(P->type, P->w, rb, a, n0, n1, t0, t1, Yp, L->n, mw);
        }
    }
#pragma omp barrier
}

/* The activations' rounding as `lin` takes them, over a buffer with room for any. */
static inline void act_as(Act8 *a, const FkLin *lin, int64_t Tp) {
    a->K = lin->k;
    a->nb = lin->k / 32;
    a->s = a->d + Tp * a->nb;
    a->tiled = lin->part[0].packed;
}

static inline void timer(double *timing, int slot, double *mark) {
    if (!timing || omp_get_thread_num() != 0) return;
    const double now = omp_get_wtime();
    timing[slot] += now - *mark;
    *mark = now;
}
/* What fk_forward's team shares over a step. */
typedef struct {
    const FkModel *m;
    int64_t T, Tp, nseg, tstride, nqkv, spans;
    const int64_t *seg, *tables, *lengths;
    const float *const *cos, *const *sin;
    float *X, *h, *qkv, *big; /* h: normed rows, then attention's output (the o input) */
    float *gu;                /* the gate/up product's output: big, or its own where S->own */
    float *part;              /* decode: att_parts' floats, or NULL */
    Act8 *a;
    int decode;
    int own; /* every thread does the row-wise phases of the products' outputs whole, on its
                own copies (a small decode step: no barrier after them, and the activations a
                thread's products read are its own) */
    double *timing;
} FkStep;

/* A thread's own: its rows for RoPE and the cache write (t0 .. t1) and for the row-wise
 * phases (r0 .. r1: all of them where S->own), its scratch, its clock; the residual rows
 * (x), normed rows (hn) and rounded activations (a) it works on (thread 0: the step's own,
 * X, h and S->a; where S->own the others' copies). */
typedef struct {
    int64_t t0, t1, r0, r1;
    float *mw, *scr;
    double mark;
    float *x, *hn;
    Act8 *a;
} FkMine;

/* A decode step's rows times the larger of hidden and intermediate sizes up to which every
 * thread does the row-wise phases whole: each thread then reads every product's whole output
 * (about 4 * (2 I + 2 H) bytes a row a layer, most of it from other cores' caches) to save
 * the barrier after each phase; past this (an 8B model's intermediate of 14,336 alone), the
 * reads would cost what the barriers do, and the rows are split as a prompt's are */
#define OWN_ROWS 6144

/* The barrier that ends a row-wise phase: none where every thread did every row. */
static inline void rows_done(const FkStep *S) {
    if (!S->own) {
#pragma omp barrier
    }
}

/* Team work, a layer's first half: the q/k/v product, bias, q/k norms and RoPE, the new keys
 * and values into the cache (K, V), attention; its output rounded into the activations the
 * o product reads (S->a, or each thread's own where S->own). */
static void layer_attention(const FkStep *S, const FkLayer *L, const void *K, const void *V,
                            FkMine *me) {
    const FkModel *m = S->m;
    const int64_t nq = m->nq, nkv = m->nkv, hd = m->hd, nqkv = S->nqkv, T = S->T;
    const int64_t *seg = S->seg;
    Act8 *a = me->a;
    lin_team(&L->qkv, a, T, S->qkv, me->mw);
    timer(S->timing, 0, &me->mark);
    for (int64_t t = me->t0; t < me->t1; t++) {
        float *r = S->qkv + t * nqkv;
        if (L->bqkv)
            for (int64_t i = 0; i < nqkv; i++) r[i] = r[i] + L->bqkv[i];
        int64_t s = S->decode ? t : 0;
        if (!S->decode)
            while (t >= seg[3 * s] + seg[3 * s + 1]) s++;
        const int64_t position = seg[3 * s + 2] + (t - seg[3 * s]);
        fk_qk_rope(r, nqkv, 1, nq, nkv, hd, L->q_norm, L->k_norm, m->eps,
                   S->cos[L->rope] + position * hd, S->sin[L->rope] + position * hd);
        fk_kv_write(r, nqkv, 1, nq, nkv, hd, (void *)K, (void *)V, m->bs,
                    S->tables + s * S->tstride, 0, &position, m->half);
    }
    act_as(a, &L->o, S->Tp);
    /* heads of whole blocks: each attention task rounds its own outputs (into the one set
     * of activations every thread's o product reads) */
    Act8 *qa = hd % 32 == 0 && !S->own ? a : NULL;
#pragma omp barrier
    if (S->decode)
        attend_team(S->qkv, nqkv, T, nq, nkv, hd, K, V, m->bs, S->tables, S->tstride,
                    S->lengths, L->window, L->sinks, m->scale, S->h, m->half, me->scr,
                    S->part, S->spans, qa);
    else {
        const int64_t *tabs[64];
        for (int64_t s = 0; s < S->nseg; s++) tabs[s] = S->tables + s * S->tstride;
        flash_team(S->qkv, nqkv, S->nseg, seg, tabs, nq, nkv, hd, K, V, m->bs, L->window, 0,
                   L->sinks, m->scale, S->h, nq * hd, m->half, me->scr, qa);
    }
    timer(S->timing, 1, &me->mark);
    if (!qa) {
        for (int64_t t = me->r0; t < me->r1; t++) quantize_range(S->h, t, t + 1, nq * hd, a);
        rows_done(S);
        timer(S->timing, 2, &me->mark);
    }
}

/* Team work, a layer's second half: the o product and the residual, the norm, gate/up,
 * SwiGLU, down and the residual; then `next`'s first norm (NULL: the last layer). */
static void layer_mlp(const FkStep *S, const FkLayer *L, const FkLayer *next, FkMine *me) {
    const FkModel *m = S->m;
    const int64_t H = m->hidden, I = m->inter, T = S->T;
    float *X = me->x, *h = me->hn, *big = S->big;
    Act8 *a = me->a;
    lin_team(&L->o, a, T, big, me->mw);
    timer(S->timing, 0, &me->mark);
    act_as(a, &L->gu, S->Tp);
    /* the products' outputs (big) are read, never written: every thread may read them */
    for (int64_t t = me->r0; t < me->r1; t++) {
        float *x = X + t * H, *y = big + t * H;
        if (L->norm_post_attn) { /* x + norm(o + bo), as the Python path (h: scratch) */
            float *z = h + t * H;
            for (int64_t i = 0; i < H; i++) z[i] = L->bo ? y[i] + L->bo[i] : y[i];
            fk_rms_norm(z, L->norm_post_attn, 1, H, m->eps, z);
            for (int64_t i = 0; i < H; i++) x[i] = x[i] + z[i];
        } else if (L->bo)
            for (int64_t i = 0; i < H; i++) x[i] = x[i] + (y[i] + L->bo[i]);
        else
            for (int64_t i = 0; i < H; i++) x[i] = x[i] + y[i];
        fk_rms_norm(x, L->norm_ff, 1, H, m->eps, h + t * H);
        quantize_range(h, t, t + 1, H, a);
    }
    rows_done(S);
    timer(S->timing, 2, &me->mark);
    lin_team(&L->gu, a, T, S->gu, me->mw);
    timer(S->timing, 0, &me->mark);
    act_as(a, &L->down, S->Tp);
    for (int64_t t = me->r0; t < me->r1; t++) {
        fk_gated(S->gu + t * 2 * I, 1, I, h + t * I, m->act);
        quantize_range(h, t, t + 1, I, a);
    }
    rows_done(S);
    timer(S->timing, 2, &me->mark);
    lin_team(&L->down, a, T, big, me->mw);
    timer(S->timing, 0, &me->mark);
    if (next) act_as(a, &next->qkv, S->Tp);
    for (int64_t t = me->r0; t < me->r1; t++) {
        float *x = X + t * H, *y = big + t * H;
        if (L->norm_post_ff) { /* h: scratch */
            fk_rms_norm(y, L->norm_post_ff, 1, H, m->eps, h + t * H);
            y = h + t * H;
        }
        for (int64_t i = 0; i < H; i++) x[i] = x[i] + y[i];
        if (next) {
            fk_rms_norm(x, next->norm_in, 1, H, m->eps, h + t * H);
            quantize_range(h, t, t + 1, H, a);
        } else if (m->final_norm) {
            fk_rms_norm(x, m->final_norm, 1, H, m->eps, x);
        }
    }
    rows_done(S);
    timer(S->timing, 2, &me->mark);
}

/* The layers of one forward over X [T, hidden] (in place: the last layer's output).
 * Pieces seg[s] = (first row, rows, position of the first row), s < nseg; nseg == T: a decode
 * step (one token each, fk_attend's arithmetic), else prompt pieces (fk_attend_prompt's).
 * Piece s's block table: tables + s * tstride. kv: layer i's K and V caches at kv[2 i],
 * kv[2 i + 1]; rope tables cos[r], sin[r] [positions, hd] (row p: position p, a row for
 * every row's position) for a layer whose `rope` is r. timing:
 * NULL, or 3 doubles that get the seconds spent in the products, in attention (with RoPE
 * and the KV write) and in the rest (thread 0's view). 0; -1: a shape it does not take (a
 * part not in an integer format); -2: no memory. */
int fk_forward(const FkModel *m, const FkLayer *layers, int64_t nl, void *const *kv, float *X,
               int64_t T, int64_t nseg, const int64_t *seg, const int64_t *tables,
               int64_t tstride, const float *const *cos, const float *const *sin, int threads,
               double *timing) {
    if (!table_ready || T <= 0) return -1;
    const int64_t H = m->hidden, nq = m->nq, nkv = m->nkv, hd = m->hd, I = m->inter;
    const int64_t nqkv = (nq + 2 * nkv) * hd, group = nq / nkv;
    const int decode = nseg == T;
    int64_t kmax = H > nq * hd ? H : nq * hd;
    kmax = kmax > I ? kmax : I;
    for (int64_t i = 0; i < nl; i++) {
        const FkLin *lins[4] = {&layers[i].qkv, &layers[i].o, &layers[i].gu, &layers[i].down};
        for (int j = 0; j < 4; j++) {
            if (lins[j]->k % 32 || lins[j]->nparts < 1 || lins[j]->nparts > 3) return -1;
            for (int64_t p = 0; p < lins[j]->nparts; p++)
                if (!is_integer(lins[j]->part[p].type) ||
                    lins[j]->part[p].packed != lins[j]->part[0].packed ||
                    (lins[j]->part[p].packed && !HAVE_PACKED))
                    return -1;
        }
    }
    if (group > 64 || nq % nkv || (!decode && nseg > 64)) return -1;
    int64_t *lengths = (int64_t *)malloc((size_t)nseg * sizeof(int64_t));
    for (int64_t s = 0; lengths && s < nseg; s++) lengths[s] = seg[3 * s + 2] + 1;
    const int64_t Tp = (T + 7) / 8 * 8, nbmax = kmax / 32;
    float *h = (float *)malloc((size_t)(T * kmax) * sizeof(float));
    float *qkv = (float *)malloc((size_t)(T * nqkv) * sizeof(float));
    float *big = (float *)malloc((size_t)(T * (2 * I > H ? 2 * I : H)) * sizeof(float));
    Act8 a;
    int failed = act8_alloc(Tp, kmax, 0, 1, &a) != 0;
    int64_t spans = 1, longest = 1; /* decode: the most spans a row's keys are cut into under
                                       any layer's window (none, or a layer's own) */
    for (int64_t i = -1; decode && lengths && i < nl; i++) {
        if (i >= 0 && layers[i].window == 0) continue; /* counted at i = -1 */
        const int64_t most = att_most(T, lengths, i < 0 ? 0 : layers[i].window);
        spans = most > spans ? most : spans;
    }
    for (int64_t s = 0; decode && lengths && s < nseg; s++)
        longest = lengths[s] > longest ? lengths[s] : longest;
    const int64_t parts = decode ? att_parts(T, nq, hd, spans) : 0;
    float *part = parts ? (float *)malloc((size_t)parts * sizeof(float)) : NULL;
    /* a small decode step: every thread does the row-wise phases whole (a barrier fewer after
     * each, and no thread waits on another's activations) */
    const int own_rows = decode && threads > 1 && T * (I > H ? I : H) <= OWN_ROWS;
    float *gu = own_rows ? (float *)malloc((size_t)(T * 2 * I) * sizeof(float)) : big;
    failed = failed || !lengths || !h || !qkv || !big || !gu || (parts && !part);
    const int64_t own = 4 * nbmax + (decode ? att_scratch(group, hd, longest)
                                            : flash_scratch(group, hd));
    const FkStep S = {m, T, Tp, nseg, tstride, nqkv, spans, seg, tables, lengths, cos,
                      sin, X, h, qkv, big, gu, part, &a, decode, own_rows, timing};
    if (!failed) {
#pragma omp parallel num_threads(threads)
        {
            float *mine = (float *)malloc((size_t)own * sizeof(float));
            /* thread 0 works on the step's own rows; others, where own_rows, on copies */
            const int copies = own_rows && omp_get_thread_num() != 0;
            float *x = copies ? (float *)malloc((size_t)(T * H) * sizeof(float)) : X;
            float *hn = copies ? (float *)malloc((size_t)(T * kmax) * sizeof(float)) : h;
            Act8 pa = {0}, *ta = &a;
            if (copies && act8_alloc(Tp, kmax, 0, 1, &pa) == 0) ta = &pa;
            if (!mine || !x || !hn || (copies && ta == &a)) {
#pragma omp atomic write
                failed = 1;
            }
#pragma omp barrier
            if (!failed) {
                FkMine me = {0, 0, 0, T, mine, mine + 4 * nbmax, omp_get_wtime(), x, hn, ta};
                thread_share(T, &me.t0, &me.t1); /* this thread's rows for RoPE, the cache */
                if (!own_rows) {                 /* and the row-wise phases */
                    me.r0 = me.t0;
                    me.r1 = me.t1;
                }
                if (copies) memcpy(x, X, (size_t)(T * H) * sizeof(float));
                for (int64_t li = 0; li < nl; li++) {
                    const FkLayer *L = &layers[li];
                    if (li == 0) { /* the first norm; later ones end the layer before */
                        act_as(ta, &L->qkv, Tp);
                        for (int64_t t = me.r0; t < me.r1; t++) {
                            fk_rms_norm(x + t * H, L->norm_in, 1, H, m->eps, hn + t * H);
                            quantize_range(hn, t, t + 1, H, ta);
                        }
                        rows_done(&S);
                        timer(timing, 2, &me.mark);
                    }
                    layer_attention(&S, L, kv[2 * li], kv[2 * li + 1], &me);
                    layer_mlp(&S, L, li + 1 < nl ? &layers[li + 1] : NULL, &me);
                }
            }
            free(mine);
            if (copies) {
                free(x);
                free(hn);
                act8_free(&pa);
            }
        }
    }
    free(lengths);
    free(h);
    free(qkv);
    free(big);
    if (gu != big) free(gu);
    free(part);
    act8_free(&a);
    return failed ? -2 : 0;
}
