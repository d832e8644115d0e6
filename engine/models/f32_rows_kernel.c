/* y(M, N) = x(M, K) W(N, K)^T in float32 for a few rows (M = 1..8 at once): a verify's linear layer.
 * W is float32, or 16-bit: bfloat16 (speclab_bf16_rows_linear) or float16 (speclab_f16_rows_linear). Each
 * 16-bit weight widens exactly to float32 as it is loaded (a bfloat16's 16 bits become a float's upper half;
 * a float16 goes through the F16C conversion), and the tiles then run the float32 tiles' products in the
 * float32 tiles' order. So a float32 layer whose weights are all exact 16-bit numbers (a checkpoint stored in
 * float16 or bfloat16, loaded as float32) gives the same bits from its 16-bit copy as from its float32
 * weights, at every variant, on half the bytes read.
 *
 * Why: at batch 1 a linear layer is bound by reading W from memory; a verify over K+1 positions
 * should cost about what one row does, if each weight is read once for all rows. A BLAS sgemm tuned
 * for large M may instead re-read W per row or per small panel (measured on a 2-core AMD EPYC: the
 * chat target's output layer took 10 ms at 1 row, 23 at 2, 34 at 3). Here each row of W (one output
 * feature) is streamed once and multiplied against all M rows of x, which stay in L1/L2
 * (8 x 1536 floats = 48 KiB at most for the chat target).
 *
 * Register blocking: a tile is ROWS rows of x by COLS rows of W with one vector accumulator per
 * (row, column) pair. M accumulators per weight row let one load of W feed M multiply-adds; COLS
 * weight rows side by side give a single row of x (a decode step) several independent chains of
 * multiply-adds, since each chain waits ~4 cycles for its previous FMA. COLS shrinks as ROWS grows
 * so ROWS x COLS accumulators plus the loaded vectors fit the register file (32 zmm, 16 ymm).
 *
 * Run-time dispatch: the library is built without -march=native; the AVX-512 and AVX2 tiles carry
 * their own target attributes and the caller picks one (speclab_f32_rows_best_isa() says the widest this
 * CPU runs, by __builtin_cpu_supports), so a library built on one x86 CPU runs correctly on another, and a
 * test on an AVX-512 machine can run the AVX2 tiles too. Elsewhere plain C does the same work. The caller
 * also picks the cache level the weights are prefetched into (PREFETCH_L2): with the ISA, a variant that
 * engine/models/linear_paths.py times per machine and width.
 *
 * Reproducibility: every output y[r, n] is one chain of multiply-adds over k in a fixed order
 * followed by a fixed lane reduction, computed by one thread, whatever M, the tile shape or the
 * thread count: 1 and 2 threads give bit-identical results, and a row's value does not depend on
 * how many rows came with it (a verify and a one-token step agree on the same position). The ISA
 * does change the order (16, 8 or 1 lanes), so results differ between variants in the last bits.
 *
 * Every weight type has plain C, AVX2 and AVX-512 tiles.
 */
#include <stdint.h>
#include <string.h>

#define MAX_ROWS 8  /* rows of x per tile; more rows are done in blocks of MAX_ROWS */

/* Loops over a tile's rows and columns are unrolled before anything else, so each accumulator becomes
   its own register (left as a loop, GCC 12 kept the accumulator array on the stack). */
#define UNROLL _Pragma("GCC unroll 8")
/* How far ahead of the weights being read to ask for memory, in floats. A tile reads its COLS rows of
   W side by side (one contiguous span of COLS x K floats) while doing M multiply-adds per weight; the
   hardware prefetcher alone left the memory stream idle during the arithmetic: the chat target's
   49,152 x 576 output layer on one thread of an Intel Xeon took 7.7 ms at 1 row and 14 ms at 8; asking
   16 KiB ahead, 9-11 ms at 8 rows (1-16 KiB all helped; a busy shared machine, so +-1 ms).
   Prefetching changes no result. */
#ifndef PREFETCH_FLOATS
#define PREFETCH_FLOATS 4096
#endif
/* Where the prefetched weights go is a variant the caller picks (PREFETCH_L2 below), measured per machine:
   on a 2-core AMD EPYC (Zen 4) asking for L1 (prefetcht0) left 5 rows costing 1.3-1.4x one row, and asking
   for L2 (prefetcht1) made 1 to 6 rows cost about the same (bench/rows_prefetch.py): a prefetch into L1 holds
   one of the core's few L1 miss buffers until the line arrives, one into L2 does not. The L1 variant came
   first and stays where it measures faster. */
#define PREFETCH(addr, l2) ((l2) ? __builtin_prefetch((addr), 0, 2) : __builtin_prefetch((addr), 0, 3))

enum { ISA_SCALAR = 0, ISA_AVX2 = 1, ISA_AVX512 = 2 };
/* The weights' type: the `wt` argument of the tiles. */
enum { W_F32 = 0, W_BF16 = 1, W_F16 = 2 };
/* The `variant` argument: an ISA_* number, plus PREFETCH_L2 to prefetch the weights into L2 instead of L1. */
enum { ISA_BITS = 3, PREFETCH_L2 = 4 };

/* Columns of W per tile for a tile of `rows` rows of x. AVX2 has 16 ymm registers: at most 12
   accumulators. AVX-512 has 32 zmm registers: up to 24 accumulators (6 x 4), which saves loads of x
   per multiply-add (on one Xeon thread, the output layer at 4-6 rows 5-7% faster than with AVX2's shapes). */
static int cols_for(int isa, int rows) {
    if (isa == ISA_AVX512) return rows <= 6 ? 4 : 2;
    return rows <= 2 ? 4 : rows <= 6 ? 2 : 1;
}

/* ------------------------------------------------------------ plain C, any CPU */

/* A bfloat16 is a float32's upper 16 bits: widening is exact. */
static inline float bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* A float16 widened to float32, exactly, in integer arithmetic (plain C has no portable half type). */
static inline float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff, bits;
    if (exponent == 0x1f) {
        bits = sign | 0x7f800000u | (mantissa << 13);  /* infinity or NaN */
    } else if (exponent != 0) {
        bits = sign | ((exponent + 112) << 23) | (mantissa << 13);  /* normal: rebias 15 -> 127 */
    } else if (mantissa == 0) {
        bits = sign;  /* signed zero */
    } else {  /* subnormal: normalise the mantissa into a float32 normal */
        int shift = 0;
        while (!(mantissa & 0x400)) { mantissa <<= 1; shift++; }
        bits = sign | ((uint32_t)(113 - shift) << 23) | ((mantissa & 0x3ff) << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline int64_t weight_bytes(int wt) { return wt == W_F32 ? 4 : 2; }

/* Weight i of a tile's weights of type wt. */
static inline float weight_at(const void *w, int wt, int64_t i) {
    if (wt == W_BF16) return bf16_to_f32(((const uint16_t *)w)[i]);
    if (wt == W_F16) return f16_to_f32(((const uint16_t *)w)[i]);
    return ((const float *)w)[i];
}

static void tile_scalar(int rows, int cols, const float *x, int64_t K, const void *w, float *y, int64_t N, int wt,
                        int l2) {
    (void)l2;  /* no prefetching in plain C */
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) {
            float acc = 0.0f;
            for (int64_t k = 0; k < K; k++) acc += x[r * K + k] * weight_at(w, wt, c * K + k);
            y[r * N + c] = acc;
        }
}

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

/* ------------------------------------------------------------ AVX2 + FMA: 8 lanes */

__attribute__((target("avx2,fma"))) static inline float sum8(__m256 v) {
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    return _mm_cvtss_f32(_mm_add_ss(a, _mm_movehdup_ps(a)));
}

/* 8 weights widened to float32: from float32; bfloat16 (zero-extend, then shift into the upper half); float16
   (F16C's conversion, exact). */
__attribute__((target("avx2,fma,f16c"), always_inline)) static inline __m256 load8(const void *w, int wt, int64_t i) {
    if (wt == W_BF16)
        return _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)w + i))), 16));
    if (wt == W_F16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)w + i)));
    return _mm256_loadu_ps((const float *)w + i);
}

/* The last `left` (< 8) weights from i, zeros after them. */
__attribute__((target("avx2,fma,f16c"), always_inline)) static inline __m256 load_tail(const void *w, int wt, int64_t i,
                                                                                      int left, __m256i mask) {
    if (wt != W_F32) {
        uint16_t part[8] = {0};  /* no 16-bit masked load in AVX2: copy the tail into zeros */
        memcpy(part, (const uint16_t *)w + i, (size_t)left * sizeof(uint16_t));
        return load8(part, wt, 0);
    }
    return _mm256_maskload_ps((const float *)w + i, mask);
}

/* ROWS, COLS, wt and l2 are constants at each call site (always_inline), so acc stays in registers and
   the prefetch is one instruction. */
__attribute__((target("avx2,fma,f16c"), always_inline)) static inline void tile_avx2(
        int rows, int cols, const float *x, int64_t K, const void *w, float *y, int64_t N, int wt, int l2) {
    const int64_t elem = weight_bytes(wt);
    __m256 acc[MAX_ROWS][4];
    UNROLL
    for (int r = 0; r < rows; r++)
        UNROLL
        for (int c = 0; c < cols; c++) acc[r][c] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) {
        __m256 wv[4];
        UNROLL
        for (int c = 0; c < cols; c++) {
            wv[c] = load8(w, wt, c * K + k);  /* each weight read once */
            /* sweeps the tile's span PREFETCH_FLOATS weights ahead at the rate the tile reads it */
            PREFETCH((const char *)w + (PREFETCH_FLOATS + k * cols + 8 * c) * elem, l2);
        }
        UNROLL
        for (int r = 0; r < rows; r++) {
            __m256 xv = _mm256_loadu_ps(x + r * K + k);
            UNROLL
            for (int c = 0; c < cols; c++) acc[r][c] = _mm256_fmadd_ps(xv, wv[c], acc[r][c]);
        }
    }
    if (k < K) {  /* K not a multiple of 8: masked loads read zeros past the end, which add nothing */
        int left = (int)(K - k);
        __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(left), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        __m256 wv[4];
        UNROLL
        for (int c = 0; c < cols; c++) wv[c] = load_tail(w, wt, c * K + k, left, mask);
        UNROLL
        for (int r = 0; r < rows; r++) {
            __m256 xv = _mm256_maskload_ps(x + r * K + k, mask);
            UNROLL
            for (int c = 0; c < cols; c++) acc[r][c] = _mm256_fmadd_ps(xv, wv[c], acc[r][c]);
        }
    }
    UNROLL
    for (int r = 0; r < rows; r++)
        UNROLL
        for (int c = 0; c < cols; c++) y[r * N + c] = sum8(acc[r][c]);
}

/* ------------------------------------------------------------ AVX-512: 16 lanes */

/* 16 weights widened to float32, as load8. */
__attribute__((target("avx512f"), always_inline)) static inline __m512 load16(const void *w, int wt, int64_t i) {
    if (wt == W_BF16)
        return _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)w + i))), 16));
    if (wt == W_F16) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)w + i)));
    return _mm512_loadu_ps((const float *)w + i);
}

/* The last `left` (< 16) weights from i, zeros after them (16-bit masked loads would need AVX512BW). */
__attribute__((target("avx512f"), always_inline)) static inline __m512 load16_tail(const void *w, int wt, int64_t i,
                                                                                   int left, __mmask16 mask) {
    if (wt != W_F32) {
        uint16_t part[16] = {0};
        memcpy(part, (const uint16_t *)w + i, (size_t)left * sizeof(uint16_t));
        return load16(part, wt, 0);
    }
    return _mm512_maskz_loadu_ps(mask, (const float *)w + i);
}

__attribute__((target("avx512f"), always_inline)) static inline void tile_avx512(
        int rows, int cols, const float *x, int64_t K, const void *w, float *y, int64_t N, int wt, int l2) {
    const int64_t elem = weight_bytes(wt);
    __m512 acc[MAX_ROWS][4];
    UNROLL
    for (int r = 0; r < rows; r++)
        UNROLL
        for (int c = 0; c < cols; c++) acc[r][c] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) {
        __m512 wv[4];
        UNROLL
        for (int c = 0; c < cols; c++) {
            wv[c] = load16(w, wt, c * K + k);
            PREFETCH((const char *)w + (PREFETCH_FLOATS + k * cols + 16 * c) * elem, l2);  /* as in the AVX2 tile */
        }
        UNROLL
        for (int r = 0; r < rows; r++) {
            __m512 xv = _mm512_loadu_ps(x + r * K + k);
            UNROLL
            for (int c = 0; c < cols; c++) acc[r][c] = _mm512_fmadd_ps(xv, wv[c], acc[r][c]);
        }
    }
    if (k < K) {  /* the tail under a mask: lanes past K load zeros */
        __mmask16 mask = (__mmask16)((1u << (K - k)) - 1);
        __m512 wv[4];
        UNROLL
        for (int c = 0; c < cols; c++) wv[c] = load16_tail(w, wt, c * K + k, (int)(K - k), mask);
        UNROLL
        for (int r = 0; r < rows; r++) {
            __m512 xv = _mm512_maskz_loadu_ps(mask, x + r * K + k);
            UNROLL
            for (int c = 0; c < cols; c++) acc[r][c] = _mm512_fmadd_ps(xv, wv[c], acc[r][c]);
        }
    }
    UNROLL
    for (int r = 0; r < rows; r++)
        UNROLL
        for (int c = 0; c < cols; c++) y[r * N + c] = _mm512_reduce_add_ps(acc[r][c]);
}

/* One switch per ISA turns (rows, cols) into constants; cols is cols_for(rows) or fewer at N's end. */
#define DISPATCH(TILE, WT, L2)                                                                                \
    switch (rows * 8 + cols) {                                                                                \
        case 1 * 8 + 4: TILE(1, 4, x, K, w, y, N, WT, L2); return;                                                \
        case 1 * 8 + 2: TILE(1, 2, x, K, w, y, N, WT, L2); return;                                                \
        case 2 * 8 + 4: TILE(2, 4, x, K, w, y, N, WT, L2); return;                                                \
        case 2 * 8 + 2: TILE(2, 2, x, K, w, y, N, WT, L2); return;                                                \
        case 3 * 8 + 2: TILE(3, 2, x, K, w, y, N, WT, L2); return;                                                \
        case 4 * 8 + 2: TILE(4, 2, x, K, w, y, N, WT, L2); return;                                                \
        case 5 * 8 + 2: TILE(5, 2, x, K, w, y, N, WT, L2); return;                                                \
        case 6 * 8 + 2: TILE(6, 2, x, K, w, y, N, WT, L2); return;                                                \
        case 3 * 8 + 4: TILE(3, 4, x, K, w, y, N, WT, L2); return;                                                \
        case 4 * 8 + 4: TILE(4, 4, x, K, w, y, N, WT, L2); return;                                                \
        case 5 * 8 + 4: TILE(5, 4, x, K, w, y, N, WT, L2); return;                                                \
        case 6 * 8 + 4: TILE(6, 4, x, K, w, y, N, WT, L2); return;                                                \
        case 7 * 8 + 2: TILE(7, 2, x, K, w, y, N, WT, L2); return;                                                \
        case 8 * 8 + 2: TILE(8, 2, x, K, w, y, N, WT, L2); return;                                                \
        case 1 * 8 + 1: TILE(1, 1, x, K, w, y, N, WT, L2); return;                                                \
        case 2 * 8 + 1: TILE(2, 1, x, K, w, y, N, WT, L2); return;                                                \
        case 3 * 8 + 1: TILE(3, 1, x, K, w, y, N, WT, L2); return;                                                \
        case 4 * 8 + 1: TILE(4, 1, x, K, w, y, N, WT, L2); return;                                                \
        case 5 * 8 + 1: TILE(5, 1, x, K, w, y, N, WT, L2); return;                                                \
        case 6 * 8 + 1: TILE(6, 1, x, K, w, y, N, WT, L2); return;                                                \
        case 7 * 8 + 1: TILE(7, 1, x, K, w, y, N, WT, L2); return;                                                \
        case 8 * 8 + 1: TILE(8, 1, x, K, w, y, N, WT, L2); return;                                                \
        default: tile_scalar(rows, cols, x, K, w, y, N, WT, L2); return;    /* no other shape */                  \
    }

/* Every (weight type, prefetch level) pair gets its own copy of the tiles, each with constants inside. */
#define DISPATCH_ALL(TILE)                                     \
    if (wt == W_BF16 && l2) { DISPATCH(TILE, W_BF16, 1) }      \
    if (wt == W_BF16) { DISPATCH(TILE, W_BF16, 0) }            \
    if (wt == W_F16 && l2) { DISPATCH(TILE, W_F16, 1) }        \
    if (wt == W_F16) { DISPATCH(TILE, W_F16, 0) }              \
    if (l2) { DISPATCH(TILE, W_F32, 1) }                       \
    DISPATCH(TILE, W_F32, 0)

__attribute__((target("avx2,fma,f16c"))) static void tile_avx2_any(
        int rows, int cols, const float *x, int64_t K, const void *w, float *y, int64_t N, int wt, int l2) {
    DISPATCH_ALL(tile_avx2)
}

__attribute__((target("avx512f"))) static void tile_avx512_any(
        int rows, int cols, const float *x, int64_t K, const void *w, float *y, int64_t N, int wt, int l2) {
    DISPATCH_ALL(tile_avx512)
}
#endif

/* The best variant this CPU runs: what the caller passes as `isa` unless told otherwise. */
int speclab_f32_rows_best_isa(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return ISA_AVX2;
#endif
    return ISA_SCALAR;
}

static void tile_any(int isa, int l2, int rows, int cols, const float *x, int64_t K, const void *w, float *y,
                     int64_t N, int wt) {
#if defined(__x86_64__) || defined(__i386__)
    if (isa == ISA_AVX512) { tile_avx512_any(rows, cols, x, K, w, y, N, wt, l2); return; }
    if (isa == ISA_AVX2) { tile_avx2_any(rows, cols, x, K, w, y, N, wt, l2); return; }
#endif
    tile_scalar(rows, cols, x, K, w, y, N, wt, l2);
}

/* y = x W^T (+ bias) with W of type wt. Threads split N into contiguous runs of whole tiles (schedule
   static): each output is computed by one thread. */
static void rows_linear(const float *x, int64_t M, int64_t K, const void *w, int wt, int64_t N,
                        const float *bias, float *y, int threads, int variant) {
    int isa = variant & ISA_BITS, l2 = (variant & PREFETCH_L2) != 0;
#if defined(__x86_64__) || defined(__i386__)
    /* every AVX2 CPU we know of has F16C, but the tiles must not meet one that lacks it */
    if (wt == W_F16 && isa == ISA_AVX2 && !__builtin_cpu_supports("f16c")) isa = ISA_SCALAR;
#endif
    const int64_t elem = weight_bytes(wt);
    int64_t step = 4;  /* columns per work item: a multiple of every cols_for() */
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t item = 0; item < (N + step - 1) / step; item++) {
        int64_t n_end = item * step + step < N ? item * step + step : N;
        for (int64_t r = 0; r < M; r += MAX_ROWS) {
            int rows = M - r < MAX_ROWS ? (int)(M - r) : MAX_ROWS;
            for (int64_t n = item * step; n < n_end;) {
                int cols = cols_for(isa, rows);
                while (n + cols > n_end) cols /= 2;  /* 4 -> 2 -> 1 at N's end */
                tile_any(isa, l2, rows, cols, x + r * K, K, (const char *)w + n * K * elem, y + r * N + n, N, wt);
                n += cols;
            }
        }
    }
    if (bias)  /* added after the products, as F.linear's result is (x W^T) + b up to rounding */
        for (int64_t r = 0; r < M; r++)
            for (int64_t n = 0; n < N; n++) y[r * N + n] += bias[n];
}

/* y = x W^T (+ bias), x (M, K), W (N, K), y (M, N), all row-major float32; bias (N) or NULL.
   `variant`'s ISA must be one this CPU runs (speclab_f32_rows_best_isa() or below), plus PREFETCH_L2 or not.
   The ISA's lanes change the last bits of a result; the prefetch changes none. */
void speclab_f32_rows_linear(const float *x, int64_t M, int64_t K, const float *w, int64_t N,
                             const float *bias, float *y, int threads, int variant) {
    rows_linear(x, M, K, w, W_F32, N, bias, y, threads, variant);
}

/* The same with W (N, K) in bfloat16 (raw 16-bit patterns); x, bias and y stay float32, so a bfloat16
   layer's activations are widened before and its outputs rounded after, by the caller. */
void speclab_bf16_rows_linear(const float *x, int64_t M, int64_t K, const uint16_t *w, int64_t N,
                              const float *bias, float *y, int threads, int variant) {
    rows_linear(x, M, K, w, W_BF16, N, bias, y, threads, variant);
}

/* The same with W (N, K) in float16 (raw 16-bit patterns), x, bias and y float32: a float32 layer whose
   weights are exact float16 numbers, read from its float16 copy. */
void speclab_f16_rows_linear(const float *x, int64_t M, int64_t K, const uint16_t *w, int64_t N,
                             const float *bias, float *y, int threads, int variant) {
    rows_linear(x, M, K, w, W_F16, N, bias, y, threads, variant);
}
