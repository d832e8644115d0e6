"""Per-request lab traces from facts a vLLM step hands over: plain Python, no vLLM and no torch, so the
lab's own tests can drive it with made-up steps and read the result back with engine.trace.load_trace.

One `Recorder` per engine process. For each request it writes `<id>.jsonl.partial` (a header, then one
cycle record per verify step as the step ends) and renames it to `<id>.jsonl` with a summary when the
request ends; `manifest.json` lists every trace, rewritten whole (write, then rename) each time one ends.

The cycle records follow docs/trace-format.md under the `vllm_num_computed` cache convention (the lab's
engine/trace/schema.py defines it; this package imports nothing of the lab, so the name and text are
repeated here and a lab test keeps them equal).
"""
import fcntl
import json
import math
import os
import re
import time
from dataclasses import dataclass, field

FORMAT, VERSION = "speclab-trace", 1
MANIFEST = "manifest.json"
CONVENTION = "vllm_num_computed"
CONVENTION_TEXT = (
    "vLLM's num_computed_tokens, read from the scheduler's output at each step: before a decode step it is the "
    "committed length - 1; the verify step computes the last committed token and the n drafts (after_append = "
    "before + n + 1); the scheduler then subtracts the rejected drafts (after_rollback = after_append - "
    "(n - accepted)), counting accepted drafts even past a stop. The rejected drafts' K/V stay in their paged "
    "slots until overwritten. The first cycle is the prefill: no drafts, from the prefix-cache hit (or 0) to the "
    "prompt's length. A draft passes when p_target/p_draft >= u; greedy steps draw no u."
)
NGRAM_TEXT = "vLLM's n-gram proposer: deterministic, so p_draft is 1 (a one-hot q)"
ID_CHARS = re.compile(r"[^A-Za-z0-9._-]")


def writes_traces(tp_rank: int, last_pp_stage: bool) -> bool:
    """Whether this worker process writes its engine's traces.

    Under tensor parallelism every rank of the last pipeline stage samples the same tokens from the same
    logits (vLLM gathers them), so only TP rank 0 writes; earlier pipeline stages never sample. Data-parallel
    engines serve requests of their own and all write, into the one folder (write_manifest merges)."""
    return tp_rank == 0 and last_pp_stage


@dataclass
class Sampling:
    """A request's sampling settings as the lab names them (vLLM: top_k -1 or 0 and top_p 1 mean off)."""

    temperature: float
    top_k: int
    top_p: float
    seed: int | None
    max_new_tokens: int
    eos_token_ids: list[int]


@dataclass
class DraftRows:
    """A drafter's distributions q where vLLM handed them to its rejection sampler (a draft model that samples):
    q of each draft token, each row's (token, q) most likely first, and beta = sum_x min(p_target, q)."""

    p_draft: list[float]
    top: list[list[tuple[int, float]]]
    beta: list[float]


@dataclass
class Step:
    """What one vLLM step did for one request, as the hooks read it.

    `tokens` are the valid sampled tokens (accepted drafts, then the recovered or bonus token). `p_target[i]`
    is the target's warped probability of draft i; `target_top` has n+1 rows of (token, p), most likely first
    (the last is the bonus position's); `residual_top` rows (token, p_target, residual, p_draft) where a draft was
    rejected; `u` the uniform draws of the drafts (None when greedy); `draft` the draft's distributions, None
    where q is one-hot on each draft (n-gram, a draft model's argmax, any greedy request).
    """

    before: int  # num_computed_tokens when scheduled
    scheduled: int  # tokens computed this step
    drafts: list[int]
    tokens: list[int]
    p_target: list[float]
    target_top: list[list[tuple[int, float]]]
    residual_top: list[tuple[int, float, float, float]] | None
    u: list[float] | None
    draft_time_s: float
    verify_time_s: float
    cycle_time_s: float
    capture_time_s: float = 0.0  # the capture's own seconds in this step (and in writing the step before)
    draft: DraftRows | None = None


@dataclass
class Request:
    rid: str
    file: str
    prompt_ids: list[int]
    sampling: Sampling
    handle: object
    generated: list[int] = field(default_factory=list)
    cycles: list[dict] = field(default_factory=list)  # only what the summary needs: num_accepted, drafts
    chain: int | None = None  # target_cache_len.after_rollback of the last cycle
    started: float = 0.0
    finished: bool = False


def ngram_match(sequence: list[int], drafts: list[int], lo: int, hi: int) -> dict:
    """The n-gram match that explains the drafts: the longest n in lo..hi whose earlier occurrence (the
    earliest one) is followed by them. The lab's loader checks it against the sequence."""
    state = {"kind": "prompt-lookup", "matched": False, "proposed": 0, "ngram_size": None, "match_start": None,
             "continuation_start": None}
    if not drafts:
        return state
    for n in range(min(hi, len(sequence) - 1), lo - 1, -1):
        tail = sequence[len(sequence) - n:]
        for start in range(0, len(sequence) - n):
            if sequence[start:start + n] == tail and sequence[start + n:start + n + len(drafts)] == drafts:
                return state | {"matched": True, "proposed": len(drafts), "ngram_size": n, "match_start": start,
                                "continuation_start": start + n}
    return state | {"note": "no earlier n-gram is followed by these drafts"}


def not_finite(s: Step) -> str | None:
    """Why a step cannot be a lab cycle (a trace holds finite numbers only), or None: vLLM 0.32's CPU build has
    been seen testing drafts against NaN rows (docs/servers.md, "Capturing vLLM's cycles")."""
    for i, p in enumerate(s.p_target):
        if not math.isfinite(p):
            return f"vLLM tested draft {i + 1} against a target distribution that is not finite (p_target {p})"
    numbers = [p for row in s.target_top for _, p in row] + [x for e in s.residual_top or [] for x in e[1:]]
    if s.draft is not None:
        numbers += s.draft.p_draft + s.draft.beta + [p for row in s.draft.top for _, p in row]
    if not all(math.isfinite(x) for x in numbers + list(s.u or [])):
        return "a target or draft distribution or a draw of this step is not finite"
    return None


def commit(tokens: list[int], budget: int, eos: set) -> tuple[list[int], bool]:
    """The lab's commit rule (engine/trace/commit.py) as vLLM's scheduler applies it: cut after the first stop
    token and at the token budget."""
    out = []
    for t in tokens[:max(budget, 0)]:
        out.append(t)
        if t in eos:
            return out, True
    return out, len(out) >= budget


class Recorder:
    def __init__(self, folder: str, header_base: dict, k: int, ngram: tuple[int, int] | None, decode,
                 trace_top_k: int = 10):
        """`header_base` holds the header fields that are the same for every request (target, draft, drafter,
        device, dtype, versions, ...); `ngram` the n-gram proposer's sizes (None: a draft model, which records no
        drafter_state); `decode(id)` is a token's text."""
        self.folder = folder
        os.makedirs(folder, exist_ok=True)
        self.base = header_base
        self.k = k
        self.ngram = ngram
        self.decode = decode
        self.trace_top_k = trace_top_k
        self.requests: dict[str, Request] = {}
        self.entries: list[dict] = []
        self.texts: dict[int, str] = {}

    def text(self, t: int) -> str:
        if t not in self.texts:
            self.texts[t] = self.decode(t)
        return self.texts[t]

    # ------------------------------------------------------------ requests

    def start(self, rid: str, prompt_ids: list[int], sampling: Sampling, prompt_text: str | None = None) -> None:
        name = ID_CHARS.sub("_", rid)[:120] or "request"
        taken = {e["file"] for e in self.entries} | {r.file for r in self.requests.values()}
        file, i = f"{name}.jsonl", 1
        while file in taken:
            file, i = f"{name}-{i}.jsonl", i + 1
        drafter = self.base["drafter"]
        if drafter.get("vllm_draft_sample_method") == "probabilistic" and sampling.temperature > 0 and (
                sampling.top_k > 0 or sampling.top_p < 1):
            # vLLM's sampling draft warps by temperature alone: the lab's name for a draft that ignores the filters
            drafter = drafter | {"draft_filters": "temperature only"}
        header = {
            "type": "header", "format": FORMAT, "version": VERSION, **self.base, "drafter": drafter,
            "settings": {"k": self.k, "temperature": sampling.temperature, "top_k": sampling.top_k,
                         "top_p": sampling.top_p, "seed": sampling.seed if sampling.seed is not None else 0,
                         "max_new_tokens": sampling.max_new_tokens, "trace_top_k": self.trace_top_k},
            "prompt": prompt_text if prompt_text is not None else "".join(self.text(t) for t in prompt_ids),
            "prompt_token_ids": list(prompt_ids), "prompt_token_texts": [self.text(t) for t in prompt_ids],
            "cache_convention": {"name": CONVENTION, "text": CONVENTION_TEXT},
            "eos_token_ids": sorted(sampling.eos_token_ids),
            "request": {"id": name[:100], "category": "vllm"},
            "vllm_request": {"request_id": rid, "seeded": sampling.seed is not None},
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        handle = open(os.path.join(self.folder, file + ".partial"), "w", encoding="utf-8")
        handle.write(json.dumps(header, ensure_ascii=False) + "\n")
        handle.flush()
        self.requests[rid] = Request(rid, file, list(prompt_ids), sampling, handle, started=time.perf_counter())

    def step(self, rid: str, s: Step) -> bool:
        """Write one cycle; returns whether the request finished in it (then its trace is closed)."""
        r = self.requests.get(rid)
        if r is None or r.finished:
            return False
        bad = not_finite(s)
        if bad:
            self.end(rid, bad)
            return False
        n, na = len(s.drafts), len(s.tokens) - 1
        nxt = s.tokens[-1]
        eos = set(r.sampling.eos_token_ids)
        committed, finished = commit(s.tokens, r.sampling.max_new_tokens - len(r.generated), eos)
        greedy = r.sampling.temperature == 0
        sequence = r.prompt_ids + r.generated
        rejected = na < n
        after_append = s.before + s.scheduled
        q = s.draft or DraftRows([1.0] * n, [[(d, 1.0)] for d in s.drafts], list(s.p_target))  # one-hot: beta = p
        record = {
            "type": "cycle", "cycle": len(r.cycles), "committed_len_before": len(sequence),
            "draft_token_ids": list(s.drafts), "draft_token_texts": [self.text(t) for t in s.drafts],
            "p_draft": list(q.p_draft), "p_target": list(s.p_target),
            "accept_prob": [min(1.0, p / pd) if pd > 0 else 1.0 for p, pd in zip(s.p_target, q.p_draft)],
            "u": [] if greedy or s.u is None else list(s.u[:min(na + 1, n)]),
            "beta": list(q.beta),
            "num_accepted": na, "rejected_position": na + 1 if rejected else None,
            "resampled_token_id": nxt if rejected else None, "bonus_token_id": None if rejected else nxt,
            "next_token_text": self.text(nxt),
            "residual_top": None if not rejected else [
                {"token_id": t, "text": self.text(t), "p_target": pt, "p_draft": pd, "residual": res}
                for t, pt, res, pd in (s.residual_top or [])],
            "target_top": [[{"token_id": t, "text": self.text(t), "p": p} for t, p in row] for row in s.target_top],
            "draft_top": [[{"token_id": t, "text": self.text(t), "p": p} for t, p in row] for row in q.top],
            "committed_token_ids": committed, "committed_token_texts": [self.text(t) for t in committed],
            "finished": finished,
            "target_cache_len": {"before": s.before, "after_append": after_append,
                                 "after_rollback": after_append - (n - na)},
            "draft_cache_len": None, "draft_catch_up": False, "verify_positions": s.scheduled,
            "draft_time_s": s.draft_time_s, "draft_step_times_s": [s.draft_time_s] if n else [],
            "verify_time_s": s.verify_time_s, "catch_up_time_s": 0.0, "cycle_time_s": s.cycle_time_s,
            "capture_time_s": s.capture_time_s,
        }
        if self.ngram is not None:  # a draft model's records carry no drafter_state, as the lab's own
            record["drafter_state"] = ngram_match(sequence, list(s.drafts), *self.ngram) | (
                {"note": "the prefill step: vLLM drafts only after it"} if not r.cycles else {})
        r.handle.write(json.dumps(record, ensure_ascii=False) + "\n")
        r.handle.flush()
        r.cycles.append({"num_accepted": na, "n": n})
        r.generated += committed
        r.chain = record["target_cache_len"]["after_rollback"]
        if finished:
            self.end(rid, "finished")
        return finished

    def end(self, rid: str, how: str) -> None:
        """The request ended: with its last cycle ("finished"), or otherwise (aborted, preempted, unsupported):
        then the trace keeps its cycles and no summary, as the lab's reader expects of an unfinished run."""
        r = self.requests.pop(rid, None)
        if r is None:
            return
        r.finished = True
        partial = os.path.join(self.folder, r.file + ".partial")
        complete = how == "finished"
        if complete:
            r.handle.write(json.dumps(self.summary(r), ensure_ascii=False) + "\n")
        r.handle.close()
        final = os.path.join(self.folder, r.file if complete else r.file + ".incomplete")
        os.replace(partial, final)
        self.entries.append({"file": os.path.basename(final), "request_id": r.rid, "complete": complete,
                             "ended": how, "prompt_tokens": len(r.prompt_ids), "num_generated": len(r.generated),
                             "num_cycles": len(r.cycles), "temperature": r.sampling.temperature})
        self.write_manifest()

    def summary(self, r: Request) -> dict:
        k = self.k
        drafting = [c for c in r.cycles if c["n"] > 0]
        accepted = sum(c["num_accepted"] for c in drafting)
        drafted = sum(c["n"] for c in drafting)
        per_pos = [sum(1 for c in drafting if c["num_accepted"] > i) / len(drafting) if drafting else 0.0
                   for i in range(k)]
        wall = time.perf_counter() - r.started
        eos = set(r.sampling.eos_token_ids)
        return {
            "type": "summary", "generated_token_ids": r.generated,
            "generated_text": "".join(self.text(t) for t in r.generated if t not in eos),
            "acceptance_rate": accepted / drafted if drafted else 0.0,
            "mean_acceptance_length": 1 + accepted / len(drafting) if drafting else 0.0,
            "per_position_acceptance": per_pos, "num_cycles": len(r.cycles), "num_generated": len(r.generated),
            "stop_reason": "eos" if r.generated and r.generated[-1] in eos else "max_new_tokens",
            "wall_time_s": wall, "tokens_per_s": len(r.generated) / wall if wall > 0 else 0.0,
        }

    def write_manifest(self) -> None:
        """Add this process's ended requests to the folder's manifest. Data-parallel engines are processes of
        their own writing into one folder: each rewrites the manifest under a lock, keeping the others' entries."""
        path = os.path.join(self.folder, MANIFEST)
        with open(path + ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            try:
                with open(path, encoding="utf-8") as f:
                    listed = json.load(f)["traces"]
            except (OSError, ValueError, KeyError, TypeError):
                listed = []  # the first request to end in this folder
            known = {e.get("file") for e in listed if isinstance(e, dict)}
            body = {"format": "speclab-vllm-capture", "version": 1, "cache_convention": CONVENTION,
                    "traces": listed + [e for e in self.entries if e["file"] not in known]}
            with open(path + ".tmp", "w", encoding="utf-8") as out:
                json.dump(body, out, indent=1)
            os.replace(path + ".tmp", path)
