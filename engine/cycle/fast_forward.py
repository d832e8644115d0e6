"""The fast path's fixed-shape forwards over static caches, and its timing without a sync.

- `new_fast_cache`: a static cache whose layers never read their position back to the host;
- `FixedForward`: one model's forward at one width, eager, captured as a CUDA graph, or compiled
  (torch.compile: CUDA graphs under it on a GPU; on the CPU inductor's C++ code with the weights
  frozen in as constants, which lets it pre-pack them for oneDNN);
- `Clock`: marks inside a cycle, CUDA events on a GPU, read after the cycle's one copy.
"""
import itertools
import time
import types
from typing import Callable

import torch

from engine.kv.layouts import CacheLayout, StaticKVCache, StaticKVLayer, new_cache
from engine.models import linear_paths
from engine.models.loading import LoadedModel

# ---------------------------------------------------------------- fixed-shape forwards

class FastStaticLayer(StaticKVLayer):
    """The static layer without its eager capacity check, which reads the position back to the
    host; the fast path checks capacity on the host from lengths it already knows."""

    def update(self, key_states, value_states, *args, **kwargs):
        return super(StaticKVLayer, self).update(key_states, value_states, *args, **kwargs)


def new_fast_cache(model: LoadedModel, capacity: int) -> StaticKVCache:
    cache = new_cache(CacheLayout("static", capacity), model.model.config)
    for layer in cache.layers:
        layer.__class__ = FastStaticLayer
        layer.cumulative_length = layer.cumulative_length.to(model.device)  # the mask reads it before the first write
    return cache


def causal_mask(cache: StaticKVCache, width: int) -> torch.Tensor:
    """(1, 1, T, capacity) bool, True where query t may attend: slots up to its own position.

    Built from the write position on the device. Given a ready 4-D mask, transformers skips its
    own mask building, whose static-cache branch reads the position back to the host
    (`q_offset == 0`), which a CUDA graph cannot capture. The logits are bit-identical.
    """
    layer = cache.layers[0]
    query_positions = layer.cumulative_length + torch.arange(width, device=layer.cumulative_length.device)  # (T,)
    slots = torch.arange(cache.capacity, device=query_positions.device)  # (capacity,)
    return (slots[None, :] <= query_positions[:, None])[None, None]


def logits_of(model: LoadedModel, ids: torch.Tensor, cache: StaticKVCache,
              module: torch.nn.Module | None = None) -> torch.Tensor:
    """ids (T,) full-vocabulary ids -> full-vocabulary float32 logits (T, V), appending T K/V entries.

    `module`: what computes the forward; by default the module the engine runs at this width."""
    rows = ids if model.full_to_row is None else model.full_to_row[ids]
    module = module if module is not None else model.runner_for(ids.shape[0])
    out = module(input_ids=rows.reshape(1, -1), attention_mask=causal_mask(cache, ids.shape[0]),
                 use_cache=True, **{model.cache_arg: cache})
    return model.full_vocab_logits(out.logits[0])


def compile_forward(model: LoadedModel, cache: StaticKVCache, width: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """`logits_of` under torch.compile, fixed shapes (one compile per width and cache capacity).

    On CUDA, "reduce-overhead" replays the compiled kernels as CUDA graphs. On the CPU there are no
    graphs to replay; inductor writes C++ for the whole forward and, with `freezing`, treats the
    weights as constants (they do not change during a run), so it can fold them and pre-pack them
    for oneDNN itself. It compiles `model.compiled_module_for(width)`: the module as loaded or the
    engine's own decoder, not the packed twin, whose oneDNN calls inductor cannot lower
    (LoweringException, torch 2.13); on int4 weights, the int4 module, whose C kernel the graph holds
    as one opaque operator (engine/models/gguf_kernel.py compiled_linear); at a width where this
    machine's linear paths chose the float32 rows kernel, the rows twin, its kernel held likewise
    (engine/models/f32_rows_kernel.py compiled_linear)."""
    if model.device.type == "cuda":
        return torch.compile(own_code(lambda ids: logits_of(model, ids, cache)), mode="reduce-overhead", dynamic=False)
    module = model.compiled_module_for(width)
    # No guards on the modules' attributes: checking them before every call cost about 1 ms of a 10 ms int4 chat
    # step on a 2-core AVX2 EPYC (dynamo's cache lookup, profiled: 1.0 ms with them, 0.2 without). With freezing
    # the graph already takes the weights as constants; the one attribute the engine changes on a built module,
    # the GGUF layers' activations (LoadedModel.use_weights), gets a compiled forward of its own (FixedForward).
    compiled = torch.compile(own_code(lambda ids: logits_of(model, ids, cache, module)), dynamic=False,
                             options={"guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe})

    def frozen(ids: torch.Tensor) -> torch.Tensor:
        # Freezing is read from inductor's config while the first call compiles; torch.compile's
        # options={"freezing": True} did not reach it (torch 2.13: the chat target's bfloat16 step
        # compiled to 25 ms that way, 17-18 ms with the config patched around the call)
        with torch._inductor.config.patch(freezing=True):
            return compiled(ids)
    return frozen


def own_code(fn: Callable) -> Callable:
    """`fn` on a code object of its own, so torch.compile keeps its compiled graphs apart from every other's.

    Dynamo caches compiled graphs per code object and picks one by its guards. A static cache's
    K/V and position tensors are marked static addresses (transformers, for CUDA graphs), and with
    freezing inductor folds them into the graph like weights; the guards then do not tell one cache
    from another, so a second FixedForward of the same shapes over a new cache ran the first one's
    graph, writing the old cache (seen as an index out of bounds on the CPU). One code object per
    compiled forward: one graph per cache."""
    code = fn.__code__.replace(co_name=f"{fn.__code__.co_name}_{next(_compiled_count)}")
    return types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__, fn.__closure__)


_compiled_count = itertools.count()


class FixedForward:
    """One model's forward at one width over its static cache: eager, a CUDA graph, or compiled.

    A graph replays the kernels recorded at capture, reading its input from `self.ids` and the
    write position from the cache's own device tensors, so one capture serves every cycle.
    """

    def __init__(self, model: LoadedModel, cache: StaticKVCache, width: int, capture: str) -> None:
        self.model, self.cache, self.width, self.capture = model, cache, width, capture
        self.fn: Callable[[torch.Tensor], torch.Tensor] = lambda ids: logits_of(model, ids, cache)
        if capture == "compile":
            # each width compiled on this machine's fastest path; eager keeps the reference path's
            # paths, so the two stay equal record for record
            linear_paths.settle_if_unchosen(model)
            self.compiled: dict[str, Callable] = {}  # weights path -> its compiled forward (compile_forward)
            self.fn = self._compiled_forward
        if capture == "graph":
            self._capture_graph()

    def _compiled_forward(self, ids: torch.Tensor) -> torch.Tensor:
        """The forward compiled for the model's current weights path, compiled on first use: the graphs keep no
        guard on module attributes, so a path switched after compiling (int4 and int4-a8 share their modules)
        must not reach the other path's graph."""
        fn = self.compiled.get(self.model.weights)
        if fn is None:
            fn = self.compiled[self.model.weights] = compile_forward(self.model, self.cache, self.width)
        return fn(ids)

    def _positions(self) -> list[torch.Tensor]:
        return [layer.cumulative_length.clone() for layer in self.cache.layers]

    def _restore(self, saved: list[torch.Tensor]) -> None:
        for layer, length in zip(self.cache.layers, saved):
            layer.cumulative_length.copy_(length)

    def _capture_graph(self) -> None:
        """Warm up on a side stream, then capture; the cache position is restored after each
        (the slots written meanwhile lie after it: stale, masked, overwritten by the next append)."""
        saved = self._positions()
        self.ids = torch.zeros(self.width, dtype=torch.long, device=self.model.device)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self.fn(self.ids)
                self._restore(saved)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = self.fn(self.ids)  # (width, V), rewritten by every replay
        self._restore(saved)

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        if self.capture == "compile" and self.model.device.type == "cuda":
            torch.compiler.cudagraph_mark_step_begin()  # a new step: the previous outputs may be overwritten
        if self.capture != "graph":
            return self.fn(ids)
        self.ids.copy_(ids)
        self.graph.replay()
        return self.out


# ---------------------------------------------------------------- timing without a sync

class Clock:
    """Marks inside a cycle: CUDA events on a GPU (read after the cycle's one copy), perf_counter elsewhere."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.marks: list = []

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def intervals(self) -> list[float]:
        """Seconds between consecutive marks; call after the host copy (the events have completed)."""
        if self.cuda:
            return [a.elapsed_time(b) / 1e3 for a, b in zip(self.marks, self.marks[1:])]
        return [b - a for a, b in zip(self.marks, self.marks[1:])]
