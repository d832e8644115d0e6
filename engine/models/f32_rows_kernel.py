"""Float32 (and bfloat16) linear layers that read each weight once for all of a verify's rows (f32_rows_kernel.c).

Why: a float32 decode step at batch 1 is bound by reading the weights, so a verify over K+1 positions
should cost about one step. Which library torch's `F.linear` reaches (MKL's sgemm on x86; oneDNN for
engine/models/cpu_linear.py's packed twin) and how it treats 2-9 rows depends on the CPU: on a 2-core
AMD EPYC (AVX-512, no AMX) a 3-position chat verify cost 1.9 steps. The kernel streams each weight row
once against up to 8 rows of x held in registers (see the C file for the register blocking), and picks
its AVX-512, AVX2 or plain C variant at run time.

engine/models/linear_paths.py times it as a third path beside the model as loaded and the packed twin,
per machine and per forward width, and runs a width on it only where it was faster.

A bfloat16 model runs the same kernel on its bfloat16 weights: they widen exactly to float32 as they are
loaded, the products and sums are float32, and the result is rounded to bfloat16 once, as F.linear in
bfloat16 does (in another order of sums). So a bfloat16 step reads half a float32 step's bytes, where
torch's own bfloat16 products on a CPU without native bfloat16 (AVX2 only) were slower than float32 at
2-6 rows (bench/results/bf16-rows-*.md).

A float32 layer whose weights are all exact float16 (or bfloat16) numbers, as a checkpoint stored in 16 bits
and loaded as float32 has them, streams a 16-bit copy of them instead (`exact_copy16`): the kernel widens each
weight back to the same float32 number and runs the same products in the same order, so the result is the
float32 weights' to the bit, on half the bytes. The chat preset's draft is stored in float16; its step reads
14 MB instead of 28.

Built once per machine by engine/models/kernel_build.py, without -march=native (the variants carry their
own target attributes). Without a C compiler the path is absent (`unavailable()` says why); the other
two paths still run.

Variants: an ISA (AVX-512, AVX2 or plain C) and where the weights are prefetched to (L1, or L2: the `-l2`
names). Which is fastest depends on the CPU and the rows: on a 2-core AMD EPYC (Zen 4) the AVX2 tiles
prefetching into L2 ran 1 to 6 rows in about the time of one, where the AVX-512 tiles prefetching into L1
took 1.3-1.4x at 5 (bench/results/rows-prefetch-*.md); on an Intel Xeon with AMX the AVX-512 tiles into L1
were the faster ISA (the L2 variants not yet measured there). So engine/models/linear_paths.py times every
variant this CPU runs on the model's own products and runs each width on the fastest (a twin's RowsPlan).
Unmeasured, a product runs the widest ISA prefetching into L1, the kernel's first choice.
SPECLAB_F32_ROWS_ISA=avx2 (or avx2-l2, scalar, ...) forces one variant, for tests and benchmarks.

Under torch.compile the kernel is one opaque operator in the graph. Where a C++ compiler and torch's headers
are at hand, that operator is f32_rows_op.cpp's `speclab_native::f32_rows_linear`, which the graph calls
without Python (`prepare_compiled`); elsewhere it is the Python custom operator `speclab::f32_rows_linear`,
about 30 us dearer a call (bench/op_call_cost.py). Both run the same kernel on the same arguments, so they
give the same bits.
"""
import ctypes
import os
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import torch
from torch import nn

from engine.models.cpu_linear import twin_with
from engine.models.gguf_kernel import SERIAL_BELOW
from engine.models.kernel_build import KernelBuildError, build, load_torch_op
from engine.trace.schema import ROWS_VARIANTS

SOURCE = Path(__file__).with_name("f32_rows_kernel.c")
OP_SOURCE = Path(__file__).with_name("f32_rows_op.cpp")
FLAGS = ("-O3", "-fPIC", "-shared", "-Wall")  # no -march=native: the library dispatches at run time
ISAS = {"scalar": 0, "avx2": 1, "avx512": 2}  # the C file's ISA_* numbers
PREFETCH_L2 = 4  # the C file's flag: prefetch the weights into L2 instead of L1
# every variant by name: an ISA prefetching into L1 (its plain name, the kernel's first form) or into L2
VARIANTS = {**ISAS, "avx2-l2": ISAS["avx2"] | PREFETCH_L2, "avx512-l2": ISAS["avx512"] | PREFETCH_L2}
assert tuple(VARIANTS) == ROWS_VARIANTS  # the names a trace header may record
ISA_ENV = "SPECLAB_F32_ROWS_ISA"
LINEAR_ARGS = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
               ctypes.c_void_p, ctypes.c_int, ctypes.c_int]


@lru_cache(maxsize=1)
def library() -> ctypes.CDLL:
    return build(SOURCE, FLAGS, {"speclab_f32_rows_linear": (LINEAR_ARGS, None),
                                 "speclab_bf16_rows_linear": (LINEAR_ARGS, None),
                                 "speclab_f16_rows_linear": (LINEAR_ARGS, None),
                                 "speclab_f32_rows_best_isa": ([], ctypes.c_int)},
                 "the float32 rows path", "the model as loaded and the packed path still run")


def unavailable() -> str | None:
    """None where the kernel builds and loads here, else one line saying why the path is absent."""
    try:
        library()
    except KernelBuildError as err:
        return str(err)
    return None


def best_isa() -> str:
    """The widest variant this CPU runs."""
    number = library().speclab_f32_rows_best_isa()
    return next(name for name, n in ISAS.items() if n == number)


def isa_to_use(asked: str | None = None) -> int:
    """The variant to run: `asked`, else SPECLAB_F32_ROWS_ISA, else the widest ISA prefetching into L1;
    refused if the CPU lacks its ISA."""
    name = asked or os.environ.get(ISA_ENV) or best_isa()
    if name not in VARIANTS:
        raise ValueError(f"unknown float32 rows variant {name!r} (from {ISA_ENV} or the caller); "
                         f"choose one of {', '.join(VARIANTS)}")
    if VARIANTS[name] & ~PREFETCH_L2 > ISAS[best_isa()]:
        raise ValueError(f"this CPU cannot run the {name} variant of the float32 rows kernel (best: {best_isa()})")
    return VARIANTS[name]


def variant_name(number: int) -> str:
    return next(name for name, n in VARIANTS.items() if n == number)


def candidate_variants(dtype: torch.dtype = torch.float32) -> list[str]:
    """The variants worth timing on this CPU for weights of `dtype`, the unmeasured default first (so a tie
    keeps it): only the one SPECLAB_F32_ROWS_ISA forces, where it is set."""
    if os.environ.get(ISA_ENV):
        return [variant_name(isa_to_use())]
    best = ISAS[best_isa()]
    isas = [n for n in (best, ISAS["avx2"]) if 0 < n <= best]
    names = [variant_name(n | prefetch) for n in dict.fromkeys(isas) for prefetch in (0, PREFETCH_L2)]
    return names or ["scalar"]


DTYPES = (torch.float32, torch.bfloat16)  # the layers the kernel runs
COPY_DTYPES = (torch.float16, torch.bfloat16)  # the 16-bit copies of a float32 layer's weights it reads (exact_copy16)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, isa: int | None = None) -> torch.Tensor:
    """x (M, K) times weight (N, K) transposed, plus bias (N): (M, N), contiguous CPU tensors all of one dtype,
    float32 or bfloat16; or float32 x and bias with a 16-bit copy of a float32 layer's weight (exact_copy16),
    which gives float32 (the kernel trusts its pointers, so every argument is checked here)."""
    n, k = weight.shape
    copy16 = x.dtype == torch.float32 and weight.dtype in COPY_DTYPES
    ok = (((x.dtype == weight.dtype and weight.dtype in DTYPES) or copy16) and x.dim() == 2 and x.shape[1] == k
          and x.is_contiguous() and weight.is_contiguous() and x.device.type == weight.device.type == "cpu"
          and (bias is None or (bias.dtype == x.dtype and bias.shape == (n,) and bias.is_contiguous())))
    if not ok:
        raise ValueError(f"the rows kernel takes contiguous CPU x (M, {k}), weight ({n}, {k}) and bias ({n},) of "
                         f"one dtype, float32 or bfloat16 (or float32 x and bias with a float16 or bfloat16 copy of "
                         f"a float32 weight); got x {x.dtype} {tuple(x.shape)}, weight {weight.dtype} {tuple(weight.shape)}")
    rows = x.shape[0]
    x32 = x.float()  # (M, K): widening is exact (x itself when float32)
    bias32 = None if bias is None else bias.float()
    y = torch.empty(rows, n, dtype=torch.float32)
    threads = 1 if rows * n * k < SERIAL_BELOW else torch.get_num_threads()
    run = {torch.float32: library().speclab_f32_rows_linear, torch.bfloat16: library().speclab_bf16_rows_linear,
           torch.float16: library().speclab_f16_rows_linear}[weight.dtype]
    run(x32.data_ptr(), rows, k, weight.data_ptr(), n, None if bias32 is None else bias32.data_ptr(), y.data_ptr(),
        threads, isa_to_use() if isa is None else isa)
    return y.to(x.dtype)  # (M, N), rounded once to bfloat16 for a bfloat16 layer


# Weights checked before a whole weight is converted: most float32 layers fail within them.
COPY_PROBE = 4096


def exact_copy16(weight: torch.Tensor) -> torch.Tensor | None:
    """A float16 (else bfloat16) copy of a float32 weight that widens back to it exactly, or None when
    neither holds every weight (the weights came from float32 training or from dequantised blocks)."""
    if weight.dtype != torch.float32 or weight.device.type != "cpu":
        return None
    w = weight.detach()
    probe = w.reshape(-1)[:COPY_PROBE]
    for dtype in COPY_DTYPES:
        if torch.equal(probe.to(dtype).float(), probe):
            copy = w.to(dtype).contiguous()
            if torch.equal(copy.float(), w):
                return copy
    return None


def weight_read(weight: torch.Tensor) -> torch.Tensor:
    """The weight the kernel reads for a layer: its exact 16-bit copy where there is one, else the weight."""
    copy = exact_copy16(weight)
    return weight.detach() if copy is None else copy


# ---------------------------------------------------------------- under torch.compile

@torch.library.custom_op("speclab::f32_rows_linear", mutates_args=())
def compiled_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, isa: int) -> torch.Tensor:
    """`linear` as one opaque operator in a compiled graph: dynamo cannot trace into a ctypes call (as
    engine/models/gguf_kernel.py compiled_linear). Eager forwards call `linear` directly: the operator's
    dispatch costs more than the kernel on the small layers."""
    return linear(x, weight, bias, isa)


@compiled_linear.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, isa: int) -> torch.Tensor:
    return x.new_empty(x.shape[0], weight.shape[0])  # (M, N) in x's dtype: what `linear` returns


NATIVE: list = [None]  # the C++ operator once prepare_compiled() loaded it; read by RowsLinear under compile
NATIVE_MISSING: list[str] = []  # why it could not be built, where it could not


@lru_cache(maxsize=1)
def prepare_compiled() -> bool:
    """Build (once per machine) and load the C++ operator for compiled graphs; False, with the reason in
    NATIVE_MISSING, where it cannot be built: compiled graphs then call the Python custom operator."""
    try:
        library()  # the C kernel itself must build first: without it there is no rows path at all
    except KernelBuildError as err:
        NATIVE_MISSING.append(" ".join(str(err).split()))
        return False
    NATIVE[0], missing = load_torch_op(
        SOURCE, OP_SOURCE, (f"-DSPECLAB_SERIAL_BELOW={SERIAL_BELOW}",), (), "speclab_native::f32_rows_linear",
        native_fake, "the float32 rows operator for compiled graphs",
        "compiled graphs call the kernel through its Python operator instead")
    NATIVE_MISSING.extend([missing] if missing else [])
    return NATIVE[0] is not None


def native_fake(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, isa: int) -> torch.Tensor:
    return x.new_empty(x.shape[0], weight.shape[0])  # (M, N) in x's dtype: what the operator returns


@dataclass
class RowsPlan:
    """The kernel variant for a product of each number of rows, shared by all of a twin's layers so that
    settling the machine's measurement (engine/models/linear_paths.py) reaches every one at once."""

    default: int  # a variant number (VARIANTS)
    by_rows: dict[int, int] = field(default_factory=dict)

    def variant(self, rows: int) -> int:
        return self.by_rows.get(rows, self.default)


class RowsLinear(nn.Module):
    """`F.linear(x, weight, bias)` through the rows kernel, sharing the layer's weight and bias."""

    def __init__(self, layer: nn.Linear, plan: RowsPlan) -> None:
        super().__init__()
        self.in_features, self.out_features = layer.in_features, layer.out_features
        self.weight, self.bias = layer.weight, layer.bias  # shared with the model, never copied
        self.plan = plan
        # the only copy a twin makes: half the float32 bytes, read instead of them where it gives the same bits
        self.register_buffer("copy16", exact_copy16(layer.weight), persistent=False)  # (N, K) or None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() or x.dtype != self.weight.dtype or x.dtype not in DTYPES:
            return nn.functional.linear(x, self.weight, self.bias)  # training or another dtype: as loaded
        flat = x.reshape(-1, self.in_features).contiguous()  # (M, K)
        weight = self.weight.detach() if self.copy16 is None else self.copy16
        bias = None if self.bias is None else self.bias.detach()
        variant = self.plan.variant(flat.shape[0])  # a constant in a compiled graph: its rows are fixed
        if torch.compiler.is_compiling():
            native = NATIVE[0]  # set before compiling (prepare_compiled): no build while a graph is traced
            y = (native if native is not None else compiled_linear)(flat, weight, bias, variant)
        else:
            y = linear(flat, weight, bias, variant)  # (M, N)
        return y.reshape(*x.shape[:-1], self.out_features)


def rows_twin(model: nn.Module, isa: str | None = None) -> nn.Module:
    """A copy of `model`'s module tree sharing its parameters, every nn.Linear on the rows kernel; its
    `rows_plan` names the variant per number of rows (`isa` or isa_to_use()'s for every one, until set)."""
    plan = RowsPlan(isa_to_use(isa))
    twin = twin_with(model, lambda layer, output: RowsLinear(layer, plan))
    twin.rows_plan = plan
    return twin
