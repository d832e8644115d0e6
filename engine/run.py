"""From settings to a finished trace file: load a pair, encode the prompt, run, record."""
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable

from .calibrate import calibrate as measure_step_times
from .config import SpecSettings
from .kv_layouts import layout_for_run
from .models import (LoadedModel, check_same_token_space, load_model, pick_device, pick_dtype)
from .presets import PRESETS
from .speculative import (CACHE_CONVENTION, CACHE_CONVENTION_TEXT, Faults, NO_FAULTS, Pair,
                          eos_ids_of, speculative_generate)
from .trace import FORMAT, VERSION, Trace, TraceWriter, library_versions, make_summary


def load_pair(target: str, draft: str, device: str | None = None,
              trust_remote_code: bool = False, dtype_name: str | None = None) -> Pair:
    dev = pick_device(device)
    dtype = pick_dtype(dev, dtype_name)
    target_model = load_model(target, dev, dtype, trust_remote_code)
    draft_model = load_model(draft, dev, dtype, trust_remote_code)
    check_same_token_space(target_model, draft_model)
    return Pair(target_model, draft_model, eos_ids_of(target_model))


def load_preset(name: str, device: str | None = None, dtype_name: str | None = None) -> Pair:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    preset = PRESETS[name]
    pair = load_pair(str(preset.target_folder()), str(preset.draft_folder()), device, dtype_name=dtype_name)
    pair.target.name, pair.draft.name = preset.target_name, preset.draft_name
    return pair


def encode_prompt(tokenizer, prompt: str, chat: bool) -> list[int]:
    """Token ids of the prompt; wrapped in the chat template when asked and available."""
    if chat and getattr(tokenizer, "chat_template", None):
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                               tokenize=False, add_generation_prompt=True)
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    if not ids:
        raise ValueError("the prompt is empty: type at least one character")
    return list(ids)


def describe_model(m: LoadedModel) -> dict:
    params = sum(p.numel() for p in m.model.parameters())
    return {"name": m.name, "architecture": type(m.model).__name__, "parameters": params,
            "vocab_size": m.full_vocab_size,
            "kept_vocab": None if m.kept_token_ids is None else int(m.kept_token_ids.numel())}


def make_header(pair: Pair, s: SpecSettings, prompt: str, prompt_ids: list[int],
                preset: str | None, chat_template: bool, faults: Faults = NO_FAULTS) -> dict:
    tok = pair.target.tokenizer
    return {
        "type": "header", "format": FORMAT, "version": VERSION,
        "target": describe_model(pair.target), "draft": describe_model(pair.draft),
        "tokenizer": type(tok).__name__, "preset": preset, "chat_template": chat_template,
        "settings": s.to_dict(), "prompt": prompt, "prompt_token_ids": prompt_ids,
        "prompt_token_texts": [tok.decode([t]) for t in prompt_ids],
        "cache_convention": {"name": CACHE_CONVENTION, "text": CACHE_CONVENTION_TEXT},
        "cache_layout": layout_for_run(s, len(prompt_ids), faults.keep_rejected_kv).describe(),
        "device": str(pair.target.device), "dtype": str(pair.target.dtype).removeprefix("torch."),
        "versions": library_versions(), "eos_token_ids": sorted(pair.eos_ids),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def run_to_trace(pair: Pair, prompt: str, s: SpecSettings, out: str | Path,
                 preset: str | None = None, chat_template: bool = True,
                 on_cycle: Callable[[dict], None] | None = None,
                 faults: Faults = NO_FAULTS, calibrate: bool = False, fast: str | None = None) -> Trace:
    """Run speculative decoding on `prompt`, writing the trace to `out` as it goes.

    With `calibrate`, the header also gets step times of both models (engine/calibrate.py),
    which the statistics need for c, t_step and the speedup predictions. With `fast` (a capture
    mode: none, graph or compile) the cycles run on engine/fast_path.py over static caches;
    their records mean the same.
    """
    if fast is not None:
        from .fast_path import check_fast_settings
        s = check_fast_settings(s, faults)
    use_chat = chat_template and bool(getattr(pair.target.tokenizer, "chat_template", None))
    prompt_ids = encode_prompt(pair.target.tokenizer, prompt, use_chat)
    header = make_header(pair, s, prompt, prompt_ids, preset, use_chat, faults)
    if faults != NO_FAULTS:
        header["faults"] = asdict(faults)  # marks a deliberately broken teaching run
    if calibrate:  # optional header field; traces without it stay valid
        header["calibration"] = measure_step_times(pair, prompt_ids, s)
    if fast is not None:  # optional header field: which path made the cycles
        header["fast_path"] = {"capture": fast}
    cycles: list[dict] = []
    with TraceWriter(out) as writer:
        writer.write(header)
        start = time.perf_counter()
        for rec in _cycles(pair, prompt_ids, s, faults, fast):
            writer.write(rec)
            cycles.append(rec)
            if on_cycle:
                on_cycle(rec)
        wall = time.perf_counter() - start
        generated = [t for c in cycles for t in c["committed_token_ids"]]
        stop = "eos" if generated and generated[-1] in pair.eos_ids else "max_new_tokens"
        text = pair.target.tokenizer.decode(generated)
        summary = make_summary(cycles, s.k, text, stop, wall)
        writer.write(summary)
    return Trace(header, cycles, summary)


def _cycles(pair: Pair, prompt_ids: list[int], s: SpecSettings, faults: Faults, fast: str | None):
    if fast is None:
        return speculative_generate(pair, prompt_ids, s, faults)
    from .fast_path import fast_generate
    return fast_generate(pair, prompt_ids, s, capture=fast)
