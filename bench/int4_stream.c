/* A decode step's int4 products with no Python around them: the chat target's 30 layers x 7 Q4_1
 * products and its 49152 x 576 Q8_0 output layer, each on its own random blocks (96 MB, so they
 * stream from memory as in a real step), timed in C. Used to choose gguf_kernel.c's COLS and
 * PREFETCH_BYTES; bench/int4_kernels.py measures the same pass through the calls the model makes.
 *
 *   cc -O3 -march=native -fopenmp -I. -DKERNEL='"engine/models/gguf_kernel.c"' bench/int4_stream.c -o /tmp/int4_stream -lm
 *   /tmp/int4_stream THREADS [ROWS] [i8] # add -DCOLS=2 or -DPREFETCH_BYTES=512 to try other settings
 *
 * With `i8`, the 8-bit-activation functions (the int4-a8 path) on the same blocks, packed as the engine packs them.
 *
 * Prints the best of 18 passes (after 2 warm-up passes) for the layers and for the output layer.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include KERNEL

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* random blocks with small positive scales and negative minimums, as a Q4_1 or Q8_0 file has */
static uint8_t *random_blocks(int64_t N, int64_t K, int bytes) {
    int64_t nb = N * K / 32;
    uint8_t *w = malloc(nb * bytes);
    for (int64_t i = 0; i < nb; i++) {
        uint8_t *b = w + i * bytes;
        uint16_t d = 0x2000 + (rand() & 0xff), m = 0xa000 + (rand() & 0xff);
        memcpy(b, &d, 2);
        if (bytes == 20) memcpy(b + 2, &m, 2);
        for (int j = bytes == 20 ? 4 : 2; j < bytes; j++) b[j] = rand();
    }
    return w;
}

/* the blocks packed for the 8-bit-activation functions (speclab_i8_pack), the GGUF ones freed */
static uint8_t *packed(uint8_t *w, int kind, int64_t N, int64_t K) {
    uint8_t *p = malloc(N * speclab_i8_row_bytes(kind, K));
    speclab_i8_pack(kind, w, N, K, p);
    free(w);
    return p;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 2, M = argc > 2 ? atoi(argv[2]) : 1;
    int i8 = argc > 3 && strcmp(argv[3], "i8") == 0;
    int64_t shapes[7][2] = {{576, 576}, {192, 576}, {192, 576}, {576, 576}, {1536, 576}, {1536, 576}, {576, 1536}};
    uint8_t *layers[30][7];
    for (int l = 0; l < 30; l++)
        for (int j = 0; j < 7; j++) {
            layers[l][j] = random_blocks(shapes[j][0], shapes[j][1], 20);
            if (i8) layers[l][j] = packed(layers[l][j], 0, shapes[j][0], shapes[j][1]);
        }
    int64_t vocab = 49152, hidden = 576;
    uint8_t *output = random_blocks(vocab, hidden, 34);
    if (i8) output = packed(output, 1, vocab, hidden);
    float *x = malloc(9 * 1536 * sizeof(float)), *y = malloc(9 * vocab * sizeof(float));
    for (int i = 0; i < 9 * 1536; i++) x[i] = rand() / (float)RAND_MAX - 0.5f;
    double best_layers = 1e9, best_output = 1e9;
    for (int pass = 0; pass < 20; pass++) {
        double t0 = now();
        for (int l = 0; l < 30; l++)
            for (int j = 0; j < 7; j++) {
                int64_t N = shapes[j][0], K = shapes[j][1];
                int th = M * N * K < (1 << 18) ? 1 : threads;  /* gguf_kernel.py's SERIAL_BELOW */
                if (i8) speclab_q4_1_i8_linear(x, M, K, layers[l][j], N, y, th);
                else speclab_q4_1_linear(x, M, K, layers[l][j], N, y, th);
            }
        double t1 = now();
        if (i8) speclab_q8_0_i8_linear(x, M, hidden, output, vocab, y, threads);
        else speclab_q8_0_linear(x, M, hidden, output, vocab, y, threads);
        double t2 = now();
        if (pass >= 2 && t1 - t0 < best_layers) best_layers = t1 - t0;
        if (pass >= 2 && t2 - t1 < best_output) best_output = t2 - t1;
    }
    printf("%s, rows %d, threads %d: layers %.2f ms (66.4 MB, %.1f GB/s), output layer %.2f ms (30.1 MB, %.1f GB/s)\n",
           i8 ? "8-bit activations" : "float32 activations", M, threads, best_layers * 1e3, 66.4e-3 / best_layers,
           best_output * 1e3, 30.1e-3 / best_output);
    return 0;
}
