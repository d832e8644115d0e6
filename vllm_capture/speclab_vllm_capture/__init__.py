"""speclab_vllm_capture: a vLLM general plugin that writes the Speculative Decoding Lab's per-cycle traces.

Off unless SPECLAB_CAPTURE_DIR names a folder. vLLM calls `register` in every process it starts; with the
variable set and vLLM at the version the wrappers were written against, it wraps a few methods of the model
runner and two functions of the rejection sampler (hooks.py says which and why). Any other version, or a
speculative method other than n-gram or a separate draft model, leaves vLLM as it is with one log line.
"""
import functools
import logging
import os
import time

log = logging.getLogger("speclab_vllm_capture")
SUPPORTED_VLLM = ("0.32.0",)
ENV = "SPECLAB_CAPTURE_DIR"
_patched = False


def register() -> None:
    global _patched
    folder = os.environ.get(ENV)
    if not folder or _patched:
        return
    try:
        import vllm
        version = vllm.__version__.split("+")[0]
        if version not in SUPPORTED_VLLM:
            log.warning("speclab capture off: vLLM %s is not one of %s", vllm.__version__, ", ".join(SUPPORTED_VLLM))
            return
        patch(folder)
        _patched = True
    except Exception as err:  # never stop the server over the capture
        log.warning("speclab capture off: %s: %s", type(err).__name__, err)


def patch(folder: str) -> None:
    from vllm.v1.sample import rejection_sampler as rs
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from speclab_vllm_capture.hooks import Capture

    cap = Capture(folder)

    def guarded(what, fn, *args):
        if not cap.on:
            return
        start = time.perf_counter()
        try:
            fn(*args)
            cap.spent += time.perf_counter() - start
        except Exception as err:
            cap.off(f"{what}: {type(err).__name__}: {err}")

    def wrap(owner, name, before=None, after=None):
        original = getattr(owner, name)

        @functools.wraps(original)
        def wrapper(*args, **kwargs):
            if before is not None:
                guarded(name, before, args, kwargs)
            result = original(*args, **kwargs)
            if after is not None:
                guarded(name, after, args, kwargs, result)
            return result
        setattr(owner, name, wrapper)

    def arg(args, kwargs, i, key):
        return args[i] if len(args) > i else kwargs.get(key)

    wrap(GPUModelRunner, "execute_model",
         before=lambda a, k: cap.begin(a[0], arg(a, k, 1, "scheduler_output")),
         after=lambda a, k, r: cap.forward_done())
    wrap(GPUModelRunner, "_sample",
         before=lambda a, k: cap.step is not None and cap.before_sample(a[0], arg(a, k, 1, "logits"),
                                                                      arg(a, k, 2, "spec_decode_metadata")),
         after=lambda a, k, r: cap.step is not None and cap.after_sample(a[0], r.sampled_token_ids))
    wrap(GPUModelRunner, "sample_tokens", after=lambda a, k, r: cap.end_step())

    original_propose = GPUModelRunner.propose_draft_token_ids

    @functools.wraps(original_propose)
    def propose(*args, **kwargs):
        start = time.perf_counter()
        result = original_propose(*args, **kwargs)
        cap.draft_time = time.perf_counter() - start
        return result
    GPUModelRunner.propose_draft_token_ids = propose

    def seen_logits(a, k):
        if cap.in_sample is None:
            return
        target_logits, md = arg(a, k, 5, "target_logits"), arg(a, k, 7, "sampling_metadata")
        x = target_logits.detach().to(cap_float())
        cap.in_sample["argmax"] = x.argmax(-1).tolist() if x.shape[0] else []
        cap.in_sample["probs"] = None if md.all_greedy else x.softmax(-1)
        draft_probs = arg(a, k, 4, "draft_probs")  # (drafts, V), or None: then q is one-hot on each draft token
        cap.in_sample["q"] = None if draft_probs is None or md.all_greedy else draft_probs.detach().to(cap_float())

    def seen_u(a, k, result):
        if cap.in_sample is not None:
            cap.in_sample["u"] = result.detach().clone()

    wrap(rs, "rejection_sample", before=seen_logits)
    wrap(rs, "generate_uniform_probs", after=seen_u)
    log.warning("speclab capture on: traces of n-gram and draft-model speculation go to %s", folder)


def cap_float():
    import torch
    return torch.float32
