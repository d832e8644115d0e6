"""What a drafter kind says when it refuses a setting: a leaf module, so that a drafter's own
module and the registry (which imports every drafter's module in its builders) can both read
the same words without importing each other."""

OTHER_TOKENIZER_GREEDY_ONLY = (
    "the other-tokenizer drafter runs only greedy (temperature 0): the ratio test needs the "
    "draft's probability of each target token, which exists only for strings both vocabularies "
    "share (Timor et al., ICML 2025); use --temperature 0, or a drafter that shares the target's tokenizer")

# A mis-set draft model (--draft-prompt raw, --draft-filters "temperature only") or EAGLE-3 head
# (--eagle3-features "top layer") runs in the chain's reference cycle: the tree and the fast path draft
# with the draft model directly, not through it.
MIS_SET_CHAIN_ONLY = (
    "--draft-prompt, --draft-filters and --eagle3-features plant a mis-set drafter, which runs on the reference "
    "chain only: drop --tree and --fast")
MIS_SET_MODEL_ONLY = (
    "--draft-prompt and --draft-filters set how a draft model reads the prompt and filters its "
    "distribution: they apply to --drafter model only")
MIS_SET_HEAD_ONLY = (
    "--eagle3-features sets which target hidden states an EAGLE-3 head reads: it applies to --drafter eagle3 only")
