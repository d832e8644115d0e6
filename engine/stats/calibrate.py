"""Step-time calibration: what one target step, one draft step and one verify pass cost.

A speculative trace never runs the target on a single token, so it cannot tell how long
plain decoding would take per token (t_step), and it times verification at one width
only (K+1 positions). This module measures, on the loaded pair and at a chosen cache
length:

- target_step_s: one cached target decode step on 1 token, with the same warping and
  sampling plain decoding does per token;
- verify_s[n]: one target forward over n positions plus warping, as `verify` does, for
  every n from 1 to K_max + 1 (the K advisor picks K from this measured curve);
- draft_step_s: one cached draft step on 1 token, warping and sampling, as `propose` does, timed
  where a cycle meets it: the K steps right after a target pass over K+1 positions
  (`time_draft_in_cycle`). Timed back to back instead, the draft's weights stay in the CPU's
  caches and the step looks cheaper than a run sees it: on the Shakespeare pair (2-core AMD EPYC,
  bench/results/draft-step-*.md) 0.77 ms back to back against 1.21 ms in real runs at K=3, and
  1.38 ms timed in a cycle's place; the chat draft, too big for those caches, moves less.

`calibrate` measures the widths a chain needs (1 to K+1). A draft tree verifies N+1 positions
(up to 65) and feeds the draft a whole level of nodes at once, so `calibrate_widths` measures a
chosen list of verify widths (TREE_WIDTHS: every width to 9, then sparser up to 65) and, when
asked, the draft model's forward at chosen widths too ("draft_positions", "draft_s"); the tree
advisor (engine/stats/tree_plan.py) interpolates between the measured widths.

Each is the median of `repeats` timings taken after a warm-up. The result is plain
data (JSON-ready) so it can ride in a trace header as the optional "calibration" field.
`calibrate_repeated` takes several whole calibrations and keeps each quantity's median and
spread: the statistics page measures that way, on a machine that may be busy.
"""
import statistics
from functools import partial
from typing import Callable

import torch

from engine.config import SpecSettings
from engine.cycle.pair import Pair
from engine.kv.ops import crop
from engine.models.device import timed
from engine.models.loading import LoadedModel
from engine.models.sampling import draw as draw_token
from engine.models.sampling import warp_probs
from engine.stats.repeats import Repeated, repeated_values
from engine.trace.schema import DRAFT_MODEL

DEFAULT_MAX_POSITIONS = 9  # verify widths 1..9 cover K = 1..8 without extrapolating
# A tree of up to MAX_TREE_NODES = 64 nodes verifies up to 65 positions: every width a chain
# needs, then a sparser grid the tree advisor interpolates over (linearly, never beyond 65).
TREE_WIDTHS = [*range(1, 10), 12, 16, 24, 32, 48, 65]


def context_of_length(prompt_ids: list[int], length: int) -> list[int]:
    """`length` token ids made by repeating the prompt; only the count matters for timing."""
    if not prompt_ids:
        raise ValueError("calibration needs at least one prompt token")
    repeats = length // len(prompt_ids) + 1
    return (list(prompt_ids) * repeats)[: max(1, length)]


def _timed(fn: Callable[[], None], device: torch.device) -> float:
    return timed(fn, device)[1]


def _step(model: LoadedModel, cache, token_ids: list[int], s: SpecSettings,
          gen: torch.Generator, draw: bool) -> None:
    """One forward over `token_ids`, warped; with `draw`, also sample the next token."""
    probs = warp_probs(model.forward(token_ids, cache), s)
    if draw:
        draw_token(probs[-1], s, gen)


def time_widths(model: LoadedModel, context: list[int], widths: list[int], s: SpecSettings,
                repeats: int, draw: bool, step: bool = False) -> dict[int | str, float]:
    """Median time of a forward over each width of new positions, at cache length len(context) - 1.

    The cache is cropped back after every forward, so each timing starts from the same
    length. Repeats run round-robin over the widths, so slow drift (another process
    waking up) spreads over all widths instead of biasing one. With `step`, one decode
    step (1 position, warped and sampled, as plain decoding does) joins the round-robin
    under the key "step": the advisor divides verify times by it, and on a shared machine
    a step timed separately drifts apart from the widths by tens of percent.
    """
    gen = torch.Generator().manual_seed(0)
    cache = model.new_cache()
    if len(context) > 1:
        model.forward(context[:-1], cache)
    keep = len(context) - 1
    # Every width gets exactly its number of new positions, also when it is wider than the context.
    feed = [context[-1]] + (context_of_length(context, max(widths) - 1) if max(widths) > 1 else [])
    jobs: list[tuple[int | str, int, bool]] = [(w, w, draw) for w in widths] + ([("step", 1, True)] if step else [])
    times: dict[int | str, list[float]] = {key: [] for key, _, _ in jobs}
    for round_number in range(repeats + 1):  # round 0 warms up and is not kept
        for key, w, sampled in jobs:
            elapsed = _timed(partial(_step, model, cache, feed[:w], s, gen, sampled), model.device)
            crop(cache, keep)
            if round_number:
                times[key].append(elapsed)
    return {key: statistics.median(t) for key, t in times.items()}


def time_draft_in_cycle(pair: Pair, context: list[int], s: SpecSettings, repeats: int) -> float:
    """Median over rounds of the mean draft step in a cycle: each round runs the target over K+1
    positions (untimed; it is what streams the target's weights through the CPU's caches), then
    times K draft steps, warped and sampled. Both caches are cropped back after each forward, so
    every round starts from len(context) - 1 cached positions."""
    gen = torch.Generator().manual_seed(0)
    k = max(1, s.k)
    target_cache, draft_cache = pair.target.new_cache(), pair.draft.new_cache()
    if len(context) > 1:
        pair.target.forward(context[:-1], target_cache)
        pair.draft.forward(context[:-1], draft_cache)
    keep = len(context) - 1
    verify_feed = [context[-1]] + context_of_length(context, k)
    means = []
    for round_number in range(repeats + 1):  # round 0 warms up and is not kept
        pair.target.forward(verify_feed, target_cache)
        crop(target_cache, keep)
        steps = []
        for _ in range(k):
            steps.append(_timed(partial(_step, pair.draft, draft_cache, [context[-1]], s, gen, True),
                                pair.draft.device))
            crop(draft_cache, keep)
        if round_number:
            means.append(statistics.mean(steps))
    return statistics.median(means)


def time_drafter_step(pair: Pair, context: list[int], s: SpecSettings, repeats: int) -> float:
    """Median time a drafter without a same-tokenizer draft model takes to propose one token
    (for prompt lookup: one n-gram search; for the other-tokenizer draft: its steps and re-encoding;
    for the EAGLE head: one head step and the target's output layer over the kept vocabulary; its
    start runs the target over the context once for the features, untimed). An EAGLE-3 head's first
    step only reads out the output its catch-up left (`calibration_steps` = 2): its second, a head pass,
    is the step timed."""
    gen = torch.Generator().manual_seed(0)
    state = pair.drafter.start(context)
    steps = getattr(pair.drafter, "calibration_steps", 1)
    times = []
    for round_number in range(repeats + 1):  # round 0 warms up and is not kept
        proposal = pair.drafter.propose(state, context, steps, s, gen)
        pair.drafter.roll_back(state, context)
        if round_number:
            times.append(sum(proposal.step_times_s) if steps == 1 else proposal.step_times_s[-1])
    return statistics.median(times)


def calibrate(pair: Pair, prompt_ids: list[int], s: SpecSettings, cache_len: int | None = None,
              max_positions: int | None = None, repeats: int = 7) -> dict:
    """Step times of both models at `cache_len` cached positions (default: the run's mean), with
    verify widths 1 to `max_positions` (default: enough for K = 1..8 and the settings' K).

    The run's mean cache length is the prompt plus half the new tokens: attention cost
    grows with the cache, so this is the length the average cycle sees.
    """
    max_positions = max_positions or max(DEFAULT_MAX_POSITIONS, s.k + 1)
    return calibrate_widths(pair, prompt_ids, s, list(range(1, max_positions + 1)), cache_len, repeats)


def run_cache_len(prompt_ids: list[int], s: SpecSettings) -> int:
    """The cache length the run's average cycle sees: the prompt plus half the new tokens."""
    return len(prompt_ids) - 1 + s.max_new_tokens // 2


def calibrate_widths(pair: Pair, prompt_ids: list[int], s: SpecSettings, widths: list[int],
                     cache_len: int | None = None, repeats: int = 7,
                     draft_widths: list[int] | None = None) -> dict:
    """As `calibrate`, at the verify widths given (distinct, increasing); with `draft_widths`
    (which must include 1), also the draft model's forward over each of those widths, warped and
    sampled, in one round-robin whose width 1 is then the draft step (back to back, not in a cycle's place)."""
    if not widths or widths != sorted(set(widths)) or widths[0] < 1:
        raise ValueError(f"verify widths must be distinct increasing positive integers, got {widths}")
    if draft_widths is not None and (1 not in draft_widths or draft_widths != sorted(set(draft_widths))):
        raise ValueError(f"draft widths must be distinct increasing and include 1, got {draft_widths}")
    is_model = pair.draft is not None and pair.drafter.kind == DRAFT_MODEL
    if draft_widths is not None and not is_model:
        raise ValueError("draft widths can be measured only for a draft model that shares the target's tokens")
    cache_len = run_cache_len(prompt_ids, s) if cache_len is None else cache_len
    context = context_of_length(prompt_ids, cache_len + 1)
    verify = time_widths(pair.target, context, widths, s, repeats, draw=False, step=True)
    draft = time_widths(pair.draft, context, draft_widths, s, repeats, draw=True) if draft_widths else None
    if draft:  # a tree's draft curve: its width 1 is the draft step, so the curve stays one measurement
        draft_step = draft[1]
    elif is_model:
        draft_step = time_draft_in_cycle(pair, context, s, repeats)
    else:
        draft_step = time_drafter_step(pair, context, s, repeats)
    out = {
        "cache_len": cache_len, "repeats": repeats, "threads": torch.get_num_threads(),
        "target_step_s": verify["step"],
        "draft_step_s": draft_step,
        "verify_positions": list(widths), "verify_s": [verify[w] for w in widths],
    }
    if draft_widths is not None:
        out |= {"draft_positions": list(draft_widths), "draft_s": [draft[w] for w in draft_widths]}
    return out


def median_calibration(rounds: list[dict]) -> tuple[dict, dict[str, Repeated]]:
    """Several whole calibrations of one pair as one: each quantity's median over the rounds, and
    each quantity's repeats, whose spread says whether the machine was quiet enough to trust it.

    The first round gives the fields that do not vary (cache length, widths, threads); its repeats
    count every round's."""
    spread = {"target step": repeated_values([r["target_step_s"] for r in rounds]),
              "draft step": repeated_values([r["draft_step_s"] for r in rounds])}
    widths = rounds[0]["verify_positions"]
    for i, w in enumerate(widths):
        spread[f"verify over {w}"] = repeated_values([r["verify_s"][i] for r in rounds])
    median = {**rounds[0], "repeats": rounds[0]["repeats"] * len(rounds),
              "target_step_s": spread["target step"].median_s, "draft_step_s": spread["draft step"].median_s,
              "verify_s": [spread[f"verify over {w}"].median_s for w in widths]}
    return median, spread


def calibrate_repeated(pair: Pair, prompt_ids: list[int], s: SpecSettings, rounds: int,
                       on_round: Callable[[int], None] | None = None) -> tuple[dict, dict[str, Repeated]]:
    """`calibrate` `rounds` times, then median_calibration: one calibration is a single sample of a
    possibly busy machine; several say how much to trust it. `on_round` hears each round's index
    (0-based) before the round runs."""
    results = []
    for i in range(rounds):
        if on_round:
            on_round(i)
        results.append(calibrate(pair, prompt_ids, s))
    return median_calibration(results)
