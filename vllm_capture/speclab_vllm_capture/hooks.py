"""The wrappers around vLLM 0.32's model runner and rejection sampler that feed the Recorder.

Nothing here changes what vLLM computes: each wrapper reads its arguments (before the wrapped call, where
vLLM may update a tensor in place) and its result, and returns the result untouched. Any error inside the
capture turns the capture off with one log line; the server keeps serving.

Where each fact comes from, per step (GPUModelRunner, which vLLM's CPUModelRunner subclasses):
- execute_model(scheduler_output): which requests run, their num_computed_tokens and the drafts the scheduler
  sent (scheduled_spec_decode_tokens), the requests that ended (finished_req_ids), the forward's time;
- _sample(logits, spec_decode_metadata): the sampled tokens per row ([accepted drafts..., recovered or bonus]);
  the bonus position's logits (or a plain step's), warped here as vLLM's sampler warps them;
- rejection_sampler.rejection_sample: the target's logits at the draft positions after vLLM's own processing
  (penalties, temperature, top-k/top-p), so p_target is the distribution vLLM tested against;
- rejection_sampler.generate_uniform_probs: the uniform draws;
- rejection_sampler.rejection_sample: also the draft model's distributions q where vLLM samples its drafts
  (draft_sample_method 'probabilistic'); otherwise q is one-hot on each draft;
- propose_draft_token_ids: the proposer's time (its drafts are used by the next step);
- sample_tokens: the end of the step: the cycle records are written then.
"""
import logging
import time

import torch

from speclab_vllm_capture.recorder import DraftRows, Recorder, Sampling, Step, writes_traces

log = logging.getLogger("speclab_vllm_capture")
TOP = 10
CAPTURED_METHODS = ("ngram", "draft_model")


def describe_drafter(runner, spec, vocab: int) -> tuple[dict, dict]:
    """The trace header's "draft" and "drafter" entries for vLLM's n-gram proposer or its separate draft model.

    vLLM's draft model drafts its argmax unless draft_sample_method is "probabilistic"; then it samples from its
    distribution at the request's temperature alone, ignoring top-k and top-p, which the lab calls a draft that
    filters by temperature only."""
    if spec.method == "ngram":
        return ({"name": "vLLM n-gram proposer", "architecture": "none (copies earlier tokens)", "parameters": 0,
                 "vocab_size": vocab, "kept_vocab": None},
                {"kind": "prompt-lookup", "min_ngram": spec.prompt_lookup_min, "max_ngram": spec.prompt_lookup_max,
                 "ngram_match": "earliest", "p_draft": "one-hot: vLLM's n-gram proposer is deterministic"})
    config = spec.draft_model_config
    arch = (getattr(config.hf_config, "architectures", None) or ["unknown"])[0]
    params = sum(p.numel() for p in runner.drafter.model.parameters())
    draft = {"name": config.served_model_name or config.model, "architecture": arch, "parameters": params,
             "vocab_size": config.get_vocab_size(), "kept_vocab": None}
    if spec.draft_sample_method == "probabilistic":
        return draft, {"kind": "model", "vllm_draft_sample_method": "probabilistic",
                       "p_draft": "the draft's distribution at the request's temperature, as vLLM sampled from it"}
    return draft, {"kind": "model", "vllm_draft_sample_method": "greedy",
                   "p_draft": "one-hot: vLLM's draft model proposes its argmax (draft_sample_method 'greedy')"}


class Capture:
    """One per engine process: the recorder (made on the first step, when the runner's config is known) and
    the facts of the step in flight."""

    def __init__(self, folder: str):
        self.folder = folder
        self.recorder: Recorder | None = None
        self.on = True
        self.step: dict | None = None  # the step in flight
        self.draft_time = 0.0  # the last lookup's time: its drafts are verified by the next step
        self.in_sample: dict | None = None  # filled by the rejection sampler's wrappers
        self.prefill: dict[str, tuple[int, float]] = {}  # a chunked prefill so far: where it started, its seconds
        self.spent = 0.0  # seconds inside the capture's wrappers since the last step's cycles were written

    def off(self, why: str) -> None:
        if self.on:
            log.warning("speclab capture off: %s", why)
        self.on = False

    # ------------------------------------------------------------ setup

    def setup(self, runner) -> None:
        spec = runner.speculative_config
        method = getattr(spec, "method", None)
        if method not in CAPTURED_METHODS:
            self.off(f"speculative method {method!r} is not captured (only {', '.join(map(repr, CAPTURED_METHODS))})")
            return
        from vllm.distributed import parallel_state
        tp_rank = parallel_state.get_tensor_model_parallel_rank()
        if not writes_traces(tp_rank, parallel_state.get_pp_group().is_last_rank):
            log.info("speclab capture: this worker (TP rank %d) writes nothing: TP rank 0 of the last pipeline "
                     "stage writes its engine's traces", tp_rank)
            self.on = False  # another rank writes; this one adds no cost
            return
        import transformers
        import vllm
        model_config = runner.model_config
        tokenizer = transformers.AutoTokenizer.from_pretrained(model_config.tokenizer)
        vocab = model_config.get_vocab_size()
        params = sum(p.numel() for p in runner.model.parameters())
        arch = (getattr(model_config.hf_config, "architectures", None) or ["unknown"])[0]
        draft, drafter = describe_drafter(runner, spec, vocab)
        base = {
            "target": {"name": model_config.served_model_name or model_config.model, "architecture": arch,
                       "parameters": params, "vocab_size": vocab, "kept_vocab": None},
            "draft": draft, "drafter": drafter,
            "tokenizer": type(tokenizer).__name__,
            "device": str(runner.device), "dtype": str(model_config.dtype).replace("torch.", ""),
            "versions": {"vllm": vllm.__version__, "torch": torch.__version__,
                         "transformers": transformers.__version__},
            "captured_by": {"plugin": "speclab_vllm_capture", "timings": (
                "per step of the whole batch: verify_time_s is execute_model's forward, cycle_time_s the step "
                "from execute_model to the end of sampling, draft_time_s the proposer's run that drafted the "
                "cycle's tokens (at the end of the step before)")},
        }
        ngram = (spec.prompt_lookup_min, spec.prompt_lookup_max) if method == "ngram" else None
        self.recorder = Recorder(self.folder, base, spec.num_speculative_tokens, ngram,
                                 lambda t: tokenizer.decode([t]), TOP)
        self.max_model_len = model_config.max_model_len

    # ------------------------------------------------------------ execute_model: what was scheduled

    def begin(self, runner, out) -> None:
        if self.recorder is None:
            self.setup(runner)
            if not self.on:
                return
        rec = self.recorder
        for rid in out.finished_req_ids:
            rec.end(rid, "ended by the scheduler before its last cycle (aborted)")
            self.prefill.pop(rid, None)
        cached = out.scheduled_cached_reqs
        for rid in set(out.preempted_req_ids or ()) | set(cached.resumed_req_ids):
            # vLLM drops a preempted request's cache and later computes prompt and output again in one prefill:
            # no lab cycle is that, so the trace keeps the cycles before it and says why it stops
            rec.end(rid, "preempted: vLLM freed its cache and recomputes it, which a lab trace cannot show")
            self.prefill.pop(rid, None)
        computed = {}
        for new in out.scheduled_new_reqs:
            computed[new.req_id] = new.num_computed_tokens
            if new.sampling_params is None or new.prompt_token_ids is None:
                continue
            sp = new.sampling_params
            greedy = sp.temperature < 1e-5
            eos = set(sp.all_stop_token_ids)
            prompt = list(new.prompt_token_ids)
            budget = min(sp.max_tokens if sp.max_tokens is not None else 10**9, self.max_model_len - len(prompt))
            rec.start(new.req_id, prompt, Sampling(
                0.0 if greedy else float(sp.temperature), 0 if sp.top_k in (None, -1) else int(sp.top_k),
                float(sp.top_p), sp.seed, int(budget), sorted(eos)))
        for rid, n in zip(cached.req_ids, cached.num_computed_tokens):
            computed[rid] = n
        self.step = {"t0": time.perf_counter(), "computed": computed,
                     "scheduled": dict(out.num_scheduled_tokens),
                     "drafts": {r: [t for t in d if t >= 0] for r, d in out.scheduled_spec_decode_tokens.items()},
                     "pending": []}

    def forward_done(self) -> None:
        if self.step is not None:
            self.step["t_forward"] = time.perf_counter() - self.step["t0"]

    # ------------------------------------------------------------ _sample: the distributions and the tokens

    def warped_rows(self, runner, logits: torch.Tensor, rows: list[int], greedy: list[bool]) -> list:
        """The (top, probs) of each row's next-token distribution, warped as vLLM's sampler warps it."""
        from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p
        md = runner.input_batch.sampling_metadata
        out = []
        for row, (i, g) in enumerate(zip(rows, greedy)):
            x = logits[i].detach().to(torch.float32)
            if g:
                out.append(([(int(x.argmax()), 1.0)], None))
                continue
            x = x / float(md.temperature[row])
            k = md.top_k[row:row + 1] if md.top_k is not None else None
            p = md.top_p[row:row + 1] if md.top_p is not None else None
            x = apply_top_k_top_p(x.unsqueeze(0).clone(), k, p)[0]
            probs = x.softmax(-1)
            out.append((top_of(probs), probs))
        return out

    def before_sample(self, runner, logits, meta) -> None:
        """Read the bonus (or plain) positions' logits before vLLM's sampler may change them in place."""
        step = self.step
        ids = list(runner.input_batch.req_ids)
        greedy = self.greedy_rows(runner, len(ids))
        if meta is None:
            rows = list(range(len(ids)))
        else:
            rows = [int(i) for i in meta.bonus_logits_indices.tolist()]
        step["req_ids"] = ids
        step["greedy"] = greedy
        step["bonus"] = self.warped_rows(runner, logits, rows, greedy)
        step["num_drafts"] = list(meta.num_draft_tokens) if meta is not None else [0] * len(ids)
        self.in_sample = {}

    def greedy_rows(self, runner, n: int) -> list[bool]:
        md = runner.input_batch.sampling_metadata
        if md.all_greedy:
            return [True] * n
        if md.all_random:
            return [False] * n
        return [float(t) == 0.0 for t in md.temperature[:n].tolist()]

    def after_sample(self, runner, sampled: torch.Tensor) -> None:
        step, rec = self.step, self.recorder
        got = self.in_sample or {}
        vocab = runner.input_batch.vocab_size
        start = 0
        for row, rid in enumerate(step["req_ids"]):
            n = step["num_drafts"][row]
            tokens = [t for t in sampled[row].tolist() if 0 <= t < vocab]
            first = start
            start += n
            if rid not in rec.requests or rid not in step["scheduled"]:
                continue
            before, scheduled = step["computed"].get(rid, 0), step["scheduled"][rid]
            req = rec.requests[rid]
            forward = step.get("t_forward", 0.0)
            if not req.cycles:  # the prefill, maybe in chunks: one cycle from where the first chunk started
                first_before, earlier = self.prefill.get(rid, (before, 0.0))
                self.prefill[rid] = (first_before, earlier + forward)
            if before + scheduled < len(req.prompt_ids) + len(req.generated) or not tokens:
                continue  # a partial (chunked) prefill: its sample is thrown away
            if not req.cycles:
                before, forward = self.prefill.pop(rid)
                scheduled = len(req.prompt_ids) - before
            drafts = step["drafts"].get(rid, [])
            if n != len(drafts):
                raise RuntimeError(f"row {row}: {n} drafts in the sampler's metadata, {len(drafts)} scheduled")
            p_target, top, residual = [], [], None
            q = None if step["greedy"][row] else got.get("q")  # greedy rows are tested on the argmax alone
            q_rows = None if q is None else [q[first + i] for i in range(n)]
            for i in range(n):
                if step["greedy"][row]:
                    am = int(got["argmax"][first + i])
                    p_target.append(1.0 if am == drafts[i] else 0.0)
                    top.append([(am, 1.0)])
                else:
                    probs = got["probs"][first + i]
                    p_target.append(float(probs[drafts[i]]))
                    top.append(top_of(probs))
            top.append(step["bonus"][row][0])
            na = len(tokens) - 1
            if na < n:
                if step["greedy"][row]:
                    residual = [(top[na][0][0], 1.0, 1.0, 0.0)]  # the argmax, never the rejected draft
                else:
                    residual = residual_top(got["probs"][first + na], drafts[na], tokens[-1],
                                            None if q_rows is None else q_rows[na])
            draft = None if q_rows is None else DraftRows(
                [float(r[d]) for r, d in zip(q_rows, drafts)], [top_of(r) for r in q_rows],
                [float(torch.minimum(got["probs"][first + i], r).sum()) for i, r in enumerate(q_rows)])
            u = None
            if not step["greedy"][row] and got.get("u") is not None:
                u = [float(x) for x in got["u"][first:first + n].tolist()]
            step["pending"].append((rid, Step(before, scheduled, drafts, tokens, p_target, top, residual, u,
                                              self.draft_time if n else 0.0, forward, 0.0,
                                              draft=draft)))

    def end_step(self) -> None:
        """The step is over (sampled, bookkept, the next drafts proposed): write its cycles."""
        step, self.step, self.in_sample = self.step, None, None
        if step is None:
            return
        elapsed = time.perf_counter() - step["t0"]
        spent, self.spent = self.spent, 0.0  # this call's own time (writing) counts towards the next step
        for rid, s in step["pending"]:
            s.verify_time_s = s.verify_time_s or elapsed
            s.cycle_time_s = max(elapsed, s.verify_time_s)  # a chunked prefill's forwards span several steps
            s.capture_time_s = spent
            self.recorder.step(rid, s)


def top_of(probs: torch.Tensor) -> list[tuple[int, float]]:
    values, ids = probs.topk(TOP)
    return [(int(i), float(v)) for v, i in zip(values.tolist(), ids.tolist()) if v > 0]


def residual_top(probs: torch.Tensor, draft: int, drawn: int,
                 q: torch.Tensor | None = None) -> list[tuple[int, float, float, float]]:
    """The residual norm(max(0, p_target - q)) at a rejected draft as (token, p_target, residual, p_draft) rows;
    without q (a one-hot draft) that is p_target with the draft token removed. The drawn (recovered) token is
    always listed."""
    if q is None:
        q = torch.zeros_like(probs)
        q[draft] = 1.0
    res = (probs - q).clamp_min(0)
    total = float(res.sum())
    res = res / total if total > 0 else res
    values, ids = res.topk(TOP)
    listed = [int(i) for v, i in zip(values.tolist(), ids.tolist()) if v > 0]
    if drawn not in listed:
        listed.append(drawn)
    return [(t, float(probs[t]), float(res[t]), float(q[t])) for t in listed]
