"""The C kernel that multiplies float32 activations by GGUF blocks (gguf_kernel.c beside this file).

Why our own kernel: PyTorch's int4 CPU kernel (`aten._weight_int4pack_mm_for_cpu`) is vectorised on
x86 only for bfloat16 activations, with bfloat16 scales and zero points and a bfloat16 output.
A Q4_1 block's float16 scale has 11 significant bits and bfloat16 keeps 8, so most scales would
change (the weights would no longer be the file's), and every layer's output would be rounded to
3 significant digits. Its float32 variant runs a scalar loop, slower than the float32 model
(bench/int4_kernels.py measures both). This kernel keeps the file's weights bit for bit and
float32 everywhere else.

It is compiled once per machine with `-O3 -march=native` and OpenMP by engine/models/kernel_build.py
(the C compiler on the PATH, the engine's cache folder, a name per source, flags and CPU); its
threads are torch's: `torch.get_num_threads()` of them per call. Without a compiler the int4 path
says so and the float32 path still runs.
"""
import ctypes
from functools import lru_cache
from pathlib import Path

import torch

from engine.models.gguf_blocks import BLOCK_BYTES
from engine.models.kernel_build import build

SOURCE = Path(__file__).with_name("gguf_kernel.c")
FLAGS = ("-O3", "-march=native", "-fPIC", "-shared", "-Wall")
FUNCTIONS = {"Q4_1": "speclab_q4_1_linear", "Q8_0": "speclab_q8_0_linear"}
# Products smaller than this many multiply-adds run on one thread: the chat target's k and v projections
# (192 x 576) at one row take ~15 us, about what waking a second thread costs, and on a busy machine each
# parallel region can wait for a descheduled thread (measured under load 4 on 2 cores: a chat step
# 214 ms threading every layer, 137 ms keeping the small ones on one thread). Results do not depend on
# it: every output is computed by one thread, in the same order, however many there are.
SERIAL_BELOW = 1 << 18
ARGTYPES = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
            ctypes.c_int]


@lru_cache(maxsize=1)
def library() -> ctypes.CDLL:
    """The compiled kernel, built on first use (engine/models/kernel_build.py)."""
    return build(SOURCE, FLAGS, {fn: (ARGTYPES, None) for fn in FUNCTIONS.values()},
                 "the int4 target path", "use --target-weights float32")


class BlockMatrix:
    """One layer's blocks, checked once, with the kernel's function bound to them.

    The kernel trusts its arguments, so they are checked: the blocks here, once (their size, dtype and
    contiguity never change), and each call's activations in `__call__`. A chat target step makes 211
    of these calls, so what a call does beyond the kernel is kept to the activation's checks, one
    output tensor and the ctypes call itself."""

    def __init__(self, blocks: torch.Tensor, kind: str, out_features: int, in_features: int) -> None:
        if kind not in FUNCTIONS:
            raise ValueError(f"no kernel for {kind} blocks (the kernel runs {', '.join(FUNCTIONS)})")
        if in_features % 32 or blocks.dtype != torch.uint8 or not blocks.is_contiguous() \
                or tuple(blocks.shape) != (out_features, in_features // 32 * BLOCK_BYTES[kind]):
            raise ValueError(f"{kind} blocks of shape {tuple(blocks.shape)} ({blocks.dtype}) do not make a "
                             f"({out_features}, {in_features}) matrix")
        self.blocks, self.kind = blocks, kind  # the tensor is held, so its memory outlives every call
        self.out_features, self.in_features = out_features, in_features
        self.function = getattr(library(), FUNCTIONS[kind])

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x (M, K) float32 times the blocks' (N, K) matrix transposed: (M, N) float32."""
        if x.dtype != torch.float32 or x.dim() != 2 or x.shape[1] != self.in_features or not x.is_contiguous():
            raise ValueError(f"the GGUF kernel takes contiguous float32 rows of {self.in_features} features, "
                             f"got {x.dtype} {tuple(x.shape)}")
        rows = x.shape[0]
        y = torch.empty(rows, self.out_features, dtype=torch.float32)
        threads = 1 if rows * self.out_features * self.in_features < SERIAL_BELOW else torch.get_num_threads()
        self.function(x.data_ptr(), rows, self.in_features, self.blocks.data_ptr(), self.out_features,
                      y.data_ptr(), threads)
        return y


def linear(x: torch.Tensor, blocks: torch.Tensor, kind: str, out_features: int) -> torch.Tensor:
    """x (M, K) float32 times the blocks' (N, K) matrix transposed: (M, N) float32 (every argument checked)."""
    if x.dim() != 2 or x.shape[1] % 32:
        raise ValueError(f"the GGUF kernel takes contiguous float32 rows of whole blocks, got {x.dtype} {tuple(x.shape)}")
    return BlockMatrix(blocks, kind, out_features, x.shape[1])(x)


# ---------------------------------------------------------------- under torch.compile

@torch.library.custom_op("speclab::gguf_linear", mutates_args=())
def compiled_linear(x: torch.Tensor, blocks: torch.Tensor, kind: str, out_features: int) -> torch.Tensor:
    """`linear` as an operator torch.compile can hold in a graph: dynamo cannot trace into a ctypes call,
    so a compiled forward (engine/cycle/fast_forward.py) calls the kernel through this operator, which
    inductor leaves as one opaque call. Eager forwards keep calling BlockMatrix directly: the operator's
    dispatch would cost more than the kernel does on the small layers."""
    return linear(x, blocks, kind, out_features)


@compiled_linear.register_fake
def _(x: torch.Tensor, blocks: torch.Tensor, kind: str, out_features: int) -> torch.Tensor:
    return x.new_empty(x.shape[0], out_features)  # (M, N) float32: what the kernel writes
