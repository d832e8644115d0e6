"""The names and limits that traces, settings, the engine and its checks share: each one defined here once.

Standard library only, and nothing from the engine: engine/config.py, the trace reader and
its checks, the drafters and the app's torch-free pages all import from here, so a value
can never drift between the code that writes a trace and the code that checks it.
"""

# ---------------------------------------------------------------- the trace file

FORMAT = "speclab-trace"  # a trace header's "format"
VERSION = 1  # a trace header's "version": the one this engine writes and reads

# The cache convention every trace states (design notes, "Cache conventions and layouts").
CACHE_CONVENTION = "committed_minus_one"  # the only convention this engine writes and reads
CACHE_CONVENTION_TEXT = (
    "After each cycle both caches hold K/V for all committed tokens except the last; "
    "the last committed token is fed at the start of the next cycle."
)

# A live vLLM's cycles as its capture plugin writes them (vllm_capture/, docs/servers.md): vLLM's own bookkeeping,
# checked by its own rules (engine/trace/chain_checks.py). The plugin repeats this name and text (it imports nothing
# of the lab); tests/test_vllm_capture.py keeps them equal.
VLLM_CONVENTION = "vllm_num_computed"
VLLM_CONVENTION_TEXT = (
    "vLLM's num_computed_tokens, read from the scheduler's output at each step: before a decode step it is the "
    "committed length - 1; the verify step computes the last committed token and the n drafts (after_append = "
    "before + n + 1); the scheduler then subtracts the rejected drafts (after_rollback = after_append - "
    "(n - accepted)), counting accepted drafts even past a stop. The rejected drafts' K/V stay in their paged "
    "slots until overwritten. The first cycle is the prefill: no drafts, from the prefix-cache hit (or 0) to the "
    "prompt's length. A draft passes when p_target/p_draft >= u; greedy steps draw no u."
)
# How a captured vLLM draft model drafted (its draft_sample_method): its argmax, so q is one-hot on each draft, or
# a sample from its distribution at the request's temperature, which vLLM hands to its rejection sampler as q.
VLLM_DRAFT_GREEDY, VLLM_DRAFT_PROBABILISTIC = "greedy", "probabilistic"
VLLM_DRAFT_SAMPLING = (VLLM_DRAFT_GREEDY, VLLM_DRAFT_PROBABILISTIC)
CACHE_CONVENTIONS = (CACHE_CONVENTION, VLLM_CONVENTION)  # what a header's cache_convention.name may say

# ---------------------------------------------------------------- settings (engine/config.py checks them)

MAX_K = 32  # beyond this a draft's acceptance has long since died out
MAX_NEW_TOKENS = 4096
MAX_TRACE_TOP_K = 100
LAYOUTS = ("dynamic", "static", "paged")  # KV-cache layouts; engine/kv/layouts.py builds them
MAX_BLOCK_SIZE = 1024  # slots per block of the paged layout, at most

# ---------------------------------------------------------------- CPU linear paths (engine/models/linear_paths.py)

# The ways a float32 CPU model's linear layers may run; a calibrated run's header records which ran each width.
AS_LOADED = "as_loaded"  # the model's own nn.Linear: F.linear, the BLAS torch was built with
PACKED = "packed"  # engine/models/cpu_linear.py's twin: oneDNN with pre-packed weights
ROWS = "rows"  # engine/models/f32_rows_kernel.py's twin: the engine's C kernel, each weight read once for all rows
LINEAR_PATHS = (AS_LOADED, PACKED, ROWS)
# every curve times these; ROWS only where its kernel compiled (and curves older than it lack it)
REQUIRED_LINEAR_PATHS = (AS_LOADED, PACKED)
# The rows kernel's variants (engine/models/f32_rows_kernel.py VARIANTS): an ISA, prefetching into L1 or ("-l2") L2
ROWS_VARIANTS = ("scalar", "avx2", "avx512", "avx2-l2", "avx512-l2")
# the fast path's forwards (header "fast_path"): eager, CUDA graphs, torch.compile
CAPTURE_MODES = ("none", "graph", "compile")

# ---------------------------------------------------------------- target weights (engine/models/gguf_linear.py)

# Which weights the target's linear layers ran on; a header's optional "target_weights" records it
# (traces without it ran the model as loaded). Each path is its own target distribution: the ratio
# test follows the one that ran.
WEIGHTS_FLOAT32 = "float32"  # the model as loaded (a GGUF target is dequantised to float32 on load)
WEIGHTS_INT4 = "int4"  # the GGUF file's blocks as stored: Q4_1 layers (a Q8_0 output layer), no requantisation
# The same blocks, each block of 32 activations rounded to 8 bits before the products, as llama.cpp multiplies
# (engine/models/gguf_kernel.c): faster on the CPU, and further from the float32 model than int4.
WEIGHTS_INT4_A8 = "int4-a8"
TARGET_WEIGHTS = (WEIGHTS_FLOAT32, WEIGHTS_INT4, WEIGHTS_INT4_A8)
GGUF_WEIGHTS = (WEIGHTS_INT4, WEIGHTS_INT4_A8)  # the paths that run the GGUF file's blocks
ACTIVATIONS = {WEIGHTS_INT4: "float32", WEIGHTS_INT4_A8: "int8"}  # what a header's target_weights.activations says
GGUF_BLOCK_TYPES = ("Q4_1", "Q8_0")  # the block types the int4 path's kernel runs

# ---------------------------------------------------------------- decoders (engine/models/llama.py)

# Which code computed a model's distributions (the CLI's --decoder): Hugging Face's modules, or the
# engine's own Llama-family decoder on the same weights. A header's optional "decoder" records it per
# model, {"target": {"ran": "own"}, "draft": {"ran": "hf", "fallback": "<why own did not apply>"}};
# traces without it (and a model it does not name) ran on Hugging Face's modules.
DECODER_HF, DECODER_OWN = "hf", "own"
DECODERS = (DECODER_HF, DECODER_OWN)
MAX_DECODER_FALLBACK_TEXT = 300  # the one-line reason own did not apply to a model

# ---------------------------------------------------------------- drafters

# A trace header's drafter "kind" and the CLI's --drafter names. What each kind is, needs and
# builds is in engine/drafters/registry.py; traces written before drafters had a name used a
# draft model.
DRAFT_MODEL, PROMPT_LOOKUP, OTHER_TOKENIZER, EAGLE = "model", "prompt-lookup", "other-tokenizer", "eagle"
SUFFIX = "suffix"
EAGLE3 = "eagle3"  # an EAGLE-3 head in the speculators format (engine/drafters/eagle3.py)
DRAFTER_KINDS = (DRAFT_MODEL, PROMPT_LOOKUP, OTHER_TOKENIZER, EAGLE, EAGLE3, SUFFIX)
FEATURE_HEADS = (EAGLE, EAGLE3)  # kinds that draft from the target's hidden states, K per cycle, over a head cache
MAX_NGRAM = 16  # prompt lookup: the longest n-gram it may be told to match
# Which earlier occurrence of the matched n-gram prompt lookup copies from. "latest" (the most recent) is
# what every trace before this option drafted with; "earliest" is what vLLM V1's ngram proposer and Hugging
# Face's prompt_lookup_num_tokens take, so a replica of a vLLM server drafts as it did. A header's drafter
# entry names it only when "earliest".
NGRAM_LATEST, NGRAM_EARLIEST = "latest", "earliest"
NGRAM_MATCHES = (NGRAM_LATEST, NGRAM_EARLIEST)

# Suffix decoding (engine/drafters/suffix.py): the limits its options are checked against, and which of its two
# trees proposed a cycle's tokens (a cycle's drafter_state "source"; null when neither proposed anything).
MAX_SUFFIX_DEPTH = 64  # tokens of the longest substring a tree keeps (vLLM's default is 24)
MAX_SUFFIX_FACTOR = 64.0  # draft tokens per matched token, at most (vLLM's default is 1.0)
MAX_CACHED_REQUESTS = 1_000_000  # earlier requests the global tree keeps (vLLM's default is 10,000)
SUFFIX_REQUEST, SUFFIX_GLOBAL = "request", "global"  # this request's prompt and output, or earlier requests' outputs
SUFFIX_SOURCES = (SUFFIX_REQUEST, SUFFIX_GLOBAL)

# A draft model deliberately mis-set the way real deployments get it wrong (the diagnosis, engine/diagnose/,
# plants them and measures what they cost). Both stay exact (the ratio test reads the distribution the draft
# really sampled from); they only lower acceptance. A header's drafter entry names them only when set.
DRAFT_PROMPT_AS_TARGET, DRAFT_PROMPT_RAW = "as target", "raw"  # "raw": the prompt without the chat template
DRAFT_PROMPTS = (DRAFT_PROMPT_AS_TARGET, DRAFT_PROMPT_RAW)
DRAFT_FILTERS_REQUEST, DRAFT_FILTERS_TEMPERATURE = "request", "temperature only"  # the latter ignores top-k/top-p
DRAFT_FILTERS = (DRAFT_FILTERS_REQUEST, DRAFT_FILTERS_TEMPERATURE)
# An EAGLE-3 head mis-set the same way: "top layer" hands it the target's last layer's output (H wide) in place
# of fc over its auxiliary layers, as vLLM runs a head whose config sets eagle_config.use_aux_hidden_state false
# (its model then skips fc). The head was trained on fused states, so few of its drafts hold: exact, acceptance
# near 0 (the chat head: 0.04 against 0.10).
EAGLE3_AUX, EAGLE3_TOP = "aux layers", "top layer"
EAGLE3_FEATURES = (EAGLE3_AUX, EAGLE3_TOP)

# ---------------------------------------------------------------- draft trees (engine/tree/)

# A tree run's header carries settings["tree"]: {"kind": STATIC_TREE, "branching": [B1, B2, ...]} or
# {"kind": DYNAMIC_TREE, "top_k": k, "depth": d, "nodes": n}. Chain runs have no "tree" entry.
STATIC_TREE, DYNAMIC_TREE = "static", "dynamic"
TREE_KINDS = (STATIC_TREE, DYNAMIC_TREE)
MAX_TREE_NODES = 64  # draft nodes per cycle (the root, the last committed token, not counted)
MAX_TREE_DEPTH = MAX_K
MAX_TREE_BRANCHING = 16  # children of one node, at most
ROOT = -1  # a node's parent when it hangs off the root (the last committed token)
NEXT_BONUS, NEXT_RESIDUAL = "bonus", "residual"  # how a tree cycle's last committed token was drawn

# ---------------------------------------------------------------- deliberate bugs (engine/teaching/faults.py)

# The acceptance rules a teaching run may declare in its header's "faults"; only "ratio" is correct.
ACCEPTANCE_RULE_TEXT = {
    "ratio": "accept with probability min(1, p_target/p_draft); resample from the residual (correct)",
    "p_target_only": "accept with probability p_target alone (wrong: ignores how often the draft proposes)",
    "no_residual": "on rejection sample from p_target instead of the residual (wrong: double-counts the overlap)",
    "token_match": "accept only if a fresh target sample equals the draft token, else resample from the residual (wrong)",
}
ACCEPTANCE_RULES = tuple(ACCEPTANCE_RULE_TEXT)
