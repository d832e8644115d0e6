"""Writing speed-benchmark results (bench/speed.py): JSON, a Markdown table per pair, and one page for all pairs."""
import json
from pathlib import Path

from bench.common import machine_words, write_results
from engine.trace.schema import DRAFT_MODEL, EAGLE

# (ratio, threshold, which settings it applies to: (pair name, setting, drafter), wording) - the
# targets of the speed issue and, for the EAGLE head on the chat pair, of the EAGLE issue.
TARGETS = [
    ("a/c", 1.0, lambda name, st, drafter: True, "engine (tracing on) at least as fast as HF assisted generation"),
    ("a/d", 1.5, lambda name, st, drafter: name == "tiny-shakespeare" and st["temperature"] == 0,
     "1.5x plain HF decoding on tiny-shakespeare, greedy"),
    ("a/d", 1.1, lambda name, st, drafter: name == "chat" and drafter == DRAFT_MODEL,
     "1.1x plain HF decoding on chat at the advisor's best K"),
    ("a/d", 1.4, lambda name, st, drafter: name == "chat" and drafter == EAGLE and st["temperature"] == 0,
     "1.4x plain HF decoding on chat with the EAGLE head, greedy"),
    ("a/d", 1.3, lambda name, st, drafter: name == "chat" and drafter == EAGLE and st["temperature"] == 1,
     "1.3x plain HF decoding on chat with the EAGLE head, T=1"),
    ("a/b", 0.95, lambda name, st, drafter: True, "tracing costs at most 5%"),
    ("fraction_of_leviathan", 0.8, lambda name, st, drafter: True,
     "measured speedup at least 80% of Leviathan's prediction"),
]
# The int4 weights path's targets, for results on that path.
INT4_TARGETS = [
    ("a/f", 1.0, lambda name, st, drafter: name == "chat" and st["temperature"] == 0,
     "chat speculative decoding, tracing on, at least as fast as llama.cpp's plain decoding of the same GGUF"),
    ("a/e", 1.3, lambda name, st, drafter: name == "chat",
     "a/e' >= 1.3, e' our own plain decoding on the same int4 path"),
]


def drafter_of(result: dict) -> str:
    """What drafted in methods a and b; results written before --drafter existed used the draft model."""
    return result.get("drafter", DRAFT_MODEL)


def drafter_lines(result: dict) -> list[str]:
    """Said beside the table: which drafter ran in (a)/(b), and what (c) compares against."""
    if drafter_of(result) == DRAFT_MODEL:
        return [f"Drafter: the separate draft model {result['draft']} in (a), (b) and (c)."]
    name = result.get("drafter_name") or drafter_of(result)
    return [f"Drafter: (a) and (b) ran our engine with the {drafter_of(result).upper()} head {name}, which drafts "
            f"from the target's own features. (c) is Hugging Face assisted generation with today's separate draft "
            f"model {result['draft']}, because Hugging Face has no EAGLE drafter: a/c compares the head in our "
            f"engine with that draft in HF."]


def value_of(setting: dict, key: str) -> float:
    return setting["ratios"][key] if key in setting["ratios"] else setting[key]


def is_int4(result: dict) -> bool:
    return (result.get("target_weights") or {}).get("path") == "int4"


def target_lines(result: dict) -> list[str]:
    lines = []
    for key, threshold, applies, words in TARGETS + (INT4_TARGETS if is_int4(result) else []):
        for st in result["settings"]:
            if applies(result.get("preset") or result["name"], st, drafter_of(result)):
                v = value_of(st, key)
                if v is None:
                    lines.append(f"- {words} (T={st['temperature']:g}): {key} not measured ({result.get('anchor_skipped')})")
                    continue
                mark = "met" if v >= threshold else "**missed**"
                lines.append(f"- {words} (T={st['temperature']:g}): {key} = {v:.3f}, target >= {threshold:g}: {mark}")
    steps = result.get("step_times")
    if steps:
        mark = "met" if steps["speedup"] >= 3 else "**missed**"
        lines.append(f"- a chat target step at least 3x faster than on the float32 path: float32 {steps['float32_ms']:.2f} ms "
                     f"/ int4 {steps['int4_ms']:.2f} ms = {steps['speedup']:.2f}x, target >= 3: {mark}")
    return lines


def weights_lines(result: dict) -> list[str]:
    """Which weights the engine's target ran on, the anchor, and the memory limit beside them."""
    w = result.get("target_weights")
    lines = []
    if w:
        what = (f"int4, the blocks of {w['file']} as stored ({', '.join(f'{n} {t}' for t, n in w['tensor_types'].items())} "
                f"linear layers, {w['weight_bytes'] / 1e6:.1f} MB), float32 activations" if w["path"] == "int4"
                else "float32, the model as loaded")
        decoder = "the engine's own decoder" if result.get("decoder") == "own" else "Hugging Face's modules"
        lines.append(f"Target weights in (a), (b), (e): {what}, run on {decoder}. (c) and (d) run Hugging Face on "
                     "the float32 model.")
    if result.get("anchor"):
        lines.append(f"(f) llama.cpp anchor: {result['anchor']}.")
    elif "anchor_skipped" in result:
        lines.append(f"(f) llama.cpp anchor not run: {result['anchor_skipped']}.")
    lim = result.get("memory_limit")
    if lim:
        words = [f"float32 {lim['float32_weight_bytes'] / 1e6:.0f} MB -> {lim['float32_floor_ms']:.2f} ms"]
        if "int4_weight_bytes" in lim:
            words.append(f"int4 {lim['int4_weight_bytes'] / 1e6:.1f} MB -> {lim['int4_floor_ms']:.2f} ms "
                         f"({1000 / lim['int4_floor_ms']:.0f} steps/s)")
        lines.append(f"Memory limit of one target step (weight bytes / measured copy bandwidth "
                     f"{lim['bandwidth_gbs']:.1f} GB/s): {'; '.join(words)}.")
    steps = result.get("step_times")
    if steps:
        lines.append(f"One target decode step, both paths interleaved ({steps['repeats']} rounds, medians): float32 "
                     f"{steps['float32_ms']:.2f} ms, int4 {steps['int4_ms']:.2f} ms ({steps['speedup']:.2f}x).")
    end_load = result.get("load_average_1min_end")
    if end_load is not None:
        # The benchmark's own threads count towards the load: on 2 threads a load near 2 is this run alone.
        own = result.get("machine", {}).get("torch_threads") or 1
        words = "a shared machine: other work ran beside this" if end_load > own + 1 else \
            f"this run's own {own} threads; nothing more than that"
        lines.append(f"1-minute load at the end: {end_load} ({words}).")
    return lines


def measured_as(result: dict) -> str:
    """The ratio the predictions were compared with: a/e since session 13 (both predictions divide by
    the engine's own plain step), a/d in older results."""
    return next((st["measured_as"] for st in result["settings"] if "measured_as" in st), "a/d")


def speed_table(result: dict) -> list[str]:
    anchor = any("f" in st["tokens_per_s"] for st in result["settings"])
    head = ("| T | K | alpha | c | (a) traced | (b) untraced | (c) HF assisted | (d) HF plain | (e) engine plain "
            + ("| (f) llama.cpp plain " if anchor else "")
            + "| a/c | a/d | a/b | e/d | a/e " + ("| a/f " if anchor else "")
            + f"| Leviathan | refined | measured ({measured_as(result)}) / Leviathan | / refined |")
    rows = [head, "|" + "---|" * (head.count("|") - 1)]
    for st in result["settings"]:
        tps, r = st["tokens_per_s"], st["ratios"]
        a_e = r.get("a/e") or r["a/b"] * r["b/e"]  # older results: through b
        rows.append(f"| {st['temperature']:g} | {st['k']} | {st['alpha']:.3f} | {st['c']:.3f} | "
                    + " | ".join(f"{tps[m]:.1f}" for m in ("abcdef" if anchor else "abcde"))
                    + f" | {r['a/c']:.2f} | {r['a/d']:.2f} | {r['a/b']:.3f} | {r['e/d']:.2f} | {a_e:.2f} "
                    + (f"| {r['a/f']:.2f} " if anchor else "")
                    + f"| {st['predicted']['leviathan']:.2f}x | {st['predicted']['refined']:.2f}x "
                    f"| {st['fraction_of_leviathan']:.0%} | {st['fraction_of_refined']:.0%} |")
    return rows


def profile_table(result: dict) -> list[str]:
    head = ("| T | cycle ms | draft steps | verify | catch-up | other (test, sampling, rollback, Python) "
            "| t_step ms (loop e) | t_draft ms | verify / t_step | tracing overhead |")
    rows = [head, "|" + "---|" * (head.count("|") - 1)]
    for st in result["settings"]:
        p = st["profile_ms"]
        share = {k: p[k] / p["cycle"] for k in ("draft_steps", "verify", "catch_up", "other")}
        rows.append(f"| {st['temperature']:g} | {p['cycle']:.2f} | "
                    + " | ".join(f"{p[k]:.2f} ({share[k]:.0%})" for k in share)
                    + f" | {p['target_step']:.2f} | {p['draft_step']:.2f} | {p['verify_in_steps']:.2f} "
                    f"| {st['tracing_overhead']:.1%} |")
    return rows


def advisor_lines(result: dict) -> list[str]:
    """What the K advisor predicted from the pilot run that chose K (when K was "auto")."""
    lines = []
    for st in result["settings"]:
        pilot = st.get("pilot")
        if pilot:
            verdict = ("a slowdown: the advisor tells a user K=0, decode plainly; the best K is measured anyway"
                       if pilot.get("advised_k") == 0 or pilot["predicted_refined"] < 1 else "a speedup")
            a_e = st["ratios"].get("a/e")
            check = (f" Measured a/e: {a_e:.2f}, so the prediction was {pilot['predicted_refined'] / a_e - 1:+.0%} "
                     "off." if a_e else "")
            why = f" The advisor: {pilot['advice']}" if pilot.get("advised_k") == 0 and pilot.get("advice") else ""
            lines.append(f"- T={st['temperature']:g}: the K advisor (pilot run, alpha {pilot['pilot_alpha']:.2f}) chose "
                         f"K={pilot['k']}, predicted {pilot['predicted_refined']:.2f}x (refined), {verdict}.{check}{why}")
    return (["K choice:", "", *lines, ""]) if lines else []


def gpu_words(machine: dict) -> str:
    if not machine.get("gpu"):
        return ""
    return f"GPU {machine['gpu']} ({machine.get('dtype')}), with "


def markdown(result: dict) -> str:
    m = result["machine"]
    vocab = (" The draft has a pruned vocabulary; for (c) it is wrapped (bench/hf.py) so HF sees full-vocabulary "
             "ids and logits." if result["draft_pruned_vocab"] else "")
    drafted_by = result["draft"] if drafter_of(result) == DRAFT_MODEL else (
        f"{result.get('drafter_name') or drafter_of(result)} ({drafter_of(result)}; HF assisted (c): {result['draft']})")
    lines = [f"### {result['name']}: {result['target']} ← {drafted_by}", "",
             f"Machine: {gpu_words(m)}{machine_words(m)}; {m['os']}; "
             f"torch {m['torch']}, transformers {m['transformers']}; {m['date']}.",
             f"{len(result['prompts'])} prompts x {result['repeats']} repeats, "
             f"{result['settings'][0]['max_new_tokens']} new tokens each, no EOS stop; tokens/s are medians over "
             f"repeats, end to end.{vocab}", *([f"Conditions: {result['note']}"] if result.get("note") else []),
             *drafter_lines(result), *weights_lines(result), "", *speed_table(result), "",
             "Where a cycle's time goes (traced runs, mean per cycle):", "", *profile_table(result), "",
             *advisor_lines(result), "Targets:", "", *target_lines(result), ""]
    return "\n".join(lines)


def write_reports(result: dict, out: Path) -> None:
    write_results(out, f"speed-{result['name']}", result, markdown(result), indent=2)
    combined = ["## Speed benchmark (bench/speed.py)", ""]
    for path in sorted(out.glob("speed-*.json")):
        combined.append(markdown(json.loads(path.read_text())))
    (out / "speed.md").write_text("\n".join(combined))
    print(markdown(result))
