/* flm-serve's k-quant conversion at load: GGML k-quant super-blocks (256 values) into the
 * block formats the CPU kernels compute, across threads, straight from a memory-mapped file.
 *
 * Bit for bit what npu/engine/quant.py's numpy reference makes where the file's f16 factors
 * are finite (its docstrings describe the layouts; tests/npu/engine/test_convert.py compares
 * the two; an inf or NaN factor's block: a value NaN is passed over when a block's largest is
 * taken, where numpy's max would give NaN), with or without AVX2 (the same operations):
 *   Q4_K 12 -> Q4_1, Q5_K 13 -> Q5_1: the same codes; a sub-block of 32 values becomes one
 *     block whose f16 scale and offset are d * sc and -(dmin * m) (float32), rounded to f16.
 *     No value is computed. Stats: the largest error of that rounding (15 or 31 times the
 *     scale's plus the offset's) and the largest value a block can hold.
 *   Q2_K 10, Q3_K 11, Q6_K 14 -> Q8_0: the values as gguf's numpy dequantizer computes them
 *     (the same float32 operations in the same order), then Q8_0 as gguf's quantizer (and
 *     ggml's reference): d = max|v| / 127, q = round-half-away(v / d) via v * (1 / d).
 *     Stats: the largest |f16 d| and the largest |v|.
 * Built into the kernels' library (npu/engine/cpu_kernels.py). Floating point contraction
 * (a * b + c as one rounding) must stay off to match numpy: GCC with -std=c11 contracts
 * nothing; clang is told below.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#if defined(__F16C__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF /* clang contracts a * b + c by default; GCC with -std=c11 does not */
#endif

enum { C_Q4_1 = 3, C_Q5_1 = 7, C_Q8_0 = 8, C_Q2_K = 10, C_Q3_K = 11, C_Q4_K = 12,
       C_Q5_K = 13, C_Q6_K = 14 };

static float half_f(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, x;
    if (e == 0) {
        float v = ldexpf((float)m, -24); /* zero or subnormal: exact */
        return sign ? -v : v;
    }
    x = sign | (e == 31 ? 0x7f800000u | (m << 13) : ((e + 112) << 23) | (m << 13));
    float f;
    memcpy(&f, &x, 4);
    return f;
}

/* float -> f16, rounded to nearest even (numpy's astype(float16)), without F16C. */
uint16_t fc_half_soft(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return sign | 0x7e00u | (uint16_t)((ax >> 13) & 0x3ffu); /* NaN */
    if (ax >= 0x477ff000u) return sign | 0x7c00u; /* inf, and what rounds to it */
    if (ax >= 0x38800000u) { /* a normal f16: rebias the exponent, round the mantissa */
        uint32_t r = ax - 0x38000000u;
        r += 0xfffu + ((r >> 13) & 1u);
        return sign | (uint16_t)(r >> 13);
    }
    if (ax < 0x33000000u) return sign; /* below 2^-25 (2^-25 itself: a tie, to even 0) */
    uint32_t e = ax >> 23, m = (ax & 0x7fffffu) | 0x800000u, shift = 126 - e;
    uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return sign | (uint16_t)q;
}

static inline uint16_t to_half(float f) {
#ifdef __F16C__
    return _cvtss_sh(f, 0); /* round to nearest even, as numpy */
#else
    return fc_half_soft(f);
#endif
}

static inline float rd_half(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return half_f(h);
}

static inline void wr_half(uint8_t *p, float f) {
    uint16_t h = to_half(f);
    memcpy(p, &h, 2);
}

/* Q4_K / Q5_K: the 6-bit scale and min of sub-block j from the 12 packed bytes. */
static inline void scale_min(const uint8_t *s, int j, uint8_t *sc, uint8_t *mn) {
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (uint8_t)((s[j + 4] & 15) | ((s[j - 4] >> 6) << 4));
        *mn = (uint8_t)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    }
}

/* Sub-block j's codes into its Q4_1 / Q5_1 block o (after the f16 scale and offset). */
static inline void k_codes(const uint8_t *qh, const uint8_t *qs, int j, int five, uint8_t *o) {
    const int nib = five ? 8 : 4;
    if (five) { /* bit l of the u32: bit j of qh[l] */
        uint32_t bits = 0;
        for (int l = 0; l < 32; l++) bits |= (uint32_t)((qh[l] >> j) & 1u) << l;
        memcpy(o + 4, &bits, 4);
    }
    /* per 64 values, a = codes 0-15, c = 16-31: block 2g takes the low nibbles, 2g+1 the
     * high ones */
    const uint8_t *a = qs + (j / 2) * 32, *c = a + 16;
    for (int i = 0; i < 16; i++)
        o[nib + i] = (j & 1) ? (uint8_t)((a[i] >> 4) | (c[i] & 0xf0))
                             : (uint8_t)((a[i] & 15) | (c[i] << 4));
}

/* One Q4_K (five = 0) or Q5_K super-block into 8 Q4_1 / Q5_1 blocks. */
static void k_as_1(const uint8_t *b, uint8_t *out, int five, float *err, float *top) {
    const float d = rd_half(b), dmin = rd_half(b + 2), code = five ? 31.0f : 15.0f;
    const int block = five ? 24 : 20;
    const uint8_t *qh = b + 16, *qs = b + (five ? 48 : 16);
    for (int j = 0; j < 8; j++) {
        uint8_t sc, mn;
        scale_min(b + 4, j, &sc, &mn);
        const float scale = d * (float)sc, offset = -(dmin * (float)mn);
        uint8_t *o = out + j * block;
        uint16_t s16 = to_half(scale), o16 = to_half(offset);
        memcpy(o, &s16, 2);
        memcpy(o + 2, &o16, 2);
        const float e = code * fabsf(half_f(s16) - scale) + fabsf(half_f(o16) - offset);
        const float t = fmaxf(fabsf(offset), fabsf(offset + code * scale));
        if (e > *err) *err = e;
        if (t > *top) *top = t;
        k_codes(qh, qs, j, five, o);
    }
}

#if defined(__AVX2__) && defined(__F16C__)
/* k_as_1 with the 8 sub-blocks' scales, offsets and stats in the 8 lanes of a vector: the
 * same operations on each (no contraction), so the same bytes and stats; fmaxf's choice of
 * the number where one side is NaN kept. About twice as fast (a load's CPU time). */
static void k_as_1_x8(const uint8_t *b, uint8_t *out, int five, float *err, float *top) {
    const float d = rd_half(b), dmin = rd_half(b + 2), code = five ? 31.0f : 15.0f;
    const int block = five ? 24 : 20;
    const uint8_t *qh = b + 16, *qs = b + (five ? 48 : 16);
    uint8_t sc[8], mn[8];
    for (int j = 0; j < 8; j++) scale_min(b + 4, j, sc + j, mn + j);
    const __m256 sign = _mm256_set1_ps(-0.0f), vcode = _mm256_set1_ps(code);
    const __m256 fsc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)sc)));
    const __m256 fmn = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)mn)));
    const __m256 scale = _mm256_mul_ps(_mm256_set1_ps(d), fsc);
    const __m256 offset = _mm256_xor_ps(_mm256_mul_ps(_mm256_set1_ps(dmin), fmn), sign);
    const __m128i s16 = _mm256_cvtps_ph(scale, 0), o16 = _mm256_cvtps_ph(offset, 0);
    const __m256 e = _mm256_add_ps(
        _mm256_mul_ps(vcode, _mm256_andnot_ps(sign, _mm256_sub_ps(_mm256_cvtph_ps(s16), scale))),
        _mm256_andnot_ps(sign, _mm256_sub_ps(_mm256_cvtph_ps(o16), offset)));
    const __m256 a = _mm256_andnot_ps(sign, offset);
    const __m256 c = _mm256_andnot_ps(sign, _mm256_add_ps(offset, _mm256_mul_ps(vcode, scale)));
    /* fmaxf(a, c): max_ps gives its second operand where either is NaN */
    const __m256 t = _mm256_blendv_ps(_mm256_max_ps(a, c), _mm256_max_ps(c, a),
                                      _mm256_cmp_ps(c, c, _CMP_UNORD_Q));
    float es[8], ts[8];
    uint16_t ss[8], os[8];
    _mm256_storeu_ps(es, e);
    _mm256_storeu_ps(ts, t);
    _mm_storeu_si128((__m128i *)ss, s16);
    _mm_storeu_si128((__m128i *)os, o16);
    float em = *err, tm = *top;
    for (int j = 0; j < 8; j++) {
        uint8_t *o = out + j * block;
        memcpy(o, ss + j, 2);
        memcpy(o + 2, os + j, 2);
        if (es[j] > em) em = es[j];
        if (ts[j] > tm) tm = ts[j];
        k_codes(qh, qs, j, five, o);
    }
    *err = em;
    *top = tm;
}
#define K_AS_1 k_as_1_x8
#else
#define K_AS_1 k_as_1
#endif

/* One Q2_K / Q3_K / Q6_K super-block's 256 values, as gguf's numpy dequantizer: each a
 * float32 product of its 16-value group's factor and its integer code (Q2_K: less the
 * group's min). The codes are unpacked first (loops the compiler vectorizes). */
static void k_values(int type, const uint8_t *b, float *v) {
    int8_t q[256];
    float dl[16], ml[16];
    if (type == C_Q6_K) { /* ql[128] qh[64] int8 scales[16] f16 d */
        const uint8_t *ql = b, *qh = b + 128;
        const int8_t *sc = (const int8_t *)(b + 192);
        const float d = rd_half(b + 208);
        for (int k = 0; k < 16; k++) dl[k] = d * (float)sc[k];
        for (int half = 0; half < 2; half++)
            for (int s = 0; s < 4; s++) /* values half * 128 + s * 32 + i */
                for (int i = 0; i < 32; i++) {
                    const int lo = (ql[half * 64 + (s & 1) * 32 + i] >> (4 * (s >> 1))) & 15;
                    const int hi = (qh[half * 32 + i] >> (2 * s)) & 3;
                    q[half * 128 + s * 32 + i] = (int8_t)((lo | (hi << 4)) - 32);
                }
    } else if (type == C_Q2_K) { /* scales[16] qs[64] f16 d f16 dmin */
        const uint8_t *sc = b, *qs = b + 16;
        const float d = rd_half(b + 80), dmin = rd_half(b + 82);
        for (int k = 0; k < 16; k++) {
            dl[k] = d * (float)(sc[k] & 15);
            ml[k] = dmin * (float)(sc[k] >> 4);
        }
        for (int half = 0; half < 2; half++)
            for (int s = 0; s < 4; s++)
                for (int i = 0; i < 32; i++)
                    q[half * 128 + s * 32 + i] = (int8_t)((qs[half * 32 + i] >> (2 * s)) & 3);
#ifdef __AVX2__
        for (int k = 0; k < 16; k++) { /* a group's 16 values: the same product, less its min */
            const __m256 f = _mm256_set1_ps(dl[k]), m = _mm256_set1_ps(ml[k]);
            const __m128i c = _mm_loadu_si128((const __m128i *)(q + 16 * k));
            const __m256 c0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(c));
            const __m256 c1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(c, 8)));
            _mm256_storeu_ps(v + 16 * k, _mm256_sub_ps(_mm256_mul_ps(f, c0), m));
            _mm256_storeu_ps(v + 16 * k + 8, _mm256_sub_ps(_mm256_mul_ps(f, c1), m));
        }
#else
        for (int p = 0; p < 256; p++) v[p] = dl[p >> 4] * (float)q[p] - ml[p >> 4];
#endif
        return;
    } else { /* Q3_K: hmask[32] qs[64] scales[12] f16 d */
        const uint8_t *hm = b, *qs = b + 32, *s8 = b + 96;
        const float d = rd_half(b + 108);
        for (int k = 0; k < 16; k++) {
            const int l = (s8[k % 8] >> (4 * (k / 8))) & 15, h = (s8[8 + k % 4] >> (2 * (k / 4))) & 3;
            dl[k] = d * (float)((l | (h << 4)) - 32);
        }
        for (int half = 0; half < 2; half++)
            for (int s = 0; s < 4; s++)
                for (int i = 0; i < 32; i++) {
                    const int lo = (qs[half * 32 + i] >> (2 * s)) & 3;
                    const int hb = ((hm[i] >> (half * 4 + s)) & 1) ^ 1;
                    q[half * 128 + s * 32 + i] = (int8_t)(lo - (hb << 2));
                }
    }
#ifdef __AVX2__
    for (int k = 0; k < 16; k++) { /* a group's 16 values at a time: the same products */
        const __m256 f = _mm256_set1_ps(dl[k]);
        const __m128i c = _mm_loadu_si128((const __m128i *)(q + 16 * k));
        _mm256_storeu_ps(v + 16 * k, _mm256_mul_ps(f, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(c))));
        _mm256_storeu_ps(v + 16 * k + 8, _mm256_mul_ps(f, _mm256_cvtepi32_ps(
                                                          _mm256_cvtepi8_epi32(_mm_srli_si128(c, 8)))));
    }
#else
    for (int p = 0; p < 256; p++) v[p] = dl[p >> 4] * (float)q[p];
#endif
}

/* 256 values as 8 Q8_0 blocks (272 bytes), as gguf's (and ggml's reference) quantizer. */
static void q8_0_of(const float *v, uint8_t *out, float *steps, float *top) {
    for (int k = 0; k < 8; k++) {
        const float *x = v + 32 * k;
        uint8_t *o = out + 34 * k;
        float amax = 0.0f;
        int8_t c[32];
#ifdef __AVX2__
        const __m256 sign = _mm256_set1_ps(-0.0f);
        __m256 m = _mm256_setzero_ps();
        /* max_ps gives its second operand where either is NaN: a NaN value is passed over,
         * as the loop's comparisons below pass it over, and m is never NaN */
        for (int i = 0; i < 32; i += 8) m = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)), m);
        /* the lanes' largest (none NaN, each at least 0: any order gives the loop's) */
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_movehdup_ps(h));
        amax = _mm_cvtss_f32(h);
#else
        for (int i = 0; i < 32; i++) {
            const float a = fabsf(x[i]);
            amax = a > amax ? a : amax;
        }
#endif
        const float d = amax / 127.0f, id = d == 0.0f ? 0.0f : 1.0f / d;
        uint16_t d16 = to_half(d);
        memcpy(o, &d16, 2);
        /* numpy's np_roundf (half away from zero), exactly: |y|'s floor f, plus 1 where
         * 2 (|y| - f) reaches 1, y's sign put back */
#ifdef __AVX2__
        __m256i w[4];
        const __m256 vid = _mm256_set1_ps(id);
        for (int i = 0; i < 32; i += 8) {
            const __m256 y = _mm256_mul_ps(_mm256_loadu_ps(x + i), vid);
            const __m256 a = _mm256_andnot_ps(sign, y);
            const __m256 f = _mm256_floor_ps(a);
            const __m256 r = _mm256_add_ps(f, _mm256_floor_ps(_mm256_add_ps(_mm256_sub_ps(a, f),
                                                                              _mm256_sub_ps(a, f))));
            const __m256 signed_r = _mm256_xor_ps(r, _mm256_and_ps(sign, y));
            w[i / 8] = _mm256_cvttps_epi32(signed_r);
        }
        /* each int32's low byte (the cast to int8_t), not a saturating pack */
        const __m256i low = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                             0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
        for (int g = 0; g < 4; g++) {
            const __m256i b = _mm256_shuffle_epi8(w[g], low);
            const int32_t l0 = _mm256_extract_epi32(b, 0), l1 = _mm256_extract_epi32(b, 4);
            memcpy(c + 8 * g, &l0, 4);
            memcpy(c + 8 * g + 4, &l1, 4);
        }
#else
        for (int i = 0; i < 32; i++) {
            const float y = x[i] * id, a = fabsf(y), f = floorf(a);
            const float r = f + floorf(2.0f * (a - f));
            c[i] = (int8_t)(int)(y < 0.0f ? -r : r);
        }
#endif
        memcpy(o + 2, c, 32);
        const float s = fabsf(half_f(d16));
        if (s > *steps) *steps = s;
        if (amax > *top) *top = amax;
    }
}

/* Bytes one super-block of `type` becomes; -1: not a type converted here. */
int64_t fc_out_bytes(int type) {
    switch (type) {
    case C_Q4_K: return 8 * 20;
    case C_Q5_K: return 8 * 24;
    case C_Q2_K: case C_Q3_K: case C_Q6_K: return 8 * 34;
    default: return -1;
    }
}

/* The format `type` is converted to (-1: none). */
int fc_target(int type) {
    return type == C_Q4_K ? C_Q4_1 : type == C_Q5_K ? C_Q5_1 : fc_out_bytes(type) > 0 ? C_Q8_0 : -1;
}

static int64_t in_bytes(int type) {
    switch (type) {
    case C_Q2_K: return 84;
    case C_Q3_K: return 110;
    case C_Q4_K: return 144;
    case C_Q5_K: return 176;
    case C_Q6_K: return 210;
    default: return -1;
    }
}

/* The kernels' packed layout (cpu_kernels.c, the same library): its rows per group, and
 * one group's rows packed. */
int fk_packed_rows(void);
int fk_pack_group(int type, const uint8_t *rows, int64_t K, uint8_t *G);

/* A conversion shared by threads: each takes a unit of rows at a time (CHUNK super-blocks'
 * worth, or a packed group's rows; a thread the system runs late holds up at most one) and
 * keeps its own maxima. */
#define CHUNK 64
typedef struct {
    int type;
    const uint8_t *src;
    uint8_t *dst;
    int64_t rows, sb, isz, osz; /* rows of sb super-blocks; bytes a super-block in, out */
    const int64_t *order;       /* row r of dst is row order[r] of src (NULL: r) */
    int64_t unit;               /* rows a unit */
    int packed;                 /* dst in the kernels' packed layout, a unit a group */
    atomic_llong next;
} Job;

typedef struct {
    Job *job;
    float s0, s1;
    int failed;
} Part;

static void convert_row(const Job *job, int64_t r, uint8_t *out, float *s0, float *s1) {
    const int same = job->type == C_Q4_K || job->type == C_Q5_K, five = job->type == C_Q5_K;
    const uint8_t *in = job->src + (job->order ? job->order[r] : r) * job->sb * job->isz;
    float v[256];
    for (int64_t i = 0; i < job->sb; i++) {
        if (same) {
            K_AS_1(in + i * job->isz, out + i * job->osz, five, s0, s1);
        } else {
            k_values(job->type, in + i * job->isz, v);
            q8_0_of(v, out + i * job->osz, s0, s1);
        }
    }
}

static void *run_part(void *arg) {
    Part *part = (Part *)arg;
    Job *job = part->job;
    const int64_t orow = job->sb * job->osz;
    float s0 = 0.0f, s1 = 0.0f;
    uint8_t *aside = job->packed ? malloc((size_t)(job->unit * orow)) : NULL;
    if (job->packed && !aside) {
        part->failed = 1;
        return NULL;
    }
    for (;;) {
        const int64_t first = atomic_fetch_add(&job->next, job->unit);
        if (first >= job->rows) break;
        const int64_t last = first + job->unit < job->rows ? first + job->unit : job->rows;
        for (int64_t r = first; r < last; r++)
            convert_row(job, r, aside ? aside + (r - first) * orow : job->dst + r * orow, &s0, &s1);
        /* a group's rows converted, still in cache: packed where they go */
        if (aside && fk_pack_group(fc_target(job->type), aside, job->sb * 256, job->dst + first * orow))
            part->failed = 1;
    }
    free(aside);
    part->s0 = s0;
    part->s1 = s1;
    return NULL;
}

#define MAX_THREADS 256

/* `rows` rows of `cols` values (a multiple of 256) in super-blocks of `type` at `src` into
 * `dst` (rows * cols / 256 * fc_out_bytes(type) bytes), row r of dst from row order[r] of
 * src (order NULL: row r); `packed`: dst in the kernels' packed layout (rows a multiple of
 * fk_packed_rows(): its bytes are the rows' own, reordered), each group packed as soon as
 * it is converted. On `threads` threads (plain threads that sleep when done: no OpenMP pool
 * left spinning between tensors); stats[0], stats[1]: the maxima named at the top. 0; -1
 * for a type not converted here, -2 for a layout this build cannot pack, -3 out of memory. */
int fc_convert_rows(int type, const uint8_t *src, int64_t rows, int64_t cols,
                    const int64_t *order, uint8_t *dst, int packed, int threads, float *stats) {
    const int64_t isz = in_bytes(type), osz = fc_out_bytes(type);
    if (isz < 0 || osz < 0 || cols % 256) return -1;
    const int64_t sb = cols / 256, xr = packed ? fk_packed_rows() : 0;
    if (packed && (xr <= 0 || rows % xr)) return -2;
    const int64_t unit = packed ? xr : (sb >= CHUNK ? 1 : CHUNK / (sb ? sb : 1));
    Job job = {type, src, dst, rows, sb, isz, osz, order, unit, packed, 0};
    Part parts[MAX_THREADS];
    pthread_t ids[MAX_THREADS];
    int started = 0;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    if (threads > (rows + unit - 1) / unit) threads = (int)((rows + unit - 1) / unit);
    if (threads < 1) threads = 1;
    for (int t = 0; t < threads; t++) parts[t] = (Part){&job, 0.0f, 0.0f, 0};
    for (int t = 1; t < threads; t++)
        if (pthread_create(&ids[t], NULL, run_part, &parts[t]) == 0) started = t;
        else break; /* fewer threads: the work is shared by those there are */
    run_part(&parts[0]);
    for (int t = 1; t <= started; t++) pthread_join(ids[t], NULL);
    float s0 = 0.0f, s1 = 0.0f;
    int failed = 0;
    for (int t = 0; t <= started; t++) {
        s0 = parts[t].s0 > s0 ? parts[t].s0 : s0;
        s1 = parts[t].s1 > s1 ? parts[t].s1 : s1;
        failed |= parts[t].failed;
    }
    stats[0] = s0;
    stats[1] = s1;
    return failed ? -3 : 0;
}

/* f16 of n floats by the software rounding (tests compare it with numpy's). */
void fc_half_soft_n(const float *x, int64_t n, uint16_t *out) {
    for (int64_t i = 0; i < n; i++) out[i] = fc_half_soft(x[i]);
}

/* A GGUF header's run of `count` strings (each a little-endian u64 length, then its bytes)
 * from buf[at], copied to `out` one after another, a NUL after each but the last (room:
 * len - at bytes); *written: the bytes written. Returns the offset after the last string,
 * or -1 where they run past `len` (npu/load/gguf_header.py: a tokenizer's 50-250k tokens
 * and merges, a Python loop of 30-40 ms). */
int64_t fc_strings_joined(const uint8_t *buf, int64_t len, int64_t at, int64_t count,
                          uint8_t *out, int64_t *written) {
    int64_t w = 0;
    for (int64_t i = 0; i < count; i++) {
        uint64_t n;
        if (at < 0 || len - at < 8) return -1;
        memcpy(&n, buf + at, 8); /* x86 and ARM Linux are little-endian, as GGUF is */
        if (n > (uint64_t)(len - at - 8)) return -1;
        if (i) out[w++] = 0;
        memcpy(out + w, buf + at + 8, (size_t)n);
        w += (int64_t)n;
        at += 8 + (int64_t)n;
    }
    *written = w;
    return at;
}
