// The int4 kernel (gguf_kernel.c) as a torch operator a compiled graph calls without Python.
//
// Why: the Python custom operator speclab::gguf_linear costs about 30 us a call before the kernel starts (its
// dispatch into Python, then the checks and the ctypes call; bench/op_call_cost.py measured the same for the
// float32 rows operator), and a compiled int4 chat step makes 121 calls. Registered here, the graph reaches the
// kernel through the dispatcher alone. The arguments are checked as gguf_kernel.py BlockMatrix checks them: the
// kernel trusts its pointers.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

extern "C" void speclab_q4_1_linear(const float *x, int64_t M, int64_t K, const uint8_t *w, int64_t N, float *y,
                                    int threads);
extern "C" void speclab_q8_0_linear(const float *x, int64_t M, int64_t K, const uint8_t *w, int64_t N, float *y,
                                    int threads);
extern "C" int speclab_q4_1_i8_linear(const float *x, int64_t M, int64_t K, const uint8_t *w, int64_t N, float *y,
                                      int threads);
extern "C" int speclab_q8_0_i8_linear(const float *x, int64_t M, int64_t K, const uint8_t *w, int64_t N, float *y,
                                      int threads);
extern "C" int64_t speclab_i8_row_bytes(int kind, int64_t K);

// Mirror of engine/models/gguf_kernel.py SERIAL_BELOW: only the speed depends on it.
static const int64_t SERIAL_BELOW = SPECLAB_SERIAL_BELOW;
// gguf_kernel.py KINDS: 0 Q4_1 and 1 Q8_0 with float32 activations on the GGUF blocks, 2 Q4_1 and 3 Q8_0 with
// 8-bit activations on the blocks packed by speclab_i8_pack
static int64_t row_bytes(int64_t kind, int64_t K) {
    return kind < 2 ? K / 32 * (kind == 0 ? 20 : 34) : speclab_i8_row_bytes((int)(kind - 2), K);
}

static at::Tensor gguf_linear(const at::Tensor &x, const at::Tensor &blocks, int64_t kind, int64_t out_features) {
    TORCH_CHECK(kind >= 0 && kind <= 3, "kind is 0-3 (Q4_1 or Q8_0, float32 or int8 activations), as gguf_kernel.py KINDS numbers them");
    TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2 && x.size(1) > 0 && x.size(1) % 32 == 0 &&
                    x.is_contiguous() && x.device().is_cpu(),
                "the GGUF kernel takes contiguous CPU float32 rows of whole 32-feature blocks");
    const int64_t M = x.size(0), K = x.size(1), N = out_features;
    TORCH_CHECK(blocks.scalar_type() == at::kByte && blocks.dim() == 2 && blocks.is_contiguous() &&
                    blocks.device().is_cpu() && blocks.size(0) == N && blocks.size(1) == row_bytes(kind, K),
                "the blocks do not make an (out_features, in_features) matrix of this kind as the kernel reads it");
    at::Tensor y = at::empty({M, N}, x.options());
    const int threads = M * N * K < SERIAL_BELOW ? 1 : at::get_num_threads();
    const uint8_t *w = blocks.data_ptr<uint8_t>();
    const float *xp = x.data_ptr<float>();
    float *yp = y.data_ptr<float>();
    int failed = 0;
    switch (kind) {
        case 0: speclab_q4_1_linear(xp, M, K, w, N, yp, threads); break;
        case 1: speclab_q8_0_linear(xp, M, K, w, N, yp, threads); break;
        case 2: failed = speclab_q4_1_i8_linear(xp, M, K, w, N, yp, threads); break;
        default: failed = speclab_q8_0_i8_linear(xp, M, K, w, N, yp, threads); break;
    }
    TORCH_CHECK(!failed, "the GGUF kernel could not get memory for the 8-bit activations");
    return y;
}

TORCH_LIBRARY_FRAGMENT(speclab_native, m) { m.def("gguf_linear(Tensor x, Tensor blocks, int kind, int out_features) -> Tensor"); }

TORCH_LIBRARY_IMPL(speclab_native, CPU, m) { m.impl("gguf_linear", gguf_linear); }
