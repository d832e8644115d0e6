/* Linear layers straight on a GGUF file's quantised blocks: y = x W^T with W kept as Q4_1 or Q8_0.
 *
 * Built at first use by engine/models/gguf_kernel.py (cc -O3 -march=native -fopenmp) and called
 * through ctypes. AVX2 with FMA where the CPU has it (x86 since 2013-2015; an AVX-512 CPU runs the
 * AVX2 code, and the 8-bit-activation functions use AVX512-VNNI's byte products where it has them);
 * elsewhere plain C doing the same arithmetic, left to the compiler to vectorise.
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

#define TILE(R, C) dot_tile(kind, R, C, xr, K, wrow, row_bytes, yr, N)

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


/* ---------------------------------------------------------------- 8-bit activations (opt-in)
 *
 * The same blocks times activations rounded to 8 bits per block of 32, as llama.cpp multiplies them: the
 * products become integer instructions, where the float32 path above forms every weight as a float first.
 * This changes the numbers: each activation x is replaced by d_x * q_x with
 *   d_x = max |x over its block| / 127,  q_x = x * (127 / max |x|) rounded to the nearest integer (ties to
 *   even), so |q_x| <= 127,
 * kept per row and per block, d_x in float32 (llama.cpp stores it in float16). A block's dot product is then
 *   Q4_1: d_w * d_x * sum(q_w * q_x) + m_w * (d_x * sum(q_x))
 *   Q8_0: d_w * d_x * sum(q_w * q_x)
 * with the integer sums exact.
 *
 * Layout. These functions read the blocks repacked once (speclab_i8_pack) so that one vector of 8 lanes
 * holds 4 bytes from each of 8 blocks: a row's integer sums for 8 blocks accumulate in one register and
 * are scaled together, 8 blocks per conversion, multiply and add. The GGUF order (one block's 32 weights
 * in a row) would need a horizontal sum or a scale per block for every row of x, which is what made a
 * verify of 5 positions cost about twice a step. A row of W is walked in groups of G blocks: 8, then one
 * group of 4 and one of 2 for what is left (a row of an odd number of blocks gets a zero block added,
 * which adds exactly 0); in a group of G, each block has 8 / G lanes. A group's bytes are
 *   a 32-byte header: for Q4_1 d_w of each lane (8 float16) then m_w of each lane (8 float16), for Q8_0 d_w of
 *   each lane widened to float32 (exactly; 8 float16 would leave the chunks 16 bytes off a 32-byte boundary),
 *   then the quantised bytes in 32-byte chunks: byte 4l + i of chunk c is byte 4 * (s * chunks + c) + i of lane
 *   l's block's quantised bytes, where s = l mod (8 / G) and chunks = G / 2 (Q4_1, two weights a byte) or G (Q8_0).
 * Every group is a multiple of 32 bytes, so no 32-byte load of a chunk straddles two cache lines.
 * The activations are laid out the same way at every call, with each lane's d_x and its sums beside them.
 * A row's output is then: for each group in order, per lane, (float(isum) * d_x) * d_w added to the
 * lane's running sum, then (Q4_1) m_w times d_x * sum(q_x) added; the 8 lanes summed at the end. A row is
 * quantised alone and every output is one fixed sequence of float32 operations, so a row's result still
 * ignores which rows came with it and how many threads ran.
 */

static inline int64_t padded_blocks(int64_t K) { return K / 32 + (K / 32 & 1); }
static inline int group_blocks(int64_t blocks, int64_t b0) {
    int64_t left = blocks - b0;
    return left >= 8 ? 8 : left >= 4 ? 4 : 2;
}
static inline int group_chunks(int kind, int G) { return kind == 0 ? G / 2 : G; }
#define GROUP_HEADER 32  /* the group's scales, before its chunks */
static inline int64_t group_bytes(int kind, int G) { return GROUP_HEADER + 32 * group_chunks(kind, G); }
static inline int64_t row_groups(int64_t K) {
    int64_t n = 0, np = padded_blocks(K);
    for (int64_t b0 = 0; b0 < np; b0 += group_blocks(np, b0)) n++;
    return n;
}

/* Bytes of one packed row of W (kind 0 Q4_1, 1 Q8_0) with K inputs. */
int64_t speclab_i8_row_bytes(int kind, int64_t K) {
    int64_t np = padded_blocks(K), bytes = 0;
    for (int64_t b0 = 0; b0 < np; b0 += group_blocks(np, b0)) bytes += group_bytes(kind, group_blocks(np, b0));
    return bytes;
}

/* W's N rows of GGUF blocks (K / 32 blocks each) into the layout above: out holds N * speclab_i8_row_bytes. */
void speclab_i8_pack(int kind, const uint8_t *w, int64_t N, int64_t K, uint8_t *out) {
    int64_t nb = K / 32, np = padded_blocks(K), bb = kind == 0 ? 20 : 34, rb = speclab_i8_row_bytes(kind, K);
    int first = kind == 0 ? 4 : 2;  /* where a block's quantised bytes start */
    for (int64_t n = 0; n < N; n++) {
        const uint8_t *src = w + n * nb * bb;
        uint8_t *dst = out + n * rb;
        memset(dst, 0, (size_t)rb);
        for (int64_t b0 = 0, G; b0 < np; b0 += G) {
            G = group_blocks(np, b0);
            int per = 8 / (int)G, chunks = group_chunks(kind, (int)G);
            for (int l = 0; l < 8; l++) {
                int64_t b = b0 + l / per;
                if (b >= nb) continue;  /* the added block stays zeros */
                const uint8_t *blk = src + b * bb;
                if (kind == 0) {
                    memcpy(dst + 2 * l, blk, 2);
                } else {  /* Q8_0: the scale widened to float32 (exactly), so that every chunk is 32-byte aligned */
                    uint16_t h;
                    memcpy(&h, blk, 2);
                    float f = f16_to_f32(h);
                    memcpy(dst + 4 * l, &f, 4);
                }
                if (kind == 0) memcpy(dst + 16 + 2 * l, blk + 2, 2);
                for (int c = 0; c < chunks; c++)
                    memcpy(dst + GROUP_HEADER + 32 * c + 4 * l, blk + first + 4 * ((l % per) * chunks + c), 4);
            }
            dst += group_bytes(kind, (int)G);
        }
    }
}

#if defined(__AVX2__) && defined(__FMA__)
typedef __m256i ivec;  /* 8 int32 lanes */
typedef __m256i wvec;  /* 32 bytes */
static inline ivec i_zero(void) { return _mm256_setzero_si256(); }
static inline ivec i_add(ivec a, ivec b) { return _mm256_add_epi32(a, b); }
static inline ivec i_sub_at(ivec a, const int32_t *p) { return _mm256_sub_epi32(a, _mm256_loadu_si256((const __m256i *)p)); }
static inline vec8 i_float(ivec a) { return _mm256_cvtepi32_ps(a); }
static inline wvec w_load(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }
static inline wvec w_low(wvec w) { return _mm256_and_si256(w, _mm256_set1_epi8(15)); }
static inline wvec w_high(wvec w) { return _mm256_and_si256(_mm256_srli_epi16(w, 4), _mm256_set1_epi8(15)); }
static inline vec8 h_load(const uint8_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
static inline vec8 v_mul(vec8 a, vec8 b) { return _mm256_mul_ps(a, b); }
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
/* One instruction: lane l += sum over its 4 bytes of (unsigned w) * (signed x). */
#define Q8_BIAS 1  /* Q8_0's signed weights are made unsigned by adding 128; sum(128 * q_x) taken off after */
typedef __m256i svec;
static inline svec s_zero(void) { return _mm256_setzero_si256(); }
static inline svec s_nibbles(svec acc, wvec w, const int8_t *x) { return _mm256_dpbusd_epi32(acc, w, w_load(x)); }
static inline ivec s_finish(svec acc) { return acc; }
static inline wvec q8_weights(wvec w) { return _mm256_xor_si256(w, _mm256_set1_epi8((char)0x80)); }
static inline ivec i_q8(ivec acc, wvec w, const int8_t *x) { return _mm256_dpbusd_epi32(acc, w, w_load(x)); }
#else
/* AVX2: pairs of byte products summed into 16-bit lanes, then pairs of those into 32. A Q4_1 product pair is at
   most 2 * 15 * 127 = 3810, so a group's 4 pairs of one accumulator stay below 2^15 and are widened once. */
#define Q8_BIAS 0
typedef __m256i svec;  /* 16 int16 lanes */
static inline svec s_zero(void) { return _mm256_setzero_si256(); }
static inline svec s_nibbles(svec acc, wvec w, const int8_t *x) { return _mm256_add_epi16(acc, _mm256_maddubs_epi16(w, w_load(x))); }
static inline ivec s_finish(svec acc) { return _mm256_madd_epi16(acc, _mm256_set1_epi16(1)); }
static inline wvec q8_weights(wvec w) { return w; }
static inline ivec i_q8(ivec acc, wvec w, const int8_t *x) {  /* |w| * (x with w's sign) = w * x; a pair at most 2 * 128 * 127 */
    __m256i pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(w_load(x), w));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}
#endif
#else  /* any other CPU: the same integers and the same float32 operations, in plain C */
#define Q8_BIAS 0
typedef struct { int32_t v[8]; } ivec;
typedef struct { uint8_t b[32]; } wvec;
typedef ivec svec;
static inline ivec i_zero(void) { ivec r = {{0}}; return r; }
static inline ivec i_add(ivec a, ivec b) { for (int l = 0; l < 8; l++) a.v[l] += b.v[l]; return a; }
static inline ivec i_sub_at(ivec a, const int32_t *p) { for (int l = 0; l < 8; l++) a.v[l] -= p[l]; return a; }
static inline vec8 i_float(ivec a) { vec8 r; for (int l = 0; l < 8; l++) r.v[l] = (float)a.v[l]; return r; }
static inline wvec w_load(const void *p) { wvec w; memcpy(w.b, p, 32); return w; }
static inline wvec w_low(wvec w) { for (int j = 0; j < 32; j++) w.b[j] &= 15; return w; }
static inline wvec w_high(wvec w) { for (int j = 0; j < 32; j++) w.b[j] >>= 4; return w; }
static inline vec8 h_load(const uint8_t *p) {
    vec8 r;
    for (int l = 0; l < 8; l++) { uint16_t h; memcpy(&h, p + 2 * l, 2); r.v[l] = f16_to_f32(h); }
    return r;
}
static inline vec8 v_mul(vec8 a, vec8 b) { for (int i = 0; i < 8; i++) a.v[i] *= b.v[i]; return a; }
static inline svec s_zero(void) { return i_zero(); }
static inline svec s_nibbles(svec acc, wvec w, const int8_t *x) {
    for (int j = 0; j < 32; j++) acc.v[j / 4] += (int)w.b[j] * x[j];
    return acc;
}
static inline ivec s_finish(svec acc) { return acc; }
static inline wvec q8_weights(wvec w) { return w; }
static inline ivec i_q8(ivec acc, wvec w, const int8_t *x) {
    for (int j = 0; j < 32; j++) acc.v[j / 4] += (int)(int8_t)w.b[j] * x[j];
    return acc;
}
#endif

/* Row r's block b: q[r * K + 32 * b ..] (int8) and d[r * K / 32 + b] (float32). */
static void quantize_rows(const float *x, int64_t M, int64_t K, int8_t *q, float *d) {
    for (int64_t i = 0; i < M * K / 32; i++) {
        const float *xb = x + 32 * i;
#if defined(__AVX2__) && defined(__FMA__)
        /* the scalar loop below, 8 lanes at a time: max |x| ignores a NaN as fmaxf does, and the conversion
           rounds to nearest even (the default rounding mode), as nearbyintf does */
        __m256 v[4], amax8 = _mm256_setzero_ps(), sign = _mm256_set1_ps(-0.0f);
        for (int k = 0; k < 4; k++) {
            v[k] = _mm256_loadu_ps(xb + 8 * k);
            amax8 = _mm256_max_ps(_mm256_andnot_ps(sign, v[k]), amax8);
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax8), _mm256_extractf128_ps(amax8, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        float amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
        __m256 inv = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
        __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127), n[4];
        for (int k = 0; k < 4; k++)
            n[k] = _mm256_min_epi32(_mm256_max_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(v[k], inv)), lo), hi);
        __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(n[0], n[1]), _mm256_packs_epi32(n[2], n[3]));
        /* the packs work per 128-bit half: put the 4-byte groups back in order */
        bytes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)(q + 32 * i), bytes);
#else
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(xb[j]));
        float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
        for (int j = 0; j < 32; j++) {
            int v = (int)nearbyintf(xb[j] * inv);
            q[32 * i + j] = (int8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
        }
#endif
        d[i] = amax / 127.0f;
    }
}

/* The sum of lane l's bytes (4l..4l+3 of each 32-byte piece) over `pieces` pieces. */
static inline void lane_sums(const int8_t *xq, int pieces, int32_t sums[8]) {
#if defined(__AVX2__) && defined(__FMA__)
    __m256i acc = _mm256_setzero_si256(), ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
    for (int p = 0; p < pieces; p++)
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(
            _mm256_maddubs_epi16(ones8, _mm256_loadu_si256((const __m256i *)(xq + 32 * p))), ones16));
    _mm256_storeu_si256((__m256i *)sums, acc);
#else
    for (int l = 0; l < 8; l++) {
        sums[l] = 0;
        for (int p = 0; p < pieces; p++)
            for (int i = 0; i < 4; i++) sums[l] += xq[32 * p + 4 * l + i];
    }
#endif
}

/* One quantised row laid out as the packed weights: xq (32 bytes a block; for Q4_1 each chunk's bytes for the
   low nibbles, then for the high ones), and per group and lane: d_x, d_x * sum(q_x) over the lane's bytes
   (the Q4_1 minimum's term), and 128 * sum(q_x) (what the bias of the VNNI Q8_0 products adds). */
static void layout_row(int kind, const int8_t *q, const float *d, int64_t K, int8_t *xq, float *xd, float *xs,
                       int32_t *xc) {
    static const int8_t zeros[32];
    int64_t nb = K / 32, np = padded_blocks(K);
    for (int64_t b0 = 0, G, lane = 0; b0 < np; b0 += G, lane += 8) {
        G = group_blocks(np, b0);
        int per = 8 / (int)G, chunks = group_chunks(kind, (int)G);
        for (int l = 0; l < 8; l++) {
            int64_t b = b0 + l / per;
            const int8_t *qb = b < nb ? q + 32 * b : zeros;
            for (int c = 0; c < chunks; c++) {
                int word = (l % per) * chunks + c;
                if (kind == 0) {
                    memcpy(xq + 64 * c + 4 * l, qb + 4 * word, 4);
                    memcpy(xq + 64 * c + 32 + 4 * l, qb + 16 + 4 * word, 4);
                } else {
                    memcpy(xq + 32 * c + 4 * l, qb + 4 * word, 4);
                }
            }
            xd[lane + l] = b < nb ? d[b] : 0.0f;
        }
        int32_t sums[8];
        lane_sums(xq, (int)G, sums);
        for (int l = 0; l < 8; l++) {
            xs[lane + l] = xd[lane + l] * (float)sums[l];
            xc[lane + l] = 128 * sums[l];
        }
        xq += 32 * G;
    }
}

/* What one call's activations become: per row, 32 bytes a (padded) block and 8 lanes a group of each array. */
typedef struct {
    const int8_t *q;
    const float *d, *s;
    const int32_t *c;
    int64_t q_row, lane_row;
} rows_i8;

/* One group of G blocks (G a constant where it is called, so that its loops unroll) for `rows` rows of x and `cols`
   packed rows of W, added to their float sums: each row's 8 lanes of exact integer sums (two accumulators, so that
   a row is two chains), then scaled. */
static inline __attribute__((always_inline)) void group_i8(
        int kind, int G, int rows, int cols, rows_i8 x, int64_t b0, int64_t lane, const uint8_t *g0, int64_t row_bytes,
        vec8 acc[ROWS][COLS]) {
    int chunks = group_chunks(kind, G);
    for (int c = 0; c < cols; c++) {
        const uint8_t *g = g0 + c * row_bytes, *qw = g + GROUP_HEADER;
        for (int64_t p = 0; p < group_bytes(kind, G); p += 64) __builtin_prefetch(g + PREFETCH_BYTES + p);
        ivec isum[ROWS];
        if (kind == 0) {
            svec a[ROWS], b[ROWS];
            for (int r = 0; r < rows; r++) { a[r] = s_zero(); b[r] = s_zero(); }
            for (int k = 0; k < chunks; k++) {
                wvec w = w_load(qw + 32 * k), lo = w_low(w), hi = w_high(w);
                for (int r = 0; r < rows; r++) {
                    const int8_t *xq = x.q + r * x.q_row + 32 * b0 + 64 * k;
                    a[r] = s_nibbles(a[r], lo, xq);
                    b[r] = s_nibbles(b[r], hi, xq + 32);
                }
            }
            for (int r = 0; r < rows; r++) isum[r] = i_add(s_finish(a[r]), s_finish(b[r]));
        } else {
            ivec a[ROWS], b[ROWS];
            for (int r = 0; r < rows; r++) { a[r] = i_zero(); b[r] = i_zero(); }
            for (int k = 0; k < chunks; k += 2) {  /* chunks is even: G is */
                wvec w0 = q8_weights(w_load(qw + 32 * k)), w1 = q8_weights(w_load(qw + 32 * k + 32));
                for (int r = 0; r < rows; r++) {
                    const int8_t *xq = x.q + r * x.q_row + 32 * b0 + 32 * k;
                    a[r] = i_q8(a[r], w0, xq);
                    b[r] = i_q8(b[r], w1, xq + 32);
                }
            }
            for (int r = 0; r < rows; r++) {
                isum[r] = i_add(a[r], b[r]);
                if (Q8_BIAS) isum[r] = i_sub_at(isum[r], x.c + r * x.lane_row + lane);
            }
        }
        vec8 dw = kind == 0 ? h_load(g) : v_load((const float *)g), mw = kind == 0 ? h_load(g + 16) : v_zero();
        for (int r = 0; r < rows; r++) {
            const float *xd = x.d + r * x.lane_row + lane;
            acc[r][c] = v_fma(v_mul(i_float(isum[r]), v_load(xd)), dw, acc[r][c]);  /* (isum * d_x) * d_w */
            if (kind == 0) acc[r][c] = v_fma(mw, v_load(x.s + r * x.lane_row + lane), acc[r][c]);
        }
    }
}

/* y[r, n + c] for `rows` (1..ROWS) rows of x and `cols` (1..COLS) packed rows of W. A row's operations are the
   same whatever `rows` and `cols` are. */
static inline __attribute__((always_inline)) void dot_tile_i8(
        int kind, int rows, int cols, rows_i8 x, int64_t K, const uint8_t *wrow, int64_t row_bytes, float *y,
        int64_t N) {
    int64_t np = padded_blocks(K), b0 = 0, lane = 0;
    const uint8_t *g = wrow;
    vec8 acc[ROWS][COLS];
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) acc[r][c] = v_zero();
    for (; np - b0 >= 8; b0 += 8, lane += 8, g += group_bytes(kind, 8))
        group_i8(kind, 8, rows, cols, x, b0, lane, g, row_bytes, acc);
    if (np - b0 >= 4) {
        group_i8(kind, 4, rows, cols, x, b0, lane, g, row_bytes, acc);
        b0 += 4, lane += 8, g += group_bytes(kind, 4);
    }
    if (np - b0 == 2) group_i8(kind, 2, rows, cols, x, b0, lane, g, row_bytes, acc);
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) y[r * N + c] = v_sum(acc[r][c]);
}

#define TILE_I8(R, C) dot_tile_i8(kind, R, C, xr, K, wrow, row_bytes, yr, N)

static inline __attribute__((always_inline)) void tile_i8(
        int kind, int64_t rows, int cols, rows_i8 xr, int64_t K, const uint8_t *wrow, int64_t row_bytes, float *yr,
        int64_t N) {
    DISPATCH_TILES(TILE_I8)
}

/* The activations quantised and laid out once per call, then the same walk as `linear` over packed rows.
   Returns 0, or -1 where the scratch memory could not be had. */
static inline __attribute__((always_inline)) int linear_i8(int kind, const float *x, int64_t M, int64_t K,
                                                           const uint8_t *w, int64_t N, float *y, int threads) {
    int64_t row_bytes = speclab_i8_row_bytes(kind, K), blocks = K / 32, lanes = 8 * row_groups(K);
    /* one allocation, the laid-out rows first and 64-byte aligned: each row is a whole number of cache lines, so
       no 32-byte load of x straddles two (on the AVX-512 EPYC, straddling loads made the 5-row products a quarter slower) */
    int64_t x_row = 32 * padded_blocks(K);  /* laid-out bytes of one row of x */
    size_t xq_bytes = (size_t)(M * x_row), lane_bytes = sizeof(float) * (size_t)(M * lanes);
    size_t bytes = xq_bytes + 3 * lane_bytes + sizeof(float) * (size_t)(M * blocks) + (size_t)(M * K);
    int8_t *xq = aligned_alloc(64, (bytes + 63) / 64 * 64);
    int failed = !xq;
    float *xd = (float *)(xq + xq_bytes), *xs = xd + M * lanes;
    int32_t *xc = (int32_t *)(xs + M * lanes);
    float *d = (float *)(xc + M * lanes);
    int8_t *q = (int8_t *)(d + M * blocks);
    if (!failed) {
        quantize_rows(x, M, K, q, d);
        for (int64_t r = 0; r < M; r++)
            layout_row(kind, q + r * K, d + r * blocks, K, xq + r * x_row, xd + r * lanes,
                       xs + r * lanes, xc + r * lanes);
        #pragma omp parallel for num_threads(threads) schedule(static)
        for (int64_t group = 0; group < (N + COLS - 1) / COLS; group++) {
            int64_t n0 = COLS * group, n_end = n0 + COLS < N ? n0 + COLS : N;
            for (int64_t r = 0; r < M; r += ROWS) {
                int64_t rows = M - r < ROWS ? M - r : ROWS;
                rows_i8 xr = {xq + r * x_row, xd + r * lanes, xs + r * lanes, xc + r * lanes, x_row, lanes};
                for (int64_t n = n0; n < n_end;) {
                    int cols = tile_cols(rows, n, n_end);
                    tile_i8(kind, rows, cols, xr, K, w + n * row_bytes, row_bytes, y + r * N + n, N);
                    n += cols;
                }
            }
        }
    }
    free(xq);
    return failed ? -1 : 0;
}

/* x (M, K) float32 times a packed (speclab_i8_pack) matrix of N rows: y (M, N). */
int speclab_q4_1_i8_linear(const float *x, int64_t M, int64_t K, const uint8_t *w, int64_t N, float *y, int threads) {
    return linear_i8(0, x, M, K, w, N, y, threads);
}

int speclab_q8_0_i8_linear(const float *x, int64_t M, int64_t K, const uint8_t *w, int64_t N, float *y, int threads) {
    return linear_i8(1, x, M, K, w, N, y, threads);
}
