"""The fuzz run's results: bench/results/fuzz-<cpu>.json (every count, the first failing cases per class
with the command that runs each again) and the same as Markdown.
"""
from bench.common import machine_words
from bench.fuzz.cases import FAILURES, KNOWN

COLUMNS = ("cases", "accepted", "refused", "crashes", "hangs", "memory", "wrong_accepts", "valid_refused", "files_outside")
HEADS = ("kind", "cases", "accepted", "refused", "crashes", "hangs", "memory", "wrong accepts", "valid refused",
         "files outside", "known", "not known")


def result_of(machine: dict, settings: dict, tallies: dict, examples: dict, seconds: float) -> dict:
    return {"machine": machine, "settings": settings, "seconds": round(seconds, 1), "kinds": tallies,
            "examples": examples, "known_defects": {tag: words for tag, (words, _) in KNOWN.items()}}


def table(tallies: dict) -> list[str]:
    lines = ["| " + " | ".join(HEADS) + " |", "|" + "---|" * len(HEADS)]
    for kind, t in tallies.items():
        cells = [kind, *(str(t[c]) for c in COLUMNS), str(sum(t["known"].values())), str(sum(t["unknown"].values()))]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def markdown(result: dict) -> str:
    s, tallies = result["settings"], result["kinds"]
    lines = [f"# Fuzz run: {s['cases']} cases per kind, seed {s['seed']}", "",
             f"Machine: {machine_words(result['machine'])}.",
             f"Each case in its own forked process, {s['seconds']:g} s and {s['memory_mib']} MiB of address space at most; "
             f"the whole run took {result['seconds']:.0f} s. `python -m bench.fuzz --cases {s['cases']} --seed {s['seed']}` "
             "makes the same cases again.", "",
             "A failure is a crash (any other exception, or a refusal that is not one line naming its source), a hang, "
             "running out of memory, a wrong accept (the change broke a rule), a valid case refused, or a file written "
             "outside the folder the entry point may write. *Known*: failures of a defect class the harness was "
             "first written to find (listed below; all fixed since, so a count here means one came back).",
             "", *table(tallies), ""]
    lines += ["## Known defects", ""] + [f"- `{tag}`: {words}" for tag, words in result["known_defects"].items()] + [""]
    for kind, by_class in result["examples"].items():
        if not by_class:
            continue
        lines += [f"## {kind}: first failing cases", ""]
        for failure in FAILURES:
            for e in by_class.get(failure, []):
                known = f" (known: {e['known']})" if e["known"] else ""
                lines.append(f"- **{failure}**{known}, case {e['index']}: {e['change']} (expected {e['expect']}, "
                             f"{e['outcome']}): {e['message'][:240]!r}; `{e['reproduce']}`")
        lines.append("")
    return "\n".join(lines)
