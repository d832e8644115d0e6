/* Linear layers straight on a GGUF file's quantised blocks: y = x W^T with W kept as Q4_1 or Q8_0.
 *
 * Built at first use by engine/models/gguf_kernel.py (cc -O3 -march=native -fopenmp) and called
 * through ctypes. AVX2 with FMA where the CPU has it (x86 since 2013-2015; an AVX-512 CPU runs the
 * AVX2 code); elsewhere plain C doing the same arithmetic, left to the compiler to vectorise.
 *
 * Exactness: each weight is formed in a float32 register as the GGUF format defines it,
 *   Q4_1: w = d * q + m   (q = 4-bit unsigned, d and m the block's float16 scale and minimum)
 *   Q8_0: w = d * q       (q = 8-bit signed, d the block's float16 scale)
 * with d and m widened to float32 exactly. d * q is exact in float32 (11 x 8 significant bits at
 * most), so w is d * q + m rounded once, which is what the gguf package's dequantisation (and so
 * transformers' float32 copy of the model) stores. Activations and sums stay float32; only the
 * order of the sums differs from a dense float32 product.
 *
 * Layout, as in the file: row n of W (one output feature) is K / 32 consecutive blocks.
 *   Q4_1 block, 20 bytes: d (f16), m (f16), qs[16]; weight j is qs[j] & 15, weight j + 16 is qs[j] >> 4.
 *   Q8_0 block, 34 bytes: d (f16), qs[32] (int8).
 * x is (M, K) float32 row-major, y is (M, N) float32 row-major.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Rows of x sharing one dequantised block: a verify over up to 9 positions (K = 8) forms each
   weight once. 9 sums and 4 weights fit AVX2's 16 registers. */
#define ROWS 9
/* Columns of W beside one row of x (a decode step): COLS independent chains of multiply-adds.
   4 was fastest on a 2-core AMD EPYC (2 and 8 slower), timed by bench/int4_stream.c. */
#define COLS 4
/* How far ahead of the block being read to ask for memory: a tile walks its COLS rows of W side by
   side, 20 bytes of each at a time, which the hardware prefetcher follows too late. Asking 2 KiB
   ahead of the stream took the chat target's Q8_0 output layer (30 MB, streamed from memory every
   step) from 3.1 to 0.9 ms on the same EPYC (bench/int4_stream.c); 1-8 KiB all did
   about as well. Prefetching changes no result. */
#define PREFETCH_BYTES 2048

#if defined(__F16C__)
#include <immintrin.h>
static inline float f16_to_f32(uint16_t h) { return _cvtsh_ss(h); }  /* exact, one instruction */
#else
static float f16_to_f32(uint16_t h) {
    /* Exact: the exponent and mantissa bits moved into float32 positions, then rescaled by 2^112
       (a power of two, so exact; fp16 subnormals land on float32 normals). */
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, rest = (uint32_t)(h & 0x7fff) << 13;
    float f;
    if ((h & 0x7c00) == 0x7c00) {
        rest |= 0x7f800000;  /* inf or nan */
        memcpy(&f, &rest, 4);
    } else {
        memcpy(&f, &rest, 4);
        f *= 0x1p112f;
    }
    uint32_t bits;
    memcpy(&bits, &f, 4);
    bits |= sign;
    memcpy(&f, &bits, 4);
    return f;
}
#endif

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

/* 8 floats, one AVX2 register (an AVX-512 CPU runs these too). */
typedef __m256 vec8;
static inline vec8 v_zero(void) { return _mm256_setzero_ps(); }
static inline vec8 v_load(const float *p) { return _mm256_loadu_ps(p); }
static inline vec8 v_fma(vec8 a, vec8 b, vec8 c) { return _mm256_fmadd_ps(a, b, c); }
static inline vec8 v_add(vec8 a, vec8 b) { return _mm256_add_ps(a, b); }

static inline float v_sum(vec8 v) {
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    return _mm_cvtss_f32(_mm_add_ss(a, _mm_movehdup_ps(a)));
}

/* The 32 weights of one block as four vectors of 8, in order. */
static inline void q4_1_block(const uint8_t *blk, vec8 w[4]) {
    uint16_t dh, mh;
    memcpy(&dh, blk, 2);
    memcpy(&mh, blk + 2, 2);
    vec8 d = _mm256_set1_ps(f16_to_f32(dh)), m = _mm256_set1_ps(f16_to_f32(mh));
    /* bytes 0..7 and 8..15 widened to 32-bit lanes straight from memory: the low nibbles are
       weights 0..15 and the high ones 16..31, so a mask and a shift finish them without shuffles */
    __m256i q0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 4)));
    __m256i q1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 12)));
    __m256i mask = _mm256_set1_epi32(15);
    /* q * d is exact in float32, so the multiply-add rounds once: w = fl(d * q + m). */
    w[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(q0, mask)), d, m);
    w[1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(q1, mask)), d, m);
    w[2] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(q0, 4)), d, m);
    w[3] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(q1, 4)), d, m);
}

static inline void q8_0_block(const uint8_t *blk, vec8 w[4]) {
    uint16_t dh;
    memcpy(&dh, blk, 2);
    vec8 d = _mm256_set1_ps(f16_to_f32(dh));
    for (int i = 0; i < 4; i++) {
        __m128i q = _mm_loadl_epi64((const __m128i *)(blk + 2 + 8 * i));
        w[i] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d);
    }
}

#else  /* any other CPU: the same arithmetic, 8 lanes in a plain struct the compiler may vectorise */

typedef struct { float v[8]; } vec8;
static inline vec8 v_zero(void) { vec8 r = {{0}}; return r; }
static inline vec8 v_load(const float *p) { vec8 r; memcpy(r.v, p, sizeof r.v); return r; }
static inline vec8 v_fma(vec8 a, vec8 b, vec8 c) { for (int i = 0; i < 8; i++) c.v[i] += a.v[i] * b.v[i]; return c; }
static inline vec8 v_add(vec8 a, vec8 b) { for (int i = 0; i < 8; i++) a.v[i] += b.v[i]; return a; }
static inline float v_sum(vec8 v) {
    return ((v.v[0] + v.v[4]) + (v.v[2] + v.v[6])) + ((v.v[1] + v.v[5]) + (v.v[3] + v.v[7]));
}

static inline void q4_1_block(const uint8_t *blk, vec8 w[4]) {
    uint16_t dh, mh;
    memcpy(&dh, blk, 2);
    memcpy(&mh, blk + 2, 2);
    float d = f16_to_f32(dh), m = f16_to_f32(mh);
    for (int j = 0; j < 16; j++) {
        w[j / 8].v[j % 8] = (float)(blk[4 + j] & 15) * d + m;
        w[2 + j / 8].v[j % 8] = (float)(blk[4 + j] >> 4) * d + m;
    }
}

static inline void q8_0_block(const uint8_t *blk, vec8 w[4]) {
    uint16_t dh;
    memcpy(&dh, blk, 2);
    float d = f16_to_f32(dh);
    for (int j = 0; j < 32; j++) w[j / 8].v[j % 8] = (float)(int8_t)blk[2 + j] * d;
}
#endif

/* y[r, n + c] for `rows` (1..ROWS) rows of x and `cols` (1..COLS) rows of W. Every output is one
   chain of multiply-adds in the same order, whatever `rows` and `cols` are: a row's result never
   depends on how many rows came with it (a verify over K+1 positions and a one-token step give
   the same logits for the same position, as far as the linear layers go). Why several columns:
   one output's chain waits on each multiply-add before the next (4 cycles each on current x86),
   so a single row of x runs COLS independent chains side by side to keep the FMA units busy. */
static inline __attribute__((always_inline)) void dot_tile(
        int kind, int rows, int cols, const float *x, int64_t K, const uint8_t *wrow, int64_t row_bytes,
        float *y, int64_t N) {
    int64_t block_bytes = kind == 0 ? 20 : 34;
    vec8 acc[ROWS][COLS];
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) acc[r][c] = v_zero();
    for (int64_t b = 0; b < K / 32; b++) {
        for (int c = 0; c < cols; c++) {
            vec8 w[4];
            const uint8_t *blk = wrow + c * row_bytes + b * block_bytes;
            /* the tile's bytes are a contiguous span; this sweeps the span PREFETCH_BYTES further on
               at the rate the tile reads its own (a prefetch past the end is harmless) */
            __builtin_prefetch(wrow + PREFETCH_BYTES + (b * cols + c) * block_bytes);
            if (kind == 0) q4_1_block(blk, w);
            else q8_0_block(blk, w);
            for (int r = 0; r < rows; r++) {
                const float *xb = x + r * K + b * 32;
                vec8 a = acc[r][c];
                for (int i = 0; i < 4; i++) a = v_fma(v_load(xb + 8 * i), w[i], a);
                acc[r][c] = a;
            }
        }
    }
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) y[r * N + c] = v_sum(acc[r][c]);
}

/* ---------------------------------------------------------------- 8-bit activations (opt-in)
 *
 * The same blocks times activations rounded to 8 bits per block of 32, as llama.cpp multiplies them: the
 * products become integer instructions (32 at a time on AVX2), where the float32 path above forms every
 * weight as a float first. This changes the numbers: each activation x is replaced by d_x * q_x with
 *   d_x = max |x over its block| / 127,  q_x = x * (127 / max |x|) rounded to the nearest integer (ties to
 *   even), so |q_x| <= 127,
 * kept per row and per block, d_x in float32 (llama.cpp stores it in float16). A block's dot product is then
 *   Q4_1: d_w * d_x * sum(q_w * q_x) + m_w * (d_x * sum(q_x))
 *   Q8_0: d_w * d_x * sum(q_w * q_x)
 * with the integer sums exact: a block's 8 partial sums (4 products each) are scaled by d_x, then multiplied by d_w
 * and added to the output's 8 running sums, summed at the end, the minimum's terms summed beside them. A row is
 * quantised alone and every output is one fixed sequence of float32 operations, so a row's result still ignores
 * which rows came with it and how many threads ran.
 */

/* Row r's block b: q[r * K + 32 * b ..] (int8), d[r * K / 32 + b] and s[...] = d * sum(q) (float32). */
static void quantize_rows(const float *x, int64_t M, int64_t K, int8_t *q, float *d, float *s) {
    for (int64_t i = 0; i < M * K / 32; i++) {
        const float *xb = x + 32 * i;
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(xb[j]));
        float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
        int sum = 0;
        for (int j = 0; j < 32; j++) {
            int v = (int)nearbyintf(xb[j] * inv);
            v = v > 127 ? 127 : v < -127 ? -127 : v;
            q[32 * i + j] = (int8_t)v;
            sum += v;
        }
        d[i] = amax / 127.0f;
        s[i] = d[i] * (float)sum;
    }
}

#if defined(__AVX2__) && defined(__FMA__)
/* A block's 32 integer products summed in 8 lanes of 4 (lane l holds positions 4l..4l+3), as float. */
static inline vec8 i8_lanes(__m256i w_unsigned, __m256i x_signed) {
    __m256i pairs = _mm256_maddubs_epi16(w_unsigned, x_signed);  /* at most 2 * 128 * 127: no saturation */
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}
static inline __m256i q4_1_nibbles(const uint8_t *blk) {
    __m128i packed = _mm_loadu_si128((const __m128i *)(blk + 4));  /* low nibbles: weights 0..15, high: 16..31 */
    __m256i both = _mm256_set_m128i(_mm_srli_epi16(packed, 4), packed);
    return _mm256_and_si256(both, _mm256_set1_epi8(15));
}
static inline vec8 q4_1_lanes(__m256i w, const int8_t *xq) {
    return i8_lanes(w, _mm256_loadu_si256((const __m256i *)xq));
}
static inline __m256i q8_0_signed(const uint8_t *blk) { return _mm256_loadu_si256((const __m256i *)(blk + 2)); }
static inline vec8 q8_0_lanes(__m256i w, const int8_t *xq) {
    __m256i x = _mm256_loadu_si256((const __m256i *)xq);
    return i8_lanes(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));  /* |w| * (x with w's sign) = w * x */
}
static inline vec8 v_set1(float a) { return _mm256_set1_ps(a); }
static inline vec8 v_mul(vec8 a, vec8 b) { return _mm256_mul_ps(a, b); }
typedef __m256i wvec;
#else
typedef struct { uint8_t b[32]; } wvec;
static inline wvec q4_1_nibbles(const uint8_t *blk) {
    wvec w;
    for (int j = 0; j < 16; j++) { w.b[j] = blk[4 + j] & 15; w.b[16 + j] = blk[4 + j] >> 4; }
    return w;
}
static inline wvec q8_0_signed(const uint8_t *blk) { wvec w; memcpy(w.b, blk + 2, 32); return w; }
static inline vec8 q4_1_lanes(wvec w, const int8_t *xq) {
    vec8 r;
    for (int l = 0; l < 8; l++) {
        int sum = 0;
        for (int j = 4 * l; j < 4 * l + 4; j++) sum += (int)w.b[j] * xq[j];
        r.v[l] = (float)sum;
    }
    return r;
}
static inline vec8 q8_0_lanes(wvec w, const int8_t *xq) {
    vec8 r;
    for (int l = 0; l < 8; l++) {
        int sum = 0;
        for (int j = 4 * l; j < 4 * l + 4; j++) sum += (int)(int8_t)w.b[j] * xq[j];
        r.v[l] = (float)sum;
    }
    return r;
}
static inline vec8 v_set1(float a) { vec8 r; for (int i = 0; i < 8; i++) r.v[i] = a; return r; }
static inline vec8 v_mul(vec8 a, vec8 b) { for (int i = 0; i < 8; i++) a.v[i] *= b.v[i]; return a; }
#endif

/* As dot_tile, on quantised rows: every output is one chain of per-block multiply-adds in block order, the
   Q4_1 minimum's term summed beside it, whatever `rows` and `cols` are. */
static inline __attribute__((always_inline)) void dot_tile_i8(
        int kind, int rows, int cols, const int8_t *xq, const float *xd, const float *xs, int64_t K,
        const uint8_t *wrow, int64_t row_bytes, float *y, int64_t N) {
    int64_t block_bytes = kind == 0 ? 20 : 34;
    vec8 acc[ROWS][COLS];
    float macc[ROWS][COLS];
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) { acc[r][c] = v_zero(); macc[r][c] = 0.0f; }
    for (int64_t b = 0; b < K / 32; b++) {
        for (int c = 0; c < cols; c++) {
            const uint8_t *blk = wrow + c * row_bytes + b * block_bytes;
            __builtin_prefetch(wrow + PREFETCH_BYTES + (b * cols + c) * block_bytes);
            uint16_t dh, mh;
            memcpy(&dh, blk, 2);
            float dw = f16_to_f32(dh), mw = 0.0f;
            vec8 dwv = v_set1(dw);
            wvec w;
            if (kind == 0) {
                memcpy(&mh, blk + 2, 2);
                mw = f16_to_f32(mh);
                w = q4_1_nibbles(blk);
            } else {
                w = q8_0_signed(blk);
            }
            for (int r = 0; r < rows; r++) {
                const int8_t *xb = xq + r * K + b * 32;
                int64_t at = r * (K / 32) + b;
                vec8 lanes = kind == 0 ? q4_1_lanes(w, xb) : q8_0_lanes(w, xb);
                acc[r][c] = v_fma(v_mul(lanes, v_set1(xd[at])), dwv, acc[r][c]);  /* (isum * d_x) * d_w */
                if (kind == 0) macc[r][c] = fmaf(mw, xs[at], macc[r][c]);
            }
        }
    }
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) y[r * N + c] = v_sum(acc[r][c]) + macc[r][c];
}

#define TILE(R, C) dot_tile(kind, R, C, xr, K, wrow, row_bytes, yr, N)
#define TILE_I8(R, C) dot_tile_i8(kind, R, C, xq, xd, xs, K, wrow, row_bytes, yr, N)

/* `rows` rows of x (1..ROWS) against `cols` rows of W; constant counts let the compiler keep the
   sums in registers. The shapes: one row with COLS columns (a decode step), 2-3 rows with 2
   (sums and weights still fit the registers), 4-9 rows with 1 (the rows are the independent chains). */
#define DISPATCH_TILES(T)                                   \
    if (cols == COLS) { T(1, COLS); return; }               \
    if (cols == 2) {                                        \
        switch (rows) {                                     \
            case 3: T(3, 2); break;                         \
            case 2: T(2, 2); break;                         \
            default: T(1, 2); break;                        \
        }                                                   \
        return;                                             \
    }                                                       \
    switch (rows) {                                         \
        case 9: T(9, 1); break;                             \
        case 8: T(8, 1); break;                             \
        case 7: T(7, 1); break;                             \
        case 6: T(6, 1); break;                             \
        case 5: T(5, 1); break;                             \
        case 4: T(4, 1); break;                             \
        case 3: T(3, 1); break;                             \
        case 2: T(2, 1); break;                             \
        default: T(1, 1); break;                            \
    }

static inline __attribute__((always_inline)) void tile(
        int kind, int64_t rows, int cols, const float *xr, int64_t K, const uint8_t *wrow, int64_t row_bytes,
        float *yr, int64_t N) {
    DISPATCH_TILES(TILE)
}

/* The tile shape for `rows` rows at column n of a group ending at n_end (the group's last columns may be fewer). */
static inline int tile_cols(int64_t rows, int64_t n, int64_t n_end) {
    int cols = rows == 1 ? COLS : rows <= 3 ? 2 : 1;
    while (cols > 1 && n + cols > n_end) cols = cols == COLS ? 2 : 1;
    return cols;
}

static inline __attribute__((always_inline)) void linear(int kind, const float *x, int64_t M, int64_t K, const uint8_t *w, int64_t N,
                   float *y, int threads) {
    int64_t row_bytes = K / 32 * (kind == 0 ? 20 : 34);
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t group = 0; group < (N + COLS - 1) / COLS; group++) {
        int64_t n0 = COLS * group, n_end = n0 + COLS < N ? n0 + COLS : N;
        for (int64_t r = 0; r < M; r += ROWS) {
            int64_t rows = M - r < ROWS ? M - r : ROWS;
            for (int64_t n = n0; n < n_end;) {
                int cols = tile_cols(rows, n, n_end);
                tile(kind, rows, cols, x + r * K, K, w + n * row_bytes, row_bytes, y + r * N + n, N);
                n += cols;
            }
        }
    }
}

void speclab_q4_1_linear(const float *x, int64_t M, int64_t K, const uint8_t *w, int64_t N, float *y, int threads) {
    linear(0, x, M, K, w, N, y, threads);
}

void speclab_q8_0_linear(const float *x, int64_t M, int64_t K, const uint8_t *w, int64_t N, float *y, int threads) {
    linear(1, x, M, K, w, N, y, threads);
}

static inline __attribute__((always_inline)) void tile_i8(
        int kind, int64_t rows, int cols, const int8_t *xq, const float *xd, const float *xs, int64_t K,
        const uint8_t *wrow, int64_t row_bytes, float *yr, int64_t N) {
    DISPATCH_TILES(TILE_I8)
}

/* The activations quantised once per call (M * K bytes and two floats per block), then the same walk as
   `linear`. Returns 0, or -1 where the scratch memory could not be had. */
static inline __attribute__((always_inline)) int linear_i8(int kind, const float *x, int64_t M, int64_t K, const uint8_t *w, int64_t N,
                     float *y, int threads) {
    int64_t row_bytes = K / 32 * (kind == 0 ? 20 : 34), blocks = K / 32;
    int8_t *xq = malloc((size_t)(M * K));
    float *xd = malloc(sizeof(float) * (size_t)(M * blocks)), *xs = malloc(sizeof(float) * (size_t)(M * blocks));
    if (!xq || !xd || !xs) {
        free(xq); free(xd); free(xs);
        return -1;
    }
    quantize_rows(x, M, K, xq, xd, xs);
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t group = 0; group < (N + COLS - 1) / COLS; group++) {
        int64_t n0 = COLS * group, n_end = n0 + COLS < N ? n0 + COLS : N;
        for (int64_t r = 0; r < M; r += ROWS) {
            int64_t rows = M - r < ROWS ? M - r : ROWS;
            for (int64_t n = n0; n < n_end;) {
                int cols = tile_cols(rows, n, n_end);
                tile_i8(kind, rows, cols, xq + r * K, xd + r * blocks, xs + r * blocks, K, w + n * row_bytes,
                        row_bytes, y + r * N + n, N);
                n += cols;
            }
        }
    }
    free(xq); free(xd); free(xs);
    return 0;
}

int speclab_q4_1_i8_linear(const float *x, int64_t M, int64_t K, const uint8_t *w, int64_t N, float *y, int threads) {
    return linear_i8(0, x, M, K, w, N, y, threads);
}

int speclab_q8_0_i8_linear(const float *x, int64_t M, int64_t K, const uint8_t *w, int64_t N, float *y, int threads) {
    return linear_i8(1, x, M, K, w, N, y, threads);
}
