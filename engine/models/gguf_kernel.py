"""The C kernel that multiplies float32 activations by GGUF blocks (gguf_kernel.c beside this file).

Why our own kernel: PyTorch's int4 CPU kernel (`aten._weight_int4pack_mm_for_cpu`) is vectorised on
x86 only for bfloat16 activations, with bfloat16 scales and zero points and a bfloat16 output.
A Q4_1 block's float16 scale has 11 significant bits and bfloat16 keeps 8, so most scales would
change (the weights would no longer be the file's), and every layer's output would be rounded to
3 significant digits. Its float32 variant runs a scalar loop, slower than the float32 model
(bench/int4_kernels.py measures both). This kernel keeps the file's weights bit for bit and
float32 everywhere else.

Its second arithmetic, asked for by name (ACTIVATIONS_INT8, the int4-a8 weights path), rounds each block of 32
activations to 8 bits first, as llama.cpp does, so that the products run in integer instructions: faster, and
no longer the float32 model's numbers (the C file says exactly what it computes). It reads the blocks repacked
once (`pack_i8`), 4 bytes of 8 blocks side by side, so that a row of x scales 8 blocks' sums at once: a verify's
extra rows then cost little beside the weights' stream. VNNI's one-instruction byte products where the CPU has
them (AVX512-VNNI, as on the AVX-512 EPYC and the Xeon with AMX), AVX2's two-step ones elsewhere.

It is compiled once per machine with `-O3 -march=native` and OpenMP by engine/models/kernel_build.py
(the C compiler on the PATH, the engine's cache folder, a name per source, flags and CPU); its
threads are torch's: `torch.get_num_threads()` of them per call. Without a compiler the int4 path
says so and the float32 path still runs.

Under torch.compile the kernel is one opaque operator in the graph: gguf_op.cpp's `speclab_native::gguf_linear`
where a C++ compiler and torch's headers are at hand (`prepare_compiled`), which the graph calls without Python,
else the Python custom operator `speclab::gguf_linear`, about 30 us dearer a call. Both run the same kernel on
the same arguments, so they give the same bits.
"""
import ctypes
from functools import lru_cache
from pathlib import Path

import torch

from engine.models.gguf_blocks import BLOCK_BYTES
from engine.models.kernel_build import KernelBuildError, build, load_torch_op

SOURCE = Path(__file__).with_name("gguf_kernel.c")
OP_SOURCE = Path(__file__).with_name("gguf_op.cpp")
FLAGS = ("-O3", "-march=native", "-fPIC", "-shared", "-Wall")
ACTIVATIONS_FLOAT32, ACTIVATIONS_INT8 = "float32", "int8"
# (block type, activations) -> the C function; the C++ operator numbers them in this order (gguf_op.cpp)
FUNCTIONS = {("Q4_1", ACTIVATIONS_FLOAT32): "speclab_q4_1_linear", ("Q8_0", ACTIVATIONS_FLOAT32): "speclab_q8_0_linear",
             ("Q4_1", ACTIVATIONS_INT8): "speclab_q4_1_i8_linear", ("Q8_0", ACTIVATIONS_INT8): "speclab_q8_0_i8_linear"}
KINDS = {key: number for number, key in enumerate(FUNCTIONS)}
BLOCK_TYPES = ("Q4_1", "Q8_0")
# Products smaller than this many multiply-adds run on one thread: the chat target's k and v projections
# (192 x 576) at one row take ~15 us, about what waking a second thread costs, and on a busy machine each
# parallel region can wait for a descheduled thread (measured under load 4 on 2 cores: a chat step
# 214 ms threading every layer, 137 ms keeping the small ones on one thread). Results do not depend on
# it: every output is computed by one thread, in the same order, however many there are.
SERIAL_BELOW = 1 << 18
ARGTYPES = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
            ctypes.c_int]


PACKING = {"speclab_i8_row_bytes": ([ctypes.c_int, ctypes.c_int64], ctypes.c_int64),
           "speclab_i8_pack": ([ctypes.c_int, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p], None)}


@lru_cache(maxsize=1)
def library() -> ctypes.CDLL:
    """The compiled kernel, built on first use (engine/models/kernel_build.py)."""
    # the int8 functions return -1 where their scratch memory could not be had
    functions = {fn: (ARGTYPES, ctypes.c_int if "_i8_" in fn else None) for fn in FUNCTIONS.values()}
    return build(SOURCE, FLAGS, functions | PACKING, "the int4 target path", "use --target-weights float32")


def kernel_row_bytes(kind: str, in_features: int, activations: str) -> int:
    """Bytes of one row of W as the kernel reads it: the GGUF blocks for float32 activations, the packed
    layout for int8 ones (a little more: Q8_0's scales widened to float32, and where K / 32 is not a multiple of 8,
    a scale for each lane)."""
    if activations == ACTIVATIONS_FLOAT32:
        return in_features // 32 * BLOCK_BYTES[kind]
    return library().speclab_i8_row_bytes(BLOCK_TYPES.index(kind), in_features)


def pack_i8(blocks: torch.Tensor, kind: str, out_features: int, in_features: int) -> torch.Tensor:
    """A matrix's GGUF blocks (N, K/32 * block bytes) in the layout the 8-bit-activation functions read
    (gguf_kernel.c speclab_i8_pack): (N, kernel_row_bytes) uint8, the same integers and scales moved."""
    check_blocks(blocks, kind, out_features, in_features)
    packed = torch.empty(out_features, kernel_row_bytes(kind, in_features, ACTIVATIONS_INT8), dtype=torch.uint8)
    library().speclab_i8_pack(BLOCK_TYPES.index(kind), blocks.data_ptr(), out_features, in_features, packed.data_ptr())
    return packed


def check_blocks(blocks: torch.Tensor, kind: str, out_features: int, in_features: int) -> None:
    if kind not in BLOCK_TYPES:
        raise ValueError(f"no kernel for {kind} blocks (the kernel runs {', '.join(BLOCK_TYPES)})")
    if in_features % 32 or blocks.dtype != torch.uint8 or not blocks.is_contiguous() \
            or tuple(blocks.shape) != (out_features, in_features // 32 * BLOCK_BYTES[kind]):
        raise ValueError(f"{kind} blocks of shape {tuple(blocks.shape)} ({blocks.dtype}) do not make a "
                         f"({out_features}, {in_features}) matrix")


class BlockMatrix:
    """One layer's blocks, checked once, with the kernel's function bound to them.

    The kernel trusts its arguments, so they are checked: the blocks here, once (their size, dtype and
    contiguity never change), and each call's activations in `__call__`. A chat target step makes 211
    of these calls, so what a call does beyond the kernel is kept to the activation's checks, one
    output tensor and the ctypes call itself."""

    def __init__(self, blocks: torch.Tensor, kind: str, out_features: int, in_features: int,
                 activations: str = ACTIVATIONS_FLOAT32, packed: torch.Tensor | None = None) -> None:
        check_blocks(blocks, kind, out_features, in_features)
        if (kind, activations) not in FUNCTIONS:
            raise ValueError(f"no kernel for {activations} activations (float32 or int8)")
        if activations == ACTIVATIONS_INT8:
            packed = pack_i8(blocks, kind, out_features, in_features) if packed is None else packed
            if packed.dtype != torch.uint8 or not packed.is_contiguous() or tuple(packed.shape) != (
                    out_features, kernel_row_bytes(kind, in_features, activations)):
                raise ValueError(f"packed {kind} rows of shape {tuple(packed.shape)} are not this matrix's")
        # what the kernel reads, held: the memory outlives every call
        self.weights = blocks if activations == ACTIVATIONS_FLOAT32 else packed
        self.kind, self.activations = kind, activations
        self.out_features, self.in_features = out_features, in_features
        self.function = getattr(library(), FUNCTIONS[kind, activations])

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x (M, K) float32 times the blocks' (N, K) matrix transposed: (M, N) float32."""
        return run(self.function, x, self.weights, self.out_features, self.in_features)


def run(function, x: torch.Tensor, weights: torch.Tensor, out_features: int, in_features: int) -> torch.Tensor:
    """One kernel call on weights already checked; the activations are checked here, on every call."""
    if x.dtype != torch.float32 or x.dim() != 2 or x.shape[1] != in_features or not x.is_contiguous():
        raise ValueError(f"the GGUF kernel takes contiguous float32 rows of {in_features} features, "
                         f"got {x.dtype} {tuple(x.shape)}")
    rows = x.shape[0]
    y = torch.empty(rows, out_features, dtype=torch.float32)
    threads = 1 if rows * out_features * in_features < SERIAL_BELOW else torch.get_num_threads()
    if function(x.data_ptr(), rows, in_features, weights.data_ptr(), out_features, y.data_ptr(), threads):
        raise MemoryError(f"the GGUF kernel could not get {rows * in_features} bytes for the 8-bit activations")
    return y


def linear(x: torch.Tensor, blocks: torch.Tensor, kind: str, out_features: int,
           activations: str = ACTIVATIONS_FLOAT32) -> torch.Tensor:
    """x (M, K) float32 times the blocks' (N, K) matrix transposed: (M, N) float32 (every argument checked)."""
    if x.dim() != 2 or x.shape[1] % 32:
        raise ValueError(f"the GGUF kernel takes contiguous float32 rows of whole blocks, got {x.dtype} {tuple(x.shape)}")
    return BlockMatrix(blocks, kind, out_features, x.shape[1], activations)(x)


# ---------------------------------------------------------------- under torch.compile

@torch.library.custom_op("speclab::gguf_linear", mutates_args=())
def compiled_linear(x: torch.Tensor, weights: torch.Tensor, kind: str, out_features: int,
                    activations: str) -> torch.Tensor:
    """x times a matrix held as the kernel reads it (the blocks, or for int8 activations their packed
    copy), as an operator torch.compile can hold in a graph: dynamo cannot trace into a ctypes call, so a
    compiled forward (engine/cycle/fast_forward.py) calls the kernel through this operator, which inductor
    leaves as one opaque call. Eager forwards keep calling BlockMatrix directly: the operator's dispatch
    would cost more than the kernel does on the small layers."""
    if (kind, activations) not in FUNCTIONS or x.dim() != 2 or x.shape[1] % 32 or weights.dtype != torch.uint8 \
            or not weights.is_contiguous() \
            or tuple(weights.shape) != (out_features, kernel_row_bytes(kind, x.shape[1], activations)):
        raise ValueError(f"{kind} weights of shape {tuple(weights.shape)} are not an ({out_features}, "
                         f"{x.shape[-1]}) matrix as the kernel reads it for {activations} activations")
    return run(getattr(library(), FUNCTIONS[kind, activations]), x, weights, out_features, x.shape[1])


@compiled_linear.register_fake
def _(x: torch.Tensor, weights: torch.Tensor, kind: str, out_features: int, activations: str) -> torch.Tensor:
    return x.new_empty(x.shape[0], out_features)  # (M, N) float32: what the kernel writes


NATIVE: list = [None]  # the C++ operator once prepare_compiled() loaded it; read by GGUFLinear under compile
NATIVE_MISSING: list[str] = []  # why it could not be built, where it could not


@lru_cache(maxsize=1)
def prepare_compiled() -> bool:
    """Build (once per machine) and load the C++ operator for compiled graphs; False, with the reason in
    NATIVE_MISSING, where it cannot be built: compiled graphs then call the Python custom operator."""
    try:
        library()  # the C kernel itself must build first: without it there is no int4 path at all
    except KernelBuildError as err:
        NATIVE_MISSING.append(" ".join(str(err).split()))
        return False
    NATIVE[0], missing = load_torch_op(
        SOURCE, OP_SOURCE, (f"-DSPECLAB_SERIAL_BELOW={SERIAL_BELOW}",), ("-march=native",),
        "speclab_native::gguf_linear", native_fake, "the int4 operator for compiled graphs",
        "compiled graphs call the kernel through its Python operator instead")
    NATIVE_MISSING.extend([missing] if missing else [])
    return NATIVE[0] is not None


def native_fake(x: torch.Tensor, weights: torch.Tensor, kind: int, out_features: int) -> torch.Tensor:
    return x.new_empty(x.shape[0], out_features)  # (M, N) float32: what the kernel writes
