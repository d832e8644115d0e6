"""The C kernel that multiplies float32 activations by GGUF blocks (gguf_kernel.c beside this file).

Why our own kernel: PyTorch's int4 CPU kernel (`aten._weight_int4pack_mm_for_cpu`) is vectorised on
x86 only for bfloat16 activations, with bfloat16 scales and zero points and a bfloat16 output.
A Q4_1 block's float16 scale has 11 significant bits and bfloat16 keeps 8, so most scales would
change (the weights would no longer be the file's), and every layer's output would be rounded to
3 significant digits. Its float32 variant runs a scalar loop, slower than the float32 model
(bench/int4_kernels.py measures both). This kernel keeps the file's weights bit for bit and
float32 everywhere else.

It is compiled once per machine with the C compiler on the PATH (`cc`, or $CC), `-O3 -march=native`
and OpenMP, into the engine's cache folder (~/.cache/speclab/kernels or $SPECLAB_CACHE/kernels),
under a name made from the source, the compiler, its flags and the CPU, so a new CPU or an edited
source builds anew. OpenMP binds to the runtime torch already loaded (libgomp.so.1), so the kernel's
threads are torch's: `torch.get_num_threads()` of them per call. Without a compiler the int4 path
says so and the float32 path still runs.
"""
import ctypes
import hashlib
import os
import shutil
import subprocess
from functools import lru_cache
from pathlib import Path

import torch

from engine.models.errors import ModelLoadError
from engine.models.gguf_blocks import BLOCK_BYTES
from engine.models.machine import cpu_features, cpu_model
from engine.models.presets import cache_root

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


class KernelBuildError(ModelLoadError):
    """The kernel could not be compiled or loaded; the message says why and what still works."""


def compiler() -> str:
    named = os.environ.get("CC")
    found = named or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not found:
        raise KernelBuildError("the int4 target path compiles a small C kernel and found no C compiler (cc, gcc "
                               "or clang; or set CC): install one, or use --target-weights float32")
    return found


def library_path(cc: str, flags: tuple[str, ...]) -> Path:
    key = repr((SOURCE.read_bytes(), cc, flags, cpu_model(), cpu_features()))
    return cache_root() / "kernels" / f"gguf-kernel-{hashlib.sha256(key.encode()).hexdigest()[:16]}.so"


def compile_library(cc: str, flags: tuple[str, ...], out: Path) -> str | None:
    """Compile to `out` atomically; None on success, else the compiler's first error line."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    try:
        done = subprocess.run([cc, *flags, "-o", str(tmp), str(SOURCE)], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as err:
        return str(err)
    if done.returncode != 0:
        tmp.unlink(missing_ok=True)
        lines = [ln for ln in done.stderr.splitlines() if "error" in ln] or done.stderr.splitlines() or ["failed"]
        return lines[0]
    os.replace(tmp, out)
    return None


@lru_cache(maxsize=1)
def library() -> ctypes.CDLL:
    """The compiled kernel, built on first use. With OpenMP unavailable (a compiler without it), a
    single-threaded build."""
    cc = compiler()
    errors = []
    for flags in ((*FLAGS, "-fopenmp"), FLAGS):
        path = library_path(cc, flags)
        error = None if path.is_file() else compile_library(cc, flags, path)
        if error is None:
            lib = ctypes.CDLL(str(path))
            for fn in FUNCTIONS.values():
                getattr(lib, fn).argtypes = ARGTYPES
                getattr(lib, fn).restype = None
            return lib
        errors.append(error)
    raise KernelBuildError(f"the int4 target path could not compile its kernel with {cc}: {errors[0]} "
                           "(use --target-weights float32)")


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
