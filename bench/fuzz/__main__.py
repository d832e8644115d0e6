"""python -m bench.fuzz --cases 1000 --out bench/results: every kind of input the lab reads, fuzzed.

Writes OUT/fuzz-<cpu>.json and .md (bench/common.py names the CPU) and prints the table. Exits with
1 when any case failed, so a script can tell. `--kinds traces --only 17` runs one case again.
"""
import argparse
import sys
import threading
import time
from pathlib import Path

from bench.common import RESULTS, cpu_tag, machine_info, write_results
from bench.fuzz.report import markdown, result_of, table
from bench.fuzz.run import KINDS, Limits, examples, run_kind, tally


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.fuzz", description=__doc__.split("\n")[0])
    p.add_argument("--cases", type=int, default=1000, help="cases per kind (default 1000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kinds", default=",".join(KINDS), help=f"a comma-separated subset of {', '.join(KINDS)}")
    p.add_argument("--only", default=None, help="comma-separated case numbers: run just these (with one kind)")
    p.add_argument("--seconds", type=float, default=Limits.seconds, help="a case's time limit: past it, a hang")
    p.add_argument("--memory-mib", type=int, default=Limits.memory_mib, help="address space a case may add")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--name", default="", help="appended to the results' file name")
    args = p.parse_args(argv)
    unknown = sorted(set(args.kinds.split(",")) - set(KINDS))
    if unknown:
        p.error(f"unknown kinds: {', '.join(unknown)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if threading.active_count() > 1:  # a fork copies only this thread: a lock another one holds would never free
        print(f"warning: {threading.active_count()} threads before forking", file=sys.stderr)
    limits = Limits(args.seconds, args.memory_mib)
    indexes = [int(i) for i in args.only.split(",")] if args.only else list(range(args.cases))
    start, tallies, kept = time.monotonic(), {}, {}
    for kind in args.kinds.split(","):
        records = run_kind(kind, indexes, args.seed, limits)
        tallies[kind], kept[kind] = tally(records), examples(records, args.seed)
        print(f"{kind}: {tallies[kind]}", flush=True)
    machine = machine_info(0)
    settings = {"cases": len(indexes), "seed": args.seed, "kinds": args.kinds.split(","), "only": args.only,
                "seconds": limits.seconds, "memory_mib": limits.memory_mib}
    result = result_of(machine, settings, tallies, kept, time.monotonic() - start)
    stem = f"fuzz-{cpu_tag(machine)}{'-' + args.name if args.name else ''}"
    write_results(args.out, stem, result, markdown(result))
    print("\n".join(table(tallies)))
    print(f"wrote {args.out / stem}.json and .md")
    return 1 if any(t["unknown"] or t["known"] for t in tallies.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
