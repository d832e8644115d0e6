"""The Diagnose page's views of one diagnosis: the verdict (what to change, the fastest first), the
ranked report with each experiment's effect and its interval, each experiment's requests side by side
with links into the stepper, the probe's draft agreement per category, and an EAGLE head's draft
vocabulary against the output.

Numbers: the diagnosis's own dict (engine/diagnose, checked by app/ui/diagnoses.py) and the arms'
traces (the per-request rates); figures: app/figures/diagnose.py.
"""
from dataclasses import asdict

import streamlit as st

from app.figures import diagnose as figs
from app.figures.workload import fmt
from app.ui import diagnoses, workloads
from app.ui.safe import markdown_table, md
from app.ui.widgets import chart
from engine.diagnose.verdict import CLOCK_WORDS, Advice, Option, basis_words, option_words
from engine.trace import TraceError

TEST_STAGE = 3  # the stepper's stage that shows each position's acceptance test
SECTIONS = {figs.CAUSE: ("Causes", "Settings of this drafter that can be wrong: those that raise acceptance first, "
                                   "the largest gain first; then those with no effect found; then those set right "
                                   "already (changing them lowered acceptance)."),
            figs.TUNING: ("Draft depth", "K, judged by tokens/s of the cycles on this machine's calibrated step times "
                                         "(a shorter K raises accepted / drafted by arithmetic alone, so acceptance "
                                         "cannot judge it). Tune it after fixing the causes above: the best K depends "
                                         "on the acceptance they change."),
            figs.ALTERNATIVE: ("Other drafters", "The largest gain in tokens/s first: their acceptance rates do not "
                                                 "compare (prompt lookup drafts fewer tokens)."),
            figs.PROPERTY: ("What the pair does", "Not settings to change: how acceptance moves with the request.")}


def effect_words(e: dict) -> str:
    """`a → b (+d, 95% interval lo to hi)`: rates to 3 decimals, tokens/s to 1."""
    iv, n = e["interval"], 1 if e["measure"].endswith("tokens_per_s") else 3
    return (f"{e['baseline']:.{n}f} → {e['variant']:.{n}f} ({e['difference']:+.{n}f}, {diagnoses.interval_name(e)} "
            + ("–" if iv is None else f"{iv[0]:+.{n}f} to {iv[1]:+.{n}f}") + ")")


def baseline_words(d: dict, advice: Advice | None) -> str:
    """The baseline's figures, each tokens/s named by its clock (the page gives both, never one unnamed)."""
    b = d["baseline"]
    wall = "" if b["tokens_per_s"] is None else f", **{b['tokens_per_s']:.1f}** wall-clock tokens/s"
    step = advice.baseline_step_tokens_per_s if advice else None
    on_steps = "" if step is None else f" (**{step:.1f}** on this machine's calibrated step times)"
    return f"Baseline: **{b['requests']}** requests, draft acceptance rate **{fmt(b['acceptance_rate'])}**{wall}{on_steps}."


def next_words(o: Option) -> str:
    return f"{md(o.name)} ×{o.speedup:.2f} ({o.clock})"


def verdict_words(faster: list[Option], measured: int) -> str:
    """The first change, with the figures it is ranked by, and the next two."""
    if not faster:
        return (f"**Keep these settings**: none of the {measured} changes measured was faster by what these "
                "requests can tell.")
    o = faster[0]
    then = "; ".join(next_words(n) for n in faster[1:3])
    return (f"**Change first: {md(o.name)}**" + (f" ({md(o.now)})" if o.now else "") + f": {CLOCK_WORDS[o.clock]} "
            f"{o.baseline:.1f} → {o.variant:.1f} {md(o.change)} (**×{o.speedup:.2f}**, over {o.requests} requests; "
            f"{md(basis_words(o))})."
            + (f" Then: {then}." if then else ""))


def cause_words(d: dict, faster: list[Option]) -> str:
    """Why acceptance is low, where a cause was found, and where its fix stands in the verdict."""
    cause = diagnoses.cause_found(d)
    if cause is None:
        tested = sum(diagnoses.ran(f) for f in d["findings"] if f["kind"] == figs.CAUSE)
        return f"No drafter setting tested ({tested}) raised acceptance: no mis-set drafter found."
    rank = next((i for i, o in enumerate(faster, 1) if o.name == cause["experiment"]), None)
    place = (f"as a change it ranks {rank} of {len(faster)} by tokens/s" if rank else
             "it is not among the faster changes")
    return (f"Why acceptance is low: **{md(cause['experiment'])}** ({md(cause['now'])}): acceptance "
            f"{md(effect_words(cause['acceptance_rate']))} {md(cause['change'])}; {place}.")


def headline(d: dict, faster: list[Option], measured: int, advice: Advice | None) -> str:
    """The page's first result: the baseline, the verdict, and the cause of low acceptance if one was found."""
    return "  \n".join([baseline_words(d, advice), verdict_words(faster, measured), cause_words(d, faster)])


def describe(manifest: dict | None) -> str:
    """The baseline's pair and settings, from its workload's manifest."""
    if manifest is None:
        return "The baseline's traces are not here, so its pair and settings cannot be shown."
    pair, s = manifest.get("pair", {}), manifest.get("settings", {})
    drafter = pair.get("drafter", {}) if isinstance(pair.get("drafter"), dict) else {}
    names = pair.get("preset") or (pair.get("target") or {}).get("name", "?")
    filters = [f"top-k {s['top_k']}" if s.get("top_k") else "", f"top-p {s['top_p']}" if s.get("top_p", 1) < 1 else ""]
    mis = [f"{k.replace('_', ' ')}: {drafter[k]}" for k in ("draft_prompt", "draft_filters", "eagle3_features")
           if drafter.get(k) not in (None, "as target", "request", "aux layers")]
    # the diagnosis's name is in the pick beside this: the settings alone, to keep the row one line high
    return (f"Pair **{md(str(names))}** · drafter **{md(str(drafter.get('kind', 'model')))}**"
            + (f" ({md(', '.join(mis))})" if mis else "") + f" · K={md(str(s.get('k', '?')))} · temperature "
            f"{md(str(s.get('temperature', '?')))}" + "".join(f" · {md(f)}" for f in filters if f))


def finding_line(f: dict, i: int | None, cause: dict | None = None) -> str:
    lead = "**Why acceptance is low.** " if f is cause else ""
    return (f"{i}. " if i is not None else "- ") + lead + md(f["verdict"])


def verdict_section(faster: list[Option], every: list[Option]) -> None:
    """The verdict's chart, then its changes in words, numbered as in the chart."""
    if every:
        chart(figs.verdict_figure([asdict(o) | {"speedup": o.speedup} for o in every], len(faster)),
              key="dg_verdict_chart")
    for i, o in enumerate(faster, 1):
        line = f"{i}. {md(option_words(o))}"
        if i == 1:
            st.success(f"**Change first.** {line}", icon=":material/target:")
        else:
            st.markdown(line)
    st.caption("Ranked by tokens/s against the baseline's on the same clock: a drafter setting and another "
               "drafter by the wall clock of the interleaved arms; K and plain decoding on this machine's "
               "calibrated step times (plain decoding is the K advisor's figure, one target step a token, not an "
               "arm). A change counts as faster when its interval lies above 0, or, for plain decoding, when the "
               "advisor finds it faster than every K; no K is ranked above plain decoding then.")


def report_tab(choice: tuple[str, str], d: dict, faster: list[Option], every: list[Option]) -> None:
    """The verdict, then the findings by kind in the report's order: the cause found marked, those with no
    effect found muted; then what could not run; then the chart of every effect on acceptance."""
    verdict_section(faster, every)
    cause = diagnoses.cause_found(d)
    for kind, (title, what) in SECTIONS.items():
        these = [f for f in d["findings"] if f["kind"] == kind and diagnoses.ran(f)]
        if not these and kind != figs.CAUSE:
            continue
        st.subheader(title)
        st.caption(what)
        if not these:
            st.caption("None ran.")
        for i, f in enumerate(these, 1):
            e = diagnoses.judged(f)
            if e is None or e["difference"] is None or not e["found"]:
                st.caption(finding_line(f, i))  # no effect found: muted
            else:
                st.markdown(finding_line(f, i, cause))
    rest = [f for f in d["findings"] if not diagnoses.ran(f)]
    if rest:
        st.subheader("Not run")
        for f in rest:
            st.caption(finding_line(f, None))
    chart(figs.effects_figure(d), key="dg_effects_chart")
    st.caption("Each arm ran the same requests with the same seed as the baseline, changing one thing, "
               "interleaved with it request by request. The interval is a paired bootstrap over requests (the "
               "same draw for both arms); a joint interval is wider, so that all the experiments' intervals hold "
               "together 95% of the time (with eight experiments, eight separate 95% intervals would show an "
               "effect that is not there about one time in three). Where it includes 0 these requests cannot "
               "tell the arms apart, which is not proof of no effect. The **Per request** tab opens every "
               "request of every arm in the stepper.")


def per_request_table(choice: tuple[str, str], arm: str, pairs: list[dict]) -> str:
    base_w, arm_w = diagnoses.arm_workload(choice, diagnoses.BASELINE), diagnoses.arm_workload(choice, arm)

    def rejection(w: tuple[str, str], row: dict) -> str:
        c = row["first_rejection"]
        return "none" if c is None else workloads.link(f"cycle {c}", w, row["file"], c, TEST_STAGE)

    rows = []
    for p in pairs:
        b, a = p["base"], p["arm"]
        diff = None if a["acceptance_rate"] is None or b["acceptance_rate"] is None else \
            a["acceptance_rate"] - b["acceptance_rate"]
        rows.append({"request": workloads.link(b["id"], base_w, b["file"]), "category": b["category"],
                     "baseline accepted / drafted": f"{b['accepted']}/{b['drafted']} = {fmt(b['acceptance_rate'])}",
                     "baseline's first rejection": rejection(base_w, b),
                     "in the arm": workloads.link(f"{a['id']} in {arm}", arm_w, a["file"]),
                     "arm accepted / drafted": f"{a['accepted']}/{a['drafted']} = {fmt(a['acceptance_rate'])}",
                     "arm's first rejection": rejection(arm_w, a),
                     "difference": "–" if diff is None else f"{diff:+.3f}"})
    # fixed column names: an arm's name never becomes a column, so never a raw one
    return markdown_table(rows, raw=("request", "baseline's first rejection", "in the arm", "arm's first rejection"))


def requests_tab(choice: tuple[str, str], d: dict) -> None:
    """One experiment's requests in both arms, each linked into the stepper (the request, and the first
    cycle that rejected a draft token, at the test stage)."""
    with_arms = [f for f in d["findings"] if diagnoses.has_arm(choice, f["arm"])]
    if not diagnoses.has_arm(choice, diagnoses.BASELINE) or not with_arms:
        st.info("The traces of this diagnosis's arms are not here, so its requests cannot be shown one by one.")
        return
    names = [f["experiment"] for f in with_arms]
    picked = st.selectbox("Experiment", names, key="dg_experiment")
    f = with_arms[names.index(picked)]
    try:
        base = diagnoses.request_rows(diagnoses.arm_workload(choice, diagnoses.BASELINE))
        arm = diagnoses.request_rows(diagnoses.arm_workload(choice, f["arm"]))
    except TraceError as err:
        st.error(f"Could not read this arm's traces: {md(str(err))}", icon=":material/error:")
        return
    pairs = diagnoses.paired_rows(base, arm)
    st.markdown(f"**{md(f['experiment'])}**: baseline ({md(f['now'])}) against arm **{md(f['arm'])}** "
                f"({md(f['change'])}), on the {len(pairs)} requests both finished.")
    chart(figs.paired_figure(pairs, f["arm"]), key="dg_paired_chart")
    st.markdown(per_request_table(choice, f["arm"], pairs))
    st.caption("A request's link opens it in the stepper at its first cycle; a rejection's link opens the first "
               "cycle that rejected a draft token, at the test (stage 3), in that arm.")


def greedy_rows(choice: tuple[str, str], d: dict, manifest: dict | None) -> tuple[str, list[dict]] | None:
    """The greedy run of the probe's requests (the baseline if greedy, else the temperature-0 arm), per request."""
    if manifest is not None and manifest.get("settings", {}).get("temperature") == 0:
        arm = diagnoses.BASELINE
    else:
        arm = next((f["arm"] for f in d["findings"] if f["experiment"] == "temperature 0.0" and diagnoses.ran(f)), None)
    if arm is None or not diagnoses.has_arm(choice, arm):
        return None
    try:
        return arm, diagnoses.request_rows(diagnoses.arm_workload(choice, arm))
    except TraceError:
        return None


def measured_words(rows: list[dict]) -> str:
    """`accepted/drafted = rate` over some requests of an arm (a rate always with its counts)."""
    n, accepted = sum(r["drafted"] for r in rows), sum(r["accepted"] for r in rows)
    return f"{accepted}/{n} = {fmt(accepted / n if n else None)}"


def one_hot_reason(manifest: dict | None) -> str | None:
    """Why the probe's overlap is its top-1 agreement at every position, where the run's sampling makes it
    so: the probe warps both models' distributions with the run's settings (engine/diagnose/agreement.py),
    and at temperature 0 or with top-k 1 each is one-hot, so sum min(p, q) is 1 where the top tokens agree
    and 0 where they do not."""
    s = (manifest or {}).get("settings", {})
    if s.get("temperature") == 0:
        return "at temperature 0"
    if s.get("top_k") == 1:
        return "with top-k 1"
    return None


def probe_rows(probe: dict, one_hot: bool, greedy: tuple[str, list[dict]] | None) -> list[dict]:
    """Per category, then all requests: the probe's figures, and the greedy arm's measured rate with its counts."""
    rows = []
    for name, g in [*probe["categories"].items(), ("all requests", probe["overall"])]:
        row = {"category": name, "requests": g["requests"]}
        if one_hot:
            row["top-1 agreement = overlap"] = fmt(g["top1_agreement"])
        else:
            row |= {"top-1 agreement": fmt(g["top1_agreement"]), "overlap sum min(p, q)": fmt(g["mean_overlap"])}
        row["predicted greedy acceptance rate"] = fmt(g["predicted_greedy_acceptance_rate"])
        if greedy is not None:
            these = greedy[1] if name == "all requests" else [r for r in greedy[1] if r["category"] == name]
            row["measured greedy: accepted / drafted"] = measured_words(these)
        rows.append(row)
    return rows


def vocab_words(v: dict) -> str:
    """An EAGLE head's draft vocabulary against the baseline's output, counts beside the share."""
    if not v["tokens"]:
        return f"The head drafts over **{v['draft_vocab_size']:,}** tokens; the baseline generated none to compare."
    if not v["outside"]:
        return (f"Every one of the baseline's **{v['tokens']:,}** output tokens is among the head's "
                f"**{v['draft_vocab_size']:,}** draft tokens: its vocabulary costs this workload no acceptance.")
    return (f"**{v['outside']:,}** of the baseline's **{v['tokens']:,}** output tokens (**{v['outside_share']:.1%}**) "
            f"lie outside the head's **{v['draft_vocab_size']:,}** draft tokens. The head gives each of them "
            "probability 0, so wherever the target's next token is one of them, the draft token there is rejected "
            "however well the head is trained (only a bonus token, which no draft proposes, places one free). "
            "The tokens it misses most:")


def vocab_section(v: dict) -> None:
    st.subheader("Draft vocabulary")
    st.markdown(vocab_words(v))
    if v["most_missed"]:
        st.markdown(markdown_table([{"token": repr(m["text"]), "id": m["token_id"], "times in the output": m["count"]}
                                    for m in v["most_missed"]]))
    st.caption("An EAGLE head drafts over a vocabulary of its own (EAGLE-1's kept tokens, EAGLE-3's d2t map): a "
               "vocabulary chosen from other text misses this workload's own words.")


def trained_length_rows(t: dict) -> list[dict]:
    """One row per arm: draft tokens within and past the head's trained length, and the acceptance of each."""
    def rate(accepted: int, drafted: int) -> str:
        return f"{accepted / drafted:.3f} ({accepted:,} / {drafted:,})" if drafted else "none drafted"

    return [{"arm": "your requests" if name == "baseline" else "with ~600 tokens of text before each",
             "requests that went past": f"{a['requests_past']} of {a['requests']}",
             "acceptance within": rate(a["accepted_within"], a["drafted_within"]),
             "acceptance past": rate(a["accepted_past"], a["drafted_past"])} for name, a in t["arms"].items()]


def trained_length_section(t: dict) -> None:
    st.subheader("Trained length")
    st.markdown(f"The head was trained on sequences of at most **{t['trained_positions']:,}** tokens (prompt and "
                "answer). A draft token at a later position comes from attention over positions the head never "
                "learnt to read; the table counts each draft token where it stands.")
    st.markdown(markdown_table(trained_length_rows(t)))
    st.caption("The head's folder says its trained length in the lab's training.json (trained_positions); heads "
               "from other tools do not say, and then this section is absent.")


def probe_tab(choice: tuple[str, str], d: dict, manifest: dict | None) -> None:
    probe = d["probe"]
    if d.get("draft_vocab") is not None:
        vocab_section(d["draft_vocab"])
    if d.get("trained_length") is not None:
        trained_length_section(d["trained_length"])
    if probe is None:
        st.info("This diagnosis has no agreement probe: it runs for a draft model only (not prompt lookup or "
                "an EAGLE head), and not when the diagnosis was limited to other experiments.")
        return
    one_hot = one_hot_reason(manifest)
    why = ("" if one_hot is None else f" One column holds both top-1 agreement and overlap here: {one_hot} the run's "
           "sampling makes both models' distributions one-hot (the probe warps both with the run's own settings), "
           "so sum min(p, q) is 1 exactly where the two top tokens agree and 0 where they do not.")
    st.markdown("One teacher-forced forward of each model over the target's own greedy continuation of every "
                "request, without speculating: how often the draft's top token is the target's (**top-1 "
                "agreement**), the mean of sum min(p, q) under the run's sampling (**overlap**, the chance the "
                "ratio test accepts there), and the greedy acceptance rate the agreement predicts, walking it K "
                "positions at a time." + why)
    greedy = greedy_rows(choice, d, manifest)
    st.markdown(markdown_table(probe_rows(probe, one_hot is not None, greedy)))
    where = ("" if greedy is None else f" The measured rate is the greedy arm's (**{md(greedy[0])}**) on the same "
             "requests; the last cycle of a request may draft past its output, which the probe cannot see.")
    seconds = probe["seconds"]
    st.caption(("" if seconds is None else f"The probe took {seconds:.1f} s.") + where)
