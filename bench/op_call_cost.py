"""What one call into the rows kernel costs beyond its arithmetic, per way of calling it.

    python -m bench.op_call_cost --threads 2

A compiled chat step calls the float32 rows kernel once per linear layer (121 times on the own decoder,
whose q/k/v and gate/up are fused). On a 16 x 16 product the arithmetic is nothing, so the time per call is
the call itself: the raw ctypes call; engine/models/f32_rows_kernel.py `linear` (its checks, the output
tensor, then the ctypes call); the custom operator `speclab::f32_rows_linear` from eager Python; and the
same operator inside a torch.compile'd graph (100 calls chained in one function: the graph's own cost per
call); and f32_rows_op.cpp's C++ operator `speclab_native::f32_rows_linear`, eager and in a graph, which is
what compiled graphs call where it builds. A native operator (F.linear) in the same compiled function is the
yardstick. Medians of --repeats
rounds. Results: RESULTS/op-call-cost-CPU.json and .md.
"""
import argparse
import statistics
import time
from pathlib import Path

import torch

from bench.common import RESULTS, cpu_tag, machine_info, machine_words, write_results
from engine.models import f32_rows_kernel as rows

CHAIN = 100  # calls per compiled function
CALLS_PER_STEP = 121  # the own decoder's linear layers in one chat step: 30 x (qkv, o, gate/up, down) + output


def per_call_us(fn, calls: int, rounds: int, per_fn: int = 1) -> list[float]:
    fn()
    out = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - start) / calls / per_fn * 1e6)
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    machine = machine_info(args.threads)
    x, w, y = torch.randn(1, 16), torch.randn(16, 16), torch.empty(1, 16)
    lib, isa = rows.library(), rows.isa_to_use()

    def chained(op):
        def f(v):
            for _ in range(CHAIN):
                v = op(v)
            return v
        return torch.compile(f)

    in_graph = chained(lambda v: rows.compiled_linear(v, w, None, isa))
    native = chained(lambda v: torch.nn.functional.linear(v, w))
    ways = {
        "ctypes call": lambda: lib.speclab_f32_rows_linear(x.data_ptr(), 1, 16, w.data_ptr(), 16, None, y.data_ptr(),
                                                           1, isa),
        "linear() (checks, output, ctypes)": lambda: rows.linear(x, w, None, isa),
        "custom operator, eager": lambda: torch.ops.speclab.f32_rows_linear(x, w, None, isa),
    }
    times = {name: per_call_us(fn, 5000, args.repeats) for name, fn in ways.items()}
    times["custom operator in a compiled graph"] = per_call_us(lambda: in_graph(x), 100, args.repeats, CHAIN)
    times["F.linear in a compiled graph"] = per_call_us(lambda: native(x), 100, args.repeats, CHAIN)
    if rows.prepare_compiled():
        cpp = rows.NATIVE[0]
        times["C++ operator, eager"] = per_call_us(lambda: cpp(x, w, None, isa), 5000, args.repeats)
        cpp_graph = chained(lambda v: cpp(v, w, None, isa))
        times["C++ operator in a compiled graph"] = per_call_us(lambda: cpp_graph(x), 100, args.repeats, CHAIN)
    median = {name: statistics.median(v) for name, v in times.items()}
    extra = median["custom operator in a compiled graph"] - median["F.linear in a compiled graph"]
    lines = ["## One call into the rows kernel, per way of calling it (bench/op_call_cost.py)", "",
             f"Machine: {machine_words(machine)}; {machine['date']}. A 1 x 16 by 16 x 16 product: the time is the "
             f"call's. Medians of {args.repeats} rounds (range in brackets).", "",
             "| way | µs per call |", "|---|---|"]
    lines += [f"| {name} | {median[name]:.1f} ({min(v):.1f}-{max(v):.1f}) |" for name, v in times.items()]
    lines += ["", f"The Python custom operator costs {extra:.1f} µs a call more than a native one inside a compiled "
                  f"graph: {extra * CALLS_PER_STEP / 1e3:.1f} ms over the {CALLS_PER_STEP} calls of one compiled chat step."]
    if "C++ operator in a compiled graph" in median:
        saved = median["custom operator in a compiled graph"] - median["C++ operator in a compiled graph"]
        lines.append(f"The C++ operator saves {saved:.1f} µs of that a call: {saved * CALLS_PER_STEP / 1e3:.1f} ms a step.")
    else:
        lines.append(f"The C++ operator did not build here: {' '.join(rows.NATIVE_MISSING)}")
    text = "\n".join(lines) + "\n"
    write_results(args.out, f"op-call-cost-{cpu_tag(machine)}",
                  {"machine": machine, "times_us": times, "extra_us_per_call": extra,
                   "calls_per_step": CALLS_PER_STEP}, text)
    print(text)


if __name__ == "__main__":
    main()
