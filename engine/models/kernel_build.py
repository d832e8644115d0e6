"""Compiling the engine's small C kernels once per machine and loading them with ctypes.

Used by engine/models/gguf_kernel.py (int4 blocks) and engine/models/f32_rows_kernel.py (float32
rows). A kernel is compiled with the C compiler on the PATH (`cc`, or $CC) into the engine's cache
folder (~/.cache/speclab/kernels or $SPECLAB_CACHE/kernels), under a name made from the source, the
compiler, its flags and the CPU, so a new CPU or an edited source builds anew. With OpenMP the
library binds to the runtime torch already loaded (libgomp.so.1), so the kernel's threads are
torch's; a compiler without OpenMP gives a single-threaded build. `build_torch_op` also compiles a C
kernel with a C++ file that registers it as a torch operator (against torch's own headers and libraries),
for compiled graphs to call without Python.
"""
import ctypes
import hashlib
import os
import shutil
import subprocess
from functools import lru_cache
from pathlib import Path

from engine.models.errors import ModelLoadError
from engine.models.machine import cpu_features, cpu_model
from engine.models.presets import cache_root


class KernelBuildError(ModelLoadError):
    """A kernel could not be compiled or loaded; the message says why and what still works."""


def compiler(needed_by: str, instead: str) -> str:
    """The C compiler to use, or a refusal naming what needs it and what to do `instead`."""
    named = os.environ.get("CC")
    found = named or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not found:
        raise KernelBuildError(f"{needed_by} compiles a small C kernel and found no C compiler (cc, gcc "
                               f"or clang; or set CC): install one, or {instead}")
    return found


def library_path(source: Path, cc: str, flags: tuple[str, ...]) -> Path:
    key = repr((source.read_bytes(), cc, flags, cpu_model(), cpu_features()))
    return cache_root() / "kernels" / f"{source.stem.replace('_', '-')}-{hashlib.sha256(key.encode()).hexdigest()[:16]}.so"


def compile_library(source: Path, cc: str, flags: tuple[str, ...], out: Path) -> str | None:
    """Compile to `out` atomically; None on success, else the compiler's first error line."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    error = run_compiler([cc, *flags, "-o", str(tmp), str(source)], timeout=300)
    if error is not None:
        tmp.unlink(missing_ok=True)
        return error
    os.replace(tmp, out)
    return None


def build(source: Path, flags: tuple[str, ...], signatures: dict[str, tuple[list, object]],
          needed_by: str, instead: str) -> ctypes.CDLL:
    """`source` compiled (with OpenMP, else without) and loaded, each function in `signatures`
    (name -> (argtypes, restype)) typed. Callers cache the result (functools.lru_cache)."""
    cc = compiler(needed_by, instead)
    errors = []
    for flag_set in ((*flags, "-fopenmp"), flags):
        path = library_path(source, cc, flag_set)
        error = None if path.is_file() else compile_library(source, cc, flag_set, path)
        if error is None:
            lib = ctypes.CDLL(str(path))
            for name, (argtypes, restype) in signatures.items():
                getattr(lib, name).argtypes = argtypes
                getattr(lib, name).restype = restype
            return lib
        errors.append(error)
    raise KernelBuildError(f"{needed_by} could not compile its kernel with {cc}: {errors[0]} ({instead})")


def run_compiler(command: list[str], timeout: int = 600) -> str | None:
    """None on success, else the compiler's first error line (or why it did not run)."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as err:
        return str(err)
    if done.returncode == 0:
        return None
    lines = [ln for ln in done.stderr.splitlines() if "error" in ln] or done.stderr.splitlines() or ["failed"]
    return lines[0]


def build_torch_op(c_source: Path, cpp_source: Path, defines: tuple[str, ...], needed_by: str, instead: str,
                   c_flags: tuple[str, ...] = ()) -> Path:
    """`c_source` and `cpp_source` (which registers a torch operator around it) compiled into one library for
    torch.ops.load_library, kept in the cache folder under a name made from both sources, the compilers, the
    defines, torch's version and the CPU. `c_flags` go to the C compile only (-march=native for a kernel that
    picks its code at compile time). KernelBuildError where no C++ compiler, torch's headers or a step fails."""
    import torch
    from torch.utils import cpp_extension

    cc = compiler(needed_by, instead)
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if not cxx:
        raise KernelBuildError(f"{needed_by} needs a C++ compiler (c++, g++ or clang++; or set $CXX): {instead}")
    abi = f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"
    key = repr((c_source.read_bytes(), cpp_source.read_bytes(), cc, cxx, defines, c_flags, abi, torch.__version__,
                cpu_model(), cpu_features()))
    out = cache_root() / "kernels" / f"{cpp_source.stem.replace('_', '-')}-{hashlib.sha256(key.encode()).hexdigest()[:16]}.so"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    work = out.with_suffix(f".{os.getpid()}.d")
    work.mkdir(exist_ok=True)
    includes = [f"-I{p}" for p in cpp_extension.include_paths()]
    libs = [f"-L{p}" for p in cpp_extension.library_paths()] + ["-lc10", "-ltorch_cpu", "-ltorch"]
    steps = [[cc, "-O3", "-fPIC", "-fopenmp", *c_flags, *defines, "-c", str(c_source), "-o", str(work / "kernel.o")],
             [cxx, "-O2", "-fPIC", "-std=c++20", abi, *defines, *includes, "-c", str(cpp_source), "-o",
              str(work / "op.o")],
             [cxx, "-shared", "-fopenmp", str(work / "op.o"), str(work / "kernel.o"), *libs, "-o", str(work / "op.so")]]
    try:
        for step in steps:
            error = run_compiler(step)
            if error is not None:
                raise KernelBuildError(f"{needed_by} could not be compiled with {step[0]}: {error} ({instead})")
        os.replace(work / "op.so", out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


@lru_cache(maxsize=None)
def load_torch_op(c_source: Path, cpp_source: Path, defines: tuple[str, ...], c_flags: tuple[str, ...],
                  qualified_name: str, fake, needed_by: str, instead: str):
    """The operator `qualified_name` ("namespace::name") built by build_torch_op, loaded, with `fake` (its output
    shape for tracing) registered: (operator, None), or (None, why) where it cannot be built or loaded. Cached:
    a library loads, and a fake registers, once per process (a second registration is an error)."""
    import torch

    try:
        path = build_torch_op(c_source, cpp_source, defines, needed_by, instead, c_flags)
        torch.ops.load_library(str(path))
    except (KernelBuildError, OSError, RuntimeError) as err:
        return None, " ".join(str(err).split())
    torch.library.register_fake(qualified_name)(fake)
    namespace, name = qualified_name.split("::")
    return getattr(getattr(torch.ops, namespace), name), None
