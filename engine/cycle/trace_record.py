"""A cycle's trace record (engine.trace.format.CycleRecord), built in one place for every cycle kind.

The reference path (reference.py), the fast path (fast.py) and the tree (engine/tree/cycle.py)
run a cycle differently but write their records here (the chain paths key for key and value
for value the same; a tree's adds its `tree` entry):
- `shown_tensors`: what the trace shows of the cycle's distributions, picked out by tensor
  ops on whatever device they live on (no host read: the fast path copies the result once);
- `describe_cycle`: those numbers, as plain Python data, turned into the description fields
  (the `record=True` part);
- `cycle_record`: the whole record, from the kind's CycleStep and Settled (engine/cycle/step.py),
  called by the driver (engine/cycle/driver.py) after every cycle.
"""
from collections.abc import Callable

import torch

from engine.cycle.step import CycleStep, Settled
from engine.trace.format import CycleRecord

Texts = Callable[[int], str]  # token id -> its decoded text (engine.cycle.reference.TokenTexts)


def shown_tensors(draft_tokens: list[int] | torch.Tensor, p_draft: torch.Tensor, p_target: torch.Tensor,
                  residual: torch.Tensor | None, row: int | torch.Tensor, next_token: int | torch.Tensor,
                  n_top: int) -> dict[str, torch.Tensor]:
    """The numbers behind a cycle's description, on the distributions' device.

    draft_tokens (n,), p_draft (n, V), p_target (n+1, V); `residual` (V,) is the distribution
    the next token was drawn from at 0-based position `row` after a rejection (None when the
    path knows there was none). Ints and lists become tensors; tensors are used as they are.
    """
    device = p_target.device
    tokens = torch.as_tensor(draft_tokens, dtype=torch.long, device=device)
    k = tokens.shape[0]
    idx = torch.arange(k, device=device)
    n_top = min(n_top, p_target.shape[-1])
    target_top, draft_top = torch.topk(p_target, n_top, dim=-1), torch.topk(p_draft, n_top, dim=-1)
    shown = {"p_draft": p_draft[idx, tokens], "p_target": p_target[idx, tokens],
             "beta": torch.minimum(p_target[:k], p_draft).sum(-1),  # (n,) overlap of the two distributions
             "target_top_p": target_top.values, "target_top_id": target_top.indices,
             "draft_top_p": draft_top.values, "draft_top_id": draft_top.indices}
    if residual is None:
        return shown
    at = torch.as_tensor(row, dtype=torch.long, device=device).reshape(1)  # index_select: no host read
    ids = torch.cat([torch.topk(residual, n_top).indices,  # the sampled token is always shown
                     torch.as_tensor(next_token, dtype=torch.long, device=device).reshape(1)])
    return {**shown, "residual_ids": ids, "residual_p": residual[ids],
            "residual_p_target": p_target.index_select(0, at)[0][ids],
            "residual_p_draft": p_draft.index_select(0, at)[0][ids]}


def top_entries(values: list[list[float]], ids: list[list[int]], texts: Texts) -> list[list[dict]]:
    """One list per row of the most likely tokens and their probabilities (zeros left out)."""
    return [[{"token_id": i, "text": texts(i), "p": v} for v, i in zip(row_v, row_i) if v > 0]
            for row_v, row_i in zip(values, ids)]


def residual_entries(shown: dict[str, list], next_token: int, texts: Texts) -> list[dict]:
    """The residual's top tokens with both models' probabilities; the sampled token (listed last)
    is shown once, also when it is among the top ones, and also when its residual is 0."""
    entries, seen = [], set()
    for i, t in enumerate(shown["residual_ids"]):
        if t in seen:
            continue
        seen.add(t)
        if shown["residual_p"][i] > 0 or t == next_token:
            entries.append({"token_id": t, "text": texts(t), "p_target": shown["residual_p_target"][i],
                            "p_draft": shown["residual_p_draft"][i], "residual": shown["residual_p"][i]})
    return entries


def describe_cycle(shown: dict[str, list], draft_tokens: list[int], num_accepted: int, next_token: int,
                   accept_prob: list[float], u: list[float], committed: list[int], texts: Texts) -> dict:
    """The probabilities and draws behind a cycle's decision, for the trace; `shown` is
    shown_tensors' output as plain lists. A rejection is fewer accepted than proposed."""
    rejected = num_accepted < len(draft_tokens)
    return {
        "draft_token_texts": [texts(t) for t in draft_tokens],
        "p_draft": shown["p_draft"], "p_target": shown["p_target"],
        "accept_prob": accept_prob, "u": u, "beta": shown["beta"],
        "rejected_position": num_accepted + 1 if rejected else None,
        "resampled_token_id": next_token if rejected else None,
        "bonus_token_id": None if rejected else next_token,
        "next_token_text": texts(next_token),
        "residual_top": residual_entries(shown, next_token, texts) if rejected else None,
        "target_top": top_entries(shown["target_top_p"], shown["target_top_id"], texts),
        "draft_top": top_entries(shown["draft_top_p"], shown["draft_top_id"], texts),
        "committed_token_texts": [texts(t) for t in committed],
    }


def cycle_record(cycle: int, committed_len_before: int, step: CycleStep, committed: list[int], finished: bool,
                 settled: Settled, cycle_s: float, description: dict | None = None) -> CycleRecord:
    """A cycle's record, for every cycle kind. A chain's lists its proposals (`draft_token_ids`); a tree's
    nodes are in its description's `tree` entry. Without a `description` (an untraced run) the record
    lacks the description fields."""
    rec = {"type": "cycle", "cycle": cycle, "committed_len_before": committed_len_before}
    if step.draft_token_ids is not None:
        rec["draft_token_ids"] = step.draft_token_ids
    rec |= {
        "num_accepted": len(step.accepted_token_ids), "committed_token_ids": committed, "finished": finished,
        "target_cache_len": settled.target_cache_len, "draft_cache_len": settled.draft_cache_len,
        **settled.layout_fields,
        "draft_catch_up": settled.draft_catch_up, "verify_positions": step.verify_positions,
        "draft_time_s": sum(step.draft_step_times_s), "draft_step_times_s": step.draft_step_times_s,
        "verify_time_s": step.verify_time_s, "catch_up_time_s": settled.catch_up_time_s, "cycle_time_s": cycle_s,
    }
    if step.drafter_state is not None:  # the model drafter adds nothing: its records stay as they were
        rec["drafter_state"] = step.drafter_state
    rec |= description or {}
    return rec if step.draft_token_ids is not None else tree_key_order(rec)


# A tree record lists its texts beside its ids, as tree traces (the bundled ones too) always have.
TREE_HEAD = ("type", "cycle", "committed_len_before", "num_accepted", "committed_token_ids", "committed_token_texts",
             "finished", "next_token_text")


def tree_key_order(rec: dict) -> dict:
    """The same record with TREE_HEAD's keys first: the key order of every tree trace written so far."""
    head = {key: rec[key] for key in TREE_HEAD if key in rec}
    return head | {key: value for key, value in rec.items() if key not in head}
