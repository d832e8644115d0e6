// The float32 rows kernel (f32_rows_kernel.c) as a torch operator a compiled graph calls without Python.
//
// Why: inside a torch.compile'd graph, a call to the Python custom operator speclab::f32_rows_linear costs
// about 30 us before the kernel starts (the operator's dispatch into Python, then the checks and the ctypes
// call): 3.6 ms of a compiled chat step's 121 calls on a 2-core AMD EPYC (bench/op_call_cost.py). Registered
// here, the graph calls the kernel through the dispatcher alone (about 6 us a call). The arguments are
// checked as f32_rows_kernel.py `linear` checks them: the kernel trusts its pointers.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

extern "C" void speclab_f32_rows_linear(const float *x, int64_t M, int64_t K, const float *w, int64_t N,
                                        const float *bias, float *y, int threads, int isa);
extern "C" void speclab_bf16_rows_linear(const float *x, int64_t M, int64_t K, const uint16_t *w, int64_t N,
                                         const float *bias, float *y, int threads, int isa);
extern "C" void speclab_f16_rows_linear(const float *x, int64_t M, int64_t K, const uint16_t *w, int64_t N,
                                        const float *bias, float *y, int threads, int isa);

// Products smaller than this run on one thread (mirror of engine/models/gguf_kernel.py SERIAL_BELOW): waking
// a second thread costs more than it saves there. Only the speed depends on it: every thread count gives the
// same bits.
static const int64_t SERIAL_BELOW = SPECLAB_SERIAL_BELOW;

// As f32_rows_kernel.py `linear`: float32 weights; bfloat16 ones with x and bias in bfloat16 too, widened to
// float32 for the kernel, the result rounded once to bfloat16; or a float32 layer's exact 16-bit copy (float16
// or bfloat16 weights, x and bias float32), whose result is float32.
static at::Tensor f32_rows_linear(const at::Tensor &x, const at::Tensor &w, const std::optional<at::Tensor> &bias,
                                  int64_t isa) {
    const auto dtype = w.scalar_type();
    const bool copy16 = x.scalar_type() == at::kFloat && (dtype == at::kHalf || dtype == at::kBFloat16);
    TORCH_CHECK((((dtype == at::kFloat || dtype == at::kBFloat16) && x.scalar_type() == dtype) || copy16) &&
                    x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1) && x.is_contiguous() && w.is_contiguous() &&
                    x.device().is_cpu() && w.device().is_cpu(),
                "the rows kernel takes contiguous CPU x (M, K) and weight (N, K) of one dtype, float32 or bfloat16, "
                "or float32 x with a float16 or bfloat16 copy of a float32 layer's weight");
    TORCH_CHECK((isa & ~4) >= 0 && (isa & ~4) <= 2,
                "isa is a variant: 0 (plain C), 1 (AVX2) or 2 (AVX-512), plus 4 to prefetch into L2, as "
                "f32_rows_kernel.py chose it");
    const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
    const bool bf16 = dtype == at::kBFloat16 && !copy16;  // a bfloat16 layer: its result is rounded to bfloat16
    at::Tensor b32;
    if (bias.has_value()) {
        TORCH_CHECK(bias->scalar_type() == x.scalar_type() && bias->dim() == 1 && bias->size(0) == N &&
                        bias->is_contiguous() && bias->device().is_cpu(),
                    "the rows kernel takes a contiguous CPU bias (N,) of x's dtype");
        b32 = bias->to(at::kFloat);
    }
    const at::Tensor x32 = bf16 ? x.to(at::kFloat) : x;  // (M, K): widening is exact
    at::Tensor y = at::empty({M, N}, x32.options());
    const float *b = b32.defined() ? b32.data_ptr<float>() : nullptr;
    const int threads = M * N * K < SERIAL_BELOW ? 1 : at::get_num_threads();
    if (dtype == at::kHalf)
        speclab_f16_rows_linear(x32.data_ptr<float>(), M, K, reinterpret_cast<const uint16_t *>(w.data_ptr()), N, b,
                                y.data_ptr<float>(), threads, static_cast<int>(isa));
    else if (dtype == at::kBFloat16)
        speclab_bf16_rows_linear(x32.data_ptr<float>(), M, K, reinterpret_cast<const uint16_t *>(w.data_ptr()), N, b,
                                 y.data_ptr<float>(), threads, static_cast<int>(isa));
    else
        speclab_f32_rows_linear(x32.data_ptr<float>(), M, K, w.data_ptr<float>(), N, b, y.data_ptr<float>(), threads,
                                static_cast<int>(isa));
    return bf16 ? y.to(at::kBFloat16) : y;
}

TORCH_LIBRARY_FRAGMENT(speclab_native, m) { m.def("f32_rows_linear(Tensor x, Tensor weight, Tensor? bias, int isa) -> Tensor"); }

TORCH_LIBRARY_IMPL(speclab_native, CPU, m) { m.impl("f32_rows_linear", f32_rows_linear); }
