"""The rows kernel's products alone, for one chat step, per ISA, prefetch distance and cache level.

    python -m bench.rows_prefetch --threads 2 --repeats 9
    python -m bench.rows_prefetch --isas avx2,avx512 --distances 4096 --hints l1,l2   # the variants linear_paths times

engine/models/f32_rows_kernel.c asks for memory PREFETCH_FLOATS floats ahead of the weights it reads (4096,
chosen on an Intel Xeon), into L1 or (its `-l2` variants) into L2. This builds the same source with other
distances and times the products of one step of the chat target (every linear layer of its 30 decoder layers
and its 49,152-token output layer, at the target's shapes, weights random: the timing depends on the shapes,
not the values) at 1 to 6 rows. Each round runs every (width, ISA, distance, cache level) once, so that a
drift of the machine falls on all of them. By default the ISA is the best this CPU runs and the level L1 (the
kernel's unmeasured default); `--isas` names others, e.g. the AVX2 tiles on an AVX-512 CPU, whose 512-bit
instructions some CPUs execute as two 256-bit halves. The products' memory limit is their weight bytes over
the copy bandwidth measured here (bench/fast_bench.py's measurement). What a step costs beyond the products
(attention, norms, the graph's other work, the calls into the kernel) is bench/step_limit.py's.
Results: RESULTS/rows-prefetch-CPU.json and .md.
"""
import argparse
import ctypes
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from bench.common import RESULTS, cpu_tag, machine_info, machine_words, write_results
from bench.fast_bench import measured_bandwidth_gbs
from engine.models import f32_rows_kernel
from engine.models.kernel_build import compiler

DISTANCES = (1024, 2048, 4096, 8192, 16384)  # floats; 4096 is the shipped kernel's
# The cache level a tile prefetches its weights into: a variant of the kernel chosen at run time
HINTS = {"l1": 0, "l2": f32_rows_kernel.PREFETCH_L2}
WIDTHS = (1, 2, 3, 4, 5, 6)
# The chat target (SmolLM2-135M): per decoder layer q, k, v, o, gate, up, down as (out, in); then the output layer
LAYER_SHAPES = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)]
SHAPES = LAYER_SHAPES * 30 + [(49152, 576)]


def build(distance: int, folder: Path) -> ctypes.CDLL:
    out = folder / f"rows-{distance}.so"
    subprocess.run([compiler("bench.rows_prefetch", "nothing to time"), "-O3", "-fPIC", "-shared", "-fopenmp",
                    f"-DPREFETCH_FLOATS={distance}", "-o", str(out), str(f32_rows_kernel.SOURCE)], check=True)
    lib = ctypes.CDLL(str(out))
    lib.speclab_f32_rows_linear.argtypes = f32_rows_kernel.LINEAR_ARGS
    lib.speclab_f32_rows_best_isa.restype = ctypes.c_int
    return lib


def one_step(lib: ctypes.CDLL, weights: list[torch.Tensor], xs: dict, width: int, threads: int, isa: int) -> float:
    """Seconds for every product of one step over `width` rows."""
    start = time.perf_counter()
    for w in weights:
        n, k = w.shape
        x, y = xs[(width, k)], torch.empty(width, n)
        lib.speclab_f32_rows_linear(x.data_ptr(), width, k, w.data_ptr(), n, None, y.data_ptr(), threads, isa)
    return time.perf_counter() - start


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--isas", default="", help="comma-separated of scalar, avx2, avx512 (default: the best here)")
    p.add_argument("--distances", default=",".join(map(str, DISTANCES)), help="prefetch distances, floats")
    p.add_argument("--hints", default="l1", help=f"comma-separated cache levels to prefetch into, of {', '.join(HINTS)}")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    distances = [int(d) for d in args.distances.split(",")]
    hints = args.hints.split(",")
    if not set(hints) <= set(HINTS):
        p.error(f"--hints takes {', '.join(HINTS)}")
    isa_names = args.isas.split(",") if args.isas else [f32_rows_kernel.best_isa()]
    isas = [f32_rows_kernel.isa_to_use(name) for name in isa_names]  # refuses one this CPU cannot run
    torch.set_num_threads(args.threads)
    machine = machine_info(args.threads)
    torch.manual_seed(0)
    weights = [torch.randn(n, k) for n, k in SHAPES]
    xs = {(m, k): torch.randn(m, k) for m in WIDTHS for k in {k for _, k in SHAPES}}
    weight_bytes = sum(w.numel() * 4 for w in weights)
    bandwidth = measured_bandwidth_gbs(torch.device("cpu"), False)
    limit_ms = weight_bytes / (bandwidth * 1e9) * 1e3
    with tempfile.TemporaryDirectory() as tmp:
        libs = {d: build(d, Path(tmp)) for d in distances}
        # a way: (ISA name, distance and cache level as a column name), its variant number and its library
        ways = [(name, f"{d} floats, {h}", isa | HINTS[h], libs[d])
                for name, isa in zip(isa_names, isas) for d in distances for h in hints]
        times = {(name, col, m): [] for name, col, _, _ in ways for m in WIDTHS}
        for m in WIDTHS:
            for _, _, isa, lib in ways:
                one_step(lib, weights, xs, m, args.threads, isa)  # warm-up
        for _ in range(args.repeats):  # every (width, way) once a round: a drift of the machine falls on all alike
            for m in WIDTHS:
                for name, col, isa, lib in ways:
                    times[(name, col, m)].append(one_step(lib, weights, xs, m, args.threads, isa) * 1e3)
    median = {key: statistics.median(v) for key, v in times.items()}
    columns = [(name, col) for name, col, _, _ in ways]
    lines = ["## The rows kernel's products for one chat step, per ISA, prefetch distance and cache level "
             "(bench/rows_prefetch.py)",
             "", f"Machine: {machine_words(machine)}; {machine['date']}. The kernel's unmeasured "
             f"default here is {f32_rows_kernel.best_isa()} into L1; the engine times the variants per width "
             "(engine/models/linear_paths.py).",
             f"Weights {weight_bytes / 1e6:.0f} MB, copy bandwidth {bandwidth:.1f} GB/s: memory limit {limit_ms:.1f} ms. "
             f"Medians of {args.repeats} rounds (range in brackets), ms.", "",
             "| rows | " + " | ".join(f"{name}, {col}" for name, col in columns) + " | best / limit |",
             "|---|" + "---|" * (len(columns) + 1)]
    for m in WIDTHS:
        cells = [f"{median[(name, col, m)]:.1f} ({min(times[(name, col, m)]):.1f}-{max(times[(name, col, m)]):.1f})"
                 for name, col in columns]
        best = min(median[(name, col, m)] for name, col in columns)
        lines.append(f"| {m} | " + " | ".join(cells) + f" | {best / limit_ms:.2f}x |")
    text = "\n".join(lines) + "\n"
    write_results(args.out, f"rows-prefetch-{cpu_tag(machine)}",
                  {"machine": machine, "weight_bytes": weight_bytes, "bandwidth_gbs": bandwidth, "limit_ms": limit_ms,
                   "isas": isa_names, "hints": hints,
                   "times_ms": {f"{name}/{col}/{m}": v for (name, col, m), v in times.items()}}, text)
    print(text)


if __name__ == "__main__":
    main()
