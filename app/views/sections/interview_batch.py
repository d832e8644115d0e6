"""Interview questions on batched speculation: why the gain shrinks as the batch grows (with this project's
measured goodput, bench/results/batch-*.json read by app/runs/batch_bench.py, where shipped), and what each
row's cache does when rows of one batch accept different numbers of tokens (with a cycle of the bundled
batched workload).
"""
import streamlit as st

from app.runs.batch_bench import largest_per_preset, shipped_sweeps
from app.ui import workloads
from app.ui.pages import WORKLOAD
from app.ui.safe import markdown_table, md
from engine.stats.batch_results import crossover_words
from engine.trace import TraceError


def q_batch_shrinks() -> None:
    with st.expander("Why does speculative decoding help less at high batch sizes?"):
        st.markdown(
            "**What a cycle costs.** Speculation trades target steps for one verify of K+1 positions. At batch 1 "
            "that verify costs about one step: a decode step is bound by reading the weights, and reading them "
            "once serves K+1 positions as well as one. A batch of B rows verifies B × (K+1) positions in one "
            "forward. As B grows, that forward stops riding on one read of the weights and starts paying for its "
            "arithmetic: it costs more and more like K+1 plain steps, while a plain batched step of B rows is "
            "still one read of the weights. The draft's cost grows with B too.\n\n"
            "**What does not change.** Acceptance is a property of the two models on the text: every row runs "
            "its own ratio test, so the batch leaves it flat. So acceptance alone is the wrong signal for "
            "whether to speculate: vLLM #26504 measured acceptance 0.86–0.91 from batch 1 to 32 while the "
            "right choice flipped from speculating (+23%) to not (−16%).\n\n"
            "**Ragged acceptance costs too.** Rows accept different numbers of tokens, so in a batch that runs "
            "its requests to the end together, the batch lasts as long as its slowest row, and the rows that "
            "finished early sit idle in every forward. The more rows, the likelier one slow row: this also "
            "grows with B. Continuous batching (a finished row takes the next request at once) removes most "
            "of it.\n\n"
            "**What to do.** Choose K per batch size from measured costs (vLLM's "
            "`num_speculative_tokens_per_batch_size`, SGLang's adaptive steps), and stop speculating past the "
            "batch size where the best K no longer beats plain batched decoding.")
        found = largest_per_preset(shipped_sweeps())
        if not found:
            st.caption("Run `python -m bench.batch` to measure this on your machine.")
            return
        for shipped in found:
            p = shipped.sweep
            idle = all(s.idle_share for s in p.sizes)  # older files have none
            st.markdown(f"Measured on {md(shipped.machine)}, **{md(p.preset)}** ({p.requests} requests of "
                        f"{p.max_new_tokens} tokens, one run): {md(crossover_words(p))}. The **Batch size** tab "
                        "of **Statistics** draws it.")
            st.markdown(markdown_table([
                {"batch": s.batch, "best K": s.best_k, "best speculating / plain batched": f"{s.best_speedup:.2f}×",
                 "advisor's K": "–" if s.advised_k is None else s.advised_k or "plain",
                 f"acceptance at K={max(s.acceptance_rate)}": f"{s.acceptance_rate[max(s.acceptance_rate)]:.2f}",
                 **({"idle rows at the best K": f"{s.idle_share[s.best_k]:.0%}"} if idle else {})}
                for s in p.sizes]))


def batched_example() -> tuple[tuple[str, str], dict, int] | None:
    """A bundled batched workload and a cycle of it where the running rows accepted different counts."""
    for choice in workloads.listed():
        if choice[0] != "bundled":
            continue
        try:
            batch = workloads.load(choice).batch_trace()
        except (TraceError, OSError):
            continue
        if batch is None:
            continue
        for n, c in enumerate(batch["cycles"]):
            if len({r["num_accepted"] for r in c["rows"] if not r["idle"]}) > 1:
                return choice, batch, n
    return None


def q_ragged_rollback() -> None:
    with st.expander("Rows of one batch accept different numbers of tokens. What happens to each row's KV cache?"):
        st.markdown(
            "**Each row rolls back to its own length.** After the verify every row holds K+1 new positions; row r "
            "keeps its accepted tokens and drops the rest, so the rows end the cycle at different lengths. The "
            "cache must keep one length per row. In the lab's batched cache (engine/kv/rows.py) every row is "
            "a static buffer with its own write position: a rollback lowers that row's length, the rejected K/V "
            "stay in their slots, hidden by the attention mask, until the row's next append overwrites them. A "
            "paged cache does it with a block table per request over one shared pool (vLLM). A dynamic cache "
            "that grows all rows together cannot hold ragged rows without padding.\n\n"
            "**Why exactness survives.** Each row's forward positions and mask are its own, and its ratio test "
            "uses its own distributions and its own random stream, so a row commits exactly what the same "
            "request would alone (the lab's tests check this token for token, and its caches against a fresh "
            "prefill after every cycle).\n\n"
            "**What it costs.** A row that finished keeps its slot in every forward until the batch refills it "
            "(continuous batching) or ends: idle and padded slots are paid for, so the lab counts them.")
        found = batched_example()
        if found is None:
            return
        choice, batch, n = found
        rows = [r for r in batch["cycles"][n]["rows"] if not r["idle"]]
        ids = {e.index: e.id for e in workloads.load(choice).entries}
        st.markdown(f"In the bundled **{md(workloads.words(choice))}**, batched cycle {n}:")
        st.markdown(markdown_table([
            {"row": r["row"], "request": ids.get(r["request"], "?"), "accepted": r["num_accepted"],
             "target cache before → after append → after rollback":
                 f"{r['target_cache_len']['before']} → {r['target_cache_len']['after_append']} → "
                 f"{r['target_cache_len']['after_rollback']}"} for r in rows]))
        st.page_link(WORKLOAD, label="See every cycle as lanes (Workload page, Batch lanes tab)",
                     icon=":material/view_timeline:")
