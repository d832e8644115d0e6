"""What a trace says about time: its header's step-time calibration and where its cycles' time goes.

`Calibration` is the header's optional calibration (engine/stats/calibrate.py measures it);
`CycleTimes` is a typical cycle's time split, medians over the records. engine/stats/analysis.py
turns both into c, the verify cost and the speedups.
"""
from dataclasses import dataclass
from statistics import fmean, median

from engine.stats.robust import Spread, spread_of


@dataclass(frozen=True)
class Calibration:
    """Step times measured on the pair at one cache length (see engine/stats/calibrate.py)."""

    cache_len: int
    target_step_s: float
    draft_step_s: float
    verify_positions: list[int]
    verify_s: list[float]

    def fit(self) -> tuple[float, float]:
        """Least-squares line t_verify(n) = intercept + slope * n through the measured widths."""
        xs, ys = self.verify_positions, self.verify_s
        if len(xs) < 2:
            return ys[0], 0.0
        mx, my = fmean(xs), fmean(ys)
        spread = sum((x - mx) ** 2 for x in xs)
        if spread == 0:  # one width measured several times: no slope to fit
            return my, 0.0
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / spread
        return my - slope * mx, slope

    def verify_time(self, positions: int) -> float:
        """Measured time to verify `positions` positions; the fitted line beyond the measured widths."""
        if positions in self.verify_positions:
            return self.verify_s[self.verify_positions.index(positions)]
        intercept, slope = self.fit()
        return max(intercept + slope * positions, self.verify_s[-1])

    def measured(self, positions: int) -> bool:
        return positions in self.verify_positions


def calibration_of(header: dict) -> Calibration | None:
    """The header's optional calibration; None when absent, ValueError when malformed."""
    raw = header.get("calibration")
    if raw is None:
        return None
    try:
        cal = Calibration(int(raw["cache_len"]), float(raw["target_step_s"]), float(raw["draft_step_s"]),
                          [int(n) for n in raw["verify_positions"]], [float(t) for t in raw["verify_s"]])
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"the trace's calibration is malformed: {err!r}") from None
    if not cal.verify_positions or len(cal.verify_positions) != len(cal.verify_s):
        raise ValueError("the trace's calibration has no verify times, or positions and times differ in length")
    if min([cal.target_step_s, cal.draft_step_s, *cal.verify_s]) <= 0:
        raise ValueError("the trace's calibration has a time that is not positive")
    return cal


@dataclass(frozen=True)
class CycleTimes:
    """Where a typical cycle's time goes (seconds per cycle unless named otherwise): medians
    over cycles, except the catch-up, which only some cycles pay and so is averaged."""

    draft_step_s: float  # one draft step (median over all steps)
    draft_s: float  # K draft steps
    verify_s: float  # one target pass over K+1 positions
    catch_up_s: float  # feeding d_K to the draft after a full accept, averaged over all cycles
    other_s: float  # the rest: acceptance test, resampling, rollback, Python bookkeeping
    cycle_s: float
    decode_s: float  # all cycles together
    tokens: int  # tokens all cycles committed
    cycles: int
    draft_step: Spread  # one draft step's median and quartiles
    cycle: Spread  # one cycle's median and quartiles


def cycle_times(cycles: list[dict]) -> CycleTimes | None:
    if not cycles:
        return None
    steps = [t for c in cycles for t in c["draft_step_times_s"]] or [0.0]
    draft, verify = median(c["draft_time_s"] for c in cycles), median(c["verify_time_s"] for c in cycles)
    catch_up = fmean(c["catch_up_time_s"] for c in cycles)
    cycle = spread_of([c["cycle_time_s"] for c in cycles])
    return CycleTimes(median(steps), draft, verify, catch_up, max(0.0, cycle.median - draft - verify - catch_up),
                      cycle.median, sum(c["cycle_time_s"] for c in cycles),
                      sum(len(c["committed_token_ids"]) for c in cycles), len(cycles), spread_of(steps), cycle)
