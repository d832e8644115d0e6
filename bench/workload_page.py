"""The Workload page's first chart on a bundled 100-request workload, in headless Chromium.

    python -m bench.workload_page [--repeats 5]

One fresh `streamlit run app/main.py`; the page /workload opens on the first bundled workload
(assets/workloads/, by name). bench/app_speed.py's time_pages times, from navigation, the first
chart drawn (its FIRST_RESULT selector: the categories chart is the page's first chart), cold and
then warm (each round a new visitor and a returning browser), beside bench/floor_page.py's reference pages
(a title and one small chart: the floor any chart page pays here). Goal: first chart within 2 s warm.
Writes bench/results/workload-page-CPU.json and .md.
"""
import argparse
import os
from pathlib import Path

from bench.app_speed import HERE, REFERENCE_PAGES, pages_markdown, time_pages
from bench.common import RESULTS, cpu_tag, machine_info, machine_words, write_results

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default=str(RESULTS))
    args = p.parse_args(argv)
    env = {k: v for k, v in os.environ.items() if k != "SPECLAB_TRACE"}
    first = sorted((ROOT / "assets" / "workloads").glob("*.zip"))[0]
    pages = time_pages(env, args.repeats, pages={f"Workload ({first.stem})": "workload"})
    # the floor on this machine now: a page with a title and one small chart, nothing else
    pages.update(time_pages(env, args.repeats, script=HERE / "floor_page.py", pages=REFERENCE_PAGES))
    machine = machine_info(0)
    text = "\n".join(["## Workload page, first chart (bench/workload_page.py)", f"Machine: {machine_words(machine)}",
                      *pages_markdown(pages)])
    write_results(Path(args.out), f"workload-page-{cpu_tag(machine)}", {"machine": machine, "workload": first.name,
                                                           "pages": pages}, text, indent=2)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
