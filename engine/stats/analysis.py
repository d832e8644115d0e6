"""Why speculation pays off or not: acceptance, cost and speed computed from a trace.

Plain functions of trace records (and of the optional step-time calibration, see
engine/stats/calibrate.py); the app's statistics page and `python -m engine stats` both show
these numbers, so they are computed in one place.

Two predictions of the speedup over plain target decoding are compared with the
measured one:
- Leviathan et al. 2023: E[tokens per cycle] / (K c + 1), with c = t_draft / t_step.
  It assumes one verify pass over K+1 positions costs one target decode step.
- refined: E[tokens per cycle] x t_step / (K t_draft + t_verify(K+1) + t_overhead), which
  uses the measured cost of verifying K+1 positions instead, and what the run measured a
  cycle to cost beyond its forwards (the draft's catch-up step and the bookkeeping). On a
  CPU a wider pass costs more than one step, so this one usually explains CPU measurements
  better; the overhead matters where a target step is cheap (the int4 chat target: at K=1
  it was a tenth of the cycle, and leaving it out predicted 1.07x where 0.89x was measured).

Each quantity has one definition (DEFINITIONS) and one function here, and every page and
the CLI show that function's value, so no two places disagree about a trace. Times are
medians over cycles (engine/stats/robust.py): a stalled cycle does not move them. The
verify cost of n positions always comes from the calibration, the one source that covers
every width the K advisor needs.
"""
from dataclasses import dataclass
from math import sqrt
from statistics import fmean, median, stdev

from engine.stats.robust import Spread
from engine.stats.timings import Calibration, CycleTimes, calibration_of, cycle_times
from engine.trace import Trace
from engine.trace.metrics import acceptance_metrics, drafted, expected_tokens_per_cycle, predicted_speedup
from engine.trace.schema import DRAFT_MODEL, MAX_K, PROMPT_LOOKUP, SUFFIX, SUFFIX_GLOBAL, SUFFIX_REQUEST

DEFINITIONS = {
    "acceptance_rate": "accepted draft tokens / drafted tokens (vLLM V1).",
    "mean_acceptance_length": "1 + accepted draft tokens / drafts (cycles that drafted at least one token): "
                              "tokens one such cycle commits, counting its resampled or bonus token (vLLM V1).",
    "per_position_acceptance": "drafts whose i-th draft token was accepted / drafts (cycles that drafted); it "
                               "needs every token before it accepted too, so the curve never rises (vLLM V1).",
    "alpha": "mean of the recorded beta = sum_x min(p_target(x), p_draft(x)) over every drafted position: "
             "the chance one draft token passes (Leviathan et al. 2023).",
    "c": "cost ratio: this run's median draft step / the calibrated target decode step (both cached, 1 token, "
         "with sampling).",
    "tokens_per_cycle": "the mean acceptance length: what a cycle that drafted commits on average, measured.",
    "expected_tokens": "E[tokens per cycle] = (1 - alpha^(K+1)) / (1 - alpha): what alpha predicts a cycle "
                       "commits if every draft token passes independently (Leviathan et al. 2023).",
    "verify_steps": "verify cost of n positions: the calibrated time of one target pass over n positions / "
                    "the calibrated target step.",
    "leviathan": "E[tokens per cycle] / (K c + 1) (Leviathan et al. 2023): assumes verifying K+1 "
                 "positions costs one target step.",
    "refined": "E[tokens per cycle] x t_step / (K t_draft + t_verify(K+1) + t_overhead): uses the measured cost "
               "of verifying K+1 positions, and the cycle's measured overhead (the draft's catch-up step after a "
               "full accept, expected alpha^K of the time, and the bookkeeping), where the run has timings.",
    "measured": "t_step x tokens committed per cycle / median cycle time: plain decoding's time per token "
                "over speculation's (decoding only, prefill and trace writing excluded).",
    "whole_run": "t_step x every committed token / the sum of all cycle times: the same ratio over the whole run, "
                 "as the race draws it, slow cycles included (decoding only, prefill excluded).",
}
NO_CALIBRATION = ("this trace has no step-time calibration, so c, t_step and the speedups cannot be "
                  "computed: record it with `python -m engine run --calibrate ...`")


# ---------------------------------------------------------------- acceptance

def measured_alpha(cycles: list[dict]) -> float:
    """Mean of every recorded beta (all K positions of every cycle); 0 with no cycles."""
    betas = [b for c in cycles for b in c["beta"]]
    return fmean(betas) if betas else 0.0


def alpha_standard_error(cycles: list[dict]) -> float:
    """The standard error of measured_alpha, each cycle one sample (its betas share a context, so they are not
    independent draws): the cycles' mean betas' standard deviation over the square root of their count; 0 with
    fewer than two cycles, which show no spread."""
    means = [fmean(c["beta"]) for c in cycles if c["beta"]]
    return stdev(means) / sqrt(len(means)) if len(means) > 1 else 0.0


def beta_by_position(cycles: list[dict], k: int) -> list[float]:
    """Mean beta at each draft position 1..K: does the draft drift as it runs ahead?"""
    means = []
    for i in range(k):  # prompt lookup may propose fewer than K: average over the cycles that reached i
        at_i = [c["beta"][i] for c in cycles if len(c["beta"]) > i]
        means.append(fmean(at_i) if at_i else 0.0)
    return means


def tokens_per_cycle_counts(cycles: list[dict], k: int) -> list[int]:
    """How many drafts (cycles that drafted) committed n = 1..K+1 tokens (accepted + the resampled or
    bonus token): the distribution whose mean is the mean acceptance length. A prompt-lookup cycle
    that found nothing is a plain step, not a draft, as vLLM counts.

    Uses num_accepted + 1 rather than the committed list, which an EOS or the token
    budget may cut short in the last cycle: the model being tested knows no budget.
    """
    counts = [0] * (k + 1)
    for c in cycles:
        if drafted(c):
            counts[c["num_accepted"]] += 1
    return counts


def acceptance_lengths(cycles: list[dict]) -> list[int]:
    """Each cycle's acceptance length: its accepted draft tokens plus the resampled or bonus token
    (num_accepted + 1, as tokens_per_cycle_counts counts them)."""
    return [c["num_accepted"] + 1 for c in cycles]


def drafted_positions(cycles: list[dict]) -> int:
    """Draft positions with a recorded beta, over all cycles: what measured_alpha averages over."""
    return sum(len(c["beta"]) for c in cycles)


def truncated_geometric_pmf(alpha: float, k: int) -> list[float]:
    """P(a cycle commits n tokens), n = 1..K+1, if each draft token passes independently with alpha.

    n <= K: the first n-1 pass and the n-th fails: alpha^(n-1) (1 - alpha).
    n = K+1: all K pass, plus the bonus token: alpha^K.
    """
    return [alpha ** (n - 1) * (1 - alpha) for n in range(1, k + 1)] + [alpha ** k]


def predicted_per_position(alpha: float, k: int) -> list[float]:
    """Per-position acceptance the i.i.d. model predicts: alpha^i for position i."""
    return [alpha ** i for i in range(1, k + 1)]


# ---------------------------------------------------------------- speed

def cost_ratio(draft_step_s: float, target_step_s: float) -> float:
    return draft_step_s / target_step_s


def refined_speedup(alpha: float, k: int, target_step_s: float, draft_step_s: float,
                    verify_s: float, overhead_s: float = 0.0) -> float:
    """E[tokens per cycle] x t_step / (K t_draft + t_verify(K+1) + t_overhead)."""
    return expected_tokens_per_cycle(alpha, k) * target_step_s / (k * draft_step_s + verify_s + overhead_s)


@dataclass(frozen=True)
class CycleOverhead:
    """What a cycle costs beyond its K draft steps and one verify pass, as a run measured it, in a
    form that carries over to another K: the draft's catch-up step (a single run, on either path, feeds
    d_K to the draft only after a full accept, alpha^K of the cycles if each token passes independently)
    and the rest (ratio test, resampling, rollback, recording),
    taken as the same at every K."""

    catch_up_step_s: float  # one catch-up forward, when one is paid
    every_cycle: bool  # every cycle paid it (a run where every cycle accepted all K)
    other_s: float

    def at(self, alpha: float, k: int) -> float:
        """Expected overhead of one cycle at K, in seconds."""
        pays = 1.0 if self.every_cycle else alpha ** k
        return pays * self.catch_up_step_s + self.other_s


NO_OVERHEAD = CycleOverhead(0.0, False, 0.0)  # no timed cycles: the forwards alone


def overhead_of(cycles: list[dict], times: CycleTimes | None) -> CycleOverhead:
    """The measured CycleOverhead of a run's cycles (NO_OVERHEAD without them)."""
    if not cycles or times is None:
        return NO_OVERHEAD
    paid = [c["catch_up_time_s"] for c in cycles if c["catch_up_time_s"] > 0]
    return CycleOverhead(median(paid) if paid else times.draft_step_s, len(paid) == len(cycles), times.other_s)


def measured_speedup(tokens_per_cycle: float, cycle_s: float, target_step_s: float) -> float:
    """Plain decoding's time per token (one target step) over speculation's (a cycle's time
    over the tokens it commits). At the median cycle this is t_step x decoding_tokens_per_s."""
    return target_step_s * tokens_per_cycle / cycle_s if cycle_s > 0 else 0.0


def whole_run_speedup(cycles: list[dict], target_step_s: float) -> float:
    """DEFINITIONS['whole_run']: plain decoding's time for every token the run committed over the cycles'
    summed time, the ratio of the race's two finishing times. Every slow cycle counts in full here, where
    the median cycle (DEFINITIONS['measured']) leaves it out, so the two differ on a run with stalls."""
    seconds = sum(c["cycle_time_s"] for c in cycles)
    return measured_speedup(sum(len(c["committed_token_ids"]) for c in cycles), seconds, target_step_s)


def measured_spread(times: CycleTimes, target_step_s: float) -> Spread:
    """The measured speedup at the median cycle time, and at the quartiles (a slow cycle, high
    time, gives the low speedup)."""
    per_cycle = times.tokens / times.cycles
    return Spread(*(measured_speedup(per_cycle, s, target_step_s)
                    for s in (times.cycle.median, times.cycle.high, times.cycle.low)))


def verify_in_steps(cal: Calibration, positions: int) -> float:
    """DEFINITIONS['verify_steps']: one pass over `positions` positions, in target steps."""
    return cal.verify_time(positions) / cal.target_step_s


def extra_position_in_steps(cal: Calibration) -> float:
    """What each extra verify position adds, in target steps: the fitted line's slope over t_step."""
    return cal.fit()[1] / cal.target_step_s


def median_draft_step_s(c: dict) -> float | None:
    """One cycle's median draft step; None for a cycle that ran no draft step."""
    return median(c["draft_step_times_s"]) if c["draft_step_times_s"] else None


def relative_error(predicted: float, measured: float) -> float:
    return abs(predicted - measured) / measured if measured > 0 else float("inf")


@dataclass(frozen=True)
class SpeedReport:
    k: int
    alpha: float
    c: float  # DEFINITIONS['c']
    target_step_s: float
    draft_step_s: float  # this run's median draft step
    verify_s: float  # this run's median verify pass over K+1 positions, in seconds
    verify_in_steps: float  # DEFINITIONS['verify_steps'] at K+1 positions: Leviathan assumes 1
    overhead_s: float  # a cycle's expected cost beyond its forwards (CycleOverhead.at), in seconds
    expected_tokens: float  # DEFINITIONS['expected_tokens']
    leviathan: float
    refined: float
    measured: float  # at the median cycle time
    c_spread: Spread  # c at the draft step's quartiles
    measured_spread: Spread  # the measured speedup at the cycle time's quartiles

    @property
    def closer(self) -> str:
        """'refined' or 'leviathan': the prediction nearer the measured speedup."""
        lev, ref = relative_error(self.leviathan, self.measured), relative_error(self.refined, self.measured)
        return "refined" if ref <= lev else "leviathan"

    @property
    def cycle_steps(self) -> float:
        """One cycle's predicted cost in target steps: K draft steps, one verify pass and the overhead."""
        return self.k * self.c + self.verify_in_steps + self.overhead_s / self.target_step_s


def speed_report(k: int, alpha: float, times: CycleTimes, cal: Calibration,
                 overhead: CycleOverhead = NO_OVERHEAD) -> SpeedReport:
    """The trace's predictions and measurement; the refined prediction is the K advisor's at this K."""
    t_step = cal.target_step_s
    c = cost_ratio(times.draft_step_s, t_step)
    measured = measured_spread(times, t_step)
    overhead_s = overhead.at(alpha, k)
    return SpeedReport(
        k=k, alpha=alpha, c=c, target_step_s=t_step, draft_step_s=times.draft_step_s, verify_s=times.verify_s,
        verify_in_steps=verify_in_steps(cal, k + 1), overhead_s=overhead_s,
        expected_tokens=expected_tokens_per_cycle(alpha, k), leviathan=predicted_speedup(alpha, k, c),
        refined=refined_speedup(alpha, k, t_step, times.draft_step_s, cal.verify_time(k + 1), overhead_s),
        measured=measured.median, c_spread=times.draft_step.scaled(1 / t_step), measured_spread=measured)


def explain_speed(r: SpeedReport) -> str:
    """One paragraph: which prediction matches the measurement, and why."""
    lev_err, ref_err = relative_error(r.leviathan, r.measured), relative_error(r.refined, r.measured)
    verdict = "faster than" if r.measured >= 1 else "slower than"
    text = (f"Measured: {r.measured:.2f}x ({verdict} plain decoding). Leviathan's prediction {r.leviathan:.2f}x "
            f"is {lev_err:.0%} off; the refined one {r.refined:.2f}x is {ref_err:.0%} off. ")
    if r.closer == "refined":
        text += (f"The refined prediction explains it better: verifying {r.k + 1} positions took "
                 f"{r.verify_in_steps:.2f} target steps here, not the 1 step Leviathan's formula assumes.")
    else:
        text += (f"Leviathan's formula explains it as well or better: verifying {r.k + 1} positions took "
                 f"{r.verify_in_steps:.2f} target steps, close enough to its assumption of 1.")
    return text


# ---------------------------------------------------------------- K advisor

@dataclass(frozen=True)
class KAdvice:
    k: int
    expected_tokens: float
    leviathan: float
    refined: float
    verify_s: float  # t_verify(K+1) from the calibration
    extrapolated: bool  # K+1 lies beyond the calibrated widths: t_verify from the fitted line
    cost_steps: float  # one cycle's time in target steps: (K t_draft + t_verify(K+1) + t_overhead) / t_step
    verify_steps: float = 0.0  # the verify pass alone in target steps: t_verify(K+1) / t_step


def advise_k(alpha: float, draft_step_s: float, cal: Calibration, ks: list[int],
             overhead: CycleOverhead = NO_OVERHEAD) -> list[KAdvice]:
    """Both predictions at each K for fixed alpha, draft step time, verify-cost curve and the
    measured per-cycle overhead (none where no cycles were timed)."""
    c = cost_ratio(draft_step_s, cal.target_step_s)
    return [advice_at(alpha, k, c, draft_step_s, cal, overhead.at(alpha, k)) for k in ks]


def advice_at(alpha: float, k: int, c: float, draft_step_s: float, cal: Calibration, overhead_s: float) -> KAdvice:
    verify_s = cal.verify_time(k + 1)
    return KAdvice(k, expected_tokens_per_cycle(alpha, k), predicted_speedup(alpha, k, c),
                   refined_speedup(alpha, k, cal.target_step_s, draft_step_s, verify_s, overhead_s),
                   verify_s, not cal.measured(k + 1), (k * draft_step_s + verify_s + overhead_s) / cal.target_step_s,
                   verify_s / cal.target_step_s)


def advisor_ks(cal: Calibration, k: int) -> list[int]:
    """K = 1 up to the widest calibrated verify, and at least 2 past the trace's K (never past MAX_K + 2)."""
    return list(range(1, min(max(max(cal.verify_positions) - 1, k + 2), MAX_K + 2) + 1))


def best_k(advice: list[KAdvice]) -> KAdvice:
    """The K the refined prediction rates fastest (ties: the smaller K), among the K whose
    verify width K+1 was measured: verify cost per width is not a straight line on a CPU
    (a BLAS kernel may change with the row count), so the pick rests on the measured curve,
    never on the fitted line. Only when no K was measured does the line decide."""
    measured = [a for a in advice if not a.extrapolated] or advice
    return max(measured, key=lambda a: (a.refined, -a.k))


PLAIN = KAdvice(0, 1.0, 1.0, 1.0, 0.0, False, 1.0)  # K=0: no draft, no verify pass, one target step a token


def advised_k(advice: list[KAdvice]) -> KAdvice:
    """What the advisor tells a run to do: the best K, or PLAIN (K=0, decode plainly) when even the
    best K is predicted slower than plain decoding on the machine the curve was measured on."""
    best = best_k(advice)
    return best if best.refined >= 1.0 else PLAIN


def advice_sentence(advice: list[KAdvice]) -> str:
    best = best_k(advice)
    why = (f"At K={best.k} a cycle costs {best.cost_steps:.2f} target steps (K draft steps, one verify pass "
           f"and any measured overhead) and is expected to commit {best.expected_tokens:.2f} tokens.")
    if advised_k(advice).k == 0:
        # why, in the terms that decide it: the measured verify pass (and the whole cycle) against what a cycle commits
        outweighs = "already more than" if best.verify_steps >= best.expected_tokens else "and with the draft steps more than"
        return (f"Decode plainly (K=0): no K beats plain decoding on this machine. The best, K={best.k}, is "
                f"predicted at {best.refined:.2f}x: its verify pass over {best.k + 1} positions costs "
                f"{best.verify_steps:.2f} target steps here (the whole cycle {best.cost_steps:.2f}), {outweighs} the "
                f"{best.expected_tokens:.2f} tokens a cycle is expected to commit, where plain decoding commits one "
                "token per step.")
    return (f"Best K = {best.k}: predicted {best.refined:.2f}x plain decoding "
            f"(Leviathan's formula would say {best.leviathan:.2f}x at that K). {why}")


# ---------------------------------------------------------------- everything for one trace

@dataclass(frozen=True)
class TraceStats:
    k: int
    num_cycles: int
    acceptance: dict  # acceptance_metrics(): the vLLM V1 metrics
    alpha: float
    beta_by_position: list[float]
    tokens_per_cycle: list[int]  # counts for n = 1..K+1
    pmf: list[float]  # truncated geometric at alpha, n = 1..K+1
    times: CycleTimes | None
    calibration: Calibration | None
    calibration_error: str | None  # why a present calibration could not be used
    speed: SpeedReport | None
    advice: list[KAdvice]
    tokens_per_s: float | None  # the summary's end-to-end rate (prefill and trace writing included)
    drafter: str = DRAFT_MODEL  # the trace header's drafter kind
    by_ngram: list["ValueRow"] | None = None  # prompt lookup only: acceptance by matched n-gram size
    by_source: list["ValueRow"] | None = None  # suffix decoding only: acceptance by the tree that proposed


@dataclass(frozen=True)
class ValueRow:
    """The cycles whose drafter state held one value of a field: prompt lookup's matched n-gram size, or suffix
    decoding's source tree ("request", "global"); None where the drafter proposed nothing."""

    value: int | str | None
    cycles: int
    proposed: int
    accepted: int

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0


def tally_by(cycles: list[dict], name: str) -> dict:
    """[cycles, proposed, accepted] per value of the drafter state's field `name`."""
    rows: dict = {}
    for c in cycles:
        row = rows.setdefault((c.get("drafter_state") or {}).get(name), [0, 0, 0])
        row[0] += 1
        row[1] += len(c["draft_token_ids"])
        row[2] += c["num_accepted"]
    return rows


def acceptance_by_source(cycles: list[dict]) -> list[ValueRow]:
    """Which tree's drafts the target keeps: this request's own text, or the global tree's outputs."""
    rows = tally_by(cycles, "source")
    return [ValueRow(source, *rows[source]) for source in (SUFFIX_REQUEST, SUFFIX_GLOBAL, None) if source in rows]


def acceptance_by_ngram(cycles: list[dict]) -> list[ValueRow]:
    """Does a longer match predict the continuation better? One row per matched n, then no match."""
    rows = tally_by(cycles, "ngram_size")
    order = sorted((n for n in rows if n is not None), reverse=True) + ([None] if None in rows else [])
    return [ValueRow(n, *rows[n]) for n in order]


def trace_stats(trace: Trace) -> TraceStats:
    cycles, k = trace.cycles, trace.k
    alpha = measured_alpha(cycles)
    times = cycle_times(cycles)
    try:
        cal, cal_error = calibration_of(trace.header), None
    except ValueError as err:
        cal, cal_error = None, str(err)
    overhead = overhead_of(cycles, times)
    speed = speed_report(k, alpha, times, cal, overhead) if cal and times else None
    advice = advise_k(alpha, times.draft_step_s, cal, advisor_ks(cal, k), overhead) if cal and times else []
    drafted = [len(c["draft_token_ids"]) for c in cycles]
    return TraceStats(k, len(cycles), acceptance_metrics([c["num_accepted"] for c in cycles], k, drafted), alpha,
                      beta_by_position(cycles, k), tokens_per_cycle_counts(cycles, k),
                      truncated_geometric_pmf(alpha, k), times, cal, cal_error, speed, advice,
                      trace.summary["tokens_per_s"] if trace.summary else None, trace.drafter_kind,
                      acceptance_by_ngram(cycles) if trace.drafter_kind == PROMPT_LOOKUP else None,
                      acceptance_by_source(cycles) if trace.drafter_kind == SUFFIX else None)
